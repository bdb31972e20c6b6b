"""Incremental findings in Spark: each run folds only its own events into the state the previous
export date carried (`fold`), group by group on the executors, and carries the new state.

    <output>/_findings_state/export_date=YYYY-MM-DD/part-*.parquet
        group_id, last_event_id, state (the group's `fold.GroupState` as JSON)

A run for date D starts from the state of the latest earlier date that has one, so re-running D
(the latest or an older one) starts from the same state again and repeats its findings. With no
such state (the first run, or an output written before incremental findings), or if a group's new
events are not all after its state (which the coordinator's per-group commit order rules out), the
run folds every exported event up to D from nothing instead: the same result, at the old cost.

A run writes, per findings table, the rows it created or changed and every row still `open` (one
a later event, or only time, can still change). The findings as of the latest run are therefore:
for each row's key, its row from the latest export date that has it, keeping a row of an earlier
date only if it is not open (`current`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from . import events as ev
from .findings import (
    UNASSIGNED_TOO_LONG,
    FindingsConfig,
    double_ownership_in_snapshot,
)
from .findings.violations import removed_but_listed
from .fold import Event, GroupState, fold_group
from .fs import OutputFS, join
from .snapshot import SCHEMA_FILE

log = logging.getLogger(__name__)

STATE_DIR = "_findings_state"

SCHEMAS: dict[str, str] = {
    "rebalances": (
        "group_id STRING, group_epoch INT, group_type STRING, reason STRING, "
        "trigger_member_id STRING, trigger_connector STRING, bump_event_id BIGINT, "
        "bumped_at_ms BIGINT, install_event_id BIGINT, installed_at_ms BIGINT, "
        "assignor_member_id STRING, leader_id STRING, protocol STRING, withheld ARRAY<STRING>, "
        "refused_reason STRING, scheduled_rebalance_delay_ms BIGINT, "
        "moves ARRAY<STRUCT<resource: STRING, `from`: STRING, `to`: STRING>>, "
        "moved ARRAY<STRING>, newly_assigned ARRAY<STRING>, left_unassigned ARRAY<STRING>, "
        "removed ARRAY<STRING>, revoked ARRAY<STRING>, moved_count INT, "
        "newly_assigned_count INT, revoked_count INT, members_to_converge BIGINT, "
        "converged_at_ms BIGINT, duration_ms BIGINT, status STRING, lost_resources BIGINT, "
        "max_lost_wait_ms BIGINT, lost_still_waiting BIGINT, open BOOLEAN"
    ),
    "lost_resources": (
        "group_id STRING, group_epoch INT, resource STRING, lost_from_member_id STRING, "
        "loss_event_type STRING, loss_event_id BIGINT, lost_at_ms BIGINT, "
        "restarted_on_member_id STRING, restart_event_id BIGINT, restarted_at_ms BIGINT, "
        "waited_ms BIGINT, waiting_so_far_ms BIGINT, open BOOLEAN"
    ),
    "connector_moves": (
        "group_id STRING, connector STRING, tasks_run BIGINT, task_moves BIGINT, "
        "tasks_moved BIGINT, connector_moves BIGINT, target_task_moves BIGINT, open BOOLEAN"
    ),
    "violations": (
        "kind STRING, source STRING, group_id STRING, group_epoch INT, resource STRING, "
        "members ARRAY<STRING>, event_id BIGINT, at_ms BIGINT, duration_ms BIGINT, "
        "detail STRING, open BOOLEAN"
    ),
    "ownership": (
        "group_id STRING, resource STRING, member_id STRING, start_id BIGINT, start_ms BIGINT, "
        "start_epoch INT, end_id BIGINT, end_ms BIGINT, end_epoch INT, open BOOLEAN"
    ),
    "removed_members": (
        "group_id STRING, member_id STRING, id BIGINT, at_ms BIGINT, group_epoch INT, "
        "event_type STRING"
    ),
    "_state": "group_id STRING, last_event_id BIGINT, state STRING",
}

OUTPUT_TABLES = (
    "rebalances",
    "lost_resources",
    "connector_moves",
    "violations",
    "ownership",
    "removed_members",
)

KEYS: dict[str, tuple[str, ...]] = {
    "rebalances": ("group_id", "group_epoch"),
    "lost_resources": ("group_id", "resource", "loss_event_id"),
    "connector_moves": ("group_id", "connector"),
    "violations": ("kind", "source", "group_id", "resource", "event_id", "members"),
    "ownership": ("group_id", "resource", "member_id", "start_id"),
}
"""What identifies a row across runs, per findings table (see `current`)."""


def schema(name: str) -> StructType:
    parsed = StructType.fromDDL(SCHEMAS[name])
    assert isinstance(parsed, StructType)
    return parsed


@dataclass(frozen=True)
class FoldResult:
    """Attributes:
    tables: the findings tables this run writes (`open` column included).
    state: the state to carry (`STATE_DIR`).
    mode: "incremental" (from the previous date's state) or "whole history" (and why).
    fold_s: seconds until the fold's tables were computed and cached (the rest of the findings'
        time is writing them).
    """

    tables: dict[str, DataFrame]
    state: DataFrame
    mode: str
    fold_s: float


def state_path(out: str, export_date: str) -> str:
    return join(out, STATE_DIR, f"export_date={export_date}")


def previous_state_date(fs: OutputFS, out: str, export_date: str, dates: list[str]) -> str | None:
    """The export date this run continues from: the latest of `dates` (the committed runs'
    dates) before `export_date`, if its state is complete; None if there is no earlier date, or
    it carried no state (run without findings, or before incremental findings): the run must
    then fold the whole history."""
    earlier = sorted(d for d in dates if d < export_date)
    if not earlier:
        return None
    previous = earlier[-1]
    return previous if fs.exists(join(state_path(out, previous), "_SUCCESS")) else None


def _fold_groups(as_of_ms: int, grace_ms: int) -> Any:
    """The function for `RDD.flatMap` over cogrouped (group, (states, events)), run on the
    executors: (table, row as JSON, None) per output row, and the group's new state."""

    def run(item: tuple[str, tuple[Iterable[str], Iterable[Event]]]) -> Iterator[Any]:
        group_id, (states, events) = item
        carried = list(states)
        state = GroupState.from_json(carried[0]) if carried else GroupState(group_id)
        outputs, new_state = fold_group(state, events, as_of_ms=as_of_ms, grace_ms=grace_ms)
        for name in OUTPUT_TABLES:
            for row in getattr(outputs, name):
                yield name, json.dumps(row), None
        # The state apart from the row: megabytes of JSON are not parsed again, nor escaped.
        yield (
            "_state",
            json.dumps({"group_id": group_id, "last_event_id": new_state.last_event_id}),
            new_state.to_json(),
        )

    return run


