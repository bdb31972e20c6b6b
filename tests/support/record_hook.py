"""The exec hook the end-to-end tests give `worker-agent run --exec-hook`.

    python record_hook.py OUT.jsonl [SLEEP_S [FAIL_FILE]]

Reads the agent's event (one JSON object on standard input, DESIGN 2.3), optionally sleeps
`SLEEP_S` seconds to emulate the cost of starting or stopping connectors and tasks, then appends
one line to `OUT.jsonl`:

    {"worker", "event", "member_epoch", "connectors", "tasks", "t_start", "t_end", "configs"}

`configs` is the event's (DESIGN 3.20: {connector: {"digest", "config"}} on `assigned`,
`reconfigured`, `paused`, `resumed` and `stopped` events), or absent; `reason` is the event's
("restart" on a restart's `revoked` and `assigned`), or absent. While `FAIL_FILE` exists, an
`assigned` event of a connector its first line names (names separated by spaces) fails: the
hook writes `cannot start <names>: <the file's second line>` to standard error, records the
attempt as event `start_failed` and exits 1. A third line N makes it fail N more times only
(the file is rewritten with N - 1, and removed at 0).

`tasks` are `[connector, task]` pairs; `t_start` and `t_end` are `time.time()` when the call began
(the event was read) and when the work was done (just before the line is written), so a resource
is surely stopped by a revoked record's `t_end` and not started before an assigned record's
`t_start`. One `os.write` on an O_APPEND descriptor, so a line is never torn. Exit 0 = done.

Standard library only, so that it runs fast under `python -S`.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    t_start = time.time()
    if len(argv) < 2:
        print("usage: record_hook.py OUT.jsonl [SLEEP_S]", file=sys.stderr)
        return 2
    out = argv[1]
    sleep_s = float(argv[2]) if len(argv) > 2 else 0.0
    event = json.loads(sys.stdin.read())
    if len(argv) > 3 and event["event"] == "assigned" and os.path.exists(argv[3]):
        with open(argv[3]) as f:
            names, why, budget = [*f.read().split("\n"), "", ""][:3]
        held = set(event["connectors"]) | {t["connector"] for t in event["tasks"]}
        failing = sorted(held & set(names.split()))
        if failing:
            if budget.strip():  # fail this many more times, then stop failing
                left = int(budget) - 1
                if left <= 0:
                    os.unlink(argv[3])
                else:
                    with open(argv[3], "w") as f:
                        f.write(f"{names}\n{why}\n{left}\n")
            _append(out, _record(event, "start_failed", t_start))
            print(f"cannot start {', '.join(failing)}: {why.strip()}", file=sys.stderr)
            return 1
    if sleep_s > 0:
        time.sleep(sleep_s)
    _append(out, _record(event, event["event"], t_start))
    return 0


def _record(event: dict, kind: str, t_start: float) -> dict:  # type: ignore[type-arg]
    record = {
        "worker": event["member_id"],
        "event": kind,
        "member_epoch": event["member_epoch"],
        "connectors": list(event["connectors"]),
        "tasks": [[t["connector"], t["task"]] for t in event["tasks"]],
        "t_start": t_start,
        "t_end": time.time(),
    }
    if "configs" in event:
        record["configs"] = event["configs"]
    if event.get("reason"):
        record["reason"] = event["reason"]
    return record


def _append(out: str, record: dict) -> None:  # type: ignore[type-arg]
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
