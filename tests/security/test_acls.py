"""Authorization by ACLs on a real mTLS coordinator (issue 12), the callers named by their
client certificates: every RPC with every operation granted (and none), deny winning over allow,
prefixed and `*` patterns, `User:*`, the super user, ACL changes reaching a running server, the
denial metric, the aggregated AUTHORIZATION_DENIED events (one row per principal and operation
per interval, `User:ANONYMOUS` included, a bounded number of principals plus one overflow row:
issue 23), and
`coordinator-svc acl add|remove|list` end to end against the test database.

A denied call answers GROUP_AUTHORIZATION_FAILED (CLUSTER_AUTHORIZATION_FAILED for ListGroups)
and changes no row of its group."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from connect.group.v1 import admin_pb2

from coordinator_svc.core.acls import (
    CLUSTER_NAME,
    AclEntry,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from coordinator_svc.metrics import Metrics
from coordinator_svc.runtime.authorizer import MAX_DENIAL_PRINCIPALS, Authorizer
from tests.support.agents import wait_for
from tests.support.client import ScriptedWorker, describe
from tests.support.coordinator import REPO, InProcessCoordinator
from tests.support.store_dump import Dump, dump
from tests.support.tls_clients import TlsStubs

from .conftest import (
    ADMIN,
    ALICE,
    BOB,
    COMPUTE_ASSIGNMENT,
    QUIET_DEFAULTS,
    Clients,
    Pki,
    clear_acls,
    denial_count,
    denial_events,
    grant,
    revoke,
    spread,
    unique,
)

GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
GROUP_ID_NOT_FOUND = 69
GROUP = ResourceType.GROUP
CLUSTER = ResourceType.CLUSTER

#: What an ALLOW of each operation lets a principal do (README: "ACLs").
GRANTS: dict[Operation, frozenset[Operation]] = {
    Operation.MEMBER: frozenset({Operation.MEMBER, Operation.DESCRIBE}),
    Operation.DESCRIBE: frozenset({Operation.DESCRIBE}),
    Operation.ALTER: frozenset({Operation.ALTER, Operation.DESCRIBE}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.DESCRIBE}),
    Operation.DELETE: frozenset({Operation.DELETE, Operation.DESCRIBE}),
    Operation.ALL: frozenset(Operation),
}


@pytest.fixture(autouse=True)
def no_acls_left(secured: InProcessCoordinator) -> Iterator[None]:
    """Every test starts and ends without ACLs (they share the module's coordinator)."""
    clear_acls(secured)
    yield
    clear_acls(secured)


def group_rows(store_dump: Dump, group_id: str) -> Dump:
    return {
        table: [row for row in rows if row.get("group_id") == group_id]
        for table, rows in store_dump.items()
    }


def acl(
    principal: str,
    operation: Operation,
    pattern: str,
    pattern_type: PatternType = PatternType.LITERAL,
    permission: Permission = Permission.ALLOW,
    resource_type: ResourceType = GROUP,
) -> AclEntry:
    return AclEntry(principal, operation, resource_type, pattern, pattern_type, permission)


def cluster_acl(principal: str, operation: Operation, deny: bool = False) -> AclEntry:
    permission = Permission.DENY if deny else Permission.ALLOW
    return acl(principal, operation, CLUSTER_NAME, PatternType.LITERAL, permission, CLUSTER)


def put(
    stubs: TlsStubs, group: str, connector: str = "c", config: dict[str, str] | None = None
) -> Any:
    return stubs.admin.PutConnector(
        admin_pb2.PutConnectorRequest(
            group_id=group, connector=connector, task_count=1, config=config or {}
        ),
        timeout=5,
    )


def find(stubs: TlsStubs, group: str) -> Any:
    return stubs.admin.FindCoordinator(admin_pb2.FindCoordinatorRequest(group_id=group), timeout=5)


def list_groups(stubs: TlsStubs) -> Any:
    return stubs.admin.ListGroups(admin_pb2.ListGroupsRequest(), timeout=5)


# --- every RPC, every operation -----------------------------------------------------------------


@dataclass
class Case:
    """One RPC called by alice on a fresh group that the admin created with connector `c`."""

    coordinator: InProcessCoordinator
    clients: Clients
    group: str

    def assignor(self) -> tuple[ScriptedWorker, Any]:
        """Alice's member `m1`, the group's assignor member, joined (and, to prepare, allowed
        MEMBER) before the ACL under test replaces that permission."""
        member = acl(ALICE, Operation.MEMBER, self.group)
        grant(self.coordinator, member)
        worker = ScriptedWorker(self.clients.alice, self.group, "m1")
        joined = worker.join()
        assert joined.error_code == COMPUTE_ASSIGNMENT, joined
        prepared = worker.prepare()
        assert prepared.error_code == 0, prepared
        revoke(self.coordinator, member)
        return worker, prepared


Call = Callable[[], int]


def heartbeat_case(case: Case) -> Call:
    worker = ScriptedWorker(case.clients.alice, case.group, "m1")
    return lambda: int(worker.join().error_code)


def prepare_case(case: Case) -> Call:
    worker, _ = case.assignor()
    return lambda: int(worker.prepare().error_code)


def install_case(case: Case) -> Call:
    worker, prepared = case.assignor()
    return lambda: int(worker.install(prepared.group_epoch, spread(prepared)).error_code)


def put_case(case: Case) -> Call:
    return lambda: int(put(case.clients.alice, case.group, "c2").error_code)


def delete_case(case: Case) -> Call:
    request = admin_pb2.DeleteConnectorRequest(group_id=case.group, connector="c")
    return lambda: int(case.clients.alice.admin.DeleteConnector(request, timeout=5).error_code)


def alter_case(case: Case) -> Call:
    request = admin_pb2.AlterGroupConfigsRequest(
        group_id=case.group, set={"heartbeat.interval.ms": "2000"}
    )
    return lambda: int(case.clients.alice.admin.AlterGroupConfigs(request, timeout=5).error_code)


def delete_group_case(case: Case) -> Call:
    request = admin_pb2.DeleteGroupRequest(group_id=case.group, with_catalogue=True)
    return lambda: int(case.clients.alice.admin.DeleteGroup(request, timeout=5).error_code)


def remove_member_case(case: Case) -> Call:
    """Alice removes the admin's member (RemoveMember is an operator's act: ALTER, whoever
    the member's principal)."""
    joined = ScriptedWorker(case.clients.admin, case.group, "admins-worker").join()
    assert joined.error_code in (0, COMPUTE_ASSIGNMENT), joined
    request = admin_pb2.RemoveMemberRequest(group_id=case.group, member_id="admins-worker")
    return lambda: int(case.clients.alice.admin.RemoveMember(request, timeout=5).error_code)


def list_case(case: Case) -> Call:
    def call() -> int:
        answer = list_groups(case.clients.alice)
        if answer.error_code == 0:
            assert case.group in {g.group_id for g in answer.groups}
        return int(answer.error_code)

    return call


def describe_case(case: Case) -> Call:
    def call() -> int:
        answer = describe(case.clients.alice, case.group)
        if answer.error_code == 0:
            assert [c.name for c in answer.catalogue] == ["c"]
        return int(answer.error_code)

    return call


def describe_values_case(case: Case) -> Call:
    """DescribeGroups asking for connector config values: DESCRIBE_CONFIGS."""
    assert put(case.clients.admin, case.group, "c", {"password": "s3cret"}).error_code == 0
    request = admin_pb2.DescribeGroupsRequest(group_ids=[case.group], include_config_values=True)

    def call() -> int:
        answer = case.clients.alice.admin.DescribeGroups(request, timeout=5).groups[0]
        if answer.error_code == 0:
            assert dict(answer.catalogue[0].config) == {"password": "s3cret"}
        return int(answer.error_code)

    return call


def find_case(case: Case) -> Call:
    def call() -> int:
        answer = find(case.clients.alice, case.group)
        if answer.error_code == 0:
            assert answer.port == case.coordinator.port
        return int(answer.error_code)

    return call


@dataclass(frozen=True)
class Rpc:
    setup: Callable[[Case], Call]
    needs: Operation
    on: ResourceType = GROUP
    allowed: tuple[int, ...] = (0,)


RPCS: dict[str, Rpc] = {
    "ConnectGroupHeartbeat": Rpc(heartbeat_case, Operation.MEMBER, allowed=(0, COMPUTE_ASSIGNMENT)),
    "ConnectGroupPrepareAssignment": Rpc(prepare_case, Operation.MEMBER),
    "ConnectGroupInstallAssignment": Rpc(install_case, Operation.MEMBER),
    "PutConnector": Rpc(put_case, Operation.ALTER),
    "DeleteConnector": Rpc(delete_case, Operation.ALTER),
    "AlterGroupConfigs": Rpc(alter_case, Operation.ALTER),
    "DeleteGroup": Rpc(delete_group_case, Operation.DELETE),
    "RemoveMember": Rpc(remove_member_case, Operation.ALTER),
    "ListGroups": Rpc(list_case, Operation.DESCRIBE, CLUSTER),
    "DescribeGroups": Rpc(describe_case, Operation.DESCRIBE),
    "DescribeGroups with config values": Rpc(describe_values_case, Operation.DESCRIBE_CONFIGS),
    "FindCoordinator": Rpc(find_case, Operation.DESCRIBE),
}


@pytest.mark.parametrize("granted", [None, *Operation], ids=lambda o: str(o or "nothing"))
@pytest.mark.parametrize("rpc", list(RPCS))
def test_each_rpc_is_allowed_exactly_by_the_operations_that_grant_it(
    secured: InProcessCoordinator, clients: Clients, rpc: str, granted: Operation | None
) -> None:
    spec = RPCS[rpc]
    case = Case(secured, clients, unique("matrix"))
    assert put(clients.admin, case.group).error_code == 0
    call = spec.setup(case)
    if granted is not None:
        pattern = CLUSTER_NAME if spec.on is CLUSTER else case.group
        grant(secured, acl(ALICE, granted, pattern, resource_type=spec.on))
    before = dump(secured.store)
    code = call()
    if granted is not None and spec.needs in GRANTS[granted]:
        assert code in spec.allowed, f"{rpc} with {granted} answered {code}"
    else:
        refused = CLUSTER_AUTHORIZATION_FAILED if spec.on is CLUSTER else GROUP_AUTHORIZATION_FAILED
        assert code == refused, f"{rpc} with {granted} answered {code}"
        assert group_rows(dump(secured.store), case.group) == group_rows(before, case.group)


def test_an_acl_on_another_group_or_for_another_principal_grants_nothing(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    group, other = unique("mine"), unique("other")
    grant(
        secured,
        acl(ALICE, Operation.ALL, other),
        acl(BOB, Operation.ALL, group),
        cluster_acl(BOB, Operation.ALL),
    )
    assert put(clients.alice, group).error_code == GROUP_AUTHORIZATION_FAILED
    assert describe(clients.alice, group).error_code == GROUP_AUTHORIZATION_FAILED
    assert ScriptedWorker(clients.alice, group, "a1").join().error_code == (
        GROUP_AUTHORIZATION_FAILED
    )
    assert list_groups(clients.alice).error_code == CLUSTER_AUTHORIZATION_FAILED
    assert put(clients.alice, other).error_code == 0
    assert put(clients.bob, group).error_code == 0
    assert list_groups(clients.bob).error_code == 0


def test_describe_groups_answers_each_group_by_its_own_acls(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    allowed, other = unique("batch"), unique("batch")
    for group in (allowed, other):
        assert put(clients.admin, group, "c", {"password": "s3cret"}).error_code == 0
    grant(secured, acl(ALICE, Operation.DESCRIBE, allowed))
    answer = clients.alice.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=[allowed, other, allowed]), timeout=5
    )
    # A group named again gets INVALID_REQUEST, unread (issue 23: bounded reads).
    assert [g.error_code for g in answer.groups] == [0, GROUP_AUTHORIZATION_FAILED, 42]
    assert [c.name for c in answer.groups[0].catalogue] == ["c"]
    assert dict(answer.groups[0].catalogue[0].config) != {"password": "s3cret"}  # masked
    refused = answer.groups[1]
    assert refused.group_id == other and not refused.catalogue and not refused.members


# --- deny wins, patterns, everyone, the super user ---------------------------------------------


def test_deny_wins_over_allow(secured: InProcessCoordinator, clients: Clients) -> None:
    group = unique("deny")
    grant(
        secured,
        acl(ALICE, Operation.ALL, group),
        acl(ALICE, Operation.ALTER, group, permission=Permission.DENY),
    )
    assert put(clients.alice, group).error_code == GROUP_AUTHORIZATION_FAILED
    alice = ScriptedWorker(clients.alice, group, "a1")
    assert alice.join().error_code in (0, COMPUTE_ASSIGNMENT)
    assert describe(clients.alice, group).error_code == 0
    # A DENY for everyone wins over alice's own ALLOW, on the next heartbeat already.
    everyone = acl("User:*", Operation.MEMBER, group, permission=Permission.DENY)
    grant(secured, everyone)
    assert alice.heartbeat().error_code == GROUP_AUTHORIZATION_FAILED
    assert describe(clients.alice, group).error_code == 0  # DESCRIBE is not denied
    revoke(secured, everyone)
    assert alice.heartbeat().error_code in (0, COMPUTE_ASSIGNMENT)
    # A prefixed DENY wins over a literal ALLOW.
    grant(secured, acl(ALICE, Operation.ALL, group[:6], PatternType.PREFIXED, Permission.DENY))
    assert describe(clients.alice, group).error_code == GROUP_AUTHORIZATION_FAILED
    assert alice.heartbeat().error_code == GROUP_AUTHORIZATION_FAILED


def test_prefixed_and_star_patterns(secured: InProcessCoordinator, clients: Clients) -> None:
    prefix = unique("team") + "-"
    grant(secured, acl(ALICE, Operation.MEMBER, prefix, PatternType.PREFIXED))
    for group in (prefix, prefix + "a", prefix + "a-b"):
        assert ScriptedWorker(clients.alice, group, "a1").join().error_code in (
            0,
            COMPUTE_ASSIGNMENT,
        ), group
    for group in (prefix[:-1], "x" + prefix, prefix.upper() + "a"):
        answer = ScriptedWorker(clients.alice, group, "a1").join()
        assert answer.error_code == GROUP_AUTHORIZATION_FAILED, group
    # The literal `*`: every group, not the cluster.
    grant(secured, acl(BOB, Operation.DESCRIBE, "*"))
    for group in (prefix + "a", unique("anything")):
        assert find(clients.bob, group).error_code == 0, group
    assert list_groups(clients.bob).error_code == CLUSTER_AUTHORIZATION_FAILED
    assert put(clients.bob, prefix + "a").error_code == GROUP_AUTHORIZATION_FAILED
    # A prefixed `*` matches only names that start with one.
    grant(secured, acl(ALICE, Operation.ALTER, "*", PatternType.PREFIXED))
    assert put(clients.alice, unique("plain")).error_code == GROUP_AUTHORIZATION_FAILED
    assert put(clients.alice, unique("*star")).error_code == 0


def test_user_star_is_every_principal(secured: InProcessCoordinator, clients: Clients) -> None:
    group = unique("everyone")
    grant(secured, acl("User:*", Operation.ALTER, group))
    assert put(clients.alice, group, "a").error_code == 0
    assert put(clients.bob, group, "b").error_code == 0
    names = sorted(c.name for c in describe(clients.admin, group).catalogue)
    assert names == ["a", "b"]


def test_the_super_user_needs_no_acl_and_no_deny_stops_it(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    group = unique("super")
    grant(
        secured,
        acl(ADMIN, Operation.ALL, group, permission=Permission.DENY),
        acl("User:*", Operation.ALL, group[:5], PatternType.PREFIXED, Permission.DENY),
        cluster_acl(ADMIN, Operation.ALL, deny=True),
    )
    assert put(clients.admin, group).error_code == 0
    admin = ScriptedWorker(clients.admin, group, "adm-1")
    assert admin.join().error_code == COMPUTE_ASSIGNMENT
    prepared = admin.prepare()
    assert prepared.error_code == 0
    assert admin.install(prepared.group_epoch, spread(prepared)).error_code == 0
    assert describe(clients.admin, group).error_code == 0
    assert group in {g.group_id for g in list_groups(clients.admin).groups}
    assert find(clients.admin, group).error_code == 0


def test_acl_changes_reach_the_running_server_without_being_asked(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    """No `refresh()` from the test: the coordinator re-reads the table every 0.1 s."""
    group = unique("refresh")
    entry = acl(ALICE, Operation.DESCRIBE, group)
    assert find(clients.alice, group).error_code == GROUP_AUTHORIZATION_FAILED
    added = time.monotonic()
    assert secured.store.acls.add(entry)
    wait_for("the new ACL", lambda: find(clients.alice, group).error_code == 0, 5, 0.02)
    assert time.monotonic() - added < 5
    assert secured.store.acls.remove(entry) == 1
    wait_for(
        "the removal",
        lambda: find(clients.alice, group).error_code == GROUP_AUTHORIZATION_FAILED,
        5,
        0.02,
    )
    # A DENY added next to an ALLOW also takes effect.
    assert secured.store.acls.add(acl(ALICE, Operation.DESCRIBE, "*"))
    wait_for("the ALLOW", lambda: find(clients.alice, group).error_code == 0, 5, 0.02)
    assert secured.store.acls.add(acl(ALICE, Operation.DESCRIBE, group, permission=Permission.DENY))
    wait_for(
        "the DENY",
        lambda: find(clients.alice, group).error_code == GROUP_AUTHORIZATION_FAILED,
        5,
        0.02,
    )
    assert find(clients.alice, unique("elsewhere")).error_code == 0


# --- denials: the metric and the audit trail ---------------------------------------------------


def test_the_denial_metric_counts_each_denied_call_by_rpc_and_operation(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    group = unique("metric")
    calls: list[tuple[str, str, Callable[[], Any]]] = [
        ("PutConnector", "ALTER", lambda: put(clients.bob, group)),
        ("DescribeGroups", "DESCRIBE", lambda: describe(clients.bob, group)),
        ("FindCoordinator", "DESCRIBE", lambda: find(clients.bob, group)),
        ("ListGroups", "DESCRIBE", lambda: list_groups(clients.bob)),
        (
            "ConnectGroupHeartbeat",
            "MEMBER",
            lambda: ScriptedWorker(clients.bob, group, "b1").join(),
        ),
    ]
    for rpc, operation, call in calls:
        before = denial_count(secured, rpc, operation)
        for _ in range(3):
            assert call().error_code in (GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED)
        assert denial_count(secured, rpc, operation) == before + 3, rpc
    # Allowed calls are not counted.
    grant(secured, acl(BOB, Operation.DESCRIBE, group))
    before = denial_count(secured, "FindCoordinator", "DESCRIBE")
    assert find(clients.bob, group).error_code == 0
    assert denial_count(secured, "FindCoordinator", "DESCRIBE") == before


def test_denials_are_written_as_one_event_per_principal_and_operation(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    g1, g2 = unique("audit-1"), unique("audit-2")
    secured.authorizer.flush_denials()  # what earlier tests left
    started_ms = int(time.time() * 1000)
    for _ in range(7):
        assert put(clients.bob, g1).error_code == GROUP_AUTHORIZATION_FAILED
    for _ in range(2):
        request = admin_pb2.DeleteConnectorRequest(group_id=g1, connector="c")
        assert clients.bob.admin.DeleteConnector(request, timeout=5).error_code == 30
    for _ in range(3):
        assert describe(clients.bob, g1).error_code == GROUP_AUTHORIZATION_FAILED
    for _ in range(2):
        assert find(clients.bob, g1).error_code == GROUP_AUTHORIZATION_FAILED
    for i in range(4):
        answer = ScriptedWorker(clients.bob, g2, f"b{i}").join()
        assert answer.error_code == GROUP_AUTHORIZATION_FAILED
    for _ in range(2):
        assert put(clients.alice, g1).error_code == GROUP_AUTHORIZATION_FAILED
    assert denial_events(secured.database_url, {g1, g2}) == []  # nothing written per request
    finished_ms = int(time.time() * 1000)

    assert secured.authorizer.flush_denials() == 4
    rows = denial_events(secured.database_url, {g1, g2})
    seen = {(r["payload"]["principal"], r["payload"]["operation"], r["group_id"]): r for r in rows}
    assert len(seen) == len(rows) == 4, rows
    expected = {
        (BOB, "ALTER", g1): (9, ["DeleteConnector", "PutConnector"]),
        (BOB, "DESCRIBE", g1): (5, ["DescribeGroups", "FindCoordinator"]),
        (BOB, "MEMBER", g2): (4, ["ConnectGroupHeartbeat"]),
        (ALICE, "ALTER", g1): (2, ["PutConnector"]),
    }
    assert {k: (r["payload"]["count"], r["payload"]["rpcs"]) for k, r in seen.items()} == expected
    for row in rows:
        payload = row["payload"]
        assert started_ms <= payload["first_ms"] <= payload["last_ms"] <= finished_ms, row
        assert row["group_epoch"] == -1 and row["member_id"] is None, row
        assert row["at_ms"] == payload["last_ms"]

    # Nothing new: nothing written. New denials: a new row with only their count.
    assert secured.authorizer.flush_denials() == 0
    assert len(denial_events(secured.database_url, {g1, g2})) == 4
    assert put(clients.bob, g1).error_code == GROUP_AUTHORIZATION_FAILED
    assert secured.authorizer.flush_denials() == 1
    latest = denial_events(secured.database_url, {g1, g2})[-1]
    assert (latest["payload"]["principal"], latest["payload"]["count"]) == (BOB, 1)


def test_anonymous_denials_are_recorded_like_any_other(module_database_url: str) -> None:
    group = unique("anonymous")
    with InProcessCoordinator(
        module_database_url, defaults=QUIET_DEFAULTS, authorization=True
    ) as plaintext:
        stubs = plaintext.stubs
        assert stubs is not None
        plaintext.authorizer.flush_denials()
        before = denial_count(plaintext, "PutConnector", "ALTER")
        for _ in range(5):
            answer = stubs.admin.PutConnector(
                admin_pb2.PutConnectorRequest(group_id=group, connector="c", task_count=1),
                timeout=5,
            )
            assert answer.error_code == GROUP_AUTHORIZATION_FAILED
            assert answer.error_message.startswith("User:ANONYMOUS is not allowed")
            assert ScriptedWorker(stubs, group, "w").join().error_code == 30
        assert denial_count(plaintext, "PutConnector", "ALTER") == before + 5
        assert plaintext.authorizer.flush_denials() == 2
    rows = denial_events(module_database_url, {group})
    assert {(r["payload"]["principal"], r["payload"]["operation"]) for r in rows} == {
        ("User:ANONYMOUS", "ALTER"),
        ("User:ANONYMOUS", "MEMBER"),
    }
    assert all(r["payload"]["count"] == 5 for r in rows), rows


def test_one_principal_denied_on_many_groups_hides_no_other_principals_denial(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    """10,000 distinct groups of one principal and one denial of another in one interval: both
    recorded, in a bounded number of rows (one per principal and operation)."""
    secured.authorizer.flush_denials()
    authorizer = Authorizer(secured.store.acls, Metrics(), enabled=True, wall_ms=lambda: 5_000)
    prefix = unique("flood")
    for i in range(10_000):
        authorizer.denied("DescribeGroups", BOB, Operation.DESCRIBE, f"{prefix}-{i}")
    lone = unique("lone")
    authorizer.denied("PutConnector", ALICE, Operation.ALTER, lone)
    authorizer.denied("ListGroups", ALICE, Operation.DESCRIBE, CLUSTER_NAME, CLUSTER)
    since = max((r["id"] for r in denial_events(secured.database_url)), default=0)
    assert authorizer.flush_denials() == 3
    rows = [r for r in denial_events(secured.database_url) if r["id"] > since]
    assert len(rows) == 3, rows
    by = {(r["payload"]["principal"], r["payload"]["operation"]): r for r in rows}
    flood = by[(BOB, "DESCRIBE")]
    assert flood["group_id"] == ""  # many groups
    assert flood["payload"]["count"] == 10_000
    assert flood["payload"]["rpcs"] == ["DescribeGroups"]
    assert 1 <= len(flood["payload"]["groups"]) <= 10
    assert all(g.startswith(prefix) for g in flood["payload"]["groups"])
    assert flood["payload"]["distinct_groups"] >= 1_000
    assert flood["payload"]["distinct_groups_capped"] is True
    single = by[(ALICE, "ALTER")]
    assert (single["group_id"], single["payload"]["count"]) == (lone, 1)
    assert single["payload"]["groups"] == [lone] and single["payload"]["distinct_groups"] == 1
    cluster = by[(ALICE, "DESCRIBE")]
    assert cluster["group_id"] == "" and cluster["payload"]["resource_type"] == "CLUSTER"

    # Through the server: one principal on 50 groups, another once, one flush, two rows.
    secured.authorizer.flush_denials()
    since = max((r["id"] for r in denial_events(secured.database_url)), default=0)
    for i in range(50):
        assert find(clients.bob, f"{prefix}-{i}").error_code == GROUP_AUTHORIZATION_FAILED
    assert find(clients.alice, lone).error_code == GROUP_AUTHORIZATION_FAILED
    assert secured.authorizer.flush_denials() == 2
    rows = [r for r in denial_events(secured.database_url) if r["id"] > since]
    counts = {r["payload"]["principal"]: (r["payload"]["count"], r["group_id"]) for r in rows}
    assert counts == {BOB: (50, ""), ALICE: (1, lone)}


def test_principals_past_the_bound_are_counted_in_one_overflow_row(
    secured: InProcessCoordinator,
) -> None:
    secured.authorizer.flush_denials()
    authorizer = Authorizer(secured.store.acls, Metrics(), enabled=True, wall_ms=lambda: 7_000)
    group = unique("crowd")
    extra = 7
    for i in range(MAX_DENIAL_PRINCIPALS + extra):
        for _ in range(2):
            authorizer.denied("PutConnector", f"User:CN=p{i}", Operation.ALTER, group)
    assert authorizer.flush_denials() == MAX_DENIAL_PRINCIPALS + 1
    rows = denial_events(secured.database_url, {group})
    assert len(rows) == MAX_DENIAL_PRINCIPALS + 1
    [overflow] = [r for r in rows if r["payload"].get("overflow")]
    assert overflow["payload"]["principal"] is None
    assert overflow["payload"]["principals"] == extra
    assert overflow["payload"]["count"] == 2 * extra
    assert sum(r["payload"]["count"] for r in rows) == 2 * (MAX_DENIAL_PRINCIPALS + extra)


def test_the_server_writes_the_denials_once_per_interval_by_itself(
    module_database_url: str, pki: Pki
) -> None:
    group = unique("interval")
    with (
        InProcessCoordinator(
            module_database_url,
            defaults=QUIET_DEFAULTS,
            tls=pki.server_tls(),
            authorization=True,
            acl_refresh_s=0.05,
            denial_interval_s=1.0,
        ) as coordinator,
        TlsStubs(coordinator.address, pki.ca.cert_file, pki.bob) as bob,
    ):
        for _ in range(20):
            assert put(bob, group).error_code == GROUP_AUTHORIZATION_FAILED

        def written() -> list[dict[str, Any]] | None:
            rows = denial_events(module_database_url, {group})
            total = sum(r["payload"]["count"] for r in rows)
            return rows if total == 20 else None

        rows = wait_for("the denials of 20 calls to be written", written, 5, 0.1)
        assert 1 <= len(rows) <= 2, rows  # one per interval (the calls may straddle two)


# --- coordinator-svc acl -------------------------------------------------------------------------


def acl_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}"}
    return subprocess.run(
        [sys.executable, "-m", "coordinator_svc.cli", "acl", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_acl_command_end_to_end(secured: InProcessCoordinator, clients: Clients) -> None:
    url = ["--database-url", secured.database_url]
    prefix = unique("cli") + "-"
    group = prefix + "g"
    entry = ["--principal", ALICE, "--operation", "member", "--group-prefix", prefix]
    assert ScriptedWorker(clients.alice, group, "a1").join().error_code == 30

    added = acl_cli("add", *url, *entry)
    assert added.returncode == 0, added
    assert added.stdout.startswith("added: ALLOW User:CN=alice,O=connect-tests MEMBER on GROUP")
    again = acl_cli("add", *url, *entry)
    assert again.returncode == 0 and again.stdout.startswith("already there:"), again
    denied = acl_cli(
        "add", *url, "--principal", BOB, "--operation", "ALTER", "--group", group, "--deny"
    )
    assert denied.returncode == 0 and "DENY" in denied.stdout, denied
    cluster = acl_cli("add", *url, "--principal", BOB, "--operation", "DESCRIBE", "--cluster")
    assert cluster.returncode == 0 and "CLUSTER" in cluster.stdout, cluster

    listed = acl_cli("list", *url)
    assert listed.returncode == 0, listed
    lines = listed.stdout.splitlines()
    assert len(lines) == 3, lines
    assert any(ALICE in line and "PREFIXED" in line and prefix in line for line in lines)
    only_bob = acl_cli("list", *url, "--principal", BOB).stdout.splitlines()
    assert len(only_bob) == 2 and all(BOB in line for line in only_bob), only_bob

    # The running coordinator picks them up.
    alice = ScriptedWorker(clients.alice, group, "a1")
    wait_for(
        "alice allowed to join",
        lambda: alice.join().error_code in (0, COMPUTE_ASSIGNMENT),
        5,
        0.05,
    )
    wait_for("bob allowed to list groups", lambda: list_groups(clients.bob).error_code == 0, 5)
    assert put(clients.bob, group).error_code == GROUP_AUTHORIZATION_FAILED

    removed = acl_cli("remove", *url, *entry)
    assert removed.returncode == 0 and removed.stdout.startswith("removed: "), removed
    gone = acl_cli("remove", *url, *entry)
    assert gone.returncode == 1 and "no such entry" in gone.stderr, gone
    wait_for(
        "alice refused again",
        lambda: alice.heartbeat().error_code == GROUP_AUTHORIZATION_FAILED,
        5,
        0.05,
    )
    assert len(acl_cli("list", *url).stdout.splitlines()) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--principal", "alice", "--operation", "MEMBER", "--group", "g"], "User:<name>"),
        (["--principal", "User:x", "--operation", "MEMBER", "--group", ""], "pattern"),
        (["--principal", "User:x", "--operation", "READ", "--group", "g"], "invalid choice"),
        (["--principal", "User:x", "--operation", "MEMBER"], "one of the arguments"),
        (
            ["--principal", "User:x", "--operation", "MEMBER", "--group", "g", "--cluster"],
            "not allowed with",
        ),
    ],
)
def test_the_acl_command_refuses_bad_entries(
    secured: InProcessCoordinator, args: list[str], message: str
) -> None:
    done = acl_cli("add", "--database-url", secured.database_url, *args)
    assert done.returncode == 2, done
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert secured.store.acls.load()[1] == []
