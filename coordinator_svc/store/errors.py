"""Values and errors of the store's ownership protocol: leases on groups (DESIGN 3.16)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Lease:
    """This process's lease on one group, as returned by `SqlStore.try_acquire` / `renew`.

    Attributes:
        group_id: the group the lease is on.
        owner_id: the holder (this process's owner id).
        token: fencing token; it changes whenever a new tenure starts (another owner took the
            group, or the lease lapsed before it was taken again), so an unchanged token means
            nobody else can have written in between. Every commit checks it in the database.
        valid_until_monotonic: a conservative local estimate (`time.monotonic()` at the start of
            the acquiring call plus the lease length) after which the caller must stop serving
            the group: the database cannot give the lease away before then.
    """

    group_id: str
    owner_id: str
    token: int
    valid_until_monotonic: float


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Another process that holds a group's lease, for NOT_COORDINATOR and FindCoordinator.

    Attributes:
        owner_id: the holder's owner id.
        advertised_address: the holder's advertised host:port.
        expires_at: when the lease lapses unless renewed (timezone-aware, database clock).
    """

    owner_id: str
    advertised_address: str
    expires_at: datetime


class StoreError(Exception):
    """Base of every error the store raises on purpose."""


class LeaseLost(StoreError):
    """A commit's lease is no longer ours (another owner, a new token, or it lapsed); nothing was
    written.

    Attributes:
        group_id: the group whose write was refused.
        holder: the live holder now, if any (None when the lease lapsed and nobody took it).
    """

    def __init__(self, group_id: str, holder: LeaseHolder | None) -> None:
        if holder is None:
            text = f"lease on group {group_id!r} lapsed; nobody holds it now"
        else:
            text = (
                f"lease on group {group_id!r} is held by {holder.owner_id!r} "
                f"at {holder.advertised_address}"
            )
        super().__init__(text)
        self.group_id = group_id
        self.holder = holder


class StoreUnavailable(StoreError):
    """The database could not be reached or refused the operation transiently (connection lost,
    pool exhausted, lock or serialization failure); nothing was written. The DBAPI error is the
    `__cause__`.

    `str()` is the detail, for the log only (it may name the database's host and port and
    carry the driver's text); `client_message` is what a client is told: the kind of failure
    (`failure_kind`), without addresses or driver text.

    Attributes:
        kind: the failure's kind (`failure_kind`).
        outcome_unknown: the failure came while the transaction was committing (the connection
            was lost on COMMIT): what it wrote may or may not have been committed. Otherwise
            nothing was written.
    """

    def __init__(
        self, detail: str, kind: str = "unavailable", outcome_unknown: bool = False
    ) -> None:
        super().__init__(detail)
        self.kind = kind
        self.outcome_unknown = outcome_unknown

    @property
    def client_message(self) -> str:
        return f"the database is unavailable ({self.kind}); retry."


class LeaseLocked(StoreUnavailable):
    """Taking a group's lease waited for its lease row's lock until the lock timeout: another
    coordinator process holds it, in a commit in flight or stopped inside its transaction (a
    paused process; the server ends that transaction after a lease length). Nothing was written;
    the database itself answered.

    Attributes:
        group_id: the group whose lease row is locked.
        holder: who the row names as the group's lease holder (as last committed), if anyone.
    """

    def __init__(self, group_id: str, holder: LeaseHolder | None) -> None:
        who = (
            "another coordinator process"
            if holder is None
            else f"coordinator {holder.owner_id!r} at {holder.advertised_address}"
        )
        super().__init__(
            f"the lease row of group {group_id!r} is locked by {who} (a commit in flight, or "
            "a process paused inside its transaction)",
            "lease locked by another owner",
        )
        self.group_id = group_id
        self.holder = holder

    @property
    def client_message(self) -> str:
        who = (
            "another coordinator process"
            if self.holder is None
            else f"the coordinator at {self.holder.advertised_address} ({self.holder.owner_id})"
        )
        return (
            f"the lease of group {self.group_id!r} is locked by {who}, which holds it in a "
            "transaction (a commit in flight, or a paused process); retry."
        )


#: PostgreSQL SQLSTATE codes (and classes, by their first two characters) named for clients.
_SQLSTATE_KINDS = {
    "55P03": "lock timeout",
    "40001": "serialization failure",
    "40P01": "deadlock",
    "57014": "statement cancelled",
    "25P03": "idle transaction ended",
    "53300": "too many connections",
    "57P01": "server shutting down",
    "57P02": "server shutting down",
    "57P03": "server starting or stopping",
    "28P01": "authentication failed",
    "28000": "authentication failed",
    "3D000": "no such database",
}
_SQLSTATE_CLASS_KINDS = {"08": "connection failure", "53": "server out of resources"}

#: Fragments of a driver's message (lower case) and the kind they mean, tried in order.
_TEXT_KINDS = (
    ("connection refused", "connection refused"),
    ("timeout expired", "connection timed out"),
    ("timed out", "connection timed out"),
    ("could not translate host name", "host name not resolved"),
    ("name or service not known", "host name not resolved"),
    ("no route to host", "host unreachable"),
    ("network is unreachable", "host unreachable"),
    ("server closed the connection", "connection lost"),
    ("connection is closed", "connection lost"),
    ("consuming input failed", "connection lost"),
    ("terminating connection", "connection lost"),
    ("database is locked", "lock timeout"),
    ("lock timeout", "lock timeout"),
    ("password authentication failed", "authentication failed"),
    ("too many clients", "too many connections"),
    ("does not exist", "no such database"),
)


def failure_kind(error: BaseException | None) -> str:
    """A short name for why the database failed (`connection refused`, `lock timeout`, ...),
    worked out from the driver's SQLSTATE or message, with no address or driver text in it;
    `unavailable` when nothing more is known."""
    if error is None:
        return "unavailable"
    state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    if isinstance(state, str) and state:
        kind = _SQLSTATE_KINDS.get(state) or _SQLSTATE_CLASS_KINDS.get(state[:2])
        if kind is not None:
            return kind
    text = str(error).lower()
    for fragment, kind in _TEXT_KINDS:
        if fragment in text:
            return kind
    return "unavailable"


class SecretMissing(StoreError):
    """A secret the coordinator needs is not in `coordinator_secrets` (the schema is not migrated
    to revision 0005, or the row was deleted): the coordinator must not start without it."""
