#!/usr/bin/env python3
"""In-process cost of the coordinator's hot paths, stage by stage (no gRPC transport, one thread).

  .venv/bin/python bench/hotpath.py [--members 200] [--profile]

Builds the benchmark's group (CONNECTORS x TASKS, MEMBERS members, a round-robin target, all
STABLE) in a GroupManager on a throwaway durable PostgreSQL, then times, in microseconds per call:
the steady heartbeat's stages (decode, validate, the pure core handler, GroupManager.execute with
its lock and timers, encode, the whole servicer method), the health check's servicer for
comparison, protobuf (de)serialisation, assignor selection over the group, and a join + leave
through the servicer (with its two durable commits). --profile adds cProfile's top functions for
steady heartbeats and for joins + leaves. Complements ./bench/run-coordinator, which measures the
real server under load; see bench/README.md.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "generated"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from connect.group.v1 import admin_pb2, coordinator_pb2  # noqa: E402
from grpc_health.v1 import health, health_pb2  # noqa: E402

from bench.coordinator_bench import IC, PG_SETTINGS, from_cat, rotated, round_robin, to_cat  # noqa: E402
from connect_protocol import wire as protocol_wire  # noqa: E402
from coordinator_svc.core.heartbeat import heartbeat  # noqa: E402
from coordinator_svc.core.model import GroupConfigDefaults  # noqa: E402
from coordinator_svc.core.results import Result  # noqa: E402
from coordinator_svc.core.selection import select  # noqa: E402
from coordinator_svc.core.validation import validate_heartbeat  # noqa: E402
from coordinator_svc.grpc_api.servicers import AdminServicer, CoordinatorServicer  # noqa: E402
from coordinator_svc.runtime.groups import GroupManager  # noqa: E402
from coordinator_svc.store import SqlStore  # noqa: E402
from tests.support.pgcluster import ThrowawayCluster, create_database  # noqa: E402

GROUP = "hot"


class Ctx:
    """The little of grpc.ServicerContext the servicers use."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def is_active(self) -> bool:
        return True


def group_state(manager: GroupManager, group_id: str) -> Any:
    """The group's state as the manager holds it (taking the group over if need be)."""
    return manager.execute(group_id, lambda s, _t: Result([], s))


def chunked(member_ids: list[str], catalogue: dict[str, int]) -> dict[str, Any]:
    """Connectors dealt in turn, tasks in contiguous runs of the sorted catalogue, the floor or
    the ceiling each (a forming group's shares under the sticky assignors)."""
    ids, names = sorted(member_ids), sorted(catalogue)
    tasks = [(name, t) for name in names for t in range(catalogue[name])]
    share, extra = divmod(len(tasks), len(ids))
    out: dict[str, Any] = {}
    at = 0
    for i, member_id in enumerate(ids):
        size = share + (i < extra)
        connectors = frozenset(names[i :: len(ids)])
        out[member_id] = (connectors, frozenset(tasks[at : at + size]))
        at += size
    return out


