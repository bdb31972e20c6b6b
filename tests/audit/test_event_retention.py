"""The audit export under the coordinators' event retention (DESIGN 3.20), with the test run's
Spark session: each committed run appends its progress to the database; the pruner deletes only
what no re-run of the latest date nor the next date reads, so the latest date re-run after
pruning began, with the pruner deleting beside it, writes exactly what it wrote before (events,
snapshot, findings, the state the next date folds from); an older date whose events were pruned
refuses and writes nothing. On PostgreSQL, the run reads as a role with only the grants the
deploy README names (SELECT, INSERT on audit_export_progress, USAGE on its sequence); on SQLite,
the progress row's timestamp is one the coordinator's store reads back.

Scenario (group `retention-demo`, connector A with 2 tasks, no delayed rebalance):
  part 1: W1 joins, W2 joins, W1 leaves, W2 leaves               (events 1..K)
  part 2: a new coordinator; W3 joins and leaves                    (K+1..M)
  -- export DAY1 with --since-event-id K: its progress (K, M) lets the pruner take 1..K --
  part 3: a new coordinator; connector B, W4 joins and leaves       (M+1..N)
  -- export DAY2 (the control); its progress lets the pruner take 1..M --
  -- DAY2 again once the pruner has begun, with it deleting beside the run: the same output --
  -- the pruner finishes; DAY1 again: refused, nothing written --
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pyspark.sql import SparkSession
from sqlalchemy.engine import make_url

from audit_export import ExportOptions, run_export
from audit_export.cli import EXIT_REFUSED, build_parser, run_and_report
from audit_export.findings import FINDING_TABLES
from audit_export.fs import qualify
from audit_export.incremental import state_path
from audit_export.snapshot import SNAPSHOT_TABLES
from audit_export.watermark import PrunedRangeError, default_export_name
from coordinator_svc.runtime.event_pruner import EventPruner, RetentionPolicy
from coordinator_svc.store import SqlStore, schema
from tests.audit import tables as T
from tests.audit.driver import Driver
from tests.deploy.local import wait_for
from tests.support.client import put_connector
from tests.support.coordinator import InProcessCoordinator

GROUP = "retention-demo"
DAY1, DAY2 = "2026-03-01", "2026-03-02"
GRACE_MS = 10_000
EVERYTHING = ["A", "A-0", "A-1"]
#: Every event is "old" for this retention: only the registrations bound what goes.
RETENTION_MS = 1


def scenario_part(url: str, body: Callable[[Driver], None]) -> int:
    """`body` against a coordinator of its own (stopped afterwards, so nothing more is written
    while the exports run); the highest event id after it."""
    with InProcessCoordinator(url) as coordinator:
        body(Driver(coordinator.stubs, GROUP))
    db = T.Database(url)
    try:
        return db.max_event_id()
    finally:
        db.close()


def part1(d: Driver) -> None:
    assert put_connector(d.stubs, GROUP, "A", 2).error_code == 0
    d.configure(**{"scheduled.rebalance.max.delay.ms": "0", "heartbeat.interval.ms": "250"})
    d.rebalance(d.join("W1"), "member joined", "W1", {"W1": EVERYTHING})
    d.rebalance(d.join("W2"), "member joined", "W2", {"W1": ["A", "A-0"], "W2": ["A-1"]})
    d.rebalance(d.leave("W1"), "member left", "W1", {"W2": EVERYTHING}, assignor="W2")
    d.leave("W2")()


def part2(d: Driver) -> None:
    d.rebalance(d.join("W3"), "member joined", "W3", {"W3": EVERYTHING}, assignor="W3")
    d.leave("W3")()


def part3(d: Driver) -> None:
    assert put_connector(d.stubs, GROUP, "B", 0).error_code == 0
    d.rebalance(d.join("W4"), "member joined", "W4", {"W4": [*EVERYTHING, "B"]}, assignor="W4")
    d.leave("W4")()


def written(spark: SparkSession, out: str, day: str) -> dict[str, list[str]]:
    """Everything a run writes for `day` but its timings: every table's rows, the findings, the
    state the next date folds from, and its watermark's ranges."""
    tables = [*SNAPSHOT_TABLES, "events", *(f"findings/{name}" for name in FINDING_TABLES)]
    out_rows = {
        name: sorted(
            json.dumps(r.asDict(recursive=True), default=str, sort_keys=True)
            for r in T.read(spark, out, name, day).collect()
        )
        for name in tables
    }
    out_rows["_findings_state"] = sorted(
        json.dumps(r.asDict(recursive=True), default=str, sort_keys=True)
        for r in spark.read.parquet(state_path(out, day)).collect()
    )
    mark = json.loads(
        Path(out.removeprefix("file://"), "_watermarks", f"export_date={day}.json").read_text()
    )
    out_rows["_watermark"] = [
        json.dumps(
            {k: mark[k] for k in ("since_event_id", "until_event_id", "rechecked", "unfilled")}
        )
    ]
    return out_rows