def fold_findings(
    spark: SparkSession,
    new_events: DataFrame,
    carried: DataFrame | None,
    all_events: Callable[[], DataFrame],
    config: FindingsConfig,
    snapshot: dict[str, DataFrame],
    hold: Callable[[DataFrame], DataFrame],
) -> FoldResult:
    """The findings of this run.

    Args:
        new_events: this export date's events (raw rows as exported).
        carried: the previous date's state (`STATE_DIR` rows), or None.
        all_events: every exported event up to this date; called only when the fold must start
            from nothing (listing the whole history's files is what a run should not do).
        hold: persists a DataFrame that several outputs read (the job's `hold`).
    """
    started = time.monotonic()
    used = new_events.filter(F.col("event_type").isin(*ev.USED_EVENT_TYPES))
    mode = "incremental"
    if carried is None:
        mode = "whole history (no state from an earlier date)"
    else:
        firsts = used.groupBy("group_id").agg(F.min("id").alias("first_new"))
        behind = (
            firsts.join(carried.select("group_id", "last_event_id"), "group_id")
            .filter(F.col("first_new") <= F.col("last_event_id"))
            .limit(1)
            .count()
        )
        if behind:
            mode = "whole history (a group's new events are not after its carried state)"
    if mode != "incremental":
        used = all_events().filter(F.col("event_type").isin(*ev.USED_EVENT_TYPES))
        carried = None
    parsed = ev.parsed(used)
    # Events become named tuples before the shuffle to their group: Spark's Rows pickle slowly.
    by_group = parsed.rdd.map(lambda r: (r["group_id"], Event.from_parsed(r.asDict())))
    states = (
        carried.rdd.map(lambda r: (r["group_id"], r["state"]))
        if carried is not None
        else spark.sparkContext.emptyRDD()
    )
    # The fold runs once; each table is then taken from its output in the JVM (a filter and a
    # JSON parse), not by passes of Python over it.
    folded = spark.createDataFrame(
        states.cogroup(by_group).flatMap(_fold_groups(config.as_of_ms, config.grace_ms)),
        "table STRING, row STRING, state STRING",
        verifySchema=False,
    ).persist(StorageLevel.MEMORY_AND_DISK)

    def table(name: str) -> DataFrame:
        rows = folded.filter(F.col("table") == name)
        if name == "_state":
            keys = F.from_json("row", "group_id STRING, last_event_id BIGINT").alias("r")
            return hold(rows.select(keys, "state").select("r.*", "state"))
        return hold(rows.select(F.from_json("row", schema(name)).alias("r")).select("r.*"))

    names = ("rebalances", "lost_resources", "connector_moves", "violations", "ownership")
    found = {name: table(name) for name in names}
    state = table("_state")
    removed = table("removed_members")
    for df in (*found.values(), state, removed):
        df.count()  # materialise each table of the fold while the fold's output is cached
    if state.filter(F.col("state").isNull() | F.col("group_id").isNull()).limit(1).count():
        raise RuntimeError("the findings fold lost a group's state; nothing was written")
    folded.unpersist()
    fold_s = time.monotonic() - started
    log.info("findings: %s, folded in %.1f s", mode, fold_s)

    rebalances = found["rebalances"]
    columns = rebalances.columns
    at = columns.index("bumped_at_ms") + 1
    found["rebalances"] = rebalances.select(
        *columns[:at], F.timestamp_millis("bumped_at_ms").alias("bumped_at"), *columns[at:]
    )
    found["violations"] = _with_snapshot_checks(found["violations"], removed, snapshot, config)
    return FoldResult(found, state, mode, fold_s)


