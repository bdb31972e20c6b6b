"""The audit export of a real scenario on PostgreSQL: a coordinator, workers joining and leaving, a
delayed rebalance; exported with the test run's Spark session, then checked against the database
row by row and against the test driver's own record of what it did and when.

Scenario (resources A, A-0..A-2, B, B-0, B-1; the driver plays W1 as the assignor member):
  put A (3 tasks), put B (2 tasks), alter a config          (epoch bumps on an empty group)
  W1 joins: W1 gets everything
  W2 joins: B, A-2, B-1 move from W1 to W2 (W1 must revoke them first)
  W3 joins: A-1 (from W1) and B-1 (from W2) move to W3
  W2 leaves: its B, A-2 are held back by a 1500 ms delayed rebalance
  the delay fires: B goes to W3, A-2 to W1
  -- export 2026-01-01 --
  the coordinator restarts; W4 joins: A-2 moves from W1 to W4
  -- export 2026-01-02 (only the new events), then the same export again (idempotent) --
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from audit_export import ExportOptions, run_export
from audit_export.incremental import read_current
from tests.audit import tables as T
from tests.audit.driver import Driver, Rebalance, now_ms, runtime_moves, target_task_moves
from tests.support.client import put_connector
from tests.support.coordinator import InProcessCoordinator

GROUP = "audit-demo"
DAY1, DAY2 = "2026-01-01", "2026-01-02"
DELAY_MS = 1500
GRACE_MS = 10_000


def export(spark: SparkSession, url: str, out: Path, day: str) -> Any:
    return run_export(spark, ExportOptions(url, str(out), export_date=day, grace_ms=GRACE_MS))


def check_snapshot_matches_database(
    spark: SparkSession, db: T.Database, out: str, day: str
) -> None:
    for name in T.RAW_TABLES:
        assert T.exported_raw(spark, out, name, day) == db.raw(name), name
    assert T.exported_derived(spark, out, "catalogue", day) == db.catalogue()
    assert T.exported_derived(spark, out, "target_assignment", day) == db.target_assignment()
    assert T.exported_derived(spark, out, "current_assignment", day) == db.current_assignment()


def findings(spark: SparkSession, out: str, name: str, day: str) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in T.read(spark, out, f"findings/{name}", day).collect()]


def check_rebalance(found: dict[str, Any], expected: Rebalance) -> None:
    assert found["reason"] == expected.reason
    assert found["trigger_member_id"] == expected.trigger
    assert found["status"] == "converged"
    assert set(found["moved"]) == expected.moved
    assert set(found["newly_assigned"]) == expected.newly_assigned
    assert set(found["left_unassigned"]) == expected.left_unassigned
    assert set(found["revoked"]) == expected.revoked
    assert found["scheduled_rebalance_delay_ms"] == expected.delay_ms
    # The coordinator's clock is this machine's: the bump and the convergence happened inside
    # the driver's window, and the duration is exactly their difference.
    assert expected.t_before_ms <= found["bumped_at_ms"] <= found["converged_at_ms"]
    assert found["converged_at_ms"] <= expected.t_after_ms
    assert found["duration_ms"] == found["converged_at_ms"] - found["bumped_at_ms"]
    assert found["duration_ms"] <= expected.t_after_ms - expected.t_before_ms
    assert found["members_to_converge"] >= 1


@pytest.mark.timeout(240)
def test_export_of_a_real_scenario_matches_the_database_and_the_drivers_record(
    spark: SparkSession, database_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "audit"
    db = T.Database(database_url)
    try:
        with InProcessCoordinator(database_url) as coordinator:
            d = Driver(coordinator.stubs, GROUP)
            assert put_connector(d.stubs, GROUP, "A", 3).error_code == 0
            assert put_connector(d.stubs, GROUP, "B", 2).error_code == 0
            d.configure(**{"heartbeat.interval.ms": "250"})
            everything = ["A", "A-0", "A-1", "A-2", "B", "B-0", "B-1"]
            d.rebalance(d.join("W1"), "member joined", "W1", {"W1": everything})
            d.rebalance(
                d.join("W2"),
                "member joined",
                "W2",
                {"W1": ["A", "A-0", "A-1", "B-0"], "W2": ["B", "A-2", "B-1"]},
            )
            d.rebalance(
                d.join("W3"),
                "member joined",
                "W3",
                {"W1": ["A", "A-0", "B-0"], "W2": ["B", "A-2"], "W3": ["A-1", "B-1"]},
            )
            t_delayed = now_ms()
            held = d.rebalance(
                d.leave("W2"),
                "member left",
                "W2",
                {"W1": ["A", "A-0", "B-0"], "W3": ["A-1", "B-1"]},
                delay_ms=DELAY_MS,
            )
            fired = d.rebalance(
                d.wait_for_epoch(held.epoch + 1),
                "scheduled rebalance fired",
                None,
                {"W1": ["A", "A-0", "B-0", "A-2"], "W3": ["A-1", "B-1", "B"]},
                t_before_ms=t_delayed + DELAY_MS,
            )
            assert fired.epoch == held.epoch + 1
        phase1 = list(d.rebalances)
        watermark1 = db.max_event_id()

        # --- export 1 -------------------------------------------------------------------
        result = export(spark, database_url, out, DAY1)
        assert result.run.since_event_id == 0
        assert result.run.until_event_id == watermark1
        uri = result.paths["summary"].rsplit("/reports/", 1)[0]
        check_snapshot_matches_database(spark, db, uri, DAY1)
        assert T.exported_events(spark, uri, DAY1) == db.events()
        assert len(T.exported_raw(spark, uri, "group_configs", DAY1)) == 1

        rebalances = {r["group_epoch"]: r for r in findings(spark, uri, "rebalances", DAY1)}
        for expected in phase1:
            check_rebalance(rebalances[expected.epoch], expected)
        # The catalogue changes on the empty group were rebalances with no one to converge.
        empty = [r for r in rebalances.values() if r["reason"] == "connector added"]
        assert [r["status"] for r in empty] == ["no_members", "no_members"]
        assert {r["trigger_connector"] for r in empty} == {"A", "B"}
        assert len(rebalances) == len(phase1) + 2

        # Lost resources: W2's B and A-2 waited for the delay, then ran again.
        lost = {r["resource"]: r for r in findings(spark, uri, "lost_resources", DAY1)}
        assert set(lost) == {x.resource for x in d.lost} == {"B", "A-2"}
        for x in d.lost:
            found = lost[x.resource]
            assert found["lost_from_member_id"] == "W2"
            assert found["loss_event_type"] == "MEMBER_LEFT"
            assert found["group_epoch"] == held.epoch
            assert found["restarted_on_member_id"] == x.restarted_on
            assert x.t_restarted_after_ms is not None
            assert DELAY_MS <= found["waited_ms"] <= x.t_restarted_after_ms - x.t_before_ms
        assert rebalances[held.epoch]["lost_resources"] == 2
        assert rebalances[held.epoch]["max_lost_wait_ms"] == max(
            r["waited_ms"] for r in lost.values()
        )

        # Task moves per connector, against the driver's record of who ran what.
        moves = {r["connector"]: r for r in findings(spark, uri, "connector_moves", DAY1)}
        targets = target_task_moves(d.target_moves)
        for connector, (task_moves, tasks_moved, connector_moves) in runtime_moves(
            d.history
        ).items():
            assert moves[connector]["task_moves"] == task_moves, connector
            assert moves[connector]["tasks_moved"] == tasks_moved, connector
            assert moves[connector]["connector_moves"] == connector_moves, connector
            assert moves[connector]["target_task_moves"] == targets.get(connector, 0)
        assert moves["A"]["task_moves"] == 3 and moves["B"]["connector_moves"] == 2

        # A clean run has no violations, and says so.
        assert findings(spark, uri, "violations", DAY1) == []
        summary = json.loads((out / "reports" / f"export_date={DAY1}" / "summary.json").read_text())
        assert summary["violation_count"] == 0
        assert summary["watermark"]["until_event_id"] == watermark1
        page = (out / "reports" / f"export_date={DAY1}" / "report.html").read_text()
        assert "<svg" in page and "No violations" in page
        for resource in everything:
            assert f">{resource}</text>" in page
        for r in phase1:  # every bump is marked (labels of close ones may be left out)
            assert f"<title>group epoch {r.epoch} at " in page

        # --- more activity after a coordinator restart, export 2 ----------------------------
        with InProcessCoordinator(database_url) as coordinator:
            d.stubs = coordinator.stubs
            d.retry_until_served()
            joined = d.rebalance(
                d.join("W4"),
                "member joined",
                "W4",
                {"W1": ["A", "A-0", "B-0"], "W3": ["A-1", "B-1", "B"], "W4": ["A-2"]},
            )
        result2 = export(spark, database_url, out, DAY2)
        assert (result2.run.since_event_id, result2.run.until_event_id) == (
            watermark1,
            db.max_event_id(),
        )
        new_events = T.exported_events(spark, uri, DAY2)
        assert new_events == db.events(after_id=watermark1)
        assert new_events and min(e[0] for e in new_events) > watermark1
        check_snapshot_matches_database(spark, db, uri, DAY2)
        rebalances2 = {r["group_epoch"]: r for r in findings(spark, uri, "rebalances", DAY2)}
        check_rebalance(rebalances2[joined.epoch], joined)
        assert joined.epoch not in rebalances and set(rebalances2).isdisjoint(
            r for r, row in rebalances.items() if not row["open"]
        ), "DAY2 writes what changed since DAY1 (and what is still open), not DAY1's findings"
        as_of_day2 = {
            r["group_epoch"] for r in read_current(spark, uri, "rebalances", DAY2).collect()
        }
        assert as_of_day2 == set(rebalances) | set(rebalances2), "the findings as of DAY2"
        assert findings(spark, uri, "violations", DAY2) == []
        marks = sorted(p.name for p in (out / "_watermarks").iterdir())
        assert marks == [f"export_date={DAY1}.json", f"export_date={DAY2}.json"]

        # --- the same export again: the same output, nothing twice --------------------------
        before = {
            name: T.exported_derived(spark, uri, name, DAY2)
            for name in ("catalogue", "target_assignment", "current_assignment")
        }
        again = export(spark, database_url, out, DAY2)
        assert (again.run.since_event_id, again.run.until_event_id) == (
            result2.run.since_event_id,
            result2.run.until_event_id,
        )
        assert T.exported_events(spark, uri, DAY2) == new_events
        for name, rows in before.items():
            assert T.exported_derived(spark, uri, name, DAY2) == rows
        everything_exported = T.read(spark, uri, "events")
        assert everything_exported.count() == everything_exported.select("id").distinct().count()
        assert everything_exported.agg(F.max("id")).collect()[0][0] == db.max_event_id()
        assert T.exported_events(spark, uri) == db.events()
    finally:
        db.close()
