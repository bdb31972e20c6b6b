"""Audit findings, computed in Spark from the exported events and the snapshot.

- `rebalances`: one row per group epoch bump: its reason (and the member or connector behind
  it), the target installed for it and what that target moved (`moved`: from one member to
  another; `newly_assigned`: from nobody; `left_unassigned`: taken from a member and given to
  nobody, e.g. held back for a delayed rebalance), what members were told to revoke for it, and
  the time from the bump until every member that was in the group when the target was installed
  had reached it (STABLE at that epoch or later, or gone); plus the lost resources it handled.
- `lost_resources`: every resource a member stopped running because it left, was fenced, expired
  or timed out: when, and how long until some member ran it again (`waited_ms`; null while it
  still waits).
- `connector_moves`: per connector, how often its tasks (and the connector itself) started on a
  different worker than the one that ran them before, and how often targets moved them.
- `violations`:
    - DOUBLE_OWNERSHIP: a resource in two members' current assignments at once (assigned or
      pending revocation): from the events (overlapping running intervals) and in the snapshot.
    - UNASSIGNED_TOO_LONG: a catalogue resource that no member ran for longer than the grace
      window while the group had live members, with no delayed rebalance pending and no hold on
      it (a fenced or timed-out member's work, or a departed static member's).
    - MEMBER_LISTED_AFTER_REMOVAL: a member still in the members table after an event removed it.
  Each names the group, the group epoch and the resource (and the members involved).
- `ownership`: the running intervals themselves (the report's timeline).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType

from . import events as ev
from . import timeline as tl

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

FINDING_TABLES = ("rebalances", "lost_resources", "connector_moves", "violations", "ownership")


@dataclass(frozen=True)
class FindingsConfig:
    """Attributes:
    grace_ms: how long a catalogue resource may run nowhere before it is a violation.
    as_of_ms: "now" for what has not ended yet (open gaps, resources still waiting).
    snapshot_after_event_id: the snapshot reflects every event up to this id.
    """

    grace_ms: int
    as_of_ms: int
    snapshot_after_event_id: int


@dataclass(frozen=True)
class Findings:
    rebalances: DataFrame
    lost_resources: DataFrame
    connector_moves: DataFrame
    violations: DataFrame
    ownership: DataFrame

    def tables(self) -> dict[str, DataFrame]:
        return {name: getattr(self, name) for name in FINDING_TABLES}


def _strs(values: Column) -> Column:
    return F.array_sort(F.coalesce(values, ev.empty_names()))


# --- rebalances ---------------------------------------------------------------------------


def rebalances(e: DataFrame, t: tl.Timeline, lost: DataFrame) -> DataFrame:
    bumps = e.filter(F.col("event_type") == ev.GROUP_EPOCH_BUMPED).select(
        "group_id",
        F.col("group_epoch").alias("epoch"),
        F.col("p_reason").alias("reason"),
        F.col("member_id").alias("trigger_member_id"),
        F.col("p_connector").alias("trigger_connector"),
        F.col("id").alias("bump_event_id"),
        F.col("at_ms").alias("bumped_at_ms"),
    )
    wg = Window.partitionBy("group_id").orderBy("epoch")
    bumps = bumps.withColumn("next_bump_event_id", F.lead("bump_event_id").over(wg))

    installs = (
        e.filter(F.col("event_type") == ev.TARGET_INSTALLED)
        .groupBy("group_id", F.col("p_assignment_epoch").alias("epoch"))
        .agg(
            F.min_by(
                F.struct(
                    F.col("id").alias("install_event_id"),
                    F.col("at_ms").alias("installed_at_ms"),
                    F.col("member_id").alias("assignor_member_id"),
                    F.col("p_moves").alias("moves"),
                    F.col("p_unassigned").alias("unassigned"),
                    F.col("p_scheduled_rebalance_delay_ms").alias("scheduled_rebalance_delay_ms"),
                ),
                "id",
            ).alias("i")
        )
        .select("group_id", "epoch", "i.*")
    )
    moves = F.coalesce(F.col("moves"), F.array().cast(ArrayType(ev.MOVE)))
    installs = (
        installs.withColumn(
            "moved",
            F.transform(
                F.filter(moves, lambda m: m["from"].isNotNull() & m["to"].isNotNull()),
                lambda m: m["resource"],
            ),
        )
        .withColumn(
            "newly_assigned",
            F.transform(F.filter(moves, lambda m: m["from"].isNull()), lambda m: m["resource"]),
        )
        .withColumn(
            "left_unassigned",
            F.transform(F.filter(moves, lambda m: m["to"].isNull()), lambda m: m["resource"]),
        )
        .withColumn("moves", moves)
    )

    revoked = (
        e.filter(F.col("event_type") == ev.REVOCATION_REQUESTED)
        .select(
            "group_id",
            F.col("p_target_epoch").alias("epoch"),
            F.explode(F.col("p_revoke")).alias("resource"),
        )
        .groupBy("group_id", "epoch")
        .agg(F.array_sort(F.collect_set("resource")).alias("revoked"))
    )

    # Members live when the target was installed, and when each reached it (or left).
    live = _live_intervals(t.membership)
    pairs = (
        installs.select("group_id", "epoch", "install_event_id")
        .join(live, "group_id")
        .filter(
            (F.col("live_from_id") < F.col("install_event_id"))
            & (F.col("live_to_id").isNull() | (F.col("live_to_id") > F.col("install_event_id")))
        )
    )
    reached = (
        pairs.join(t.member_levels, ["group_id", "member_id", "epoch"], "left")
        .groupBy("group_id", "epoch", "member_id", "live_to_id", "live_to_ms")
        .agg(F.min_by(F.struct("reach_id", "reach_ms"), "reach_id").alias("r"))
        .withColumn(
            "done_ms",
            F.when(
                F.col("r.reach_id").isNotNull()
                & (F.col("live_to_id").isNull() | (F.col("r.reach_id") < F.col("live_to_id"))),
                F.col("r.reach_ms"),
            ).otherwise(F.col("live_to_ms")),
        )
        .groupBy("group_id", "epoch")
        .agg(
            F.count("*").alias("members_to_converge"),
            F.sum(F.col("done_ms").isNull().cast("int")).alias("members_not_converged"),
            F.max("done_ms").alias("last_done_ms"),
        )
    )

    live_at_bump = t.live_counts.filter(F.col("order") == 1).select(
        "group_id", F.col("id").alias("bump_event_id"), "live_members"
    )
    lost_per_epoch = lost.groupBy("group_id", F.col("epoch")).agg(
        F.count("*").alias("lost_resources"),
        F.max("waited_ms").alias("max_lost_wait_ms"),
        F.sum(F.col("restarted_at_ms").isNull().cast("int")).alias("lost_still_waiting"),
    )

    out = (
        bumps.join(installs, ["group_id", "epoch"], "left")
        .join(revoked, ["group_id", "epoch"], "left")
        .join(reached, ["group_id", "epoch"], "left")
        .join(live_at_bump, ["group_id", "bump_event_id"], "left")
        .join(lost_per_epoch, ["group_id", "epoch"], "left")
    )
    installed = F.col("install_event_id").isNotNull()
    converged = installed & (F.coalesce(F.col("members_not_converged"), F.lit(0)) == 0)
    no_members = ~installed & (F.coalesce(F.col("live_members"), F.lit(0)) == 0)
    converged_at = (
        F.when(converged, F.greatest(F.col("last_done_ms"), F.col("installed_at_ms")))
        .when(no_members, F.col("bumped_at_ms"))
        .cast("long")
    )
    status = (
        F.when(converged, F.lit("converged"))
        .when(no_members, F.lit("no_members"))
        .when(installed, F.lit("in_progress"))
        .when(F.col("next_bump_event_id").isNotNull(), F.lit("superseded"))
        .otherwise(F.lit("awaiting_target"))
    )
    return out.select(
        "group_id",
        F.col("epoch").alias("group_epoch"),
        "reason",
        "trigger_member_id",
        "trigger_connector",
        "bump_event_id",
        "bumped_at_ms",
        F.timestamp_millis("bumped_at_ms").alias("bumped_at"),
        "install_event_id",
        "installed_at_ms",
        "assignor_member_id",
        F.coalesce("scheduled_rebalance_delay_ms", F.lit(0)).alias("scheduled_rebalance_delay_ms"),
        "moves",
        _strs(F.col("moved")).alias("moved"),
        _strs(F.col("newly_assigned")).alias("newly_assigned"),
        _strs(F.col("left_unassigned")).alias("left_unassigned"),
        _strs(F.col("revoked")).alias("revoked"),
        F.size(_strs(F.col("moved"))).alias("moved_count"),
        F.size(_strs(F.col("newly_assigned"))).alias("newly_assigned_count"),
        F.size(_strs(F.col("revoked"))).alias("revoked_count"),
        F.coalesce("members_to_converge", F.lit(0)).alias("members_to_converge"),
        converged_at.alias("converged_at_ms"),
        (converged_at - F.col("bumped_at_ms")).alias("duration_ms"),
        status.alias("status"),
        F.coalesce("lost_resources", F.lit(0)).alias("lost_resources"),
        "max_lost_wait_ms",
        F.coalesce("lost_still_waiting", F.lit(0)).alias("lost_still_waiting"),
    )


def _live_intervals(membership: DataFrame) -> DataFrame:
    """Per member incarnation: from the event that made it live to the one that ended it."""
    w = Window.partitionBy("group_id", "member_id").orderBy("id")
    rows = membership.withColumn(
        "was_live", F.coalesce(F.lag("live").over(w), F.lit(False))
    ).filter(F.col("live") != F.col("was_live"))
    w2 = Window.partitionBy("group_id", "member_id").orderBy("id")
    return (
        rows.withColumn("live_to_id", F.lead("id").over(w2))
        .withColumn("live_to_ms", F.lead("at_ms").over(w2))
        .filter(F.col("live"))
        .select(
            "group_id",
            "member_id",
            F.col("id").alias("live_from_id"),
            "live_to_id",
            "live_to_ms",
        )
    )


# --- lost resources -----------------------------------------------------------------------


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
        .when(ty.isin(ev.MEMBER_FENCED, ev.REVOCATION_TIMED_OUT), F.col("p_held"))
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


# --- connector moves ----------------------------------------------------------------------


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


# --- violations ---------------------------------------------------------------------------


def _violation(
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
    return _violation(
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
    return _violation(
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
    holds = e.filter(F.col("event_type").isin(ev.MEMBER_FENCED, ev.REVOCATION_TIMED_OUT)).select(
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
    return _violation(
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


def listed_after_removal(
    t: tl.Timeline, snapshot_members: DataFrame, snapshot_current: DataFrame, after_id: int
) -> DataFrame:
    w = Window.partitionBy("group_id", "member_id").orderBy(F.col("id").desc())
    last = t.membership.withColumn("n", F.row_number().over(w)).filter(
        (F.col("n") == 1) & ~F.col("listed") & (F.col("id") <= after_id)
    )
    held = snapshot_current.groupBy("group_id", "member_id").agg(
        F.array_join(F.array_sort(F.collect_set("resource")), ", ").alias("holds")
    )
    found = last.join(
        snapshot_members.select("group_id", "member_id"), ["group_id", "member_id"], "left_semi"
    ).join(held, ["group_id", "member_id"], "left")
    return _violation(
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


# --- all of them --------------------------------------------------------------------------


def compute(
    events: DataFrame,
    snapshot: dict[str, DataFrame],
    config: FindingsConfig,
    keep: Callable[[DataFrame], DataFrame] = lambda df: df,
) -> Findings:
    """Findings from every exported event (raw event rows) and this run's snapshot tables.

    `keep` is applied to the intermediate results that several findings read (the parsed
    events and the timeline), e.g. to persist them."""
    used = events.filter(F.col("event_type").isin(*ev.USED_EVENT_TYPES))
    e = keep(ev.parsed(used))
    t = tl.build(e, keep)
    lost = lost_resources(e, t, config.as_of_ms)
    violations = (
        double_ownership_in_events(t, config.as_of_ms)
        .unionByName(double_ownership_in_snapshot(snapshot["current_assignment"]))
        .unionByName(
            unassigned_too_long(e, t, snapshot["catalogue"], snapshot["current_assignment"], config)
        )
        .unionByName(
            listed_after_removal(
                t,
                snapshot["members"],
                snapshot["current_assignment"],
                config.snapshot_after_event_id,
            )
        )
    )
    return Findings(
        rebalances=rebalances(e, t, lost),
        lost_resources=lost.withColumnRenamed("epoch", "group_epoch"),
        connector_moves=connector_moves(e, t),
        violations=violations,
        ownership=t.ownership,
    )
