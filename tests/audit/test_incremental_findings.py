"""Incremental findings: N export runs, each folding only its own events into the state the
previous date carried, give the same findings as one run over the whole history, and the same as
the Spark recomputation they replace.

A real coordinator plays one scenario, exported on four dates at awkward points: in the middle of
a rebalance (bumped, no target yet), in the middle of a scheduled-rebalance delay, after a
coordinator restart with an event of another group still uncommitted below the watermark (it
commits afterwards and reaches the next date), then the latest date re-run after more events,
and an older date re-run (which must repeat its first run exactly). Then:

- the findings as of the last date (`incremental.read_current`) equal one fold over every event
  (the same `as_of`), and equal `findings.compute` (the whole-history Spark computation), but
  for the columns the fold adds (`open`; a deleted connector's resources are `removed` rather
  than `left_unassigned`);
- the pure fold, on the same events, split at every event of the history (and at random sets of
  points), with the state carried through its JSON form, gives the same rows as one fold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from connect.group.v1 import admin_pb2
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from audit_export import ExportOptions, incremental, run_export
from audit_export import events as ev
from audit_export import findings as fnd
from audit_export import snapshot as snap
from audit_export.fold import Event
from audit_export.fs import OutputFS, join
from tests.audit import tables as T
from tests.audit.driver import Driver
from tests.audit.fold_runs import check_every_split
from tests.support.client import put_connector
from tests.support.coordinator import InProcessCoordinator
from tests.support.pgcluster import libpq_url

GROUP = "audit-incremental"
DAYS = ("2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04")
DELAY_MS = 6000
GRACE_MS = 10_000
TABLES = ("rebalances", "lost_resources", "connector_moves", "violations", "ownership")


def _export(spark: SparkSession, url: str, out: Path, day: str) -> Any:
    return run_export(spark, ExportOptions(url, str(out), export_date=day, grace_ms=GRACE_MS))


def _insert_raw(conn: psycopg.Connection[Any], group: str) -> int:
    row = conn.execute(
        """INSERT INTO events (occurred_at, at_ms, group_id, group_epoch, event_type, member_id,
                               payload)
           VALUES (now(), 1, %s, 1, 'GROUP_CREATED', NULL, '{}'::jsonb) RETURNING id""",
        (group,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _rows(df: DataFrame, drop: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
    """A table's rows as sorted tuples (arrays as tuples, structs as tuples)."""

    def plain(v: Any) -> Any:
        if isinstance(v, list):
            return tuple(plain(x) for x in v)
        if hasattr(v, "asDict"):
            return tuple(plain(x) for x in v)
        return v

    cols = sorted(c for c in df.columns if c not in drop and c != "export_date")
    return sorted((tuple(plain(r[c]) for c in cols) for r in df.select(*cols).collect()), key=repr)


def _reference_rows(name: str, df: DataFrame) -> list[tuple[Any, ...]]:
    return _rows(df)


def _fold_rows_as_reference(name: str, df: DataFrame) -> list[tuple[Any, ...]]:
    """The fold's table in the reference's shape: without `open`, and a rebalance's `removed`
    counted as `left_unassigned` (the reference cannot tell them apart)."""
    if name == "rebalances":
        df = df.withColumn(
            "left_unassigned", F.array_sort(F.array_union("left_unassigned", "removed"))
        ).drop("removed")
    return _rows(df, drop=("open",))


