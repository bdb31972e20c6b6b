"""The SQL store: group state, leases and the audit trail in PostgreSQL or SQLite (SQLAlchemy 2
Core, synchronous).

Every commit is one transaction that first locks and checks the caller's lease in SQL, against the
database's clock, so a stale or paused owner's writes are refused whatever its own clock says
(DESIGN 3.16). The records of a commit are reduced to their net effect per row and written with a
handful of statements (upserts, deletes and one multi-row event insert), since this runs on every
state-changing heartbeat.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from coordinator_svc.core import replay
from coordinator_svc.core.model import Connector, GroupMeta, GroupState, Member, TargetAssignment
from coordinator_svc.core.records import (
    ConfigRecord,
    ConnectorRecord,
    ConnectorRemovedRecord,
    EventRecord,
    GroupMetaRecord,
    MemberRecord,
    MemberRemovedRecord,
    Record,
    TargetRecord,
)

from . import rows, schema
from .errors import Lease, LeaseHolder, LeaseLost, StoreUnavailable
from .migrate import normalize_url, upgrade_to_head

SQLITE_BUSY_TIMEOUT_MS = 10_000
POSTGRES_CONNECT_TIMEOUT_S = 5
MAX_LOCK_WAIT_MS = 5_000
NO_TOKEN = -1
RENEW_CHUNK = 500  # leases renewed per statement on SQLite (its parameter limit is 32,766)
# An empty assignment as each database prints the JSON of `ResourceSet().to_json()`.
_EMPTY_JSON_TEXT = {
    False: '{"tasks": [], "connectors": []}',
    True: '{"connectors": [], "tasks": []}',
}

_L = schema.group_leases.c


@dataclass(slots=True)
class _Plan:
    """The net effect of a commit's records, per row (later records win, as replay would)."""

    group_id: str
    meta: GroupMeta | None = None
    prepared_changed: bool = False
    configs: Mapping[str, str] | None = None
    target: TargetAssignment | None = None
    target_changed: frozenset[str] | None = None  # None: rewrite every member's row
    connectors: dict[str, Connector | None] = field(default_factory=dict)
    members: dict[str, Member | None] = field(default_factory=dict)
    epoch_only: set[str] = field(default_factory=set)  # members whose row needs only epochs
    events: list[EventRecord] = field(default_factory=list)

    @staticmethod
    def of(group_id: str, records: Iterable[Record]) -> _Plan:
        plan = _Plan(group_id)
        for record in records:
            record_group = (
                record.meta.group_id if isinstance(record, GroupMetaRecord) else record.group_id
            )
            if record_group != group_id:
                raise ValueError(
                    f"record for group {record_group!r} in a commit under the lease on {group_id!r}"
                )
            match record:
                case GroupMetaRecord(meta=meta, prepared_changed=prepared_changed):
                    plan.meta = meta
                    plan.prepared_changed = plan.prepared_changed or prepared_changed
                case TargetRecord(target=target, changed_members=changed):
                    if plan.target is None:
                        plan.target_changed = changed
                    elif plan.target_changed is not None and changed is not None:
                        plan.target_changed = plan.target_changed | changed
                    else:
                        plan.target_changed = None
                    plan.target = target
                case MemberRecord(member=member, epoch_only=epoch_only):
                    member_id = member.member_id
                    # Narrow only if every change of the member in this commit was.
                    narrow = epoch_only and (
                        member_id not in plan.members or member_id in plan.epoch_only
                    )
                    plan.members[member_id] = member
                    if narrow:
                        plan.epoch_only.add(member_id)
                    else:
                        plan.epoch_only.discard(member_id)
                case MemberRemovedRecord(member_id=member_id):
                    plan.members[member_id] = None
                    plan.epoch_only.discard(member_id)
                case ConnectorRecord(connector=connector):
                    plan.connectors[connector.name] = connector
                case ConnectorRemovedRecord(name=name):
                    plan.connectors[name] = None
                case ConfigRecord(configs=configs):
                    plan.configs = configs
                case EventRecord():
                    plan.events.append(record)
        return plan


