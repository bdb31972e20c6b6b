"""A per-resource recording exec hook for end-to-end tests of partial release (DESIGN 3.11).

    python -S resource_hook.py OUT.jsonl [--stop-s S] [--start-s S] [--task-stop-s CONNECTOR=S]...

Reads the agent's event (one JSON object on standard input, DESIGN 2.3, with the hook's
`"release"` mode), starts or stops each of its resources *concurrently*, each taking its own
time, and appends one line to `OUT.jsonl` when all are done:

    {"worker", "event", "member_epoch", "connectors", "tasks", "t_start", "t_end",
     "release", "resources": {"A": [t_begin, t_end], "A-0": [t_begin, t_end], ...}}

The first seven keys are `record_hook.py`'s (so `tests.support.agents` reads these files as it
reads that hook's); `resources` says, per resource, when its own start or stop began (the call's
`t_start`: all begin at once) and ended.

Costs: a resource stops in `--stop-s` (default 0.01) and starts in `--start-s` (default 0.01); the
tasks of a connector named by `--task-stop-s CONNECTOR=S` (repeatable) stop in S seconds instead
(the connector itself keeps the default). The resources run concurrently, so a resource ends at
`t_start` + its own cost; the hook sleeps to each end in turn (shortest first), which is the same
timeline as one thread per resource, without the threads.

Release: on a `revoked` event whose `"release"` is `"per-resource"`, the hook writes
``{"released": {"connectors": [...], "tasks": [{"connector", "task"}]}}`` to standard output (one
line per resource, flushed) the moment that resource has stopped, so the agent can release it at
once; in `batch` mode it writes nothing and the agent releases the whole event on exit 0.

Standard library only, so that it runs fast under `python -S`.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _usage() -> int:
    print(
        "usage: resource_hook.py OUT.jsonl [--stop-s S] [--start-s S] "
        "[--task-stop-s CONNECTOR=S]...",
        file=sys.stderr,
    )
    return 2


def parse_args(argv: list[str]) -> tuple[str, float, float, dict[str, float]] | None:
    """(out, stop_s, start_s, {connector: task stop seconds}), or None if malformed."""
    if len(argv) < 2:
        return None
    out = argv[1]
    stop_s = start_s = 0.01
    task_stop: dict[str, float] = {}
    rest = argv[2:]
    while rest:
        if len(rest) < 2:
            return None
        flag, value, rest = rest[0], rest[1], rest[2:]
        if flag == "--stop-s":
            stop_s = float(value)
        elif flag == "--start-s":
            start_s = float(value)
        elif flag == "--task-stop-s" and "=" in value:
            name, _, seconds = value.rpartition("=")
            task_stop[name] = float(seconds)
        else:
            return None
    return out, stop_s, start_s, task_stop


def main(argv: list[str]) -> int:
    t_start = time.time()
    parsed = parse_args(argv)
    if parsed is None:
        return _usage()
    out, stop_s, start_s, task_stop = parsed
    event = json.loads(sys.stdin.read())
    kind = event["event"]
    per_resource = kind == "revoked" and event.get("release") == "per-resource"
    # (name, cost, release line payload)
    work: list[tuple[str, float, dict[str, list[object]]]] = []
    for c in event["connectors"]:
        cost = stop_s if kind == "revoked" else start_s
        work.append((c, cost, {"connectors": [c]}))
    for t in event["tasks"]:
        connector, task = t["connector"], t["task"]
        cost = task_stop.get(connector, stop_s) if kind == "revoked" else start_s
        work.append(
            (f"{connector}-{task}", cost, {"tasks": [{"connector": connector, "task": task}]})
        )
    work.sort(key=lambda w: (w[1], w[0]))
    spans: dict[str, list[float]] = {}
    for name, cost, payload in work:
        left = t_start + cost - time.time()
        if left > 0:
            time.sleep(left)
        spans[name] = [t_start, time.time()]
        if per_resource:
            sys.stdout.write(json.dumps({"released": payload}, separators=(",", ":")) + "\n")
            sys.stdout.flush()
    record = {
        "worker": event["member_id"],
        "event": kind,
        "member_epoch": event["member_epoch"],
        "connectors": list(event["connectors"]),
        "tasks": [[t["connector"], t["task"]] for t in event["tasks"]],
        "t_start": t_start,
        "t_end": time.time(),
        "release": event.get("release", "batch"),
        "resources": spans,
    }
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
