"""One export run: snapshot, events, findings, report, watermark (in that order; the watermark
file is written last and is the run's commit point), then the run's progress appended to the
database for the coordinators' event retention (`watermark.ProgressRow`, DESIGN 3.20). A run
that may need events the retention pruned refuses before writing anything
(`watermark.check_not_pruned`).

Output layout under the output path (every table Parquet, partitioned by export date and group):

    <table>/export_date=YYYY-MM-DD/group_id=<group>/part-*.parquet
        groups, group_leases, members, catalogue, target_assignment, current_assignment,
        group_configs (the snapshot), events (this run's events)
    findings/<name>/export_date=YYYY-MM-DD/group_id=<group>/part-*.parquet
        rebalances, lost_resources, connector_moves, violations, ownership: what this run
        found or changed, and every row still open (`incremental`)
    _findings_state/export_date=YYYY-MM-DD/part-*.parquet
        what the next date's findings start from (`incremental`)
    reports/export_date=YYYY-MM-DD/summary.json and report.html
    _watermarks/export_date=YYYY-MM-DD.json

Connector configs carry secrets: the catalogue has each connector's config digest and its values
only with `include_config_values`; the events are written as stored, and a CONNECTOR_PUT's
payload has `config_changed` and the new `config_digest`, never values. A digest is an HMAC under
the database's key (migration 0005), which the export never reads (`source.WITHHELD`); events
and exports written before 0005 keep their unkeyed "sha256:" digests.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from . import findings as fnd
from . import incremental, report, report_data, snapshot, source
from .fs import OutputFS, join, qualify
from .summary import build_summary
from .watermark import (
    EventRange,
    RunRecord,
    check_not_pruned,
    default_export_name,
    load_runs,
    plan_range,
    progress_row,
    record_run,
    still_unfilled,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportOptions:
    """What to export, from where, to where.

    Attributes:
        database_url: the coordinator's database (SQLAlchemy or JDBC URL).
        output: the output directory (a local path or any Hadoop URI).
        export_date: the run's logical date, YYYY-MM-DD (default: today, UTC).
        since_event_id: export the events after this id, overriding the watermark.
        db_user: database user (overrides the URL's).
        db_password: database password (overrides the URL's).
        tuning: how tables are split into parallel JDBC reads.
        grace_ms: how long a catalogue resource may run nowhere before it is a violation.
        unfilled_wait_ms: how long an event id missing below the watermark is looked for
            again (see `watermark`).
        findings: compute the findings, the summary and the report.
        max_report_rows: rows per list in the JSON summary and the report (Parquet has all).
        include_config_values: write each connector's config values in the catalogue, besides
            its digest (off: connector configs carry secrets; only for an export stored as
            securely as the database).
        findings_mode: "incremental" (this date's events folded into the state the previous
            date carried; see `incremental`) or "whole-history" (every exported event
            recomputed in Spark: the reference computation, and the old cost).
        as_of_ms: "now" for what has not ended yet (default: the time of the run; a re-run of
            an older date uses its first run's).
        export_name: the name the run's progress is recorded under in the database, for the
            coordinators' event retention (default: the output location,
            `watermark.default_export_name`).
    """

    database_url: str
    output: str
    export_date: str | None = None
    since_event_id: int | None = None
    db_user: str | None = None
    db_password: str | None = None
    tuning: source.ReadTuning = field(default_factory=source.ReadTuning)
    grace_ms: int = 60_000
    unfilled_wait_ms: int = 3_600_000
    findings: bool = True
    max_report_rows: int = 500
    include_config_values: bool = False
    findings_mode: str = "incremental"
    as_of_ms: int | None = None
    export_name: str | None = None


@dataclass(frozen=True)
class ExportResult:
    """What a run did.

    Attributes:
        run: the committed run record (its range is the watermark).
        event_range: the events exported and why.
        summary: the JSON summary (None without findings).
        paths: where the summary and report were written.
        timings: seconds: `export` (the snapshot and the events read and written, from the
            start of the run), of which `snapshot` (the snapshot tables, from the start) and
            `events` (the events' job, which runs beside the snapshot); then `findings` and
            `report`.
        source_rows: rows read from the database per table.
        findings_mode: how the findings were computed (incremental, or whole history and why).
        findings_state_bytes: the size of the state carried to the next date.
        export_name: the name the run's progress was recorded under.
    """

    run: RunRecord
    event_range: EventRange
    summary: dict[str, Any] | None
    paths: dict[str, str]
    timings: dict[str, float]
    source_rows: dict[str, int]
    findings_mode: str = ""
    findings_state_bytes: int = 0
    export_name: str = ""


def _today() -> str:
    return datetime.now(UTC).date().isoformat()


def _validate_date(value: str) -> str:
    try:
        return date.fromisoformat(value).isoformat()
    except ValueError as exc:
        raise ValueError(f"export date {value!r} is not YYYY-MM-DD") from exc


def _events_schema() -> StructType:
    """The events as written: the table's columns (group_id a partition) and export_date."""
    schema = StructType.fromDDL(source.EVENTS.ddl() + ", export_date STRING")
    assert isinstance(schema, StructType)
    return schema


def _write_counted(
    fs: OutputFS, df: DataFrame, path: str, export_date: str, *, files: int = 0
) -> int:
    """Write `df` (see `snapshot.write_partitioned`) and return how many rows it wrote, counted
    by the write itself (an observed metric), not by a second pass over the data."""
    seen = Observation(path)
    snapshot.write_partitioned(
        fs, df.observe(seen, F.count(F.lit(1)).alias("rows")), path, export_date, files=files
    )
    return int(seen.get["rows"])


def run_export(spark: SparkSession, options: ExportOptions) -> ExportResult:
    """Run one export with `spark` (any session: local, or under spark-submit)."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    # Partitioned writes keep a file open per group instead of sorting every row by group.
    spark.conf.set("spark.sql.maxConcurrentOutputFileWriters", "64")
    export_date = _validate_date(options.export_date or _today())
    src = source.with_credentials(
        source.source_from_url(options.database_url), options.db_user, options.db_password
    )
    fs = OutputFS(spark)
    out = qualify(options.output)
    export_name = options.export_name or default_export_name(out)
    tuning = options.tuning
    timings: dict[str, float] = {}
    persisted: list[DataFrame] = []

    def hold(df: DataFrame) -> DataFrame:
        """Cache a result that several outputs read."""
        if df.is_cached:
            return df
        kept = df.persist(StorageLevel.MEMORY_AND_DISK)
        persisted.append(kept)
        return kept

    def keep(df: DataFrame) -> DataFrame:
        """Materialise an intermediate result and cut its lineage: later steps reuse it, and
        their plans stay small (planning a long lineage costs seconds per step)."""
        return df.localCheckpoint(eager=True)

    # A snapshot or findings table is written by this many tasks (so as many files per group and
    # export date at most); the events keep their read partitions.
    small_files = max(1, spark.sparkContext.defaultParallelism)
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="audit-export")
    try:
        began = time.monotonic()
        with source.pinned_snapshot(spark, src) as pinned:
            stats = pinned.stats
            # 1. Which events this run exports: up to the highest id in the snapshot, so the
            #    snapshot reflects at least every exported event.
            runs = load_runs(fs, out)
            event_range = plan_range(runs, export_date, stats.max_event_id, options.since_event_id)
            check_not_pruned(event_range, pinned.pruned_through_event_id())

            # 2. The events stream from parallel JDBC reads straight to Parquet, started first:
            #    they are most of the work, and the snapshot is written beside them.
            def write_events() -> int:
                started = time.monotonic()
                events = source.read_events(
                    spark,
                    src,
                    event_range.since_event_id,
                    event_range.until_event_id,
                    recheck=event_range.recheck,
                    exclude=event_range.exclude,
                    tuning=tuning,
                    session_init=pinned.session_init,
                )
                rows = _write_counted(fs, events, join(out, "events"), export_date)
                timings["events"] = time.monotonic() - started
                return rows

            events_job = pool.submit(write_events)

            # 3. The snapshot: every table read at the same instant (PostgreSQL), each streamed
            #    from JDBC to Parquet.
            tables = snapshot.read(
                spark,
                src,
                stats,
                tuning=tuning,
                session_init=pinned.session_init,
                include_config_values=options.include_config_values,
            )
            writes = {
                name: pool.submit(
                    _write_counted, fs, df, join(out, name), export_date, files=small_files
                )
                for name, df in tables.items()
            }
            table_rows = {name: job.result() for name, job in writes.items()}
            timings["snapshot"] = time.monotonic() - began
            table_rows["events"] = n_events = events_job.result()
            timings["export"] = time.monotonic() - began
            # 4. Ids of the range the snapshot lacks (transactions still open, or rolled back):
            #    looked for again by the next export date. Counted first: usually none.
            expected = (
                event_range.until_event_id
                - event_range.since_event_id
                - len(event_range.exclude)
                + len(event_range.recheck)
            )
            missing = (
                []
                if n_events == expected
                else pinned.missing_event_ids(
                    event_range.since_event_id,
                    event_range.until_event_id,
                    event_range.recheck,
                    event_range.exclude,
                )
            )
            # Pruning that reached into the range while it was read (only where the reads are
            # not pinned to one instant, SQLite) fails the run before it commits.
            check_not_pruned(event_range, pinned.pruned_through_event_id())
        source_rows = {**stats.rows, "events": n_events}

        summary: dict[str, Any] | None = None
        findings_mode = ""
        state_bytes = 0
        paths: dict[str, str] = {}
        now_ms = int(time.time() * 1000)
        as_of_ms = _as_of(options, runs, export_date, max(now_ms, stats.max_event_at_ms))
        unfilled = still_unfilled(event_range, missing, now_ms, options.unfilled_wait_ms)
        run = RunRecord(
            export_date=export_date,
            since_event_id=event_range.since_event_id,
            until_event_id=event_range.until_event_id,
            snapshot_after_event_id=stats.max_event_id,
            exported_at=datetime.now(UTC).isoformat(timespec="seconds"),
            event_rows=n_events,
            table_rows=table_rows,
            source=src.display,
            rechecked=event_range.recheck,
            unfilled=unfilled,
            as_of_ms=as_of_ms,
        )

        # 4. Findings: this date's events folded into the previous date's state (or, with
        #    `findings_mode="whole-history"`, recomputed in Spark from every exported event),
        #    and the report.
        if options.findings:
            started = time.monotonic()
            config = fnd.FindingsConfig(
                grace_ms=options.grace_ms,
                as_of_ms=as_of_ms,
                snapshot_after_event_id=stats.max_event_id,
            )
            exported = {
                name: snapshot.read_exported(spark, fs, join(out, name), export_date)
                for name in snapshot.SNAPSHOT_TABLES
            }

            def history() -> DataFrame:
                return _all_events(spark, fs, out, up_to=export_date)

            if options.findings_mode == "whole-history":
                found = fnd.compute(history(), exported, config, keep)
                finding_tables = {name: hold(df) for name, df in found.tables().items()}
                findings_mode = "whole history (recomputed in Spark)"
            else:
                previous = incremental.previous_state_date(
                    fs, out, export_date, [r.export_date for r in runs]
                )
                carried = (
                    spark.read.schema(incremental.schema("_state")).parquet(
                        incremental.state_path(out, previous)
                    )
                    if previous is not None
                    else None
                )
                new_events = snapshot.read_exported(spark, fs, join(out, "events"), export_date)
                folded = incremental.fold_findings(
                    spark, new_events, carried, history, config, exported, hold
                )
                finding_tables = folded.tables
                findings_mode = folded.mode
                timings["findings_fold"] = folded.fold_s
                folded.state.coalesce(small_files).write.mode("overwrite").parquet(
                    incremental.state_path(out, export_date)
                )
                state_bytes = fs.size(incremental.state_path(out, export_date))
                table_rows["findings/_state"] = folded.state.count()
            log.info("findings: %s", findings_mode)
            written = {
                name: pool.submit(
                    _write_counted,
                    fs,
                    df,
                    join(out, "findings", name),
                    export_date,
                    files=small_files,
                )
                for name, df in finding_tables.items()
            }
            table_rows.update({f"findings/{name}": job.result() for name, job in written.items()})
            timings["findings"] = time.monotonic() - started

            started = time.monotonic()
            summary = build_summary(
                run,
                event_range,
                config,
                exported,
                finding_tables,
                options.max_report_rows,
                include_config_values=options.include_config_values,
            )
            timelines = report_data.collect_timelines(finding_tables, config.as_of_ms)
            base = join(out, "reports", f"export_date={export_date}")
            paths = {"summary": join(base, "summary.json"), "report": join(base, "report.html")}
            fs.write_text(paths["summary"], report.to_json(summary))
            fs.write_text(paths["report"], report.render_html(summary, timelines))
            timings["report"] = time.monotonic() - started

        record_run(fs, out, run)
        progress = progress_row(run)
        source.record_progress(
            spark,
            src,
            export_name,
            progress.since_event_id,
            progress.until_event_id,
            progress.lowest_unfilled_id,
            datetime.now(UTC),
        )
        return ExportResult(
            run,
            event_range,
            summary,
            paths,
            timings,
            source_rows,
            findings_mode,
            state_bytes,
            export_name,
        )
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for df in persisted:
            df.unpersist()


def _all_events(spark: SparkSession, fs: OutputFS, out: str, *, up_to: str) -> DataFrame:
    """Every event exported by the export dates up to `up_to`, once each."""
    path = join(out, "events")
    schema = _events_schema()
    if not fs.exists(path):
        return spark.createDataFrame([], schema)
    df = spark.read.schema(schema).parquet(path).filter(F.col("export_date") <= up_to)
    return df.dropDuplicates(["id"])


def _as_of(options: ExportOptions, runs: list[RunRecord], export_date: str, now_ms: int) -> int:
    """ "Now" for what has not ended yet: `options.as_of_ms` if given; for a re-run of an older
    export date, what its first run used (so it repeats exactly); else `now_ms`."""
    if options.as_of_ms is not None:
        return options.as_of_ms
    same = next((r for r in runs if r.export_date == export_date), None)
    later = any(r.export_date > export_date for r in runs)
    if same is not None and later and same.as_of_ms is not None:
        return same.as_of_ms
    return now_ms
