"""The store's database: the engine for PostgreSQL or SQLite with its session options and
connect/begin hooks, the database's clock as SQL, and how every store operation runs (`transaction`,
`retrying`: connection failures become StoreUnavailable, a dead pooled connection is retried once,
and a failure while committing is marked as of unknown outcome).

Every wait is bounded by the lease (DESIGN 3.16, 3.21): the connect timeout, the lock wait and, on
the lease renewal's own small pool (`Database(..., renewals=True)`), how long sent bytes may stay
unacknowledged, so that one renewal attempt during an outage fails in time for the next one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import orjson
import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from connect_protocol.safe_text import mask_urls_in

from . import schema
from .errors import StoreUnavailable, failure_kind

SQLITE_BUSY_TIMEOUT_MS = 10_000
POSTGRES_CONNECT_TIMEOUT_S = 5
#: libpq's smallest connect timeout (it rounds anything lower up to 2 s).
MIN_CONNECT_TIMEOUT_S = 2
MAX_LOCK_WAIT_MS = 5_000

T = TypeVar("T")
_PROGRESS = "coordinator_progress"


@dataclass(slots=True)
class _Progress:
    """What one transaction got done: statements completed, whether the connection died, and
    whether its COMMIT was under way (a failure then leaves the outcome unknown)."""

    statements: int = 0
    lost_connection: bool = False
    committing: bool = False


def _detail(what: str, error: BaseException | None) -> str:
    """A failure's detail for the log: the driver's text, any URL or password in it masked."""
    return f"{what}: {mask_urls_in(str(error))}"


def _count_statements(engine: sa.Engine) -> None:
    @sa_event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Connection, *_args: Any) -> None:
        progress = conn.info.get(_PROGRESS)
        if progress is not None:
            progress.statements += 1


def _session_options(url: sa.URL, lease_ms: int) -> str:
    """PostgreSQL settings of every connection, so that no lock blocks takeover for long.

    A process paused (or cut off) inside a transaction keeps its row locks, the lease row's
    included, and a process waiting on them would wait for ever: the server ends such a
    session once it has been idle in its transaction for a lease length (its lease has
    lapsed by then anyway), and no statement waits for a lock longer than a fraction of the
    lease (the request then fails with COORDINATOR_NOT_AVAILABLE and is retried)."""
    lock_wait_ms = max(1, min(MAX_LOCK_WAIT_MS, lease_ms // 2))
    idle_ms = max(1, lease_ms)
    options = [
        f"-c lock_timeout={lock_wait_ms}",
        f"-c idle_in_transaction_session_timeout={idle_ms}",
    ]
    given = url.query.get("options")
    if isinstance(given, str) and given:
        options.insert(0, given)
    return " ".join(options)


def connect_timeout_s(lease_ms: int) -> int:
    """How long connecting may take: half the lease (so that a renewal attempt that meets an
    unanswering server leaves time for another within the lease), between libpq's minimum and
    POSTGRES_CONNECT_TIMEOUT_S."""
    return max(MIN_CONNECT_TIMEOUT_S, min(POSTGRES_CONNECT_TIMEOUT_S, lease_ms // 2000))


def json_dumps(value: Any) -> bytes:
    """JSON for PostgreSQL's JSONB columns, written by orjson: member and target rows carry a
    member's whole share (10,000 tasks and their tokens), written under the group's lock, where
    the standard library's encoder was an eighth of the coordinator's time (issue 24). The
    result parses to what `json.dumps` writes (JSONB keeps no formatting); a value orjson does
    not take (a tuple subclass, an integer beyond 64 bits) is written by `json.dumps`."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(value).encode()


