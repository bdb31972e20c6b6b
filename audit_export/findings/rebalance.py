"""The `rebalances` finding: one row per group epoch bump, built from one small table per aspect
of it (the bump, the target installed for it and what that target moved, the revocations asked
for it, how its members converged, the live members when it happened, the resources lost in it),
joined on (group, epoch) and turned into the output columns."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType

from .. import events as ev
from .. import timeline as tl


def rebalances(e: DataFrame, t: tl.Timeline, lost: DataFrame) -> DataFrame:
    """One row per group epoch bump (see the package's docstring for the columns' meaning)."""
    installs = _installs(e)
    joined = (
        _bumps(e)
        .join(installs, ["group_id", "epoch"], "left")
        .join(_revoked(e), ["group_id", "epoch"], "left")
        .join(_convergence(installs, t), ["group_id", "epoch"], "left")
        .join(_live_at_bump(t), ["group_id", "bump_event_id"], "left")
        .join(_lost_per_epoch(lost), ["group_id", "epoch"], "left")
    )
    return joined.select(*_output_columns())


def _bumps(e: DataFrame) -> DataFrame:
    """The epoch bumps: reason, trigger, when; and the next bump's event (null for the last)."""
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
    return bumps.withColumn("next_bump_event_id", F.lead("bump_event_id").over(wg))


def _installs(e: DataFrame) -> DataFrame:
    """Per group epoch, the first target installed for it, its moves split by kind."""
    return _split_moves(_first_installs(e))


def _first_installs(e: DataFrame) -> DataFrame:
    """Per group epoch, the first TARGET_INSTALLED event for it: when, by whom, its moves."""
    return (
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


def _split_moves(installs: DataFrame) -> DataFrame:
    """Adds the resources the target `moved` (member to member), `newly_assigned` (from nobody)
    and `left_unassigned` (to nobody); `moves` becomes an empty array where it was null."""
    moves = F.coalesce(F.col("moves"), F.array().cast(ArrayType(ev.MOVE)))
    return (
        installs.withColumn(
            "moved",
            _resources(moves, lambda m: m["from"].isNotNull() & m["to"].isNotNull()),
        )
        .withColumn("newly_assigned", _resources(moves, lambda m: m["from"].isNull()))
        .withColumn("left_unassigned", _resources(moves, lambda m: m["to"].isNull()))
        .withColumn("moves", moves)
    )


def _resources(moves: Column, which: Callable[[Column], Column]) -> Column:
    """The resources of the moves that `which` selects."""
    return F.transform(F.filter(moves, which), lambda m: m["resource"])


def _revoked(e: DataFrame) -> DataFrame:
    """Per group epoch, the resources members were asked to revoke for its target (sorted)."""
    return (
        e.filter(F.col("event_type") == ev.REVOCATION_REQUESTED)
        .select(
            "group_id",
            F.col("p_target_epoch").alias("epoch"),
            F.explode(F.col("p_revoke")).alias("resource"),
        )
        .groupBy("group_id", "epoch")
        .agg(F.array_sort(F.collect_set("resource")).alias("revoked"))
    )


def _convergence(installs: DataFrame, t: tl.Timeline) -> DataFrame:
    """Per group epoch with a target: how many members had to reach it (those live when it was
    installed), how many have neither reached it nor left, and when the last one was done."""
    return (
        _members_at_install(installs, t)
        .join(t.member_levels, ["group_id", "member_id", "epoch"], "left")
        .groupBy("group_id", "epoch", "member_id", "live_to_id", "live_to_ms")
        .agg(F.min_by(F.struct("reach_id", "reach_ms"), "reach_id").alias("r"))
        .withColumn("done_ms", _done_ms())
        .groupBy("group_id", "epoch")
        .agg(
            F.count("*").alias("members_to_converge"),
            F.sum(F.col("done_ms").isNull().cast("int")).alias("members_not_converged"),
            F.max("done_ms").alias("last_done_ms"),
        )
    )


def _members_at_install(installs: DataFrame, t: tl.Timeline) -> DataFrame:
    """Per installed target, the member incarnations live when it was installed."""
    return (
        installs.select("group_id", "epoch", "install_event_id")
        .join(_live_intervals(t.membership), "group_id")
        .filter(
            (F.col("live_from_id") < F.col("install_event_id"))
            & (F.col("live_to_id").isNull() | (F.col("live_to_id") > F.col("install_event_id")))
        )
    )


def _done_ms() -> Column:
    """When a member was done with a target: when it first reached it (`r`), if that was before
    it left; else when it left; null while it has done neither."""
    reached_while_live = F.col("r.reach_id").isNotNull() & (
        F.col("live_to_id").isNull() | (F.col("r.reach_id") < F.col("live_to_id"))
    )
    return F.when(reached_while_live, F.col("r.reach_ms")).otherwise(F.col("live_to_ms"))


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


def _live_at_bump(t: tl.Timeline) -> DataFrame:
    """The number of live members at each epoch bump."""
    return t.live_counts.filter(F.col("order") == 1).select(
        "group_id", F.col("id").alias("bump_event_id"), "live_members"
    )


def _lost_per_epoch(lost: DataFrame) -> DataFrame:
    """Per group epoch, the resources lost in it: how many, the longest wait, how many still
    wait."""
    return lost.groupBy("group_id", F.col("epoch")).agg(
        F.count("*").alias("lost_resources"),
        F.max("waited_ms").alias("max_lost_wait_ms"),
        F.sum(F.col("restarted_at_ms").isNull().cast("int")).alias("lost_still_waiting"),
    )


def _outcome() -> tuple[Column, Column]:
    """A bump's `converged_at_ms` and `status`, from the joined install, convergence and live
    count: converged when every member is done with the installed target; no_members when no
    target came and no member was live; else in_progress, superseded or awaiting_target."""
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
    return converged_at, status


def _strs(values: Column) -> Column:
    return F.array_sort(F.coalesce(values, ev.empty_names()))


def _output_columns() -> list[Column | str]:
    """The finding's columns, in order, from the joined tables."""
    converged_at, status = _outcome()
    return [
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
    ]
