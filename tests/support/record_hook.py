"""The exec hook the end-to-end tests give `worker-agent run --exec-hook`.

    python record_hook.py OUT.jsonl [SLEEP_S [FAIL_FILE]]

Reads the agent's event (one JSON object on standard input, DESIGN 2.3), optionally sleeps
`SLEEP_S` seconds to emulate the cost of starting or stopping connectors and tasks, then appends
one line to `OUT.jsonl`:

    {"worker", "event", "member_epoch", "connectors", "tasks", "t_start", "t_end", "configs"}

`configs` is the event's (DESIGN 3.20: {connector: {"digest", "config"}} on `assigned` and
`reconfigured` events), or absent. While `FAIL_FILE` exists, an `assigned` event of a connector
its first line names (names separated by spaces) fails: the hook writes `cannot start <names>:
<the file's second line>` to standard error, records nothing and exits 1.

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
            names, _, why = f.read().partition("\n")
        held = set(event["connectors"]) | {t["connector"] for t in event["tasks"]}
        failing = sorted(held & set(names.split()))
        if failing:
            print(f"cannot start {', '.join(failing)}: {why.strip()}", file=sys.stderr)
            return 1
    if sleep_s > 0:
        time.sleep(sleep_s)
    record = {
        "worker": event["member_id"],
        "event": event["event"],
        "member_epoch": event["member_epoch"],
        "connectors": list(event["connectors"]),
        "tasks": [[t["connector"], t["task"]] for t in event["tasks"]],
        "t_start": t_start,
        "t_end": time.time(),
    }
    if "configs" in event:
        record["configs"] = event["configs"]
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