def per_call_us(fn: Callable[[], Any], n: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=200)
    parser.add_argument("--connectors", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--n", type=int, default=5000, help="calls per steady measurement")
    parser.add_argument("--pairs", type=int, default=200, help="join+leave pairs")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--chunked",
        action="store_true",
        help="each member's tasks one run of the sorted catalogue (as the sticky assignors "
        "place them), not dealt one by one",
    )
    args = parser.parse_args()

    ctx = Ctx()
    defaults = GroupConfigDefaults(session_timeout_ms=600_000, rebalance_timeout_ms=600_000)
    with ThrowawayCluster(settings=PG_SETTINGS) as cluster:
        url = create_database(cluster.url, "hot")
        store = SqlStore(url, owner_id=f"hot-{uuid.uuid4().hex[:6]}", advertised_address="x:1")
        store.migrate()
        manager = GroupManager(store, defaults)
        manager.start()
        coord, admin = CoordinatorServicer(manager), AdminServicer(manager)
        try:
            for i in range(args.connectors):
                admin.PutConnector(
                    admin_pb2.PutConnectorRequest(
                        group_id=GROUP, connector=f"conn-{i:02d}", task_count=args.tasks
                    ),
                    ctx,
                )
            epochs: dict[str, int] = {}
            for i in range(args.members):
                req = coordinator_pb2.ConnectGroupHeartbeatRequest(
                    group_id=GROUP,
                    member_id=f"member-{i:04d}",
                    member_epoch=0,
                    rebalance_timeout_ms=600_000,
                )
                req.client_assignors.assignors.append(IC)
                req.connectors_and_tasks.SetInParent()
                epochs[req.member_id] = coord.ConnectGroupHeartbeat(req, ctx).member_epoch
            state = group_state(manager, GROUP)
            assert state is not None
            assignor = state.meta.assignor_member_id
            assert assignor is not None
            hb = coordinator_pb2.ConnectGroupHeartbeatRequest(
                group_id=GROUP, member_id=assignor, member_epoch=epochs[assignor]
            )
            assert coord.ConnectGroupHeartbeat(hb, ctx).error_code == 10001
            prep = coord.ConnectGroupPrepareAssignment(
                coordinator_pb2.ConnectGroupPrepareAssignmentRequest(
                    group_id=GROUP, member_id=assignor, member_epoch=epochs[assignor]
                ),
                ctx,
            )
            deal = chunked if args.chunked else round_robin
            target = deal(
                [m.member_id for m in prep.members], {c.name: c.task_count for c in prep.catalogue}
            )
            install = coordinator_pb2.ConnectGroupInstallAssignmentRequest(
                group_id=GROUP,
                member_id=assignor,
                member_epoch=epochs[assignor],
                group_epoch=prep.group_epoch,
            )
            for member_id, res in sorted(target.items()):
                to_cat(res, install.members.add(member_id=member_id).connectors_and_tasks)
            assert coord.ConnectGroupInstallAssignment(install, ctx).error_code == 0
            for member_id in sorted(epochs):
                req = coordinator_pb2.ConnectGroupHeartbeatRequest(
                    group_id=GROUP, member_id=member_id, member_epoch=epochs[member_id]
                )
                req.connectors_and_tasks.SetInParent()
                epochs[member_id] = coord.ConnectGroupHeartbeat(req, ctx).member_epoch
            state = group_state(manager, GROUP)
            assert state is not None and state.status().value == "STABLE", state.status()

            member = "member-0100"
            msg = coordinator_pb2.ConnectGroupHeartbeatRequest(
                group_id=GROUP, member_id=member, member_epoch=epochs[member]
            )
            req = protocol_wire.heartbeat_request_from_wire(msg)
            now = int(time.time() * 1000)
            result = heartbeat(state, req, now, defaults)
            assert not result.records, result.records
            wire = msg.SerializeToString()
            resp_msg = protocol_wire.heartbeat_response_to_wire(result.response)
            resp_wire = resp_msg.SerializeToString()
            owned_msg = coordinator_pb2.ConnectGroupHeartbeatRequest()
            owned_msg.CopyFrom(msg)
            to_cat(target[member], owned_msg.connectors_and_tasks)
            health_servicer = health.HealthServicer()
            health_req = health_pb2.HealthCheckRequest()
            n = args.n
            rows: list[tuple[str, float]] = [
                (
                    "steady: whole servicer method",
                    per_call_us(lambda: coord.ConnectGroupHeartbeat(msg, ctx), n),
                ),
                (
                    "steady, owned list: whole servicer method",
                    per_call_us(lambda: coord.ConnectGroupHeartbeat(owned_msg, ctx), n),
                ),
                (
                    "  decode (protocol_wire.heartbeat_request_from_wire)",
                    per_call_us(lambda: protocol_wire.heartbeat_request_from_wire(msg), n),
                ),
                (
                    "  decode, owned list",
                    per_call_us(lambda: protocol_wire.heartbeat_request_from_wire(owned_msg), n),
                ),
                ("  validate_heartbeat", per_call_us(lambda: validate_heartbeat(req), n)),
                (
                    "  core heartbeat() (pure, no lock)",
                    per_call_us(lambda: heartbeat(state, req, now, defaults), n),
                ),
                (
                    "  GroupManager.execute(heartbeat)",
                    per_call_us(
                        lambda: manager.execute(GROUP, lambda s, t: heartbeat(s, req, t, defaults)),
                        n,
                    ),
                ),
                (
                    "  encode (protocol_wire.heartbeat_response_to_wire)",
                    per_call_us(
                        lambda: protocol_wire.heartbeat_response_to_wire(result.response), n
                    ),
                ),
                (
                    "  metrics histogram observe",
                    per_call_us(lambda: manager.metrics.heartbeat_latency.observe(0.001), n),
                ),
                (
                    "grpc would also: parse request bytes",
                    per_call_us(
                        lambda: coordinator_pb2.ConnectGroupHeartbeatRequest.FromString(wire), n
                    ),
                ),
                (
                    "grpc would also: serialise response",
                    per_call_us(lambda: resp_msg.SerializeToString(), n),
                ),
                (
                    "health Check: whole servicer method",
                    per_call_us(lambda: health_servicer.Check(health_req, ctx), n),
                ),
                (
                    f"select() over {len(state.members)} members",
                    per_call_us(lambda: select(state.members.values(), assignor), 50),
                ),
            ]
            _ = resp_wire

            counter = iter(range(10**9))

            def join_leave() -> None:
                k = next(counter)
                member_id = f"fresh-{k}"
                j = coordinator_pb2.ConnectGroupHeartbeatRequest(
                    group_id=GROUP,
                    member_id=member_id,
                    member_epoch=0,
                    rebalance_timeout_ms=600_000,
                )
                j.client_assignors.assignors.append(IC)
                j.connectors_and_tasks.SetInParent()
                r = coord.ConnectGroupHeartbeat(j, ctx)
                assert r.error_code in (0, 10001), r
                r = coord.ConnectGroupHeartbeat(
                    coordinator_pb2.ConnectGroupHeartbeatRequest(
                        group_id=GROUP, member_id=member_id, member_epoch=-1
                    ),
                    ctx,
                )
                assert r.error_code == 0, r

            current = {"target": target, "round": 0}

            def revocation_round() -> int:
                """Bump, install a target moving 2 tasks per member, then every member is told,
                acknowledges and collects: returns the number of state-changing heartbeats."""
                rnd = current["round"] = current["round"] + 1
                admin.PutConnector(
                    admin_pb2.PutConnectorRequest(
                        group_id=GROUP,
                        connector=f"conn-{args.connectors - 1:02d}",
                        task_count=args.tasks + rnd % 2,
                    ),
                    ctx,
                )
                st = group_state(manager, GROUP)
                assert st is not None
                chooser = st.meta.assignor_member_id
                assert chooser is not None
                ep = st.members[chooser].member_epoch
                hb = coordinator_pb2.ConnectGroupHeartbeatRequest(
                    group_id=GROUP, member_id=chooser, member_epoch=ep
                )
                assert coord.ConnectGroupHeartbeat(hb, ctx).error_code == 10001
                pr = coord.ConnectGroupPrepareAssignment(
                    coordinator_pb2.ConnectGroupPrepareAssignmentRequest(
                        group_id=GROUP, member_id=chooser, member_epoch=ep
                    ),
                    ctx,
                )
                prev = current["target"]
                new = rotated(
                    {
                        m.member_id: prev.get(m.member_id, (frozenset(), frozenset()))
                        for m in pr.members
                    },
                    {c.name: c.task_count for c in pr.catalogue},
                    2,
                )
                ins = coordinator_pb2.ConnectGroupInstallAssignmentRequest(
                    group_id=GROUP, member_id=chooser, member_epoch=ep, group_epoch=pr.group_epoch
                )
                for member_id, res in sorted(new.items()):
                    to_cat(res, ins.members.add(member_id=member_id).connectors_and_tasks)
                assert coord.ConnectGroupInstallAssignment(ins, ctx).error_code == 0
                current["target"] = new
                st = group_state(manager, GROUP)
                assert st is not None
                mine = {
                    m.member_id: [
                        m.member_epoch,
                        (
                            m.assigned.connectors,
                            frozenset((t.connector, t.task) for t in m.assigned.tasks),
                        ),
                    ]
                    for m in st.members.values()
                }
                changes = 0

                def beat(member_id: str) -> bool:
                    ep, owned = mine[member_id]
                    req = coordinator_pb2.ConnectGroupHeartbeatRequest(
                        group_id=GROUP, member_id=member_id, member_epoch=ep
                    )
                    to_cat(owned, req.connectors_and_tasks)
                    r = coord.ConnectGroupHeartbeat(req, ctx)
                    assert r.error_code in (0, 10001), r
                    changed = r.member_epoch != ep
                    mine[member_id][0] = r.member_epoch
                    if r.HasField("assignment"):
                        told = from_cat(r.assignment.connectors_and_tasks)
                        changed = changed or told != owned
                        mine[member_id][1] = told
                    return changed

                for member_id in sorted(mine):
                    changes += beat(member_id)  # told to revoke
                for member_id in sorted(mine):
                    changes += beat(member_id)  # acknowledges
                for member_id in sorted(mine):
                    if mine[member_id][1] != new[member_id]:
                        changes += beat(member_id)  # collects what was released
                return changes

            started, cpu_started = time.perf_counter(), time.process_time()
            n_changes = revocation_round()
            per_change = (time.perf_counter() - started) / n_changes * 1e6
            cpu_per_change = (time.process_time() - cpu_started) / n_changes * 1e6
            rows += [
                (
                    f"revocation round: per state change ({n_changes} changes, 1 commit each)",
                    per_change,
                ),
                # This process's CPU (the driver's requests and the coordinator's work, not
                # PostgreSQL's): what a group's changes cost the interpreter that serves them.
                ("revocation round: this process's CPU per state change", cpu_per_change),
            ]

            join_req = coordinator_pb2.ConnectGroupHeartbeatRequest(
                group_id=GROUP, member_id="fresh-x", member_epoch=0, rebalance_timeout_ms=600_000
            )
            join_req.client_assignors.assignors.append(IC)
            join_req.connectors_and_tasks.SetInParent()
            join_core = protocol_wire.heartbeat_request_from_wire(join_req)
            rows += [
                (
                    "join: core heartbeat() (pure, not persisted)",
                    per_call_us(lambda: heartbeat(state, join_core, now, defaults), 50),
                ),
                (
                    "join + leave via servicer (2 durable commits)",
                    per_call_us(join_leave, args.pairs),
                ),
            ]

            width = max(len(r[0]) for r in rows)
            print(
                f"\nhot paths, one thread, group of {args.members} members "
                f"({args.connectors}x{args.tasks} tasks); microseconds per call"
            )
            for name, us in rows:
                print(f"  {name.ljust(width)}  {us:10.1f} us")

            if args.profile:
                for title, fn, count in (
                    ("revocation round (~600 state changes)", revocation_round, 1),
                    (
                        "steady heartbeats via servicer",
                        lambda: coord.ConnectGroupHeartbeat(msg, ctx),
                        n,
                    ),
                    ("join + leave via servicer", join_leave, args.pairs),
                ):
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(count):
                        fn()
                    prof.disable()
                    out = io.StringIO()
                    pstats.Stats(prof, stream=out).sort_stats(
                        os.environ.get("HOT_SORT", "tottime")
                    ).print_stats(int(os.environ.get("HOT_TOP", "18")))
                    print(f"\ncProfile, {count} x {title}, by own time:")
                    print("\n".join(out.getvalue().splitlines()[4:]))
        finally:
            manager.stop()
            store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
