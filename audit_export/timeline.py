"""The group's history rebuilt from its events, in Spark: who ran what when, who was a member
when, which resources existed when.

Everything is ordered by event id, which increases in commit order within a group (DESIGN 3.17),
so "at once" means "between the same two events", whatever the clocks said. Times (`*_ms`) are the
coordinator's, carried along for durations and the report.

A member *runs* a resource from the event that gives it to the member (ASSIGNMENT_DELIVERED, or a
static member taking its predecessor's assignment over) until the event that takes it away: the
member acknowledging its revocation, leaving, being fenced, expiring or timing out. A resource the
member must give up still runs until it is acknowledged (the coordinator counts assigned plus
pending revocation as owned, DESIGN 3.11).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from . import events as ev

NO_END = 2**62
"""Stands for "not ended yet" in interval arithmetic on event ids."""


def _empty() -> Column:
    return ev.empty_names()


def _dynamic_left() -> Column:
    return (F.col("event_type") == ev.MEMBER_LEFT) & ~F.coalesce(F.col("p_static"), F.lit(False))


def _removed() -> Column:
    return F.col("event_type").isin(*ev.REMOVAL_TYPES) | _dynamic_left()


@dataclass(frozen=True)
class Timeline:
    """The rebuilt history.

    Attributes:
        ownership: one row per (group, resource, member) running interval: `start_id`,
            `start_ms`, `start_epoch`, and `end_id` / `end_ms` / `end_epoch` (null while still
            running).
        membership: one row per membership event per member: `live` (a member that heartbeats
            and reconciles) and `listed` (still in the members table) after the event.
        live_counts: per group, the number of live members after each membership event or
            epoch bump (`live_members`, at `id`).
        existence: one row per (group, resource) catalogue interval (`from_*` .. `to_*`).
        resources: `resource` -> `connector`, `task`, `resource_type`, from the catalogue events.
        member_levels: per member and epoch, the event at which the member first reached
            that epoch's target (`reach_id`, `reach_ms`).
    """

    ownership: DataFrame
    membership: DataFrame
    live_counts: DataFrame
    existence: DataFrame
    resources: DataFrame
    member_levels: DataFrame


def _member_rows(e: DataFrame) -> DataFrame:
    """One row per event that changes a member's assignment or liveness, with what it sets
    (null: unchanged). A static takeover also gives a row to the member replaced."""
    t = F.col("event_type")
    member = e.filter(F.col("member_id").isNotNull()).select(
        "group_id",
        "member_id",
        "id",
        "at_ms",
        "group_epoch",
        "event_type",
        F.when(t == ev.ASSIGNMENT_DELIVERED, F.col("p_assigned"))
        .when((t == ev.MEMBER_JOINED) | _removed(), _empty())
        .alias("set_assigned"),
        F.when(t == ev.REVOCATION_REQUESTED, F.col("p_revoke"))
        .when(t == ev.REVOCATION_PARTIALLY_ACKNOWLEDGED, F.col("p_pending"))
        .when(
            t.isin(
                ev.REVOCATION_ACKNOWLEDGED,
                ev.MEMBER_JOINED,
                ev.MEMBER_LEFT,
                ev.STATIC_MEMBER_REPLACED,
            )
            | _removed(),
            _empty(),
        )
        .alias("set_pending"),
        F.when(
            t.isin(
                ev.ASSIGNMENT_DELIVERED,
                ev.MEMBER_JOINED,
                ev.MEMBER_REJOINED,
                ev.STATIC_MEMBER_REPLACED,
            ),
            F.lit(True),
        )
        .when((t == ev.MEMBER_LEFT) | _removed(), F.lit(False))
        .alias("set_active"),
        F.when(t == ev.STATIC_MEMBER_REPLACED, F.col("p_previous_member_id")).alias(
            "takes_over_from"
        ),
        F.when(t == ev.ASSIGNMENT_DELIVERED, F.col("p_member_epoch")).alias("member_epoch"),
        F.when(t == ev.ASSIGNMENT_DELIVERED, F.col("p_state")).alias("member_state"),
    )
    member = member.filter(
        F.col("set_assigned").isNotNull()
        | F.col("set_pending").isNotNull()
        | F.col("set_active").isNotNull()
    )
    replaced = e.filter(F.col("event_type") == ev.STATIC_MEMBER_REPLACED).select(
        "group_id",
        F.col("p_previous_member_id").alias("member_id"),
        "id",
        "at_ms",
        "group_epoch",
        F.lit("STATIC_MEMBER_REPLACED_PREDECESSOR").alias("event_type"),
        _empty().alias("set_assigned"),
        _empty().alias("set_pending"),
        F.lit(False).alias("set_active"),
        F.lit(None).cast("string").alias("takes_over_from"),
        F.lit(None).cast("int").alias("member_epoch"),
        F.lit(None).cast("string").alias("member_state"),
    )
    return member.unionByName(replaced)


def _carry(rows: DataFrame) -> DataFrame:
    """Each member's assigned set, pending set and liveness after each of its rows."""
    w = (
        Window.partitionBy("group_id", "member_id")
        .orderBy("id")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    return (
        rows.withColumn(
            "assigned", F.coalesce(F.last("set_assigned", ignorenulls=True).over(w), _empty())
        )
        .withColumn(
            "pending", F.coalesce(F.last("set_pending", ignorenulls=True).over(w), _empty())
        )
        .withColumn(
            "active", F.coalesce(F.last("set_active", ignorenulls=True).over(w), F.lit(False))
        )
    )


def _with_takeovers(rows: DataFrame) -> DataFrame:
    """A static member taking over gets its predecessor's assignment as it was just before."""
    first = _carry(rows).select(
        F.col("group_id").alias("p_group"),
        F.col("member_id").alias("p_member"),
        F.col("id").alias("p_id"),
        F.col("assigned").alias("p_assigned"),
    )
    takeovers = rows.filter(F.col("takes_over_from").isNotNull()).select(
        F.col("group_id").alias("t_group"),
        F.col("takes_over_from").alias("t_prev"),
        F.col("id").alias("t_id"),
    )
    predecessor = (
        takeovers.join(
            first,
            (F.col("p_group") == F.col("t_group"))
            & (F.col("p_member") == F.col("t_prev"))
            & (F.col("p_id") < F.col("t_id")),
        )
        .groupBy("t_group", "t_id")
        .agg(F.max_by("p_assigned", "p_id").alias("inherited"))
        .select(F.col("t_group").alias("group_id"), F.col("t_id").alias("id"), "inherited")
    )
    return (
        rows.join(predecessor, ["group_id", "id"], "left")
        .withColumn(
            "set_assigned",
            F.when(
                F.col("takes_over_from").isNotNull(), F.coalesce(F.col("inherited"), _empty())
            ).otherwise(F.col("set_assigned")),
        )
        .drop("inherited")
    )


def ownership(member_state: DataFrame) -> DataFrame:
    """Running intervals from the members' carried state."""
    w = Window.partitionBy("group_id", "member_id").orderBy("id")
    owned = member_state.withColumn(
        "owned",
        F.when(F.col("active"), F.array_union("assigned", "pending")).otherwise(_empty()),
    ).withColumn("owned_before", F.coalesce(F.lag("owned").over(w), _empty()))
    keys = ["group_id", "member_id", "id", "at_ms", "group_epoch"]
    starts = owned.select(
        *keys, F.explode(F.array_except("owned", "owned_before")).alias("resource")
    ).withColumn("kind", F.lit(1))
    stops = owned.select(
        *keys, F.explode(F.array_except("owned_before", "owned")).alias("resource")
    ).withColumn("kind", F.lit(-1))
    wr = Window.partitionBy("group_id", "member_id", "resource").orderBy("id")
    bounds = starts.unionByName(stops)
    return (
        bounds.withColumn("end_id", F.lead("id").over(wr))
        .withColumn("end_ms", F.lead("at_ms").over(wr))
        .withColumn("end_epoch", F.lead("group_epoch").over(wr))
        .filter(F.col("kind") == 1)
        .select(
            "group_id",
            "resource",
            "member_id",
            F.col("id").alias("start_id"),
            F.col("at_ms").alias("start_ms"),
            F.col("group_epoch").alias("start_epoch"),
            "end_id",
            "end_ms",
            "end_epoch",
        )
    )


def membership(e: DataFrame) -> DataFrame:
    """Membership events per member: `live` and `listed` after each."""
    t = F.col("event_type")
    static_left = (t == ev.MEMBER_LEFT) & F.coalesce(F.col("p_static"), F.lit(False))
    own = e.filter(
        F.col("member_id").isNotNull()
        & t.isin(
            ev.MEMBER_JOINED,
            ev.MEMBER_REJOINED,
            ev.MEMBER_LEFT,
            ev.STATIC_MEMBER_REPLACED,
            *ev.REMOVAL_TYPES,
        )
    ).select(
        "group_id",
        "member_id",
        "id",
        "at_ms",
        "group_epoch",
        "event_type",
        t.isin(ev.MEMBER_JOINED, ev.MEMBER_REJOINED, ev.STATIC_MEMBER_REPLACED).alias("live"),
        (~_removed()).alias("listed"),
        F.when(static_left, F.col("p_held")).otherwise(_empty()).alias("held"),
    )
    predecessors = e.filter(t == ev.STATIC_MEMBER_REPLACED).select(
        "group_id",
        F.col("p_previous_member_id").alias("member_id"),
        "id",
        "at_ms",
        "group_epoch",
        F.lit("STATIC_MEMBER_REPLACED_PREDECESSOR").alias("event_type"),
        F.lit(False).alias("live"),
        F.lit(False).alias("listed"),
        _empty().alias("held"),
    )
    return own.unionByName(predecessors)


def live_counts(members: DataFrame, e: DataFrame) -> DataFrame:
    """Live members per group after each membership event, and at each epoch bump and at each
    group's first event (before anyone joined)."""
    wm = Window.partitionBy("group_id", "member_id").orderBy("id")
    deltas = members.withColumn(
        "delta",
        F.col("live").cast("int") - F.coalesce(F.lag("live").over(wm), F.lit(False)).cast("int"),
    ).select("group_id", "id", "at_ms", "delta", F.lit(0).alias("order"))
    first = e.groupBy("group_id").agg(
        F.min("id").alias("id"), F.min_by("at_ms", "id").alias("at_ms")
    )
    markers = (
        e.filter(F.col("event_type") == ev.GROUP_EPOCH_BUMPED)
        .select("group_id", "id", "at_ms")
        .unionByName(first)
        .select("group_id", "id", "at_ms", F.lit(0).alias("delta"), F.lit(1).alias("order"))
    )
    wg = (
        Window.partitionBy("group_id")
        .orderBy("id", "order")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    return (
        deltas.unionByName(markers)
        .withColumn("live_members", F.sum("delta").over(wg))
        .select("group_id", "id", "at_ms", "order", "live_members")
    )


def _catalogue_rows(e: DataFrame) -> DataFrame:
    """The resources of each connector after each catalogue event."""
    t = F.col("event_type")
    connector = F.col("p_connector")
    task_count = F.coalesce(F.col("p_task_count"), F.lit(0))
    tasks = F.when(
        task_count > 0,
        F.transform(
            F.sequence(F.lit(0), task_count - 1),
            lambda i: F.concat(connector, F.lit("-"), i.cast("string")),
        ),
    ).otherwise(_empty())
    return e.filter(t.isin(ev.CONNECTOR_PUT, ev.CONNECTOR_DELETED)).select(
        "group_id",
        connector.alias("connector"),
        "id",
        "at_ms",
        "group_epoch",
        F.when(t == ev.CONNECTOR_PUT, F.concat(F.array(connector), tasks))
        .otherwise(_empty())
        .alias("exists"),
    )


def existence(e: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Catalogue intervals per resource, and the resource -> connector/task mapping."""
    rows = _catalogue_rows(e)
    w = Window.partitionBy("group_id", "connector").orderBy("id")
    rows = rows.withColumn("before", F.coalesce(F.lag("exists").over(w), _empty()))
    keys = ["group_id", "connector", "id", "at_ms", "group_epoch"]
    added = rows.select(*keys, F.explode(F.array_except("exists", "before")).alias("resource"))
    gone = rows.select(*keys, F.explode(F.array_except("before", "exists")).alias("resource"))
    bounds = added.withColumn("kind", F.lit(1)).unionByName(gone.withColumn("kind", F.lit(-1)))
    wr = Window.partitionBy("group_id", "resource").orderBy("id")
    intervals = (
        bounds.withColumn("to_id", F.lead("id").over(wr))
        .withColumn("to_ms", F.lead("at_ms").over(wr))
        .withColumn("to_epoch", F.lead("group_epoch").over(wr))
        .filter(F.col("kind") == 1)
        .select(
            "group_id",
            "resource",
            "connector",
            F.col("id").alias("from_id"),
            F.col("at_ms").alias("from_ms"),
            F.col("group_epoch").alias("from_epoch"),
            "to_id",
            "to_ms",
            "to_epoch",
        )
    )
    mapping = (
        added.select("group_id", "resource", "connector")
        .dropDuplicates(["group_id", "resource"])
        .withColumn(
            "task",
            F.when(F.col("resource") == F.col("connector"), F.lit(None).cast("int")).otherwise(
                F.expr("cast(substring(resource, length(connector) + 2) as int)")
            ),
        )
        .withColumn(
            "resource_type",
            F.when(F.col("task").isNull(), F.lit("connector")).otherwise(F.lit("task")),
        )
    )
    return intervals, mapping


def _moved(e: DataFrame) -> DataFrame:
    """The members each install moved to its epoch at once (DESIGN 3.21): STABLE at that epoch
    from the install's event on, as if it had been delivered to them there."""
    return e.filter(F.col("event_type") == ev.TARGET_INSTALLED).select(
        "group_id",
        F.explode(F.coalesce(F.col("p_moved_members"), _empty())).alias("member_id"),
        "id",
        "at_ms",
        F.col("p_assignment_epoch").alias("level"),
        F.lit(True).alias("reaches"),
    )


def member_levels(
    member_rows: DataFrame, members: DataFrame, moved: DataFrame | None = None
) -> DataFrame:
    """Per member and epoch, the first event at which the member had reached that epoch's target:
    STABLE at that epoch, or at any later epoch, by a delivery or by an install that `moved` it
    (`_moved`). A new member (joined, or a static member taking over) starts from the group
    epoch it joined at."""
    delivered = member_rows.filter(F.col("member_epoch").isNotNull()).select(
        "group_id",
        "member_id",
        "id",
        "at_ms",
        F.when(F.col("member_state") == "STABLE", F.col("member_epoch"))
        .otherwise(F.col("member_epoch") - 1)
        .alias("level"),
        F.lit(True).alias("reaches"),
    )
    if moved is not None:
        delivered = delivered.unionByName(moved)
    joins = members.filter(
        F.col("event_type").isin(ev.MEMBER_JOINED, ev.STATIC_MEMBER_REPLACED)
    ).select(
        "group_id",
        "member_id",
        "id",
        "at_ms",
        (F.col("group_epoch") - 1).alias("level"),
        F.lit(False).alias("reaches"),
    )
    w = (
        Window.partitionBy("group_id", "member_id")
        .orderBy("id")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    rows = delivered.unionByName(joins).withColumn("floor", F.max("level").over(w))
    return rows.filter(
        F.col("reaches") & F.col("floor").isNotNull() & (F.col("level") > F.col("floor"))
    ).select(
        "group_id",
        "member_id",
        F.explode(F.sequence(F.col("floor") + 1, F.col("level"))).alias("epoch"),
        F.col("id").alias("reach_id"),
        F.col("at_ms").alias("reach_ms"),
    )


def build(e: DataFrame, keep: Callable[[DataFrame], DataFrame] = lambda df: df) -> Timeline:
    """The timeline of parsed events `e` (`events.parsed`); `keep` is applied to every part
    that later steps read more than once (e.g. to persist it)."""
    rows = _member_rows(e)
    if e.filter(F.col("event_type") == ev.STATIC_MEMBER_REPLACED).limit(1).count() > 0:
        rows = _with_takeovers(rows)
    members = keep(membership(e))
    intervals, mapping = existence(e)
    return Timeline(
        ownership=keep(ownership(_carry(rows))),
        membership=members,
        live_counts=live_counts(members, e),
        existence=intervals,
        resources=mapping,
        member_levels=member_levels(rows, members, _moved(e)),
    )
