"""What the export should contain, computed from the database by plain SQL (SQLAlchemy), and
what it does contain, read back from the Parquet output: both as sorted lists of plain tuples,
so tests compare them row by row."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from audit_export import source
from audit_export.snapshot import SCHEMA_FILE
from connect_protocol.configs import KEYED_DIGEST_PREFIX, config_digest
from coordinator_svc.store import schema
from coordinator_svc.store.migrate import normalize_url

Row = tuple[Any, ...]

RAW_TABLES = {
    "groups": source.GROUPS,
    "group_leases": source.GROUP_LEASES,
    "members": source.MEMBERS,
    "group_configs": source.GROUP_CONFIGS,
    "group_tombstones": source.GROUP_TOMBSTONES,
}


def _norm(value: Any) -> Any:
    """Database values -> comparable plain values (timestamps as epoch microseconds)."""
    if isinstance(value, datetime):
        delta = value - datetime(1970, 1, 1, tzinfo=value.tzinfo)
        return delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return value


def _freeze(value: Any) -> Any:
    """JSON text -> canonical JSON text; JSON null (how SQLAlchemy stores None) -> None."""
    if value is None:
        return None
    parsed = json.loads(value)
    return None if parsed is None else json.dumps(parsed, sort_keys=True)


def _sorted(rows: Iterable[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: json.dumps(r, default=repr, sort_keys=True))


def _names(rs: Any) -> list[tuple[str, str, str, int | None]]:
    """A stored resource set -> (resource, type, connector, task) per connector and task."""
    rs = rs or {}
    out: list[tuple[str, str, str, int | None]] = [
        (c, "connector", c, None) for c in rs.get("connectors", [])
    ]
    out += [
        (f"{t['connector']}-{t['task']}", "task", t["connector"], int(t["task"]))
        for t in rs.get("tasks", [])
    ]
    out += [  # a large set's stored form (coordinator_svc.store.stored_sets)
        (f"{r['connector']}-{n}", "task", r["connector"], n)
        for r in rs.get("task_ranges", [])
        for n in range(int(r["first"]), int(r["last"]) + 1)
    ]
    return out


class Database:
    """The coordinator's database read with SQLAlchemy, shaped like the export's tables."""

    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(normalize_url(url))

    def close(self) -> None:
        self.engine.dispose()

    def rows(self, table: sa.Table, where: Any = None) -> list[dict[str, Any]]:
        query = sa.select(table)
        if where is not None:
            query = query.where(where)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def execute(self, statement: Any, params: Any = None) -> None:
        with self.engine.begin() as conn:
            conn.execute(statement, params)

    def raw(self, name: str) -> list[Row]:
        spec = RAW_TABLES[name]
        table = schema.Base.metadata.tables[name]
        return _sorted(
            tuple(_norm(row[col]) for col in spec.column_names()) for row in self.rows(table)
        )

    def events(self, after_id: int = 0, until_id: int | None = None) -> list[Row]:
        t = schema.events
        where = t.c.id > after_id
        if until_id is not None:
            where = sa.and_(where, t.c.id <= until_id)
        return _sorted(
            tuple(_norm(row[col]) for col in source.EVENTS.column_names())
            for row in self.rows(t, where)
        )

    def max_event_id(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.max(schema.events.c.id))).scalar() or 0)

    def digest_key(self) -> bytes:
        """The database's config digest key (migration 0005)."""
        secrets = schema.coordinator_secrets
        with self.engine.connect() as conn:
            value = conn.execute(
                sa.select(secrets.c.value).where(secrets.c.name == schema.CONFIG_DIGEST_KEY)
            ).scalar_one()
        return bytes(value)

    def catalogue(self, config_values: bool = False) -> list[Row]:
        """The connector rows carry the digest of their config (recomputed here from the
        stored config, keyed by the database's key, or unkeyed for a row stored before
        migration 0005; None for a row stored without one) and, with `config_values`, the
        config itself; every row its connector's target state."""
        out: list[Row] = []
        key = self.digest_key()
        for c in self.rows(schema.connectors):
            stored = c["config_digest"]
            keyed = stored.startswith(KEYED_DIGEST_PREFIX)
            digest = config_digest(c["config"], key if keyed else None) if stored else None
            config = json.dumps(c["config"], sort_keys=True) if config_values else None
            out.append(
                (
                    c["group_id"],
                    c["name"],
                    "connector",
                    c["name"],
                    None,
                    c["task_count"],
                    digest,
                    config,
                    c["target_state"],  # the connector's target state (migration 0012)
                )
            )
            out += [
                (
                    c["group_id"],
                    f"{c['name']}-{i}",
                    "task",
                    c["name"],
                    i,
                    c["task_count"],
                    None,
                    None,
                    c["target_state"],  # its tasks' rows carry it too
                )
                for i in range(c["task_count"])
            ]
        return _sorted(out)

    def target_assignment(self) -> list[Row]:
        targets = {t["group_id"]: t for t in self.rows(schema.target_assignments)}
        groups = {g["group_id"]: g for g in self.rows(schema.groups)}
        members = {(m["group_id"], m["member_id"]): m for m in self.rows(schema.members)}
        out: list[Row] = []
        for tm in self.rows(schema.target_assignment_members):
            g, t = tm["group_id"], targets[tm["group_id"]]
            m = members.get((g, tm["member_id"]))
            for resource, kind, connector, task in _names(tm["resources"]):
                out.append(
                    (
                        g,
                        tm["member_id"],
                        resource,
                        kind,
                        connector,
                        task,
                        t["assignment_epoch"],
                        groups[g]["group_epoch"],
                        tm["version"],
                        None if m is None else m["member_epoch"],
                        None if m is None else m["state"],
                        t["scheduled_rebalance_at_ms"],
                        t["lost_work_rebalance_at_ms"],
                        t["next_wave_at_ms"],
                    )
                )
        return _sorted(out)

    def resource_statuses(self) -> list[Row]:
        """The stored statuses named as the export names resources (a connector's row, stored
        as task -1, with task None); last, the trace's digest as the coordinator stored it
        (keyed, its STATUS_CHANGED event's; None for "", no trace), never the trace."""
        out: list[Row] = []
        for s in self.rows(schema.resource_statuses):
            connector, task = s["connector"], s["task"]
            digest = s["trace_digest"] or None
            out.append(
                (
                    s["group_id"],
                    connector if task < 0 else f"{connector}-{task}",
                    "connector" if task < 0 else "task",
                    connector,
                    None if task < 0 else task,
                    s["state"],
                    s["member_id"],
                    s["fencing_token"],
                    s["restart_count"],
                    s["reported_at_ms"],
                    digest,
                )
            )
        return _sorted(out)

    def current_assignment(self) -> list[Row]:
        targets = {t["group_id"]: t for t in self.rows(schema.target_assignments)}
        groups = {g["group_id"]: g for g in self.rows(schema.groups)}
        owner = {(r[0], r[2]): r[1] for r in self.target_assignment()}
        out: list[Row] = []
        for m in self.rows(schema.members):
            g = m["group_id"]
            for pending, rs in ((False, m["assigned"]), (True, m["pending_revocation"])):
                for resource, kind, connector, task in _names(rs):
                    out.append(
                        (
                            g,
                            m["member_id"],
                            m["instance_id"],
                            resource,
                            kind,
                            connector,
                            task,
                            pending,
                            m["member_epoch"],
                            m["previous_epoch"],
                            m["state"],
                            groups[g]["group_epoch"],
                            targets[g]["assignment_epoch"] if g in targets else None,
                            owner.get((g, resource)),
                        )
                    )
        return _sorted(out)


