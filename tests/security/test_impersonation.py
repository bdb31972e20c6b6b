"""One member acting as another (issue 12), on a real mTLS coordinator with two principals (alice
and bob, two client certificates) that ACLs both allow MEMBER on the groups: bob using alice's
member id (with its right epoch, a wrong one, leaving, rejoining, after alice was fenced), her
instance id (live, after a static leave) and her assignor role (Prepare/Install with the ids and
epochs DescribeGroups shows) is refused with GROUP_AUTHORIZATION_FAILED, and every table is as it
was (the events table may only gain AUTHORIZATION_DENIED rows, when denials are flushed); alice
goes on as before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from connect.group.v1 import admin_pb2

from connect_protocol.errors import ErrorCode
from coordinator_svc.core.acls import AclEntry, Operation, PatternType, ResourceType
from tests.support.client import ScriptedWorker, describe, from_cat, parse
from tests.support.coordinator import InProcessCoordinator
from tests.support.store_dump import Dump, dump
from tests.support.tls_clients import TlsStubs

from .conftest import (
    ALICE,
    BOB,
    COMPUTE_ASSIGNMENT,
    QUIET_DEFAULTS,
    Clients,
    Pki,
    denial_count,
    denial_events,
    grant,
    settle,
    spread,
    unique,
)

GROUP_AUTHORIZATION_FAILED = 30
PREFIX = "imp-"


@pytest.fixture(scope="module", autouse=True)
def both_may_be_members(secured: InProcessCoordinator) -> None:
    for principal in (ALICE, BOB):
        grant(
            secured,
            AclEntry(principal, Operation.MEMBER, ResourceType.GROUP, PREFIX, PatternType.PREFIXED),
        )


@pytest.fixture
def group(clients: Clients) -> str:
    """A group with connectors A (2 tasks) and B (1 task)."""
    group_id = unique(PREFIX + "g")
    for name, tasks in (("A", 2), ("B", 1)):
        answer = clients.admin.admin.PutConnector(
            admin_pb2.PutConnectorRequest(group_id=group_id, connector=name, task_count=tasks),
            timeout=5,
        )
        assert answer.error_code == 0, answer
    return group_id


@pytest.fixture
def pair(clients: Clients, group: str) -> tuple[ScriptedWorker, ScriptedWorker]:
    """Alice's member `a1` (instance `inst-a`) and bob's `b1` (instance `inst-b`), both
    running their share of a settled group; alice joined first (the assignor member)."""
    alice = ScriptedWorker(clients.alice, group, "a1", instance_id="inst-a")
    bob = ScriptedWorker(clients.bob, group, "b1", instance_id="inst-b")
    assert alice.join().error_code == COMPUTE_ASSIGNMENT
    assert bob.join().error_code == 0
    settled = settle([alice, bob], clients.admin, group)
    assert settled.assignor_member_id == "a1"
    assert alice.owned != parse() and bob.owned != parse()
    return alice, bob


def view(clients: Clients, group: str) -> Any:
    """The group as DescribeGroups shows it (the coordinator's memory), without the clock."""
    answer = describe(clients.admin, group)
    assert answer.error_code == 0, answer
    answer.coordinator_time_ms = 0
    return answer


class Unchanged:
    """The database and the group's view before some refused calls, to compare with after."""

    def __init__(self, coordinator: InProcessCoordinator, clients: Clients, group: str) -> None:
        self.coordinator = coordinator
        self.clients = clients
        self.group = group
        coordinator.authorizer.flush_denials()
        self.dump: Dump = dump(coordinator.store)
        self.view = view(clients, group)

    def check(self) -> list[dict[str, Any]]:
        """Every table as before, except new AUTHORIZATION_DENIED events once the denials are
        flushed (returned); the group's view as before."""
        self.coordinator.authorizer.flush_denials()
        after = dump(self.coordinator.store)
        for table, rows in self.dump.items():
            if table != "events":
                assert after[table] == rows, f"table {table} changed"
        events = self.dump["events"]
        assert after["events"][: len(events)] == events, "events were changed"
        new = after["events"][len(events) :]
        assert [e["event_type"] for e in new] == ["AUTHORIZATION_DENIED"] * len(new), new
        assert view(self.clients, self.group) == self.view
        return new


def refused(answer: Any) -> None:
    assert answer.error_code == GROUP_AUTHORIZATION_FAILED, answer
    assert "another principal" in answer.error_message, answer.error_message
    if hasattr(answer, "assignment"):
        assert not answer.HasField("assignment"), answer  # nothing of alice's leaks


def still_works(alice: ScriptedWorker, bob: ScriptedWorker) -> None:
    owned, epoch = alice.owned, alice.epoch
    assert alice.heartbeat().error_code == 0, alice.last
    assert (alice.owned, alice.epoch) == (owned, epoch)
    assert bob.heartbeat().error_code == 0, bob.last


# --- member ids ---------------------------------------------------------------------------------


def test_bob_cannot_heartbeat_leave_or_rejoin_as_alices_member(
    secured: InProcessCoordinator,
    clients: Clients,
    group: str,
    pair: tuple[ScriptedWorker, ScriptedWorker],
) -> None:
    alice, bob = pair
    unchanged = Unchanged(secured, clients, group)
    member = {m.member_id: m for m in unchanged.view.members}["a1"]
    assert member.member_epoch == alice.epoch

    impostor = ScriptedWorker(clients.bob, group, "a1")
    impostor.epoch, impostor.owned = member.member_epoch, from_cat(member.current_assignment)
    attempts: list[Callable[[], Any]] = [
        impostor.heartbeat,  # alice's epoch, alice's work: a perfect copy
        lambda: impostor.heartbeat(full=True),
        lambda: impostor.heartbeat(report_owned=False),
        lambda: impostor.heartbeat(epoch=member.member_epoch + 7),  # would fence alice
        lambda: impostor.heartbeat(epoch=member.member_epoch - 1),
        lambda: impostor.heartbeat(epoch=-1, report_owned=False),  # leave
        lambda: impostor.heartbeat(epoch=-2, instance_id="inst-a", report_owned=False),
        impostor.join,
        lambda: ScriptedWorker(clients.bob, group, "a1", instance_id="inst-b").join(),
    ]
    for attempt in attempts:
        refused(attempt())
    unchanged.check()
    still_works(alice, bob)


def test_bob_cannot_take_a_fenced_members_id_while_its_work_is_held(
    secured: InProcessCoordinator,
    clients: Clients,
    group: str,
    pair: tuple[ScriptedWorker, ScriptedWorker],
) -> None:
    alice, bob = pair
    fenced = alice.heartbeat(epoch=alice.epoch + 3)  # alice's own mistake: she is fenced
    assert fenced.error_code == ErrorCode.FENCED_MEMBER_EPOCH, fenced
    assert "a1" not in {m.member_id for m in describe(clients.admin, group).members}
    unchanged = Unchanged(secured, clients, group)
    refused(ScriptedWorker(clients.bob, group, "a1").join())
    refused(ScriptedWorker(clients.bob, group, "a1", instance_id="inst-x").join())
    unchanged.check()
    # Alice may take her id back (her old work stays held until the session timeout).
    assert alice.join().error_code in (0, COMPUTE_ASSIGNMENT), alice.last
    assert "a1" in {m.member_id for m in describe(clients.admin, group).members}
    assert bob.heartbeat().error_code in (0, COMPUTE_ASSIGNMENT), bob.last


def test_not_even_the_super_user_can_act_as_alices_member(
    secured: InProcessCoordinator,
    clients: Clients,
    group: str,
    pair: tuple[ScriptedWorker, ScriptedWorker],
) -> None:
    """Super users bypass ACLs, not identity binding."""
    alice, bob = pair
    unchanged = Unchanged(secured, clients, group)
    admin = ScriptedWorker(clients.admin, group, "a1", instance_id="inst-a")
    admin.epoch, admin.owned = alice.epoch, alice.owned
    refused(admin.heartbeat())
    refused(admin.leave())
    refused(admin.prepare())
    refused(ScriptedWorker(clients.admin, group, "adm", instance_id="inst-a").join())
    unchanged.check()
    still_works(alice, bob)


def test_ids_are_bound_with_authorization_off(module_database_url: str, pki: Pki) -> None:
    """Identity binding holds whether or not ACLs are on: with `--authorization none`, bob
    still cannot act as alice's member or take her instance id."""
    group = unique(PREFIX + "open")
    with (
        InProcessCoordinator(
            module_database_url, defaults=QUIET_DEFAULTS, tls=pki.server_tls()
        ) as open_coordinator,
        TlsStubs(open_coordinator.address, pki.ca.cert_file, pki.alice) as alice_stubs,
        TlsStubs(open_coordinator.address, pki.ca.cert_file, pki.bob) as bob_stubs,
    ):
        put = alice_stubs.admin.PutConnector(
            admin_pb2.PutConnectorRequest(group_id=group, connector="A", task_count=2), timeout=5
        )
        assert put.error_code == 0, put
        alice = ScriptedWorker(alice_stubs, group, "a1", instance_id="inst-a")
        settle([alice], bob_stubs, group)  # anybody may describe: authorization is off
        before = dump(open_coordinator.store)
        impostor = ScriptedWorker(bob_stubs, group, "a1")
        impostor.epoch, impostor.owned = alice.epoch, alice.owned
        refused(impostor.heartbeat())
        refused(impostor.leave())
        refused(impostor.prepare())
        refused(ScriptedWorker(bob_stubs, group, "b1", instance_id="inst-a").join())
        open_coordinator.authorizer.flush_denials()
        after = dump(open_coordinator.store)
        assert {t: r for t, r in after.items() if t != "events"} == {
            t: r for t, r in before.items() if t != "events"
        }
        new = after["events"][len(before["events"]) :]
        assert after["events"][: len(before["events"])] == before["events"]
        assert {e["event_type"] for e in new} <= {"AUTHORIZATION_DENIED"}
        assert alice.heartbeat().error_code == 0


# --- instance ids -------------------------------------------------------------------------------


def test_bob_cannot_use_alices_instance_id_while_she_is_in_the_group(
    secured: InProcessCoordinator,
    clients: Clients,
    group: str,
    pair: tuple[ScriptedWorker, ScriptedWorker],
) -> None:
    alice, bob = pair
    unchanged = Unchanged(secured, clients, group)
    newcomer = ScriptedWorker(clients.bob, group, "b2", instance_id="inst-a")
    refused(newcomer.join())  # not UNRELEASED_INSTANCE_ID: the id is not bob's to wait for
    own_member = ScriptedWorker(clients.bob, group, "b1", instance_id="inst-a")
    own_member.epoch, own_member.owned = bob.epoch, bob.owned
    refused(own_member.heartbeat(full=True))
    refused(own_member.heartbeat(epoch=-2, instance_id="inst-a", report_owned=False))
    as_alice = ScriptedWorker(clients.bob, group, "a1", instance_id="inst-a")
    as_alice.epoch = alice.epoch
    refused(as_alice.leave(static=True))
    unchanged.check()
    still_works(alice, bob)


def test_bob_cannot_take_over_alices_instance_id_after_her_static_leave(
    secured: InProcessCoordinator,
    clients: Clients,
    group: str,
    pair: tuple[ScriptedWorker, ScriptedWorker],
) -> None:
    alice, bob = pair
    alices_work = alice.owned
    left = alice.leave(static=True)
    assert left.error_code == 0 and left.member_epoch == -2, left
    unchanged = Unchanged(secured, clients, group)
    member = {m.member_id: m for m in unchanged.view.members}["a1"]
    assert member.state == "LEFT" and member.instance_id == "inst-a"

    refused(ScriptedWorker(clients.bob, group, "b3", instance_id="inst-a").join())
    refused(ScriptedWorker(clients.bob, group, "a1", instance_id="inst-a").join())
    refused(ScriptedWorker(clients.bob, group, "a1").join())
    own_member = ScriptedWorker(clients.bob, group, "b1", instance_id="inst-a")
    own_member.epoch, own_member.owned = bob.epoch, bob.owned
    refused(own_member.heartbeat(full=True))
    unchanged.check()

    # Alice comes back under a new member id with her instance id: she gets her work back.
    successor = ScriptedWorker(clients.alice, group, "a2", instance_id="inst-a")
    assert successor.join().error_code in (0, COMPUTE_ASSIGNMENT), successor.last
    described = {m.member_id: m for m in describe(clients.admin, group).members}
    assert set(described) == {"a2", "b1"}
    assert described["a2"].instance_id == "inst-a"
    assert from_cat(described["a2"].target_assignment) == alices_work
    assert bob.heartbeat().error_code in (0, COMPUTE_ASSIGNMENT)


def test_bob_cannot_take_a_fenced_static_members_instance_id_while_its_work_is_held(
    secured: InProcessCoordinator,
    clients: Clients,
    group: str,
    pair: tuple[ScriptedWorker, ScriptedWorker],
) -> None:
    """Issue 23's finding: alice's static member is fenced (a stale epoch), so its work is
    held and her agent may still run it; bob joining with her instance id under a new member
    id, or taking it on with his own member, is refused and changes nothing; alice's restarted
    pod (a new member id, the same instance id) is accepted."""
    alice, bob = pair
    fenced = alice.heartbeat(epoch=alice.epoch + 3)
    assert fenced.error_code == ErrorCode.FENCED_MEMBER_EPOCH, fenced
    assert "a1" not in {m.member_id for m in describe(clients.admin, group).members}
    unchanged = Unchanged(secured, clients, group)

    refused(ScriptedWorker(clients.bob, group, "b2", instance_id="inst-a").join())
    own_member = ScriptedWorker(clients.bob, group, "b1", instance_id="inst-a")
    own_member.epoch, own_member.owned = bob.epoch, bob.owned
    refused(own_member.heartbeat(full=True))
    unchanged.check()

    restarted = ScriptedWorker(clients.alice, group, "a2", instance_id="inst-a")
    assert restarted.join().error_code in (0, COMPUTE_ASSIGNMENT), restarted.last
    described = {m.member_id: m for m in describe(clients.admin, group).members}
    assert set(described) == {"a2", "b1"}
    assert described["a2"].instance_id == "inst-a"
    assert bob.heartbeat().error_code in (0, COMPUTE_ASSIGNMENT), bob.last


# --- the assignor member ------------------------------------------------------------------------


def test_bob_cannot_prepare_or_install_as_the_assignor_member(
    secured: InProcessCoordinator,
    clients: Clients,
    group: str,
    pair: tuple[ScriptedWorker, ScriptedWorker],
) -> None:
    alice, bob = pair
    put = clients.admin.admin.PutConnector(
        admin_pb2.PutConnectorRequest(group_id=group, connector="C", task_count=3), timeout=5
    )
    assert put.error_code == 0, put
    assert alice.heartbeat().error_code == COMPUTE_ASSIGNMENT  # she is asked to compute
    assert bob.heartbeat().error_code == 0

    unchanged = Unchanged(secured, clients, group)
    shown = unchanged.view
    assignor = {m.member_id: m for m in shown.members}[shown.assignor_member_id]
    assert assignor.member_id == "a1"
    impostor = ScriptedWorker(clients.bob, group, assignor.member_id)
    impostor.epoch = assignor.member_epoch
    everything_to_bob = {
        "b1": parse("A", "A-0", "A-1", "B", "B-0", "C", "C-0", "C-1", "C-2"),
        "a1": parse(),
    }
    refused(impostor.prepare())
    refused(impostor.install(shown.group_epoch, everything_to_bob))
    refused(impostor.install(shown.group_epoch, {}, error=1))  # "the assignor failed"
    refused(impostor.install(shown.group_epoch, everything_to_bob, delay_ms=60_000))
    unchanged.check()

    # Alice prepares; bob still cannot install in her place, with her prepared epoch.
    prepared = alice.prepare()
    assert prepared.error_code == 0, prepared
    unchanged = Unchanged(secured, clients, group)
    refused(impostor.install(prepared.group_epoch, everything_to_bob))
    refused(impostor.prepare())
    unchanged.check()

    assert alice.install(prepared.group_epoch, spread(prepared)).error_code == 0
    settled = settle([alice, bob], clients.admin, group)
    targets = spread(prepared)
    members = {m.member_id: from_cat(m.current_assignment) for m in settled.members}
    assert members == targets


# --- are the refusals counted? ------------------------------------------------------------------


def test_every_refused_impersonation_is_counted_and_audited(
    secured: InProcessCoordinator,
    clients: Clients,
    group: str,
    pair: tuple[ScriptedWorker, ScriptedWorker],
) -> None:
    """`coordinator_authorization_denials` counts "an id bound to another principal" too, and
    authenticated denials are aggregated into AUTHORIZATION_DENIED events: each refused
    impersonation is one denial of MEMBER, by RPC, whichever path the server answered it on."""
    alice, _bob = pair
    secured.authorizer.flush_denials()
    assert alice.heartbeat().error_code == 0
    impostor = ScriptedWorker(clients.bob, group, "a1")
    impostor.epoch, impostor.owned = alice.epoch, alice.owned

    prepares = denial_count(secured, "ConnectGroupPrepareAssignment", "MEMBER")
    installs = denial_count(secured, "ConnectGroupInstallAssignment", "MEMBER")
    refused(impostor.prepare())
    refused(impostor.install(alice.epoch, {"a1": parse(), "b1": parse()}))
    assert denial_count(secured, "ConnectGroupPrepareAssignment", "MEMBER") == prepares + 1
    assert denial_count(secured, "ConnectGroupInstallAssignment", "MEMBER") == installs + 1

    heartbeats = denial_count(secured, "ConnectGroupHeartbeat", "MEMBER")
    for _ in range(3):
        refused(impostor.heartbeat())  # with alice's epoch: a steady heartbeat
    refused(impostor.heartbeat(epoch=-1, report_owned=False))
    refused(impostor.join())
    assert denial_count(secured, "ConnectGroupHeartbeat", "MEMBER") == heartbeats + 5

    secured.authorizer.flush_denials()
    rows = denial_events(secured.database_url, {group})
    assert [(r["payload"]["principal"], r["payload"]["operation"]) for r in rows] == [
        (BOB, "MEMBER")
    ], rows
    assert rows[0]["payload"]["count"] == 7
    assert rows[0]["payload"]["rpcs"] == [
        "ConnectGroupHeartbeat",
        "ConnectGroupInstallAssignment",
        "ConnectGroupPrepareAssignment",
    ]
