#!/usr/bin/env python3
"""Summarise a py-spy raw profile (`py-spy record --format raw --gil --threads`), as written by
`./bench/run-coordinator --profile` into bench/results/profile-<phase>.txt.

  .venv/bin/python bench/profile_summary.py bench/results/profile-steady.txt [--top 25]

Prints, over the samples in which a thread held the GIL (so: where the coordinator's Python CPU
time goes): the share per thread kind, per coarse category (gRPC plumbing, protobuf conversion,
core handler, SQL store, logging, metrics, ...), the top functions by inclusive share and by self
share.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

LINE = re.compile(r"^thread \((\d+)\): ([^;]*);(.*) (\d+)$")

# A sample goes to the category of its innermost frame that belongs to one (walking from the
# running function outwards): a JSON dump inside a log call counts as logging, one inside
# psycopg as the store, a threading.Condition inside gRPC's server as gRPC plumbing.
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("sql store / driver", ("sqlalchemy/", "psycopg/", "coordinator_svc/store/", "store/rows.py")),
    ("logging (structured json)", ("logging/", "connect_protocol/logs.py")),
    ("metrics (prometheus_client)", ("prometheus_client/",)),
    ("core: assignor selection", ("core/selection.py", "Assignor.covers")),
    ("replay / state model (owner index)", ("core/replay.py", "core/model.py")),
    ("core: change set & records", ("core/change.py", "core/records.py")),
    ("core: reconciliation", ("core/reconciliation.py",)),
    (
        "core: handlers, validation, resources",
        (
            "core/heartbeat.py",
            "core/assignment.py",
            "core/admin.py",
            "core/validation.py",
            "connect_protocol/resources.py",
            "connect_protocol/messages.py",
        ),
    ),
    (
        "proto <-> core conversion",
        ("grpc_api/convert.py", "connect_protocol/wire.py", "google/protobuf"),
    ),
    ("timers", ("runtime/timer_service.py", "core/timers.py")),
    (
        "group manager (locks, leases)",
        (
            "runtime/groups.py",
            "runtime/ownership.py",
            "runtime/group_commit.py",
            "runtime/group_timers.py",
            "runtime/owned_group.py",
        ),
    ),
    ("servicer glue", ("grpc_api/servicers.py", "grpc_api/aio.py")),
    (
        "grpc server plumbing (threads, queues, event loop)",
        ("grpc/", "concurrent/futures/", "asyncio/"),
    ),
]


def categorize(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, needles in CATEGORIES:
            if any(n in frame for n in needles):
                return name
    return "other"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()

    total = 0
    threads: Counter[str] = Counter()
    categories: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    for raw in args.profile.read_text().splitlines():
        m = LINE.match(raw.strip())
        if not m:
            continue
        _tid, thread, stack, count_s = m.groups()
        count = int(count_s)
        frames = stack.split(";")
        total += count
        threads[re.sub(r"_?\d+$", "", thread.split(" ")[0]) or thread] += count
        categories[categorize(frames)] += count
        for frame in set(frames):
            inclusive[frame] += count
        self_time[frames[-1]] += count

    if not total:
        print(f"{args.profile}: no samples")
        return 1

    def show(title: str, counter: Counter[str], n: int) -> None:
        print(f"\n{title}")
        for key, value in counter.most_common(n):
            print(f"  {100 * value / total:5.1f}%  {key}")

    print(f"{args.profile}: {total} samples with the GIL held")
    show("by thread", threads, 10)
    show("by category (of the innermost frame that has one)", categories, 20)
    show(f"top {args.top} functions, inclusive", inclusive, args.top)
    show(f"top {args.top} functions, self", self_time, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
