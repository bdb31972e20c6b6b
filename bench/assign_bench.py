#!/usr/bin/env python3
"""Assignor micro-benchmark: `assign()` of the built-in assignors, new code against the baseline.

Run from the repo root:

    .venv/bin/python -m bench.assign_bench                        # all three sizes
    .venv/bin/python -m bench.assign_bench --quick                # small sizes only, fewer repeats
    .venv/bin/python -m bench.assign_bench --skip-baseline-large  # no baseline at the largest size

The baseline is the frozen copy of the assignors as they were before the linear-time rewrite
(`tests.support.frozen_assignors_v1`); both run in the same process on the same inputs.
Sizes are workers x tasks, with connectors of 100 tasks each and 40-character connector names.
Scenarios (IncrementalCooperative):

  first    no previous target, members own nothing, no state blob.
  steady   the previous target (the first assignment) installed and owned, its state blob, the
           same members.
  +1       as steady, plus one new worker that owns nothing.

Eager runs on the steady view (it ignores targets and ownership). Each figure is the median
wall time of `assign()` over the repeats (views are built outside the timed region, and a
`gc.collect()` precedes every run, which is not timed); the baseline's largest size runs once.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace

from connect_protocol.resources import ResourceSet, TaskId
from tests.support import frozen_assignors_v1 as frozen_v1
from worker_agent.assignor import (
    SCHEDULED_REBALANCE_MAX_DELAY_MS,
    AssignmentResult,
    ConnectAssignor,
    GroupView,
    MemberView,
)
from worker_agent.assignors import EagerAssignor, IncrementalCooperativeAssignor

TASKS_PER_CONNECTOR = 100
NAME_LENGTH = 40

LARGE = (10_000, 100_000)  # the baseline takes ~30 s a run here: it runs once
SIZES_FULL: tuple[tuple[int, int], ...] = ((100, 5_000), (1_000, 50_000), LARGE)
SIZES_QUICK: tuple[tuple[int, int], ...] = ((100, 5_000), (1_000, 50_000))


def connector_name(index: int) -> str:
    """A 40-character connector name."""
    prefix = "connector-"
    return prefix + str(index).zfill(NAME_LENGTH - len(prefix))


def base_view(workers: int, tasks: int) -> GroupView:
    """The first assignment's view: `workers` members owning nothing, no target, no state."""
    connectors = max(1, tasks // TASKS_PER_CONNECTOR)
    catalogue = {connector_name(i): TASKS_PER_CONNECTOR for i in range(connectors)}
    members = tuple(MemberView(f"worker-{i:06d}", instance_id=f"i-{i:06d}") for i in range(workers))
    return GroupView(
        group_epoch=2,
        assignor_name="incremental_cooperative",
        assignor_version=2,
        members=members,
        catalogue=catalogue,
        assignment_epoch=1,
        configs={SCHEDULED_REBALANCE_MAX_DELAY_MS: "300000"},
        coordinator_time_ms=1_000_000,
    )


def _copy(share: ResourceSet) -> ResourceSet:
    """An equal set of new objects, as the coordinator's wire decoding would give."""
    return ResourceSet.of(share.connectors, [TaskId(t.connector, t.task) for t in share.tasks])


def steady_view(first: GroupView, result: AssignmentResult) -> GroupView:
    """`result` installed and converged: it is the target and every member owns its share
    (equal sets, distinct objects)."""
    members = tuple(
        replace(m, owned=_copy(result.members.get(m.member_id, ResourceSet())))
        for m in first.members
    )
    return replace(
        first,
        group_epoch=first.group_epoch + 1,
        assignment_epoch=first.group_epoch,
        members=members,
        target=dict(result.members),
        assignor_state=result.assignor_state,
        coordinator_time_ms=first.coordinator_time_ms + 1_000,
    )


def added_view(steady: GroupView) -> GroupView:
    """`steady` plus one new worker that owns nothing."""
    newcomer = MemberView("worker-new", instance_id="i-new")
    return replace(steady, members=(*steady.members, newcomer), group_epoch=steady.group_epoch + 1)


def timed(assignor: ConnectAssignor, group: GroupView, repeats: int) -> tuple[float, float]:
    """Median and minimum wall time of `assignor.assign(group)` over `repeats` runs, in ms."""
    samples: list[float] = []
    for _ in range(repeats):
        gc.collect()  # every run starts from the same collector state
        start = time.perf_counter()
        assignor.assign(group)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), min(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="only the two smaller sizes, 3 repeats"
    )
    parser.add_argument(
        "--skip-baseline-large",
        action="store_true",
        help="do not run the baseline at the largest size (it takes about a minute)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="repeats per figure")
    args = parser.parse_args(argv)
    sizes = SIZES_QUICK if args.quick else SIZES_FULL
    repeats = args.repeats or (3 if args.quick else 5)

    implementations: dict[str, Callable[[], tuple[ConnectAssignor, ConnectAssignor]]] = {
        "new": lambda: (IncrementalCooperativeAssignor(), EagerAssignor()),
        "baseline": lambda: (
            frozen_v1.IncrementalCooperativeAssignor(),
            frozen_v1.EagerAssignor(),
        ),
    }
    header = f"{'assignor':<12} {'size':>17} {'scenario':<8} {'baseline ms':>12} {'new ms':>9}"
    header += f" {'speed-up':>9}"
    print(header)
    print("-" * len(header))
    for workers, tasks in sizes:
        first = base_view(workers, tasks)
        steady = steady_view(first, IncrementalCooperativeAssignor().assign(first))
        added = added_view(steady)
        scenarios = (
            ("incremental", "first", first),
            ("incremental", "steady", steady),
            ("incremental", "+1", added),
            ("eager", "steady", steady),
        )
        for kind, scenario, group in scenarios:
            figures: dict[str, float | None] = {}
            for name, make in implementations.items():
                incremental, eager = make()
                assignor = incremental if kind == "incremental" else eager
                if name == "baseline" and (workers, tasks) == LARGE:
                    if args.skip_baseline_large:
                        figures[name] = None
                        continue
                    figures[name] = timed(assignor, group, 1)[0]
                else:
                    figures[name] = timed(assignor, group, repeats)[0]
            old, new = figures["baseline"], figures["new"]
            assert new is not None
            old_text = "-" if old is None else f"{old:,.1f}"
            ratio = "-" if old is None else f"{old / new:,.1f}x"
            size = f"{workers:,} x {tasks:,}"
            print(f"{kind:<12} {size:>17} {scenario:<8} {old_text:>12} {new:>9,.1f} {ratio:>9}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
