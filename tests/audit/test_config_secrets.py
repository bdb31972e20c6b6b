"""Connector configs are secrets (issue 16): the audit export writes each config's digest, never
its values, unless `--include-config-values` asks for them; a config change shows as two
different digests, in the daily catalogue snapshots and in the CONNECTOR_PUT events. Status
traces may carry secrets too (issue 28): a worker's FAILED report with a secret in its trace is
exported as the status row with the keyed digest the coordinator stored beside the trace (the
one its STATUS_CHANGED event carries), with or without config values, and the export never
reads the trace: its queries do not name the column, and the day 2 exports run with it renamed.

One coordinator per database (PostgreSQL and the embedded SQLite file, both read over JDBC by the
test run's Spark session): A is put with a secret, exported on day 1; A's secret is changed
(same task count: no rebalance), a worker given A and A-0 reports A RUNNING and A-0 FAILED with
a trace holding another secret, exported on day 2; then day 2 again into another directory with
the values included (both day 2 exports with `resource_statuses.trace` renamed away, so that any
statement naming it fails). Every file under each output directory (Parquet, schemas,
summary.json, report.html, watermarks) is searched for the secrets: as written (Spark's snappy
leaves a single random string intact, which the values export proves), and the Parquet tables
read back."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import reduce
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from connect.group.v1 import admin_pb2, common_pb2, coordinator_pb2
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from audit_export import ExportOptions, cli, run_export, snapshot, snapshot_sql, source
from audit_export.snapshot import SCHEMA_FILE
from connect_protocol.configs import config_digest
from coordinator_svc.core.status import trace_digest
from coordinator_svc.store import schema
from tests.audit import tables as T
from tests.support.client import ScriptedWorker, parse
from tests.support.coordinator import InProcessCoordinator

GROUP = "secrets"
DAY1, DAY2 = "2026-04-01", "2026-04-02"


def put(stubs: Any, config: dict[str, str]) -> None:
    resp = stubs.admin.PutConnector(
        admin_pb2.PutConnectorRequest(group_id=GROUP, connector="A", task_count=1, config=config),
        timeout=10,
    )
    assert resp.error_code == 0, resp


def report_failure(stubs: Any, trace: str) -> None:
    """A worker w1 given A and A-0 (it computes the assignment itself) reports A RUNNING and
    A-0 FAILED with `trace`, each under its grant's fencing token."""
    worker = ScriptedWorker(stubs, GROUP, "w1")
    worker.join()
    worker.heartbeat()
    prepared = worker.prepare()
    assert prepared.error_code == 0, prepared.error_message
    installed = worker.install(prepared.group_epoch, {"w1": parse("A", "A-0")})
    assert installed.error_code == 0, installed.error_message
    for _ in range(3):
        worker.heartbeat()
    owned = worker.owned
    assert owned == parse("A", "A-0")
    worker.owned = (frozenset(), frozenset())  # answered with the whole assignment again
    grants = worker.heartbeat().assignment.fencing_tokens
    worker.owned = owned
    tokens = {(t.connector, t.task if t.HasField("task") else -1): t.token for t in grants}
    failed = coordinator_pb2.StatusEntry(
        connector="A", task=0, fencing_token=tokens["A", 0], state=common_pb2.FAILED, trace=trace
    )
    running = coordinator_pb2.StatusEntry(
        connector="A", fencing_token=tokens["A", -1], state=common_pb2.RUNNING
    )
    answer = stubs.coordinator.ConnectGroupReportStatus(
        coordinator_pb2.ConnectGroupReportStatusRequest(
            group_id=GROUP,
            member_id=worker.member_id,
            member_epoch=worker.epoch,
            entries=[running, failed],
        ),
        timeout=10,
    )
    assert answer.error_code == 0, answer.error_message
    assert [r.error_code for r in answer.results] == [0, 0], answer


def files_with(root: Path, secret: str) -> list[str]:
    """The files under `root` whose bytes contain `secret` (UTF-8)."""
    needle = secret.encode()
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and needle in p.read_bytes()
    )


TRACE_AWAY = "trace_renamed_by_the_test"


@contextmanager
def trace_column_renamed(url: str) -> Iterator[None]:
    """`resource_statuses.trace` renamed (back when the block ends): while the block runs, any
    statement that names the column fails instead of reading the traces."""
    db = T.Database(url)

    def rename(old: str, new: str) -> None:
        db.execute(sa.text(f"ALTER TABLE resource_statuses RENAME COLUMN {old} TO {new}"))

    try:
        rename("trace", TRACE_AWAY)
        with pytest.raises(sa.exc.DBAPIError), db.engine.connect() as conn:
            conn.execute(sa.text("SELECT trace FROM resource_statuses"))  # the trap is set
        try:
            yield
        finally:
            rename(TRACE_AWAY, "trace")
    finally:
        db.close()


