#!/usr/bin/env python3
"""The audit export benchmark's driver (run it through ./bench/run-audit-export; see
bench/README.md).

1. Starts a throwaway PostgreSQL, creates the coordinator's schema (Alembic), and generates one
   group straight in SQL: CONNECTORS x TASKS tasks, MEMBERS members with the tasks spread
   round-robin (current and target assignment), and EVENTS events: the catalogue being put, the
   members joining, then rebalance rounds in which every member is delivered the new epoch
   (ASSIGNMENT_DELIVERED with its assigned set), as a real group of that size would log them.
2. Baseline: PostgreSQL's `COPY <table> TO '<file>'` of the same tables to local disk (server
   side, text format), twice (the first warms the caches; the faster counts), and, for reference,
   `COPY ... TO STDOUT` into a local file through psycopg.
3. The export: a local Spark session (start-up timed on its own), then one audit export run:
   the snapshot (every state table read over JDBC at one pinned instant, the derived tables
   flattened by the database, written as Parquet) and the events (parallel JDBC range reads,
   written as Parquet) at once, then findings and report. Then the same export again in the same
   JVM (warm), for reference.

Figures: rows/s of COPY and of the export (the same source rows; the export's time is from the
start of the run until the snapshot and the events are written, without Spark's start-up and
without the findings, which are reported apart), and their ratio (aim: >= 50 %).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "generated"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import psycopg  # noqa: E402
from psycopg.types.numeric import Int8  # noqa: E402

from coordinator_svc.store.migrate import upgrade_to_head  # noqa: E402
from tests.support.pgcluster import ThrowawayCluster, create_database, libpq_url  # noqa: E402

RESULTS = REPO / "bench" / "results"
GROUP = "bench"
TABLES = (
    "groups",
    "group_leases",
    "members",
    "connectors",
    "target_assignments",
    "target_assignment_members",
    "group_configs",
    "events",
)
EMPTY_SET = '{"connectors": [], "tasks": []}'
ASSIGNORS = (
    '[{"name": "incremental_cooperative", "minimum_version": 1, "maximum_version": 2, '
    '"reason": 0, "version": 2, "metadata": ""}]'
)


_CANONICAL_CONFIG = '{"tasks.max":"%%s","topic":"topic-%%s"}'
CONFIG_DIGEST_SQL = (
    f"'sha256:' || encode(sha256(convert_to(format('{_CANONICAL_CONFIG}', %(t)s, k), 'UTF8')), "
    "'hex')"
)
"""Connector k's unkeyed `connect_protocol.configs.config_digest` (its config, as generated:
sorted keys, no spaces), in SQL (a psycopg query text: `%%` is `%`). Unkeyed on purpose: the rows
and events stand for ones written before migration 0005 keyed digests (PostgreSQL has no HMAC
without pgcrypto); the export copies a digest as it finds it, keyed or not."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def note_state(args: argparse.Namespace, name: str, value: str) -> None:
    """For run-audit-export's exit trap: what to clean up if this driver is killed."""
    if args.state_dir:
        (Path(args.state_dir) / name).write_text(value)


# --- data --------------------------------------------------------------------------------


def _ints(**params: Any) -> dict[str, Any]:
    """Query parameters, integers sent as bigint (psycopg would pick the smallest int type,
    and arithmetic on it in SQL would overflow)."""
    return {k: Int8(v) if isinstance(v, int) else v for k, v in params.items()}


