"""The SQL store: group state, leases and the audit trail in PostgreSQL or SQLite (SQLAlchemy 2
Core, synchronous). `SqlStore` is the one interface the rest of the coordinator uses; it delegates
to the modules beside it: `engine` (the engine, transactions, retries), `leases`, `state_writes`
(a commit's records as a few statements) and `reads` (loading a group, listings, the audit trail).

Every commit is one transaction that first locks (FOR KEY SHARE: renewals are not blocked, a
takeover waits) and checks the caller's lease in SQL, against the database's clock, so a stale or
paused owner's writes are refused whatever its own clock says (DESIGN 3.16, 3.21). The records of
a commit are reduced to their net effect per row and written with a handful of statements
(upserts, deletes and one multi-row event insert), since this runs on every state-changing
heartbeat.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

from connect_protocol.safe_text import mask_urls_in
from coordinator_svc.core.model import GroupState, Tombstone
from coordinator_svc.core.records import Record

from . import schema, state_writes
from .acl_store import AclStore
from .engine import Database
from .errors import Lease, LeaseHolder, StoreUnavailable, failure_kind
from .features import FeatureStore
from .leases import Leases
from .migrate import normalize_url, read_revisions, upgrade_to_head
from .reads import GroupSummary, Reads
from .retention import RetentionStore
from .state_writes import Plan, WriteStatements
from .stored_sets import STORED_SET_FORMS

__all__ = ["GroupSummary", "SqlStore"]


class SqlStore:
    """Persistence of group state, group leases and the audit trail.

    Args:
        url: SQLAlchemy URL: `postgresql+psycopg://...` (production; plain `postgresql://` means
            psycopg 3) or `sqlite:///path.db` (embedded).
        owner_id: this process's identity in leases. Must be unique per process *lifetime*
            (e.g. host name plus a random suffix): a restarted process must not reuse the id of a
            paused predecessor.
        advertised_address: host:port other processes name in NOT_COORDINATOR / FindCoordinator.
        lease_ms: lease length; renew well inside it.
    """

    def __init__(
        self, url: str, owner_id: str, advertised_address: str, lease_ms: int = 10_000
    ) -> None:
        if lease_ms <= 0:
            raise ValueError("lease_ms must be positive")
        self.url = normalize_url(url)
        self.owner_id = owner_id
        self.advertised_address = advertised_address
        self.lease_ms = lease_ms
        self._db = Database(self.url, lease_ms)
        # Renewals on a pool of their own: never queued behind the group's state transactions
        # for a connection (SQLite: one writer anyway, the same engine).
        self._renewal_db = None if self._db.sqlite else Database(self.url, lease_ms, renewals=True)
        self._leases = Leases(
            self._db, owner_id, advertised_address, lease_ms, renewals=self._renewal_db
        )
        self._writes = WriteStatements.build(self._db)
        self._reads = Reads(self._db)
        #: The ACL table and the authorization events (`acl_store`).
        self.acls = AclStore(self._db)
        #: The cluster features' levels (`features`, migration 0010).
        self.features = FeatureStore(self._db)
        #: The audit exports' registrations and event pruning (`retention`, migration 0013).
        self.retention = RetentionStore(self._db, owner_id)

    def _transaction(self, *, write: bool) -> AbstractContextManager[Connection]:
        """One transaction on the store's database (for tests and tools that read it directly);
        connection-level failures become StoreUnavailable."""
        return self._db.transaction(write=write)

    # --- lifecycle ------------------------------------------------------------------------

    def migrate(self) -> None:
        """`alembic upgrade head` on this store's database."""
        try:
            upgrade_to_head(self.url)
        except (sa_exc.OperationalError, sa_exc.InterfaceError) as error:
            raise StoreUnavailable(
                f"database unavailable: {mask_urls_in(str(error.orig))}", failure_kind(error.orig)
            ) from error

    def schema_revisions(self) -> tuple[str, ...]:
        """The database's schema revisions (empty: never migrated), read on the store's own
        connections: what readiness probes. StoreUnavailable if the database does not answer."""
        return self._db.retrying(False, read_revisions)

    def close(self) -> None:
        self._db.dispose()
        if self._renewal_db is not None:
            self._renewal_db.dispose()

    def __enter__(self) -> SqlStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- group state ----------------------------------------------------------------------

    def group_ids(self) -> list[str]:
        return self._reads.group_ids()

    def count_groups(self) -> int:
        """How many groups the database holds (all coordinators')."""
        return self._reads.count_groups()

    def count_groups_created_by(self, principal: str) -> int:
        """How many groups `principal` created (`groups.created_by`; groups from before
        migration 0005 are nobody's)."""
        return self._reads.count_groups_created_by(principal)

    def existing_group_ids(self, group_ids: Sequence[str]) -> set[str]:
        """Which of `group_ids` exist: one statement per 10,000 ids, no lease taken (what
        DescribeGroups asks before it describes groups this process does not hold)."""
        return self._reads.existing_group_ids(group_ids)

    def stored_set_form(self) -> str:
        """How large resource sets are written: "ranges" or "plain" (`stored_sets`; the
        setting of migration 0008, "plain" where it is missing or unknown)."""
        form = self._reads.setting(schema.STORED_SET_FORM)
        return form if form in STORED_SET_FORMS else "plain"

    def config_digest_key(self) -> bytes:
        """The HMAC key of connector config digests, generated by migration 0005 and kept in
        the database (one per database). Raises SecretMissing (a schema not migrated, a
        deleted row) so that a coordinator never starts computing digests under another key."""
        return self._reads.config_digest_key()

    def group_summaries(self, after: str, limit: int) -> list[GroupSummary]:
        """One page of groups (ids after `after`, in order) with what ListGroups shows, computed
        by the database: epochs, member count, and how many members have not reached the
        target (so the group's state is known without loading it)."""
        return self._reads.group_summaries(after, limit)

    def groups_needing_owner(self, limit: int) -> list[str]:
        """Groups no process holds a live lease on that have timers to run (members, holds or
        a scheduled rebalance): the ones a process adopts. Idle groups are left alone (they
        are taken on their first request)."""
        return self._reads.groups_needing_owner(limit)

    def load_group(self, group_id: str) -> GroupState | None:
        """The group as last committed, rebuilt through `replay` (which checks the invariants),
        or None if it does not exist."""
        return self._reads.load_group(group_id)

    def load_tombstone(self, group_id: str) -> Tombstone | None:
        """What DeleteGroup kept of a deleted group (its counters), or None."""
        return self._reads.load_tombstone(group_id)

    def commit(self, lease: Lease, records: Sequence[Record]) -> None:
        """Write `records` in one transaction, if `lease` is still the group's live lease by the
        database's clock; otherwise write nothing and raise LeaseLost naming the holder.

        Records must all belong to the lease's group (ValueError otherwise). No records, or
        only volatile ones (a classic group's round, which is never persisted): nothing to
        write, returns at once without touching the database."""
        if not records:
            return
        plan = Plan.of(lease.group_id, records)
        if plan.empty:
            return

        def write(conn: Connection) -> None:
            self._leases.check(conn, lease)
            state_writes.write(conn, self._writes, plan)

        self._db.retrying(True, write)

    # --- leases ---------------------------------------------------------------------------

    def try_acquire(self, group_id: str, held: Lease | None = None) -> Lease | LeaseHolder:
        """Take the group's lease if nobody holds it or it lapsed by the database's clock, or
        extend `held` (same token) if that is still the group's live lease. Otherwise return the
        live holder: possibly this very owner id, when an earlier process with the same id holds
        a lease this one does not know of (it is not extended; it lapses, then a new tenure with
        a new token starts).

        A new tenure waits for the commits of the previous one in flight (`leases`); past the
        lock timeout it raises LeaseLocked (a StoreUnavailable naming the row's holder)."""
        return self._leases.try_acquire(group_id, held)

    def renew(self, leases: Iterable[Lease]) -> list[Lease]:
        """Extend every given lease that is still ours, same token, and not lapsed, in one
        transaction: on PostgreSQL one statement with two array parameters however many
        groups there are; on SQLite a statement per `leases.RENEW_CHUNK` groups. Returns the renewed
        ones with their new local expiry; the others are lost."""
        return self._leases.renew(leases)

    def release(self, lease: Lease) -> None:
        """Give the lease up now (graceful shutdown), so that another process can take over at
        once. Does nothing if it is no longer ours."""
        self._leases.release(lease)

    def forget(self, lease: Lease) -> None:
        """Give up the lease of a group that does not exist and delete its row (a read-only
        call on an unknown group leaves nothing behind). Does nothing if the lease is no
        longer ours or the group was created under it."""
        self._leases.forget(lease)

    def holder(self, group_id: str) -> LeaseHolder | None:
        """The group's live lease holder (possibly this process), or None."""
        return self._leases.holder(group_id)

    # --- audit and inspection -------------------------------------------------------------

    def list_events(
        self, group_id: str | None = None, after_id: int = 0, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Audit events with id > after_id, oldest first, optionally of one group."""
        return self._reads.list_events(group_id, after_id, limit)
