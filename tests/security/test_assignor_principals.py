"""Who may compute (issue 23 item 5), on a real mTLS coordinator with two principals that ACLs
both allow MEMBER on the group: with `assignor.principals` listing bob, alice's member is never
sent COMPUTE_ASSIGNMENT although its id is the smaller (it would be the assignor member without
the list), her Prepare and Install are refused as a non-assignor's and change nothing, and bob's
member computes; with no listed principal present the group stays ASSIGNING and DescribeGroups
says why, and nobody is asked."""

from __future__ import annotations

from typing import Any

import pytest
from connect.group.v1 import admin_pb2

from connect_protocol.configs import ASSIGNOR_PRINCIPALS
from connect_protocol.errors import ErrorCode
from coordinator_svc.core.acls import AclEntry, Operation, PatternType, ResourceType
from tests.support.client import ScriptedWorker, describe, from_cat, parse
from tests.support.coordinator import InProcessCoordinator
from tests.support.store_dump import dump

from .conftest import ALICE, BOB, COMPUTE_ASSIGNMENT, Clients, grant, settle, spread, unique

PREFIX = "who-computes-"


@pytest.fixture(scope="module", autouse=True)
def both_may_be_members(secured: InProcessCoordinator) -> None:
    for principal in (ALICE, BOB):
        grant(
            secured,
            AclEntry(principal, Operation.MEMBER, ResourceType.GROUP, PREFIX, PatternType.PREFIXED),
        )


def alter(clients: Clients, group_id: str, value: str) -> Any:
    answer = clients.admin.admin.AlterGroupConfigs(
        admin_pb2.AlterGroupConfigsRequest(group_id=group_id, set={ASSIGNOR_PRINCIPALS: value}),
        timeout=5,
    )
    assert answer.error_code == 0, answer
    return answer


def put(clients: Clients, group_id: str, name: str, tasks: int) -> None:
    answer = clients.admin.admin.PutConnector(
        admin_pb2.PutConnectorRequest(group_id=group_id, connector=name, task_count=tasks),
        timeout=5,
    )
    assert answer.error_code == 0, answer


def test_only_the_listed_principals_member_computes(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    group = unique(PREFIX + "g")
    put(clients, group, "A", 2)
    put(clients, group, "B", 1)
    assert alter(clients, group, BOB).effective_configs[ASSIGNOR_PRINCIPALS] == BOB

    alice = ScriptedWorker(clients.alice, group, "a1")  # the smaller id
    bob = ScriptedWorker(clients.bob, group, "b1")
    assert alice.join().error_code == 0, alice.last
    assert bob.join().error_code == COMPUTE_ASSIGNMENT, bob.last
    for _ in range(3):
        assert alice.heartbeat().error_code == 0, alice.last
    shown = describe(clients.admin, group)
    assert shown.assignor_member_id == "b1"
    assert shown.group_configs[ASSIGNOR_PRINCIPALS] == BOB

    # Alice's Prepare and Install, with her own member and epoch: refused, nothing changes.
    secured.authorizer.flush_denials()
    before = dump(secured.store)
    prepared = alice.prepare()
    assert prepared.error_code == ErrorCode.UNKNOWN_MEMBER_ID, prepared
    assert "not the group's assignor member" in prepared.error_message
    everything_to_alice = {"a1": parse("A", "A-0", "A-1", "B", "B-0"), "b1": parse()}
    installed = alice.install(shown.group_epoch, everything_to_alice)
    assert installed.error_code == ErrorCode.UNKNOWN_MEMBER_ID, installed
    secured.authorizer.flush_denials()
    after = dump(secured.store)
    assert {t: r for t, r in after.items() if t != "events"} == {
        t: r for t, r in before.items() if t != "events"
    }

    settled = settle([alice, bob], clients.admin, group)  # bob computes (settle asks whoever)
    assert settled.assignor_member_id == "b1"
    computed = {m.member_id: from_cat(m.current_assignment) for m in settled.members}
    prepared_by_bob = bob.prepare()
    assert prepared_by_bob.error_code == 0, prepared_by_bob
    assert computed == spread(prepared_by_bob)
    assert alice.owned != parse()  # she runs her share of bob's target


def test_with_no_listed_principal_present_the_group_stays_assigning_and_says_why(
    clients: Clients,
) -> None:
    group = unique(PREFIX + "none")
    put(clients, group, "A", 2)
    alice = ScriptedWorker(clients.alice, group, "a1")
    bob = ScriptedWorker(clients.bob, group, "b1")
    assert alice.join().error_code == COMPUTE_ASSIGNMENT
    assert bob.join().error_code == 0
    settle([alice, bob], clients.admin, group)

    alter(clients, group, "User:CN=nobody,O=connect-tests")
    shown = describe(clients.admin, group)
    assert shown.assignor_member_id == ""
    assert ASSIGNOR_PRINCIPALS in shown.assignor_unavailable_reason
    put(clients, group, "B", 1)  # a computation is due: nobody may do it
    for _ in range(3):
        assert alice.heartbeat().error_code == 0, alice.last
        assert bob.heartbeat().error_code == 0, bob.last
    shown = describe(clients.admin, group)
    assert shown.state == "ASSIGNING" and shown.assignor_member_id == ""
    assert "User:CN=nobody,O=connect-tests" in shown.assignor_unavailable_reason

    alter(clients, group, f"{ALICE},{BOB}")  # both listed: the role comes back at once
    assert describe(clients.admin, group).assignor_member_id == "a1"
    assert alice.heartbeat().error_code == COMPUTE_ASSIGNMENT


def test_a_bad_value_is_refused_in_band(clients: Clients) -> None:
    group = unique(PREFIX + "bad")
    answer = clients.admin.admin.AlterGroupConfigs(
        admin_pb2.AlterGroupConfigsRequest(group_id=group, set={ASSIGNOR_PRINCIPALS: "bob"}),
        timeout=5,
    )
    assert answer.error_code == ErrorCode.INVALID_REQUEST, answer
    assert "User:<name>" in answer.error_message
