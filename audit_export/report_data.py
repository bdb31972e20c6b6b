"""What the report draws, collected from the findings in Spark: per busiest group, the running
intervals of its most moved resources and its epoch bumps (`report` renders them)."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from . import report

MAX_TIMELINE_GROUPS = 20
MAX_INTERVALS_PER_GROUP = 20_000


def collect_timelines(found: dict[str, DataFrame], as_of_ms: int) -> list[report.GroupTimeline]:
    """The intervals and epoch bumps the report draws, for the most active groups."""
    ownership, rebalances = found["ownership"], found["rebalances"]
    busiest = [
        r["group_id"]
        for r in rebalances.groupBy("group_id")
        .count()
        .orderBy(F.col("count").desc(), "group_id")
        .limit(MAX_TIMELINE_GROUPS)
        .collect()
    ]
    if not busiest:
        busiest = [
            r["group_id"]
            for r in ownership.select("group_id").distinct().limit(MAX_TIMELINE_GROUPS).collect()
        ]
    own = ownership.filter(F.col("group_id").isin(busiest))
    per_resource = own.groupBy("group_id", "resource").agg(F.count("*").alias("n"))
    w = Window.partitionBy("group_id").orderBy(F.col("n").desc(), "resource")
    ranked = per_resource.withColumn("rank", F.row_number().over(w))
    totals = {r["group_id"]: r["count"] for r in per_resource.groupBy("group_id").count().collect()}
    lanes = ranked.filter(F.col("rank") <= report.MAX_LANES).select("group_id", "resource")
    intervals = (
        own.join(lanes, ["group_id", "resource"], "left_semi")
        .select("group_id", "resource", "member_id", "start_ms", "end_ms")
        .limit(MAX_INTERVALS_PER_GROUP * max(1, len(busiest)))
        .collect()
    )
    markers = (
        rebalances.filter(F.col("group_id").isin(busiest))
        .select("group_id", "group_epoch", "bumped_at_ms", "reason")
        .collect()
    )
    out = {
        g: report.GroupTimeline(g, resources_total=totals.get(g, 0), as_of_ms=as_of_ms)
        for g in busiest
    }
    for r in intervals:
        out[r["group_id"]].intervals.append(
            report.Interval(r["resource"], r["member_id"], r["start_ms"], r["end_ms"])
        )
    for r in markers:
        out[r["group_id"]].markers.append(
            report.Marker(r["group_epoch"], r["bumped_at_ms"], r["reason"] or "")
        )
    return [out[g] for g in sorted(out)]
