#!/usr/bin/env python3
"""Garbage-collection pauses while a large group's state grows (issue 24), with the coordinator's
policy (`coordinator_svc.runtime.gc_pauses`: survivors of a long, fruitless full collection
frozen at most every 5 s, the frozen heap handed back every 10 minutes) against the code before
it (at most once a minute), each in a fresh interpreter, same run (./bench/run-gc;
bench/README.md, "Garbage-collection pauses").

The workload builds what a forming group leaves in memory, in the coordinator's own types: for
each new member, a `ResourceSet` share of TASKS tasks over 1,000 connectors and its fencing
tokens (`FencingTokens`), kept in a dict as a group's members are; every step also replaces
the shares of 10 earlier members (a rebalance's churn: garbage without cycles) and drops a few
small reference cycles (as requests leave behind). The interpreter's thresholds are the
coordinator's (CPython's defaults after `gc_pauses.tune`). Printed per member count (three, so
growth shows) and policy: full collections, the longest and total pause, and freezes.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "generated"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from prometheus_client import CollectorRegistry, Histogram  # noqa: E402

from connect_protocol.resources import ResourceSet, TaskId  # noqa: E402
from connect_protocol.tokens import FencingTokens  # noqa: E402
from coordinator_svc.runtime import gc_pauses  # noqa: E402

CONNECTORS = [f"connector-{i:05d}" for i in range(1_000)]


def share(member: int, version: int, tasks: int) -> tuple[ResourceSet, FencingTokens]:
    picked = [
        TaskId(CONNECTORS[(member * 7 + j * 13 + version) % 1_000], (member + j + version) % 500)
        for j in range(tasks)
    ]
    resources = ResourceSet.of([c for c, _ in picked[::9]], picked)
    tokens = FencingTokens._of(
        {c: version for c in resources.connectors}, {t: version for t in resources.tasks}
    )
    return resources, tokens


class Request:
    """A stand-in for what a request leaves behind: a small reference cycle."""

    def __init__(self) -> None:
        self.me = self


def workload(members: int, tasks: int, policy: str) -> dict[str, Any]:
    if policy == "before":
        gc_pauses.FREEZE_EVERY_S = 60.0  # the code before this change
    gc_pauses.tune()
    pauses = Histogram("p", "p", ["generation"], registry=CollectorRegistry())
    full: list[float] = []

    class Timing:
        started = 0.0

        def __call__(self, phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                Timing.started = time.perf_counter()
            elif info["generation"] == 2:
                full.append(time.perf_counter() - Timing.started)

    timing = Timing()
    gc.callbacks.append(timing)  # before the observer: its freeze is not counted as a pause
    observer = gc_pauses.observe(pauses)
    group: dict[str, tuple[ResourceSet, FencingTokens]] = {}
    started = time.perf_counter()
    for k in range(members):
        group[f"member-{k:05d}"] = share(k, 0, tasks)
        for j in range(10):
            earlier = (k * 31 + j * 17) % (k + 1)
            group[f"member-{earlier:05d}"] = share(earlier, k + 1, tasks)
        for _ in range(5):
            Request()
    took = time.perf_counter() - started
    gc_pauses.stop_observing(observer)
    gc.callbacks.remove(timing)
    return {
        "members": members,
        "policy": policy,
        "seconds": took,
        "full_collections": len(full),
        "longest_ms": max(full, default=0.0) * 1000,
        "total_ms": sum(full) * 1000,
        "freezes": observer.frozen_times,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", default="1000,3000,10000", help="comma-separated sizes")
    parser.add_argument("--tasks", type=int, default=100, help="tasks per member")
    parser.add_argument("--one", nargs=2, metavar=("MEMBERS", "POLICY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(workload(int(args.one[0]), args.tasks, args.one[1])))
        return 0
    rows = []
    for members in (int(x) for x in args.members.split(",")):
        for policy in ("before", "now"):
            out = subprocess.run(
                [sys.executable, __file__, "--one", str(members), policy, "--tasks",
                 str(args.tasks)],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            row = json.loads(out)
            rows.append(row)
            print(
                f"[gc] {members} members, {policy}: {row['full_collections']} full collections, "
                f"longest {row['longest_ms']:.0f} ms",
                flush=True,
            )
    print()
    print(
        f"Full collections while a group of N members x {args.tasks} tasks is built with churn; "
        "baseline 'before': survivors frozen at most once a minute; 'now': every 5 s"
    )
    print("members | policy | seconds | full collections | longest ms | total ms | freezes")
    for r in rows:
        print(
            f"{r['members']:>7} | {r['policy']:>6} | {r['seconds']:7.1f} | "
            f"{r['full_collections']:>16} | {r['longest_ms']:10.0f} | {r['total_ms']:8.0f} | "
            f"{r['freezes']:>7}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
