"""What the security tests share: one database per module, one set of certificates per module
(a CA, the server's certificate, and client certificates for an administrator and two
principals), a coordinator per module that requires client certificates and authorizes by ACLs,
and helpers to grant and revoke ACLs and to read the denial metric and events."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from coordinator_svc.core.acls import AclEntry
from coordinator_svc.core.model import GroupConfigDefaults
from coordinator_svc.core.records import EventType
from coordinator_svc.grpc_api.tls import ServerTls
from coordinator_svc.store import schema
from tests.support.certs import CertificateAuthority, Issued
from tests.support.client import Resources, ScriptedWorker, describe, from_cat, parse
from tests.support.coordinator import InProcessCoordinator
from tests.support.pgcluster import create_database, drop_database
from tests.support.tls_clients import TlsStubs, subject_principal

#: Long sessions and rebalance timeouts: no timer changes a group while a test compares dumps.
QUIET_DEFAULTS = GroupConfigDefaults(
    session_timeout_ms=300_000,
    heartbeat_interval_ms=1_000,
    rebalance_timeout_ms=300_000,
    scheduled_rebalance_max_delay_ms=0,
    assignment_error_backoff_ms=100,
    assignment_interval_ms=0,  # a computation at every epoch bump (DESIGN 3.21)
)

ADMIN = subject_principal("admin")
ALICE = subject_principal("alice")
BOB = subject_principal("bob")


@dataclass(frozen=True)
class Pki:
    """A CA, the coordinator's certificate and the clients' (admin is the super user)."""

    ca: CertificateAuthority
    server: Issued
    admin: Issued
    alice: Issued
    bob: Issued

    def server_tls(self, mutual: bool = True) -> ServerTls:
        return ServerTls(
            str(self.server.cert),
            str(self.server.key),
            str(self.ca.cert_file) if mutual else None,
        )


@pytest.fixture(scope="module")
def module_database_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh database for the whole module, dropped afterwards."""
    name = f"t_sec_{uuid.uuid4().hex}"
    url = create_database(postgres_admin_url, name)
    try:
        yield url
    finally:
        drop_database(postgres_admin_url, name)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    ca = CertificateAuthority(tmp_path_factory.mktemp("pki"), "security-ca")
    return Pki(
        ca=ca,
        server=ca.server(),
        admin=ca.issue("admin", "admin"),
        alice=ca.issue("alice", "alice"),
        bob=ca.issue("bob", "bob"),
    )


@pytest.fixture(scope="module")
def secured(module_database_url: str, pki: Pki) -> Iterator[InProcessCoordinator]:
    """A coordinator that requires client certificates (principals from their subjects) and
    authorizes by ACLs, `ADMIN` its super user; denials are written only when a test flushes
    them."""
    with InProcessCoordinator(
        module_database_url,
        defaults=QUIET_DEFAULTS,
        tls=pki.server_tls(mutual=True),
        authorization=True,
        super_users=[ADMIN],
        acl_refresh_s=0.1,
        denial_interval_s=3_600.0,
    ) as coordinator:
        yield coordinator


class Clients:
    """TLS stubs of the module's coordinator, one channel per client certificate."""

    def __init__(self, address: str, pki: Pki) -> None:
        self.admin = TlsStubs(address, pki.ca.cert_file, pki.admin)
        self.alice = TlsStubs(address, pki.ca.cert_file, pki.alice)
        self.bob = TlsStubs(address, pki.ca.cert_file, pki.bob)

    def close(self) -> None:
        for stubs in (self.admin, self.alice, self.bob):
            stubs.close()


@pytest.fixture(scope="module")
def clients(secured: InProcessCoordinator, pki: Pki) -> Iterator[Clients]:
    out = Clients(secured.address, pki)
    try:
        yield out
    finally:
        out.close()


# --- ACLs, metrics, events ----------------------------------------------------------------------


def grant(coordinator: InProcessCoordinator, *entries: AclEntry) -> None:
    """Add `entries` to the coordinator's database and make it re-read them now."""
    for entry in entries:
        coordinator.store.acls.add(entry)
    coordinator.authorizer.refresh()


