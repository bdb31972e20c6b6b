"""Audit findings, computed in Spark from the exported events and the snapshot.

- `rebalances`: one row per group epoch bump: its reason (and the member or connector behind
  it), the target installed for it and what that target moved (`moved`: from one member to
  another; `newly_assigned`: from nobody; `left_unassigned`: taken from a member and given to
  nobody, e.g. held back for a delayed rebalance), what members were told to revoke for it, and
  the time from the bump until every member that was in the group when the target was installed
  had reached it (STABLE at that epoch or later, or gone); plus the lost resources it handled.
  A classic group (DESIGN 3.19) has one row per generation instead (`group_type` "classic"):
  the reason its rebalance started (CLASSIC_REBALANCE_STARTED) and the member behind it, the
  join's completion as its install (`installed_at_ms`; the leader as `leader_id` and
  `assignor_member_id`, the `protocol` voted, what a hold kept from the leader as `withheld`),
  what the generation's SyncGroup answers gave (`moved` from the resource's last owner,
  `newly_assigned` from nobody), what they revoked, and when every member of the join had been
  answered at that generation (or a later one) or was gone (`converged_at_ms`); `status`
  `refused` with `refused_reason` when the leader's assignments were refused, `awaiting_join`
  before the join completed. Connect rows have `group_type` "connect" and no leader.
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

Modules, one per job: `rebalance`, `lost`, `moves`, `violations` (the violation kinds and rows,
DOUBLE_OWNERSHIP, MEMBER_LISTED_AFTER_REMOVAL), `unassigned` (UNASSIGNED_TOO_LONG) and `common`
(`FindingsConfig`, `Findings`). This package is their public surface: `compute` runs them all.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .. import events as ev
from .. import timeline as tl
from .common import FINDING_TABLES, Findings, FindingsConfig
from .lost import lost_resources
from .moves import connector_moves
from .rebalance import rebalances
from .unassigned import unassigned_too_long
from .violations import (
    DOUBLE_OWNERSHIP,
    MEMBER_LISTED_AFTER_REMOVAL,
    UNASSIGNED_TOO_LONG,
    VIOLATION_COLUMNS,
    double_ownership_in_events,
    double_ownership_in_snapshot,
    listed_after_removal,
)

__all__ = [
    "DOUBLE_OWNERSHIP",
    "FINDING_TABLES",
    "MEMBER_LISTED_AFTER_REMOVAL",
    "UNASSIGNED_TOO_LONG",
    "VIOLATION_COLUMNS",
    "Findings",
    "FindingsConfig",
    "compute",
    "connector_moves",
    "double_ownership_in_events",
    "double_ownership_in_snapshot",
    "listed_after_removal",
    "lost_resources",
    "rebalances",
    "unassigned_too_long",
]


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
