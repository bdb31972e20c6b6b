"""Certificates for tests on real TLS connections, made with the `cryptography` package: a CA,
server certificates for 127.0.0.1/localhost, client certificates with a common name and SAN
URIs/DNS names, expired ones, a second CA whose certificates the first must refuse, and CRLs
(PEM or DER) that revoke some of them."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM files on disk."""

    cert: Path
    key: Path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates into `directory`."""

    def __init__(self, directory: Path, name: str = "test-ca") -> None:
        self.directory = directory
        self.name = name
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(days=1))
            .not_valid_after(_now() + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert_file = _write(
            directory / f"{name}.crt", self._cert.public_bytes(serialization.Encoding.PEM)
        )

    def issue(
        self,
        file_stem: str,
        common_name: str,
        *,
        server: bool = False,
        client: bool = True,
        dns_names: tuple[str, ...] = (),
        uris: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        valid_days: float = 7.0,
        expired: bool = False,
    ) -> Issued:
        """A certificate signed by this CA, written to `<file_stem>.crt` and `.key`."""
        key = ec.generate_private_key(ec.SECP256R1())
        if expired:
            not_before = _now() - datetime.timedelta(days=10)
            not_after = _now() - datetime.timedelta(days=1)
        else:
            not_before = _now() - datetime.timedelta(minutes=5)
            not_after = _now() + datetime.timedelta(days=valid_days)
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        names += [x509.UniformResourceIdentifier(u) for u in uris]
        names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(
                x509.Name(
                    [
                        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "connect-tests"),
                        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                    ]
                )
            )
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        cert_file = _write(
            self.directory / f"{file_stem}.crt", cert.public_bytes(serialization.Encoding.PEM)
        )
        key_file = _write(
            self.directory / f"{file_stem}.key",
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
        return Issued(cert_file, key_file)

    def server(self, file_stem: str = "server", **kwargs: object) -> Issued:
        """A server certificate for 127.0.0.1 and localhost."""
        return self.issue(
            file_stem,
            "coordinator",
            server=True,
            client=False,
            dns_names=("localhost",),
            ips=("127.0.0.1",),
            **kwargs,  # type: ignore[arg-type]
        )

    def crl(self, revoked: Sequence[Issued] = (), *, der: bool = False) -> bytes:
        """A CRL of this CA listing `revoked` (by serial number), signed by it; PEM unless
        `der`."""
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(self._cert.subject)
            .last_update(_now() - datetime.timedelta(minutes=5))
            .next_update(_now() + datetime.timedelta(days=7))
        )
        for issued in revoked:
            serial = x509.load_pem_x509_certificate(issued.cert.read_bytes()).serial_number
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder()
                .serial_number(serial)
                .revocation_date(_now() - datetime.timedelta(minutes=1))
                .build()
            )
        crl = builder.sign(self._key, hashes.SHA256())
        encoding = serialization.Encoding.DER if der else serialization.Encoding.PEM
        return crl.public_bytes(encoding)
