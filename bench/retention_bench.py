#!/usr/bin/env python3
"""Event retention's cost (issue 30, DESIGN 3.20; run it through ./bench/run-retention;
bench/README.md, "Event retention").

For each size S (events to prune; three sizes, so growth shows), on a durable PostgreSQL
(fsync, synchronous_commit and full_page_writes on) and a fresh `coordinator-svc serve` with
`--event-retention-ms` set (an hour) and its default rate (10,000 rows a second): S events two
days old are written straight into the table (about 250 bytes of payload each), then 10,000
more as old, and a group of 100 members forms (connector of 100 tasks, every member STABLE).
No audit export is registered yet, so the pruner looks (every 250 ms) and deletes nothing: the
baseline. Measured, in the same run and on the same coordinator:

- steady heartbeats (a load generator process, `bench/loadgen.py`, 6 threads, closed loop,
  no field changed: answered from memory, no database), 5 s after 1 s warm-up: rate, p50 and
  p99; and commits (AlterGroupConfigs on another group, one thread, closed loop: a transaction
  with an event row each), 4 s: p50 and p99;
- then an export's progress is registered (as the audit export appends it) with its latest
  run starting after the first S events, so those S may go, and once the pruner has begun,
  the same two windows while it deletes: again rate and percentiles, and the events deleted per
  second over the windows;
- the time until all S are gone (events deleted per second over the whole), and that none of
  the events the export still needs (the 10,000 old ones after its start, the group's) was.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "generated"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import psycopg  # noqa: E402
from connect.group.v1 import admin_pb2  # noqa: E402

from bench.coordinator_bench import Child, free_port, log  # noqa: E402
from bench.lifecycle_bench import (  # noqa: E402
    GROUP,
    RESULTS,
    bench_coordinator,
    install,
    pct,
    print_table,
    put,
    settle,
)
from connect_protocol.errors import ErrorCode  # noqa: E402
from tests.support.client import IC, ScriptedWorker  # noqa: E402
from tests.support.coordinator import Stubs  # noqa: E402
from tests.support.pgcluster import ThrowawayCluster, libpq_url  # noqa: E402

MEMBERS = 100
TASKS = 100
#: Old events above the registered export's start: old enough, but the export still needs them.
NEEDED_OLD = 10_000
STEADY_S = 5.0
COMMITS_S = 4.0
LOADGEN_THREADS = 6
COMMIT_GROUP = "retention-bench-commits"
DURABLE = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "max_wal_size": "4GB",
}


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise RuntimeError(f"{name} not exported")


def write_old_events(db: str, count: int) -> None:
    """`count` events two days old, as a coordinator writes them (a few hundred bytes each)."""
    with psycopg.connect(libpq_url(db), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO events (occurred_at, at_ms, group_id, group_epoch, event_type, "
            "member_id, payload) SELECT now() - interval '2 days', "
            "(extract(epoch FROM now() - interval '2 days') * 1000)::bigint, "
            "'old-' || (g %% 1000), g, 'ASSIGNMENT_DELIVERED', 'member-' || (g %% 100), "
            "jsonb_build_object('n', g, 'assignment', repeat('x', 220)) "
            "FROM generate_series(1, %s) g",
            (count,),
        )
        conn.execute("VACUUM ANALYZE events")


def sql_value(db: str, query: str, *params: Any) -> int:
    with psycopg.connect(libpq_url(db)) as conn:
        row = conn.execute(query, params).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def register(db: str, since: int, until: int) -> None:
    """What the audit export appends after a committed run."""
    with psycopg.connect(libpq_url(db), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO audit_export_progress (export_name, since_event_id, until_event_id, "
            "lowest_unfilled_id, at) VALUES ('bench', %s, %s, %s, now())",
            (since, until, until + 1),
        )


class Commits:
    """AlterGroupConfigs in a closed loop on one thread (each a commit with an event row),
    latencies kept while `measure` is set."""

    def __init__(self, stubs: Stubs) -> None:
        self._stubs = stubs
        self._stop = threading.Event()
        self.measure = threading.Event()
        self.samples: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            request = admin_pb2.AlterGroupConfigsRequest(
                group_id=COMMIT_GROUP, set={"rebalance.wave.pause.ms": str(n % 2)}
            )
            started = time.perf_counter()
            resp = self._stubs.admin.AlterGroupConfigs(request, timeout=60)
            took = (time.perf_counter() - started) * 1000
            if resp.error_code != 0:
                raise RuntimeError(f"AlterGroupConfigs: {resp.error_message}")
            if self.measure.is_set():
                self.samples.append(took)

    def window(self, seconds: float) -> list[float]:
        self.samples = []
        self.measure.set()
        time.sleep(seconds)
        self.measure.clear()
        return list(self.samples)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)


def steady(loadgen: Child, members: list[dict[str, Any]]) -> dict[str, float]:
    loadgen.send(
        {
            "op": "steady",
            "group": GROUP,
            "members": members,
            "duration_s": STEADY_S,
            "warmup_s": 1.0,
        }
    )
    out = loadgen.receive(STEADY_S + 60)
    if "failed" in out or out["errors"]:
        raise RuntimeError(f"steady heartbeats: {out}")
    kind = out["kinds"]["steady"]
    return {"rate": kind["rate_per_s"], "p50": kind["p50_ms"], "p99": kind["p99_ms"]}


def run_size(cluster_url: str, size: int, rows_per_s: int) -> dict[str, float]:
    metrics = free_port()
    db, proc = bench_coordinator(
        cluster_url,
        f"retention_{size}",
        *("--event-retention-ms", "3600000", "--event-prune-interval-ms", "250"),
        *("--event-prune-rows-per-s", str(rows_per_s)),
        *("--metrics-port", str(metrics), "--metrics-host", "127.0.0.1"),
    )
    stubs = Stubs(proc.address)
    loadgen = None
    commits = Commits(stubs)
    try:
        log(f"{size}: writing {size + NEEDED_OLD} old events")
        write_old_events(db, size + NEEDED_OLD)
        log(f"{size}: forming a group of {MEMBERS}")
        put(stubs, "fan", TASKS, "0")
        created = stubs.admin.PutConnector(
            admin_pb2.PutConnectorRequest(group_id=COMMIT_GROUP, connector="c", task_count=0),
            timeout=60,
        )
        if created.error_code != 0:
            raise RuntimeError(f"PutConnector: {created.error_message}")
        workers = [
            ScriptedWorker(stubs, GROUP, f"w{i:03d}", assignors=(IC,)) for i in range(MEMBERS)
        ]
        for w in workers:
            w.join()
        settle(workers, 1)
        assignor = next(w for w in workers if w.last.error_code == ErrorCode.COMPUTE_ASSIGNMENT)
        install(
            assignor,
            {
                w.member_id: (
                    frozenset({"fan"} if i == 0 else set()),
                    frozenset(("fan", t) for t in range(i, TASKS, MEMBERS)),
                )
                for i, w in enumerate(workers)
            },
        )
        settle(workers)
        members = [
            {"id": w.member_id, "epoch": w.heartbeat(report_owned=False).member_epoch}
            for w in workers
        ]
        loadgen = Child(
            "loadgen",
            [
                sys.executable,
                str(REPO / "bench" / "loadgen.py"),
                *("--target", proc.address, "--threads", str(LOADGEN_THREADS)),
            ],
            RESULTS / f"retention-{size}-loadgen.log",
            stdin=True,
        )
        loadgen.receive(60)  # ready
        commits.start()

        # Without pruning: retention on, nothing registered, so nothing may go.
        log(f"{size}: steady heartbeats and commits, no pruning")
        base_steady = steady(loadgen, members)
        base_commits = commits.window(COMMITS_S)
        log(f"{size}: {base_steady}, commit p99 {pct(base_commits, 0.99):.1f} ms")
        if metric(metrics, "coordinator_events_pruned_total") != 0:
            raise RuntimeError("events were pruned before any export was registered")

        # Pruning: an export whose latest run started at event `size`: the old events after it,
        # and the group's, stay.
        top = sql_value(db, "SELECT max(id) FROM events")
        needed = top - size
        register(db, size, top)
        registered = time.monotonic()
        while metric(metrics, "coordinator_events_pruned_total") == 0:
            time.sleep(0.05)
        pruned_before = metric(metrics, "coordinator_events_pruned_total")
        window_started = time.monotonic()
        log(f"{size}: pruning began ({pruned_before:.0f} so far); the same windows")
        prune_steady = steady(loadgen, members)
        prune_commits = commits.window(COMMITS_S)
        pruned_in_windows = metric(metrics, "coordinator_events_pruned_total") - pruned_before
        windows_s = time.monotonic() - window_started
        log(
            f"{size}: {prune_steady}, commit p99 {pct(prune_commits, 0.99):.1f} ms; "
            f"{pruned_in_windows:.0f} pruned in {windows_s:.1f} s"
        )
        if metric(metrics, "coordinator_events_pruned_through_id") >= size:
            raise RuntimeError("pruning ended before the windows did: use a larger size")
        while metric(metrics, "coordinator_events_pruned_through_id") < size:
            time.sleep(0.1)
        all_s = time.monotonic() - registered
        left = sql_value(db, "SELECT count(*) FROM events WHERE id <= %s", size)
        kept = sql_value(db, "SELECT count(*) FROM events WHERE id > %s AND id <= %s", size, top)
        return {
            "events": size,
            "rows_per_s_windows": pruned_in_windows / windows_s,
            "rows_per_s_all": size / all_s,
            "prune_all_s": all_s,
            "old_left": left,
            "needed_lost": needed - kept,
            "steady_rate_base": base_steady["rate"],
            "steady_rate_prune": prune_steady["rate"],
            "steady_p50_base": base_steady["p50"],
            "steady_p50_prune": prune_steady["p50"],
            "steady_p99_base": base_steady["p99"],
            "steady_p99_prune": prune_steady["p99"],
            "commit_p50_base": statistics.median(base_commits),
            "commit_p50_prune": statistics.median(prune_commits),
            "commit_p99_base": pct(base_commits, 0.99),
            "commit_p99_prune": pct(prune_commits, 0.99),
        }
    finally:
        commits.stop()
        if loadgen is not None:
            loadgen.send({"op": "quit"})
            loadgen.stop()
        stubs.close()
        proc.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="200000,500000,1000000", help="events to prune per run")
    p.add_argument("--rows-per-s", type=int, default=10_000, help="serve --event-prune-rows-per-s")
    a = p.parse_args()
    with ThrowawayCluster(settings=DURABLE) as cluster:
        rows = [run_size(cluster.url, int(s), a.rows_per_s) for s in a.sizes.split(",")]
    heads = [
        ("events", "old events to prune"),
        ("rows_per_s_windows", "events pruned /s (during the windows)"),
        ("rows_per_s_all", "events pruned /s (all of them)"),
        ("prune_all_s", "seconds to prune all"),
        ("old_left", "old events left"),
        ("needed_lost", "events the export needs, deleted"),
        ("steady_rate_base", "steady heartbeats /s, no pruning (baseline)"),
        ("steady_rate_prune", "steady heartbeats /s, pruning"),
        ("steady_p50_base", "steady p50 ms, no pruning (baseline)"),
        ("steady_p50_prune", "steady p50 ms, pruning"),
        ("steady_p99_base", "steady p99 ms, no pruning (baseline)"),
        ("steady_p99_prune", "steady p99 ms, pruning"),
        ("commit_p50_base", "commit p50 ms, no pruning (baseline)"),
        ("commit_p50_prune", "commit p50 ms, pruning"),
        ("commit_p99_base", "commit p99 ms, no pruning (baseline)"),
        ("commit_p99_prune", "commit p99 ms, pruning"),
    ]
    print_table(heads, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
