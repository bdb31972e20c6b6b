"""The snapshot: the coordinator's current state as analyst-friendly tables, and how every output
table is written (Parquet, partitioned by export date and group).

Tables (each with `group_id`; `export_date` is added when written):

- `groups`, `group_leases`, `members`, `group_configs`: the rows as stored (JSON columns as JSON
  text, byte columns as binary).
- `catalogue`: one row per connector and per task (`resource`, `resource_type`, `connector`,
  `task`), with the connector's task count and configuration.
- `target_assignment`: one row per resource in a member's share of the target, with the
  assignment epoch, group epoch, the share's version, the member's epoch and state if it is
  still a member, and the scheduled rebalance if one is pending.
- `current_assignment`: one row per resource a member is told it owns (`pending_revocation`
  false) or must still give up (`pending_revocation` true), with the member's epochs and state,
  the group and assignment epochs, and to whom the target gives the resource.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StringType

from . import events as ev
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
)


def catalogue(connectors: DataFrame) -> DataFrame:
    """One row per connector and per task of every connector in the catalogue."""
    base = connectors.select(
        "group_id",
        F.col("name").alias("connector"),
        "task_count",
        F.from_json("config", MapType(StringType(), StringType())).alias("config"),
    )
    connector_rows = base.select(
        "group_id",
        F.col("connector").alias("resource"),
        F.lit("connector").alias("resource_type"),
        "connector",
        F.lit(None).cast("int").alias("task"),
        "task_count",
        "config",
    )
    task_rows = base.select(
        "group_id",
        "connector",
        "task_count",
        F.explode(
            F.when(
                F.col("task_count") > 0, F.sequence(F.lit(0), F.col("task_count") - 1)
            ).otherwise(F.array().cast("array<int>"))
        ).alias("task"),
    ).select(
        "group_id",
        F.concat(F.col("connector"), F.lit("-"), F.col("task").cast("string")).alias("resource"),
        F.lit("task").alias("resource_type"),
        "connector",
        "task",
        "task_count",
        F.lit(None).cast(MapType(StringType(), StringType())).alias("config"),
    )
    return connector_rows.unionByName(task_rows)


def _explode_items(df: DataFrame, json_column: str) -> DataFrame:
    """Rows of `df` times the resources of its JSON resource-set column."""
    item = ev.items(F.from_json(F.col(json_column), ev.RESOURCE_SET))
    return df.withColumn("_item", F.explode(item)).select(
        "*",
        F.col("_item.resource").alias("resource"),
        F.col("_item.resource_type").alias("resource_type"),
        F.col("_item.connector").alias("connector"),
        F.col("_item.task").alias("task"),
    )


def target_assignment(
    target_members: DataFrame, targets: DataFrame, groups: DataFrame, members: DataFrame
) -> DataFrame:
    """One row per resource of each member's share of the target."""
    rows = _explode_items(
        target_members.select("group_id", "member_id", "resources", "version"), "resources"
    )
    return (
        rows.join(
            targets.select("group_id", "assignment_epoch", "scheduled_rebalance_at_ms"),
            "group_id",
            "left",
        )
        .join(groups.select("group_id", "group_epoch"), "group_id", "left")
        .join(
            members.select(
                "group_id",
                "member_id",
                "member_epoch",
                F.col("state").alias("member_state"),
            ),
            ["group_id", "member_id"],
            "left",
        )
        .select(
            "group_id",
            "member_id",
            "resource",
            "resource_type",
            "connector",
            "task",
            "assignment_epoch",
            "group_epoch",
            F.col("version").alias("target_version"),
            "member_epoch",
            "member_state",
            "scheduled_rebalance_at_ms",
        )
    )


def current_assignment(
    members: DataFrame, groups: DataFrame, targets: DataFrame, target: DataFrame
) -> DataFrame:
    """One row per resource each member owns or must still give up."""
    base = members.select(
        "group_id",
        "member_id",
        "instance_id",
        "member_epoch",
        "previous_epoch",
        F.col("state").alias("member_state"),
        "assigned",
        "pending_revocation",
    )
    owned = _explode_items(base, "assigned").withColumn("pending_revocation", F.lit(False))
    pending = _explode_items(
        base.drop("assigned").withColumnRenamed("pending_revocation", "pending_json"),
        "pending_json",
    ).withColumn("pending_revocation", F.lit(True))
    columns = [
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
    ]
    rows = owned.select(*columns).unionByName(pending.select(*columns))
    return (
        rows.join(groups.select("group_id", "group_epoch"), "group_id", "left")
        .join(targets.select("group_id", "assignment_epoch"), "group_id", "left")
        .join(
            target.select("group_id", "resource", F.col("member_id").alias("target_member_id")),
            ["group_id", "resource"],
            "left",
        )
        .select(*columns, "group_epoch", "assignment_epoch", "target_member_id")
    )


def build(raw: Mapping[str, DataFrame]) -> dict[str, DataFrame]:
    """The snapshot tables from the raw tables (keyed by table name)."""
    groups, members, targets = raw["groups"], raw["members"], raw["target_assignments"]
    target = target_assignment(raw["target_assignment_members"], targets, groups, members)
    return {
        "groups": groups,
        "group_leases": raw["group_leases"],
        "members": members,
        "catalogue": catalogue(raw["connectors"]),
        "target_assignment": target,
        "current_assignment": current_assignment(members, groups, targets, target),
        "group_configs": raw["group_configs"],
    }


def write_partitioned(
    fs: OutputFS, df: DataFrame, path: str, export_date: str, *, files: int = 0
) -> None:
    """Write `df` under `path/export_date=<date>/group_id=<group>/`, replacing whatever an earlier
    run wrote for that export date (so re-running an export date is idempotent).

    `files` > 0 first coalesces to that many tasks (no shuffle), so that a small table is not
    spread over many tiny files; 0 keeps the read's partitioning (large tables stream)."""
    fs.delete(join(path, f"export_date={export_date}"))
    out = df.withColumn("export_date", F.lit(export_date))
    if files > 0:
        out = out.coalesce(files)
    out.write.mode("append").partitionBy(*PARTITION_COLUMNS).parquet(path)
    # A table with no rows at all has no Parquet file to take a schema from: keep it beside.
    fs.write_text(join(path, SCHEMA_FILE), out.schema.json())
