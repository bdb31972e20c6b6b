"""The exec hook the tests in this package give every client's `--exec-hook` (the Python agent's
`worker-agent run`, the Node worker, the Go worker: one JSON contract, DESIGN 2.3).

    python -S exec_hook.py OUT.jsonl [--fail-file FILE] [--sleep-revoked S] [--hang-file FILE]

Reads the event (one JSON object on standard input) and appends one line to OUT.jsonl:
`{"worker", "event", "member_epoch", "connectors", "tasks", "t_start", "t_end",
"fencing_tokens", "env"}`, plus the event's `configs` and `target_states` when it has them and
its `reason` when there is one. `tasks` are `{"connector", "task"}` objects; `t_start` / `t_end`
are `time.time()` when the call began and just before the line is written, so an `assigned`
resource may run from `t_start` on, and a `revoked` one has surely stopped by `t_end`. `env` is
what the client put in the hook's environment: `WORKER_AGENT_EVENT`, `_GROUP_ID`, `_MEMBER_ID`,
`_MEMBER_EPOCH` (None when unset).

`--fail-file FILE`: while FILE exists, an `assigned` call fails: it records event `start_failed`,
writes `cannot start <resources>: <FILE's first line>` to standard error and exits 1.
`--sleep-revoked S`: a `revoked` call sleeps S seconds before it records (a slow stop), so a
client that acknowledges a revocation before its hook returned shows as an overlap.
`--hang-file FILE`: while FILE exists, an `assigned` call starts a child (`sleep 60`, in the
hook's process group), appends "HOOK_PID CHILD_PID" to FILE.pids and sleeps 60 s without
recording: only a client that kills the hook's process group at its timeout ends both.

One `os.write` on an O_APPEND descriptor, so a line is never torn. Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ENV = (
    "WORKER_AGENT_EVENT",
    "WORKER_AGENT_GROUP_ID",
    "WORKER_AGENT_MEMBER_ID",
    "WORKER_AGENT_MEMBER_EPOCH",
)


def _options(argv: list[str]) -> dict[str, str] | None:
    out: dict[str, str] = {}
    rest = argv[2:]
    while rest:
        if len(rest) < 2 or rest[0] not in ("--fail-file", "--sleep-revoked", "--hang-file"):
            return None
        out[rest[0]] = rest[1]
        rest = rest[2:]
    return out


def main(argv: list[str]) -> int:
    t_start = time.time()
    options = _options(argv) if len(argv) >= 2 else None
    if options is None:
        print(
            "usage: exec_hook.py OUT.jsonl [--fail-file F] [--sleep-revoked S] [--hang-file F]",
            file=sys.stderr,
        )
        return 2
    event = json.loads(sys.stdin.read())
    kind = event["event"]
    hang = options.get("--hang-file")
    if kind == "assigned" and hang is not None and os.path.exists(hang):
        child = subprocess.Popen(["sleep", "60"])
        with open(hang + ".pids", "a") as f:
            f.write(f"{os.getpid()} {child.pid}\n")
        time.sleep(60)
        return 1
    fail_file = options.get("--fail-file")
    failing = kind == "assigned" and fail_file is not None and os.path.exists(fail_file)
    if failing:
        kind = "start_failed"
    elif kind == "revoked" and "--sleep-revoked" in options:
        time.sleep(float(options["--sleep-revoked"]))
    record = {
        "worker": event["member_id"],
        "event": kind,
        "member_epoch": event["member_epoch"],
        "connectors": list(event["connectors"]),
        "tasks": list(event["tasks"]),
        "t_start": t_start,
        "t_end": time.time(),
        "fencing_tokens": event.get("fencing_tokens"),
        "env": {name: os.environ.get(name) for name in ENV},
    }
    for key in ("configs", "target_states", "reason"):
        if event.get(key) is not None:
            record[key] = event[key]
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    if failing:
        assert fail_file is not None
        with open(fail_file) as f:
            why = f.read().split("\n", 1)[0].strip()
        names = list(event["connectors"]) + [
            f"{t['connector']}-{t['task']}" for t in event["tasks"]
        ]
        print(f"cannot start {', '.join(names)}: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
