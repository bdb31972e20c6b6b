"""ACLs that mean what they show, and an audit trail of their changes that names the caller
(issue 23, items 4 and 8), on PostgreSQL with a real mTLS coordinator:

- an ACL row edited in place (`UPDATE acls SET ...`, neither through the RPCs nor the command)
  is enforced within the refresh interval, and recorded exactly once as ACL_CHANGED (principal
  `database`, the row's old version removed and its new one added) however many coordinators
  notice it;
- AddAcl / RemoveAcl write ACL_ADDED / ACL_REMOVED naming the certificate's principal and the
  peer address; `coordinator-svc acl --database-url` names `local:<os user>`; neither is
  reported again as a direct change;
- ListAcls pages (page_size, page_token, next_page_token) and `coordinator-svc acl list
  --coordinator` follows the pages."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from connect.group.v1 import admin_pb2

from coordinator_svc.core.acls import (
    CLUSTER_NAME,
    AclEntry,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from coordinator_svc.core.records import EventType
from coordinator_svc.metrics import Metrics
from coordinator_svc.runtime.authorizer import Authorizer
from coordinator_svc.store import SqlStore, schema
from tests.support.coordinator import REPO, InProcessCoordinator

from .conftest import ADMIN, ALICE, BOB, Clients, Pki, clear_acls, grant, unique

GROUP_AUTHORIZATION_FAILED = 30
INVALID_REQUEST = 42
ACL_EVENTS = (EventType.ACL_ADDED, EventType.ACL_REMOVED, EventType.ACL_CHANGED)


@pytest.fixture(autouse=True)
def no_acls_left(secured: InProcessCoordinator) -> None:
    clear_acls(secured)


def last_event_id(database_url: str) -> int:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.max(schema.events.c.id))).scalar() or 0)
    finally:
        engine.dispose()


def acl_events(database_url: str, after_id: int) -> list[dict[str, Any]]:
    """The ACL_* events written after event `after_id`, in order."""
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(schema.events)
                .where(
                    schema.events.c.id > after_id,
                    schema.events.c.event_type.in_([t.value for t in ACL_EVENTS]),
                )
                .order_by(schema.events.c.id)
            ).mappings()
            return [dict(row) for row in rows]
    finally:
        engine.dispose()


def execute(database_url: str, sql: str, **params: Any) -> int:
    """`sql` in its own transaction, as an operator at a psql prompt would; rows changed."""
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as conn:
            return int(conn.execute(sa.text(sql), params).rowcount)
    finally:
        engine.dispose()


def find(clients_of: Any, group: str) -> int:
    answer = clients_of.admin.FindCoordinator(
        admin_pb2.FindCoordinatorRequest(group_id=group), timeout=5
    )
    return int(answer.error_code)


def poll(what: str, check: Callable[[], bool], deadline_s: float) -> None:
    """Until `check()` holds; fails after `deadline_s` (many times the refresh interval)."""
    end = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {deadline_s} s")
        time.sleep(0.02)


# --- item 4: an edit in place is enforced --------------------------------------------------------


def test_an_acl_row_updated_in_place_is_enforced_after_the_refresh_interval(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    """The module's coordinator re-reads every 0.1 s; nothing here asks it to refresh."""
    group = unique("in-place")
    grant(secured, AclEntry(ALICE, Operation.DESCRIBE, ResourceType.GROUP, group))
    assert find(clients.alice, group) == 0
    assert find(clients.bob, group) == GROUP_AUTHORIZATION_FAILED

    # The ALLOW row now names bob: same id, same count of rows.
    changed = execute(
        secured.database_url,
        "UPDATE acls SET principal = :bob WHERE principal = :alice AND pattern = :group",
        bob=BOB,
        alice=ALICE,
        group=group,
    )
    assert changed == 1
    poll("bob allowed", lambda: find(clients.bob, group) == 0, 5.0)
    assert find(clients.alice, group) == GROUP_AUTHORIZATION_FAILED

    # The permission of the same row turned to DENY: bob refused again.
    execute(
        secured.database_url,
        "UPDATE acls SET permission = 'DENY' WHERE pattern = :group",
        group=group,
    )
    poll("bob refused", lambda: find(clients.bob, group) == GROUP_AUTHORIZATION_FAILED, 5.0)
    listed = clients.admin.admin.ListAcls(admin_pb2.ListAclsRequest(principal=BOB), timeout=5)
    assert [(e.permission, e.pattern) for e in listed.entries] == [("DENY", group)]


# --- item 8: who changed the ACLs --------------------------------------------------------------


