"""The `lost_resources` finding: every resource a member stopped running because it left, was
fenced, expired or timed out, and how long until some member ran it again."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .. import events as ev
from .. import timeline as tl


def lost_resources(e: DataFrame, t: tl.Timeline, as_of_ms: int) -> DataFrame:
    ty = F.col("event_type")
    static = F.coalesce(F.col("p_static"), F.lit(False))
    lost_set = (
        F.when((ty == ev.MEMBER_LEFT) & static, F.col("p_held"))
        .when(ty == ev.MEMBER_LEFT, F.col("p_released"))
        .when(
            (ty == ev.MEMBER_SESSION_EXPIRED) & ~F.coalesce(F.col("p_static_left"), F.lit(False)),
            F.col("p_released"),
        )
        .when(ty.isin(*ev.HOLDING_TYPES), F.col("p_held"))
    )
    losses = e.filter(ty.isin(ev.MEMBER_LEFT, ev.MEMBER_SESSION_EXPIRED, *ev.REMOVAL_TYPES)).select(
        "group_id",
        (F.col("group_epoch") + 1).alias("epoch"),
        F.col("member_id").alias("lost_from_member_id"),
        F.col("event_type").alias("loss_event_type"),
        F.col("id").alias("loss_event_id"),
        F.col("at_ms").alias("lost_at_ms"),
        F.explode(F.coalesce(lost_set, ev.empty_names())).alias("resource"),
    )
    starts = t.ownership.select(
        F.col("group_id").alias("s_group"),
        F.col("resource").alias("s_resource"),
        F.col("member_id").alias("s_member"),
        F.col("start_id").alias("s_id"),
        F.col("start_ms").alias("s_ms"),
    )
    later = (
        (F.col("s_group") == F.col("group_id"))
        & (F.col("s_resource") == F.col("resource"))
        & (F.col("s_id") > F.col("loss_event_id"))
    )
    keys = [
        "group_id",
        "epoch",
        "resource",
        "lost_from_member_id",
        "loss_event_type",
        "loss_event_id",
        "lost_at_ms",
    ]
    restarts = (
        losses.join(starts, later, "left")
        .groupBy(*keys)
        .agg(F.min_by(F.struct("s_id", "s_ms", "s_member"), "s_id").alias("s"))
    )
    return restarts.select(
        *keys,
        F.col("s.s_member").alias("restarted_on_member_id"),
        F.col("s.s_id").alias("restart_event_id"),
        F.col("s.s_ms").alias("restarted_at_ms"),
        (F.col("s.s_ms") - F.col("lost_at_ms")).alias("waited_ms"),
        F.when(F.col("s.s_id").isNull(), F.lit(as_of_ms) - F.col("lost_at_ms")).alias(
            "waiting_so_far_ms"
        ),
    )