def revoke(coordinator: InProcessCoordinator, *entries: AclEntry) -> None:
    for entry in entries:
        assert coordinator.store.acls.remove(entry) == 1, entry
    coordinator.authorizer.refresh()


def clear_acls(coordinator: InProcessCoordinator) -> None:
    """Remove every ACL entry (tests share the module's coordinator and database)."""
    _, entries = coordinator.store.acls.load()
    for entry in entries:
        coordinator.store.acls.remove(entry)
    coordinator.authorizer.refresh()


def denial_count(coordinator: InProcessCoordinator, rpc: str, operation: str) -> float:
    """`coordinator_authorization_denials{rpc, operation}` as the coordinator counts it now."""
    value = coordinator.manager.metrics.registry.get_sample_value(
        "coordinator_authorization_denials_total", {"rpc": rpc, "operation": operation}
    )
    return value or 0.0


def denial_events(database_url: str, group_ids: set[str] | None = None) -> list[dict[str, Any]]:
    """The AUTHORIZATION_DENIED rows of the events table (of `group_ids` if given), in order."""
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(schema.events)
                .where(schema.events.c.event_type == EventType.AUTHORIZATION_DENIED.value)
                .order_by(schema.events.c.id)
            ).mappings()
            out = [dict(row) for row in rows]
    finally:
        engine.dispose()
    if group_ids is not None:
        out = [row for row in out if row["group_id"] in group_ids]
    return out


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` as a Kubernetes Secret volume does: a new file, renamed over the old."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}")
    tmp.write_bytes(data)
    tmp.replace(path)


# --- groups played by scripted workers ----------------------------------------------------------

COMPUTE_ASSIGNMENT = 10001


def spread(prepared: Any) -> dict[str, Resources]:
    """Every catalogue resource of a PrepareAssignment answer, dealt round-robin over its
    members (sorted), connectors and tasks alike."""
    member_ids = sorted(m.member_id for m in prepared.members)
    resources = sorted(
        [spec.name for spec in prepared.catalogue]
        + [f"{spec.name}-{t}" for spec in prepared.catalogue for t in range(spec.task_count)]
    )
    dealt: dict[str, list[str]] = {m: [] for m in member_ids}
    for i, resource in enumerate(resources):
        dealt[member_ids[i % len(member_ids)]].append(resource)
    return {m: parse(*items) for m, items in dealt.items()}


def settle(
    workers: Sequence[ScriptedWorker], admin: TlsStubs, group_id: str, rounds: int = 25
) -> Any:
    """Heartbeat the workers (the one asked computes and installs `spread`) until the group is
    STABLE: every member at the assignment epoch, which is the group epoch, nothing pending,
    every worker running exactly its current assignment. Returns DescribeGroups' answer."""
    group: Any = None
    for _ in range(rounds):
        for worker in workers:
            answer = worker.heartbeat()
            assert answer.error_code in (0, COMPUTE_ASSIGNMENT), answer
            if answer.error_code == COMPUTE_ASSIGNMENT:
                prepared = worker.prepare()
                assert prepared.error_code == 0, prepared
                installed = worker.install(prepared.group_epoch, spread(prepared))
                assert installed.error_code == 0, installed
        group = describe(admin, group_id)
        if _stable(group, workers):
            return group
    raise AssertionError(f"group {group_id} did not settle: {group}")


def _stable(group: Any, workers: Sequence[ScriptedWorker]) -> bool:
    if group.error_code != 0 or group.state != "STABLE":
        return False
    if group.group_epoch != group.assignment_epoch:
        return False
    members = {m.member_id: m for m in group.members}
    if set(members) != {w.member_id for w in workers}:
        return False
    for worker in workers:
        m = members[worker.member_id]
        if m.member_epoch != group.assignment_epoch or m.state != "STABLE":
            return False
        if m.pending_revocation.connectors or m.pending_revocation.tasks:
            return False
        if from_cat(m.current_assignment) != from_cat(m.target_assignment):
            return False
        if worker.owned != from_cat(m.current_assignment) or worker.epoch != m.member_epoch:
            return False
    return True