def json_loads(data: bytes | bytearray | memoryview | str) -> Any:
    """JSON read back from PostgreSQL (orjson; what it refuses, `json.loads` reads)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(bytes(data) if isinstance(data, memoryview) else data)


def _create_engine(url: sa.URL, lease_ms: int, renewals: bool = False) -> sa.Engine:
    """The engine for `url` (PostgreSQL or SQLite), counting the statements of each transaction
    (see `Database.retrying`). `renewals`: the lease renewer's own pool (one connection, another
    while it is replaced), whose sent bytes may stay unacknowledged for a lease at most (a
    partition ends the attempt instead of blocking the renewer past the lease)."""
    if url.get_backend_name() != "sqlite":
        connect_args: dict[str, Any] = {"options": _session_options(url, lease_ms)}
        if "connect_timeout" not in url.query:
            connect_args["connect_timeout"] = connect_timeout_s(lease_ms)
        pool: dict[str, Any] = {}
        if renewals:
            pool = {"pool_size": 1, "max_overflow": 1, "pool_timeout": lease_ms / 1000}
            if "tcp_user_timeout" not in url.query:
                connect_args["tcp_user_timeout"] = max(1000, lease_ms)
        # No pool_pre_ping: it costs a round trip per transaction. A pooled connection that
        # turned out dead is retried instead (`Database.retrying`).
        # SQLite keeps the standard encoder: it stores JSON as text, which `reads` compares.
        engine = sa.create_engine(
            url,
            connect_args=connect_args,
            json_serializer=json_dumps,
            json_deserializer=json_loads,
            **pool,
        )
        _count_statements(engine)
        return engine
    engine = sa.create_engine(
        url,
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


class Database:
    """One store's engine and the dialect-dependent pieces its statements are built from.

    Args:
        url: a normalized SQLAlchemy URL (`migrate.normalize_url`).
        lease_ms: the lease length: bounds PostgreSQL's lock and idle-in-transaction waits and
            is the length `until` adds to the database's clock.
        renewals: the engine of the lease renewer alone (a pool of its own, so that a renewal
            never waits for a connection behind the group's state transactions).
    """

    def __init__(self, url: sa.URL, lease_ms: int, renewals: bool = False) -> None:
        backend = url.get_backend_name()
        if backend not in ("postgresql", "sqlite"):
            raise ValueError(f"unsupported database {backend!r}: use PostgreSQL or SQLite")
        self.url = url
        self.lease = timedelta(milliseconds=lease_ms)
        self.sqlite = backend == "sqlite"
        self.engine = _create_engine(url, lease_ms, renewals)

    def insert(self, table: sa.Table) -> Any:
        """The dialect's INSERT of `table` (the one with `on_conflict_do_update`)."""
        return sqlite.insert(table) if self.sqlite else postgresql.insert(table)

    def now(self) -> sa.ColumnElement[datetime]:
        """The database's current time: `clock_timestamp()` on PostgreSQL; on SQLite (no clock of
        its own that we trust to compare with stored text) Python's UTC now, bound as `p_now`
        (see `time_params`)."""
        if self.sqlite:
            return sa.bindparam("p_now", type_=schema.UtcDateTime())
        return sa.func.clock_timestamp(type_=schema.UtcDateTime())

    def until(self) -> sa.ColumnElement[datetime]:
        """The end of a lease taken or renewed now."""
        if self.sqlite:
            return sa.bindparam("p_until", type_=schema.UtcDateTime())
        return self.now() + sa.bindparam("p_lease", self.lease, type_=sa.Interval())

    def time_params(self) -> dict[str, Any]:
        """The parameters `now` and `until` need: on SQLite, Python's clock read at this call."""
        if not self.sqlite:
            return {}
        now = datetime.now(UTC)
        return {"p_now": now, "p_until": now + self.lease}

    @contextmanager
    def transaction(
        self, *, write: bool, progress: _Progress | None = None
    ) -> Iterator[Connection]:
        """One transaction; connection-level failures become StoreUnavailable (nothing written).
        Reads see one snapshot (REPEATABLE READ on PostgreSQL, a read transaction on SQLite).
        `progress` counts the statements that completed (see `retrying`)."""
        progress = progress or _Progress()
        try:
            with self.engine.connect() as conn:
                conn.info[_PROGRESS] = progress
                try:
                    if self.sqlite:
                        conn.execution_options(sqlite_immediate=write)
                    elif not write:
                        conn.execution_options(isolation_level="REPEATABLE READ")
                    with conn.begin():
                        yield conn
                        progress.committing = True  # COMMIT follows, as the block ends
                finally:
                    conn.info.pop(_PROGRESS, None)
        except (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.InternalError) as error:
            # InternalError: e.g. the server ended a session left idle in its transaction.
            progress.lost_connection = bool(error.connection_invalidated)
            kind = failure_kind(error.orig)
            if kind == "unavailable" and error.connection_invalidated:
                kind = "connection lost"
            raise StoreUnavailable(
                _detail("database unavailable", error.orig), kind, progress.committing
            ) from error
        except (sa_exc.TimeoutError, sa_exc.DisconnectionError) as error:
            kind = "pool exhausted" if isinstance(error, sa_exc.TimeoutError) else "connection lost"
            raise StoreUnavailable(
                _detail("database unavailable", error), kind, progress.committing
            ) from error
        except sa_exc.DBAPIError as error:
            if error.connection_invalidated:
                progress.lost_connection = True
                raise StoreUnavailable(
                    _detail("database connection lost", error.orig),
                    "connection lost",
                    progress.committing,
                ) from error
            raise

    def retrying(self, write: bool, body: Callable[[Connection], T]) -> T:
        """`body` in one transaction, run once more on a fresh connection if the pooled one was
        found dead before any statement completed (so nothing was written): what
        `pool_pre_ping` achieved, without its round trip on every transaction."""
        progress = _Progress()
        try:
            with self.transaction(write=write, progress=progress) as conn:
                return body(conn)
        except StoreUnavailable:
            if not (progress.lost_connection and progress.statements == 0):
                raise
        with self.transaction(write=write) as conn:
            return body(conn)

    def dispose(self) -> None:
        self.engine.dispose()
