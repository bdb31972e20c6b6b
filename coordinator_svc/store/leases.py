"""Group leases: taking, renewing, releasing and naming the holder of a group's lease, and the
check a commit makes of its lease, all in SQL against the database's clock (DESIGN 3.16), with
the fencing token that a new tenure increments.

Leases never wait behind state (DESIGN 3.21). On PostgreSQL the row locks are chosen by its
row-lock conflict table: a commit's check takes FOR KEY SHARE on the lease row, held until the
commit ends; the renewal (and extending our own live lease) is an UPDATE of `lease_until` alone,
which takes FOR NO KEY UPDATE, and the two do not conflict, so a renewal never waits for a
commit of its group however long it runs (the token is no key column: no unique index names it).
A new tenure (another owner, or ours after it lapsed) first locks the row FOR UPDATE, which
conflicts with KEY SHARE: it waits for every commit that passed its check under the previous
tenure, then re-checks liveness by the database's clock in its upsert. So a takeover never
commits while such a commit is in flight (§3.16). The upsert alone would not do: INSERT ... ON
CONFLICT DO UPDATE of non-key columns only takes FOR NO KEY UPDATE. A takeover that waits for
the lock longer than `lock_timeout` raises LeaseLocked, naming the row's holder; a lease live
and held by another is answered from a plain read, without waiting for any lock. SQLite has one
writer at a time: there all of this is best effort, as every write transaction is exclusive.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from . import schema
from .engine import Database
from .errors import Lease, LeaseHolder, LeaseLocked, LeaseLost, StoreUnavailable

NO_TOKEN = -1
RENEW_CHUNK = 500  # leases renewed per statement on SQLite (its parameter limit is 32,766)

_L = schema.group_leases.c


@dataclass(frozen=True, slots=True)
class LeaseStatements:
    """The prepared lease statements of one store (parameters `p_*`, plus `Database.time_params`
    on SQLite)."""

    check: sa.Select[Any]  # the lease row, locked FOR KEY SHARE, and whether it is live
    extend: sa.Executable  # our live lease, same token: no new tenure; returns the token
    lock: sa.Select[Any]  # the lease row, FOR UPDATE: waits for commits under its tenure
    acquire: sa.Executable  # take or extend; returns the token, or no row if held by another
    holder_any: sa.Select[Any]
    holder_live: sa.Select[Any]
    renew: sa.Executable  # by an IN list of (group, token) keys
    renew_arrays: sa.Executable | None  # by two arrays of keys: PostgreSQL only
    release: sa.Executable
    forget: sa.Executable

    @staticmethod
    def build(db: Database) -> LeaseStatements:
        now, until = db.now(), db.until()
        t_leases = schema.group_leases
        check = (
            sa.select(
                _L.owner_id,
                _L.token,
                _L.advertised_address,
                _L.lease_until,
                (_L.lease_until > now).label("live"),
            )
            .where(_L.group_id == sa.bindparam("p_group"))
            .with_for_update(read=True, key_share=True)
        )
        lock = sa.select(_L.token).where(_L.group_id == sa.bindparam("p_group")).with_for_update()
        extend = (
            sa.update(t_leases)
            .where(
                _L.group_id == sa.bindparam("p_group"),
                _L.owner_id == sa.bindparam("p_owner"),
                _L.token == sa.bindparam("p_token", type_=sa.Integer()),
                _L.lease_until > now,
            )
            .values(lease_until=until)
            .returning(_L.token)
        )
        insert = db.insert(t_leases).values(
            group_id=sa.bindparam("p_group"),
            owner_id=sa.bindparam("p_owner"),
            advertised_address=sa.bindparam("p_address"),
            token=1,
            lease_until=until,
            acquired_at=now,
        )
        # Ours (this process, by owner id AND the token it holds: a restarted process reusing an
        # id must not extend its paused predecessor's tenure) and not lapsed.
        ours = (_L.owner_id == insert.excluded.owner_id) & (
            _L.token == sa.bindparam("p_token", type_=sa.Integer())
        )
        ours_and_live = ours & (_L.lease_until > now)
        acquire = insert.on_conflict_do_update(
            index_elements=[_L.group_id],
            set_={
                "owner_id": insert.excluded.owner_id,
                "advertised_address": insert.excluded.advertised_address,
                # A new tenure (other owner, or ours after it lapsed) gets a new fencing token.
                "token": sa.case((ours_and_live, _L.token), else_=_L.token + 1),
                "lease_until": insert.excluded.lease_until,
                "acquired_at": sa.case(
                    (ours_and_live, _L.acquired_at), else_=insert.excluded.acquired_at
                ),
            },
            where=ours | (_L.lease_until <= now),
        ).returning(_L.token)
        holder_any = sa.select(_L.owner_id, _L.advertised_address, _L.lease_until).where(
            _L.group_id == sa.bindparam("p_group")
        )
        renew = (
            sa.update(t_leases)
            .where(
                _L.owner_id == sa.bindparam("p_owner"),
                _L.lease_until > now,
                sa.tuple_(_L.group_id, _L.token).in_(sa.bindparam("p_keys", expanding=True)),
            )
            .values(lease_until=until)
            .returning(_L.group_id, _L.token)
        )
        renew_arrays = None
        if not db.sqlite:
            # The keys as two arrays: two parameters for any number of groups (an IN list of
            # tuples overflows PostgreSQL's parameter limit past ~30,000 groups).
            keys = sa.select(
                sa.func.unnest(sa.bindparam("p_groups", type_=postgresql.ARRAY(sa.String))).label(
                    "group_id"
                ),
                sa.func.unnest(
                    sa.bindparam("p_tokens", type_=postgresql.ARRAY(sa.BigInteger))
                ).label("token"),
            ).subquery("keys")
            renew_arrays = (
                sa.update(t_leases)
                .where(
                    _L.owner_id == sa.bindparam("p_owner"),
                    _L.lease_until > now,
                    _L.group_id == keys.c.group_id,
                    _L.token == keys.c.token,
                )
                .values(lease_until=until)
                .returning(_L.group_id, _L.token)
            )
        release = (
            sa.update(t_leases)
            .where(
                _L.group_id == sa.bindparam("p_group"),
                _L.owner_id == sa.bindparam("p_owner"),
                _L.token == sa.bindparam("p_token"),
                _L.lease_until > now,
            )
            .values(lease_until=now)
        )
        # The lease of a group that does not exist (a describe or FindCoordinator named it):
        # its row goes, so that read-only calls leave nothing behind. Only while ours, and only
        # if no group row was written under it.
        t_groups = schema.groups
        forget = sa.delete(t_leases).where(
            _L.group_id == sa.bindparam("p_group"),
            _L.owner_id == sa.bindparam("p_owner"),
            _L.token == sa.bindparam("p_token"),
            ~sa.exists().where(t_groups.c.group_id == sa.bindparam("p_group")),
        )
        return LeaseStatements(
            forget=forget,
            check=check,
            extend=extend,
            lock=lock,
            acquire=acquire,
            holder_any=holder_any,
            holder_live=holder_any.where(_L.lease_until > now),
            renew=renew,
            renew_arrays=renew_arrays,
            release=release,
        )


class Leases:
    """The leases one process (`owner_id`, reachable at `advertised_address`) takes and keeps;
    `SqlStore` documents each operation. `renewals` is the database (engine) renewals run on:
    a pool of their own on PostgreSQL (`Database(..., renewals=True)`)."""

    def __init__(
        self,
        db: Database,
        owner_id: str,
        advertised_address: str,
        lease_ms: int,
        renewals: Database | None = None,
    ) -> None:
        self._db = db
        self._renewals = renewals or db
        self._owner_id = owner_id
        self._advertised_address = advertised_address
        self._lease_ms = lease_ms
        self.sql = LeaseStatements.build(db)

    def _local_expiry(self, started: float) -> float:
        return started + self._lease_ms / 1000

    def try_acquire(self, group_id: str, held: Lease | None) -> Lease | LeaseHolder:
        started = time.monotonic()
        params = {
            "p_group": group_id,
            "p_owner": self._owner_id,
            "p_token": held.token if held is not None and held.group_id == group_id else NO_TOKEN,
            "p_address": self._advertised_address,
            **self._db.time_params(),
        }

        def extend(conn: Connection) -> Lease | None:
            token = conn.execute(self.sql.extend, params).scalar_one_or_none()
            if token is None:
                return None
            return Lease(group_id, self._owner_id, int(token), self._local_expiry(started))

        def acquire(conn: Connection) -> Lease | LeaseHolder:
            live = conn.execute(self.sql.holder_live, params).one_or_none()
            if live is not None:  # held by another: said at once, no lock waited for
                return LeaseHolder(live.owner_id, live.advertised_address, live.lease_until)
            # A new tenure waits for the commits that passed their check under the previous
            # one (their FOR KEY SHARE): see the module docstring. The upsert re-checks.
            conn.execute(self.sql.lock, params)
            token = conn.execute(self.sql.acquire, params).scalar_one_or_none()
            if token is not None:
                return Lease(group_id, self._owner_id, int(token), self._local_expiry(started))
            # Not taken: the conflicting row is locked by us, so this is its holder.
            row = conn.execute(self.sql.holder_any, params).one()
            return LeaseHolder(row.owner_id, row.advertised_address, row.lease_until)

        if params["p_token"] != NO_TOKEN:
            # Our own live lease is extended like a renewal: it waits for no commit of ours.
            extended = self._db.retrying(True, extend)
            if extended is not None:
                return extended
        try:
            return self._db.retrying(True, acquire)
        except StoreUnavailable as error:
            if error.kind != "lock timeout" or self._db.sqlite:
                raise
            raise LeaseLocked(group_id, self._last_holder(group_id)) from error

    def _last_holder(self, group_id: str) -> LeaseHolder | None:
        """Who the lease row names (as last committed, read without waiting for its lock), or
        None if that read fails too."""
        try:
            row = self._db.retrying(
                False,
                lambda conn: conn.execute(self.sql.holder_any, {"p_group": group_id}).one_or_none(),
            )
        except StoreUnavailable:
            return None
        if row is None:
            return None
        return LeaseHolder(row.owner_id, row.advertised_address, row.lease_until)

    def renew(self, leases: Iterable[Lease]) -> list[Lease]:
        keys = sorted((lease.group_id, lease.token) for lease in leases)
        if not keys:
            return []
        started = time.monotonic()
        renew_arrays = self.sql.renew_arrays

        def renew(conn: Connection) -> list[Any]:
            if renew_arrays is not None:
                params = {
                    "p_owner": self._owner_id,
                    "p_groups": [k[0] for k in keys],
                    "p_tokens": [k[1] for k in keys],
                }
                return list(conn.execute(renew_arrays, params).all())
            out: list[Any] = []
            for i in range(0, len(keys), RENEW_CHUNK):
                chunk = keys[i : i + RENEW_CHUNK]
                params = {"p_owner": self._owner_id, "p_keys": chunk, **self._db.time_params()}
                out.extend(conn.execute(self.sql.renew, params).all())
            return out

        renewed = self._renewals.retrying(True, renew)
        expiry = self._local_expiry(started)
        return sorted(
            (Lease(row.group_id, self._owner_id, int(row.token), expiry) for row in renewed),
            key=lambda lease: lease.group_id,
        )

    def release(self, lease: Lease) -> None:
        params = {
            "p_group": lease.group_id,
            "p_owner": lease.owner_id,
            "p_token": lease.token,
            **self._db.time_params(),
        }
        self._db.retrying(True, lambda conn: conn.execute(self.sql.release, params))

    def forget(self, lease: Lease) -> None:
        params = {"p_group": lease.group_id, "p_owner": lease.owner_id, "p_token": lease.token}
        self._db.retrying(True, lambda conn: conn.execute(self.sql.forget, params))

    def holder(self, group_id: str) -> LeaseHolder | None:
        params = {"p_group": group_id, **self._db.time_params()}
        row = self._db.retrying(
            False, lambda conn: conn.execute(self.sql.holder_live, params).one_or_none()
        )
        if row is None:
            return None
        return LeaseHolder(row.owner_id, row.advertised_address, row.lease_until)

    def check(self, conn: Connection, lease: Lease) -> None:
        """In a commit's transaction: lock the group's lease row FOR KEY SHARE (renewals go on;
        a new tenure waits for this transaction) and raise LeaseLost (naming the live holder, if
        any) unless `lease` is still its live lease by the database's clock."""
        row = conn.execute(
            self.sql.check, {"p_group": lease.group_id, **self._db.time_params()}
        ).one_or_none()
        if (
            row is not None
            and row.live
            and row.owner_id == lease.owner_id
            and row.token == lease.token
        ):
            return
        holder = None
        if row is not None and row.live:
            holder = LeaseHolder(row.owner_id, row.advertised_address, row.lease_until)
        raise LeaseLost(lease.group_id, holder)
