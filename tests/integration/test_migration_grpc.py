"""Online migration over gRPC on PostgreSQL (issue 27, DESIGN 3.19): a running classic group is
upgraded by a connect worker's join, its classic workers keep working through translated calls,
the group survives a takeover as a mixed group, and it is downgraded when the connect worker
leaves. One in-process coordinator (real gRPC server on 127.0.0.1, real database)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from connect.group.v1 import admin_pb2, common_pb2

from connect_protocol.configs import MIGRATION_POLICY
from connect_protocol.errors import ErrorCode
from tests.integration.test_classic_grpc import GROUP, Coordinator, classic_defaults
from tests.support.classic_client import ClassicMember
from tests.support.client import IC, ScriptedWorker, describe, parse, put_connector
from tests.support.coordinator import Stubs

#: What a connect agent of protocol `sessioned` lists: it covers Connect's eager workers too.
SESSIONED = (IC, common_pb2.Assignor(name="eager", minimum_version=0, maximum_version=0))


def connect_worker(stubs: Stubs, member_id: str) -> ScriptedWorker:
    return ScriptedWorker(stubs, GROUP, member_id, assignors=SESSIONED)


def formed(coord: Coordinator, stubs: Stubs) -> list[ClassicMember]:
    """Two eager classic workers running connector A and its 3 tasks (round-robin)."""
    put_connector(stubs, GROUP, "A", 3)
    members = [coord.member(url=f"http://c{i}:8083") for i in range(2)]
    for m in members:
        m.join_once()  # MEMBER_ID_REQUIRED: its id
    with ThreadPoolExecutor(2) as pool:
        joined = list(pool.map(lambda m: m.join(), members))
        assert all(j.error_code == 0 for j in joined)
        synced = list(pool.map(lambda m: m.sync(), members))
    assert all(s.error_code == 0 for s in synced), synced
    return members


def protocols_of(group: Any) -> dict[str, str]:
    return {m.member_id: m.group_protocol for m in group.members}


def test_upgrade_translated_calls_and_downgrade(database_url: str) -> None:
    with Coordinator(database_url, classic_defaults(100)) as coord:
        stubs = Stubs(coord.address)
        c1, c2 = formed(coord, stubs)
        generation = c1.generation
        w1 = connect_worker(stubs, "w1")
        joined = w1.join()
        assert joined.error_code in (0, ErrorCode.COMPUTE_ASSIGNMENT), joined.error_message
        group = describe(stubs, GROUP)
        assert group.group_type == "connect"
        assert protocols_of(group) == {
            c1.member_id: "classic",
            c2.member_id: "classic",
            "w1": "connect",
        }
        assert group.assignor_member_id == "w1"
        events = coord.store.list_events(GROUP)
        (converted,) = [e for e in events if e["event_type"] == "GROUP_CONVERTED"][-1:]
        assert converted["payload"]["direction"] == "to_connect"
        assert converted["payload"]["generation"] == generation
        # The classic workers' heartbeats are answered at their generation, nothing moved.
        assert c1.heartbeat().error_code == ErrorCode.NONE
        assert sum(len(m.current_assignment.tasks) for m in group.members) == 3

        # w1 computes: it takes c1's share. c1 learns it by heartbeat, rejoins (answered at
        # once, no leader), and its SyncGroup (eager: the whole new set) gives it nothing.
        prepared = w1.prepare()
        assert prepared.error_code == 0, prepared.error_message
        c1_share = next(m for m in group.members if m.member_id == c1.member_id)
        c2_share = next(m for m in group.members if m.member_id == c2.member_id)
        to_w1 = (
            frozenset(c1_share.current_assignment.connectors),
            frozenset((t.connector, t.task) for t in c1_share.current_assignment.tasks),
        )
        to_c2 = (
            frozenset(c2_share.current_assignment.connectors),
            frozenset((t.connector, t.task) for t in c2_share.current_assignment.tasks),
        )
        empty = parse()
        installed = w1.install(
            prepared.group_epoch, {"w1": to_w1, c2.member_id: to_c2, c1.member_id: empty}
        )
        assert installed.error_code == 0, installed.error_message
        assert c1.heartbeat().error_code == ErrorCode.REBALANCE_IN_PROGRESS
        rejoined = c1.join_once()
        assert rejoined.error_code == ErrorCode.NONE, rejoined.error_message
        assert rejoined.leader == "" and len(rejoined.members) == 0
        synced = c1.sync()
        assert synced.error_code == ErrorCode.NONE, synced.error_message
        assert synced.assignment.version == 0
        assert (
            not synced.assignment.assignment.tasks and not synced.assignment.assignment.connectors
        )
        w1.heartbeat()
        assert w1.owned == to_w1, w1.owned

        # w1 leaves: the group is classic again and its workers rejoin the classic way.
        w1.leave()
        group = describe(stubs, GROUP)
        assert group.group_type == "classic"
        assert group.classic.state == "PREPARING_REBALANCE"
        events = coord.store.list_events(GROUP)
        directions = [
            e["payload"]["direction"] for e in events if e["event_type"] == "GROUP_CONVERTED"
        ]
        assert directions[-2:] == ["to_connect", "to_classic"]
        with ThreadPoolExecutor(2) as pool:
            again = list(pool.map(lambda m: m.join(), (c1, c2)))
        assert len({j.generation_id for j in again}) == 1
        assert again[0].generation_id > generation
        stubs.close()


def test_a_mixed_group_survives_a_takeover(database_url: str) -> None:
    defaults = classic_defaults(100)
    with Coordinator(database_url, defaults) as coord:
        stubs = Stubs(coord.address)
        c1, c2 = formed(coord, stubs)
        w1 = connect_worker(stubs, "w1")
        assert w1.join().error_code in (0, ErrorCode.COMPUTE_ASSIGNMENT)
        before = describe(stubs, GROUP)
        stubs.close()
    with Coordinator(database_url, defaults) as coord:  # the next owner loads it
        stubs = Stubs(coord.address)
        for m in (c1, c2):
            m.stub = coord.member().stub
        assert c1.heartbeat().error_code == ErrorCode.NONE
        after = describe(stubs, GROUP)
        assert after.group_type == "connect"
        assert protocols_of(after) == protocols_of(before)
        assert [
            (m.member_id, m.member_epoch, list(m.current_assignment.tasks)) for m in after.members
        ] == [
            (m.member_id, m.member_epoch, list(m.current_assignment.tasks)) for m in before.members
        ]
        stubs.close()


def test_policy_refusals_are_inconsistent_group_protocol(database_url: str) -> None:
    with Coordinator(database_url, classic_defaults(100)) as coord:
        stubs = Stubs(coord.address)
        formed(coord, stubs)
        altered = stubs.admin.AlterGroupConfigs(
            admin_pb2.AlterGroupConfigsRequest(
                group_id=GROUP, set={MIGRATION_POLICY.name: "downgrade"}
            ),
            timeout=10,
        )
        assert altered.error_code == 0, altered.error_message
        refused = connect_worker(stubs, "w1").join()
        assert refused.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        assert "'downgrade'" in refused.error_message
        assert describe(stubs, GROUP).group_type == "classic"
        stubs.close()
