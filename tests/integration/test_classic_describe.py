"""Classic groups through a real coordinator (issue 25 P3; DESIGN 3.19): ListGroups and
DescribeGroups over gRPC and the `list-groups` / `describe` commands show the group type, the
classic state, generation, protocol, leader and each member's protocol; AlterGroupConfigs refuses
a key that does not apply to classic groups; connect calls on a non-empty classic group are
refused naming its type; a connect join converts an EMPTY classic group, in the database too.

The classic groups are written to the database as the classic core would commit them (built
with a `GroupChange`), then loaded by the coordinator like any group: this needs none of P1's
handlers. Sessions are long so that nothing expires while the commands run."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from connect.group.v1 import admin_pb2, coordinator_pb2

from connect_protocol.classic_messages import ClassicProtocol, ConnectWorkerMetadata
from connect_protocol.configs import (
    MIGRATION_POLICY,
    SCHEDULED_REBALANCE_MAX_DELAY_MS,
    SESSION_TIMEOUT_MS,
)
from connect_protocol.errors import ErrorCode
from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from coordinator_svc.core.change import GroupChange
from coordinator_svc.core.classic_model import (
    AcceptedAssignment,
    ClassicGroupMeta,
    ClassicMemberInfo,
    ClassicState,
    GroupType,
)
from coordinator_svc.core.conversion import to_classic
from coordinator_svc.core.model import Connector, Member
from coordinator_svc.store import Lease, SqlStore
from tests.support.client import ScriptedWorker, describe, put_connector
from tests.support.coordinator import FAST_DEFAULTS, InProcessCoordinator, run_cli

CLASSIC = "classic-cluster"
EMPTY_CLASSIC = "classic-empty"
CONNECT = "connect-cluster"
NOW = 1_800_000_000_000
SESSION_MS = 120_000  # nothing expires during the test
DEFAULTS = replace(FAST_DEFAULTS, session_timeout_ms=SESSION_MS)


def classic_member(member_id: str, held: ResourceSet, synced: bool) -> Member:
    url = f"http://{member_id}:8083"
    return Member(
        member_id=member_id,
        member_epoch=4,
        url=url,
        rebalance_timeout_ms=30_000,
        assigned=held,
        principal="User:ANONYMOUS",
        classic=ClassicMemberInfo(
            protocols=(
                ClassicProtocol("compatible", ConnectWorkerMetadata(1, url, 0, held)),
                ClassicProtocol("default", ConnectWorkerMetadata(0, url)),
            ),
            session_timeout_ms=SESSION_MS,
            last_joined_generation=4,
            accepted=AcceptedAssignment(4, 1, held, EMPTY, answered=True) if synced else None,
        ),
    )


def seed(store: SqlStore, group_id: str, members: bool) -> None:
    """A classic group at generation 4 with connector A (2 tasks) and fencing token counter 7:
    STABLE with leader c1 (who holds A and A-0, synced) and c2 (not synced), or EMPTY with no
    members."""
    lease = store.try_acquire(group_id)
    assert isinstance(lease, Lease)
    change = GroupChange(None, group_id, NOW, DEFAULTS, creator="User:ANONYMOUS")
    change.put_connector(Connector("A", 2))
    change.set_target(replace(change.target, assignment_epoch=4))
    if members:
        change.set_meta(
            group_epoch=4,
            group_type=GroupType.CLASSIC,
            classic=ClassicGroupMeta(ClassicState.STABLE, "compatible", "c1"),
            last_fencing_token=7,
        )
        held = ResourceSet.of(["A"], [TaskId("A", 0)])
        change.put_member(classic_member("c1", held, synced=True))
        change.put_member(classic_member("c2", EMPTY, synced=False))
        store.commit(lease, change.records())
    else:
        # A connect group made by PutConnector, converted by `to_classic` in a second commit
        # (as a classic JoinGroup would, P1), read back from the database in between.
        change.set_meta(group_epoch=4, last_fencing_token=7)
        store.commit(lease, change.records())
        state = store.load_group(group_id)
        assert state is not None and not state.meta.is_classic
        converting = GroupChange(state, group_id, NOW + 1, DEFAULTS)
        to_classic(converting)
        store.commit(lease, converting.records())
        loaded = store.load_group(group_id)
        assert loaded is not None and loaded.meta.is_classic and loaded.group_epoch == 4
        assert loaded.meta.last_fencing_token == 7 and list(loaded.catalogue) == ["A"]
    store.release(lease)


@pytest.fixture
def coordinator(database_url: str) -> Iterator[InProcessCoordinator]:
    seeder = SqlStore(database_url, "seeder", "127.0.0.1:1")
    try:
        seeder.migrate()
        seed(seeder, CLASSIC, members=True)
        seed(seeder, EMPTY_CLASSIC, members=False)
    finally:
        seeder.close()
    with InProcessCoordinator(database_url, defaults=DEFAULTS) as coord:
        yield coord


def test_list_and_describe_show_classic_groups(coordinator: InProcessCoordinator) -> None:
    stubs = coordinator.stubs
    assert stubs is not None
    assert put_connector(stubs, CONNECT, "B", 1).error_code == 0
    listed = stubs.admin.ListGroups(admin_pb2.ListGroupsRequest(), timeout=10)
    assert listed.error_code == 0
    rows = {
        g.group_id: (g.group_type, g.state, g.group_epoch, g.member_count, g.protocol_name)
        for g in listed.groups
    }
    assert rows == {
        CLASSIC: ("classic", "STABLE", 4, 2, "compatible"),
        EMPTY_CLASSIC: ("classic", "EMPTY", 4, 0, ""),
        CONNECT: ("connect", "EMPTY", 2, 0, ""),
    }

    group = describe(stubs, CLASSIC)
    assert group.error_code == 0, group.error_message
    assert (group.group_type, group.state, group.group_epoch) == ("classic", "STABLE", 4)
    c = group.classic
    assert (c.state, c.generation_id, c.protocol_type, c.protocol_name, c.leader_id) == (
        "STABLE",
        4,
        "connect",
        "compatible",
        "c1",
    )
    assert list(c.pending_member_ids) == [] and list(c.members_joined) == []
    members = {
        m.member_id: (
            m.group_protocol,
            list(m.classic.protocols),
            m.classic.session_timeout_ms,
            m.classic.last_joined_generation,
            m.classic.synced,
        )
        for m in group.members
    }
    assert members == {
        "c1": ("classic", ["compatible", "default"], SESSION_MS, 4, True),
        "c2": ("classic", ["compatible", "default"], SESSION_MS, 4, False),
    }
    connect = describe(stubs, CONNECT)
    assert connect.group_type == "connect" and not connect.HasField("classic")


def test_the_cli_lists_and_describes_classic_groups(coordinator: InProcessCoordinator) -> None:
    stubs = coordinator.stubs
    assert stubs is not None
    assert put_connector(stubs, CONNECT, "B", 1).error_code == 0
    listed = run_cli("list-groups", "--coordinator", coordinator.address)
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line.split() for line in listed.stdout.splitlines()}
    assert lines["GROUP"] == ["GROUP", "TYPE", "STATE", "EPOCH", "MEMBERS", "PROTOCOL"]
    assert lines[CLASSIC] == [CLASSIC, "classic", "STABLE", "4", "2", "compatible"]
    assert lines[EMPTY_CLASSIC] == [EMPTY_CLASSIC, "classic", "EMPTY", "4", "0", "-"]
    assert lines[CONNECT] == [CONNECT, "connect", "EMPTY", "2", "0", "-"]

    described = run_cli("describe", CLASSIC, "--coordinator", coordinator.address)
    assert described.returncode == 0, described.stderr
    text = described.stdout
    assert f"Group {CLASSIC} (classic)  state STABLE" in text
    assert "classic state STABLE   generation 4   protocol connect/compatible" in text
    assert "leader c1" in text
    assert "catalogue: A (2 tasks)" in text
    # Only the configurations that apply to classic groups.
    assert (
        "configs: assignor.principals=, group.protocol.migration.policy=bidirectional, "
        "restart.failed.backoff.ms=10000, restart.failed.max.attempts=10, "
        "scheduled.rebalance.max.delay.ms=2000\n"
    ) in text
    member_lines = {line.split()[0]: line.split() for line in text.splitlines()[1:] if line}
    assert member_lines["c1"][:6] == ["c1", "classic", "compatible,", "default", "120000", "4"]
    assert "yes" in member_lines["c1"] and "no" in member_lines["c2"]
    assert "assignment (target) epoch" not in text  # the connect block is not shown
    connect = run_cli("describe", CONNECT, "--coordinator", coordinator.address)
    assert connect.returncode == 0 and "assignment (target) epoch" in connect.stdout


def test_alter_configs_on_a_classic_group_refuses_keys_that_do_not_apply(
    coordinator: InProcessCoordinator,
) -> None:
    stubs = coordinator.stubs
    assert stubs is not None
    refused = stubs.admin.AlterGroupConfigs(
        admin_pb2.AlterGroupConfigsRequest(group_id=CLASSIC, set={SESSION_TIMEOUT_MS: "7000"}),
        timeout=10,
    )
    assert refused.error_code == ErrorCode.INVALID_REQUEST
    assert "classic group" in refused.error_message and SESSION_TIMEOUT_MS in refused.error_message
    accepted = stubs.admin.AlterGroupConfigs(
        admin_pb2.AlterGroupConfigsRequest(
            group_id=CLASSIC, set={SCHEDULED_REBALANCE_MAX_DELAY_MS: "5000"}
        ),
        timeout=10,
    )
    assert accepted.error_code == 0, accepted.error_message
    assert accepted.effective_configs[SCHEDULED_REBALANCE_MAX_DELAY_MS] == "5000"
    group = describe(stubs, CLASSIC)
    assert group.group_configs[SCHEDULED_REBALANCE_MAX_DELAY_MS] == "5000"
    assert group.group_configs[SESSION_TIMEOUT_MS] == str(SESSION_MS)  # the default, untouched


def test_connect_calls_on_a_non_empty_classic_group_are_refused(
    coordinator: InProcessCoordinator,
) -> None:
    """A connect join would convert it (issue 27) unless its migration policy forbids that."""
    stubs = coordinator.stubs
    assert stubs is not None
    altered = stubs.admin.AlterGroupConfigs(
        admin_pb2.AlterGroupConfigsRequest(
            group_id=CLASSIC, set={MIGRATION_POLICY.name: "disabled"}
        ),
        timeout=10,
    )
    assert altered.error_code == 0, altered.error_message
    joined = ScriptedWorker(stubs, CLASSIC, "w1").join()
    assert joined.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert "classic group" in joined.error_message and "'disabled'" in joined.error_message
    steady = ScriptedWorker(stubs, CLASSIC, "c1").heartbeat(epoch=4)
    assert steady.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    prepared = stubs.coordinator.ConnectGroupPrepareAssignment(
        coordinator_pb2.ConnectGroupPrepareAssignmentRequest(
            group_id=CLASSIC, member_id="c1", member_epoch=4
        ),
        timeout=10,
    )
    assert prepared.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    group = describe(stubs, CLASSIC)
    assert group.group_type == "classic" and len(group.members) == 2


def test_a_connect_join_converts_an_empty_classic_group(
    coordinator: InProcessCoordinator,
) -> None:
    stubs = coordinator.stubs
    assert stubs is not None
    joined = ScriptedWorker(stubs, EMPTY_CLASSIC, "w1").join()
    assert joined.error_code in (0, ErrorCode.COMPUTE_ASSIGNMENT), joined.error_message
    assert joined.member_epoch == 4  # assignment epoch = the generation
    group = describe(stubs, EMPTY_CLASSIC)
    assert (group.group_type, group.group_epoch) == ("connect", 5)
    assert [c.name for c in group.catalogue] == ["A"]
    assert [m.group_protocol for m in group.members] == ["connect"]
    events = coordinator.store.list_events(EMPTY_CLASSIC)
    converted = [e for e in events if e["event_type"] == "GROUP_CONVERTED"]
    assert [e["payload"]["direction"] for e in converted] == ["to_classic", "to_connect"]
    assert converted[1]["payload"]["generation"] == 4
    listed = stubs.admin.ListGroups(admin_pb2.ListGroupsRequest(), timeout=10)
    row = next(g for g in listed.groups if g.group_id == EMPTY_CLASSIC)
    assert (row.group_type, row.protocol_name, row.member_count) == ("connect", "", 1)