def _with_snapshot_checks(
    violations: DataFrame,
    removed: DataFrame,
    snapshot: dict[str, DataFrame],
    config: FindingsConfig,
) -> DataFrame:
    """The fold's violations, an open UNASSIGNED_TOO_LONG kept only if the snapshot agrees (in
    the catalogue, owned by nobody), plus the snapshot's own checks (open: they hold for this
    run's snapshot)."""
    owned_now = snapshot["current_assignment"].select("group_id", "resource").distinct()
    in_catalogue = snapshot["catalogue"].select("group_id", "resource").distinct()
    open_gap = (F.col("kind") == UNASSIGNED_TOO_LONG) & F.col("open")
    confirmed = (
        violations.filter(open_gap)
        .join(in_catalogue, ["group_id", "resource"], "left_semi")
        .join(owned_now, ["group_id", "resource"], "left_anti")
        .select(*violations.columns)
    )
    listed_rows = removed_but_listed(
        removed,
        snapshot["members"],
        snapshot["current_assignment"],
        config.snapshot_after_event_id,
    )
    snapshot_rows = double_ownership_in_snapshot(snapshot["current_assignment"]).unionByName(
        listed_rows
    )
    return (
        violations.filter(~open_gap)
        .unionByName(confirmed)
        .unionByName(snapshot_rows.withColumn("open", F.lit(True)))
    )


def current(per_date: DataFrame, name: str, latest_date: str) -> DataFrame:
    """The findings as of `latest_date` from a findings table read across export dates (with
    its `export_date` column): per key, the row of the latest date that has it; a row from an
    earlier date counts only if it is not open."""
    keys = [F.array_join(k, ",") if k == "members" else F.col(k) for k in KEYS[name]]
    eligible = per_date.filter(~F.col("open") | (F.col("export_date") == latest_date))
    w = Window.partitionBy(*keys).orderBy(F.col("export_date").desc())
    return (
        eligible.withColumn("_n", F.row_number().over(w))
        .filter(F.col("_n") == 1)
        .drop("_n", "export_date")
    )


def read_current(spark: SparkSession, out: str, name: str, latest_date: str) -> DataFrame:
    """A findings table as of `latest_date`, from what the export dates up to it wrote (see
    `current`); `out` is the export's output path."""
    path = join(out, "findings", name)
    # The schema written beside the table: a table with no rows on any date has no Parquet file.
    written = StructType.fromJson(json.loads(OutputFS(spark).read_text(join(path, SCHEMA_FILE))))
    per_date = (
        spark.read.schema(written)
        .option("basePath", path)
        .parquet(path)
        .filter(F.col("export_date") <= latest_date)
    )
    return current(per_date, name, latest_date)