def generate(conn: psycopg.Connection[Any], args: argparse.Namespace) -> dict[str, Any]:
    """One group of CONNECTORS x TASKS tasks, MEMBERS members and EVENTS events, in SQL."""
    c, t, m, n = args.connectors, args.tasks, args.members, args.events
    now_ms = int(time.time() * 1000)
    base_ms = now_ms - n * args.event_spacing_ms - 60_000
    conn.execute("SET synchronous_commit = off")
    conn.execute(
        """
        CREATE TEMP TABLE member_sets AS
        SELECT m,
               format('worker-%%s', lpad(m::text, 5, '0')) AS member_id,
               jsonb_build_object(
                 'connectors', coalesce((
                   SELECT jsonb_agg(format('conn-%%s', lpad(k::text, 5, '0')) ORDER BY k)
                   FROM generate_series(m, %(c)s - 1, %(m)s) k), '[]'::jsonb),
                 'tasks', coalesce((
                   SELECT jsonb_agg(jsonb_build_object(
                            'connector', format('conn-%%s', lpad((g / %(t)s)::text, 5, '0')),
                            'task', g %% %(t)s) ORDER BY g)
                   FROM generate_series(m, %(c)s * %(t)s - 1, %(m)s) g), '[]'::jsonb)
               ) AS assigned
        FROM generate_series(0, %(m)s - 1) m
        """,
        _ints(c=c, t=t, m=m),
    )
    # Epochs: the group starts at 1; every connector put and every join bumps it.
    e_joined = 1 + c + m
    # Rebalance rounds: round 0 installs the first target (the last join's epoch), every later
    # round is a scheduled rebalance firing; each delivers the new epoch to every member.
    head = 2 + 2 * c + 2 * m  # the first id after the puts and the joins
    per_round = 3 + m
    rounds = max(1, -(-(n - head + 1) // per_round))
    e_last = e_joined + rounds - 1
    conn.execute(
        """
        INSERT INTO groups (group_id, group_type, group_epoch, created_at_ms,
            assignor_member_id, compute_requested_epoch, excluded_assignors,
            compute_not_before_ms, last_assignment_error, last_assignment_error_message,
            prepared, holds, session_floor_ms, session_floor_until_ms)
        VALUES (%(g)s, 'connect', %(e)s, %(base)s, 'worker-00000', NULL, '[]', NULL, 0, '',
            'null', '[]', 0, 0)
        """,
        _ints(g=GROUP, e=e_last, base=base_ms),
    )
    conn.execute(
        """
        INSERT INTO group_leases VALUES (%(g)s, 'bench-node', '127.0.0.1:9093', 1,
            now() + interval '10 seconds', now())
        """,
        _ints(g=GROUP),
    )
    conn.execute(
        """
        INSERT INTO connectors (group_id, name, task_count, config, config_digest)
        SELECT %(g)s, format('conn-%%s', lpad(k::text, 5, '0')), %(t)s,
               jsonb_build_object('topic', format('topic-%%s', k), 'tasks.max', %(t)s::text),
               {CONFIG_DIGEST}
        FROM generate_series(0, %(c)s - 1) k
        """.replace("{CONFIG_DIGEST}", CONFIG_DIGEST_SQL),
        _ints(g=GROUP, c=c, t=t),
    )
    conn.execute(
        """
        INSERT INTO members (group_id, member_id, instance_id, url, member_epoch,
            previous_epoch, state, rebalance_timeout_ms, assignors, assigned, pending_revocation)
        SELECT %(g)s, member_id, NULL, format('http://%%s:8083', member_id), %(e)s, %(e)s - 1,
               'STABLE', 60000, %(assignors)s::jsonb, assigned, %(empty)s::jsonb
        FROM member_sets
        """,
        _ints(g=GROUP, e=e_last, assignors=ASSIGNORS, empty=EMPTY_SET),
    )
    conn.execute(
        "INSERT INTO target_assignments VALUES (%(g)s, %(e)s, '\\x00'::bytea, NULL)",
        _ints(g=GROUP, e=e_last),
    )
    conn.execute(
        """
        INSERT INTO target_assignment_members (group_id, member_id, resources, version, metadata)
        SELECT %(g)s, member_id, assigned, 2, ''::bytea FROM member_sets
        """,
        {"g": GROUP},
    )
    conn.execute(
        """
        INSERT INTO group_configs VALUES
            (%(g)s, 'heartbeat.interval.ms', '3000'),
            (%(g)s, 'scheduled.rebalance.max.delay.ms', '300000'),
            (%(g)s, 'session.timeout.ms', '10000')
        """,
        {"g": GROUP},
    )
    started = time.monotonic()
    ev = """INSERT INTO events (id, occurred_at, at_ms, group_id, group_epoch, event_type,
                member_id, payload)
            SELECT id, to_timestamp((%(base)s + id * %(sp)s) / 1000.0), %(base)s + id * %(sp)s,
                   %(g)s, epoch, type, member, payload
            FROM ({body}) s (id, epoch, type, member, payload) WHERE id <= %(n)s"""
    params = _ints(base=base_ms, sp=args.event_spacing_ms, g=GROUP, n=n)
    conn.execute(
        ev.format(
            body="SELECT 1::bigint AS id, 1 AS epoch, 'GROUP_CREATED' AS type, "
            "NULL::text AS member, '{}'::jsonb AS payload"
        ),
        params,
    )
    # The catalogue: a put and a bump per connector.
    conn.execute(
        ev.format(
            body="""
            SELECT 2 + 2 * k + x AS id, 1 + k + x AS epoch,
                   CASE x WHEN 0 THEN 'CONNECTOR_PUT' ELSE 'GROUP_EPOCH_BUMPED' END AS type,
                   NULL::text AS member,
                   CASE x WHEN 0 THEN jsonb_build_object(
                            'connector', format('conn-%%s', lpad(k::text, 5, '0')),
                            'task_count', %(t)s, 'previous_task_count', NULL,
                            'config_changed', true,
                            'config_digest', {CONFIG_DIGEST}, 'caller', 'ipv4:127.0.0.1:1')
                   ELSE jsonb_build_object('reason', 'connector added',
                            'connector', format('conn-%%s', lpad(k::text, 5, '0'))) END
            FROM generate_series(0, %(c)s - 1) k, generate_series(0, 1) x""".replace(
                "{CONFIG_DIGEST}", CONFIG_DIGEST_SQL
            )
        ),
        {**params, **_ints(c=c, t=t)},
    )
    # The members join, one bump each.
    conn.execute(
        ev.format(
            body="""
            SELECT 2 + 2 * %(c)s + 2 * m + x AS id, 1 + %(c)s + m + x AS epoch,
                   CASE x WHEN 0 THEN 'MEMBER_JOINED' ELSE 'GROUP_EPOCH_BUMPED' END AS type,
                   member_id AS member,
                   CASE x WHEN 0 THEN jsonb_build_object('instance_id', NULL, 'url', '',
                            'assignors', jsonb_build_array('incremental_cooperative'))
                   ELSE jsonb_build_object('reason', 'member joined') END
            FROM member_sets, generate_series(0, 1) x"""
        ),
        {**params, **_ints(c=c)},
    )
    # Rebalance rounds.
    conn.execute(
        ev.format(
            body="""
            SELECT %(head)s + r * %(per)s + x AS id, %(ej)s + r AS epoch,
                   CASE x WHEN 0 THEN 'GROUP_EPOCH_BUMPED' WHEN 1 THEN 'ASSIGNMENT_REQUESTED'
                          ELSE 'TARGET_INSTALLED' END AS type,
                   CASE x WHEN 0 THEN NULL ELSE 'worker-00000' END AS member,
                   CASE x WHEN 0 THEN jsonb_build_object('reason', 'scheduled rebalance fired')
                          WHEN 1 THEN jsonb_build_object('group_epoch', %(ej)s + r)
                          ELSE jsonb_build_object('assignment_epoch', %(ej)s + r,
                                 'moves', '[]'::jsonb, 'unassigned', '[]'::jsonb,
                                 'scheduled_rebalance_delay_ms', 0) END
            FROM generate_series(0, %(rounds)s - 1) r, generate_series(0, 2) x
            WHERE NOT (r = 0 AND x = 0)"""
        ),
        {**params, **_ints(head=head, per=per_round, ej=e_joined, rounds=rounds)},
    )
    conn.execute(
        ev.format(
            body="""
            SELECT %(head)s + r * %(per)s + 3 + s.m AS id, %(ej)s + r AS epoch,
                   'ASSIGNMENT_DELIVERED' AS type, s.member_id AS member,
                   jsonb_build_object('member_epoch', %(ej)s + r, 'state', 'STABLE',
                       'assigned', s.assigned,
                       'added', CASE r WHEN 0 THEN s.assigned ELSE %(empty)s::jsonb END,
                       'removed', %(empty)s::jsonb)
            FROM generate_series(0, %(rounds)s - 1) r, member_sets s"""
        ),
        {**params, **_ints(head=head, per=per_round, ej=e_joined, rounds=rounds, empty=EMPTY_SET)},
    )
    conn.execute("SELECT setval('events_id_seq', (SELECT max(id) FROM events))")
    conn.commit()
    log(f"events inserted in {time.monotonic() - started:.1f} s; VACUUM ANALYZE")
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE")
    conn.autocommit = False
    rows = {
        table: int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]) for table in TABLES
    }
    size = conn.execute(
        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
        "WHERE c.relname = ANY(%s) AND c.relkind = 'r'",
        [list(TABLES)],
    ).fetchone()
    conn.commit()
    return {
        "rows": rows,
        "tasks": c * t,
        "members": m,
        "rounds": rounds,
        "table_bytes": int(size[0]) if size else 0,
    }


