#!/usr/bin/env python3
"""TOAST compression of the coordinator's commits (issue 24): the members' share columns on lz4,
as migration 0009 sets them, against pglz, PostgreSQL's default, in the same run (run it through
./bench/run-toast; bench/README.md, "TOAST compression").

A throwaway PostgreSQL with durable commits. For each share size (tasks per member: three sizes,
so growth shows) and each method, a fresh database migrated to head (the pglz cell then sets the
members' columns back to pglz) and a fresh `SqlStore`; a group of 200 members; then BATCHES
commits through `SqlStore.commit`, each what a batch of 10 member changes writes during a
rebalance: 10 member rows (the member's whole share and fencing tokens, tasks spread over 1,000
connectors with 40-character names as in run-scale) and 10 events carrying the share (events
stay on the server's default in both). Printed per size and method: ms per commit (p50, mean),
the members' and events' table sizes, and the method PostgreSQL reports for the stored tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "generated"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import sqlalchemy as sa  # noqa: E402

from connect_protocol.resources import ResourceSet, TaskId  # noqa: E402
from connect_protocol.tokens import FencingTokens  # noqa: E402
from coordinator_svc.core.model import GroupMeta, Member, MemberState  # noqa: E402
from coordinator_svc.core.records import (  # noqa: E402
    EventRecord,
    EventType,
    GroupMetaRecord,
    MemberRecord,
    Record,
)
from coordinator_svc.store import Lease, SqlStore  # noqa: E402
from tests.support.pgcluster import ThrowawayCluster, create_database  # noqa: E402

GROUP = "toast-bench"
MEMBERS = 200
PER_BATCH = 10
CONNECTORS = [f"scale-benchmark-connector-number-{i:07d}" for i in range(1_000)]
PG_SETTINGS = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}


def share(member: int, tasks: int, version: int) -> ResourceSet:
    """`tasks` tasks spread over the connectors (a different spread for each `version`), and
    one connector in nine of the member's."""
    picked = [
        TaskId(CONNECTORS[(member * 7 + j * 13 + version) % 1_000], (member + j + version) % 1_000)
        for j in range(tasks)
    ]
    return ResourceSet.of([c for c, _ in picked[::9]], picked)


def tokens_of(resources: ResourceSet, first: int) -> FencingTokens:
    by_connector = {c: first + k for k, c in enumerate(sorted(resources.connectors))}
    by_task = {t: first + k for k, t in enumerate(resources.ordered_tasks())}
    return FencingTokens._of(by_connector, by_task)


def member(member_id: str, k: int, tasks: int, version: int) -> Member:
    assigned = share(k, tasks, version)
    return Member(
        member_id=member_id,
        member_epoch=10 + version,
        previous_epoch=9 + version,
        url=f"http://{member_id}.bench.invalid:8083",
        rebalance_timeout_ms=60_000,
        state=MemberState.STABLE,
        assigned=assigned,
        tokens=tokens_of(assigned, 1 + version * 10_000),
        stable_since_epoch=10 + version,
    )


MEMBER_SETS = ("assigned", "pending_revocation", "fencing_tokens")


def run_one(url: str, tasks: int, batches: int, method: str) -> dict[str, object]:
    store = SqlStore(url, "toast-bench", "127.0.0.1:1", lease_ms=3_600_000)
    try:
        store.migrate()
        if method == "pglz":
            with store._transaction(write=True) as conn:
                conn.execute(
                    sa.text(
                        "ALTER TABLE members "
                        + ", ".join(f"ALTER COLUMN {c} SET COMPRESSION pglz" for c in MEMBER_SETS)
                    )
                )
        lease = store.try_acquire(GROUP)
        assert isinstance(lease, Lease)
        ids = [f"member-{k:04d}" for k in range(MEMBERS)]
        created: list[Record] = [GroupMetaRecord(GroupMeta(GROUP, 10))]
        created += [MemberRecord(GROUP, member(m, k, tasks, 0)) for k, m in enumerate(ids)]
        store.commit(lease, created)
        took: list[float] = []
        for b in range(batches):
            records: list[Record] = []
            for j in range(PER_BATCH):
                k = (b * PER_BATCH + j) % MEMBERS
                changed = member(ids[k], k, tasks, 1 + b)
                records.append(MemberRecord(GROUP, changed))
                records.append(
                    EventRecord(
                        GROUP,
                        10 + b,
                        EventType.ASSIGNMENT_DELIVERED,
                        0,
                        ids[k],
                        {"assigned": changed.assigned.to_json(), "state": "STABLE"},
                    )
                )
            started = time.perf_counter()
            store.commit(lease, records)
            took.append((time.perf_counter() - started) * 1000)
        with store._transaction(write=False) as conn:
            stored = conn.execute(
                sa.text(
                    "SELECT string_agg(DISTINCT coalesce(pg_column_compression(fencing_tokens), "
                    "'none'), ',') FROM members"
                )
            ).scalar_one()
            sizes = {
                table: conn.execute(
                    sa.text(f"SELECT pg_total_relation_size('{table}')")
                ).scalar_one()
                for table in ("members", "events")
            }
        return {
            "stored": stored,
            "p50_ms": statistics.median(took),
            "mean_ms": statistics.fmean(took),
            "members_mb": sizes["members"] / 2**20,
            "events_mb": sizes["events"] / 2**20,
        }
    finally:
        store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="30,100,300", help="tasks per member, comma-separated")
    parser.add_argument("--batches", type=int, default=200, help="commits per size and method")
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    cluster = ThrowawayCluster(settings=PG_SETTINGS)
    cluster.start()
    try:
        rows = []
        for tasks in sizes:
            for method in ("pglz", "lz4"):
                url = create_database(cluster.url, f"toast_{method}_{tasks}")
                out = run_one(url, tasks, args.batches, method)
                rows.append((tasks, method, out))
                print(
                    f"[toast] {tasks} tasks/member, {method}: p50 {out['p50_ms']:.2f} ms per "
                    f"commit of {PER_BATCH} member changes",
                    flush=True,
                )
    finally:
        cluster.stop()
    print()
    print(
        f"Commits of {PER_BATCH} member changes (row + event each), {args.batches} per cell; "
        f"PostgreSQL fsync=on synchronous_commit=on; baseline: the members' columns on pglz "
        "(PostgreSQL's default; the code before migration 0009)"
    )
    header = ("tasks/member", "method", "stored as", "p50 ms", "mean ms", "vs pglz",
              "members MB", "events MB")  # fmt: skip
    print(" | ".join(header))
    base: dict[int, float] = {}
    for tasks, method, out in rows:
        if method == "pglz":
            base[tasks] = float(out["mean_ms"])  # type: ignore[arg-type]
        ratio = float(out["mean_ms"]) / base[tasks]  # type: ignore[arg-type]
        print(
            f"{tasks:>12} | {method:>6} | {out['stored']!s:>9} | {out['p50_ms']:6.2f} | "
            f"{out['mean_ms']:7.2f} | {ratio:6.0%} | {out['members_mb']:10.1f} | "
            f"{out['events_mb']:9.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