def _upsert(
    insert: Callable[[sa.Table], Any], table: sa.Table, keep: Sequence[str] = ()
) -> sa.Executable:
    """INSERT ... ON CONFLICT (primary key) DO UPDATE SET every other column, except the columns
    in `keep`: those are neither sent (a new row gets their default) nor overwritten."""
    stmt = insert(table)
    if keep:
        sent: dict[str, Any] = {
            c.name: sa.bindparam(c.name) for c in table.columns if c.name not in keep
        }
        stmt = stmt.values(sent)
    keys = [c for c in table.primary_key.columns]
    return stmt.on_conflict_do_update(  # type: ignore[no-any-return]
        index_elements=keys,
        set_={
            c.name: stmt.excluded[c.name]
            for c in table.columns
            if not c.primary_key and c.name not in keep
        },
    )


def _plain(row: sa.RowMapping) -> dict[str, Any]:
    return dict(row)


T = TypeVar("T")
_PROGRESS = "coordinator_progress"


@dataclass(slots=True)
class _Progress:
    """What one transaction got done: statements completed, whether the connection died."""

    statements: int = 0
    lost_connection: bool = False


def _count_statements(engine: sa.Engine) -> None:
    @sa_event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Connection, *_args: Any) -> None:
        progress = conn.info.get(_PROGRESS)
        if progress is not None:
            progress.statements += 1


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """What ListGroups shows of a group, as the database has it."""

    group_id: str
    group_epoch: int
    assignment_epoch: int
    member_count: int
    unsettled_members: int  # members (not left) away from the target epoch or share


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
        self._lease = timedelta(milliseconds=lease_ms)
        backend = self.url.get_backend_name()
        if backend not in ("postgresql", "sqlite"):
            raise ValueError(f"unsupported database {backend!r}: use PostgreSQL or SQLite")
        self._sqlite = backend == "sqlite"
        self._engine = self._create_engine()
        self._build_statements()

    # --- engine ---------------------------------------------------------------------------

    def _create_engine(self) -> sa.Engine:
        if not self._sqlite:
            connect_args: dict[str, Any] = {"options": self._session_options()}
            if "connect_timeout" not in self.url.query:
                connect_args["connect_timeout"] = POSTGRES_CONNECT_TIMEOUT_S
            # No pool_pre_ping: it costs a round trip per transaction. A pooled connection that
            # turned out dead is retried instead (`_retrying`).
            engine = sa.create_engine(self.url, connect_args=connect_args)
            _count_statements(engine)
            return engine
        engine = sa.create_engine(
            self.url,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        )
        _count_statements(engine)

        @sa_event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            # Let SQLAlchemy's "begin" event issue BEGIN (pysqlite's own is deferred and lazy).
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
                cursor.execute("PRAGMA foreign_keys=ON")
            finally:
                cursor.close()

        @sa_event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            # Writers take the database's write lock up front: SQLite's stand-in for FOR UPDATE.
            immediate = conn.get_execution_options().get("sqlite_immediate", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine

    def _session_options(self) -> str:
        """PostgreSQL settings of every connection, so that no lock blocks takeover for long.

        A process paused (or cut off) inside a transaction keeps its row locks, the lease row's
        included, and a process waiting on them would wait for ever: the server ends such a
        session once it has been idle in its transaction for a lease length (its lease has
        lapsed by then anyway), and no statement waits for a lock longer than a fraction of the
        lease (the request then fails with COORDINATOR_NOT_AVAILABLE and is retried)."""
        lock_wait_ms = max(1, min(MAX_LOCK_WAIT_MS, self.lease_ms // 2))
        idle_ms = max(1, self.lease_ms)
        options = [
            f"-c lock_timeout={lock_wait_ms}",
            f"-c idle_in_transaction_session_timeout={idle_ms}",
        ]
        given = self.url.query.get("options")
        if isinstance(given, str) and given:
            options.insert(0, given)
        return " ".join(options)

    def _now(self) -> sa.ColumnElement[datetime]:
        """The database's current time: `clock_timestamp()` on PostgreSQL; on SQLite (no clock of
        its own that we trust to compare with stored text) Python's UTC now, bound as `now`."""
        if self._sqlite:
            return sa.bindparam("p_now", type_=schema.UtcDateTime())
        return sa.func.clock_timestamp(type_=schema.UtcDateTime())

    def _until(self) -> sa.ColumnElement[datetime]:
        if self._sqlite:
            return sa.bindparam("p_until", type_=schema.UtcDateTime())
        return self._now() + sa.bindparam("p_lease", self._lease, type_=sa.Interval())

    def _time_params(self) -> dict[str, Any]:
        if not self._sqlite:
            return {}
        now = datetime.now(UTC)
        return {"p_now": now, "p_until": now + self._lease}

    def _build_statements(self) -> None:
        insert: Callable[[sa.Table], Any] = sqlite.insert if self._sqlite else postgresql.insert
        now, until = self._now(), self._until()
        t_leases = schema.group_leases

        # Leases.
        self._lease_check = (
            sa.select(
                _L.owner_id,
                _L.token,
                _L.advertised_address,
                _L.lease_until,
                (_L.lease_until > now).label("live"),
            )
            .where(_L.group_id == sa.bindparam("p_group"))
            .with_for_update()
        )
        acquire = insert(t_leases).values(
            group_id=sa.bindparam("p_group"),
            owner_id=sa.bindparam("p_owner"),
            advertised_address=sa.bindparam("p_address"),
            token=1,
            lease_until=until,
            acquired_at=now,
        )
        # Ours (this process, by owner id AND the token it holds: a restarted process reusing an
        # id must not extend its paused predecessor's tenure) and not lapsed.
        ours = (_L.owner_id == acquire.excluded.owner_id) & (
            _L.token == sa.bindparam("p_token", type_=sa.Integer())
        )
        ours_and_live = ours & (_L.lease_until > now)
        self._acquire = acquire.on_conflict_do_update(
            index_elements=[_L.group_id],
            set_={
                "owner_id": acquire.excluded.owner_id,
                "advertised_address": acquire.excluded.advertised_address,
                # A new tenure (other owner, or ours after it lapsed) gets a new fencing token.
                "token": sa.case((ours_and_live, _L.token), else_=_L.token + 1),
                "lease_until": acquire.excluded.lease_until,
                "acquired_at": sa.case(
                    (ours_and_live, _L.acquired_at), else_=acquire.excluded.acquired_at
                ),
            },
            where=ours | (_L.lease_until <= now),
        ).returning(_L.token)
        self._holder_any = sa.select(_L.owner_id, _L.advertised_address, _L.lease_until).where(
            _L.group_id == sa.bindparam("p_group")
        )
        self._holder_live = self._holder_any.where(_L.lease_until > now)
        self._renew = (
            sa.update(t_leases)
            .where(
                _L.owner_id == sa.bindparam("p_owner"),
                _L.lease_until > now,
                sa.tuple_(_L.group_id, _L.token).in_(sa.bindparam("p_keys", expanding=True)),
            )
            .values(lease_until=until)
            .returning(_L.group_id, _L.token)
        )
        if not self._sqlite:
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
            self._renew_arrays = (
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
        g, t, m = schema.groups.c, schema.target_assignments.c, schema.members.c
        tmc = schema.target_assignment_members.c
        lease_free = ~sa.exists().where(_L.group_id == g.group_id, _L.lease_until > now)
        has_members = sa.exists().where(m.group_id == g.group_id)
        has_schedule = sa.exists().where(
            t.group_id == g.group_id, t.scheduled_rebalance_at_ms.is_not(None)
        )
        json_length = sa.func.json_array_length if self._sqlite else sa.func.jsonb_array_length
        self._needing_owner = (
            sa.select(g.group_id)
            .where(lease_free, has_members | has_schedule | (json_length(g.holds) > 0))
            .order_by(g.group_id)
            .limit(sa.bindparam("p_limit"))
        )
        page = (
            sa.select(g.group_id, g.group_epoch)
            .where(g.group_id > sa.bindparam("p_after"))
            .order_by(g.group_id)
            .limit(sa.bindparam("p_limit"))
            .subquery("page")
        )
        epoch = sa.func.coalesce(t.assignment_epoch, page.c.group_epoch)
        unsettled = (
            sa.select(sa.func.count())
            .select_from(
                schema.members.outerjoin(
                    schema.target_assignment_members,
                    (tmc.group_id == m.group_id) & (tmc.member_id == m.member_id),
                )
            )
            .where(
                m.group_id == page.c.group_id,
                m.state != "LEFT",
                (m.member_epoch != epoch)
                | (m.state != "STABLE")
                | (
                    sa.func.coalesce(
                        sa.cast(tmc.resources, sa.Text), sa.literal(_EMPTY_JSON_TEXT[self._sqlite])
                    )
                    != sa.cast(m.assigned, sa.Text)
                ),
            )
            .scalar_subquery()
        )
        members = sa.select(sa.func.count()).where(m.group_id == page.c.group_id).scalar_subquery()
        self._summaries = (
            sa.select(
                page.c.group_id,
                page.c.group_epoch,
                epoch.label("assignment_epoch"),
                members.label("members"),
                unsettled.label("unsettled"),
            )
            .select_from(page.outerjoin(schema.target_assignments, t.group_id == page.c.group_id))
            .order_by(page.c.group_id)
        )
        self._release = (
            sa.update(t_leases)
            .where(
                _L.group_id == sa.bindparam("p_group"),
                _L.owner_id == sa.bindparam("p_owner"),
                _L.token == sa.bindparam("p_token"),
                _L.lease_until > now,
            )
            .values(lease_until=now)
        )

        # State.
        self._upsert_group = _upsert(insert, schema.groups)
        # Most metadata changes leave the Prepare snapshot (as large as the group) as it was:
        # they neither send nor rewrite it.
        self._upsert_group_keep_prepared = _upsert(insert, schema.groups, keep=("prepared",))
        self._upsert_member = _upsert(insert, schema.members)
        self._upsert_connector = _upsert(insert, schema.connectors)
        self._upsert_target = _upsert(insert, schema.target_assignments)
        m, c = schema.members.c, schema.connectors.c
        self._update_member_epochs = (
            sa.update(schema.members)
            .where(m.group_id == sa.bindparam("p_group"), m.member_id == sa.bindparam("p_member"))
            .values(
                member_epoch=sa.bindparam("p_epoch"),
                previous_epoch=sa.bindparam("p_previous"),
                state=sa.bindparam("p_state"),
            )
        )
        self._delete_members = sa.delete(schema.members).where(
            m.group_id == sa.bindparam("p_group"),
            m.member_id.in_(sa.bindparam("p_ids", expanding=True)),
        )
        self._delete_connectors = sa.delete(schema.connectors).where(
            c.group_id == sa.bindparam("p_group"),
            c.name.in_(sa.bindparam("p_ids", expanding=True)),
        )
        tm, gc = schema.target_assignment_members, schema.group_configs
        self._delete_target_members = sa.delete(tm).where(tm.c.group_id == sa.bindparam("p_group"))
        self._delete_some_target_members = self._delete_target_members.where(
            tm.c.member_id.in_(sa.bindparam("p_ids", expanding=True))
        )
        self._insert_target_members = sa.insert(tm)
        self._delete_configs = sa.delete(gc).where(gc.c.group_id == sa.bindparam("p_group"))
        self._insert_configs = sa.insert(gc)
        self._insert_events = sa.insert(schema.events)

    @contextmanager
    def _transaction(
        self, *, write: bool, progress: _Progress | None = None
    ) -> Iterator[Connection]:
        """One transaction; connection-level failures become StoreUnavailable (nothing written).
        Reads see one snapshot (REPEATABLE READ on PostgreSQL, a read transaction on SQLite).
        `progress` counts the statements that completed (see `_retrying`)."""
        progress = progress or _Progress()
        try:
            with self._engine.connect() as conn:
                conn.info[_PROGRESS] = progress
                try:
                    if self._sqlite:
                        conn.execution_options(sqlite_immediate=write)
                    elif not write:
                        conn.execution_options(isolation_level="REPEATABLE READ")
                    with conn.begin():
                        yield conn
                finally:
                    conn.info.pop(_PROGRESS, None)
        except (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.InternalError) as error:
            # InternalError: e.g. the server ended a session left idle in its transaction.
            progress.lost_connection = bool(error.connection_invalidated)
            raise StoreUnavailable(f"database unavailable: {error.orig}") from error
        except (sa_exc.TimeoutError, sa_exc.DisconnectionError) as error:
            raise StoreUnavailable(f"database unavailable: {error}") from error
        except sa_exc.DBAPIError as error:
            if error.connection_invalidated:
                progress.lost_connection = True
                raise StoreUnavailable(f"database connection lost: {error.orig}") from error
            raise

    def _retrying(self, write: bool, body: Callable[[Connection], T]) -> T:
        """`body` in one transaction, run once more on a fresh connection if the pooled one was
        found dead before any statement completed (so nothing was written): what
        `pool_pre_ping` achieved, without its round trip on every transaction."""
        progress = _Progress()
        try:
            with self._transaction(write=write, progress=progress) as conn:
                return body(conn)
        except StoreUnavailable:
            if not (progress.lost_connection and progress.statements == 0):
                raise
        with self._transaction(write=write) as conn:
            return body(conn)

    # --- lifecycle ------------------------------------------------------------------------

    def migrate(self) -> None:
        """`alembic upgrade head` on this store's database."""
        try:
            upgrade_to_head(self.url)
        except (sa_exc.OperationalError, sa_exc.InterfaceError) as error:
            raise StoreUnavailable(f"database unavailable: {error.orig}") from error

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> SqlStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- group state ----------------------------------------------------------------------

    def group_ids(self) -> list[str]:
        g = schema.groups.c
        stmt = sa.select(g.group_id).order_by(g.group_id)

        def read(conn: Connection) -> list[str]:
            return [str(group_id) for group_id in conn.execute(stmt).scalars()]

        return self._retrying(False, read)

    def group_summaries(self, after: str, limit: int) -> list[GroupSummary]:
        """One page of groups (ids after `after`, in order) with what ListGroups shows, computed
        by the database: epochs, member count, and how many members have not reached the
        target (so the group's state is known without loading it)."""

        def read(conn: Connection) -> list[GroupSummary]:
            result = conn.execute(self._summaries, {"p_after": after, "p_limit": limit})
            return [
                GroupSummary(
                    row.group_id,
                    int(row.group_epoch),
                    int(row.assignment_epoch),
                    int(row.members),
                    int(row.unsettled),
                )
                for row in result
            ]

        return self._retrying(False, read)

    def groups_needing_owner(self, limit: int) -> list[str]:
        """Groups no process holds a live lease on that have timers to run (members, holds or
        a scheduled rebalance): the ones a process adopts. Idle groups are left alone (they
        are taken on their first request)."""

        def read(conn: Connection) -> list[str]:
            params = {"p_limit": limit, **self._time_params()}
            return [str(g) for g in conn.execute(self._needing_owner, params).scalars()]

        return self._retrying(False, read)

    def load_group(self, group_id: str) -> GroupState | None:
        """The group as last committed, rebuilt through `replay` (which checks the invariants),
        or None if it does not exist."""

        def read(conn: Connection) -> list[Record] | None:
            def select(table: sa.Table, *order: sa.ColumnElement[Any]) -> list[dict[str, Any]]:
                stmt = sa.select(table).where(table.c.group_id == group_id).order_by(*order)
                return [_plain(row) for row in conn.execute(stmt).mappings()]

            meta = select(schema.groups)
            if not meta:
                return None
            target = select(schema.target_assignments)
            target_members = select(
                schema.target_assignment_members,
                schema.target_assignment_members.c.member_id,
            )
            configs = select(schema.group_configs, schema.group_configs.c.name)
            connectors = select(schema.connectors, schema.connectors.c.name)
            members = select(schema.members, schema.members.c.member_id)
            return rows.group_records(
                meta[0], target[0] if target else None, target_members, configs, connectors, members
            )

        records = self._retrying(False, read)
        return None if records is None else replay.new_state(records)

    def commit(self, lease: Lease, records: Sequence[Record]) -> None:
        """Write `records` in one transaction, if `lease` is still the group's live lease by the
        database's clock; otherwise write nothing and raise LeaseLost naming the holder.

        Records must all belong to the lease's group (ValueError otherwise). No records: nothing
        to write, returns at once without touching the database."""
        if not records:
            return
        plan = _Plan.of(lease.group_id, records)

        def write(conn: Connection) -> None:
            self._check_lease(conn, lease)
            self._write(conn, plan)

        self._retrying(True, write)

    def _check_lease(self, conn: Connection, lease: Lease) -> None:
        row = conn.execute(
            self._lease_check, {"p_group": lease.group_id, **self._time_params()}
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

    def _write(self, conn: Connection, plan: _Plan) -> None:
        group_id = plan.group_id
        if plan.meta is not None:
            row = rows.group_row(plan.meta, with_prepared=plan.prepared_changed)
            if plan.prepared_changed:
                conn.execute(self._upsert_group, row)
            else:
                conn.execute(self._upsert_group_keep_prepared, row)
        removed_members = [m for m, v in plan.members.items() if v is None]
        if removed_members:
            conn.execute(self._delete_members, {"p_group": group_id, "p_ids": removed_members})
        removed_connectors = [c for c, v in plan.connectors.items() if v is None]
        if removed_connectors:
            conn.execute(
                self._delete_connectors, {"p_group": group_id, "p_ids": removed_connectors}
            )
        put_connectors = [
            rows.connector_row(group_id, v) for v in plan.connectors.values() if v is not None
        ]
        if put_connectors:
            conn.execute(self._upsert_connector, put_connectors)
        if plan.configs is not None:
            conn.execute(self._delete_configs, {"p_group": group_id})
            config_rows = rows.config_rows(group_id, plan.configs)
            if config_rows:
                conn.execute(self._insert_configs, config_rows)
        if plan.target is not None:
            conn.execute(self._upsert_target, rows.target_row(group_id, plan.target))
            changed = plan.target_changed
            if changed is None:
                conn.execute(self._delete_target_members, {"p_group": group_id})
            elif changed:
                ids = {"p_group": group_id, "p_ids": sorted(changed)}
                conn.execute(self._delete_some_target_members, ids)
            target_members = rows.target_member_rows(group_id, plan.target, changed)
            if target_members:
                conn.execute(self._insert_target_members, target_members)
        put_members = [
            rows.member_row(group_id, v)
            for v in plan.members.values()
            if v is not None and v.member_id not in plan.epoch_only
        ]
        if put_members:
            conn.execute(self._upsert_member, put_members)
        moved = [
            rows.member_epoch_row(group_id, v)
            for v in plan.members.values()
            if v is not None and v.member_id in plan.epoch_only
        ]
        if moved:
            conn.execute(self._update_member_epochs, moved)
        if plan.events:
            # executemany: psycopg 3 sends the rows in one pipeline.
            conn.execute(self._insert_events, [rows.event_row(e) for e in plan.events])

    # --- leases ---------------------------------------------------------------------------

    def _local_expiry(self, started: float) -> float:
        return started + self.lease_ms / 1000

    def try_acquire(self, group_id: str, held: Lease | None = None) -> Lease | LeaseHolder:
        """Take the group's lease if nobody holds it or it lapsed by the database's clock, or
        extend `held` (same token) if that is still the group's live lease. Otherwise return the
        live holder: possibly this very owner id, when an earlier process with the same id holds
        a lease this one does not know of (it is not extended; it lapses, then a new tenure with
        a new token starts)."""
        started = time.monotonic()
        params = {
            "p_group": group_id,
            "p_owner": self.owner_id,
            "p_token": held.token if held is not None and held.group_id == group_id else NO_TOKEN,
            "p_address": self.advertised_address,
            **self._time_params(),
        }

        def acquire(conn: Connection) -> Lease | LeaseHolder:
            token = conn.execute(self._acquire, params).scalar_one_or_none()
            if token is not None:
                return Lease(group_id, self.owner_id, int(token), self._local_expiry(started))
            # Not taken: the conflicting row is locked by the upsert, so this is its holder.
            row = conn.execute(self._holder_any, params).one()
            return LeaseHolder(row.owner_id, row.advertised_address, row.lease_until)

        return self._retrying(True, acquire)

    def renew(self, leases: Iterable[Lease]) -> list[Lease]:
        """Extend every given lease that is still ours, same token, and not lapsed, in one
        transaction: on PostgreSQL one statement with two array parameters however many
        groups there are; on SQLite a statement per RENEW_CHUNK groups. Returns the renewed
        ones with their new local expiry; the others are lost."""
        keys = sorted((lease.group_id, lease.token) for lease in leases)
        if not keys:
            return []
        started = time.monotonic()

        def renew(conn: Connection) -> list[Any]:
            if not self._sqlite:
                params = {
                    "p_owner": self.owner_id,
                    "p_groups": [k[0] for k in keys],
                    "p_tokens": [k[1] for k in keys],
                }
                return list(conn.execute(self._renew_arrays, params).all())
            out: list[Any] = []
            for i in range(0, len(keys), RENEW_CHUNK):
                chunk = keys[i : i + RENEW_CHUNK]
                params = {"p_owner": self.owner_id, "p_keys": chunk, **self._time_params()}
                out.extend(conn.execute(self._renew, params).all())
            return out

        renewed = self._retrying(True, renew)
        expiry = self._local_expiry(started)
        return sorted(
            (Lease(row.group_id, self.owner_id, int(row.token), expiry) for row in renewed),
            key=lambda lease: lease.group_id,
        )

    def release(self, lease: Lease) -> None:
        """Give the lease up now (graceful shutdown), so that another process can take over at
        once. Does nothing if it is no longer ours."""
        params = {
            "p_group": lease.group_id,
            "p_owner": lease.owner_id,
            "p_token": lease.token,
            **self._time_params(),
        }
        self._retrying(True, lambda conn: conn.execute(self._release, params))

    def holder(self, group_id: str) -> LeaseHolder | None:
        """The group's live lease holder (possibly this process), or None."""
        params = {"p_group": group_id, **self._time_params()}
        row = self._retrying(
            False, lambda conn: conn.execute(self._holder_live, params).one_or_none()
        )
        if row is None:
            return None
        return LeaseHolder(row.owner_id, row.advertised_address, row.lease_until)

    # --- audit and inspection -------------------------------------------------------------

    def list_events(
        self, group_id: str | None = None, after_id: int = 0, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Audit events with id > after_id, oldest first, optionally of one group."""
        e = schema.events.c
        stmt = sa.select(schema.events).where(e.id > after_id).order_by(e.id)
        if group_id is not None:
            stmt = stmt.where(e.group_id == group_id)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._transaction(write=False) as conn:
            return [_plain(row) for row in conn.execute(stmt).mappings()]
