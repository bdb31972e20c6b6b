"""gRPC clients on TLS channels for tests against a coordinator that serves TLS or mTLS: stubs
that trust a given CA and present a client certificate (or none), each on a channel of its own
(its own subchannel pool, so that every new channel makes a new handshake), and the principal
the server's default mapping (`--principal-from subject`, DEFAULT) gives a certificate of
`tests/support/certs.py`."""

from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path
from types import TracebackType

import grpc
from connect.group.v1 import admin_pb2, admin_pb2_grpc, coordinator_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from connect_protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, channel_options
from tests.support.certs import Issued


def subject_principal(common_name: str) -> str:
    """`User:<subject>` of a certificate that `CertificateAuthority.issue` made for
    `common_name`, as the server names it by default (RFC 4514 order: CN first)."""
    return f"User:CN={common_name},O=connect-tests"


def tls_channel(
    address: str,
    ca_file: Path | None,
    client: Issued | None = None,
    server_name: str | None = None,
) -> grpc.Channel:
    """A channel to `address` that verifies the server with `ca_file` (None: the system's
    roots) and presents `client` (None: no client certificate)."""
    credentials = grpc.ssl_channel_credentials(
        ca_file.read_bytes() if ca_file is not None else None,
        client.key.read_bytes() if client is not None else None,
        client.cert.read_bytes() if client is not None else None,
    )
    options: list[tuple[str, int | str]] = [
        ("grpc.use_local_subchannel_pool", 1),
        *channel_options(DEFAULT_MAX_MESSAGE_BYTES),
    ]
    if server_name is not None:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(address, credentials, options=options)


class TlsStubs:
    """The coordinator's, admin and health stubs on one TLS channel (usable wherever
    `tests.support.coordinator.Stubs` is, e.g. by `ScriptedWorker`)."""

    def __init__(
        self,
        address: str,
        ca_file: Path | None,
        client: Issued | None = None,
        server_name: str | None = None,
    ) -> None:
        self.address = address
        self.channel = tls_channel(address, ca_file, client, server_name)
        self.coordinator = coordinator_pb2_grpc.ConnectGroupCoordinatorStub(self.channel)
        self.admin = admin_pb2_grpc.ConnectGroupAdminStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def check(self, timeout_s: float = 5.0) -> int:
        """The health check's status (raises grpc.RpcError if the call fails, e.g. when the
        handshake is refused)."""
        response = self.health.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        status: int = response.status
        return status

    def find_coordinator(
        self, group_id: str, timeout_s: float = 5.0
    ) -> admin_pb2.FindCoordinatorResponse:
        response: admin_pb2.FindCoordinatorResponse = self.admin.FindCoordinator(
            admin_pb2.FindCoordinatorRequest(group_id=group_id), timeout=timeout_s
        )
        return response

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> TlsStubs:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def refusal(
    address: str,
    ca_file: Path | None,
    client: Issued | None = None,
    timeout_s: float = 5.0,
) -> grpc.RpcError | None:
    """The error of one health check on a new channel (None if it succeeded)."""
    with TlsStubs(address, ca_file, client) as stubs:
        try:
            stubs.check(timeout_s)
        except grpc.RpcError as error:
            return error
    return None


def wait_tls_serving(
    address: str, ca_file: Path, client: Issued | None = None, timeout_s: float = 30.0
) -> None:
    """Wait until a health check over TLS (with `client`) says SERVING."""
    deadline = time.monotonic() + timeout_s
    last: grpc.RpcError | None = None
    while time.monotonic() < deadline:
        with TlsStubs(address, ca_file, client) as stubs:
            try:
                if stubs.check(1.0) == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as error:
                last = error
        time.sleep(0.1)
    raise AssertionError(f"{address} not serving over TLS after {timeout_s:g} s: {last}")


def presented_serial(address: str, ca_file: Path, client: Issued | None = None) -> int:
    """The serial number of the certificate the server presents to a new TLS connection that
    trusts `ca_file` (ssl.SSLError if it does not verify)."""
    from cryptography import x509

    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca_file))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def serial_of(cert_file: Path) -> int:
    from cryptography import x509

    return int(x509.load_pem_x509_certificate(cert_file.read_bytes()).serial_number)
