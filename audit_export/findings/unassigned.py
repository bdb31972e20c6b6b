"""The UNASSIGNED_TOO_LONG violation: the spans in which a catalogue resource ran on no member
(`_gaps`), the windows that excuse them (`_excuses`: a delayed rebalance pending, no live
member, a hold), and the gaps charged beyond the grace window."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .. import events as ev
from .. import timeline as tl
from .common import FindingsConfig
from .violations import UNASSIGNED_TOO_LONG, violation_rows


def _gaps(t: tl.Timeline) -> DataFrame:
    """Spans in which a catalogue resource ran on no member: (group, resource, start_*, end_*);
    end null while it still runs nowhere."""
    own = t.ownership
    exist = t.existence
    cols = ["group_id", "resource", "id", "ms", "epoch", "dE", "dR"]
    bounds = (
        own.select(
            "group_id",
            "resource",
            F.col("start_id").alias("id"),
            F.col("start_ms").alias("ms"),
            F.col("start_epoch").alias("epoch"),
            F.lit(0).alias("dE"),
            F.lit(1).alias("dR"),
        )
        .unionByName(
            own.filter(F.col("end_id").isNotNull()).select(
                "group_id",
                "resource",
                F.col("end_id").alias("id"),
                F.col("end_ms").alias("ms"),
                F.col("end_epoch").alias("epoch"),
                F.lit(0).alias("dE"),
                F.lit(-1).alias("dR"),
            )
        )
        .unionByName(
            exist.select(
                "group_id",
                "resource",
                F.col("from_id").alias("id"),
                F.col("from_ms").alias("ms"),
                F.col("from_epoch").alias("epoch"),
                F.lit(1).alias("dE"),
                F.lit(0).alias("dR"),
            )
        )
        .unionByName(
            exist.filter(F.col("to_id").isNotNull()).select(
                "group_id",
                "resource",
                F.col("to_id").alias("id"),
                F.col("to_ms").alias("ms"),
                F.col("to_epoch").alias("epoch"),
                F.lit(-1).alias("dE"),
                F.lit(0).alias("dR"),
            )
        )
        .select(*cols)
    )
    w = (
        Window.partitionBy("group_id", "resource")
        .orderBy("id", F.col("dR").desc(), F.col("dE").desc())
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    wo = Window.partitionBy("group_id", "resource").orderBy(
        "id", F.col("dR").desc(), F.col("dE").desc()
    )
    state = (
        bounds.withColumn("E", F.sum("dE").over(w))
        .withColumn("R", F.sum("dR").over(w))
        .withColumn("in_gap", (F.col("E") > 0) & (F.col("R") == 0))
        .withColumn(
            "change",
            (F.col("in_gap") != F.coalesce(F.lag("in_gap").over(wo), F.lit(False))).cast("int"),
        )
        .withColumn("island", F.sum("change").over(w))
    )
    islands = state.groupBy("group_id", "resource", "island").agg(
        F.first("in_gap").alias("in_gap"),
        F.min("id").alias("start_id"),
        F.min_by("ms", "id").alias("start_ms"),
        F.min_by("epoch", "id").alias("start_epoch"),
    )
    wi = Window.partitionBy("group_id", "resource").orderBy("island")
    return (
        islands.withColumn("end_id", F.lead("start_id").over(wi))
        .withColumn("end_ms", F.lead("start_ms").over(wi))
        .filter(F.col("in_gap"))
        .drop("island", "in_gap")
    )


def _excuses(e: DataFrame, t: tl.Timeline, as_of_ms: int) -> tuple[DataFrame, DataFrame]:
    """Windows in which a resource may legally run nowhere: per group (a delayed rebalance
    pending, no live member) and per resource (held for a fenced or timed-out member, or for a
    departed static member). Columns: group_id, [resource,] w_start, w_end."""
    delays = e.filter(F.col("event_type") == ev.SCHEDULED_REBALANCE_SET).select(
        "group_id", F.col("at_ms").alias("w_start"), F.col("p_at_ms").alias("w_end")
    )
    # Spans with no live member, merged (consecutive events that leave the group empty are one
    # span; a span per event would multiply every gap by them in the join below).
    wl = Window.partitionBy("group_id").orderBy("id", "order")
    running = wl.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    spans = (
        t.live_counts.withColumn("empty", F.col("live_members") <= 0)
        .withColumn(
            "change",
            F.coalesce(F.lag("empty").over(wl) != F.col("empty"), F.lit(True)).cast("int"),
        )
        .withColumn("span", F.sum("change").over(running))
        .groupBy("group_id", "span")
        .agg(F.first("empty").alias("empty"), F.min("at_ms").alias("w_start"))
    )
    ws = Window.partitionBy("group_id").orderBy("span")
    empty = (
        spans.withColumn("w_end", F.coalesce(F.lead("w_start").over(ws), F.lit(as_of_ms)))
        .filter(F.col("empty"))
        .select("group_id", "w_start", "w_end")
    )
    holds = e.filter(F.col("event_type").isin(*ev.HOLDING_TYPES)).select(
        "group_id",
        F.explode(F.col("p_held")).alias("resource"),
        F.col("at_ms").alias("w_start"),
        F.col("p_held_until_ms").alias("w_end"),
    )
    wm = Window.partitionBy("group_id", "member_id").orderBy("id")
    static_left = (
        t.membership.withColumn("next_ms", F.lead("at_ms").over(wm))
        .filter(F.size("held") > 0)
        .select(
            "group_id",
            F.explode("held").alias("resource"),
            F.col("at_ms").alias("w_start"),
            F.coalesce(F.col("next_ms"), F.lit(as_of_ms)).alias("w_end"),
        )
    )
    return delays.unionByName(empty), holds.unionByName(static_left)


def unassigned_too_long(
    e: DataFrame,
    t: tl.Timeline,
    snapshot_catalogue: DataFrame,
    snapshot_current: DataFrame,
    config: FindingsConfig,
    keep: Callable[[DataFrame], DataFrame] = lambda df: df,
) -> DataFrame:
    gaps = keep(_gaps(t)).withColumn(
        "gap_end_ms", F.coalesce(F.col("end_ms"), F.lit(config.as_of_ms))
    )
    per_group, per_resource = _excuses(e, t, config.as_of_ms)
    key = ["group_id", "resource", "start_id"]
    overlapping = F.col("w_start") < F.col("gap_end_ms")
    group_cover = (
        gaps.join(per_group, "group_id")
        .filter(overlapping & (F.col("w_end") > F.col("start_ms")))
        .select(*key, "w_end")
    )
    resource_cover = (
        gaps.join(per_resource, ["group_id", "resource"])
        .filter(overlapping & (F.col("w_end") > F.col("start_ms")))
        .select(*key, "w_end")
    )
    cover = (
        group_cover.unionByName(resource_cover)
        .groupBy(*key)
        .agg(F.max("w_end").alias("excused_until_ms"))
    )
    charged = (
        gaps.join(cover, key, "left")
        .withColumn(
            "charged_from_ms",
            F.greatest(F.col("start_ms"), F.coalesce(F.col("excused_until_ms"), F.lit(0))),
        )
        .withColumn("charged_ms", F.col("gap_end_ms") - F.col("charged_from_ms"))
        .filter(F.col("charged_ms") > config.grace_ms)
    )
    # A gap still open must also show in the snapshot: in the catalogue, owned by nobody.
    owned_now = snapshot_current.select("group_id", "resource").distinct()
    in_catalogue = snapshot_catalogue.select("group_id", "resource").distinct()
    open_confirmed = (
        charged.filter(F.col("end_id").isNull())
        .join(in_catalogue, ["group_id", "resource"], "left_semi")
        .join(owned_now, ["group_id", "resource"], "left_anti")
    )
    found = charged.filter(F.col("end_id").isNotNull()).unionByName(open_confirmed)
    return violation_rows(
        found,
        UNASSIGNED_TOO_LONG,
        "events",
        group_epoch=F.col("start_epoch"),
        resource=F.col("resource"),
        members=F.array(),
        event_id=F.col("start_id"),
        at_ms=F.col("start_ms"),
        duration_ms=F.col("charged_ms"),
        detail=F.format_string(
            "%s ran on no member for %d ms beyond any delay or hold (grace %d ms), from event %d%s",
            F.col("resource"),
            F.col("charged_ms"),
            F.lit(config.grace_ms),
            F.col("start_id"),
            F.when(F.col("end_id").isNull(), F.lit(", still unassigned")).otherwise(
                F.format_string(" to event %d", F.col("end_id"))
            ),
        ),
    )
