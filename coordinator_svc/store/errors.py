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
    `__cause__`."""


class SecretMissing(StoreError):
    """A secret the coordinator needs is not in `coordinator_secrets` (the schema is not migrated
    to revision 0005, or the row was deleted): the coordinator must not start without it."""