def files(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def restricted_role(url: str) -> tuple[str, Callable[[], None]]:
    """A login role with only what the deploy README grants the export; its URL, and a cleanup."""
    role = f"audit_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN"))
        conn.execute(sa.text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"))
        conn.execute(sa.text(f"GRANT INSERT ON audit_export_progress TO {role}"))
        conn.execute(sa.text(f"GRANT USAGE ON SEQUENCE audit_export_progress_id_seq TO {role}"))

    def drop() -> None:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP OWNED BY {role}"))
            conn.execute(sa.text(f"DROP ROLE {role}"))
        engine.dispose()

    return make_url(url).set(username=role).render_as_string(hide_password=False), drop


@pytest.mark.timeout(300)
def test_pruning_beside_the_export_loses_nothing_and_an_older_date_refuses(
    spark: SparkSession, database_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "audit"
    k = scenario_part(database_url, part1)
    m = scenario_part(database_url, part2)
    store = SqlStore(database_url, "pruner", "-")
    db = T.Database(database_url)
    try:

        def export(day: str, url: str = database_url, **kw: Any) -> Any:
            options = ExportOptions(url, str(out), export_date=day, grace_ms=GRACE_MS, **kw)
            return run_export(spark, options)

        as_of = int(time.time() * 1000) + 600_000
        first = export(DAY1, since_event_id=k, findings=False)
        assert (first.run.since_event_id, first.run.until_event_id) == (k, m)
        [registered] = store.retention.registrations()
        name = default_export_name(qualify(str(out)))
        assert first.export_name == registered.export_name == name
        assert (registered.since_event_id, registered.until_event_id) == (k, m)
        assert registered.lowest_unfilled_id == m + 1 and registered.runs == 1
        assert abs(registered.at - datetime.now(UTC)) < timedelta(minutes=1)

        n = scenario_part(database_url, part3)
        db.execute(
            sa.insert(schema.group_tombstones).values(
                group_id="deleted-group",
                group_epoch=7,
                last_fencing_token=41,
                deleted_at=datetime.now(UTC),
                deleted_by="User:ops",
            )
        )
        events_of_day2 = db.events(m, n)
        control = export(DAY2, as_of_ms=as_of)
        assert (control.run.since_event_id, control.run.until_event_id) == (m, n)
        assert T.exported_events(spark, str(out), DAY2) == events_of_day2
        assert T.exported_raw(spark, str(out), "group_tombstones", DAY2) == db.raw(
            "group_tombstones"
        )
        expected = written(spark, qualify(str(out)), DAY2)
        assert expected["findings/rebalances"]  # the scenario's rebalances were found

        # DAY2's progress lets the pruner delete 1..m. Once it has begun (one event a tenth
        # of a second), the latest date runs again beside it, as a role with only the grants
        # the deploy README names, and writes the same.
        pruner = EventPruner(
            store.retention, RetentionPolicy(RETENTION_MS, rows_per_s=10, interval_s=0.05)
        )
        role_url, drop_role = restricted_role(database_url)
        pruner.start()
        try:
            floor = store.retention.pruning
            floor_at_start = wait_for("pruning", lambda: floor().pruned_through_event_id, 10)
            export(DAY2, url=role_url, as_of_ms=as_of)
            assert floor().pruned_through_event_id > floor_at_start  # it went on meanwhile
        finally:
            pruner.stop()
            drop_role()
        assert written(spark, qualify(str(out)), DAY2) == expected

        while pruner.look().deleted:
            pass
        assert store.retention.pruning().pruned_through_event_id == m
        assert sorted(row[0] for row in db.events()) == list(range(m + 1, n + 1))
        # The older date refuses and writes nothing.
        before = files(out)
        with pytest.raises(PrunedRangeError, match=rf"pruned events through id {m}\b"):
            export(DAY1, findings=False)
        assert files(out) == before
        [registered] = store.retention.registrations()
        assert (registered.since_event_id, registered.until_event_id, registered.runs) == (m, n, 3)
    finally:
        db.close()
        store.close()


def test_on_sqlite_the_progress_reads_back_and_a_refusal_exits_4(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'coordinator.db'}"
    store = SqlStore(url, "pruner", "-")
    store.migrate()
    try:
        now = datetime.now(UTC) - timedelta(hours=1)
        rows = [
            {
                "occurred_at": now,
                "at_ms": int(now.timestamp() * 1000),
                "group_id": "",
                "group_epoch": -1,
                "event_type": "FEATURE_UPDATED",
                "member_id": None,
                "payload": {"feature": "group.version", "level": 1, "previous_level": 1},
            }
            for _ in range(6)
        ]
        db = T.Database(url)
        db.execute(sa.insert(schema.events), rows)
        db.close()
        out = tmp_path / "audit"
        args = build_parser(local=False).parse_args(
            [
                *("--database-url", url, "--output", str(out), "--export-date", DAY1),
                *("--since-event-id", "3", "--no-findings", "--export-name", "trial"),
            ]
        )
        assert run_and_report(spark, args, time.monotonic()) == 0
        [registered] = store.retention.registrations()
        assert (registered.export_name, registered.since_event_id, registered.until_event_id) == (
            "trial",
            3,
            6,
        )
        assert abs(registered.at - datetime.now(UTC)) < timedelta(minutes=1)
        assert EventPruner(store.retention, RetentionPolicy(RETENTION_MS)).look().deleted == 3
        before = files(out)
        args.since_event_id = 1
        assert run_and_report(spark, args, time.monotonic()) == EXIT_REFUSED
        assert "pruned events through id 3" in capsys.readouterr().err
        assert files(out) == before
    finally:
        store.close()
