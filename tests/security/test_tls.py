"""Transport security on real TLS connections with generated certificates (issue 12): an mTLS
coordinator refuses clients without a certificate, with one from another CA, or with an expired
one, and names a correct client by its certificate; principals from each certificate field and
through mapping rules, and UNAUTHENTICATED for a certificate the rules cannot map; a rotated
server certificate is used by new connections without a restart while open ones go on; TLS
without a client CA serves clients without certificates (all ANONYMOUS); `serve`, the operator
commands and `worker-agent` refuse plaintext off loopback unless allowed, and the commands and a
real agent work over mTLS."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from connect.group.v1 import admin_pb2, coordinator_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator_svc.core.acls import AclEntry, Operation, ResourceType
from coordinator_svc.core.principals import (
    PrincipalMapper,
    PrincipalSource,
    parse_mapping_rules,
)
from coordinator_svc.grpc_api.tls import ServerTls
from coordinator_svc.store import SqlStore
from tests.support.agents import AgentProcess, intervals, running_now, wait_for
from tests.support.certs import CertificateAuthority, Issued
from tests.support.client import describe, from_cat, names
from tests.support.coordinator import REPO, CoordinatorProcess, InProcessCoordinator, free_port
from tests.support.tcp_proxy import TcpProxy
from tests.support.tls_clients import (
    TlsStubs,
    presented_serial,
    refusal,
    serial_of,
    subject_principal,
    wait_tls_serving,
)

from .conftest import (
    ALICE,
    BOB,
    QUIET_DEFAULTS,
    Clients,
    Pki,
    grant,
    unique,
    write_atomically,
)

GROUP_AUTHORIZATION_FAILED = 30
GROUP_ID_NOT_FOUND = 69
#: An address of TEST-NET-1 (RFC 5737): not loopback, and nothing answers there.
REMOTE = "192.0.2.1:9093"
ENV = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}"}


@pytest.fixture(scope="module")
def rogue(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    """Another CA, whose certificates the coordinator must not accept."""
    return CertificateAuthority(tmp_path_factory.mktemp("rogue-ca"), "rogue-ca")


def describe_as(stubs: TlsStubs, group_id: str) -> admin_pb2.DescribedGroup:
    group: admin_pb2.DescribedGroup = describe(stubs, group_id)
    return group


def run_cli(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coordinator_svc.cli", *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def tls_flags(pki: Pki, client: Issued | None) -> list[str]:
    flags = ["--tls-ca", str(pki.ca.cert_file)]
    if client is not None:
        flags += ["--tls-cert", str(client.cert), "--tls-key", str(client.key)]
    return flags


# --- who may connect ----------------------------------------------------------------------------


@pytest.mark.parametrize("client", ["no certificate", "another CA", "expired"])
def test_an_mtls_server_refuses_a_client_it_cannot_verify(
    secured: InProcessCoordinator,
    clients: Clients,
    pki: Pki,
    rogue: CertificateAuthority,
    client: str,
) -> None:
    """Each refused certificate names the super user: were it accepted, it could do anything."""
    group = unique("refused")
    presented = {
        "no certificate": None,
        "another CA": rogue.issue("rogue-admin", "admin"),
        "expired": pki.ca.issue("expired-admin", "admin", expired=True),
    }[client]
    with TlsStubs(secured.address, pki.ca.cert_file, presented) as stubs:
        with pytest.raises(grpc.RpcError) as refused:
            stubs.admin.PutConnector(
                admin_pb2.PutConnectorRequest(group_id=group, connector="c", task_count=1),
                timeout=5,
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
        with pytest.raises(grpc.RpcError):
            stubs.check(timeout_s=5)
    # The server is up and the group was never created: the call did not get through.
    assert describe_as(clients.admin, group).error_code == GROUP_ID_NOT_FOUND
    assert refusal(secured.address, pki.ca.cert_file, pki.admin) is None


def test_a_plaintext_client_gets_nothing_from_a_tls_server(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    channel = grpc.insecure_channel(secured.address)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        channel.close()
    assert clients.admin.check() == health_pb2.HealthCheckResponse.SERVING


def test_the_server_knows_a_client_by_its_certificates_subject(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    group = unique("whoami")
    answer = describe_as(clients.alice, group)
    assert answer.error_code == GROUP_AUTHORIZATION_FAILED
    assert f"{ALICE} is not allowed DESCRIBE" in answer.error_message
    assert ALICE == "User:CN=alice,O=connect-tests"
    # An ACL for exactly that principal lets alice (and nobody else) describe the group.
    grant(secured, AclEntry(ALICE, Operation.DESCRIBE, ResourceType.GROUP, group))
    assert describe_as(clients.alice, group).error_code == GROUP_ID_NOT_FOUND
    answer = describe_as(clients.bob, group)
    assert answer.error_code == GROUP_AUTHORIZATION_FAILED
    assert f"{BOB} is not allowed" in answer.error_message
    # The super user needs no ACL.
    assert describe_as(clients.admin, group).error_code == GROUP_ID_NOT_FOUND


@pytest.fixture(scope="module")
def field_certificates(pki: Pki) -> Issued:
    return pki.ca.issue(
        "fields",
        "Worker-7",
        uris=("spiffe://connect.example/ns/prod/sa/worker-7", "https://other.example/w7"),
        dns_names=("worker-7.prod.connect.example", "alt.connect.example"),
    )


@pytest.mark.parametrize(
    ("source", "rules", "expected"),
    [
        (PrincipalSource.SUBJECT, "DEFAULT", "User:CN=Worker-7,O=connect-tests"),
        (PrincipalSource.SUBJECT, "RULE:^CN=([^,]+),O=connect-tests$/$1/L", "User:worker-7"),
        (PrincipalSource.CN, "DEFAULT", "User:Worker-7"),
        (
            PrincipalSource.SAN_URI,
            "DEFAULT",
            "User:spiffe://connect.example/ns/prod/sa/worker-7",
        ),
        (
            PrincipalSource.SAN_URI,
            "RULE:^spiffe:\\/\\/connect\\.example\\/ns\\/([^\\/]+)\\/sa\\/(.+)$/$2@$1/",
            "User:worker-7@prod",
        ),
        (PrincipalSource.SAN_DNS, "DEFAULT", "User:worker-7.prod.connect.example"),
    ],
)
def test_the_principal_comes_from_the_chosen_field_through_the_rules(
    module_database_url: str,
    pki: Pki,
    field_certificates: Issued,
    source: PrincipalSource,
    rules: str,
    expected: str,
) -> None:
    mapper = PrincipalMapper(source, parse_mapping_rules(rules))
    with (
        InProcessCoordinator(
            module_database_url,
            defaults=QUIET_DEFAULTS,
            tls=pki.server_tls(),
            principal_mapper=mapper,
            authorization=True,
        ) as coordinator,
        TlsStubs(coordinator.address, pki.ca.cert_file, field_certificates) as stubs,
    ):
        answer = describe_as(stubs, unique("field"))
    assert answer.error_code == GROUP_AUTHORIZATION_FAILED
    assert answer.error_message.startswith(f"{expected} is not allowed"), answer.error_message


def test_a_certificate_the_rules_cannot_map_is_unauthenticated(
    module_database_url: str, pki: Pki
) -> None:
    rules = parse_mapping_rules("RULE:^CN=(worker-[0-9]+),O=connect-tests$/$1/")
    intruder = pki.ca.issue("intruder", "intruder")
    worker = pki.ca.issue("worker-3", "worker-3")
    group = unique("unmapped")
    with InProcessCoordinator(
        module_database_url,
        defaults=QUIET_DEFAULTS,
        tls=pki.server_tls(),
        principal_mapper=PrincipalMapper(PrincipalSource.SUBJECT, rules),
        authorization=True,
    ) as coordinator:
        registry = coordinator.manager.metrics.registry
        with TlsStubs(coordinator.address, pki.ca.cert_file, intruder) as stubs:
            for call in (
                lambda: describe_as(stubs, group),
                lambda: stubs.find_coordinator(group),
                lambda: stubs.admin.ListGroups(admin_pb2.ListGroupsRequest(), timeout=5),
            ):
                with pytest.raises(grpc.RpcError) as refused:
                    call()
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert registry.get_sample_value("coordinator_unauthenticated_requests_total") == 3
        with TlsStubs(coordinator.address, pki.ca.cert_file, worker) as stubs:
            answer = describe_as(stubs, group)
        assert answer.error_code == GROUP_AUTHORIZATION_FAILED
        assert answer.error_message.startswith("User:worker-3 is not allowed")
        # A SAN URI source and a certificate without one: no principal either.
        with InProcessCoordinator(
            module_database_url,
            tls=pki.server_tls(),
            principal_mapper=PrincipalMapper(PrincipalSource.SAN_URI),
        ) as by_uri:
            with (
                TlsStubs(by_uri.address, pki.ca.cert_file, worker) as stubs,
                pytest.raises(grpc.RpcError) as refused,
            ):
                describe_as(stubs, group)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


# --- rotation -----------------------------------------------------------------------------------


@pytest.fixture
def rotating(
    module_database_url: str, pki: Pki, tmp_path: Path
) -> Iterator[tuple[InProcessCoordinator, Path, Path]]:
    """An mTLS coordinator whose certificate and key are files the test rewrites."""
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    write_atomically(cert, pki.server.cert.read_bytes())
    write_atomically(key, pki.server.key.read_bytes())
    with InProcessCoordinator(
        module_database_url,
        defaults=QUIET_DEFAULTS,
        tls=ServerTls(str(cert), str(key), str(pki.ca.cert_file)),
    ) as coordinator:
        yield coordinator, cert, key


def test_a_rotated_server_certificate_from_a_new_ca_is_used_without_a_restart(
    rotating: tuple[InProcessCoordinator, Path, Path], pki: Pki, tmp_path: Path
) -> None:
    coordinator, cert, key = rotating
    address, old_ca = coordinator.address, pki.ca.cert_file
    new_ca = CertificateAuthority(tmp_path / "new-ca", "new-ca")
    new_server = new_ca.server()
    assert refusal(address, old_ca, pki.alice) is None
    assert refusal(address, new_ca.cert_file, pki.alice) is not None
    opened_before = TlsStubs(address, old_ca, pki.alice)
    try:
        assert opened_before.check() == health_pb2.HealthCheckResponse.SERVING

        # A file caught half written, then a pair that does not match (the certificate, not
        # yet its key): the previous pair stays in use.
        write_atomically(cert, b"-----BEGIN CERTIFICATE-----\nMIIB")
        assert refusal(address, old_ca, pki.alice) is None
        write_atomically(cert, new_server.cert.read_bytes())
        assert refusal(address, old_ca, pki.alice) is None
        write_atomically(key, new_server.key.read_bytes())

        # New connections get the new certificate: only clients trusting the new CA connect.
        assert refusal(address, new_ca.cert_file, pki.alice) is None
        refused = refusal(address, old_ca, pki.alice)
        assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE
        assert presented_serial(address, new_ca.cert_file, pki.alice) == serial_of(new_server.cert)
        with pytest.raises(ssl.SSLError):
            presented_serial(address, old_ca, pki.alice)
        # The connection opened before the rotation goes on.
        assert opened_before.check() == health_pb2.HealthCheckResponse.SERVING
        assert opened_before.find_coordinator(unique("after-rotation")).error_code == 0
    finally:
        opened_before.close()


def test_a_reissued_certificate_from_the_same_ca_is_presented_to_new_connections(
    rotating: tuple[InProcessCoordinator, Path, Path], pki: Pki
) -> None:
    coordinator, cert, key = rotating
    first = presented_serial(coordinator.address, pki.ca.cert_file, pki.alice)
    assert first == serial_of(pki.server.cert)
    reissued = pki.ca.server("server-reissued")
    assert serial_of(reissued.cert) != first
    write_atomically(cert, reissued.cert.read_bytes())
    write_atomically(key, reissued.key.read_bytes())
    assert presented_serial(coordinator.address, pki.ca.cert_file, pki.alice) == serial_of(
        reissued.cert
    )
    assert refusal(coordinator.address, pki.ca.cert_file, pki.alice) is None


def test_a_rotation_to_a_mismatched_pair_is_a_failed_reload_and_the_old_pair_serves(
    rotating: tuple[InProcessCoordinator, Path, Path], pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    coordinator, cert, _key = rotating
    registry = coordinator.manager.metrics.registry
    reissued = pki.ca.server("server-without-its-key")
    write_atomically(cert, reissued.cert.read_bytes())  # the key file keeps the old key
    for _ in range(3):  # three handshakes: the one version of the files fails once
        assert presented_serial(coordinator.address, pki.ca.cert_file, pki.alice) == serial_of(
            pki.server.cert
        )
        assert refusal(coordinator.address, pki.ca.cert_file, pki.alice) is None
    assert registry.get_sample_value("coordinator_tls_reloads_total") == 0
    assert registry.get_sample_value("coordinator_tls_reload_failures_total") == 1
    events = [getattr(r, "fields", {}).get("event") for r in caplog.records]
    assert events.count("tls_reload_failed") == 1 and "tls_reloaded" not in events
    failed = next(r for r in caplog.records if "tls_reload_failed" in str(getattr(r, "fields", "")))
    assert "is not the key of the certificate" in failed.fields["reason"]  # type: ignore[attr-defined]


# --- TLS without client certificates ------------------------------------------------------------


def test_tls_without_a_client_ca_serves_clients_without_certificates_as_anonymous(
    module_database_url: str, pki: Pki
) -> None:
    group = unique("tls-only")
    with InProcessCoordinator(
        module_database_url,
        defaults=QUIET_DEFAULTS,
        tls=pki.server_tls(mutual=False),
        authorization=True,
    ) as coordinator:
        with TlsStubs(coordinator.address, pki.ca.cert_file) as plain_tls:
            assert plain_tls.check() == health_pb2.HealthCheckResponse.SERVING
            answer = describe_as(plain_tls, group)
            assert answer.error_code == GROUP_AUTHORIZATION_FAILED
            assert answer.error_message.startswith("User:ANONYMOUS is not allowed")
        # A certificate is not asked for, so it names nobody: even the admin's is ANONYMOUS.
        with TlsStubs(coordinator.address, pki.ca.cert_file, pki.admin) as with_cert:
            answer = describe_as(with_cert, group)
            assert answer.error_message.startswith("User:ANONYMOUS is not allowed")
        grant(
            coordinator, AclEntry("User:ANONYMOUS", Operation.DESCRIBE, ResourceType.GROUP, group)
        )
        with TlsStubs(coordinator.address, pki.ca.cert_file) as plain_tls:
            assert describe_as(plain_tls, group).error_code == GROUP_ID_NOT_FOUND
        # Still TLS: a client that does not trust the server's CA gets nowhere.
        with TlsStubs(coordinator.address, None) as untrusting:
            with pytest.raises(grpc.RpcError) as refused:
                untrusting.check()
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


# --- serve's plaintext rule ---------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "::"])
def test_serve_refuses_plaintext_on_a_non_loopback_host(
    module_database_url: str, host: str
) -> None:
    port = str(free_port())
    done = run_cli("serve", "--host", host, "--port", port, "--database-url", module_database_url)
    assert done.returncode == 2, done
    assert "not a loopback address" in done.stderr, done.stderr
    assert "--allow-plaintext" in done.stderr and "--tls-cert" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_serve_refuses_a_client_ca_without_a_server_certificate(module_database_url: str) -> None:
    done = run_cli(
        "serve", "--tls-client-ca", "/nonexistent/ca.crt", "--database-url", module_database_url
    )
    assert done.returncode == 2, done
    assert "--tls-client-ca needs --tls-cert" in done.stderr


def test_serve_with_allow_plaintext_on_a_non_loopback_host_serves_and_warns(
    module_database_url: str, tmp_path: Path
) -> None:
    log_path = tmp_path / "coordinator.log"
    process = CoordinatorProcess(
        module_database_url, "--host", "0.0.0.0", "--allow-plaintext", log_path=log_path
    )
    try:
        process.start(timeout_s=30)  # its health check over 127.0.0.1 answers: it serves
        assert process.terminate() == 0
    finally:
        process.close()
    entries = [
        json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")
    ]
    warnings = [e for e in entries if e.get("event") == "plaintext_serving"]
    assert len(warnings) == 1, entries
    assert warnings[0]["level"] == "warning"
    assert "PLAINTEXT" in warnings[0]["msg"] and "0.0.0.0" in warnings[0]["msg"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--principal-mapping-rules", "RULE:^CN=([^,]+),.*$/$2/"], "--principal-mapping-rules"),
        (["--principal-mapping-rules", "RULE:^CN=(.*$/$1/"], "--principal-mapping-rules"),
        (["--super-users", "User:CN=admin;alice"], "--super-users"),
        (["--principal-from", "email"], "invalid choice"),
    ],
)
def test_serve_refuses_unusable_principal_flags(
    module_database_url: str, flags: list[str], message: str
) -> None:
    done = run_cli("serve", "--database-url", module_database_url, *flags)
    assert done.returncode == 2, done
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_serve_wires_mtls_principals_and_acls_from_its_flags(
    module_database_url: str, pki: Pki, tmp_path: Path
) -> None:
    """`coordinator-svc serve` with every security flag: the principal is the CN mapped to
    lower case, the super user is named that way, ACLs from the table are re-read."""
    log_path = tmp_path / "coordinator.log"
    process = CoordinatorProcess(
        module_database_url,
        "--host",
        "127.0.0.1",
        "--tls-cert",
        str(pki.server.cert),
        "--tls-key",
        str(pki.server.key),
        "--tls-client-ca",
        str(pki.ca.cert_file),
        "--principal-from",
        "cn",
        "--principal-mapping-rules",
        "RULE:^(.*)$/$1/U",
        "--authorization",
        "acl",
        "--super-users",
        "User:ADMIN; User:SOMEONE-ELSE",
        "--acl-refresh-ms",
        "100",
        log_path=log_path,
    )
    group = unique("served")
    try:
        process.start(wait=False)
        wait_tls_serving(process.address, pki.ca.cert_file, pki.admin)
        with (
            TlsStubs(process.address, pki.ca.cert_file, pki.admin) as admin,
            TlsStubs(process.address, pki.ca.cert_file, pki.alice) as alice,
        ):
            put = admin.admin.PutConnector(
                admin_pb2.PutConnectorRequest(group_id=group, connector="c", task_count=1),
                timeout=5,
            )
            assert put.error_code == 0, put
            answer = describe_as(alice, group)
            assert answer.error_code == GROUP_AUTHORIZATION_FAILED
            assert answer.error_message.startswith("User:ALICE is not allowed"), answer
            store = SqlStore(module_database_url, "acl-editor", "127.0.0.1:0")
            try:
                store.acls.add(
                    AclEntry("User:ALICE", Operation.DESCRIBE, ResourceType.GROUP, group)
                )
            finally:
                store.close()
            wait_for(
                "alice allowed by the new ACL",
                lambda: describe_as(alice, group).error_code == 0,
                10,
                0.05,
            )
        assert process.terminate() == 0
    finally:
        process.close()
    log = log_path.read_text()
    assert '"tls":"mtls"' in log.replace(" ", ""), log[-2000:]
    assert "plaintext_serving" not in log and "acl_without_mtls" not in log


def test_serve_on_loopback_plaintext_does_not_warn(
    module_database_url: str, tmp_path: Path
) -> None:
    log_path = tmp_path / "coordinator.log"
    process = CoordinatorProcess(module_database_url, log_path=log_path)
    try:
        process.start(timeout_s=30)
        process.terminate()
    finally:
        process.close()
    assert "plaintext_serving" not in log_path.read_text()


# --- the operator commands ----------------------------------------------------------------------


def test_the_operator_commands_work_over_mtls(secured: InProcessCoordinator, pki: Pki) -> None:
    group = unique("cli")
    address = ["--coordinator", secured.address, "--timeout", "5"]
    as_admin = tls_flags(pki, pki.admin)
    put = run_cli("put-connector", group, "orders", "--tasks", "2", *address, *as_admin)
    assert put.returncode == 0, put
    shown = run_cli("describe", group, *address, *as_admin)
    assert shown.returncode == 0, shown
    assert group in shown.stdout and "orders" in shown.stdout, shown.stdout
    listed = run_cli("list-groups", *address, *as_admin)
    assert listed.returncode == 0 and group in listed.stdout, listed
    # The name checked in the server's certificate: one it has works, another fails.
    named = run_cli("describe", group, *address, *as_admin, "--tls-server-name", "localhost")
    assert named.returncode == 0, named
    misnamed = run_cli(
        "describe", group, *address, *as_admin, "--tls-server-name", "coordinator.evil.example"
    )
    assert misnamed.returncode != 0 and group not in misnamed.stdout, misnamed


def test_the_operator_commands_act_as_their_certificates_principal(
    secured: InProcessCoordinator, pki: Pki, clients: Clients
) -> None:
    group = unique("cli-alice")
    address = ["--coordinator", secured.address, "--timeout", "5"]
    put = run_cli(
        "put-connector", group, "orders", "--tasks", "1", *address, *tls_flags(pki, pki.alice)
    )
    assert put.returncode == 1, put
    assert "GROUP_AUTHORIZATION_FAILED" in put.stderr and ALICE in put.stderr, put.stderr
    assert describe_as(clients.admin, group).error_code == GROUP_ID_NOT_FOUND
    # Without a client certificate, or without TLS at all, the mTLS server is out of reach.
    for flags in (tls_flags(pki, None), []):
        done = run_cli("put-connector", group, "orders", "--tasks", "1", *address, *flags)
        assert done.returncode != 0, done
    assert describe_as(clients.admin, group).error_code == GROUP_ID_NOT_FOUND


def test_the_operator_commands_refuse_plaintext_to_a_non_loopback_coordinator() -> None:
    for command in (
        ["describe", "g"],
        ["list-groups"],
        ["put-connector", "g", "c", "--tasks", "1"],
    ):
        started = time.monotonic()
        done = run_cli(*command, "--coordinator", REMOTE, "--timeout", "2")
        assert done.returncode == 2, done
        assert "not a loopback address" in done.stderr and "--allow-plaintext" in done.stderr
        assert time.monotonic() - started < 15  # refused before any connection attempt


# --- the worker agent ---------------------------------------------------------------------------


def agent_tls_flags(pki: Pki, client: Issued) -> list[str]:
    return [
        "--tls-ca",
        str(pki.ca.cert_file),
        "--tls-cert",
        str(client.cert),
        "--tls-key",
        str(client.key),
    ]


def test_a_worker_agent_joins_and_runs_work_over_mtls(
    secured: InProcessCoordinator, pki: Pki, clients: Clients, tmp_path: Path
) -> None:
    group = unique("agents")
    agent_cert = pki.ca.issue("agent-1", "agent-1")
    grant(
        secured,
        AclEntry(subject_principal("agent-1"), Operation.MEMBER, ResourceType.GROUP, group),
    )
    put = clients.admin.admin.PutConnector(
        admin_pb2.PutConnectorRequest(group_id=group, connector="A", task_count=2), timeout=5
    )
    assert put.error_code == 0, put
    agent = AgentProcess(
        "w1",
        secured.address,
        group,
        tmp_path,
        extra_args=agent_tls_flags(pki, agent_cert),
        rebalance_timeout_ms=5_000,
    )
    everything = {"A", "A-0", "A-1"}
    try:
        agent.start()

        def runs_everything() -> bool:
            group_now = describe_as(clients.admin, group)
            members = {m.member_id: m for m in group_now.members}
            if set(members) != {"w1"}:
                return False
            if set(names(from_cat(members["w1"].current_assignment))) != everything:
                return False
            ivs, problems = intervals([agent])
            assert not problems, problems
            return running_now(ivs).get(agent.current.label, set()) == everything

        wait_for("the agent to run A, A-0, A-1 over mTLS", runs_everything, 20, 0.1, agent.log_tail)
        # Its member id is bound to its certificate's principal: alice cannot use it.
        grant(secured, AclEntry(ALICE, Operation.MEMBER, ResourceType.GROUP, group))
        member = describe_as(clients.admin, group).members[0]
        impostor = clients.alice.coordinator.ConnectGroupHeartbeat(
            coordinator_pb2.ConnectGroupHeartbeatRequest(
                group_id=group, member_id="w1", member_epoch=member.member_epoch
            ),
            timeout=5,
        )
        assert impostor.error_code == GROUP_AUTHORIZATION_FAILED
        assert agent.stop() == 0
    finally:
        agent.close()
    assert not describe_as(clients.admin, group).members


def test_a_worker_agent_whose_principal_may_not_join_stops(
    secured: InProcessCoordinator, pki: Pki, clients: Clients, tmp_path: Path
) -> None:
    group = unique("agents-denied")
    outsider = pki.ca.issue("agent-outsider", "agent-outsider")
    assert (
        clients.admin.admin.PutConnector(
            admin_pb2.PutConnectorRequest(group_id=group, connector="A", task_count=1), timeout=5
        ).error_code
        == 0
    )
    agent = AgentProcess(
        "w-out", secured.address, group, tmp_path, extra_args=agent_tls_flags(pki, outsider)
    )
    try:
        agent.start()
        code = agent.current.proc.wait(20)
    finally:
        agent.close()
    assert code == 3, agent.log_tail()
    log = "\n".join(agent.current.log_lines())
    assert "GROUP_AUTHORIZATION_FAILED" in log or "not allowed MEMBER" in log, log[-2000:]
    assert not describe_as(clients.admin, group).members
    assert agent.records() == []


def test_a_worker_agent_reconnects_with_its_rotated_client_certificate(
    module_database_url: str, pki: Pki, clients: Clients, tmp_path: Path
) -> None:
    """The agent's certificate is rewritten with one from a second client CA (same subject);
    then the server trusts only that CA and every connection is cut: the agent connects again
    with the new certificate and keeps being served (it takes up a new connector)."""
    other_ca = CertificateAuthority(tmp_path / "ca-b", "clients-ca-b")
    client_ca = tmp_path / "clients-ca.crt"
    write_atomically(client_ca, pki.ca.cert_file.read_bytes() + other_ca.cert_file.read_bytes())
    agent_cert, agent_key = tmp_path / "agent.crt", tmp_path / "agent.key"
    first = pki.ca.issue("agent-r-a", "agent-r")
    write_atomically(agent_cert, first.cert.read_bytes())
    write_atomically(agent_key, first.key.read_bytes())
    group = unique("agent-rotation")
    flags = ["--tls-ca", str(pki.ca.cert_file), "--tls-cert", str(agent_cert)]
    flags += ["--tls-key", str(agent_key)]
    with (
        InProcessCoordinator(
            module_database_url,
            defaults=QUIET_DEFAULTS,
            tls=ServerTls(str(pki.server.cert), str(pki.server.key), str(client_ca)),
        ) as coordinator,
        TcpProxy(coordinator.address) as proxy,
        TlsStubs(coordinator.address, pki.ca.cert_file, pki.admin) as admin,
    ):
        put = admin.admin.PutConnector(
            admin_pb2.PutConnectorRequest(group_id=group, connector="A", task_count=1), timeout=5
        )
        assert put.error_code == 0, put
        agent = AgentProcess("w-rot", proxy.address, group, tmp_path / "agent", extra_args=flags)
        try:
            agent.start()

            def runs(expected: set[str]) -> Callable[[], bool]:
                def probe() -> bool:
                    ivs, problems = intervals([agent])
                    assert not problems, problems
                    return running_now(ivs).get(agent.current.label, set()) == expected

                return probe

            wait_for("the agent to run A", runs({"A", "A-0"}), 20, 0.1, agent.log_tail)
            accepted = proxy.connections_accepted
            second = other_ca.issue("agent-r-b", "agent-r")
            write_atomically(agent_cert, second.cert.read_bytes())
            write_atomically(agent_key, second.key.read_bytes())
            wait_for(
                "the agent to reconnect with its new files",
                lambda: proxy.connections_accepted > accepted,
                10,
                0.1,
                agent.log_tail,
            )
            write_atomically(client_ca, other_ca.cert_file.read_bytes())
            assert refusal(coordinator.address, pki.ca.cert_file, first) is not None
            proxy.cut("refuse")
            proxy.restore()
            put = admin.admin.PutConnector(
                admin_pb2.PutConnectorRequest(group_id=group, connector="B", task_count=1),
                timeout=5,
            )
            assert put.error_code == 0, put
            wait_for(
                "the agent to run A and B after the cut",
                runs({"A", "A-0", "B", "B-0"}),
                20,
                0.1,
                agent.log_tail,
            )
            members = [m.member_id for m in describe_as(admin, group).members]
            assert members == ["w-rot"]
            assert agent.current.alive
            assert agent.current.log_lines("TLS files changed: reconnecting")
        finally:
            agent.close()


def test_the_worker_agent_refuses_plaintext_to_a_non_loopback_coordinator() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "worker_agent.cli", "run", "--coordinator", REMOTE, "--group", "g"],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done
    assert "not a loopback address" in done.stderr and "--allow-plaintext" in done.stderr
    assert "Traceback" not in done.stderr
