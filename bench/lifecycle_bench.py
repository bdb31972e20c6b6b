#!/usr/bin/env python3
"""The connector lifecycle's cost (issue 28, DESIGN 3.20; run it through ./bench/run-lifecycle;
bench/README.md, "Configs and statuses").

For each size N (members; three sizes, so growth shows), on a fresh database and a fresh
`coordinator-svc serve` at its default member-call rate: N connect workers form a group running
connector `fan` with N tasks (one task each, so all N hold part of it) and connector `solo`
(held by one member). Timed, from the client:

- the PutConnector that changes `fan`'s config: its commit raises the lifecycle revision of its N
  holders (ms); baseline, the same call for `solo` (one holder);
- after it, every member heartbeats, sees its revision moved and calls ConnectGroupConfigs
  (16 threads, one principal): fetches per second, p50/p99 ms, and how many were refused
  (THROTTLING_QUOTA_EXCEEDED; the aim is none at the default rate);
- status reports: every member reports RUNNING for its task, then FAILED with a trace (16
  threads): changes per second; baseline, steady heartbeats per second with the same threads;
- a rebalance that moves every task of `fan` to the next member (N tasks moved, revoked and
  granted, reconciled to STABLE): the rows of `resource_statuses` it wrote (the aim is 0: a
  rebalance writes no status; found by comparing every row's xmin before and after).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "generated"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import sqlalchemy as sa  # noqa: E402
from connect.group.v1 import admin_pb2, common_pb2, coordinator_pb2  # noqa: E402

from connect_protocol.errors import ErrorCode  # noqa: E402
from tests.support.client import IC, ScriptedWorker, from_cat  # noqa: E402
from tests.support.coordinator import CoordinatorProcess, Stubs  # noqa: E402
from tests.support.pgcluster import ThrowawayCluster, create_database  # noqa: E402

GROUP = "lifecycle-bench"
RESULTS = REPO / "bench" / "results"
LONG_MS = 600_000  # no session or deadline may end during a run
THREADS = 16
Resources = tuple[frozenset[str], frozenset[tuple[str, int]]]


def ms(seconds: float) -> float:
    return seconds * 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def put(stubs: Stubs, name: str, tasks: int, version: str) -> float:
    started = time.perf_counter()
    resp = stubs.admin.PutConnector(
        admin_pb2.PutConnectorRequest(
            group_id=GROUP,
            connector=name,
            task_count=tasks,
            config={"topic": name, "password": f"secret-{version}"},
        ),
        timeout=60,
    )
    took = ms(time.perf_counter() - started)
    if resp.error_code != 0:
        raise RuntimeError(f"PutConnector {name}: {resp.error_message}")
    return took


def settle(workers: list[ScriptedWorker], rounds: int = 4) -> None:
    with ThreadPoolExecutor(THREADS) as pool:
        for _ in range(rounds):
            list(pool.map(lambda w: w.heartbeat(), workers))


def install(assignor: ScriptedWorker, targets: dict[str, Resources]) -> None:
    prepared = assignor.prepare()
    if prepared.error_code != 0:
        raise RuntimeError(f"prepare: {prepared.error_message}")
    installed = assignor.install(prepared.group_epoch, targets)
    if installed.error_code != 0:
        raise RuntimeError(f"install: {installed.error_message}")


def share(i: int, n: int) -> Resources:
    connectors = {"fan"} if i == 0 else set()
    if i == 1 % n:
        connectors.add("solo")
    return frozenset(connectors), frozenset({("fan", i)})


def timed_calls(
    workers: list[ScriptedWorker], call: Callable[[ScriptedWorker], Any]
) -> tuple[float, list[float], list[Any]]:
    """Each worker's `call` on THREADS threads: (calls per second, latencies ms, answers)."""
    latencies: list[float] = []

    def one(w: ScriptedWorker) -> Any:
        started = time.perf_counter()
        answer = call(w)
        latencies.append(ms(time.perf_counter() - started))
        return answer

    started = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        answers = list(pool.map(one, workers))
    return len(workers) / (time.perf_counter() - started), latencies, answers