EXPORTED_COLUMNS: dict[str, Sequence[str]] = {
    "catalogue": (
        "group_id",
        "resource",
        "resource_type",
        "connector",
        "task",
        "task_count",
        "config_digest",
        "config",
        "target_state",
    ),
    "target_assignment": (
        "group_id",
        "member_id",
        "resource",
        "resource_type",
        "connector",
        "task",
        "assignment_epoch",
        "group_epoch",
        "target_version",
        "member_epoch",
        "member_state",
        "scheduled_rebalance_at_ms",
        "lost_work_rebalance_at_ms",
        "next_wave_at_ms",
    ),
    "current_assignment": (
        "group_id",
        "member_id",
        "instance_id",
        "resource",
        "resource_type",
        "connector",
        "task",
        "pending_revocation",
        "member_epoch",
        "previous_epoch",
        "member_state",
        "group_epoch",
        "assignment_epoch",
        "target_member_id",
    ),
    "resource_statuses": (
        "group_id",
        "resource",
        "resource_type",
        "connector",
        "task",
        "state",
        "member_id",
        "fencing_token",
        "restart_count",
        "reported_at_ms",
        "trace_digest",
    ),
}


def read(spark: SparkSession, out: str, table: str, export_date: str | None = None) -> DataFrame:
    """A table as an analyst reads it: with the schema kept beside it (so a table without rows
    reads as empty)."""
    local = out.removeprefix("file://")
    with open(f"{local}/{table}/{SCHEMA_FILE}") as f:
        table_schema = StructType.fromJson(json.load(f))
    df = spark.read.schema(table_schema).parquet(f"{out}/{table}")
    if export_date is not None:
        df = df.filter(F.col("export_date") == export_date)
    return df


def _spark_rows(df: DataFrame, columns: Sequence[str], kinds: dict[str, str]) -> list[Row]:
    select = []
    for col in columns:
        if kinds.get(col) == "time":
            select.append(F.unix_micros(F.col(col)).alias(col))
        elif col == "config":
            select.append(F.to_json(F.col(col)).alias(col))
        else:
            select.append(F.col(col))
    rows = []
    for r in df.select(*select).collect():
        values = []
        for col, v in zip(columns, r, strict=True):
            if kinds.get(col) == "json" or col == "config":
                v = _freeze(v)
            elif isinstance(v, bytearray):
                v = bytes(v)
            values.append(v)
        rows.append(tuple(values))
    return _sorted(rows)


def exported_raw(spark: SparkSession, out: str, name: str, export_date: str) -> list[Row]:
    spec = RAW_TABLES[name]
    return _spark_rows(read(spark, out, name, export_date), spec.column_names(), dict(spec.columns))


def exported_events(spark: SparkSession, out: str, export_date: str | None = None) -> list[Row]:
    spec = source.EVENTS
    return _spark_rows(
        read(spark, out, "events", export_date), spec.column_names(), dict(spec.columns)
    )


def exported_derived(spark: SparkSession, out: str, name: str, export_date: str) -> list[Row]:
    return _spark_rows(read(spark, out, name, export_date), EXPORTED_COLUMNS[name], {})
