"""`report_data.collect_timelines` in a real local Spark session (the shared `spark` fixture):
from finding tables with the findings' schemas it collects what `build_timeline` makes of the
same rows in plain Python (the timelines test_report.py draws), whether or not the rebalances
have the newer `removed` column; and it trims long name lists to the names of the lanes drawn
and a few more, keeping the counts."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from audit_export import report, report_data
from tests.audit.test_report import AS_OF, T, _with_removed, scenario, timelines

REBALANCES = (
    "group_id string, group_epoch int, reason string, trigger_member_id string, "
    "trigger_connector string, bump_event_id bigint, bumped_at_ms bigint, bumped_at timestamp, "
    "install_event_id bigint, installed_at_ms bigint, assignor_member_id string, "
    "scheduled_rebalance_delay_ms bigint, "
    "moves array<struct<resource:string,from:string,to:string>>, moved array<string>, "
    "newly_assigned array<string>, left_unassigned array<string>, revoked array<string>, "
    "moved_count int, newly_assigned_count int, revoked_count int, members_to_converge bigint, "
    "converged_at_ms bigint, duration_ms bigint, status string, lost_resources bigint, "
    "max_lost_wait_ms bigint, lost_still_waiting bigint"
)
"""The `rebalances` finding's schema (audit_export/findings/rebalance.py)."""

LOST = (
    "group_id string, group_epoch int, resource string, lost_from_member_id string, "
    "loss_event_type string, loss_event_id bigint, lost_at_ms bigint, "
    "restarted_on_member_id string, restart_event_id bigint, restarted_at_ms bigint, "
    "waited_ms bigint, waiting_so_far_ms bigint"
)
OWNERSHIP = (
    "group_id string, resource string, member_id string, start_id bigint, start_ms bigint, "
    "start_epoch int, end_id bigint, end_ms bigint, end_epoch int"
)


def _frame(spark: SparkSession, ddl: str, rows: list[dict[str, Any]]) -> DataFrame:
    names = [c.strip().split(" ")[0] for c in _columns(ddl)]
    return spark.createDataFrame([tuple(r.get(n) for n in names) for r in rows], ddl)


def _columns(ddl: str) -> list[str]:
    """Top-level column definitions of a DDL string (commas inside <...> kept)."""
    out, depth, current = [], 0, ""
    for ch in ddl:
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(current)
            current = ""
        else:
            current += ch
    return [*out, current]


def _rebalances(spark: SparkSession, *, removed_column: bool) -> DataFrame:
    """The scenario's `rebalances`, with the newer `removed` column or without."""
    rows = scenario().rebalances
    if removed_column:
        return _frame(
            spark, REBALANCES + ", removed array<string>", [_with_removed(r) for r in rows]
        )
    return _frame(spark, REBALANCES, rows)


def _found(spark: SparkSession) -> dict[str, DataFrame]:
    s = scenario()
    ownership = [
        {**r, "start_id": n, "end_id": None if r["end_ms"] is None else 10_000 + n}
        for n, r in enumerate(s.ownership)
    ]
    return {
        "ownership": _frame(spark, OWNERSHIP, ownership),
        "rebalances": _rebalances(spark, removed_column=False),
        "lost_resources": _frame(spark, LOST, s.lost),
        "connector_moves": spark.createDataFrame([], "group_id string"),
        "violations": spark.createDataFrame([], "group_id string"),
    }


def test_collect_timelines_gives_what_the_report_draws(spark: SparkSession) -> None:
    expected = timelines(scenario())
    assert [t.group_id for t in expected] == ["billing", "payments"]
    found = _found(spark)
    assert report_data.collect_timelines(found, AS_OF) == expected
    payments = expected[1]
    e19 = next(m for m in payments.markers if m.epoch == 19)
    assert e19.removed == report.Names(("C", "C-0", "C-1"), 3) and e19.held.total == 0
    kinds = {(f.resource, f.kind) for f in payments.facts}
    assert ("C-0", report.REMOVED) in kinds and ("A-1", report.HELD) in kinds
    assert ("A-0", report.LOST) in kinds


def test_the_findings_removed_column_is_read_where_there(spark: SparkSession) -> None:
    """The same split into held and removed, from the newer `removed` column."""
    rows: dict[bool, list[dict[str, Any]]] = {}
    for removed_column in (False, True):
        df = _rebalances(spark, removed_column=removed_column)
        assert ("removed" in df.columns) is removed_column
        got = report_data.rebalance_rows(df).orderBy("group_id", "group_epoch").collect()
        rows[removed_column] = [r.asDict(recursive=True) for r in got]
    assert rows[True] == rows[False]
    e19 = next(r for r in rows[True] if r["group_epoch"] == 19)
    assert (e19["removed"], e19["held"], e19["removed_count"]) == (["C", "C-0", "C-1"], [], 3)


def test_long_name_lists_keep_the_lanes_names_and_the_counts(spark: SparkSession) -> None:
    many = [f"Z-{n}" for n in range(40)]
    row = {
        "group_id": "g",
        "group_epoch": 5,
        "reason": "member fenced",
        "bumped_at_ms": T,
        "installed_at_ms": T + 10,
        "scheduled_rebalance_delay_ms": 1_000,
        "moved": sorted(many),
        "newly_assigned": [],
        "left_unassigned": sorted([*many, "Z-99"]),
        "moved_count": 40,
    }
    rows = report_data.rebalance_rows(
        _frame(spark, REBALANCES, [row]).withColumn("_lanes", F.array(F.lit("Z-7"), F.lit("Z-99")))
    ).collect()
    [r] = [x.asDict(recursive=True) for x in rows]
    assert (r["moved_count"], r["held_count"], r["removed_count"]) == (40, 41, 0)
    assert len(r["moved"]) == report_data.SHOWN_NAMES + 1 and "Z-7" in r["moved"]
    assert "Z-99" in r["held"] and "Z-7" in r["held"]
    t = report_data.build_timeline(
        "g",
        [{"resource": "Z-99", "member_id": "W1", "start_ms": T - 5, "end_ms": T + 20}],
        [{**r, "group_id": "g"}],
        [],
        T + 100,
    )
    [marker] = t.markers
    assert marker.held.total == 41 and marker.moved.total == 40
    assert t.facts == [report.Fact("Z-99", report.HELD, T + 10, 5, "delay 1.00 s")]
