"""The server's transport security: its certificate and key, the optional client CA that makes
client certificates required (mTLS), and re-reading them when their files change. gRPC asks for
the configuration at every TLS handshake; the answer is "unchanged" unless a file's stamp moved,
so a rotation (cert-manager rewriting a Secret volume) takes effect for the next connection
without a restart, and connections open before it keep going. A certificate and key that do not
match are not handed to gRPC: the reload fails (logged, counted apart) and the previous pair
stays. The CRLs of client certificates (`crl_file`) are read by `revocation.py`."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from connect_protocol.logs import fields
from connect_protocol.tls import TlsConfigError, file_stamp, read_pem_file

from ..metrics import Metrics

log = logging.getLogger("coordinator.tls")


@dataclass(frozen=True)
class ServerTls:
    """The files of the server's TLS: certificate chain, key, and the CA bundle that client
    certificates must chain to (None: no client certificate is asked for); `crl_file`: CRLs
    that revoke client certificates (`revocation.RevocationList`; not one of `files()`)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    crl_file: str | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca_file is not None

    def files(self) -> tuple[str, ...]:
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        """The configuration from the files as they are now; TlsConfigError if one is
        unreadable or not PEM, or if the key is not the certificate's."""
        cert = read_pem_file(self.cert_file, "server certificate")
        key = read_pem_file(self.key_file, "server key", key=True)
        check_key_matches(cert, key, self.cert_file, self.key_file)
        ca = read_pem_file(self.client_ca_file, "client CA bundle") if self.client_ca_file else None
        return grpc.ssl_server_certificate_configuration([(key, cert)], ca)


def check_key_matches(cert_pem: bytes, key_pem: bytes, cert_file: str, key_file: str) -> None:
    """TlsConfigError unless `key_pem` is the private key of the first certificate of
    `cert_pem` (their public keys compared)."""
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as error:
        raise TlsConfigError(f"{cert_file!r} holds a certificate that does not parse") from error
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as error:  # TypeError: an encrypted key
        raise TlsConfigError(
            f"{key_file!r} holds no usable private key (unencrypted PEM): {error}"
        ) from error
    try:
        der, spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        matches = key.public_key().public_bytes(der, spki) == certificate.public_key().public_bytes(
            der, spki
        )
    except (ValueError, TypeError) as error:
        raise TlsConfigError(f"cannot compare {key_file!r} with {cert_file!r}: {error}") from error
    if not matches:
        raise TlsConfigError(
            f"the key {key_file!r} is not the key of the certificate {cert_file!r} (a rotation "
            "caught between the two files, or a wrong pair)"
        )


class ReloadingCredentials:
    """Server credentials that re-read `tls`'s files when they change. A file caught half
    written, or a pair that does not match, keeps the previous configuration (logged); the next
    handshake after the files settle picks the new one up."""

    def __init__(self, tls: ServerTls, metrics: Metrics | None = None) -> None:
        self.tls = tls
        self._metrics = metrics
        self._lock = threading.Lock()
        self._stamp = file_stamp(tls.files())
        self._failed_stamp: tuple[tuple[int, int], ...] | None = None
        self.reloads = 0
        self.failed_reloads = 0
        self.credentials = grpc.dynamic_ssl_server_credentials(
            tls.configuration(), self._fetch, require_client_authentication=tls.mutual
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's callback at each handshake: a new configuration, or None for unchanged. A
        version of the files that cannot be used is logged and counted once."""
        stamp = file_stamp(self.tls.files())
        with self._lock:
            if stamp == self._stamp or stamp == self._failed_stamp:
                return None
            try:
                configuration = self.tls.configuration()
            except TlsConfigError as error:
                self._failed_stamp = stamp
                self.failed_reloads += 1
                if self._metrics is not None:
                    self._metrics.tls_reload_failures.inc()
                log.warning(
                    "TLS files changed but cannot be used yet; keeping the previous ones: %s",
                    error,
                    extra=fields(event="tls_reload_failed", reason=str(error)),
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