def tables_with(spark: SparkSession, root: Path, *secrets: str) -> list[str]:
    """The Parquet tables under `root` (each has a schema file) with a row whose JSON contains
    any of `secrets`: the decoded values, whatever the compression."""
    found = []
    for schema_file in sorted(root.rglob(SCHEMA_FILE)):
        table = str(schema_file.parent.relative_to(root))
        df = T.read(spark, f"file://{root}", table)
        row = F.to_json(F.struct(*df.columns))
        hit = reduce(lambda a, b: a | b, [row.contains(s) for s in secrets])
        if df.filter(hit).limit(1).count():
            found.append(table)
    return found


def catalogue_row(spark: SparkSession, out: Path, day: str) -> dict[str, Any]:
    rows = (
        T.read(spark, f"file://{out}", "catalogue", day)
        .filter("resource_type = 'connector'")
        .collect()
    )
    assert len(rows) == 1
    return rows[0].asDict(recursive=True)


@pytest.fixture(params=["postgresql", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return str(request.getfixturevalue("database_url"))
    return f"sqlite:///{tmp_path / 'coordinator.db'}"


@pytest.mark.timeout(240)
def test_the_export_writes_config_digests_and_values_only_when_asked(
    spark: SparkSession, url: str, tmp_path: Path
) -> None:
    secret1, secret2 = f"s3cr3t-{uuid.uuid4().hex}", f"s3cr3t-{uuid.uuid4().hex}"
    traced = f"tr4ce-{uuid.uuid4().hex}"
    trace = f"org.postgresql.util.PSQLException: connect to postgresql://app:{traced}@db failed"
    config1 = {"db.password": secret1, "topic": "orders"}
    config2 = {"db.password": secret2, "topic": "orders"}
    out, with_values = tmp_path / "audit", tmp_path / "audit-with-values"

    # The findings, summary and report read the Parquet written, whatever the database: they
    # are searched once, after the PostgreSQL export of day 2 (each run of them costs seconds).
    findings = url.startswith("postgresql")

    with InProcessCoordinator(url) as coordinator:
        db = T.Database(url)
        key = db.digest_key()  # the database's digest key (migration 0005)
        db.close()
        digests = config_digest(config1, key), config_digest(config2, key)
        assert config_digest(config1) not in digests  # keyed, not the plain sha256
        put(coordinator.stubs, config1)
        run_export(spark, ExportOptions(url, str(out), export_date=DAY1, findings=False))
        put(coordinator.stubs, config2)
        report_failure(coordinator.stubs, trace)
    # Day 2 has the trace stored; the exports run without a column of that name to read.
    with trace_column_renamed(url):
        result = run_export(
            spark, ExportOptions(url, str(out), export_date=DAY2, findings=findings)
        )
        run_export(
            spark,
            ExportOptions(
                url, str(with_values), export_date=DAY2, include_config_values=True, findings=False
            ),
        )

    # By default no secret anywhere: not in the Parquet files, the schemas, the summary, the
    # report or the watermarks, neither as written nor as the tables read back.
    for secret in (secret1, secret2, key.hex(), traced):
        assert files_with(out, secret) == []
    assert tables_with(spark, out, secret1, secret2, key.hex(), traced) == []
    assert not (out / "coordinator_secrets").exists()  # the key is never exported
    if findings:
        assert result.summary is not None and result.summary["connector_configs"] == "digests"
        report = (out / "reports" / f"export_date={DAY2}" / "report.html").read_text()
        assert "digests only" in report
        assert result.summary["status_traces"] == "digests"
        assert result.summary["resource_statuses"] == {"FAILED": 1, "RUNNING": 1}
        assert "FAILED 1, RUNNING 1" in report
        searched = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
        assert {f"reports/export_date={DAY2}/{n}" for n in ("summary.json", "report.html")} <= (
            searched
        )

    # The change shows: each day's catalogue has that day's digest (the coordinator's
    # `config_digest` of the config), and no values.
    day1, day2 = catalogue_row(spark, out, DAY1), catalogue_row(spark, out, DAY2)
    assert (day1["config_digest"], day2["config_digest"]) == digests
    assert digests[0] != digests[1]
    assert day1["config"] is None and day2["config"] is None
    task = T.read(spark, f"file://{out}", "catalogue", DAY2).filter("resource = 'A-0'").collect()
    assert [(r["config_digest"], r["config"]) for r in task] == [(None, None)]
    # ... and so do the events: one CONNECTOR_PUT a day, with the new config's digest.
    puts = [
        json.loads(r["payload"])
        for r in T.read(spark, f"file://{out}", "events")
        .filter("event_type = 'CONNECTOR_PUT'")
        .orderBy("id")
        .collect()
    ]
    assert [(p["config_digest"], p["config_changed"]) for p in puts] == [
        (digests[0], True),
        (digests[1], True),
    ]

    # The statuses as stored, each trace as the keyed digest stored with it (none for A's: it
    # has no trace), the STATUS_CHANGED event's own; no text anywhere.
    db = T.Database(url)
    try:
        statuses = db.resource_statuses()
        [stored] = [r["trace"] for r in db.rows(schema.resource_statuses) if r["task"] == 0]
    finally:
        db.close()
    assert stored == trace  # there was a trace to leak
    exported = T.exported_derived(spark, f"file://{out}", "resource_statuses", DAY2)
    assert exported == statuses
    assert [(r[1], r[5]) for r in exported] == [("A", "RUNNING"), ("A-0", "FAILED")]
    # The coordinator's HMAC of the trace under the database's key, not the plain sha256 that
    # anyone guessing the trace could compute: that is in no output byte, nor is the key.
    assert exported[0][10] is None
    assert exported[1][10] == trace_digest(trace, key) != trace_digest(trace, None)
    plain = hashlib.sha256(trace.encode()).hexdigest()
    assert files_with(out, plain) == [] and files_with(with_values, plain) == []
    assert "trace" not in T.read(spark, f"file://{out}", "resource_statuses").columns
    [changed] = [
        json.loads(r["payload"])
        for r in T.read(spark, f"file://{out}", "events", DAY2)
        .filter("event_type = 'STATUS_CHANGED'")
        .collect()
    ]
    [failed] = [c for c in changed["changes"] if c.get("task") == 0]
    assert failed["state"] == "FAILED" and failed["trace_digest"] == exported[1][10]

    # With the values asked for: the day's secret is in the catalogue (and only there; the
    # previous config is nowhere: the snapshot is of the current state, the events never
    # carry values), beside the same digest.
    assert files_with(with_values, secret2) and all(
        f.startswith("catalogue/") for f in files_with(with_values, secret2)
    )
    assert files_with(with_values, secret1) == []
    assert files_with(with_values, traced) == []  # traces never, whatever is asked
    row = catalogue_row(spark, with_values, DAY2)
    assert row["config"] == config2 and row["config_digest"] == digests[1]


def test_no_query_of_the_export_names_the_trace_column() -> None:
    """Traces are never read, not even into Spark's memory: the statuses' query, whole and as
    the parallel reads limit it, takes the stored `trace_digest` and names no `trace` column,
    in either dialect; nor does any other derived table's query, and the stored table is never
    read as it is (only counted)."""
    named = re.compile(r"\btrace\b", re.IGNORECASE)
    assert "trace" in source.RESOURCE_STATUSES.column_names()  # stored: there is one to name
    dialects: tuple[snapshot_sql.Dialect, ...] = ("postgresql", "sqlite")
    for dialect in dialects:
        statuses = snapshot_sql.RESOURCE_STATUSES.sql(dialect)
        assert "s.trace_digest" in statuses, statuses
        for table in (*snapshot_sql.derived_tables(), *snapshot_sql.derived_tables(True)):
            for where in (None, "{key} = 'A-0'"):
                sql = table.sql(dialect, where)
                assert not named.search(sql), (table.name, dialect, sql)
    assert source.RESOURCE_STATUSES not in snapshot.RAW_TABLES
    for spec in (*snapshot.RAW_TABLES, source.EVENTS):
        assert "trace" not in spec.column_names(), spec.name
    assert "trace" not in snapshot.exported_columns(include_config_values=True)["resource_statuses"]


def test_the_command_line_asks_for_config_values_explicitly() -> None:
    base = ["--output", "/tmp/x", "--database-url", "sqlite:////tmp/c.db"]
    for local in (True, False):
        parser = cli.build_parser(local=local)
        assert not cli.options_from_args(parser.parse_args(base)).include_config_values
        assert cli.options_from_args(
            parser.parse_args([*base, "--include-config-values"])
        ).include_config_values
    help_text = " ".join(cli.build_parser().format_help().split())
    assert "--include-config-values" in help_text
    assert "as securely as the database" in help_text
