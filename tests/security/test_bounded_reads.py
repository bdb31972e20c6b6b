"""Reads a hostile client cannot amplify, quotas per principal, and admin events that say who
(issue 23, items 1, 2, 8 and the Prepare/Install answers of item 10). Real PostgreSQL, real gRPC
on 127.0.0.1 (mTLS where principals matter); what is asserted is counted, never timed."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from connect.group.v1 import admin_pb2, common_pb2, coordinator_pb2
from sqlalchemy import event as sa_event

from coordinator_svc.core.acls import AclEntry, Operation, PatternType, Permission, ResourceType
from coordinator_svc.core.records import EventType
from coordinator_svc.store import schema
from tests.support.coordinator import CoordinatorProcess, InProcessCoordinator, Stubs
from tests.support.tls_clients import TlsStubs

from .conftest import ALICE, BOB, QUIET_DEFAULTS, Pki, grant, unique

INVALID_REQUEST = 42
POLICY_VIOLATION = 44
GROUP_ID_NOT_FOUND = 69
UNKNOWN_MEMBER_ID = 25
COMPUTE_ASSIGNMENT = 10001
#: The coordinator's own threads that use the database on their own schedule.
BACKGROUND_THREADS = frozenset(
    {"lease-renewer", "authorizer", "coordinator-timers", "readiness-probe", "readiness"}
)


def acl(
    principal: str, operation: Operation, group_id: str, permission: Permission = Permission.ALLOW
) -> AclEntry:
    return AclEntry(
        principal=principal,
        operation=operation,
        resource_type=ResourceType.GROUP,
        pattern=group_id,
        pattern_type=PatternType.LITERAL,
        permission=permission,
    )


def big_config(size_bytes: int) -> dict[str, str]:
    """A connector config whose keys (shown by DescribeGroups even with values hidden) take
    about `size_bytes`."""
    keys = size_bytes // 100 + 1
    return {f"setting.{i:06d}.{'k' * 80}": "v" for i in range(keys)}


def put_big_group(admin: Any, group_id: str, size_bytes: int = 260_000) -> None:
    answer = admin.PutConnector(
        admin_pb2.PutConnectorRequest(
            group_id=group_id, connector="wide", task_count=1, config=big_config(size_bytes)
        ),
        timeout=30,
    )
    assert answer.error_code == 0, answer.error_message


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident set (VmHWM), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def test_one_large_group_named_10000_times_is_read_once_and_costs_no_memory(
    database_url: str,
) -> None:
    """The finding: one 14 KB request naming a 257 KB group 1,000 times took the coordinator
    from 89 MiB to 1,101 MiB. Now the first entry describes it, every repeat and every id past
    --max-describe-groups is an error entry, and the peak RSS grows by less than 50 MB."""
    coordinator = CoordinatorProcess(database_url).start()
    stubs = Stubs(coordinator.address)
    if True:
        try:
            group_id = unique("wide")
            put_big_group(stubs.admin, group_id)
            once = stubs.admin.DescribeGroups(
                admin_pb2.DescribeGroupsRequest(group_ids=[group_id]), timeout=30
            )
            assert once.groups[0].error_code == 0
            assert once.groups[0].ByteSize() >= 250_000
            assert coordinator.proc is not None
            before = peak_rss_bytes(coordinator.proc.pid)
            answer = stubs.admin.DescribeGroups(
                admin_pb2.DescribeGroupsRequest(group_ids=[group_id] * 10_000), timeout=60
            )
            grown = peak_rss_bytes(coordinator.proc.pid) - before
        finally:
            stubs.close()
            coordinator.close()
    assert len(answer.groups) == 10_000
    assert [g.group_id for g in answer.groups] == [group_id] * 10_000
    assert answer.groups[0].error_code == 0
    assert answer.groups[0].ByteSize() >= 250_000
    codes = [g.error_code for g in answer.groups[1:]]
    assert set(codes[:999]) == {INVALID_REQUEST}, "a repeat within the limit"
    assert set(codes[999:]) == {POLICY_VIOLATION}, "past --max-describe-groups (1,000)"
    assert "--max-describe-groups" in answer.groups[-1].error_message
    assert grown < 50 * 1024 * 1024, f"peak RSS grew by {grown / 2**20:.1f} MiB"


def test_distinct_groups_past_the_message_limit_get_error_entries_unread(
    database_url: str,
) -> None:
    """Six distinct 260 KB groups under a 1 MB message limit: the first three are described,
    the rest answered POLICY_VIOLATION (naming the limit) without being read, so the answer
    stays under the limit instead of failing whole with RESOURCE_EXHAUSTED."""
    limit = 1_000_000
    defaults = dataclasses.replace(QUIET_DEFAULTS, max_message_bytes=limit)
    group_ids = [unique("wide") for _ in range(6)]
    with InProcessCoordinator(database_url, defaults=defaults) as first:
        assert first.stubs is not None
        for group_id in group_ids:
            put_big_group(first.stubs.admin, group_id)
    # A second coordinator (the first released its leases): describing loads each group.
    with InProcessCoordinator(database_url, defaults=defaults) as coordinator:
        assert coordinator.stubs is not None
        loads: list[str] = []
        load = coordinator.store.load_group

        def counting_load(group_id: str) -> Any:
            loads.append(group_id)
            return load(group_id)

        coordinator.store.load_group = counting_load  # type: ignore[method-assign]
        answer = coordinator.stubs.admin.DescribeGroups(
            admin_pb2.DescribeGroupsRequest(group_ids=group_ids), timeout=30
        )
    assert [g.group_id for g in answer.groups] == group_ids
    codes = [g.error_code for g in answer.groups]
    described = codes.count(0)
    assert described == 3, codes
    assert codes == [0] * described + [POLICY_VIOLATION] * (6 - described)
    assert "--max-message-bytes" in answer.groups[-1].error_message
    assert answer.ByteSize() < limit
    # The group that crossed the limit was read; none after it.
    assert loads == group_ids[: described + 1]


def test_unknown_ids_take_no_lease_and_a_constant_number_of_statements(
    database_url: str,
) -> None:
    """The finding: each unknown id took and deleted a lease row (1.8 ms each, one pool thread
    for the whole list). Now 10 and 2,000 unknown ids cost the same statements: one read, no
    lease row."""
    defaults = dataclasses.replace(QUIET_DEFAULTS, max_describe_groups=5_000)
    with InProcessCoordinator(database_url, defaults=defaults) as coordinator:
        assert coordinator.stubs is not None
        engine = coordinator.store._db.engine
        statements: list[str] = []
        leases_written: list[str] = []

        def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if threading.current_thread().name in BACKGROUND_THREADS:
                return  # lease renewal, ACL refresh: not the call's
            statements.append(statement)
            if "group_leases" in statement and not statement.lstrip().upper().startswith("SELECT"):
                leases_written.append(statement)

        def describe(n: int) -> tuple[list[int], int]:
            statements.clear()
            ids = [f"unknown-{uuid.uuid4().hex}" for _ in range(n)]
            answer = coordinator.stubs.admin.DescribeGroups(  # type: ignore[union-attr]
                admin_pb2.DescribeGroupsRequest(group_ids=ids), timeout=60
            )
            assert [g.group_id for g in answer.groups] == ids
            return [g.error_code for g in answer.groups], len(statements)

        sa_event.listen(engine, "before_cursor_execute", count)
        try:
            few_codes, few = describe(10)
            many_codes, many = describe(2_000)
        finally:
            sa_event.remove(engine, "before_cursor_execute", count)
        with engine.connect() as conn:
            leases = conn.execute(
                sa.select(sa.func.count())
                .select_from(schema.group_leases)
                .where(schema.group_leases.c.group_id.like("unknown-%"))
            ).scalar_one()
    assert set(few_codes) == set(many_codes) == {GROUP_ID_NOT_FOUND}
    assert few == many == 1, (few, many)
    assert leases_written == []
    assert leases == 0


@pytest.fixture
def mtls(database_url: str, pki: Pki) -> Iterator[InProcessCoordinator]:
    """mTLS without ACLs (each caller's principal from its certificate), two groups per
    principal at most."""
    defaults = dataclasses.replace(QUIET_DEFAULTS, max_groups_per_principal=2)
    with InProcessCoordinator(
        database_url, defaults=defaults, tls=pki.server_tls(mutual=True)
    ) as coordinator:
        yield coordinator


def stubs_for(coordinator: InProcessCoordinator, pki: Pki, who: Any) -> TlsStubs:
    return TlsStubs(coordinator.address, pki.ca.cert_file, who)


def put(stubs: TlsStubs, group_id: str, connector: str = "c") -> Any:
    return stubs.admin.PutConnector(
        admin_pb2.PutConnectorRequest(group_id=group_id, connector=connector, task_count=1),
        timeout=10,
    )


def test_group_creation_is_limited_per_principal_and_recorded(
    mtls: InProcessCoordinator, pki: Pki, database_url: str
) -> None:
    """The finding: --max-groups was global, so one principal could fill it for everyone. Now
    each group records its creator and --max-groups-per-principal counts by it: alice's third
    group is refused, bob still creates his, and alice may still change her own."""
    alice, bob = stubs_for(mtls, pki, pki.alice), stubs_for(mtls, pki, pki.bob)
    try:
        mine = [unique("alice"), unique("alice")]
        for group_id in mine:
            assert put(alice, group_id).error_code == 0
        refused = put(alice, unique("alice"))
        assert refused.error_code == POLICY_VIOLATION
        assert "--max-groups-per-principal" in refused.error_message
        assert ALICE in refused.error_message
        theirs = unique("bob")
        assert put(bob, theirs).error_code == 0, "another principal's creations are unaffected"
        assert put(alice, mine[0], "another").error_code == 0, "her own groups still change"
    finally:
        alice.close()
        bob.close()
    engine = sa.create_engine(database_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            g = schema.groups.c
            created = dict(
                conn.execute(
                    sa.select(g.group_id, g.created_by).where(g.group_id.in_([*mine, theirs]))
                ).all()
            )
    finally:
        engine.dispose()
    assert created == {mine[0]: ALICE, mine[1]: ALICE, theirs: BOB}


def events_of(database_url: str, group_id: str) -> list[dict[str, Any]]:
    engine = sa.create_engine(database_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            e = schema.events.c
            rows = conn.execute(
                sa.select(e.event_type, e.payload).where(e.group_id == group_id).order_by(e.id)
            ).all()
    finally:
        engine.dispose()
    return [{"type": row.event_type, **row.payload} for row in rows]


def test_admin_changes_are_recorded_with_the_callers_principal_and_address(
    mtls: InProcessCoordinator, pki: Pki, database_url: str
) -> None:
    """The finding: CONNECTOR_PUT, CONNECTOR_DELETED and CONFIG_ALTERED carried only the peer's
    ip:port. Each now names the principal too, and GROUP_CREATED names the creator."""
    alice = stubs_for(mtls, pki, pki.alice)
    group_id = unique("audited")
    try:
        assert put(alice, group_id).error_code == 0
        altered = alice.admin.AlterGroupConfigs(
            admin_pb2.AlterGroupConfigsRequest(
                group_id=group_id, set={"session.timeout.ms": "9000"}
            ),
            timeout=10,
        )
        assert altered.error_code == 0
        deleted = alice.admin.DeleteConnector(
            admin_pb2.DeleteConnectorRequest(group_id=group_id, connector="c"), timeout=10
        )
        assert deleted.error_code == 0
    finally:
        alice.close()
    events = {e["type"]: e for e in events_of(database_url, group_id)}
    assert events[EventType.GROUP_CREATED.value]["principal"] == ALICE
    for kind in (EventType.CONNECTOR_PUT, EventType.CONFIG_ALTERED, EventType.CONNECTOR_DELETED):
        assert events[kind.value]["principal"] == ALICE, kind
        assert str(events[kind.value]["caller"]).startswith("ipv4:127.0.0.1:"), kind


def join(stubs: TlsStubs, group_id: str, member_id: str) -> Any:
    return stubs.coordinator.ConnectGroupHeartbeat(
        coordinator_pb2.ConnectGroupHeartbeatRequest(
            group_id=group_id,
            member_id=member_id,
            member_epoch=0,
            rebalance_timeout_ms=60_000,
            client_assignors=common_pb2.AssignorList(
                assignors=[
                    common_pb2.Assignor(
                        name="incremental_cooperative",
                        minimum_version=1,
                        maximum_version=2,
                        version=2,
                    )
                ]
            ),
        ),
        timeout=10,
    )


def test_a_refused_prepare_names_the_assignor_only_to_a_caller_that_may_describe(
    secured: InProcessCoordinator, pki: Pki
) -> None:
    """The finding: Prepare/Install answers to a non-assignor named the assignor's member id
    even where DESCRIBE was denied. Alice (MEMBER, DESCRIBE denied) is told only that she is
    not the assignor; the admin (who may describe) is told who is."""
    group_id = unique("secret-assignor")
    grant(
        secured,
        acl(BOB, Operation.MEMBER, group_id),
        acl(ALICE, Operation.MEMBER, group_id),
        acl(ALICE, Operation.DESCRIBE, group_id, permission=Permission.DENY),
    )
    bob = stubs_for(secured, pki, pki.bob)
    alice = stubs_for(secured, pki, pki.alice)
    admin = stubs_for(secured, pki, pki.admin)
    assignor = f"bob-{uuid.uuid4().hex[:8]}"
    try:
        first = join(bob, group_id, assignor)
        assert first.error_code in (0, COMPUTE_ASSIGNMENT), first.error_message
        answers = {}
        for name, stubs in (("alice", alice), ("admin", admin)):
            member_id = f"{name}-{uuid.uuid4().hex[:8]}"
            joined = join(stubs, group_id, member_id)
            assert joined.error_code == 0, joined.error_message
            answers[name] = stubs.coordinator.ConnectGroupPrepareAssignment(
                coordinator_pb2.ConnectGroupPrepareAssignmentRequest(
                    group_id=group_id, member_id=member_id, member_epoch=joined.member_epoch
                ),
                timeout=10,
            )
    finally:
        for stubs in (bob, alice, admin):
            stubs.close()
    assert answers["alice"].error_code == UNKNOWN_MEMBER_ID
    assert "not the group's assignor member" in answers["alice"].error_message
    assert assignor not in answers["alice"].error_message
    assert answers["admin"].error_code == UNKNOWN_MEMBER_ID
    assert assignor in answers["admin"].error_message, "the control: DESCRIBE shows it"
