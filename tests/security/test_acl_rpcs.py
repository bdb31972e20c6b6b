"""ACL administration over gRPC (issue 12: "cluster-wide list and ACL admin"): ListAcls needs
DESCRIBE on the cluster, AddAcl and RemoveAcl need ALTER on it; a super user may do all; an
added entry takes effect at once; with authorization off the RPCs refuse (ACLs are then edited
in the database); `coordinator-svc acl --coordinator` goes through them over mTLS."""

from __future__ import annotations

import os
import subprocess
import sys

from connect.group.v1 import admin_pb2

from coordinator_svc.core.acls import CLUSTER_NAME, AclEntry, Operation, PatternType, ResourceType
from tests.support.coordinator import REPO, InProcessCoordinator

from .conftest import ADMIN, ALICE, BOB, Clients, Pki, clear_acls, grant, unique

CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_REQUEST = 42


def _wire(
    principal: str, operation: str, pattern: str, kind: str = "LITERAL"
) -> admin_pb2.AclEntry:
    return admin_pb2.AclEntry(
        principal=principal,
        operation=operation,
        resource_type="GROUP",
        pattern_type=kind,
        pattern=pattern,
        permission="ALLOW",
    )


def test_only_cluster_alter_may_change_acls_and_a_change_applies_at_once(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    clear_acls(secured)
    group = unique("acl-rpc")
    entry = _wire(ALICE, "ALTER", group)
    refused = clients.bob.admin.AddAcl(admin_pb2.AddAclRequest(entry=entry), timeout=10)
    assert refused.error_code == CLUSTER_AUTHORIZATION_FAILED
    assert secured.store.acls.load()[1] == []

    added = clients.admin.admin.AddAcl(
        admin_pb2.AddAclRequest(entry=entry), timeout=10
    )  # super user
    assert added.error_code == 0 and added.changed
    again = clients.admin.admin.AddAcl(admin_pb2.AddAclRequest(entry=entry), timeout=10)
    assert again.error_code == 0 and not again.changed
    put = clients.alice.admin.PutConnector(
        admin_pb2.PutConnectorRequest(group_id=group, connector="A", task_count=1), timeout=10
    )
    assert put.error_code == 0, put  # applied at once, no refresh interval

    grant(
        secured,
        AclEntry(BOB, Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME),
    )
    removed = clients.bob.admin.RemoveAcl(admin_pb2.RemoveAclRequest(entry=entry), timeout=10)
    assert removed.error_code == 0 and removed.changed
    denied = clients.alice.admin.PutConnector(
        admin_pb2.PutConnectorRequest(group_id=group, connector="B", task_count=1), timeout=10
    )
    assert denied.error_code == 30


def test_listing_needs_cluster_describe(secured: InProcessCoordinator, clients: Clients) -> None:
    clear_acls(secured)
    group = unique("acl-list")
    grant(
        secured, AclEntry(ALICE, Operation.MEMBER, ResourceType.GROUP, group, PatternType.PREFIXED)
    )
    refused = clients.alice.admin.ListAcls(admin_pb2.ListAclsRequest(), timeout=10)
    assert refused.error_code == CLUSTER_AUTHORIZATION_FAILED
    assert not refused.entries
    grant(secured, AclEntry(ALICE, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME))
    listed = clients.alice.admin.ListAcls(admin_pb2.ListAclsRequest(principal=ALICE), timeout=10)
    assert listed.error_code == 0
    assert {(e.operation, e.pattern_type, e.pattern) for e in listed.entries} == {
        ("MEMBER", "PREFIXED", group),
        ("DESCRIBE", "LITERAL", CLUSTER_NAME),
    }


def test_a_malformed_entry_is_invalid_request(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    clear_acls(secured)
    for entry in (
        _wire("bob", "ALTER", "g"),  # not User:...
        _wire(ALICE, "FLY", "g"),
        _wire(ALICE, "ALTER", ""),
        _wire(ALICE, "ALTER", "g\x00"),
    ):
        answer = clients.admin.admin.AddAcl(admin_pb2.AddAclRequest(entry=entry), timeout=10)
        assert answer.error_code == INVALID_REQUEST, (entry, answer)
    assert secured.store.acls.load()[1] == []


def test_with_authorization_off_the_acl_rpcs_refuse(database_url: str) -> None:
    with InProcessCoordinator(database_url) as coordinator:
        assert coordinator.stubs is not None
        added = coordinator.stubs.admin.AddAcl(
            admin_pb2.AddAclRequest(entry=_wire(ALICE, "ALTER", "g")), timeout=10
        )
        assert added.error_code == CLUSTER_AUTHORIZATION_FAILED
        assert "--authorization acl" in added.error_message
        assert coordinator.store.acls.load()[1] == []


def test_the_acl_command_goes_through_the_rpcs_over_mtls(
    secured: InProcessCoordinator, pki: Pki
) -> None:
    clear_acls(secured)
    group = unique("acl-cli")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}"}
    tls = [
        "--coordinator",
        secured.address,
        "--tls-ca",
        str(pki.ca.cert_file),
        "--tls-cert",
        str(pki.admin.cert),
        "--tls-key",
        str(pki.admin.key),
    ]

    def acl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "coordinator_svc.cli", "acl", *args, *tls],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=60,
        )

    added = acl("add", "--principal", BOB, "--operation", "MEMBER", "--group", group)
    assert added.returncode == 0, added.stderr
    assert "added" in added.stdout
    listed = acl("list", "--principal", BOB)
    assert listed.returncode == 0, listed.stderr
    assert f"ALLOW {BOB} MEMBER on GROUP LITERAL {group!r}" in listed.stdout
    removed = acl("remove", "--principal", BOB, "--operation", "MEMBER", "--group", group)
    assert removed.returncode == 0, removed.stderr
    assert secured.store.acls.load()[1] == []
    assert ADMIN  # the command acted as the super user's certificate
