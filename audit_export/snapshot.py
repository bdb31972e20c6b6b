"""The snapshot: the coordinator's current state as analyst-friendly tables, read over JDBC (the
derived ones flattened by the database, see `snapshot_sql`), and how every output table is
written (Parquet, partitioned by export date and group).

Tables (each with `group_id`; `export_date` is added when written):

- `groups`, `group_leases`, `members`, `group_configs`, `group_tombstones`: the rows as stored
  (JSON columns as JSON text, byte columns as binary). `group_tombstones` has a row per deleted
  group (DESIGN 3.20): its last group epoch and fencing token, who deleted it and when.
- `catalogue`: one row per connector and per task (`resource`, `resource_type`, `connector`,
  `task`), with the connector's task count and, on its connector row, the digest of its config
  (`config_digest`; `connect_protocol.configs.config_digest`): "hmac-sha256:<hex>", keyed by
  the coordinator database's secret (migration 0005), so equal digests mean equal configs
  within one database and nobody without the key can test a guess against them; rows from
  before 0005 had "sha256:<hex>", unkeyed, and copies of those in earlier exports and in
  events stay so. The `config` values themselves (a map) only with `include_config_values`,
  else NULL: configs carry secrets, and the export keeps a daily copy of whatever it writes.
- `target_assignment`: one row per resource in a member's share of the target, with the
  assignment epoch, group epoch, the share's version, the member's epoch and state if it is
  still a member, and the pending delayed rebalance, lost-work rebalance and next wave times.
- `current_assignment`: one row per resource a member is told it owns (`pending_revocation`
  false) or must still give up (`pending_revocation` true), with the member's epochs and state,
  the group and assignment epochs, and to whom the target gives the resource.
- `resource_statuses`: one row per connector (`task` NULL) and task whose holder reported a
  status (or that a restart was requested for), as stored: state, the reporting member and its
  grant's fencing token, the restart count and when. Whether a row still counts (its reporter
  still holds the resource under that token; else DescribeGroups shows UNASSIGNED) is not
  derived here. The trace is never read (traces may carry secrets): `trace_digest` is the
  digest the coordinator stored with it (NULL for none): "hmac-sha256:<hex>" under the
  database's own key, as config digests are, equal to the `trace_digest` of the STATUS_CHANGED
  event that wrote it (so rows and events join), and no guess of a trace can be confirmed
  against it without the key.

Which stored columns are written is `exported_columns`; what is deliberately not is
`source.WITHHELD`, with the reasons.
"""

from __future__ import annotations

import json
from functools import partial

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StringType, StructType

from . import snapshot_sql, source
from .fs import OutputFS, join

PARTITION_COLUMNS = ("export_date", "group_id")
SCHEMA_FILE = "_schema.json"
"""Beside every table: its Spark schema (`StructType.fromJson`), partition columns included, for
reading a table that has no rows yet (Spark ignores files whose names start with `_`)."""

SNAPSHOT_TABLES = (
    "groups",
    "group_leases",
    "members",
    "catalogue",
    "target_assignment",
    "current_assignment",
    "group_configs",
    "resource_statuses",
    "group_tombstones",
)


RAW_TABLES = (
    source.GROUPS,
    source.GROUP_LEASES,
    source.MEMBERS,
    source.GROUP_CONFIGS,
    source.GROUP_TOMBSTONES,
)
"""The snapshot tables written as stored."""


def read(
    spark: SparkSession,
    src: source.Source,
    stats: source.TableStats,
    *,
    tuning: source.ReadTuning = source.DEFAULT_TUNING,
    session_init: str | None = None,
    include_config_values: bool = False,
) -> dict[str, DataFrame]:
    """Every snapshot table (by name, in `SNAPSHOT_TABLES` order) as a JDBC read: the stored
    tables as they are, the derived ones flattened by the database (`snapshot_sql`). With
    `session_init` from `source.pinned_snapshot`, all of them read the same instant. Connector
    config values are read (and so written) only with `include_config_values`."""
    tables = {
        spec.name: source.read_table(
            spark,
            src,
            spec,
            rows=stats.rows.get(spec.name, 0),
            tuning=tuning,
            session_init=session_init,
        )
        for spec in RAW_TABLES
    }
    for table in snapshot_sql.derived_tables(include_config_values):
        df = source.read_query(
            spark,
            src,
            table.name,
            partial(table.sql, src.dialect),
            table.ddl(),
            rows=stats.rows.get(table.source_table, 0),
            tuning=tuning,
            session_init=session_init,
        ).select(*table.column_names())
        if table.name == "catalogue":
            df = df.withColumn("config", F.from_json("config", MapType(StringType(), StringType())))
        tables[table.name] = df
    return {name: tables[name] for name in SNAPSHOT_TABLES}


def exported_columns(include_config_values: bool = False) -> dict[str, set[str]]:
    """Per stored table, the columns some output table carries: the tables written as stored
    (`RAW_TABLES` and the events) and what the derived tables read (`DerivedTable.carries`)."""
    out: dict[str, set[str]] = {}
    for spec in (*RAW_TABLES, source.EVENTS):
        out.setdefault(spec.name, set()).update(spec.column_names())
    for table in snapshot_sql.derived_tables(include_config_values):
        for stored, columns in table.carries:
            out.setdefault(stored, set()).update(columns)
    return out


JSON_COLUMNS = {
    spec.name: tuple(name for name, kind in spec.columns if kind == "json")
    for spec in (*RAW_TABLES, source.EVENTS)
}
"""Per table written as stored: its JSON text columns."""


def write_partitioned(
    fs: OutputFS, df: DataFrame, path: str, export_date: str, *, files: int = 0
) -> None:
    """Write `df` under `path/export_date=<date>/group_id=<group>/`, replacing whatever an earlier
    run wrote for that export date (so re-running an export date is idempotent).

    `files` > 0 first coalesces to that many tasks (no shuffle), so that a small table is not
    spread over many tiny files; 0 keeps the read's partitioning (large tables stream).

    JSON text columns (`JSON_COLUMNS`, by the table's directory name) are written without a
    dictionary and without min/max statistics: every value is distinct and nobody filters on
    their order, and computing both costs the writer about a tenth of its time on the events."""
    fs.delete(join(path, f"export_date={export_date}"))
    out = df.withColumn("export_date", F.lit(export_date))
    if files > 0:
        out = out.coalesce(files)
    writer = out.write.mode("append").partitionBy(*PARTITION_COLUMNS)
    for column in JSON_COLUMNS.get(path.rstrip("/").rsplit("/", 1)[-1], ()):
        writer = writer.option(f"parquet.enable.dictionary#{column}", "false").option(
            f"parquet.column.statistics.enabled#{column}", "false"
        )
    writer.parquet(path)
    # A table with no rows at all has no Parquet file to take a schema from: keep it beside.
    fs.write_text(join(path, SCHEMA_FILE), out.schema.json())


def read_exported(spark: SparkSession, fs: OutputFS, path: str, export_date: str) -> DataFrame:
    """What `write_partitioned` wrote under `path` for `export_date` (empty if nothing was)."""
    schema = StructType.fromJson(json.loads(fs.read_text(join(path, SCHEMA_FILE))))
    part = join(path, f"export_date={export_date}")
    if not fs.exists(part):
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).option("basePath", path).parquet(part)
