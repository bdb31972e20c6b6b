"""What the servicers know of a call besides its request: who sent it (the principal, from the
client certificate the TLS handshake verified), from where, and whether the caller still
waits. `CallIdentity` reads the principal off gRPC's auth context (refusing a certificate that
a CRL revokes); `PoolContext` carries it, worked out on the event loop, to a call that runs on
a pool thread."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..core.acls import ANONYMOUS
from ..core.principals import CertificateIdentity, PrincipalMapper
from .revocation import RevocationList

UNMAPPED = "the client certificate names no principal that the server's mapping rules accept."


class Context(Protocol):
    """What the servicers ask of a call's context (gRPC's, or `PoolContext`)."""

    def peer(self) -> str: ...

    def is_active(self) -> bool: ...

    def auth_context(self) -> Mapping[str, Sequence[bytes]]: ...


class Unauthenticated(Exception):
    """A call refused with UNAUTHENTICATED: its client certificate is revoked, or maps to no
    principal."""


class CallIdentity:
    """The principal of a call: ANONYMOUS unless the server asks for client certificates
    (`mapper` given), then the certificate's name through the mapping rules; None when the
    rules map it to nothing (the call is refused with UNAUTHENTICATED). With `revocations`,
    a certificate its CRLs revoke is refused too (`authenticate`)."""

    def __init__(
        self, mapper: PrincipalMapper | None = None, revocations: RevocationList | None = None
    ) -> None:
        self.mapper = mapper
        self.revocations = revocations

    def authenticate(self, context: Any) -> str:
        """The principal of a call as it arrives (every RPC, on the event loop); Unauthenticated
        if its certificate is revoked or maps to no principal."""
        if self.mapper is None:
            return ANONYMOUS
        auth = context.auth_context()
        if self.revocations is not None:
            pem = auth.get("x509_pem_cert")
            refusal = self.revocations.refusal(pem[0] if pem else None)
            if refusal is not None:
                raise Unauthenticated(refusal)
        principal = self.mapper.principal(certificate_identity(auth))
        if principal is None:
            raise Unauthenticated(UNMAPPED)
        return principal

    def principal(self, context: Any) -> str | None:
        if self.mapper is None:
            return ANONYMOUS  # every call's, so a PoolContext's too
        known = getattr(context, "principal", None)
        if isinstance(known, str):
            return known  # a PoolContext: worked out on the event loop
        return self.mapper.principal(certificate_identity(context.auth_context()))


def _texts(values: Sequence[bytes] | None) -> tuple[str, ...]:
    return tuple(v.decode("utf-8", "replace") for v in values or ())


def certificate_identity(auth: Mapping[str, Sequence[bytes]]) -> CertificateIdentity | None:
    """What gRPC's auth context says the client certificate is; None without one."""
    subject = _texts(auth.get("x509_subject"))
    common_name = _texts(auth.get("x509_common_name"))
    if not subject and not common_name and "x509_pem_cert" not in auth:
        return None
    return CertificateIdentity(
        subject=subject[0] if subject else "",
        common_name=common_name[0] if common_name else "",
        san_uris=_texts(auth.get("peer_uri")),
        san_dns=_texts(auth.get("peer_dns")),
    )


class PoolContext:
    """A call's context for a synchronous servicer on a pool thread: the caller's address, its
    principal, and whether the caller is still waiting."""

    def __init__(self, peer: str, principal: str) -> None:
        self._peer = peer
        self.principal = principal
        self.gone = threading.Event()

    def peer(self) -> str:
        return self._peer

    def is_active(self) -> bool:
        return not self.gone.is_set()

    def auth_context(self) -> Mapping[str, Sequence[bytes]]:
        return {}
