"""Reading the coordinator's tables over Spark JDBC.

The database is named by the coordinator's own SQLAlchemy URL (`postgresql+psycopg://...`,
`sqlite:///coordinator.db`) or by a JDBC URL. PostgreSQL is read through the PostgreSQL JDBC
driver, the embedded SQLite file through Xerial's; neither is downloaded: the jars come from
Debian's `libpostgresql-jdbc-java` and `libxerial-sqlite-jdbc-java` (`/usr/share/java/`) or from
`spark-submit --jars`.

Every table is read with an explicit column list and an explicit Spark type per column
(`customSchema`), so both databases give the same DataFrame schema: JSON columns arrive as JSON
text, timestamps as UTC timestamps (SQLite stores them as text), byte columns as binary. Large
tables are read in parallel partitions, never through the driver: the event table by ranges of
its id (`partitionColumn` / `lowerBound` / `upperBound` / `numPartitions`), other large
PostgreSQL tables by hash predicates on their key.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import reduce
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connect_protocol.safe_text import SECRET_NAME, mask_url

Dialect = Literal["postgresql", "sqlite"]

DRIVERS: dict[Dialect, str] = {
    "postgresql": "org.postgresql.Driver",
    "sqlite": "org.sqlite.JDBC",
}

DEFAULT_JDBC_JARS = ("/usr/share/java/postgresql.jar", "/usr/share/java/sqlite-jdbc.jar")
"""Where Debian's libpostgresql-jdbc-java and libxerial-sqlite-jdbc-java put their jars."""


class SourceError(ValueError):
    """The database URL cannot be read over JDBC."""


@dataclass(frozen=True)
class Source:
    """A database to read, as Spark's JDBC data source needs it.

    Attributes:
        dialect: `postgresql` or `sqlite`.
        jdbc_url: the JDBC URL, without credentials or any other secret parameter.
        user: database user (PostgreSQL), or None.
        password: its password, or None.
        display: the URL with its secrets hidden, for logs and the summary.
        secrets: the URL's other secret parameters (`sslpassword`, ...), passed to the driver
            as connection properties rather than in the URL (which Spark shows in its plans).
    """

    dialect: Dialect
    jdbc_url: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    display: str = ""
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def driver(self) -> str:
        return DRIVERS[self.dialect]

    def options(self) -> dict[str, str]:
        """Connection options common to every read."""
        opts = {**self.secrets, "url": self.jdbc_url, "driver": self.driver}
        if self.user is not None:
            opts["user"] = self.user
        if self.password is not None:
            opts["password"] = self.password
        return opts


def source_from_url(url: str) -> Source:
    """A `Source` from a SQLAlchemy URL (as `coordinator-svc serve --database-url` takes) or a
    JDBC URL (`jdbc:postgresql://...`, `jdbc:sqlite:/path.db`)."""
    if url.startswith("jdbc:"):
        return _from_jdbc(url)
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme in ("postgresql", "postgres"):
        if not parts.hostname:
            raise SourceError(
                f"{_redact(url)}: name a TCP host; the JDBC driver cannot use a Unix socket"
            )
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        port = f":{parts.port}" if parts.port else ""
        query, secrets = _split_secrets(parts.query)
        jdbc = f"jdbc:postgresql://{host}{port}{parts.path or '/'}"
        if query:
            jdbc += "?" + urlencode(query)
        params = dict(parse_qsl(parts.query))
        user = unquote(parts.username) if parts.username else params.get("user")
        password = unquote(parts.password) if parts.password else params.get("password")
        return Source("postgresql", jdbc, user, password, _redact(url), secrets)
    if scheme == "sqlite":
        # sqlite:///relative.db and sqlite:////absolute.db, as SQLAlchemy reads them.
        path = url.split("://", 1)[1]
        if not path.startswith("/") or path in ("/", "/:memory:"):
            raise SourceError(f"{url}: an SQLite URL must name a file (sqlite:///path.db)")
        path = path[1:].split("?", 1)[0]
        return Source("sqlite", f"jdbc:sqlite:{os.path.abspath(path)}", display=url)
    raise SourceError(f"{_redact(url)}: unsupported database URL (PostgreSQL or SQLite only)")


