"""The exec hook the tests in this package give `worker-agent run --exec-hook`.

    python -S exec_hook.py OUT.jsonl

Reads the agent's event (one JSON object on standard input, DESIGN 2.3) and appends one line to
OUT.jsonl: `{"worker", "event", "member_epoch", "connectors", "tasks", "t_start", "t_end"}`, where
`tasks` are `{"connector", "task"}` objects and `t_start` / `t_end` are `time.time()` when the
call began and just before the line is written. So an `assigned` resource may run from `t_start`
on, and a `revoked` one has surely stopped by `t_end`. One `os.write` on an O_APPEND descriptor,
so a line is never torn. Exit 0 = done. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    t_start = time.time()
    if len(argv) != 2:
        print("usage: exec_hook.py OUT.jsonl", file=sys.stderr)
        return 2
    event = json.loads(sys.stdin.read())
    record = {
        "worker": event["member_id"],
        "event": event["event"],
        "member_epoch": event["member_epoch"],
        "connectors": list(event["connectors"]),
        "tasks": list(event["tasks"]),
        "t_start": t_start,
        "t_end": time.time(),
    }
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
