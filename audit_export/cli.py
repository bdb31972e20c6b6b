"""`coordinator-audit-export`: run the audit export locally (a local Spark session), and the
argument handling shared with the `spark-submit` entry point (`spark_submit.py`)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from connect_protocol.env import env_default

from .job import ExportOptions, ExportResult, run_export
from .source import DEFAULT_JDBC_JARS, ProgressNotRecorded, ReadTuning
from .watermark import EXPORT_NAME_LENGTH, WatermarkError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_DATABASE_URL = "sqlite:///coordinator.db"
EXIT_VIOLATIONS = 3
#: The run refused before writing anything: the watermarks and the database disagree, or events
#: it needs were pruned by the coordinators' event retention.
EXIT_REFUSED = 4
#: The run committed, but its progress could not be recorded in the database.
EXIT_PROGRESS_NOT_RECORDED = 5

DESCRIPTION = """\
Export the coordinator's tables for audit: a full snapshot of the current state (groups, members,
catalogue, target and current assignment, group configurations, leases) and the events added since
the previous run, as Parquet partitioned by export date and group; then audit findings computed in
Spark (rebalances: reason, moves, revocations, time to converge, lost resources and how long they
waited; task moves per connector; violations: a resource owned twice, a resource unassigned beyond
the grace window, a removed member still listed), written as Parquet, a JSON summary and an HTML
report under OUTPUT/reports/export_date=DATE/.

Connector configs carry secrets: the catalogue has each connector's config digest (sha256 of its
canonical JSON: a change shows, two snapshots compare) and not its values, unless
--include-config-values.

Incremental: each run records its watermark (the last event id it exported) in
OUTPUT/_watermarks/; the next export date starts after it. The findings are incremental too: a
run folds only its own events into the state the previous date carried (OUTPUT/_findings_state/),
and writes what changed plus what is still open (column `open`); the findings as of a date are,
per row key, the latest date's row. Re-running an export date replaces what it wrote
(idempotent; an older date repeats its first run).

Event retention: after committing a run, the export appends its progress to the database
(audit_export_progress, under --export-name), so the coordinators' --event-retention-ms keeps every
event it may still read; its database role needs INSERT on that table. A run that would need
events the coordinators already pruned refuses (exit 4) and writes nothing: re-running the latest
date or running a new one works, an older date whose events are gone does not.

