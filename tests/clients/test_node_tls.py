"""The Node.js client over mTLS (issue 12): without a client certificate it gets nowhere on a
coordinator that requires one. (Joining with a certificate, a principal's ACLs and the plaintext
rule are conformance scenarios, run against every client: tests/clients/conformance.)"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from connect.group.v1 import admin_pb2, admin_pb2_grpc

from tests.clients.conftest import NodeClient
from tests.clients.workers import NodeWorker
from tests.support.certs import CertificateAuthority, Issued
from tests.support.coordinator import CoordinatorProcess
from tests.support.pgcluster import create_database, drop_database


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority(tmp_path_factory.mktemp("node-tls"))


@pytest.fixture(scope="module")
def admin_cert(ca: CertificateAuthority) -> Issued:
    return ca.issue("admin", "admin")


@pytest.fixture(scope="module")
def mtls_coordinator(
    postgres_admin_url: str, ca: CertificateAuthority, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    name = f"node_tls_{uuid.uuid4().hex[:8]}"
    url = create_database(postgres_admin_url, name)
    server = ca.server()
    log = tmp_path_factory.mktemp("node-tls-log") / "coordinator.log"
    proc = CoordinatorProcess(
        url,
        "--tls-cert",
        str(server.cert),
        "--tls-key",
        str(server.key),
        "--tls-client-ca",
        str(ca.cert_file),
        log_path=log,
    )
    try:
        proc.start(wait=False)
        yield proc
    finally:
        proc.close()
        drop_database(postgres_admin_url, name)


def _admin(
    address: str, ca: CertificateAuthority, cert: Issued
) -> admin_pb2_grpc.ConnectGroupAdminStub:
    creds = grpc.ssl_channel_credentials(
        ca.cert_file.read_bytes(), cert.key.read_bytes(), cert.cert.read_bytes()
    )
    return admin_pb2_grpc.ConnectGroupAdminStub(grpc.secure_channel(address, creds))


def _wait_serving(address: str, ca: CertificateAuthority, cert: Issued) -> None:
    admin = _admin(address, ca, cert)
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.ListGroups(admin_pb2.ListGroupsRequest(), timeout=1)
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_node_client_without_a_certificate_gets_nowhere(
    node_client: NodeClient,
    mtls_coordinator: CoordinatorProcess,
    ca: CertificateAuthority,
    admin_cert: Issued,
    tmp_path: Path,
) -> None:
    _wait_serving(mtls_coordinator.address, ca, admin_cert)
    group = f"node-tls-{uuid.uuid4().hex[:6]}"
    worker = NodeWorker(node_client.node, mtls_coordinator.address, group, "node-2", tmp_path)
    worker.start("--tls-ca", str(ca.cert_file))
    try:
        time.sleep(3)
        described = _admin(mtls_coordinator.address, ca, admin_cert).DescribeGroups(
            admin_pb2.DescribeGroupsRequest(group_ids=[group]), timeout=5
        )
        assert described.groups[0].error_code != 0  # the group was never created
        assert not worker.events("start")
    finally:
        worker.kill()