def _from_jdbc(url: str) -> Source:
    if url.startswith("jdbc:postgresql:"):
        base, _, raw_query = url.partition("?")
        query, secrets = _split_secrets(raw_query)
        params = dict(parse_qsl(raw_query))
        jdbc = base + ("?" + urlencode(query) if query else "")
        return Source(
            "postgresql", jdbc, params.get("user"), params.get("password"), _redact(url), secrets
        )
    if url.startswith("jdbc:sqlite:"):
        return Source("sqlite", url, display=url)
    raise SourceError(f"{_redact(url)}: unsupported JDBC URL (PostgreSQL or SQLite only)")


def _split_secrets(raw_query: str) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """A URL query's parameters without `user`, `password` and any other secret (kept apart:
    they go to the driver as connection properties), and those secrets but the two."""
    query: list[tuple[str, str]] = []
    secrets: dict[str, str] = {}
    for key, value in parse_qsl(raw_query):
        if key in ("user", "password"):
            continue
        if SECRET_NAME.search(key):
            secrets[key] = value
        else:
            query.append((key, value))
    return query, secrets


def _redact(url: str) -> str:
    return mask_url(url)


def with_credentials(source: Source, user: str | None, password: str | None) -> Source:
    """The source with a user and password set (those given override the URL's)."""
    return Source(
        source.dialect,
        source.jdbc_url,
        user if user is not None else source.user,
        password if password is not None else source.password,
        source.display,
        source.secrets,
    )


# --- the tables ---------------------------------------------------------------------------

ColumnKind = Literal["string", "int", "long", "json", "time", "binary", "boolean"]

_SPARK_TYPES: dict[ColumnKind, str] = {
    "string": "STRING",
    "int": "INT",
    "long": "BIGINT",
    "json": "STRING",
    "time": "TIMESTAMP",
    "binary": "BINARY",
    "boolean": "BOOLEAN",
}


@dataclass(frozen=True)
class TableSpec:
    """One coordinator table: its columns (name, kind) in order, and the key its parallel
    partitions are hashed on (PostgreSQL)."""

    name: str
    columns: tuple[tuple[str, ColumnKind], ...]
    hash_key: str = "group_id"

    def column_names(self) -> list[str]:
        return [name for name, _ in self.columns]

    def ddl(self) -> str:
        """The columns as the export's DataFrames type them (timestamps as timestamps)."""
        return ", ".join(f"{name} {_SPARK_TYPES[kind]}" for name, kind in self.columns)

    def custom_schema(self, dialect: Dialect) -> str:
        """Spark's `customSchema`: every column typed. SQLite timestamps are text; PostgreSQL
        JSON arrives as its UTF-8 bytes (`_finish` makes them strings without decoding and
        re-encoding them, which is most of the JDBC driver's work on the events)."""
        out = []
        for name, kind in self.columns:
            if kind == "time" and dialect == "sqlite":
                spark_type = "STRING"
            elif kind == "json" and dialect == "postgresql":
                spark_type = "BINARY"
            else:
                spark_type = _SPARK_TYPES[kind]
            out.append(f"{name} {spark_type}")
        return ", ".join(out)


