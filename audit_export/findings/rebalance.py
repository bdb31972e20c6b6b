"""The `rebalances` finding: one row per group epoch bump of a connect group, and one per
generation of a classic group, built from one small table per aspect of it (the bump, the target
installed for it and what that target moved, the revocations asked for it, how its members
converged, the live members when it happened, the resources lost in it), joined on (group, epoch)
and turned into the output columns.

A classic generation g + 1 (plan-issue25 3.11) is opened by the first CLASSIC_REBALANCE_STARTED at
g (or, with none, by its CLASSIC_JOIN_COMPLETED); that completion stands for the install (its
leader as the assignor, its `members` those that must converge); its moves are what the
generation's SyncGroup answers (ASSIGNMENT_DELIVERED at member epoch g + 1) added, from each
resource's last owner; a member has converged at its first answer of g + 1 or later, or when it
stops being live; an ASSIGNMENT_REFUSED after the completion makes it `refused`. The pure fold
(`audit_export.fold.group`) computes the same rows event by event."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType

from .. import events as ev
from .. import timeline as tl

CONNECT = "connect"
CLASSIC = "classic"
_KEY = ["group_id", "epoch", "group_type"]


def rebalances(e: DataFrame, t: tl.Timeline, lost: DataFrame) -> DataFrame:
    """One row per group epoch bump or classic generation (see the package's docstring for the
    columns' meaning)."""
    connect_installs = _first_installs(e)
    completions = _classic_completions(e)
    installs = _split_moves(connect_installs.unionByName(_classic_installs(e, t, completions)))
    convergence = _convergence(connect_installs, t).unionByName(
        _classic_convergence(e, t, completions)
    )
    joined = (
        _openings(e)
        .join(installs, _KEY, "left")
        .join(_revoked(e), ["group_id", "epoch"], "left")
        .join(convergence, _KEY, "left")
        .join(_live_at_bump(t), ["group_id", "bump_event_id"], "left")
        .join(_lost_per_epoch(lost), ["group_id", "epoch"], "left")
    )
    return joined.select(*_output_columns())


def _openings(e: DataFrame) -> DataFrame:
    """The rows: connect epoch bumps and classic generations opened; reason, trigger, when;
    and the next row's opening event (null for the last)."""
    bumps = e.filter(F.col("event_type") == ev.GROUP_EPOCH_BUMPED).select(
        "group_id",
        F.col("group_epoch").alias("epoch"),
        F.lit(CONNECT).alias("group_type"),
        F.col("p_reason").alias("reason"),
        F.col("member_id").alias("trigger_member_id"),
        F.col("p_connector").alias("trigger_connector"),
        F.col("id").alias("bump_event_id"),
        F.col("at_ms").alias("bumped_at_ms"),
    )
    wg = Window.partitionBy("group_id").orderBy("epoch")
    return bumps.unionByName(_classic_openings(e)).withColumn(
        "next_bump_event_id", F.lead("bump_event_id").over(wg)
    )


def _generation() -> Column:
    """A classic event's generation: its payload's, else its group epoch (the same number)."""
    return F.coalesce(F.col("p_generation"), F.col("group_epoch"))


def _classic_openings(e: DataFrame) -> DataFrame:
    """Per classic generation, the event that opened its row: the first rebalance started at the
    generation before (its reason and trigger), or else its join completion (no reason)."""
    started = e.filter(F.col("event_type") == ev.CLASSIC_REBALANCE_STARTED).select(
        "group_id",
        (_generation() + 1).alias("epoch"),
        "id",
        "at_ms",
        F.col("p_reason").alias("reason"),
        F.col("member_id").alias("trigger_member_id"),
        F.col("p_connector").alias("trigger_connector"),
    )
    completed = e.filter(F.col("event_type") == ev.CLASSIC_JOIN_COMPLETED).select(
        "group_id",
        _generation().alias("epoch"),
        "id",
        "at_ms",
        F.lit(None).cast("string").alias("reason"),
        F.lit(None).cast("string").alias("trigger_member_id"),
        F.lit(None).cast("string").alias("trigger_connector"),
    )
    first = F.min_by(
        F.struct("reason", "trigger_member_id", "trigger_connector", "id", "at_ms"), "id"
    ).alias("o")
    return (
        started.unionByName(completed)
        .groupBy("group_id", "epoch")
        .agg(first)
        .select(
            "group_id",
            "epoch",
            F.lit(CLASSIC).alias("group_type"),
            "o.reason",
            "o.trigger_member_id",
            "o.trigger_connector",
            F.col("o.id").alias("bump_event_id"),
            F.col("o.at_ms").alias("bumped_at_ms"),
        )
    )


def _classic_completions(e: DataFrame) -> DataFrame:
    """Per classic generation, its first join completion: when, the leader, the protocol, the
    members that must sync, what a hold kept from the leader; and the first refusal of the
    leader's assignments after it (`refused_event_id`, `refused_reason`)."""
    completed = (
        e.filter(F.col("event_type") == ev.CLASSIC_JOIN_COMPLETED)
        .groupBy("group_id", _generation().alias("epoch"))
        .agg(
            F.min_by(
                F.struct(
                    F.col("id").alias("install_event_id"),
                    F.col("at_ms").alias("installed_at_ms"),
                    F.col("p_leader").alias("leader_id"),
                    F.col("p_protocol").alias("protocol"),
                    F.col("p_members").alias("members"),
                    F.col("p_withheld").alias("withheld"),
                ),
                "id",
            ).alias("c")
        )
        .select("group_id", "epoch", "c.*")
    )
    refusals = e.filter(F.col("event_type") == ev.ASSIGNMENT_REFUSED).select(
        "group_id",
        _generation().alias("epoch"),
        F.col("id").alias("refused_id"),
        F.coalesce(F.col("p_reason"), F.lit("")).alias("refused_reason"),
    )
    refused = (
        completed.select("group_id", "epoch", "install_event_id")
        .join(refusals, ["group_id", "epoch"])
        .filter(F.col("refused_id") > F.col("install_event_id"))
        .groupBy("group_id", "epoch")
        .agg(
            F.min("refused_id").alias("refused_event_id"),
            F.min_by("refused_reason", "refused_id").alias("refused_reason"),
        )
    )
    return completed.join(refused, ["group_id", "epoch"], "left")


def _classic_installs(e: DataFrame, t: tl.Timeline, completions: DataFrame) -> DataFrame:
    """The classic completions in the shape of `_first_installs` (the leader as the assignor),
    with their moves: what each SyncGroup answer of the generation added (before a refusal),
    from the resource's last owner before that answer (null: newly assigned); a resource given
    back to the member that last ran it did not move."""
    added = (
        e.filter(
            (F.col("event_type") == ev.ASSIGNMENT_DELIVERED)
            & F.col("member_id").isNotNull()
            & F.col("p_member_epoch").isNotNull()
        )
        .select(
            "group_id",
            F.col("p_member_epoch").alias("epoch"),
            F.col("id").alias("delivery_id"),
            F.col("member_id").alias("to"),
            F.explode(F.array_distinct(F.col("p_added"))).alias("resource"),
        )
        .join(
            completions.select("group_id", "epoch", "install_event_id", "refused_event_id"),
            ["group_id", "epoch"],
        )
        .filter(
            (F.col("delivery_id") > F.col("install_event_id"))
            & (
                F.col("refused_event_id").isNull()
                | (F.col("delivery_id") < F.col("refused_event_id"))
            )
        )
    )
    runs = t.ownership.select(
        F.col("group_id").alias("r_group"),
        F.col("resource").alias("r_resource"),
        F.col("member_id").alias("owner"),
        "start_id",
    )
    earlier = (
        (F.col("r_group") == F.col("group_id"))
        & (F.col("r_resource") == F.col("resource"))
        & (F.col("start_id") < F.col("delivery_id"))
    )
    owners = (
        added.join(runs, earlier, "left")
        .groupBy("group_id", "epoch", "delivery_id", "to", "resource")
        .agg(F.max_by("owner", "start_id").alias("from"))
    )
    moves = (
        owners.filter(F.col("from").isNull() | (F.col("from") != F.col("to")))
        .groupBy("group_id", "epoch")
        .agg(F.sort_array(F.collect_set(F.struct("resource", "from", "to"))).alias("moves"))
    )
    return completions.join(moves, ["group_id", "epoch"], "left").select(
        "group_id",
        "epoch",
        F.lit(CLASSIC).alias("group_type"),
        "install_event_id",
        "installed_at_ms",
        F.col("leader_id").alias("assignor_member_id"),
        "leader_id",
        "protocol",
        "withheld",
        "refused_reason",
        "moves",
        F.lit(None).cast("array<string>").alias("unassigned"),
        F.lit(None).cast("long").alias("scheduled_rebalance_delay_ms"),
    )


def _classic_convergence(e: DataFrame, t: tl.Timeline, completions: DataFrame) -> DataFrame:
    """Per completed classic generation: how many members had to sync to it (its `members`),
    how many have neither been answered at it (or a later generation) nor stopped being live
    since, and when the last one that did was done."""
    members = completions.select(
        "group_id",
        "epoch",
        "install_event_id",
        F.explode(F.array_distinct(F.col("members"))).alias("member_id"),
    )
    deliveries = e.filter(
        (F.col("event_type") == ev.ASSIGNMENT_DELIVERED) & F.col("p_member_epoch").isNotNull()
    ).select(
        "group_id",
        "member_id",
        F.col("id").alias("done_id"),
        F.col("at_ms").alias("done_ms"),
        F.col("p_member_epoch").alias("reached"),
    )
    synced = (
        members.join(deliveries, ["group_id", "member_id"])
        .filter(
            (F.col("reached") >= F.col("epoch")) & (F.col("done_id") > F.col("install_event_id"))
        )
        .select("group_id", "epoch", "member_id", "done_id", "done_ms")
    )
    left = (
        members.join(
            _live_intervals(t.membership).filter(F.col("live_to_id").isNotNull()),
            ["group_id", "member_id"],
        )
        .filter(F.col("live_to_id") > F.col("install_event_id"))
        .select(
            "group_id",
            "epoch",
            "member_id",
            F.col("live_to_id").alias("done_id"),
            F.col("live_to_ms").alias("done_ms"),
        )
    )
    done = (
        synced.unionByName(left)
        .groupBy("group_id", "epoch", "member_id")
        .agg(F.min_by("done_ms", "done_id").alias("done_ms"))
    )
    return (
        members.join(done, ["group_id", "epoch", "member_id"], "left")
        .groupBy("group_id", "epoch")
        .agg(
            F.count("*").alias("members_to_converge"),
            F.sum(F.col("done_ms").isNull().cast("int")).alias("members_not_converged"),
            F.max("done_ms").alias("last_done_ms"),
        )
        .withColumn("group_type", F.lit(CLASSIC))
    )


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
        .select(
            "group_id",
            "epoch",
            F.lit(CONNECT).alias("group_type"),
            "i.*",
            F.lit(None).cast("string").alias("leader_id"),
            F.lit(None).cast("string").alias("protocol"),
            F.lit(None).cast("array<string>").alias("withheld"),
            F.lit(None).cast("string").alias("refused_reason"),
        )
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
        .withColumn("group_type", F.lit(CONNECT))
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
    """A row's `converged_at_ms` and `status`, from the joined install, convergence and live
    count: converged when every member is done with the installed target (classic: the
    completed generation); no_members when no target came and no member was live (classic: the
    join completed with no member); refused when the classic leader's assignments were refused;
    else in_progress, superseded or awaiting_target (classic: awaiting_join)."""
    classic = F.col("group_type") == CLASSIC
    installed = F.col("install_event_id").isNotNull()
    refused = F.col("refused_reason").isNotNull()
    converged = installed & (F.coalesce(F.col("members_not_converged"), F.lit(0)) == 0) & ~refused
    no_members = F.when(
        classic, converged & (F.coalesce(F.col("members_to_converge"), F.lit(0)) == 0)
    ).otherwise(~installed & (F.coalesce(F.col("live_members"), F.lit(0)) == 0))
    converged_at = (
        F.when(classic & no_members, F.col("installed_at_ms"))
        .when(converged, F.greatest(F.col("last_done_ms"), F.col("installed_at_ms")))
        .when(no_members, F.col("bumped_at_ms"))
        .cast("long")
    )
    status = (
        F.when(refused, F.lit("refused"))
        .when(classic & no_members, F.lit("no_members"))
        .when(converged, F.lit("converged"))
        .when(no_members, F.lit("no_members"))
        .when(installed, F.lit("in_progress"))
        .when(F.col("next_bump_event_id").isNotNull(), F.lit("superseded"))
        .when(classic, F.lit("awaiting_join"))
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
        "group_type",
        "reason",
        "trigger_member_id",
        "trigger_connector",
        "bump_event_id",
        "bumped_at_ms",
        F.timestamp_millis("bumped_at_ms").alias("bumped_at"),
        "install_event_id",
        "installed_at_ms",
        "assignor_member_id",
        "leader_id",
        "protocol",
        _strs(F.col("withheld")).alias("withheld"),
        "refused_reason",
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
