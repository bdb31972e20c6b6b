"""The violation kinds, the shape of a violation row (`VIOLATION_COLUMNS`, `violation_rows`),
and the DOUBLE_OWNERSHIP and MEMBER_LISTED_AFTER_REMOVAL checks (UNASSIGNED_TOO_LONG, which
needs the gaps and their excuses, is in `unassigned`)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .. import timeline as tl

DOUBLE_OWNERSHIP = "DOUBLE_OWNERSHIP"
UNASSIGNED_TOO_LONG = "UNASSIGNED_TOO_LONG"
MEMBER_LISTED_AFTER_REMOVAL = "MEMBER_LISTED_AFTER_REMOVAL"

VIOLATION_COLUMNS = (
    "kind",
    "source",
    "group_id",
    "group_epoch",
    "resource",
    "members",
    "event_id",
    "at_ms",
    "duration_ms",
    "detail",
)


def violation_rows(
    df: DataFrame,
    kind: str,
    source: str,
    *,
    group_epoch: Column,
    resource: Column,
    members: Column,
    event_id: Column,
    at_ms: Column,
    duration_ms: Column,
    detail: Column,
) -> DataFrame:
    """`df` as violation rows (`VIOLATION_COLUMNS`), each column cast to its type."""
    return df.select(
        F.lit(kind).alias("kind"),
        F.lit(source).alias("source"),
        F.col("group_id"),
        group_epoch.cast("int").alias("group_epoch"),
        resource.cast("string").alias("resource"),
        members.cast("array<string>").alias("members"),
        event_id.cast("long").alias("event_id"),
        at_ms.cast("long").alias("at_ms"),
        duration_ms.cast("long").alias("duration_ms"),
        detail.alias("detail"),
    )


def double_ownership_in_events(t: tl.Timeline, as_of_ms: int) -> DataFrame:
    a = t.ownership.select(
        "group_id",
        "resource",
        F.col("member_id").alias("a_member"),
        F.col("start_id").alias("a_start"),
        F.col("start_ms").alias("a_start_ms"),
        F.col("start_epoch").alias("a_epoch"),
        F.coalesce(F.col("end_id"), F.lit(tl.NO_END)).alias("a_end"),
        F.coalesce(F.col("end_ms"), F.lit(as_of_ms)).alias("a_end_ms"),
    )
    b = t.ownership.select(
        "group_id",
        "resource",
        F.col("member_id").alias("b_member"),
        F.col("start_id").alias("b_start"),
        F.col("start_ms").alias("b_start_ms"),
        F.col("start_epoch").alias("b_epoch"),
        F.coalesce(F.col("end_id"), F.lit(tl.NO_END)).alias("b_end"),
        F.coalesce(F.col("end_ms"), F.lit(as_of_ms)).alias("b_end_ms"),
    )
    overlap = a.join(b, ["group_id", "resource"]).filter(
        (F.col("a_member") < F.col("b_member"))
        & (F.col("a_start") < F.col("b_end"))
        & (F.col("b_start") < F.col("a_end"))
    )
    later_a = F.col("a_start") > F.col("b_start")
    return violation_rows(
        overlap,
        DOUBLE_OWNERSHIP,
        "events",
        group_epoch=F.when(later_a, F.col("a_epoch")).otherwise(F.col("b_epoch")),
        resource=F.col("resource"),
        members=F.array("a_member", "b_member"),
        event_id=F.greatest("a_start", "b_start"),
        at_ms=F.greatest("a_start_ms", "b_start_ms"),
        duration_ms=F.least("a_end_ms", "b_end_ms") - F.greatest("a_start_ms", "b_start_ms"),
        detail=F.format_string(
            "%s ran on %s and %s at once, from event %d",
            F.col("resource"),
            F.col("a_member"),
            F.col("b_member"),
            F.greatest("a_start", "b_start"),
        ),
    )


def double_ownership_in_snapshot(current: DataFrame) -> DataFrame:
    holders = current.groupBy("group_id", "resource").agg(
        F.array_sort(F.collect_set("member_id")).alias("members"),
        F.array_sort(
            F.collect_list(
                F.format_string(
                    "%s (member epoch %d%s)",
                    F.col("member_id"),
                    F.col("member_epoch"),
                    F.when(F.col("pending_revocation"), F.lit(", pending revocation")).otherwise(
                        F.lit("")
                    ),
                )
            )
        ).alias("holders"),
        F.max("group_epoch").alias("group_epoch"),
    )
    twice = holders.filter(F.size("members") > 1)
    return violation_rows(
        twice,
        DOUBLE_OWNERSHIP,
        "snapshot",
        group_epoch=F.col("group_epoch"),
        resource=F.col("resource"),
        members=F.col("members"),
        event_id=F.lit(None),
        at_ms=F.lit(None),
        duration_ms=F.lit(None),
        detail=F.format_string(
            "%s is in the current assignments of %s at group epoch %d",
            F.col("resource"),
            F.array_join("holders", " and "),
            F.col("group_epoch"),
        ),
    )


def listed_after_removal(
    t: tl.Timeline, snapshot_members: DataFrame, snapshot_current: DataFrame, after_id: int
) -> DataFrame:
    w = Window.partitionBy("group_id", "member_id").orderBy(F.col("id").desc())
    last = t.membership.withColumn("n", F.row_number().over(w)).filter(
        (F.col("n") == 1) & ~F.col("listed")
    )
    return removed_but_listed(last, snapshot_members, snapshot_current, after_id)


def removed_but_listed(
    removed: DataFrame, snapshot_members: DataFrame, snapshot_current: DataFrame, after_id: int
) -> DataFrame:
    """MEMBER_LISTED_AFTER_REMOVAL rows: of `removed` (per member, the event that removed it:
    group_id, member_id, id, at_ms, group_epoch, event_type), those up to `after_id` still in
    the snapshot's members, with what they hold in its current assignment."""
    held = snapshot_current.groupBy("group_id", "member_id").agg(
        F.array_join(F.array_sort(F.collect_set("resource")), ", ").alias("holds")
    )
    found = (
        removed.filter(F.col("id") <= after_id)
        .join(
            snapshot_members.select("group_id", "member_id"),
            ["group_id", "member_id"],
            "left_semi",
        )
        .join(held, ["group_id", "member_id"], "left")
    )
    return violation_rows(
        found,
        MEMBER_LISTED_AFTER_REMOVAL,
        "snapshot",
        group_epoch=F.col("group_epoch"),
        resource=F.col("holds"),
        members=F.array("member_id"),
        event_id=F.col("id"),
        at_ms=F.col("at_ms"),
        duration_ms=F.lit(None),
        detail=F.format_string(
            "member %s is still listed after %s (event %d at group epoch %d)%s",
            F.col("member_id"),
            F.col("event_type"),
            F.col("id"),
            F.col("group_epoch"),
            F.when(
                F.col("holds").isNotNull(), F.concat(F.lit(", holding "), F.col("holds"))
            ).otherwise(F.lit("")),
        ),
    )