def configs(w: ScriptedWorker) -> Any:
    return w.stubs.coordinator.ConnectGroupConfigs(
        coordinator_pb2.ConnectGroupConfigsRequest(
            group_id=GROUP, member_id=w.member_id, member_epoch=w.epoch
        ),
        timeout=60,
    )


def report(w: ScriptedWorker, state: int, tokens: dict[str, int]) -> Any:
    entry = coordinator_pb2.StatusEntry(
        connector="fan",
        task=sorted(t for _, t in w.owned[1])[0],
        fencing_token=tokens[w.member_id],
        state=state,  # type: ignore[arg-type]
        trace="" if state == common_pb2.RUNNING else "java.lang.RuntimeException: bench",
    )
    return w.stubs.coordinator.ConnectGroupReportStatus(
        coordinator_pb2.ConnectGroupReportStatusRequest(
            group_id=GROUP, member_id=w.member_id, member_epoch=w.epoch, entries=[entry]
        ),
        timeout=60,
    )


def status_rows(db: str) -> dict[tuple[str, int], str]:
    engine = sa.create_engine(db.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT connector, task, xmin::text FROM resource_statuses")
            ).all()
    finally:
        engine.dispose()
    return {(r[0], int(r[1])): str(r[2]) for r in rows}


def bench_coordinator(cluster_url: str, name: str, *extra: str) -> tuple[str, CoordinatorProcess]:
    """A fresh database `name` and a `coordinator-svc serve` on it whose sessions and deadlines
    outlast a run (computations at every bump), with `extra` flags; its log in bench/results."""
    db = create_database(cluster_url, f"{name}_{int(time.time())}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    proc = CoordinatorProcess(
        db,
        "--session-timeout-ms",
        str(LONG_MS),
        "--heartbeat-interval-ms",
        "10000",
        "--rebalance-timeout-ms",
        str(LONG_MS),
        "--assignment-interval-ms",
        "0",
        *extra,
        log_path=RESULTS / f"{name.replace('_', '-')}-coordinator.log",
    ).start()
    return db, proc


