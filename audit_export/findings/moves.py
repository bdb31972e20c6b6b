"""The `connector_moves` finding: per connector, how often its tasks (and the connector itself)
started on a different worker than before, and how often installed targets moved them."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .. import events as ev
from .. import timeline as tl


def _with_connector(df: DataFrame, resources: DataFrame) -> DataFrame:
    """Adds `connector` and `resource_type`: from the catalogue events, else from the name."""
    parsed_task = F.regexp_extract(F.col("resource"), r"^(.*)-(\d+)$", 1)
    return (
        df.join(
            resources.select(
                "group_id",
                "resource",
                F.col("connector").alias("_c"),
                F.col("resource_type").alias("_t"),
            ),
            ["group_id", "resource"],
            "left",
        )
        .withColumn(
            "connector",
            F.coalesce(
                F.col("_c"),
                F.when(parsed_task != "", parsed_task).otherwise(F.col("resource")),
            ),
        )
        .withColumn(
            "resource_type",
            F.coalesce(
                F.col("_t"),
                F.when(parsed_task != "", F.lit("task")).otherwise(F.lit("connector")),
            ),
        )
        .drop("_c", "_t")
    )


def connector_moves(e: DataFrame, t: tl.Timeline) -> DataFrame:
    w = Window.partitionBy("group_id", "resource").orderBy("start_id")
    runs = t.ownership.withColumn("prev_member", F.lag("member_id").over(w)).withColumn(
        "moved", F.col("prev_member").isNotNull() & (F.col("prev_member") != F.col("member_id"))
    )
    runs = _with_connector(runs, t.resources)
    is_task = F.col("resource_type") == "task"
    actual = runs.groupBy("group_id", "connector").agg(
        F.countDistinct(F.when(is_task, F.col("resource"))).alias("tasks_run"),
        F.sum((F.col("moved") & is_task).cast("int")).alias("task_moves"),
        F.countDistinct(F.when(F.col("moved") & is_task, F.col("resource"))).alias("tasks_moved"),
        F.sum((F.col("moved") & ~is_task).cast("int")).alias("connector_moves"),
    )
    target = _with_connector(
        e.filter(F.col("event_type") == ev.TARGET_INSTALLED)
        .select("group_id", F.explode(F.col("p_moves")).alias("m"))
        .filter(F.col("m.from").isNotNull() & F.col("m.to").isNotNull())
        .select("group_id", F.col("m.resource").alias("resource")),
        t.resources,
    )
    target_counts = target.groupBy("group_id", "connector").agg(
        F.sum((F.col("resource_type") == "task").cast("int")).alias("target_task_moves")
    )
    return actual.join(target_counts, ["group_id", "connector"], "full").select(
        "group_id",
        "connector",
        F.coalesce("tasks_run", F.lit(0)).alias("tasks_run"),
        F.coalesce("task_moves", F.lit(0)).cast("long").alias("task_moves"),
        F.coalesce("tasks_moved", F.lit(0)).alias("tasks_moved"),
        F.coalesce("connector_moves", F.lit(0)).cast("long").alias("connector_moves"),
        F.coalesce("target_task_moves", F.lit(0)).cast("long").alias("target_task_moves"),
    )
