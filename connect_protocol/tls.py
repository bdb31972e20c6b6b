"""Transport security settings shared by the agent, the operator CLI and the server: a client's
TLS files (CA bundle, optional client certificate for mTLS, the name to verify), reading PEM
files with clear errors, noticing that files changed (cert-manager rotates them), and the rule
that plaintext is for loopback only unless explicitly allowed. No gRPC here: each side builds
its credentials from `ClientTls.pem()`."""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass

from .env import env_default

#: The hosts a plaintext connection may go to without an explicit flag.
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def host_of(address: str) -> str:
    """The host part of "host:port", "[v6]:port", "dns:///host:port" or a bare host."""
    target = address.split("///", 1)[-1] if "///" in address else address
    if target.startswith("["):
        return target[1 : target.find("]")] if "]" in target else target[1:]
    if target.count(":") == 1:
        return target.rsplit(":", 1)[0]
    return target  # a bare host or an IPv6 address without brackets and port


def is_loopback(host: str) -> bool:
    """Whether `host` ("127.0.0.1", "::1", "localhost", ...) names this machine only."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def plaintext_problem(address: str, allow_plaintext: bool, flag: str) -> str | None:
    """Why a plaintext connection to (or listener on) `address` is refused, or None: plaintext
    is for loopback unless `flag` allows it."""
    if allow_plaintext or is_loopback(host_of(address)):
        return None
    return (
        f"{address} is not a loopback address and no TLS is configured: traffic, including "
        f"connector configs, would cross the network in clear. Configure TLS, or pass {flag} "
        "to accept plaintext."
    )


def file_stamp(paths: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """What changes when any of `paths` is rewritten or replaced (a Kubernetes Secret volume
    swaps a symlink, which changes the target's inode and mtime)."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append((-1, -1))
        else:
            out.append((st.st_mtime_ns, st.st_ino))
    return tuple(out)


def read_pem_file(path: str, what: str, key: bool = False) -> bytes:
    """The PEM file `path` (the `what` of a message), checked to hold a private key (`key`) or
    a certificate; TlsConfigError if it is unreadable or holds neither."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        raise TlsConfigError(f"cannot read the {what} {path!r}: {error.strerror}") from error
    marker, kind = (b"PRIVATE KEY-----", "private key") if key else (_CERT, "certificate")
    if marker not in data:
        raise TlsConfigError(f"{path!r} holds no PEM {kind}")
    return data


_CERT = b"-----BEGIN CERTIFICATE-----"


class TlsConfigError(ValueError):
    """A TLS file that is missing, unreadable, or not PEM; or an incomplete combination."""


@dataclass(frozen=True)
class ClientTls:
    """TLS for a client's channels: `ca_file` verifies the coordinator (None: the system's
    roots); `cert_file` and `key_file`, both or neither, are the client certificate that mTLS
    asks for; `server_name` is the name checked in the coordinator's certificate instead of the
    dialled host (needed when FindCoordinator answers with a pod IP)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise TlsConfigError("a client certificate needs both its file and its key file")

    def files(self) -> tuple[str, ...]:
        return tuple(p for p in (self.ca_file, self.cert_file, self.key_file) if p)

    def stamp(self) -> tuple[tuple[int, int], ...]:
        """Changes when any of the files changes: a channel opened before is then stale."""
        return file_stamp(self.files())

    def pem(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(CA bundle, client key, client certificate) as they are now, for
        `grpc.ssl_channel_credentials`; TlsConfigError if one is unreadable or not PEM."""
        ca = read_pem_file(self.ca_file, "CA bundle") if self.ca_file else None
        cert = read_pem_file(self.cert_file, "client certificate") if self.cert_file else None
        key = read_pem_file(self.key_file, "client key", key=True) if self.key_file else None
        return ca, key, cert

    def channel_options(self) -> list[tuple[str, str]]:
        """The gRPC channel options TLS adds (the name to verify)."""
        if self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []


def add_client_tls_arguments(parser: argparse.ArgumentParser, env_prefix: str, what: str) -> None:
    """The TLS flags of a client (`what`: "the agent", "the command"), each also read from
    `<env_prefix><FLAG>`: --tls-ca, --tls-cert, --tls-key, --tls-server-name,
    --allow-plaintext. `client_tls(args)` turns them into a ClientTls."""
    group = parser.add_argument_group(
        "transport security",
        f"Without --tls-ca or --tls-cert {what} speaks plaintext, and only to loopback "
        "coordinators unless --allow-plaintext is given. The files are read again when they "
        "change (cert-manager rotation): the next connection uses them.",
    )

    def env(name: str) -> str | None:
        return env_default(f"{env_prefix}{name}", None)

    group.add_argument(
        "--tls-ca",
        default=env("TLS_CA"),
        help=f"PEM CA bundle that verifies the coordinator; TLS on ({env_prefix}TLS_CA)",
    )
    group.add_argument(
        "--tls-cert",
        default=env("TLS_CERT"),
        help="PEM client certificate for mTLS; its identity is the caller's principal "
        f"({env_prefix}TLS_CERT)",
    )
    group.add_argument(
        "--tls-key",
        default=env("TLS_KEY"),
        help=f"PEM key of the client certificate ({env_prefix}TLS_KEY)",
    )
    group.add_argument(
        "--tls-server-name",
        default=env("TLS_SERVER_NAME"),
        help="name to verify in the coordinator's certificate instead of the dialled host, "
        f"e.g. when FindCoordinator answers with pod IPs ({env_prefix}TLS_SERVER_NAME)",
    )
    group.add_argument(
        "--allow-plaintext",
        action="store_true",
        default=(env("ALLOW_PLAINTEXT") or "") not in ("", "0", "false"),
        help=f"talk plaintext to non-loopback coordinators ({env_prefix}ALLOW_PLAINTEXT=1)",
    )


def client_tls(args: argparse.Namespace) -> ClientTls | None:
    """The ClientTls the flags of `add_client_tls_arguments` ask for (None: plaintext), its
    files read once now so that a bad one is reported before anything starts;
    TlsConfigError if unusable."""
    if not (args.tls_ca or args.tls_cert or args.tls_key):
        return None
    tls = ClientTls(args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)
    tls.pem()
    return tls