@pytest.mark.timeout(900)
def test_incremental_runs_equal_one_run_over_the_whole_history(
    spark: SparkSession, database_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "audit"
    first_runs: dict[str, Any] = {}

    def export(day: str) -> Any:
        result = _export(spark, database_url, out, day)
        first_runs.setdefault(day, result)
        return result

    everything = ["A", "A-0", "A-1", "A-2", "B", "B-0", "B-1", "C", "C-0"]
    with InProcessCoordinator(database_url) as coordinator:
        d = Driver(coordinator.stubs, GROUP)
        for name, tasks in (("A", 3), ("B", 2), ("C", 1)):
            assert put_connector(d.stubs, GROUP, name, tasks).error_code == 0
        d.configure(**{"heartbeat.interval.ms": "250", "session.timeout.ms": "180000"})
        d.rebalance(d.join("W1"), "member joined", "W1", {"W1": everything})
        d.rebalance(
            d.join("W2"),
            "member joined",
            "W2",
            {"W1": ["A", "A-0", "A-1", "B-0", "C"], "W2": ["B", "A-2", "B-1", "C-0"]},
        )

        def join_w3_and_export_mid_rebalance() -> None:
            d.join("W3")()
            export(DAYS[0])  # bumped, no target installed yet

        d.rebalance(
            join_w3_and_export_mid_rebalance,
            "member joined",
            "W3",
            {"W1": ["A", "A-0", "B-0"], "W2": ["B", "A-2", "C-0"], "W3": ["A-1", "B-1", "C"]},
        )
        held = d.rebalance(
            d.leave("W2"),
            "member left",
            "W2",
            {"W1": ["A", "A-0", "B-0"], "W3": ["A-1", "B-1", "C"]},
            delay_ms=DELAY_MS,
        )
        export(DAYS[1])  # in the delay: B, A-2 and C-0 held for W2
        d.rebalance(
            d.wait_for_epoch(held.epoch + 1, timeout_s=60),
            "scheduled rebalance fired",
            None,
            {"W1": ["A", "A-0", "B-0", "A-2"], "W3": ["A-1", "B-1", "C", "B", "C-0"]},
        )

        def delete_c() -> None:
            resp = d.stubs.admin.DeleteConnector(
                admin_pb2.DeleteConnectorRequest(group_id=GROUP, connector="C"), timeout=10
            )
            assert resp.error_code == 0, resp

        d.rebalance(
            delete_c,
            "connector deleted",
            None,
            {"W1": ["A", "A-0", "B-0", "A-2"], "W3": ["A-1", "B-1", "B"]},
        )

    # A coordinator restart; an event of another group takes an id and commits only after the
    # next export has moved the watermark past it.
    with (
        InProcessCoordinator(database_url) as coordinator,
        psycopg.connect(libpq_url(database_url)) as slow,
    ):
        d.stubs = coordinator.stubs
        d.retry_until_served()
        late = _insert_raw(slow, "g-late")
        d.rebalance(
            d.join("W4"),
            "member joined",
            "W4",
            {"W1": ["A", "A-0", "B-0"], "W3": ["A-1", "B-1", "B"], "W4": ["A-2"]},
        )
        day3 = export(DAYS[2])
        assert late in {i for i, _ in day3.run.unfilled}
        slow.commit()
        d.rebalance(
            d.leave("W3"),
            "member left",
            "W3",
            {"W1": ["A", "A-0", "B-0", "B"], "W4": ["A-2", "A-1", "B-1"]},
        )
        export(DAYS[3])
        # More events, then the latest date again: it starts from the same state and picks
        # them up.
        d.rebalance(
            d.join("W5"),
            "member joined",
            "W5",
            {"W1": ["A", "A-0", "B-0"], "W4": ["A-2", "A-1"], "W5": ["B", "B-1"]},
        )
        last = _export(spark, database_url, out, DAYS[3])
    assert last.run.since_event_id == first_runs[DAYS[3]].run.since_event_id
    assert last.run.until_event_id > first_runs[DAYS[3]].run.until_event_id

    uri = last.paths["summary"].rsplit("/reports/", 1)[0]
    fs = OutputFS(spark)
    for day in DAYS:
        assert fs.exists(join(incremental.state_path(uri, day), "_SUCCESS")), day

    # An older date again: the same findings and state as its first run.
    def date_output(day: str) -> dict[str, list[tuple[Any, ...]]]:
        found = {name: _rows(T.read(spark, uri, f"findings/{name}", day)) for name in TABLES}
        state = spark.read.parquet(incremental.state_path(uri, day))
        found["_state"] = _rows(state)
        return found

    day2_first = date_output(DAYS[1])
    again = _export(spark, database_url, out, DAYS[1])
    assert again.run.until_event_id == first_runs[DAYS[1]].run.until_event_id
    assert again.run.as_of_ms == first_runs[DAYS[1]].run.as_of_ms
    assert date_output(DAYS[1]) == day2_first

    # The findings as of the last date, against one fold over everything and the Spark
    # recomputation, with the same "now" and snapshot.
    config = fnd.FindingsConfig(
        grace_ms=GRACE_MS,
        as_of_ms=last.run.as_of_ms,
        snapshot_after_event_id=last.run.snapshot_after_event_id,
    )
    exported = {
        name: snap.read_exported(spark, fs, join(uri, name), DAYS[3])
        for name in snap.SNAPSHOT_TABLES
    }
    history = spark.read.parquet(join(uri, "events")).drop("export_date").dropDuplicates(["id"])
    assert history.filter(F.col("id") == late).count() == 1
    held_frames: list[DataFrame] = []

    def hold(df: DataFrame) -> DataFrame:
        held_frames.append(df.cache())
        return held_frames[-1]

    whole = incremental.fold_findings(spark, history, None, lambda: history, config, exported, hold)
    assert whole.mode.startswith("whole history")
    reference = fnd.compute(history, exported, config).tables()
    for name in TABLES:
        current = incremental.read_current(spark, uri, name, DAYS[3])
        assert _rows(current) == _rows(whole.tables[name]), name
        assert _fold_rows_as_reference(name, current) == _reference_rows(name, reference[name]), (
            name
        )
    rebalances = {r["group_epoch"]: r for r in whole.tables["rebalances"].collect()}
    deleted = [r for r in rebalances.values() if r["reason"] == "connector deleted"]
    assert len(deleted) == 1 and sorted(deleted[0]["removed"]) == ["C", "C-0"]
    assert not set(deleted[0]["left_unassigned"]) & {"C", "C-0"}
    assert any(r["scheduled_rebalance_delay_ms"] == DELAY_MS for r in rebalances.values())
    for df in held_frames:
        df.unpersist()

    # The pure fold on the same events: split anywhere, the same rows as one fold.
    events = [
        Event.from_parsed(r.asDict())
        for r in ev.parsed(history.filter(F.col("event_type").isin(*ev.USED_EVENT_TYPES)))
        .orderBy("id")
        .collect()
    ]
    assert len(events) > 60
    check_every_split(events, config.as_of_ms, GRACE_MS)