def test_add_and_remove_over_grpc_record_the_principal_and_address(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    since = last_event_id(secured.database_url)
    group = unique("audited")
    wire = admin_pb2.AclEntry(
        principal=ALICE, operation="ALTER", resource_type="GROUP", pattern=group
    )
    added = clients.admin.admin.AddAcl(admin_pb2.AddAclRequest(entry=wire), timeout=10)
    assert added.error_code == 0 and added.changed
    again = clients.admin.admin.AddAcl(admin_pb2.AddAclRequest(entry=wire), timeout=10)
    assert again.error_code == 0 and not again.changed  # no change, no event
    removed = clients.admin.admin.RemoveAcl(admin_pb2.RemoveAclRequest(entry=wire), timeout=10)
    assert removed.error_code == 0 and removed.changed
    refused = clients.bob.admin.AddAcl(admin_pb2.AddAclRequest(entry=wire), timeout=10)
    assert refused.error_code != 0
    secured.authorizer.refresh()  # a direct change would be recorded now: there is none

    rows = acl_events(secured.database_url, since)
    assert [r["event_type"] for r in rows] == ["ACL_ADDED", "ACL_REMOVED"], rows
    for row in rows:
        payload = row["payload"]
        assert row["group_id"] == "" and row["group_epoch"] == -1 and row["member_id"] is None
        assert payload["principal"] == ADMIN
        assert payload["address"].startswith(("ipv4:127.0.0.1:", "ipv6:")), payload
        assert payload["entry"]["principal"] == ALICE
        assert payload["entry"]["pattern"] == group
        assert payload["entry"]["operation"] == "ALTER"
    assert rows[0]["payload"]["via"] == "AddAcl" and rows[1]["payload"]["via"] == "RemoveAcl"
    assert rows[0]["payload"]["entry"]["id"] == rows[1]["payload"]["entry"]["id"]


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


def test_the_command_against_the_database_records_the_local_user(
    secured: InProcessCoordinator,
) -> None:
    since = last_event_id(secured.database_url)
    group = unique("cli-audit")
    entry = ["--principal", BOB, "--operation", "DESCRIBE", "--group", group]
    url = ["--database-url", secured.database_url]
    assert acl_cli("add", *url, *entry).returncode == 0
    assert acl_cli("remove", *url, *entry).returncode == 0
    secured.authorizer.refresh()

    rows = acl_events(secured.database_url, since)
    assert [r["event_type"] for r in rows] == ["ACL_ADDED", "ACL_REMOVED"], rows
    for row in rows:
        assert row["payload"]["principal"] == f"local:{getpass.getuser()}"
        assert row["payload"]["via"] == "cli" and row["payload"]["address"]
        assert row["payload"]["entry"]["pattern"] == group


def test_an_edit_in_place_is_recorded_once_as_acl_changed_by_the_database(
    secured: InProcessCoordinator,
) -> None:
    """Two more Authorizers on the same database (as two more coordinators would have), both
    refreshing at once, besides the module's coordinator, which refreshes every 0.1 s."""
    group = unique("changed")
    grant(secured, AclEntry(ALICE, Operation.MEMBER, ResourceType.GROUP, group))
    since = last_event_id(secured.database_url)
    stores = [
        SqlStore(secured.database_url, owner_id=f"acl-audit-{i}", advertised_address="-")
        for i in range(2)
    ]
    try:
        authorizers = [Authorizer(s.acls, Metrics(), enabled=True) for s in stores]
        for a in authorizers:
            a.refresh()
        execute(
            secured.database_url,
            "UPDATE acls SET operation = 'ALL', principal = :bob WHERE pattern = :group",
            bob=BOB,
            group=group,
        )
        barrier = threading.Barrier(len(authorizers))
        errors: list[BaseException] = []

        def refresh(authorizer: Authorizer) -> None:
            try:
                barrier.wait(timeout=10)
                authorizer.refresh()
            except BaseException as error:  # reported below
                errors.append(error)

        threads = [threading.Thread(target=refresh, args=(a,)) for a in authorizers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert errors == []
        for a in authorizers:
            assert a.allowed(BOB, Operation.ALTER, ResourceType.GROUP, group)
            assert not a.allowed(ALICE, Operation.MEMBER, ResourceType.GROUP, group)
        time.sleep(0.3)  # the module's coordinator has refreshed (and found nothing) meanwhile
        secured.authorizer.refresh()
    finally:
        for s in stores:
            s.close()

    rows = acl_events(secured.database_url, since)
    assert [r["event_type"] for r in rows] == ["ACL_CHANGED"], rows
    payload = rows[0]["payload"]
    assert payload["principal"] == "database" and rows[0]["group_id"] == ""
    [removed], [added] = payload["removed"], payload["added"]
    assert removed["id"] == added["id"]
    assert (removed["principal"], removed["operation"]) == (ALICE, "MEMBER")
    assert (added["principal"], added["operation"]) == (BOB, "ALL")
    assert added["pattern"] == removed["pattern"] == group

    # A later add through the command is its own ACL_ADDED, the edit not reported again.
    since = last_event_id(secured.database_url)
    grant(secured, AclEntry(ALICE, Operation.DESCRIBE, ResourceType.GROUP, group))
    assert [r["event_type"] for r in acl_events(secured.database_url, since)] == ["ACL_ADDED"]


def test_a_direct_insert_and_delete_are_recorded_and_an_empty_update_is_not(
    secured: InProcessCoordinator,
) -> None:
    group = unique("direct")
    since = last_event_id(secured.database_url)
    execute(
        secured.database_url,
        "INSERT INTO acls (principal, operation, resource_type, pattern_type, pattern, "
        "permission, created_at) VALUES (:p, 'DESCRIBE', 'GROUP', 'LITERAL', :g, 'ALLOW', now())",
        p=ALICE,
        g=group,
    )
    poll(
        "the insert recorded",
        lambda: len(acl_events(secured.database_url, since)) == 1,
        5.0,
    )
    assert execute(secured.database_url, "UPDATE acls SET pattern = 'x' WHERE false") == 0
    execute(secured.database_url, "DELETE FROM acls WHERE pattern = :g", g=group)
    poll(
        "the delete recorded",
        lambda: len(acl_events(secured.database_url, since)) == 2,
        5.0,
    )
    secured.authorizer.refresh()
    rows = acl_events(secured.database_url, since)
    assert [r["event_type"] for r in rows] == ["ACL_CHANGED", "ACL_CHANGED"], rows
    assert [len(r["payload"]["added"]) for r in rows] == [1, 0]
    assert [len(r["payload"]["removed"]) for r in rows] == [0, 1]


# --- item 1: ListAcls pages ----------------------------------------------------------------------


def _bulk_insert(database_url: str, principal: str, patterns: list[str]) -> None:
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.insert(schema.acls),
                [
                    {
                        "principal": principal,
                        "operation": "DESCRIBE",
                        "resource_type": "GROUP",
                        "pattern_type": "LITERAL",
                        "pattern": p,
                        "permission": "ALLOW",
                        "created_at": datetime.now(UTC),
                    }
                    for p in patterns
                ],
            )
    finally:
        engine.dispose()


def test_list_acls_pages(secured: InProcessCoordinator, clients: Clients) -> None:
    prefix = unique("page")
    patterns = [f"{prefix}-{i:02d}" for i in range(5)]
    _bulk_insert(secured.database_url, ALICE, patterns)
    grant(secured, AclEntry(BOB, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME))

    seen: list[str] = []
    token, pages = "", 0
    while True:
        answer = clients.admin.admin.ListAcls(
            admin_pb2.ListAclsRequest(principal=ALICE, page_size=2, page_token=token), timeout=5
        )
        assert answer.error_code == 0, answer
        assert len(answer.entries) <= 2
        seen += [e.pattern for e in answer.entries]
        pages += 1
        token = answer.next_page_token
        if not token:
            break
    assert seen == patterns and pages == 3
    everything = clients.bob.admin.ListAcls(admin_pb2.ListAclsRequest(), timeout=5)
    assert len(everything.entries) == 6 and not everything.next_page_token

    for bad in ("x", "-1", "1" * 20, "\x00"):
        answer = clients.admin.admin.ListAcls(admin_pb2.ListAclsRequest(page_token=bad), timeout=5)
        assert answer.error_code == INVALID_REQUEST, (bad, answer)
        assert not answer.entries
    negative = clients.admin.admin.ListAcls(admin_pb2.ListAclsRequest(page_size=-1), timeout=5)
    assert negative.error_code == INVALID_REQUEST


def test_the_list_command_follows_the_pages_over_grpc(
    secured: InProcessCoordinator, pki: Pki
) -> None:
    """More entries than one default page (1000)."""
    prefix = unique("many")
    patterns = [f"{prefix}-{i:04d}" for i in range(1_005)]
    _bulk_insert(secured.database_url, ALICE, patterns)
    listed = acl_cli(
        "list",
        "--principal",
        ALICE,
        "--coordinator",
        secured.address,
        "--tls-ca",
        str(pki.ca.cert_file),
        "--tls-cert",
        str(pki.admin.cert),
        "--tls-key",
        str(pki.admin.key),
    )
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 1_005
    assert lines[0].endswith(f"{patterns[0]!r}") and lines[-1].endswith(f"{patterns[-1]!r}")
    assert PatternType.LITERAL.value in lines[0] and Permission.ALLOW.value in lines[0]
    # One statement (recorded as one ACL_CHANGED), not 1,005 removals.
    execute(secured.database_url, "DELETE FROM acls WHERE pattern LIKE :p", p=f"{prefix}-%")