GROUPS = TableSpec(
    "groups",
    (
        ("group_id", "string"),
        ("group_type", "string"),
        ("group_epoch", "int"),
        ("created_at_ms", "long"),
        ("assignor_member_id", "string"),
        ("compute_requested_epoch", "int"),
        ("excluded_assignors", "json"),
        ("compute_not_before_ms", "long"),
        ("last_assignment_error", "int"),
        ("last_assignment_error_message", "string"),
        ("prepared", "json"),
        ("holds", "json"),
        ("session_floor_ms", "int"),
        ("session_floor_until_ms", "long"),
        ("last_fencing_token", "long"),
        ("created_by", "string"),
        ("compute_requested_at_ms", "long"),
        # Classic groups (migration 0007, DESIGN 3.19); NULL for connect groups.
        ("classic_state", "string"),
        ("protocol_name", "string"),
        ("leader_id", "string"),
    ),
)
GROUP_LEASES = TableSpec(
    "group_leases",
    (
        ("group_id", "string"),
        ("owner_id", "string"),
        ("advertised_address", "string"),
        ("token", "long"),
        ("lease_until", "time"),
        ("acquired_at", "time"),
    ),
)
MEMBERS = TableSpec(
    "members",
    (
        ("group_id", "string"),
        ("member_id", "string"),
        ("instance_id", "string"),
        ("url", "string"),
        ("member_epoch", "int"),
        ("previous_epoch", "int"),
        ("state", "string"),
        ("rebalance_timeout_ms", "int"),
        ("assignors", "json"),
        ("assigned", "json"),
        ("pending_revocation", "json"),
        ("principal", "string"),
        ("fencing_tokens", "json"),
        ("last_grant_at_ms", "long"),
        ("stable_since_epoch", "int"),
        # Classic members (migration 0007, DESIGN 3.19); NULL for connect-protocol members.
        ("group_protocol", "string"),
        ("classic_protocols", "json"),
        ("session_timeout_ms", "int"),
        ("last_joined_generation", "int"),
        ("classic_assignment", "json"),
        # Connector lifecycle (migration 0011, DESIGN 3.20).
        ("lifecycle_revision", "long"),
    ),
    hash_key="member_id",
)
CONNECTORS = TableSpec(
    "connectors",
    (
        ("group_id", "string"),
        ("name", "string"),
        ("task_count", "int"),
        ("config", "json"),
        ("config_digest", "string"),
        # Target states (migration 0012, DESIGN 3.20).
        ("target_state", "string"),
    ),
    hash_key="name",
)
"""Never read whole by the export: the catalogue (`snapshot_sql.CATALOGUE`) carries the digest
of each config and its values only when asked."""
RESOURCE_STATUSES = TableSpec(
    "resource_statuses",
    (
        ("group_id", "string"),
        ("connector", "string"),
        ("task", "int"),
        ("state", "string"),
        ("member_id", "string"),
        ("fencing_token", "long"),
        ("restart_count", "long"),
        ("trace", "string"),
        ("trace_digest", "string"),
        ("reported_at_ms", "long"),
        # Automatic restarts (migration 0012, DESIGN 3.20).
        ("auto_attempts", "int"),
        ("auto_restart_at_ms", "long"),
        ("auto_exhausted", "boolean"),
    ),
    hash_key="connector",
)
"""What each resource's holder last reported (migration 0011). Never read whole by the export:
the snapshot's `resource_statuses` (`snapshot_sql.RESOURCE_STATUSES`) has each trace's stored
keyed digest, never its text (the trace column is not even read)."""
TARGET_ASSIGNMENTS = TableSpec(
    "target_assignments",
    (
        ("group_id", "string"),
        ("assignment_epoch", "int"),
        ("assignor_state", "binary"),
        ("scheduled_rebalance_at_ms", "long"),
        ("lost_work_rebalance_at_ms", "long"),
        ("next_wave_at_ms", "long"),
    ),
)
TARGET_ASSIGNMENT_MEMBERS = TableSpec(
    "target_assignment_members",
    (
        ("group_id", "string"),
        ("member_id", "string"),
        ("resources", "json"),
        ("version", "int"),
        ("metadata", "binary"),
    ),
    hash_key="member_id",
)
GROUP_CONFIGS = TableSpec(
    "group_configs",
    (("group_id", "string"), ("name", "string"), ("value", "string")),
)
GROUP_TOMBSTONES = TableSpec(
    "group_tombstones",
    (
        ("group_id", "string"),
        ("group_epoch", "int"),
        ("last_fencing_token", "long"),
        ("deleted_at", "time"),
        ("deleted_by", "string"),
    ),
)
"""What DeleteGroup kept of each deleted group (migration 0013, DESIGN 3.20): its last epoch and
fencing token (a group re-created under the id continues both), who deleted it and when."""
EVENTS = TableSpec(
    "events",
    (
        ("id", "long"),
        ("occurred_at", "time"),
        ("at_ms", "long"),
        ("group_id", "string"),
        ("group_epoch", "int"),
        ("event_type", "string"),
        ("member_id", "string"),
        ("payload", "json"),
    ),
)

