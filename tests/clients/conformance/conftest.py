"""Fixtures of the conformance suite: which clients run (`CONFORMANCE_CLIENTS`, default all
three), each client built or installed once per session (a missing one fails loudly: never a
skip), a factory of clients that kills whatever a test left running, and a coordinator that
requires client certificates and checks ACLs, for the mTLS scenario.

    CONFORMANCE_CLIENTS=python,node pytest tests/clients/conformance   # only these two
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from connect.group.v1 import admin_pb2

from tests.clients.conformance.drivers import (
    CLIENT_KINDS,
    Client,
    GoClient,
    NodeClient,
    PythonClient,
)
from tests.clients.conftest import NodeClient as InstalledNode
from tests.support.certs import CertificateAuthority, Issued
from tests.support.coordinator import REPO, CoordinatorProcess
from tests.support.pgcluster import create_database, drop_database
from tests.support.tls_clients import TlsStubs, subject_principal

GO_BUILD = REPO / "clients" / "go" / "build"
ADMIN_CN = "conformance-admin"


def selected_kinds() -> list[str]:
    """CONFORMANCE_CLIENTS (comma-separated), default every client; an unknown name is an
    error, not a skip."""
    raw = os.environ.get("CONFORMANCE_CLIENTS", "").strip()
    kinds = [k.strip() for k in raw.split(",") if k.strip()] if raw else list(CLIENT_KINDS)
    unknown = sorted(set(kinds) - set(CLIENT_KINDS))
    if unknown or not kinds:
        raise pytest.UsageError(
            f"CONFORMANCE_CLIENTS={raw!r}: choose among {', '.join(CLIENT_KINDS)}"
        )
    return kinds


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every scenario that takes `client_kind` runs once per selected client."""
    if "client_kind" in metafunc.fixturenames:
        metafunc.parametrize("client_kind", selected_kinds())


@pytest.fixture(scope="session")
def kinds() -> list[str]:
    return selected_kinds()


@pytest.fixture(scope="session")
def go_binary() -> Path:
    """`clients/go/build` (plan §2: idempotent, offline; prints the binary's path). Missing or
    failing: the Go client's scenarios fail, loudly."""
    if not GO_BUILD.exists():
        pytest.fail(
            f"{GO_BUILD} is missing: the Go worker cannot be built (set CONFORMANCE_CLIENTS to "
            "leave the Go client out deliberately)",
            pytrace=False,
        )
    done = subprocess.run([str(GO_BUILD)], cwd=REPO, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(
            f"{GO_BUILD} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}",
            pytrace=False,
        )
    lines = done.stdout.strip().splitlines()
    binary = Path(lines[-1].strip()) if lines else Path()
    if not binary.is_absolute():
        binary = REPO / binary
    if not lines or not os.access(binary, os.X_OK):
        pytest.fail(f"{GO_BUILD} printed no executable path: {done.stdout!r}", pytrace=False)
    return binary


MakeClient = Callable[..., Client]


@pytest.fixture
def make_client(
    request: pytest.FixtureRequest, coordinator: CoordinatorProcess, group: str, tmp_path: Path
) -> Iterator[MakeClient]:
    """`make_client(kind, member_id, coordinator=..., fail_file=..., sleep_revoked_s=...)`: a
    client of that kind in this test's group (not started). Teardown kills any still running."""
    made: list[Client] = []

    def make(
        kind: str, member_id: str, *, coordinator_address: str | None = None, **kw: Any
    ) -> Client:
        address = coordinator_address or coordinator.address
        directory = tmp_path / member_id
        client: Client
        if kind == "python":
            client = PythonClient(address, group, member_id, directory, **kw)
        elif kind == "node":
            node: InstalledNode = request.getfixturevalue("node_client")
            client = NodeClient(node.node, address, group, member_id, directory, **kw)
        elif kind == "go":
            binary: Path = request.getfixturevalue("go_binary")
            client = GoClient(binary, address, group, member_id, directory, **kw)
        else:
            raise AssertionError(f"no client {kind!r}")
        made.append(client)
        return client

    try:
        yield make
    finally:
        for client in made:
            client.kill()


# --- mTLS with ACLs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Mtls:
    """A coordinator that requires client certificates and checks ACLs (deny by default), its
    CA, and an admin (a super user) on a TLS channel."""

    coordinator: CoordinatorProcess
    ca: CertificateAuthority
    admin: TlsStubs

    def issue(self, common_name: str) -> Issued:
        return self.ca.issue(common_name, common_name)

    def allow_member(self, common_name: str, group: str) -> None:
        entry = admin_pb2.AclEntry(
            principal=subject_principal(common_name),
            operation="MEMBER",
            resource_type="GROUP",
            pattern_type="LITERAL",
            pattern=group,
            permission="ALLOW",
        )
        added = self.admin.admin.AddAcl(admin_pb2.AddAclRequest(entry=entry), timeout=10)
        assert added.error_code == 0, added


@pytest.fixture(scope="session")
def mtls(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mtls]:
    directory = tmp_path_factory.mktemp("conformance-mtls")
    ca = CertificateAuthority(directory / "ca")
    server = ca.server()
    admin_cert = ca.issue(ADMIN_CN, ADMIN_CN)
    name = f"conf_tls_{uuid.uuid4().hex[:8]}"
    url = create_database(postgres_admin_url, name)
    process = CoordinatorProcess(
        url,
        "--tls-cert",
        str(server.cert),
        "--tls-key",
        str(server.key),
        "--tls-client-ca",
        str(ca.cert_file),
        "--authorization",
        "acl",
        "--super-users",
        subject_principal(ADMIN_CN),
        "--acl-refresh-ms",
        "100",
        log_path=directory / "coordinator.log",
    )
    try:
        process.start(wait=False)
        admin = TlsStubs(process.address, ca.cert_file, admin_cert)
        deadline = time.monotonic() + 30
        while True:
            try:
                admin.admin.ListGroups(admin_pb2.ListGroupsRequest(), timeout=1)
                break
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        try:
            yield Mtls(process, ca, admin)
        finally:
            admin.close()
    finally:
        process.close()
        drop_database(postgres_admin_url, name)
