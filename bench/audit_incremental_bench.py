"""The incremental audit benchmark (`./bench/run-audit-export --incremental`; see bench/README.md).

A scheduled export runs once a day on a history that only grows. This runs DAYS daily exports of
EVENTS_PER_DAY new events each (by default 10 x 100,000: the history grows to 1,000,000), each in
a fresh process as a CronJob would, and reports per run the findings' time, the events it read
and the state it carried. Then, in the same run, the baseline: the findings recomputed from the
whole history (`--findings-mode whole-history`, what every run cost before) on the final history.

The group is generated in SQL as in `audit_export_bench.generate` (CONNECTORS x TASKS tasks
spread over MEMBERS members, then rebalance rounds, each delivering the new epoch to every
member); each further day appends rounds. The last day's report is screenshotted before (the
pre-issue-15 renderer) and after, into bench/results/.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.audit_export_bench import GROUP, _ints, generate, log

DAY0 = "2026-06-01"


def day_name(i: int) -> str:
    import datetime as dt

    return (dt.date.fromisoformat(DAY0) + dt.timedelta(days=i)).isoformat()


def append_rounds(conn: psycopg.Connection[Any], rounds: int, spacing_ms: int) -> int:
    """Append `rounds` rebalance rounds to the generated group's events (a bump, the assignor's
    request and install, a delivery to every member); returns the events added."""
    conn.execute("SET synchronous_commit = off")
    row = conn.execute("SELECT max(id), max(group_epoch), max(at_ms) FROM events").fetchone()
    assert row is not None
    last_id, epoch, last_ms = int(row[0]), int(row[1]), int(row[2])
    members = int(conn.execute("SELECT count(*) FROM member_sets").fetchone()[0])  # type: ignore[index]
    per_round = 3 + members
    params = _ints(g=GROUP, id0=last_id + 1, e0=epoch + 1, per=per_round, n=rounds)
    params.update(_ints(ms0=last_ms + spacing_ms, sp=spacing_ms))
    conn.execute(
        """
        INSERT INTO events (id, occurred_at, at_ms, group_id, group_epoch, event_type,
                            member_id, payload)
        SELECT id, to_timestamp((%(ms0)s + (id - %(id0)s) * %(sp)s) / 1000.0),
               %(ms0)s + (id - %(id0)s) * %(sp)s, %(g)s, epoch, type, member, payload
        FROM (
            SELECT %(id0)s + r * %(per)s + x AS id, %(e0)s + r AS epoch,
                   CASE x WHEN 0 THEN 'GROUP_EPOCH_BUMPED' WHEN 1 THEN 'ASSIGNMENT_REQUESTED'
                          ELSE 'TARGET_INSTALLED' END AS type,
                   CASE x WHEN 0 THEN NULL ELSE 'worker-00000' END AS member,
                   CASE x WHEN 0 THEN jsonb_build_object('reason', 'scheduled rebalance fired')
                          WHEN 1 THEN jsonb_build_object('group_epoch', %(e0)s + r)
                          ELSE jsonb_build_object('assignment_epoch', %(e0)s + r,
                                 'moves', '[]'::jsonb, 'unassigned', '[]'::jsonb,
                                 'scheduled_rebalance_delay_ms', 0) END
            FROM generate_series(0, %(n)s - 1) r, generate_series(0, 2) x
            UNION ALL
            SELECT %(id0)s + r * %(per)s + 3 + s.m, %(e0)s + r, 'ASSIGNMENT_DELIVERED',
                   s.member_id,
                   jsonb_build_object('member_epoch', %(e0)s + r, 'state', 'STABLE',
                       'assigned', s.assigned, 'added', '{"connectors": [], "tasks": []}'::jsonb,
                       'removed', '{"connectors": [], "tasks": []}'::jsonb)
            FROM generate_series(0, %(n)s - 1) r, member_sets s
        ) s (id, epoch, type, member, payload)
        """,
        params,
    )
    conn.execute("SELECT setval('events_id_seq', (SELECT max(id) FROM events))")
    conn.execute(
        "UPDATE groups SET group_epoch = %(e)s WHERE group_id = %(g)s",
        _ints(e=epoch + rounds, g=GROUP),
    )
    conn.commit()
    return rounds * per_round


def run_one_export(url: str, out: Path, day: str, mode: str, args: argparse.Namespace) -> Any:
    """One export in a fresh process (`--one-export`); its result as JSON."""
    spec = {
        "url": url,
        "out": str(out),
        "day": day,
        "mode": mode,
        "partitions": args.partitions,
        "driver_memory": args.driver_memory,
        "shuffle_partitions": args.shuffle_partitions,
        "screenshots": str(args.screenshots) if args.screenshots else "",
    }
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--one-export", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-5000:])
        raise RuntimeError(f"the export of {day} ({mode}) failed with {proc.returncode}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = time.monotonic() - started
    return result


def one_export(spec: dict[str, Any]) -> None:
    """The child process: a local session, one export, the figures as one JSON line."""
    from audit_export.job import ExportOptions, run_export
    from audit_export.session import local_session
    from audit_export.source import ReadTuning

    spark = local_session(
        driver_memory=spec["driver_memory"], shuffle_partitions=spec["shuffle_partitions"]
    )
    try:
        result = run_export(
            spark,
            ExportOptions(
                spec["url"],
                spec["out"],
                export_date=spec["day"],
                tuning=ReadTuning(max_partitions=spec["partitions"]),
                findings_mode=spec["mode"],
            ),
        )
        if spec["screenshots"]:
            _screenshots(spark, spec, result)
    finally:
        spark.stop()
    print(
        json.dumps(
            {
                "timings": result.timings,
                "events": result.run.event_rows,
                "mode": result.findings_mode,
                "state_rows": result.run.table_rows.get("findings/_state"),
                "state_bytes": result.findings_state_bytes,
                "violations": None if result.summary is None else result.summary["violation_count"],
            }
        )
    )


def _screenshots(spark: Any, spec: dict[str, Any], result: Any) -> None:
    """The run's report drawn by today's renderer and by the pre-issue-15 one, as PNG."""
    from audit_export import report, report_data, snapshot
    from audit_export.fs import OutputFS, join
    from tests.support.browser import screenshot
    from tests.support.frozen_report_v0 import render_before

    fs = OutputFS(spark)
    found = {
        name: snapshot.read_exported(spark, fs, join(spec["out"], "findings", name), spec["day"])
        for name in ("rebalances", "lost_resources", "connector_moves", "violations", "ownership")
    }
    timelines = report_data.collect_timelines(found, result.run.as_of_ms or 0)
    directory = Path(spec["screenshots"])
    directory.mkdir(parents=True, exist_ok=True)
    for name, html in (
        ("before", render_before(result.summary, timelines)),
        ("after", report.render_html(result.summary, timelines)),
    ):
        page = directory / f"audit-report-{name}.html"
        page.write_text(html)
        screenshot(page, directory / f"audit-report-{name}.png", width=1400, height=2400)


def run(args: argparse.Namespace, url: str, work: Path) -> dict[str, Any]:
    """The daily runs and the whole-history baseline; prints the table, returns the figures."""
    per_day = args.events_per_day
    args.events = per_day
    with psycopg.connect(libpq_url_of(url)) as conn:
        generate(conn, args)
        per_round = 3 + args.members
        out = work / "incremental"
        runs = []
        total = per_day
        for i in range(args.days):
            if i > 0:
                rounds = max(1, -(-per_day // per_round))
                total += append_rounds(conn, rounds, args.event_spacing_ms)
            last = i == args.days - 1
            result = run_one_export(
                url,
                out,
                day_name(i),
                "incremental",
                argparse.Namespace(
                    **{**vars(args), "screenshots": args.screenshots if last else None}
                ),
            )
            result["history_events"] = total
            runs.append(result)
            log(
                f"day {i + 1}: {result['events']:,} new events (history {total:,}): findings "
                f"{result['timings'].get('findings', 0):.2f} s, state {result['state_rows']} "
                f"rows / {result['state_bytes'] / 1e6:.1f} MB ({result['mode']})"
            )
    baseline = run_one_export(
        url,
        work / "whole-history",
        day_name(args.days - 1),
        "whole-history",
        argparse.Namespace(**{**vars(args), "screenshots": None}),
    )
    b = baseline["timings"]["findings"]
    log(f"baseline (whole history, {total:,} events): findings {b:.2f} s")

    first = runs[0]["timings"]["findings"]
    print()
    print(
        f"{'run':<26} | {'new events':>10} | {'history':>10} | {'findings':>9} | "
        f"{'vs run 1':>8} | {'state':>16} | mode"
    )
    print("-" * 110)
    for i, r in enumerate(runs):
        f = r["timings"]["findings"]
        print(
            f"{'day ' + str(i + 1) + ' (fresh process)':<26} | {r['events']:>10,} | "
            f"{r['history_events']:>10,} | {f:>8.2f}s | {f / first:>7.2f}x | "
            f"{r['state_rows']:>5} rows {r['state_bytes'] / 1e6:>5.1f} MB | {r['mode']}"
        )
    print(
        f"{'baseline: whole history':<26} | {baseline['events']:>10,} | {total:>10,} | "
        f"{b:>8.2f}s | {b / first:>7.2f}x | {'-':>16} | {baseline['mode']}"
    )
    worst = max(r["timings"]["findings"] for r in runs)
    print(
        f"\nworst incremental run: {worst / first:.2f}x the first (aim: < 2x); the last run "
        f"{runs[-1]['timings']['findings']:.2f} s against {b:.2f} s recomputing the whole "
        "history "
        f"({b / runs[-1]['timings']['findings']:.1f}x faster)"
    )
    return {"runs": runs, "baseline": baseline, "worst_vs_first": worst / first}


def libpq_url_of(url: str) -> str:
    from tests.support.pgcluster import libpq_url

    return libpq_url(url)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one-export":
        repo = Path(__file__).resolve().parents[1]
        for extra in (repo, repo / "generated"):
            if str(extra) not in sys.path:
                sys.path.insert(0, str(extra))
        one_export(json.loads(sys.argv[2]))