STATE_TABLES = (
    GROUPS,
    GROUP_LEASES,
    MEMBERS,
    CONNECTORS,
    TARGET_ASSIGNMENTS,
    TARGET_ASSIGNMENT_MEMBERS,
    GROUP_CONFIGS,
    RESOURCE_STATUSES,
    GROUP_TOMBSTONES,
)
"""Every table but the events: read on every run (the snapshot; `CONNECTORS` and
`RESOURCE_STATUSES` without their secret columns), and counted to size the parallel reads."""

_AUTO_RESTARTS = (
    "the automatic restarts' bookkeeping (migration 0012: consecutive attempts, the pending "
    "one's time, whether they gave up), the coordinator's timer state: each restart it "
    "requested is an event (CONNECTOR_RESTART_REQUESTED, reason auto, with the attempt), and "
    "the snapshot's restart_count counts every restart; `coordinator-svc status` shows the rest"
)
WITHHELD: Mapping[tuple[str, str], str] = {
    ("coordinator_settings", "*"): (
        "the coordinators' operational settings (migration 0008: how large sets are stored), "
        "not group state; `coordinator-svc settings show` prints them"
    ),
    ("features", "*"): (
        "cluster feature levels (migration 0010: group.version), not group state: "
        "`coordinator-svc features describe` shows them, and each change is an event "
        '(FEATURE_UPDATED; group id "")'
    ),
    ("coordinator_secrets", "*"): (
        "the config digest key (migration 0005): with it anyone could confirm a guessed "
        "config value against the digests the export writes"
    ),
    ("connectors", "config"): (
        "connector config values carry secrets (passwords, keys): the catalogue has their "
        "digest, and the values only with --include-config-values"
    ),
    ("resource_statuses", "trace"): (
        "a FAILED resource's trace is the worker's error output, which may carry secrets "
        "(a connection URL with its password, a config value in an exception) or personal "
        "data. The export never reads it: the snapshot has the digest the coordinator stored "
        "beside it (trace_digest), an HMAC under the database's key as config digests are, "
        "equal to its STATUS_CHANGED event's (rows and events join on it), against which "
        "nobody without the key can confirm a guessed trace; `coordinator-svc status` or "
        "DescribeGroups show the text to those allowed to describe the group"
    ),
    ("resource_statuses", "auto_attempts"): _AUTO_RESTARTS,
    ("resource_statuses", "auto_restart_at_ms"): _AUTO_RESTARTS,
    ("resource_statuses", "auto_exhausted"): _AUTO_RESTARTS,
    ("target_assignments", "assignor_state"): (
        "the client assignor's opaque state (up to --max-assignor-state-bytes per group), "
        "meaningful only to the assignor's code; DescribeGroups shows it"
    ),
    ("target_assignment_members", "metadata"): (
        "the client assignor's opaque per-member bytes, meaningful only to the assignor's code"
    ),
    ("acls", "*"): (
        "cluster-wide authorization rules, not group state: `coordinator-svc acl list` shows "
        'them, and each change is an event (ACL_ADDED, ACL_REMOVED, ACL_CHANGED; group id "")'
    ),
    ("audit_export_progress", "*"): (
        "the audit exports' own progress (migration 0013: each committed run's event range, "
        "appended by the export itself for the event pruner), which the output already holds "
        "as its watermarks (_watermarks/); `coordinator-svc audit-exports list` shows it"
    ),
    ("event_pruning", "*"): (
        "the event pruner's bookkeeping (migration 0013: the highest event id pruned and the "
        "pruning lease), not group state; the export reads the highest pruned id to refuse a "
        "run that needs pruned events, and `coordinator-svc audit-exports list` shows it"
    ),
    ("acl_audit", "*"): (
        "bookkeeping of the ACL change trail (a change counter and the entries last "
        "accounted for); the changes themselves are events"
    ),
}
"""Every stored table or column (`"*"`: the whole table) the export deliberately does not
write, with the reason: the one list `tests/audit/test_export_schema.py` checks the store's
schema against, beside what the snapshot writes (`snapshot.exported_columns`). A column a later
migration adds must be exported or named here."""


