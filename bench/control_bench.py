#!/usr/bin/env python3
"""Target states and restarts (issue 29, DESIGN 3.20; run it through ./bench/run-control;
bench/README.md, "Pause, stop and restart").

For each task count T (three sizes, so growth shows), on a fresh database and a fresh
`coordinator-svc serve`: 100 connect workers form a group running connector `big` with T tasks
spread over all of them (T/100 each) and connector `solo` without tasks (held by one member).
Timed from the client, each the median of 5 calls, each call one commit:

- PauseConnector of `big` (the T tasks' holders told: 100 members' revisions raised) and its
  ResumeConnector; baseline, the same pair for `solo` (one holder);
- a config change of `big` (PutConnector: the same holders told, issue 28's path) as a second
  baseline;
- RestartConnector of `big` with include_tasks (T + 1 restart counts raised and rows written);
- StopConnector of `big` and its ResumeConnector (each an epoch bump, the holders told);
- that pausing moved nothing: every member's owned list is unchanged and the group epoch too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "generated"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from connect.group.v1 import admin_pb2  # noqa: E402

from bench.lifecycle_bench import (  # noqa: E402
    bench_coordinator,
    install,
    ms,
    print_table,
    run_sizes,
    settle,
)
from connect_protocol.errors import ErrorCode  # noqa: E402
from tests.support.client import IC, ScriptedWorker  # noqa: E402
from tests.support.coordinator import Stubs  # noqa: E402

GROUP = "lifecycle-bench"  # the group lifecycle_bench's helpers name
MEMBERS = 100
REPEAT = 5


def timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    resp = call()
    took = ms(time.perf_counter() - started)
    if resp.error_code != 0:
        raise RuntimeError(resp.error_message)
    return took


def median_of(call: Callable[[], Any]) -> float:
    return statistics.median(timed(call) for _ in range(REPEAT))


def run_size(cluster_url: str, tasks: int) -> dict[str, float]:
    _db, proc = bench_coordinator(cluster_url, f"control_{tasks}")
    stubs = Stubs(proc.address)
    admin = stubs.admin

    def put(name: str, count: int, version: str) -> Any:
        return admin.PutConnector(
            admin_pb2.PutConnectorRequest(
                group_id=GROUP, connector=name, task_count=count, config={"v": version}
            ),
            timeout=60,
        )

    def target(rpc: str, name: str) -> Callable[[], Any]:
        request = getattr(admin_pb2, f"{rpc}Request")(group_id=GROUP, connector=name)
        return lambda: getattr(admin, rpc)(request, timeout=60)

    try:
        put("big", tasks, "0")
        put("solo", 0, "0")
        workers = [
            ScriptedWorker(stubs, GROUP, f"w{i:03d}", assignors=(IC,)) for i in range(MEMBERS)
        ]
        for w in workers:
            w.join()
        settle(workers, 1)
        assignor = next(w for w in workers if w.last.error_code == ErrorCode.COMPUTE_ASSIGNMENT)
        targets = {
            w.member_id: (
                frozenset({"big"} if i == 0 else {"solo"} if i == 1 else set()),
                frozenset(("big", t) for t in range(i, tasks, MEMBERS)),
            )
            for i, w in enumerate(workers)
        }
        install(assignor, targets)
        settle(workers)
        if any(w.owned != targets[w.member_id] for w in workers):
            raise RuntimeError("the group did not form as targeted")
        epoch = workers[0].heartbeat(report_owned=False).member_epoch

        pauses: list[float] = []
        resumes: list[float] = []
        solo: list[float] = []
        for _ in range(REPEAT):
            pauses.append(timed(target("PauseConnector", "big")))
            resumes.append(timed(target("ResumeConnector", "big")))
            solo.append(timed(target("PauseConnector", "solo")))
            timed(target("ResumeConnector", "solo"))
        settle(workers, 1)
        moved = sum(1 for w in workers if w.owned != targets[w.member_id])
        epoch_moved = workers[0].heartbeat(report_owned=False).member_epoch != epoch
        if moved or epoch_moved:
            raise RuntimeError(f"pausing moved {moved} members' work (epoch moved: {epoch_moved})")
        versions = iter(range(1, 100))
        config_ms = median_of(lambda: put("big", tasks, f"v{next(versions)}"))
        restart_request = admin_pb2.RestartConnectorRequest(
            group_id=GROUP, connector="big", include_tasks=True
        )
        restart_ms = median_of(lambda: admin.RestartConnector(restart_request, timeout=60))
        stops = [timed(target("StopConnector", "big"))]
        starts = [timed(target("ResumeConnector", "big"))]
        for _ in range(REPEAT - 1):
            stops.append(timed(target("StopConnector", "big")))
            starts.append(timed(target("ResumeConnector", "big")))
        return {
            "tasks": tasks,
            "pause_ms": statistics.median(pauses),
            "resume_ms": statistics.median(resumes),
            "solo_pause_ms": statistics.median(solo),
            "config_change_ms": config_ms,
            "restart_all_ms": restart_ms,
            "stop_ms": statistics.median(stops),
            "resume_from_stop_ms": statistics.median(starts),
            "moved_by_pausing": moved,
        }
    finally:
        stubs.close()
        proc.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="100,300,1000", help="tasks of connector big, per run")
    a = p.parse_args()
    rows = run_sizes(run_size, [int(s) for s in a.sizes.split(",")])
    print_table(
        [
            ("tasks", f"tasks of big (over {MEMBERS} members)"),
            ("pause_ms", "PauseConnector big ms (one commit)"),
            ("resume_ms", "ResumeConnector big ms"),
            ("solo_pause_ms", "PauseConnector solo (1 holder) ms (baseline)"),
            ("config_change_ms", "config change of big ms (baseline, issue 28)"),
            ("restart_all_ms", "RestartConnector big --include-tasks ms"),
            ("stop_ms", "StopConnector big ms (epoch bump)"),
            ("resume_from_stop_ms", "ResumeConnector from STOPPED ms (epoch bump)"),
            ("moved_by_pausing", "members whose work pausing moved"),
        ],
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
