#!/usr/bin/env python3
"""Online migration's cost (issue 27, DESIGN 3.19; run it through ./bench/run-migration;
bench/README.md, "Online migration").

For each size N (classic workers; three sizes, so growth shows), on a fresh database and a fresh
`coordinator-svc serve`: N eager classic workers form a classic group running 2N tasks; one
connect worker joins, which converts the group (the upgrade: timed); it computes a target that
moves nothing to a new epoch, so every classic worker learns by heartbeat that it must rejoin;
then each classic worker's translated JoinGroup + SyncGroup round is timed, one worker after the
other (the figure: ms per member round, p50 and p99). Baselines in the same run and group: a
classic worker's steady Heartbeat, and a new connect worker's join round (the epoch-0 heartbeat
and the next one, the connect protocol's counterpart of JoinGroup + SyncGroup).
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

from connect.group.v1 import classic_pb2  # noqa: E402

from bench.classic_phases import CALLS_PER_CHANNEL, ClassicCalls  # noqa: E402
from connect_protocol.errors import ErrorCode  # noqa: E402
from tests.support.client import (  # noqa: E402
    IC,
    ScriptedWorker,
    describe,
    from_cat,
    put_connector,
)
from tests.support.coordinator import CoordinatorProcess, Stubs  # noqa: E402
from tests.support.pgcluster import ThrowawayCluster, create_database  # noqa: E402

GROUP = "migration-bench"
RESULTS = REPO / "bench" / "results"
LONG_MS = 600_000  # no session or deadline may end during a run


def ms(seconds: float) -> float:
    return seconds * 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_size(cluster_url: str, n: int, baseline_joins: int) -> dict[str, float]:
    from connect.group.v1 import common_pb2

    eager = common_pb2.Assignor(name="eager", minimum_version=0, maximum_version=0)
    db = create_database(cluster_url, f"migration_{n}_{int(time.time())}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    proc = CoordinatorProcess(
        db,
        "--classic-min-session-timeout-ms",
        "100",
        "--classic-initial-rebalance-delay-ms",
        "100",
        "--session-timeout-ms",
        str(LONG_MS),
        "--heartbeat-interval-ms",
        "10000",
        "--rebalance-timeout-ms",
        str(LONG_MS),
        "--assignment-interval-ms",
        "0",
        log_path=RESULTS / f"migration-{n}-coordinator.log",
    ).start()
    stubs = Stubs(proc.address)
    calls = ClassicCalls(proc.address, max(1, n // CALLS_PER_CHANNEL + 1))
    try:
        put_connector(stubs, GROUP, "bench", 2 * n)
        members = calls.form(GROUP, "c", n, LONG_MS, LONG_MS)
        w = ScriptedWorker(stubs, GROUP, "w-assignor", assignors=(IC, eager))
        started = time.perf_counter()
        joined = w.join()
        upgrade_ms = ms(time.perf_counter() - started)
        if joined.error_code not in (0, ErrorCode.COMPUTE_ASSIGNMENT):
            raise RuntimeError(f"connect join: {joined.error_message}")
        group = describe(stubs, GROUP)
        if group.group_type != "connect":
            raise RuntimeError(f"not converted: {group.group_type}")
        prepared = w.prepare()
        shares = {m.member_id: from_cat(m.current_assignment) for m in group.members}
        installed = w.install(prepared.group_epoch, shares)
        if installed.error_code != 0:
            raise RuntimeError(f"install: {installed.error_message}")
        w.heartbeat()
        stub = calls.stub(0)
        rounds: list[float] = []
        generations: dict[str, int] = {}
        for member_id in members.ids:
            req = ClassicCalls.join_request(
                GROUP, member_id, f"http://{member_id}.bench.invalid:8083", LONG_MS, LONG_MS
            )
            started = time.perf_counter()
            join = stub.JoinGroup(req, timeout=60)
            sync = stub.SyncGroup(
                classic_pb2.SyncGroupRequest(
                    group_id=GROUP, generation_id=join.generation_id, member_id=member_id
                ),
                timeout=60,
            )
            rounds.append(ms(time.perf_counter() - started))
            generations[member_id] = join.generation_id
            if join.error_code != 0 or sync.error_code != 0:
                raise RuntimeError(
                    f"{member_id}: JoinGroup {ErrorCode(join.error_code).name}, SyncGroup "
                    f"{ErrorCode(sync.error_code).name} {sync.error_message}"
                )
        beats: list[float] = []
        for member_id in members.ids[: min(200, n)]:
            started = time.perf_counter()
            resp = stub.Heartbeat(
                classic_pb2.HeartbeatRequest(
                    group_id=GROUP,
                    generation_id=generations[member_id],
                    member_id=member_id,
                ),
                timeout=30,
            )
            beats.append(ms(time.perf_counter() - started))
            if resp.error_code != 0:
                raise RuntimeError(f"{member_id} heartbeat: {ErrorCode(resp.error_code).name}")
        connect_rounds: list[float] = []
        for k in range(baseline_joins):
            worker = ScriptedWorker(stubs, GROUP, f"w-{k}", assignors=(IC, eager))
            started = time.perf_counter()
            worker.join()
            worker.heartbeat()
            connect_rounds.append(ms(time.perf_counter() - started))
        return {
            "members": n,
            "upgrade_join_ms": upgrade_ms,
            "translated_round_p50_ms": statistics.median(rounds),
            "translated_round_p99_ms": pct(rounds, 0.99),
            "classic_heartbeat_p50_ms": statistics.median(beats),
            "connect_join_round_p50_ms": statistics.median(connect_rounds),
            "connect_join_round_p99_ms": pct(connect_rounds, 0.99),
        }
    finally:
        calls.close()
        stubs.close()
        proc.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="100,300,1000", help="classic workers per run")
    p.add_argument("--baseline-joins", type=int, default=50, help="connect joins timed per size")
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    cluster = ThrowawayCluster()
    cluster.start()
    try:
        rows = [run_size(cluster.url, n, a.baseline_joins) for n in sizes]
    finally:
        cluster.stop()
    heads = [
        ("members", "classic workers"),
        ("upgrade_join_ms", "upgrade (connect join) ms"),
        ("translated_round_p50_ms", "translated Join+Sync p50 ms"),
        ("translated_round_p99_ms", "translated Join+Sync p99 ms"),
        ("classic_heartbeat_p50_ms", "classic Heartbeat p50 ms (baseline)"),
        ("connect_join_round_p50_ms", "connect join round p50 ms (baseline)"),
        ("connect_join_round_p99_ms", "connect join round p99 ms (baseline)"),
    ]
    width = max(len(label) for _, label in heads)
    for key, label in heads:
        print(label.ljust(width) + "".join(f" | {row[key]:>9.1f}" for row in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
