"""Revocation of client certificates (`serve --tls-crl`): certificate revocation lists (CRLs, PEM
or DER; a PEM file may hold several) read from a file and read again when it changes, checked
against each call's client certificate by its issuer and serial number (RFC 5280 §5).

A call costs a `stat` of the file and a dict lookup: the verdict on each certificate (the PEM
bytes gRPC's auth context carries) is cached until the file changes. A CRL signed by one of the
client CAs is verified against it (an invalid signature is refused); one whose issuer is not
among them is used all the same (a CRL can only take access away) and logged. Not supported:
delta CRLs, indirect CRLs (the certificate-issuer entry extension), and revocation of an
intermediate CA (only the client's own certificate is checked)."""

from __future__ import annotations

import datetime
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa

from connect_protocol.logs import fields
from connect_protocol.tls import TlsConfigError, file_stamp

log = logging.getLogger("coordinator.tls")

#: Verdicts cached at most (one per distinct client certificate seen since the file changed);
#: past it the cache starts again empty.
MAX_CACHED_VERDICTS = 65_536

_PEM_CRL = re.compile(rb"-----BEGIN X509 CRL-----.+?-----END X509 CRL-----", re.DOTALL)


@dataclass(frozen=True)
class Revocations:
    """What the CRLs of one version of the file say: the revoked serial numbers per issuer."""

    serials: dict[x509.Name, frozenset[int]]
    crls: int

    def revoked(self, certificate: x509.Certificate) -> bool:
        return certificate.serial_number in self.serials.get(certificate.issuer, frozenset())


def parse_crls(data: bytes, path: str) -> list[x509.CertificateRevocationList]:
    """The CRLs of a file: every PEM `X509 CRL` block, or one DER CRL; TlsConfigError if it
    holds none or one does not parse."""
    try:
        if b"-----BEGIN" in data:
            blocks = _PEM_CRL.findall(data)
            if not blocks:
                raise TlsConfigError(f"{path!r} holds no PEM X509 CRL")
            return [x509.load_pem_x509_crl(block) for block in blocks]
        if not data.strip():
            raise TlsConfigError(f"{path!r} is empty: it holds no CRL")
        return [x509.load_der_x509_crl(data)]
    except ValueError as error:
        if isinstance(error, TlsConfigError):
            raise
        raise TlsConfigError(f"{path!r} holds a CRL that does not parse: {error}") from error


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as error:
        raise TlsConfigError(f"cannot read the {what} {path!r}: {error.strerror}") from error


def _signed_by(crl: x509.CertificateRevocationList, ca: x509.Certificate) -> bool:
    key = ca.public_key()
    if not isinstance(
        key,
        rsa.RSAPublicKey
        | ec.EllipticCurvePublicKey
        | ed25519.Ed25519PublicKey
        | ed448.Ed448PublicKey
        | dsa.DSAPublicKey,
    ):
        return False
    try:
        return crl.is_signature_valid(key)
    except (UnsupportedAlgorithm, ValueError, TypeError):
        return False