# --- reading ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadTuning:
    """How tables are split into parallel JDBC reads.

    Attributes:
        max_partitions: at most this many parallel reads per table.
        event_rows_per_partition: event rows per read partition.
        state_rows_per_partition: rows of a state table per read partition (PostgreSQL only;
            an SQLite file is read by one connection).
        fetch_size: JDBC fetch size (rows per round trip).
    """

    max_partitions: int = 4
    event_rows_per_partition: int = 250_000
    state_rows_per_partition: int = 20_000
    fetch_size: int = 10_000

    def partitions(self, rows: int, per_partition: int) -> int:
        return max(1, min(self.max_partitions, -(-rows // max(1, per_partition))))


DEFAULT_TUNING = ReadTuning()


def _select(spec: TableSpec, where: str | None) -> str:
    sql = f"SELECT {', '.join(spec.column_names())} FROM {spec.name}"
    if where:
        sql += f" WHERE {where}"
    return sql


def _subquery(spec: TableSpec, where: str | None) -> str:
    return f"({_select(spec, where)}) {spec.name}_src"


def _finish(df: DataFrame, spec: TableSpec, source: Source) -> DataFrame:
    """Columns typed as the spec says (see `TableSpec.custom_schema`), in its order."""
    columns = []
    for name, kind in spec.columns:
        if kind == "time" and source.dialect == "sqlite":
            columns.append(F.to_timestamp(F.col(name)).alias(name))
        elif kind == "json" and source.dialect == "postgresql":
            columns.append(F.col(name).cast("string").alias(name))
        else:
            columns.append(F.col(name))
    return df.select(*columns)


def _hash_condition(key: str, parts: int, part: int) -> str:
    """PostgreSQL: the rows whose `key` hashes to `part` of `parts`."""
    return f"mod(abs(hashtext({key})::bigint), {parts}) = {part}"


def read_query(
    spark: SparkSession,
    source: Source,
    name: str,
    sql: Callable[[str | None], str],
    custom_schema: str,
    *,
    rows: int = 0,
    tuning: ReadTuning = DEFAULT_TUNING,
    session_init: str | None = None,
) -> DataFrame:
    """The rows of a query. `sql(condition)` gives the query, limited to the rows meeting
    `condition` when it is not None (a condition on a `{key}` placeholder, which the query
    replaces by its key column): on PostgreSQL, a source of more than `state_rows_per_partition`
    rows is read by several connections at once, each taking the rows whose key hashes to it.
    `session_init` runs first on every connection (see `pinned_snapshot`)."""
    parts = tuning.partitions(rows, tuning.state_rows_per_partition)
    props = {
        **source.options(),
        "customSchema": custom_schema,
        "fetchsize": str(tuning.fetch_size),
    }
    if session_init:
        props["sessionInitStatement"] = session_init
    if source.dialect == "postgresql" and parts > 1:
        # One query per partition, each reading its share of the source rows.
        queries = [sql(_hash_condition("{key}", parts, i)) for i in range(parts)]
        frames = [
            spark.read.format("jdbc").options(**props).option("dbtable", f"({q}) {name}_src").load()
            for q in queries
        ]
        return reduce(DataFrame.unionByName, frames)
    return (
        spark.read.format("jdbc")
        .options(**props)
        .option("dbtable", f"({sql(None)}) {name}_src")
        .load()
    )


def read_table(
    spark: SparkSession,
    source: Source,
    spec: TableSpec,
    *,
    rows: int = 0,
    tuning: ReadTuning = DEFAULT_TUNING,
    session_init: str | None = None,
) -> DataFrame:
    """A whole state table (in parallel by its `hash_key`, see `read_query`)."""

    def sql(condition: str | None) -> str:
        return _select(spec, condition.format(key=spec.hash_key) if condition else None)

    df = read_query(
        spark,
        source,
        spec.name,
        sql,
        spec.custom_schema(source.dialect),
        rows=rows,
        tuning=tuning,
        session_init=session_init,
    )
    return _finish(df, spec, source)


def _id_list(ids: Sequence[int]) -> str:
    return ", ".join(str(int(i)) for i in ids)


def events_condition(
    after_id: int, until_id: int, recheck: Sequence[int] = (), exclude: Sequence[int] = ()
) -> str:
    """The SQL condition of the events a run exports: `after_id < id <= until_id` but `exclude`,
    and `recheck` (ids at or below `after_id`) if they exist."""
    cond = f"id > {int(after_id)} AND id <= {int(until_id)}"
    if exclude:
        cond += f" AND id NOT IN ({_id_list(exclude)})"
    if recheck:
        cond = f"({cond}) OR id IN ({_id_list(recheck)})"
    return cond


def read_events(
    spark: SparkSession,
    source: Source,
    after_id: int,
    until_id: int,
    *,
    recheck: Sequence[int] = (),
    exclude: Sequence[int] = (),
    tuning: ReadTuning = DEFAULT_TUNING,
    session_init: str | None = None,
) -> DataFrame:
    """The events of `events_condition`, read in parallel ranges of the id (split by the id
    span, which is the row count but for ids lost to rolled-back transactions)."""
    where = events_condition(after_id, until_id, recheck, exclude)
    parts = tuning.partitions(until_id - after_id, tuning.event_rows_per_partition)
    reader = (
        spark.read.format("jdbc")
        .options(**source.options())
        .option("fetchsize", str(tuning.fetch_size))
        .option("customSchema", EVENTS.custom_schema(source.dialect))
        .option("dbtable", _subquery(EVENTS, where))
    )
    if session_init:
        reader = reader.option("sessionInitStatement", session_init)
    if parts > 1 and until_id > after_id + 1:
        reader = (
            reader.option("partitionColumn", "id")
            .option("lowerBound", str(after_id + 1))
            .option("upperBound", str(until_id + 1))
            .option("numPartitions", str(parts))
        )
    return _finish(reader.load(), EVENTS, source)


@dataclass(frozen=True)
class TableStats:
    """Row counts of every table and the event id range, read in one query.

    Attributes:
        rows: rows per state table (by table name).
        max_event_id: the highest event id (0 when there are none).
        max_event_at_ms: the time of the last event (coordinator clock; 0 when there are none).
    """

    rows: Mapping[str, int]
    max_event_id: int
    max_event_at_ms: int


def _stats_sql() -> tuple[str, list[str]]:
    names = [spec.name for spec in STATE_TABLES]
    selects = [f"(SELECT count(*) FROM {n}) AS {n}" for n in names]
    selects.append("(SELECT coalesce(max(id), 0) FROM events) AS max_event_id")
    selects.append(
        "(SELECT coalesce(max(at_ms), 0) FROM "
        "(SELECT at_ms FROM events ORDER BY id DESC LIMIT 1) last) AS max_event_at_ms"
    )
    return "SELECT " + ", ".join(selects), names


def _connect(spark: SparkSession, source: Source) -> Any:
    """A JDBC connection in the driver's JVM (through the driver jar Spark loaded)."""
    jvm: Any = spark.sparkContext._jvm
    registry = jvm.org.apache.spark.sql.execution.datasources.jdbc.DriverRegistry
    registry.register(source.driver)
    driver = registry.get(source.driver)
    props = jvm.java.util.Properties()
    for key in ("user", "password"):
        value = getattr(source, key)
        if value is not None:
            props.setProperty(key, value)
    conn = driver.connect(source.jdbc_url, props)
    if conn is None:
        raise SourceError(f"{source.display}: the JDBC driver does not accept this URL")
    return conn


def _read_stats(conn: Any) -> TableStats:
    sql, names = _stats_sql()
    stmt = conn.createStatement()
    try:
        rs = stmt.executeQuery(sql)
        rs.next()
        counts = {n: int(rs.getLong(n)) for n in names}
        return TableStats(
            counts, int(rs.getLong("max_event_id")), int(rs.getLong("max_event_at_ms"))
        )
    finally:
        stmt.close()


MAX_MISSING_IDS = 10_000
"""At most this many missing event ids are listed per run (a larger hole is a sequence jump, not
transactions in flight)."""


@dataclass
class Pinned:
    """The database at one instant (see `pinned_snapshot`).

    Attributes:
        stats: row counts and the event id range at that instant.
        session_init: the statement that makes a JDBC read see that instant (None: SQLite).
    """

    stats: TableStats
    session_init: str | None
    _conn: Any = field(repr=False)
    _dialect: Dialect = "postgresql"

    def missing_event_ids(
        self, after_id: int, until_id: int, recheck: Sequence[int], exclude: Sequence[int]
    ) -> list[int]:
        """The ids of `events_condition` that no event has at this instant (at most
        `MAX_MISSING_IDS`). Always none on SQLite: its writers take turns, so ids commit in
        order."""
        if self._dialect != "postgresql":
            return []
        parts = [
            f"SELECT s.id FROM generate_series({int(after_id) + 1}::bigint, {int(until_id)}) "
            "AS s(id) WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.id = s.id)"
        ]
        if recheck:
            parts.append(
                f"SELECT r.id FROM unnest(ARRAY[{_id_list(recheck)}]::bigint[]) AS r(id) "
                "WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.id = r.id)"
            )
        sql = f"SELECT id FROM ({' UNION '.join(parts)}) m"
        if exclude:
            sql += f" WHERE id NOT IN ({_id_list(exclude)})"
        sql += f" ORDER BY id LIMIT {MAX_MISSING_IDS}"
        stmt = self._conn.createStatement()
        try:
            rs = stmt.executeQuery(sql)
            out = []
            while rs.next():
                out.append(int(rs.getLong(1)))
            return out
        finally:
            stmt.close()

    def pruned_through_event_id(self) -> int:
        """The highest event id the coordinators' event retention pruned (migration 0013), at
        this instant (PostgreSQL: the pinned snapshot's, so it agrees with every read; SQLite:
        now, so reading it again after the reads tells whether pruning reached into them)."""
        stmt = self._conn.createStatement()
        try:
            rs = stmt.executeQuery(
                "SELECT coalesce(max(pruned_through_event_id), 0) FROM event_pruning"
            )
            rs.next()
            return int(rs.getLong(1))
        finally:
            stmt.close()


_PROGRESS_SQL: dict[Dialect, str] = {
    "postgresql": "INSERT INTO audit_export_progress (export_name, since_event_id, "
    "until_event_id, lowest_unfilled_id, at) VALUES (?, ?, ?, ?, CAST(? AS timestamptz))",
    "sqlite": "INSERT INTO audit_export_progress (export_name, since_event_id, "
    "until_event_id, lowest_unfilled_id, at) VALUES (?, ?, ?, ?, ?)",
}


class ProgressNotRecorded(RuntimeError):
    """A committed run's progress row could not be appended to the database."""


def record_progress(
    spark: SparkSession,
    source: Source,
    export_name: str,
    since_event_id: int,
    until_event_id: int,
    lowest_unfilled_id: int,
    at: datetime,
) -> None:
    """Append a committed run's progress to `audit_export_progress` (DESIGN 3.20), on a JDBC
    connection of the driver's own: what the coordinators' event pruner keeps events for. The
    export's database role needs INSERT on the table (and, on PostgreSQL, USAGE on its id
    sequence `audit_export_progress_id_seq`)."""
    if at.tzinfo is None:
        raise ValueError("at must be timezone-aware")
    utc = at.astimezone(UTC)
    # As the coordinator stores timestamps: timestamptz, or naive UTC text on SQLite.
    text = utc.isoformat() if source.dialect == "postgresql" else utc.strftime(_SQLITE_TIME)
    try:
        conn = _connect(spark, source)
    except Exception as error:
        raise ProgressNotRecorded(f"{source.display}: cannot connect: {error}") from error
    try:
        conn.setAutoCommit(True)
        stmt = conn.prepareStatement(_PROGRESS_SQL[source.dialect])
        try:
            stmt.setString(1, export_name)
            stmt.setLong(2, since_event_id)
            stmt.setLong(3, until_event_id)
            stmt.setLong(4, lowest_unfilled_id)
            stmt.setString(5, text)
            stmt.executeUpdate()
        finally:
            stmt.close()
    except Exception as error:
        raise ProgressNotRecorded(
            f"the run is committed (its watermark is written), but its progress could not be "
            f"appended to audit_export_progress in {source.display}: {error}. The coordinators' "
            "event retention keeps events only for exports that record their progress: give "
            "the export's database role INSERT on audit_export_progress (and USAGE on the "
            "sequence audit_export_progress_id_seq), then run the export again (a re-run of "
            "this date repeats it and records its progress)"
        ) from error
    finally:
        conn.close()


_SQLITE_TIME = "%Y-%m-%d %H:%M:%S.%f"


@contextmanager
def pinned_snapshot(spark: SparkSession, source: Source) -> Iterator[Pinned]:
    """The database's state at one instant, for reads on many connections.

    PostgreSQL: a REPEATABLE READ transaction on one connection in the driver exports its
    snapshot (`pg_export_snapshot`) and stays open while the block runs; every read given the
    session-init statement imports that snapshot, so all of them, the stats and the missing
    ids see exactly the same committed state. SQLite: the stats, and no statement (the file
    is read as it is; the coordinator writes it from one process)."""
    conn = _connect(spark, source)
    try:
        if source.dialect != "postgresql":
            conn.setAutoCommit(True)
            yield Pinned(_read_stats(conn), None, conn, source.dialect)
            return
        conn.setAutoCommit(False)
        conn.setTransactionIsolation(4)  # java.sql.Connection.TRANSACTION_REPEATABLE_READ
        stmt = conn.createStatement()
        try:
            # The transaction idles while the snapshot is read: a server-wide idle timeout
            # must not end it (the reads could no longer import its snapshot).
            stmt.execute("SET idle_in_transaction_session_timeout = 0")
            rs = stmt.executeQuery("SELECT pg_export_snapshot()")
            rs.next()
            snapshot_id = str(rs.getString(1))
        finally:
            stmt.close()
        stats = _read_stats(conn)
        yield Pinned(
            stats,
            f"BEGIN ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT '{snapshot_id}'",
            conn,
        )
        conn.rollback()
    finally:
        conn.close()
