"""The parts of the audit export that need no Spark: database URLs, the watermark rules, the
report's picture, the command line, and the event vocabulary's agreement with the coordinator."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest

from audit_export import events, report
from audit_export.source import SourceError, events_condition, source_from_url
from audit_export.watermark import RunRecord, WatermarkError, plan_range, still_unfilled
from coordinator_svc.core.records import EventType
from tests.support.coordinator import REPO


def test_sqlalchemy_postgres_urls_become_jdbc_urls_with_credentials_apart() -> None:
    s = source_from_url("postgresql+psycopg://audit:p%40ss@db.example:5433/coord?sslmode=require")
    assert s.dialect == "postgresql"
    assert s.jdbc_url == "jdbc:postgresql://db.example:5433/coord?sslmode=require"
    assert (s.user, s.password) == ("audit", "p@ss")
    assert "p%40ss" not in s.display and "***" in s.display
    assert s.options()["driver"] == "org.postgresql.Driver"


def test_sqlite_urls_name_the_file_absolutely() -> None:
    assert source_from_url("sqlite:////var/lib/c.db").jdbc_url == "jdbc:sqlite:/var/lib/c.db"
    relative = source_from_url("sqlite:///coordinator.db")
    assert relative.jdbc_url == "jdbc:sqlite:" + os.path.abspath("coordinator.db")
    assert source_from_url("jdbc:sqlite:/x.db").dialect == "sqlite"


@pytest.mark.parametrize("url", ["sqlite://", "mysql://h/db", "postgresql:///db?host=/run"])
def test_urls_the_export_cannot_read_are_refused(url: str) -> None:
    with pytest.raises(SourceError):
        source_from_url(url)


def _run(date: str, since: int, until: int) -> RunRecord:
    return RunRecord(date, since, until, until, "", until - since)


def test_each_export_date_starts_after_the_previous_dates_watermark() -> None:
    assert plan_range([], "2026-01-01", 10, None).since_event_id == 0
    runs = [_run("2026-01-01", 0, 10)]
    r = plan_range(runs, "2026-01-02", 25, None)
    assert (r.since_event_id, r.until_event_id) == (10, 25)


def test_rerunning_the_latest_date_starts_from_its_start_and_picks_up_new_events() -> None:
    runs = [_run("2026-01-01", 0, 10), _run("2026-01-02", 10, 25)]
    r = plan_range(runs, "2026-01-02", 30, None)
    assert (r.since_event_id, r.until_event_id) == (10, 30)


def test_rerunning_an_older_date_repeats_exactly_its_recorded_range() -> None:
    runs = [_run("2026-01-01", 0, 10), _run("2026-01-02", 10, 25)]
    r = plan_range(runs, "2026-01-01", 30, None)
    assert (r.since_event_id, r.until_event_id) == (0, 10)


def test_since_overrides_the_watermark_and_a_database_behind_it_is_refused() -> None:
    runs = [_run("2026-01-01", 0, 10)]
    assert plan_range(runs, "2026-01-02", 30, 3).since_event_id == 3
    with pytest.raises(WatermarkError, match="below the recorded watermark"):
        plan_range(runs, "2026-01-02", 5, None)


def test_watermark_records_round_trip_as_json() -> None:
    run = RunRecord(
        "2026-01-01", 0, 10, 9, "t", 10, {"events": 10}, "sqlite:///x", (3,), ((3, 7), (8, 9))
    )
    assert RunRecord.from_json(run.to_json()) == run


def test_the_next_date_looks_again_for_the_ids_the_previous_one_missed() -> None:
    first = replace(_run("2026-01-01", 0, 10), unfilled=((4, 1_000), (9, 2_000)))
    r = plan_range([first], "2026-01-02", 20, None)
    assert (r.since_event_id, r.until_event_id, r.recheck) == (10, 20, (4, 9))
    assert r.exclude == () and r.recorded_unfilled is None
    # 4 turned up, 9 did not, 15 of the new range is missing too: 9 keeps when it was first
    # seen, 15 is new.
    assert still_unfilled(r, [9, 15], now_ms=3_000, wait_ms=10_000) == ((9, 2_000), (15, 3_000))
    # Missing for longer than the wait after being looked for again: given up. An id of the
    # run's own range is always looked for once more, however old the run.
    assert still_unfilled(r, [9, 15], now_ms=13_000, wait_ms=10_000) == ((15, 13_000),)


def test_a_rerun_looks_for_what_its_first_run_looked_for() -> None:
    day1 = replace(_run("2026-01-01", 0, 10), unfilled=((4, 1_000),))
    day2 = replace(_run("2026-01-02", 10, 20), rechecked=(4,), unfilled=((15, 5_000),))
    latest = plan_range([day1, day2], "2026-01-02", 25, None)
    assert (latest.since_event_id, latest.until_event_id, latest.recheck) == (10, 25, (4,))
    assert latest.unfilled_before == {4: 1_000}
    # An older date, re-run after day 3 exported what day 2 missed: exactly day 2's export
    # again, and its record unchanged (day 3 took over id 15).
    day3 = replace(_run("2026-01-03", 20, 30), rechecked=(15,))
    older = plan_range([day1, day2, day3], "2026-01-02", 40, None)
    assert (older.since_event_id, older.until_event_id) == (10, 20)
    assert older.recheck == (4,) and older.exclude == (15,)
    assert still_unfilled(older, [], now_ms=99_000, wait_ms=1) == ((15, 5_000),)


def test_the_events_condition_names_the_range_the_rechecks_and_the_exclusions() -> None:
    assert events_condition(10, 20) == "id > 10 AND id <= 20"
    assert events_condition(10, 20, recheck=(4, 9), exclude=(15,)) == (
        "(id > 10 AND id <= 20 AND id NOT IN (15)) OR id IN (4, 9)"
    )


def test_the_event_types_read_are_the_coordinators() -> None:
    assert {e.value for e in EventType} >= events.USED_EVENT_TYPES


def test_the_timeline_draws_a_lane_per_resource_a_bar_per_run_and_each_bump() -> None:
    t = report.GroupTimeline(
        "g<1>",
        intervals=[
            report.Interval("A-0", "W1", 1_000, 2_000),
            report.Interval("A-0", "W2", 2_500, None),
            report.Interval("A", "W1", 1_000, None),
        ],
        markers=[report.Marker(4, 1_000, "member joined"), report.Marker(5, 2_200, "left")],
        resources_total=2,
        as_of_ms=3_000,
    )
    svg = report.timeline_svg(t)
    assert svg.count('class="lane"') == 2 and ">A-0</text>" in svg and ">A</text>" in svg
    assert svg.count("<title>A-0 on ") == 2 and svg.count("<title>A on ") == 1
    # 1000 ms without a change in a 2000 ms history: drawn shortened, and labelled.
    assert "shortened in the picture" in svg and "1.00 s" in svg
    assert ">e4<title>" in svg and ">e5<title>" in svg
    assert "A-0 on W2" in svg and "still running" in svg
    assert "g<1>" not in svg and "g&lt;1&gt;" in svg
    assert report.PALETTE[0] in svg and report.PALETTE[1] in svg


def test_help_documents_the_database_output_since_and_partitions() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "audit_export.cli", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    for option in (
        "--database-url",
        "--output",
        "--export-date",
        "--since-event-id",
        "--partitions",
        "--event-rows-per-partition",
        "--grace-ms",
        "--master",
        "--jdbc-jars",
        "--include-config-values",
    ):
        assert option in proc.stdout, option
    assert "watermark" in proc.stdout and "DATABASE_URL" in proc.stdout


def test_the_report_says_whether_the_catalogue_holds_config_values_and_status_traces() -> None:
    summary = {"export_date": "2026-01-01", "watermark": {"since_event_id": 0, "until_event_id": 3}}
    assert "digests only" in report.render_html({**summary, "connector_configs": "digests"}, [])
    shown = report.render_html({**summary, "connector_configs": "values"}, [])
    assert "digests and values (--include-config-values)" in shown
    # Status traces are digests whatever the options; the statuses are counted by state.
    assert "<td>status traces</td><td>digests only" in shown
    assert "<td>none reported</td>" in shown
    counted = report.render_html({**summary, "resource_statuses": {"FAILED": 2, "RUNNING": 5}}, [])
    assert "<td>resources by last reported status</td><td>FAILED 2, RUNNING 5</td>" in counted


def test_secrets_of_a_url_stay_out_of_the_jdbc_url_and_the_display() -> None:
    """Spark shows the JDBC URL in its plans: the password and other secret parameters go to the
    driver as connection properties, and the display masks them."""
    for url in (
        "jdbc:postgresql://db.example:5432/coord?user=audit&password=pw1&sslpassword=pw2&ssl=true",
        "postgresql+psycopg://audit:pw1@db.example:5432/coord?sslpassword=pw2&ssl=true",
        "postgresql://db.example:5432/coord?user=audit&password=pw1&sslpassword=pw2&ssl=true",
    ):
        s = source_from_url(url)
        assert "pw1" not in s.jdbc_url and "pw2" not in s.jdbc_url, s.jdbc_url
        assert "pw1" not in s.display and "pw2" not in s.display, s.display
        assert "ssl=true" in s.jdbc_url and "db.example:5432" in s.display
        options = s.options()
        assert (options["user"], options["password"], options["sslpassword"]) == (
            "audit",
            "pw1",
            "pw2",
        )