Every option can also be set by the environment variable named in its help; the database
password can be given in the URL or in AUDIT_EXPORT_DB_PASSWORD.
"""


_env = env_default


def build_parser(local: bool = True) -> argparse.ArgumentParser:
    """The options; `local` adds those of the local Spark session (spark-submit has its own)."""
    parser = argparse.ArgumentParser(
        prog="coordinator-audit-export" if local else "spark_submit.py",
        description=DESCRIPTION,
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, width=100),
    )
    src = parser.add_argument_group("source")
    src.add_argument(
        "--database-url",
        default=_env("DATABASE_URL", DEFAULT_DATABASE_URL),
        help="the coordinator's database: its SQLAlchemy URL (postgresql+psycopg://user:pw@host"
        ":5432/db, sqlite:///coordinator.db) or a JDBC URL (jdbc:postgresql://..., "
        "jdbc:sqlite:/path.db) (DATABASE_URL; default %(default)s)",
    )
    src.add_argument(
        "--db-user",
        default=_env("AUDIT_EXPORT_DB_USER", None),
        help="database user, overriding the URL's (AUDIT_EXPORT_DB_USER)",
    )
    dst = parser.add_argument_group("output")
    dst.add_argument(
        "--output",
        default=_env("AUDIT_EXPORT_OUTPUT", None),
        required=_env("AUDIT_EXPORT_OUTPUT", None) is None,
        help="output directory: a local path or a Hadoop URI (hdfs://, s3a://, ...) "
        "(AUDIT_EXPORT_OUTPUT)",
    )
    dst.add_argument(
        "--export-date",
        default=_env("AUDIT_EXPORT_DATE", None),
        help="the run's logical date, YYYY-MM-DD: the partition it writes, and the key of its "
        "watermark (AUDIT_EXPORT_DATE; default today, UTC)",
    )
    dst.add_argument(
        "--export-name",
        default=_env("AUDIT_EXPORT_NAME", None),
        help="the name this export's progress is recorded under in the database, for the "
        "coordinators' event retention (at most 128 characters; AUDIT_EXPORT_NAME; default: "
        "the output location)",
    )
    dst.add_argument(
        "--include-config-values",
        action="store_true",
        help="write each connector's config values in the catalogue, besides its digest: for "
        "operators who store the export as securely as the database (default: digests only; "
        "configs carry passwords and keys)",
    )
    inc = parser.add_argument_group("incremental events (since / watermark)")
    inc.add_argument(
        "--since-event-id",
        type=int,
        default=_env("AUDIT_EXPORT_SINCE_EVENT_ID", None),
        help="export the events with an id above this one, instead of starting after the "
        "previous export date's watermark (0: every event) (AUDIT_EXPORT_SINCE_EVENT_ID)",
    )
    inc.add_argument(
        "--unfilled-wait-ms",
        type=int,
        default=_env("AUDIT_EXPORT_UNFILLED_WAIT_MS", 3_600_000),
        help="an event id below the watermark that was missing from a run's snapshot (its "
        "transaction still open, or rolled back) is looked for again by the next export date; "
        "after this long missing it is given up (AUDIT_EXPORT_UNFILLED_WAIT_MS; default "
        "%(default)s)",
    )
    par = parser.add_argument_group("partitions (parallel JDBC reads)")
    defaults = ReadTuning()
    par.add_argument(
        "--partitions",
        type=int,
        default=_env("AUDIT_EXPORT_PARTITIONS", defaults.max_partitions),
        help="at most this many parallel reads per table: the events by ranges of their id, "
        "large PostgreSQL state tables by a hash of their key (AUDIT_EXPORT_PARTITIONS; "
        "default %(default)s)",
    )
    par.add_argument(
        "--event-rows-per-partition",
        type=int,
        default=_env("AUDIT_EXPORT_EVENT_ROWS_PER_PARTITION", defaults.event_rows_per_partition),
        help="event rows per read partition (default %(default)s)",
    )
    par.add_argument(
        "--fetch-size",
        type=int,
        default=_env("AUDIT_EXPORT_FETCH_SIZE", defaults.fetch_size),
        help="JDBC fetch size, rows per round trip (default %(default)s)",
    )
    fin = parser.add_argument_group("findings")
    fin.add_argument(
        "--grace-ms",
        type=int,
        default=_env("AUDIT_EXPORT_GRACE_MS", 60_000),
        help="how long a catalogue resource may run on no member (outside a delayed rebalance "
        "or a hold, with members in the group) before it is a violation "
        "(AUDIT_EXPORT_GRACE_MS; default %(default)s)",
    )
    fin.add_argument(
        "--no-findings",
        action="store_true",
        help="export the tables and events only: no findings, summary or report",
    )
    fin.add_argument(
        "--findings-mode",
        choices=("incremental", "whole-history"),
        default=_env("AUDIT_EXPORT_FINDINGS_MODE", "incremental"),
        help="incremental: fold this date's events into the previous date's state; "
        "whole-history: recompute from every exported event in Spark (the reference "
        "computation, at a cost that grows with the history) (AUDIT_EXPORT_FINDINGS_MODE; "
        "default %(default)s)",
    )
    fin.add_argument(
        "--max-report-rows",
        type=int,
        default=500,
        help="rows per list in the JSON summary and the HTML report; the Parquet findings "
        "have every row (default %(default)s)",
    )
    fin.add_argument(
        "--fail-on-violations",
        action="store_true",
        help=f"exit with status {EXIT_VIOLATIONS} when any violation is found (for alerting)",
    )
    if local:
        spark = parser.add_argument_group("local Spark session")
        spark.add_argument(
            "--master",
            default=_env("AUDIT_EXPORT_MASTER", "local[2]"),
            help="a local Spark master, local[N] (AUDIT_EXPORT_MASTER; default %(default)s); "
            "for a cluster, hand audit_export/spark_submit.py to spark-submit, which ships this "
            "package to the executors",
        )
        spark.add_argument(
            "--jdbc-jars",
            default=_env("AUDIT_EXPORT_JDBC_JARS", ",".join(DEFAULT_JDBC_JARS)),
            help="comma-separated JDBC driver jars (AUDIT_EXPORT_JDBC_JARS; default Debian's "
            "libpostgresql-jdbc-java and libxerial-sqlite-jdbc-java: %(default)s)",
        )
        spark.add_argument(
            "--driver-memory",
            default=_env("AUDIT_EXPORT_DRIVER_MEMORY", "1g"),
            help="Spark driver memory (AUDIT_EXPORT_DRIVER_MEMORY; default %(default)s)",
        )
        spark.add_argument(
            "--shuffle-partitions",
            type=int,
            default=_env("AUDIT_EXPORT_SHUFFLE_PARTITIONS", 4),
            help="spark.sql.shuffle.partitions (default %(default)s)",
        )
    return parser


def options_from_args(args: argparse.Namespace) -> ExportOptions:
    return ExportOptions(
        database_url=args.database_url,
        output=args.output,
        export_date=args.export_date,
        since_event_id=args.since_event_id,
        db_user=args.db_user,
        db_password=os.environ.get("AUDIT_EXPORT_DB_PASSWORD") or None,
        tuning=ReadTuning(
            max_partitions=args.partitions,
            event_rows_per_partition=args.event_rows_per_partition,
            fetch_size=args.fetch_size,
        ),
        grace_ms=args.grace_ms,
        unfilled_wait_ms=args.unfilled_wait_ms,
        findings=not args.no_findings,
        max_report_rows=args.max_report_rows,
        include_config_values=args.include_config_values,
        findings_mode=args.findings_mode,
        export_name=args.export_name,
    )


def describe(result: ExportResult, seconds: float) -> str:
    run, rng = result.run, result.event_range
    lines = [
        f"audit export {run.export_date} from {run.source} in {seconds:.1f} s",
        f"  events {rng.since_event_id + 1}..{rng.until_event_id}: {run.event_rows} exported "
        f"({rng.why}); watermark now {run.until_event_id}; progress recorded as "
        f"{result.export_name!r}",
        "  rows: " + ", ".join(f"{k} {v}" for k, v in sorted(run.table_rows.items())),
    ]
    if run.rechecked or run.unfilled:
        lines.append(
            f"  ids looked for again: {len(run.rechecked)}; missing from this run's snapshot "
            f"(looked for by the next date): {len(run.unfilled)}"
        )
    if result.summary is not None:
        s = result.summary
        lines.append(f"  findings: {result.findings_mode}")
        lines.append(
            f"  findings: {len(s['rebalances'])} rebalances listed, "
            f"{s['violation_count']} violation(s) {s['violations_by_kind'] or ''}".rstrip()
        )
        for v in s["violations"][:20]:
            lines.append(f"    {v['kind']} {v['group_id']} epoch {v['group_epoch']}: {v['detail']}")
        lines.append(f"  summary: {result.paths['summary']}")
        lines.append(f"  report:  {result.paths['report']}")
    return "\n".join(lines)


def _exit_code(args: argparse.Namespace, result: ExportResult) -> int:
    if args.fail_on_violations and result.summary and result.summary["violation_count"] > 0:
        return EXIT_VIOLATIONS
    return 0


def _check_export_name(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.export_name is not None and not 0 < len(args.export_name) <= EXPORT_NAME_LENGTH:
        parser.error(f"--export-name must be 1 to {EXPORT_NAME_LENGTH} characters")


def run_and_report(spark: SparkSession, args: argparse.Namespace, started: float) -> int:
    """One export with `spark`, reported on stdout; a refusal or an unrecorded progress on
    stderr, with its exit code."""
    try:
        result = run_export(spark, options_from_args(args))
    except WatermarkError as error:
        print(f"audit export refused: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except ProgressNotRecorded as error:
        print(f"audit export: {error}", file=sys.stderr)
        return EXIT_PROGRESS_NOT_RECORDED
    print(describe(result, time.monotonic() - started))
    return _exit_code(args, result)


def main(argv: Sequence[str] | None = None) -> int:
    """The console command: a local Spark session, one export, a short report on stdout."""
    parser = build_parser(local=True)
    args = parser.parse_args(argv)
    _check_export_name(parser, args)
    if not args.master.startswith("local"):
        parser.error(
            f"--master {args.master}: this command runs a local session only; on a cluster, "
            'run audit_export/spark_submit.py with spark-submit (README.md, "Audit export")'
        )
    from .session import local_session

    started = time.monotonic()
    spark = local_session(
        master=args.master,
        jars=[j for j in args.jdbc_jars.split(",") if j],
        driver_memory=args.driver_memory,
        shuffle_partitions=args.shuffle_partitions,
    )
    try:
        return run_and_report(spark, args, started)
    finally:
        spark.stop()


def main_submit(argv: Sequence[str] | None = None) -> int:
    """Under spark-submit: the session (master, jars, memory) is spark-submit's."""
    parser = build_parser(local=False)
    args = parser.parse_args(argv)
    _check_export_name(parser, args)
    from pyspark.sql import SparkSession

    from .session import APP_NAME

    started = time.monotonic()
    spark = SparkSession.builder.appName(APP_NAME).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        return run_and_report(spark, args, started)
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
