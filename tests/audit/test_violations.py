"""An inconsistent state written straight into the coordinator's tables (what no correct coordinator
writes) is reported, each finding naming the group, the epoch and the resource."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from pyspark.sql import SparkSession

from audit_export import ExportOptions, run_export
from coordinator_svc.store import schema
from tests.audit import tables as T
from tests.audit.driver import Driver, now_ms
from tests.support.client import put_connector
from tests.support.coordinator import InProcessCoordinator

GROUP = "broken"
GRACE_MS = 3_000


def test_a_resource_owned_twice_and_other_inconsistencies_are_named(
    spark: SparkSession, database_url: str, tmp_path: Path
) -> None:
    with InProcessCoordinator(database_url) as coordinator:
        d = Driver(coordinator.stubs, GROUP)
        assert put_connector(d.stubs, GROUP, "A", 2).error_code == 0
        t_members = now_ms()
        d.rebalance(d.join("W1"), "member joined", "W1", {"W1": ["A", "A-0", "A-1"]})
        d.rebalance(d.join("W2"), "member joined", "W2", {"W1": ["A", "A-0"], "W2": ["A-1"]})
        d.rebalance(
            d.join("W3"), "member joined", "W3", {"W1": ["A", "A-0"], "W2": ["A-1"], "W3": []}
        )
        d.rebalance(d.leave("W3"), "member left", "W3", {"W1": ["A", "A-0"], "W2": ["A-1"]})

    db = T.Database(database_url)
    try:
        members = {m["member_id"]: m for m in db.rows(schema.members)}
        w1, w2 = members["W1"], members["W2"]
        group_epoch = db.rows(schema.groups)[0]["group_epoch"]
        left = [e for e in db.rows(schema.events) if e["event_type"] == "MEMBER_LEFT"]
        assert [e["member_id"] for e in left] == ["W3"]
        t = schema.events.c

        # 1. A-1 in two members' current assignments: W1 is told it owns it (an event says so
        #    too), while W2 still runs it.
        doubled = {
            "connectors": ["A"],
            "tasks": [{"connector": "A", "task": 0}, {"connector": "A", "task": 1}],
        }
        db.execute(
            sa.update(schema.members)
            .where(schema.members.c.member_id == "W1")
            .values(assigned=doubled)
        )
        at = now_ms()
        db.execute(
            sa.insert(schema.events).values(
                occurred_at=datetime.fromtimestamp(at / 1000, UTC),
                at_ms=at,
                group_id=GROUP,
                group_epoch=group_epoch,
                event_type="ASSIGNMENT_DELIVERED",
                member_id="W1",
                payload={
                    "member_epoch": w1["member_epoch"],
                    "state": "STABLE",
                    "assigned": doubled,
                    "added": {"connectors": [], "tasks": [{"connector": "A", "task": 1}]},
                    "removed": {"connectors": [], "tasks": []},
                },
            )
        )
        # 2. W3 listed again although an event removed it.
        db.execute(
            sa.insert(schema.members).values(
                {**w2, "member_id": "W3", "assigned": {"connectors": [], "tasks": []}}
            )
        )
        # 3. Connector Z put into the catalogue long ago and never run by anyone.
        long_ago = at - 120_000
        db.execute(
            sa.insert(schema.connectors).values(group_id=GROUP, name="Z", task_count=1, config={})
        )
        db.execute(
            sa.insert(schema.events).values(
                occurred_at=datetime.fromtimestamp(long_ago / 1000, UTC),
                at_ms=long_ago,
                group_id=GROUP,
                group_epoch=group_epoch,
                event_type="CONNECTOR_PUT",
                member_id=None,
                payload={"connector": "Z", "task_count": 1, "caller": "test"},
            )
        )
        z_event = max(e["id"] for e in db.rows(schema.events, t.event_type == "CONNECTOR_PUT"))
        # Z has waited since the group got members (before that nobody could run it): make that
        # clearly longer than the grace window.
        time.sleep(max(0.0, (t_members + GRACE_MS + 1_000 - now_ms()) / 1000))

        result = run_export(
            spark,
            ExportOptions(
                database_url, str(tmp_path / "out"), export_date="2026-02-01", grace_ms=GRACE_MS
            ),
        )
        uri = result.paths["summary"].rsplit("/reports/", 1)[0]
        found = sorted(
            (
                v["kind"],
                v["source"],
                v["group_id"],
                v["group_epoch"],
                v["resource"],
                tuple(v["members"]),
                v["event_id"],
            )
            for v in (
                r.asDict(recursive=True)
                for r in T.read(spark, uri, "findings/violations", "2026-02-01").collect()
            )
        )
        delivered = max(e["id"] for e in db.rows(schema.events, t.member_id == "W1"))
        assert found == sorted(
            [
                ("DOUBLE_OWNERSHIP", "events", GROUP, group_epoch, "A-1", ("W1", "W2"), delivered),
                ("DOUBLE_OWNERSHIP", "snapshot", GROUP, group_epoch, "A-1", ("W1", "W2"), None),
                (
                    "MEMBER_LISTED_AFTER_REMOVAL",
                    "snapshot",
                    GROUP,
                    left[0]["group_epoch"],
                    None,
                    ("W3",),
                    left[0]["id"],
                ),
                ("UNASSIGNED_TOO_LONG", "events", GROUP, group_epoch, "Z", (), z_event),
                ("UNASSIGNED_TOO_LONG", "events", GROUP, group_epoch, "Z-0", (), z_event),
            ]
        )
        summary = json.loads(Path(result.paths["summary"].removeprefix("file://")).read_text())
        assert summary["violation_count"] == 5
        assert summary["violations_by_kind"] == {
            "DOUBLE_OWNERSHIP": 2,
            "MEMBER_LISTED_AFTER_REMOVAL": 1,
            "UNASSIGNED_TOO_LONG": 2,
        }
        snapshot_finding = next(
            v
            for v in summary["violations"]
            if v["kind"] == "DOUBLE_OWNERSHIP" and v["source"] == "snapshot"
        )
        assert "A-1 is in the current assignments of W1" in snapshot_finding["detail"]
        assert f"group epoch {group_epoch}" in snapshot_finding["detail"]
        page = Path(result.paths["report"].removeprefix("file://")).read_text()
        assert "5 violation(s)" in page and "DOUBLE_OWNERSHIP" in page
    finally:
        db.close()
