"""The server's transport security: its certificate and key, the optional client CA that makes
client certificates required (mTLS), and re-reading them when their files change. gRPC asks for
the configuration at every TLS handshake; the answer is "unchanged" unless a file's stamp moved,
so a rotation (cert-manager rewriting a Secret volume) takes effect for the next connection
without a restart, and connections open before it keep going."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import grpc

from connect_protocol.logs import fields
from connect_protocol.tls import TlsConfigError, file_stamp, read_pem_file

from ..metrics import Metrics

log = logging.getLogger("coordinator.tls")


@dataclass(frozen=True)
class ServerTls:
    """The files of the server's TLS: certificate chain, key, and the CA bundle that client
    certificates must chain to (None: no client certificate is asked for)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca_file is not None

    def files(self) -> tuple[str, ...]:
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        """The configuration from the files as they are now; TlsConfigError if one is
        unreadable or not PEM."""
        cert = read_pem_file(self.cert_file, "server certificate")
        key = read_pem_file(self.key_file, "server key", key=True)
        ca = read_pem_file(self.client_ca_file, "client CA bundle") if self.client_ca_file else None
        return grpc.ssl_server_certificate_configuration([(key, cert)], ca)


class ReloadingCredentials:
    """Server credentials that re-read `tls`'s files when they change. A file caught half
    written, or a pair that does not match, keeps the previous configuration (logged); the next
    handshake after the files settle picks the new one up."""

    def __init__(self, tls: ServerTls, metrics: Metrics | None = None) -> None:
        self.tls = tls
        self._metrics = metrics
        self._lock = threading.Lock()
        self._stamp = file_stamp(tls.files())
        self.reloads = 0
        self.credentials = grpc.dynamic_ssl_server_credentials(
            tls.configuration(), self._fetch, require_client_authentication=tls.mutual
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's callback at each handshake: a new configuration, or None for unchanged."""
        stamp = file_stamp(self.tls.files())
        with self._lock:
            if stamp == self._stamp:
                return None
            try:
                configuration = self.tls.configuration()
            except TlsConfigError as error:
                log.warning(
                    "TLS files changed but cannot be used yet; keeping the previous ones: %s",
                    error,
                    extra=fields(event="tls_reload_failed"),
                )
                return None
            self._stamp = stamp
            self.reloads += 1
        if self._metrics is not None:
            self._metrics.tls_reloads.inc()
        log.info(
            "TLS certificate files changed; new connections use them",
            extra=fields(event="tls_reloaded", files=list(self.tls.files())),
        )
        return configuration