def load_revocations(crl_file: str, client_ca_file: str | None) -> Revocations:
    """The CRLs of `crl_file` as they are now. A CRL whose issuer is one of the client CAs of
    `client_ca_file` must carry a valid signature of it (TlsConfigError otherwise); one whose
    issuer is none of them is logged and used. TlsConfigError if the file is unreadable or
    holds no CRL."""
    crls = parse_crls(_read(crl_file, "CRL file"), crl_file)
    cas: Sequence[x509.Certificate] = ()
    if client_ca_file:
        try:
            cas = x509.load_pem_x509_certificates(_read(client_ca_file, "client CA bundle"))
        except ValueError as error:
            raise TlsConfigError(f"{client_ca_file!r}: {error}") from error
    serials: dict[x509.Name, set[int]] = {}
    now = datetime.datetime.now(datetime.UTC)
    for crl in crls:
        issuers = [ca for ca in cas if ca.subject == crl.issuer]
        if not issuers:
            log.warning(
                "a CRL's issuer is none of the client CAs: its entries are used, its "
                "signature is not checked",
                extra=fields(
                    event="tls_crl_issuer_unknown",
                    issuer=crl.issuer.rfc4514_string(),
                    file=crl_file,
                ),
            )
        elif not any(_signed_by(crl, ca) for ca in issuers):
            raise TlsConfigError(
                f"{crl_file!r}: the CRL of {crl.issuer.rfc4514_string()!r} is not signed by "
                "the client CA of that name"
            )
        next_update = crl.next_update_utc
        if next_update is not None and next_update < now:
            log.warning(
                "a CRL is past its next update: its entries are used; publish a fresh one",
                extra=fields(
                    event="tls_crl_stale",
                    issuer=crl.issuer.rfc4514_string(),
                    next_update=next_update.isoformat(),
                ),
            )
        serials.setdefault(crl.issuer, set()).update(entry.serial_number for entry in crl)
    return Revocations({k: frozenset(v) for k, v in serials.items()}, len(crls))


class RevocationList:
    """The CRLs of `crl_file`, read at start (TlsConfigError if unusable) and again at the first
    call after the file changes; one that cannot be used then keeps the previous CRLs (logged).
    `refusal(pem)` says why a client certificate is refused, or None."""

    def __init__(self, crl_file: str, client_ca_file: str | None = None) -> None:
        self.crl_file = crl_file
        self.client_ca_file = client_ca_file
        self._paths = (crl_file,)
        self._lock = threading.Lock()
        self._stamp = file_stamp(self._paths)
        self._current = load_revocations(crl_file, client_ca_file)
        self._verdicts: dict[bytes, str | None] = {}
        self.loads = 1
        self._log_loaded("CRLs loaded", "tls_crl_loaded")

    def _log_loaded(self, message: str, event: str) -> None:
        log.info(
            message,
            extra=fields(
                event=event,
                file=self.crl_file,
                crls=self._current.crls,
                revoked=sum(len(s) for s in self._current.serials.values()),
            ),
        )

    def refusal(self, pem: bytes | None) -> str | None:
        """Why the client certificate `pem` (its PEM bytes, from the auth context) is refused:
        revoked by a CRL, or unreadable; None if it may go on."""
        if pem is None:
            return None
        if file_stamp(self._paths) != self._stamp:
            self._reload()
        try:
            return self._verdicts[pem]
        except KeyError:
            pass
        verdict = self._judge(pem)
        if len(self._verdicts) >= MAX_CACHED_VERDICTS:
            self._verdicts = {}
        self._verdicts[pem] = verdict
        return verdict

    def _judge(self, pem: bytes) -> str | None:
        try:
            certificate = x509.load_pem_x509_certificate(pem)
        except ValueError:
            return "the client certificate cannot be read to check it against the CRLs."
        if not self._current.revoked(certificate):
            return None
        log.warning(
            "a revoked client certificate is refused",
            extra=fields(
                event="tls_certificate_revoked",
                subject=certificate.subject.rfc4514_string(),
                issuer=certificate.issuer.rfc4514_string(),
                serial=f"{certificate.serial_number:x}",
            ),
        )
        return (
            f"the client certificate (serial {certificate.serial_number:x}) is revoked by its "
            "issuer's CRL."
        )

    def _reload(self) -> None:
        with self._lock:
            stamp = file_stamp(self._paths)
            if stamp == self._stamp:
                return  # another thread reloaded it
            self._stamp = stamp
            try:
                current = load_revocations(self.crl_file, self.client_ca_file)
            except TlsConfigError as error:
                log.warning(
                    "the CRL file changed but cannot be used; keeping the previous CRLs: %s",
                    error,
                    extra=fields(event="tls_crl_reload_failed", file=self.crl_file),
                )
                return
            self._current = current
            self._verdicts = {}
            self.loads += 1
        self._log_loaded("CRL file changed; calls are checked against it", "tls_crl_reloaded")
