"""Cutting a leaked client certificate off (issue 23, item 6), on real mTLS connections to
127.0.0.1: a certificate that the CRL file (`--tls-crl`, PEM or DER, re-read when it changes)
lists is refused with UNAUTHENTICATED at its next call on a channel opened before, the steady
heartbeat included, while another certificate of the same CA goes on; an unusable CRL is an
error at start and keeps the previous CRLs later; a connection older than the maximum age is
closed (the client's next calls go through a new connection); bad flag values are refused."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from connect_protocol.tls import TlsConfigError
from coordinator_svc.cli import main
from coordinator_svc.grpc_api.revocation import RevocationList
from coordinator_svc.grpc_api.tls import ServerTls
from coordinator_svc.runtime.gc_pauses import PauseObserver
from tests.support.agents import wait_for
from tests.support.certs import CertificateAuthority, Issued
from tests.support.client import ScriptedWorker
from tests.support.coordinator import InProcessCoordinator
from tests.support.tcp_proxy import TcpProxy
from tests.support.tls_clients import TlsStubs

from .conftest import QUIET_DEFAULTS, Pki, settle, unique, write_atomically


def events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "fields", {}).get("event") == event]


def unauthenticated(call: Callable[[], object]) -> bool:
    """Whether `call` is refused with UNAUTHENTICATED (any other failure is raised)."""
    try:
        call()
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.UNAUTHENTICATED:
            return True
        raise
    return False


@pytest.fixture
def crl_file(pki: Pki, tmp_path: Path) -> Path:
    """A CRL file that revokes nothing yet."""
    path = tmp_path / "clients.crl"
    write_atomically(path, pki.ca.crl())
    return path


@pytest.fixture
def revoking(module_database_url: str, pki: Pki, crl_file: Path) -> Iterator[InProcessCoordinator]:
    """An mTLS coordinator that checks client certificates against `crl_file`."""
    tls = ServerTls(str(pki.server.cert), str(pki.server.key), str(pki.ca.cert_file), str(crl_file))
    with InProcessCoordinator(module_database_url, defaults=QUIET_DEFAULTS, tls=tls) as coordinator:
        yield coordinator


@pytest.mark.parametrize("encoding", ["pem", "der"])
def test_a_certificate_listed_in_the_crl_is_refused_at_its_next_call_without_a_restart(
    revoking: InProcessCoordinator,
    pki: Pki,
    crl_file: Path,
    encoding: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="coordinator.tls")
    leaked = pki.ca.issue(f"leaked-{encoding}", f"leaked-{encoding}")
    colleague = pki.ca.issue(f"colleague-{encoding}", f"colleague-{encoding}")
    group = unique("revocation")
    registry = revoking.manager.metrics.registry
    with (
        TlsStubs(revoking.address, pki.ca.cert_file, leaked) as leaked_stubs,
        TlsStubs(revoking.address, pki.ca.cert_file, colleague) as colleague_stubs,
    ):
        # A heartbeat of a member the group does not know (answered in band; it creates no
        # group), and a FindCoordinator: both served before the CRL lists the certificate.
        leaked_worker = ScriptedWorker(leaked_stubs, group, unique("leaked"))
        leaked_worker.epoch = 5
        colleague_worker = ScriptedWorker(colleague_stubs, group, unique("colleague"))
        colleague_worker.epoch = 5
        assert leaked_worker.heartbeat().error_code != 0
        assert leaked_stubs.find_coordinator(group).error_code == 0

        write_atomically(crl_file, pki.ca.crl([leaked], der=encoding == "der"))

        # The channel opened before: its next call, a heartbeat, then any RPC.
        assert unauthenticated(leaked_worker.heartbeat)
        assert unauthenticated(lambda: leaked_stubs.find_coordinator(group))
        assert unauthenticated(lambda: leaked_worker.prepare())
        # A new channel with the same certificate: refused too.
        with TlsStubs(revoking.address, pki.ca.cert_file, leaked) as fresh:
            assert unauthenticated(lambda: fresh.find_coordinator(group))
        # Another certificate of the same CA goes on, on its open channel and a new one.
        assert not unauthenticated(colleague_worker.heartbeat)
        assert colleague_stubs.find_coordinator(group).error_code == 0
        with TlsStubs(revoking.address, pki.ca.cert_file, colleague) as fresh:
            assert fresh.find_coordinator(group).error_code == 0
        assert registry.get_sample_value("coordinator_unauthenticated_requests_total") == 4
        # Logged once for the certificate, not once per call.
        assert len(events(caplog, "tls_certificate_revoked")) == 1
        assert len(events(caplog, "tls_crl_reloaded")) == 1

        # Taken off the list again: the certificate is accepted at its next call.
        write_atomically(crl_file, pki.ca.crl([colleague], der=encoding == "der"))
        assert leaked_stubs.find_coordinator(group).error_code == 0
        assert unauthenticated(colleague_worker.heartbeat)


def test_a_revoked_member_is_refused_at_its_next_steady_heartbeat(
    revoking: InProcessCoordinator, pki: Pki, crl_file: Path
) -> None:
    """The heartbeat of a STABLE member that changes nothing is answered on the event loop
    without a pool thread: the CRL check comes before it."""
    leaked = pki.ca.issue("leaked-steady", "leaked-steady")
    colleague = pki.ca.issue("colleague-steady", "colleague-steady")
    group = unique("steady")
    with (
        TlsStubs(revoking.address, pki.ca.cert_file, leaked) as leaked_stubs,
        TlsStubs(revoking.address, pki.ca.cert_file, colleague) as colleague_stubs,
    ):
        leaked_worker = ScriptedWorker(leaked_stubs, group, unique("leaked"))
        colleague_worker = ScriptedWorker(colleague_stubs, group, unique("colleague"))
        settle([leaked_worker, colleague_worker], colleague_stubs, group)
        assert leaked_worker.heartbeat().error_code == 0
        write_atomically(crl_file, pki.ca.crl([leaked]))
        assert unauthenticated(leaked_worker.heartbeat)
        assert colleague_worker.heartbeat().error_code == 0


def test_a_crl_file_that_becomes_unusable_keeps_the_previous_crls(
    revoking: InProcessCoordinator,
    pki: Pki,
    crl_file: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    leaked = pki.ca.issue("leaked-kept", "leaked-kept")
    group = unique("kept")
    with TlsStubs(revoking.address, pki.ca.cert_file, leaked) as stubs:
        write_atomically(crl_file, pki.ca.crl([leaked]))
        assert unauthenticated(lambda: stubs.find_coordinator(group))
        write_atomically(crl_file, b"-----BEGIN X509 CRL-----\nMIIB")  # caught half written
        assert unauthenticated(lambda: stubs.find_coordinator(group))
        crl_file.unlink()
        assert unauthenticated(lambda: stubs.find_coordinator(group))
    assert len(events(caplog, "tls_crl_reload_failed")) == 2


def test_a_pem_file_may_hold_several_crls_and_one_of_an_unknown_issuer_is_logged(
    module_database_url: str,
    pki: Pki,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    other_ca = CertificateAuthority(tmp_path / "other-ca", "other-ca")
    leaked = pki.ca.issue("leaked-bundle", "leaked-bundle")
    crl_file = tmp_path / "bundle.crl"
    write_atomically(crl_file, other_ca.crl([other_ca.issue("x", "x")]) + pki.ca.crl([leaked]))
    tls = ServerTls(str(pki.server.cert), str(pki.server.key), str(pki.ca.cert_file), str(crl_file))
    with (
        InProcessCoordinator(module_database_url, defaults=QUIET_DEFAULTS, tls=tls) as coordinator,
        TlsStubs(coordinator.address, pki.ca.cert_file, leaked) as stubs,
    ):
        assert coordinator.server.revocations is not None
        assert unauthenticated(lambda: stubs.find_coordinator(unique("bundle")))
    unknown = events(caplog, "tls_crl_issuer_unknown")
    assert [r.fields["issuer"] for r in unknown] == ["CN=other-ca"]  # type: ignore[attr-defined]


def crl_problem(tmp_path: Path, pki: Pki, data: bytes) -> str:
    path = tmp_path / "bad.crl"
    path.write_bytes(data)
    with pytest.raises(TlsConfigError) as refused:
        RevocationList(str(path), str(pki.ca.cert_file))
    return str(refused.value)


def test_an_unusable_crl_is_refused_at_start(pki: Pki, tmp_path: Path) -> None:
    assert "no PEM X509 CRL" in crl_problem(tmp_path, pki, pki.ca.cert_file.read_bytes())
    assert "does not parse" in crl_problem(tmp_path, pki, b"\x30\x03\x02\x01\x01")
    assert "empty" in crl_problem(tmp_path, pki, b"")
    # Same issuer name, another key: not the client CA's signature.
    impostor = CertificateAuthority(tmp_path / "impostor", pki.ca.name)
    assert "is not signed by the client CA" in crl_problem(tmp_path, pki, impostor.crl())
    with pytest.raises(TlsConfigError, match="cannot read"):
        RevocationList(str(tmp_path / "missing.crl"), str(pki.ca.cert_file))


def test_serve_exits_2_on_an_unparsable_crl(
    module_database_url: str, pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.crl"
    bad.write_bytes(b"not a CRL")
    code = main(
        [
            "serve",
            "--database-url",
            module_database_url,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--tls-cert",
            str(pki.server.cert),
            "--tls-key",
            str(pki.server.key),
            "--tls-client-ca",
            str(pki.ca.cert_file),
            "--tls-crl",
            str(bad),
        ]
    )
    assert code == 2
    assert "does not parse" in capsys.readouterr().err
    # A start refused leaves no collector callback behind in the process that called `main`
    # (one left here logged to a closed stream at the end of the test run).
    assert not [c for c in gc.callbacks if isinstance(c, PauseObserver)]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--max-connection-age-ms", "-1"], "--max-connection-age-ms must be 0 (never) or"),
        (["--max-connection-age-ms", "999"], "--max-connection-age-ms must be 0 (never) or"),
        (["--max-connection-age-ms", str(2**31)], "--max-connection-age-ms must be 0 (never) or"),
        (["--max-connection-age-grace-ms", "-5"], "--max-connection-age-grace-ms must be"),
        (["--max-connection-age-grace-ms", "9999"], "--max-connection-age-grace-ms must be"),
        (["--tls-crl", "{crl}", "--no-client-ca"], "--tls-crl needs --tls-client-ca"),
        (["--tls-crl", "{missing}"], "--tls-crl: cannot read the file"),
    ],
)
def test_serve_refuses_bad_revocation_and_connection_age_flags(
    pki: Pki,
    crl_file: Path,
    tmp_path: Path,
    flags: list[str],
    expected: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tls = ["--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)]
    if "--no-client-ca" in flags:
        flags = [f for f in flags if f != "--no-client-ca"]
    else:
        tls += ["--tls-client-ca", str(pki.ca.cert_file)]
    flags = [f.format(crl=crl_file, missing=tmp_path / "missing.crl") for f in flags]
    code = main(["serve", "--database-url", "sqlite://", "--port", "0", *tls, *flags])
    assert code == 2
    assert expected in capsys.readouterr().err


# --- maximum connection age ---------------------------------------------------------------------


def calls_until_connections(stubs: TlsStubs, proxy: TcpProxy, connections: int) -> list[str]:
    """Make calls on one channel until the proxy has seen `connections` connections; the
    failures among them."""
    failures: list[str] = []

    def reconnected() -> bool:
        try:
            stubs.find_coordinator(unique("aged"))
        except grpc.RpcError as error:
            failures.append(f"{error.code()}: {error.details()}")
        return proxy.connections_accepted >= connections

    wait_for(f"{connections} connections", reconnected, timeout_s=60.0, interval_s=0.1)
    return failures


def test_a_connection_older_than_the_maximum_age_is_closed_and_calls_go_on(
    module_database_url: str, pki: Pki, tmp_path: Path
) -> None:
    client: Issued = pki.alice
    with (
        InProcessCoordinator(
            module_database_url,
            defaults=QUIET_DEFAULTS,
            tls=pki.server_tls(),
            max_connection_age_ms=1_000,
            max_connection_age_grace_ms=10_000,
        ) as coordinator,
        TcpProxy(coordinator.address) as proxy,
        TlsStubs(proxy.address, pki.ca.cert_file, client) as stubs,
    ):
        failures = calls_until_connections(stubs, proxy, 3)
        # The server closed the first two connections (GOAWAY, then closed once idle); the
        # client's calls went on over new ones, none of them failed.
        assert failures == []
        assert proxy.connections_accepted >= 3
        assert wait_for("old connections closed", lambda: proxy.open_connections <= 1)