def run_size(cluster_url: str, n: int) -> dict[str, float]:
    db, proc = bench_coordinator(cluster_url, f"lifecycle_{n}")
    stubs = Stubs(proc.address)
    try:
        put(stubs, "fan", n, "0")
        put(stubs, "solo", 0, "0")
        workers = [ScriptedWorker(stubs, GROUP, f"w{i:05d}", assignors=(IC,)) for i in range(n)]
        for w in workers:
            w.join()
        settle(workers, 1)
        assignor = next(w for w in workers if w.last.error_code == ErrorCode.COMPUTE_ASSIGNMENT)
        install(assignor, {w.member_id: share(i, n) for i, w in enumerate(workers)})
        settle(workers)
        held = sum(1 for w in workers if w.owned[1])
        if held != n:
            raise RuntimeError(f"{held} of {n} members run a task of fan")

        # The config change and its fan-out.
        fan_ms = statistics.median(put(stubs, "fan", n, f"v{k}") for k in range(1, 4))
        solo_ms = statistics.median(put(stubs, "solo", 0, f"v{k}") for k in range(1, 4))
        revisions = [w.heartbeat(report_owned=False).lifecycle_revision for w in workers]
        fetch_rate, fetch_ms, answers = timed_calls(workers, configs)
        refused = sum(1 for a in answers if a.error_code == ErrorCode.THROTTLING_QUOTA_EXCEEDED)
        wrong = [a for a in answers if a.error_code not in (0, ErrorCode.THROTTLING_QUOTA_EXCEEDED)]
        if wrong:
            raise RuntimeError(f"ConnectGroupConfigs: {wrong[0].error_message}")
        if any(
            a.lifecycle_revision != r
            for a, r in zip(answers, revisions, strict=True)
            if a.error_code == 0
        ):
            raise RuntimeError("a fetch answered another revision than the heartbeat")

        # Status reports, and steady heartbeats as their baseline.
        tokens = {}
        for w in workers:
            w.owned = (frozenset(), frozenset())
            beat = w.heartbeat()  # the whole assignment again, with its tokens
            w.owned = from_cat(beat.assignment.connectors_and_tasks)
            tokens[w.member_id] = next(
                t.token for t in beat.assignment.fencing_tokens if t.HasField("task")
            )
        running_rate, _, _ = timed_calls(workers, lambda w: report(w, common_pb2.RUNNING, tokens))
        failed_rate, _, failed = timed_calls(
            workers, lambda w: report(w, common_pb2.FAILED, tokens)
        )
        if any(a.error_code != 0 or a.results[0].error_code != 0 for a in failed):
            raise RuntimeError(f"a status report was refused: {failed[0]}")
        heartbeat_rate, _, _ = timed_calls(workers, lambda w: w.heartbeat(report_owned=False))

        # A rebalance moving every task of fan: status rows written.
        before = status_rows(db)
        # The group epoch must move first: a connector without tasks is added (no status).
        put(stubs, "epoch-bump", 0, "0")
        settle(workers, 1)
        chosen = next(w for w in workers if w.last.error_code == ErrorCode.COMPUTE_ASSIGNMENT)
        targets = {}
        for i, w in enumerate(workers):
            connectors, _ = share(i, n)
            if i == 0:
                connectors = connectors | {"epoch-bump"}
            targets[w.member_id] = (connectors, frozenset({("fan", (i + 1) % n)}))
        install(chosen, targets)
        settle(workers, 6)
        moved = sum(
            1 for i, w in enumerate(workers) if w.owned[1] == frozenset({("fan", (i + 1) % n)})
        )
        if moved != n:
            raise RuntimeError(f"only {moved} of {n} members run their new task")
        after = status_rows(db)
        written = sum(1 for key, xmin in after.items() if before.get(key) != xmin)
        written += sum(1 for key in before if key not in after)
        return {
            "members": n,
            "fan_put_ms": fan_ms,
            "solo_put_ms": solo_ms,
            "fetch_per_s": fetch_rate,
            "fetch_p50_ms": statistics.median(fetch_ms),
            "fetch_p99_ms": pct(fetch_ms, 0.99),
            "fetch_refused": refused,
            "status_changes_per_s": statistics.mean([running_rate, failed_rate]),
            "heartbeats_per_s": heartbeat_rate,
            "rebalance_tasks_moved": moved,
            "rebalance_status_rows_written": written,
        }
    finally:
        stubs.close()
        proc.close()


def run_sizes(
    run: Callable[[str, int], dict[str, float]], sizes: list[int]
) -> list[dict[str, float]]:
    """`run(cluster_url, size)` for each size, on one throwaway PostgreSQL."""
    cluster = ThrowawayCluster()
    cluster.start()
    try:
        return [run(cluster.url, n) for n in sizes]
    finally:
        cluster.stop()


def print_table(heads: list[tuple[str, str]], rows: list[dict[str, float]]) -> None:
    """One line per (key, label), a column per row (size)."""
    width = max(len(label) for _, label in heads)
    for key, label in heads:
        print(label.ljust(width) + "".join(f" | {row[key]:>9.1f}" for row in rows))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="100,300,1000", help="members per run")
    a = p.parse_args()
    rows = run_sizes(run_size, [int(s) for s in a.sizes.split(",")])
    heads = [
        ("members", "members (holders of fan)"),
        ("fan_put_ms", "config change of fan (N holders) ms"),
        ("solo_put_ms", "config change of solo (1 holder) ms (baseline)"),
        ("fetch_per_s", "ConnectGroupConfigs fetches /s after it"),
        ("fetch_p50_ms", "fetch p50 ms"),
        ("fetch_p99_ms", "fetch p99 ms"),
        ("fetch_refused", "fetches refused (default rate)"),
        ("status_changes_per_s", "status changes /s"),
        ("heartbeats_per_s", "steady heartbeats /s (baseline)"),
        ("rebalance_tasks_moved", "tasks moved by the rebalance"),
        ("rebalance_status_rows_written", "status rows it wrote"),
    ]
    print_table(heads, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