# --- the baseline ---------------------------------------------------------------------------


def copy_server_side(conn: psycopg.Connection[Any], directory: Path) -> dict[str, float]:
    """`COPY <table> TO '<file>'` per table (the server writes the files); seconds per table."""
    out = {}
    conn.autocommit = True
    for table in TABLES:
        target = directory / f"{table}.copy"
        started = time.monotonic()
        conn.execute(f"COPY {table} TO '{target}'")
        out[table] = time.monotonic() - started
    conn.autocommit = False
    return out


def copy_to_stdout(conn: psycopg.Connection[Any], directory: Path) -> dict[str, float]:
    """`COPY <table> TO STDOUT` through psycopg into a local file (what `psql \\copy` does)."""
    out = {}
    for table in TABLES:
        started = time.monotonic()
        with (
            (directory / f"{table}.stdout").open("wb") as f,
            conn.cursor() as cur,
            cur.copy(f"COPY {table} TO STDOUT") as copy,
        ):
            for block in copy:
                f.write(block)
        out[table] = time.monotonic() - started
        conn.commit()
    return out


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --- the run ------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="10,000 tasks, 1,000 members, 100,000 events (about 2 minutes)",
    )
    parser.add_argument("--connectors", type=int, default=1_000)
    parser.add_argument("--tasks", type=int, default=100, help="tasks per connector")
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument(
        "--event-spacing-ms",
        type=int,
        default=1,
        help="coordinator-clock time between generated events",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=4,
        help="the export's --partitions (parallel JDBC reads per table)",
    )
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument(
        "--no-findings",
        action="store_true",
        help="export the tables only (skip the findings and the report)",
    )
    parser.add_argument(
        "--keep-output",
        action="store_true",
        help="keep the Parquet output and COPY files (printed at the end)",
    )
    inc = parser.add_argument_group(
        "incremental findings (--incremental: daily runs on a growing history, each in a fresh "
        "process, against recomputing the whole history)"
    )
    inc.add_argument("--incremental", action="store_true", help="run this benchmark instead")
    inc.add_argument("--days", type=int, default=10)
    inc.add_argument("--events-per-day", type=int, default=100_000)
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.connectors, args.tasks, args.members, args.events = 100, 100, 1_000, 100_000
        args.days, args.events_per_day = 4, 25_000
    args.screenshots = RESULTS if args.incremental else None

    RESULTS.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    note_state(args, "work_dir", str(work))
    os.chmod(work, 0o777)  # the server (user postgres) writes COPY files here
    result: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k != "state_dir"},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    try:
        with ThrowawayCluster(settings={"max_wal_size": "4GB", "autovacuum": "off"}) as cluster:
            note_state(args, "pg_base", str(cluster.base_dir))
            note_state(args, "pg_bin", str(cluster.bin_dir))
            url = create_database(cluster.url, "audit_bench")
            upgrade_to_head(url)
            if args.incremental:
                from bench import audit_incremental_bench

                result["incremental"] = audit_incremental_bench.run(args, url, work)
                path = RESULTS / "audit-incremental-latest.json"
                path.write_text(json.dumps(result, indent=2, default=str) + "\n")
                print(f"results: {path}; report screenshots: {RESULTS}/audit-report-*.png")
                return 0
            log(
                f"generating {args.connectors * args.tasks:,} tasks, {args.members:,} members, "
                f"{args.events:,} events"
            )
            started = time.monotonic()
            with psycopg.connect(libpq_url(url)) as conn:
                data = generate(conn, args)
            data["generate_s"] = time.monotonic() - started
            result["data"] = data
            total_rows = sum(data["rows"].values())
            log(
                f"generated in {data['generate_s']:.1f} s: {total_rows:,} rows, "
                f"{data['table_bytes'] / 1e6:.0f} MB ({data['rows']})"
            )

            copies = []
            with psycopg.connect(libpq_url(url)) as conn:
                for attempt in range(2):
                    d = work / f"copy{attempt}"
                    d.mkdir()
                    os.chmod(d, 0o777)
                    secs = copy_server_side(conn, d)
                    copies.append({"seconds": secs, "total_s": sum(secs.values()), "bytes": du(d)})
                    log(f"COPY TO file #{attempt + 1}: {sum(secs.values()):.2f} s")
                    shutil.rmtree(d, ignore_errors=True)
                d = work / "stdout"
                d.mkdir()
                secs = copy_to_stdout(conn, d)
                stdout_copy = {"seconds": secs, "total_s": sum(secs.values()), "bytes": du(d)}
                shutil.rmtree(d, ignore_errors=True)
                log(f"COPY TO STDOUT (psycopg): {stdout_copy['total_s']:.2f} s")
            result["copy_to_file"] = copies
            result["copy_to_stdout"] = stdout_copy
            copy_s = min(c["total_s"] for c in copies)

            from audit_export.job import ExportOptions, run_export
            from audit_export.session import local_session
            from audit_export.source import ReadTuning

            load_before = os.getloadavg()
            started = time.monotonic()
            spark = local_session(
                driver_memory=args.driver_memory, shuffle_partitions=args.shuffle_partitions
            )
            startup_s = time.monotonic() - started
            log(f"Spark session started in {startup_s:.1f} s")
            out = work / "export"
            started = time.monotonic()
            try:
                export = run_export(
                    spark,
                    ExportOptions(
                        url,
                        str(out),
                        export_date=dt.date.today().isoformat(),
                        tuning=ReadTuning(max_partitions=args.partitions),
                        findings=not args.no_findings,
                    ),
                )
                export_wall_s = time.monotonic() - started
                log(f"export: {export_wall_s:.1f} s {export.timings}")
                # The same export again in the same JVM (warm: classes loaded, code generated,
                # JIT-compiled), to a fresh output: what a long-lived session would see.
                again = run_export(
                    spark,
                    ExportOptions(
                        url,
                        str(work / "export-again"),
                        export_date=dt.date.today().isoformat(),
                        tuning=ReadTuning(max_partitions=args.partitions),
                        findings=False,
                    ),
                )
                log(f"export again (warm JVM, no findings): {again.timings}")
            finally:
                spark.stop()
            timings = export.timings
            export_s = timings["export"]
            warm_s = again.timings["export"]
            result["spark"] = {
                "startup_s": startup_s,
                "wall_s": export_wall_s,
                "timings": timings,
                "warm_timings": again.timings,
                "source_rows": export.source_rows,
                "written_rows": export.run.table_rows,
                "output_bytes": du(out),
                "violations": None if export.summary is None else export.summary["violation_count"],
                "load_before": load_before,
                "load_after": os.getloadavg(),
            }
            source_rows = sum(export.source_rows.values())
            assert source_rows == total_rows, (export.source_rows, data["rows"])
    finally:
        if not args.keep_output:
            shutil.rmtree(work, ignore_errors=True)
        if args.state_dir:
            (Path(args.state_dir) / "work_dir").unlink(missing_ok=True)

    copy_rate = total_rows / copy_s
    export_rate = source_rows / export_s
    rows = [
        ("source rows (8 tables)", f"{total_rows:,}", "", ""),
        (
            "COPY TO file, server side (baseline)",
            f"{copy_s:.2f} s",
            f"{copy_rate:,.0f} rows/s",
            f"{copies[0]['total_s']:.2f} s cold",
        ),
        (
            "COPY TO STDOUT via psycopg (reference)",
            f"{stdout_copy['total_s']:.2f} s",
            f"{total_rows / stdout_copy['total_s']:,.0f} rows/s",
            "",
        ),
        ("Spark session start-up (apart)", f"{startup_s:.2f} s", "", ""),
        (
            "export: snapshot (7 tables)",
            f"{timings['snapshot']:.2f} s",
            "",
            f"{sum(v for k, v in export.run.table_rows.items() if k != 'events'):,} rows "
            f"written from {source_rows - export.source_rows['events']:,} source rows",
        ),
        (
            "export: events",
            f"{timings['events']:.2f} s",
            f"{export.source_rows['events'] / timings['events']:,.0f} rows/s",
            f"{args.partitions} JDBC partitions, beside the snapshot",
        ),
        (
            "export: snapshot + events",
            f"{export_s:.2f} s",
            f"{export_rate:,.0f} rows/s",
            f"ratio {export_rate / copy_rate:.0%} of COPY (aim >= 50%), fresh JVM",
        ),
        (
            "the same export again, warm JVM",
            f"{warm_s:.2f} s",
            f"{source_rows / warm_s:,.0f} rows/s",
            f"ratio {source_rows / warm_s / copy_rate:.0%} of COPY; events' part "
            f"{again.timings['events']:.2f} s",
        ),
    ]
    if "findings" in timings:
        rows.append(
            (
                "findings (apart)",
                f"{timings['findings']:.2f} s",
                f"{data['rows']['events'] / timings['findings']:,.0f} events/s",
                f"{result['spark']['violations']} violation(s)",
            )
        )
        rows.append(("summary + HTML report (apart)", f"{timings['report']:.2f} s", "", ""))
    width = max(len(r[0]) for r in rows)
    print()
    print(f"{'figure':<{width}} | {'time':>10} | {'rate':>18} | note")
    print("-" * (width + 60))
    for name, secs, rate, note in rows:
        print(f"{name:<{width}} | {secs:>10} | {rate:>18} | {note}")
    print(
        f"\nload average before/after the export: {result['spark']['load_before'][0]:.2f} / "
        f"{result['spark']['load_after'][0]:.2f} on {os.cpu_count()} cores"
    )
    result["figures"] = {
        "copy_rows_per_s": copy_rate,
        "export_rows_per_s": export_rate,
        "ratio": export_rate / copy_rate,
        "warm_export_rows_per_s": source_rows / warm_s,
        "warm_ratio": source_rows / warm_s / copy_rate,
        "spark_startup_s": startup_s,
    }
    result["git_commit"] = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    path = RESULTS / "audit-export-latest.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"results: {path}")
    if args.keep_output:
        print(f"output kept in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
