"""The export and its findings on a cluster. `spark-submit --master local-cluster[2,1,1024]`
runs the job with a driver and two executors, each in its own JVM, launched by a standalone
worker as on a real cluster. The executors read the PostgreSQL tables over JDBC with the driver
jar that `--jars` ships, and run the findings' Python fold. Their Python has no site-packages, so
the package reaches them only as `spark_submit.py` ships it. They also run in another time zone
than the driver, as a cluster's hosts may. The output must equal, table by table, that of the
same export in local mode (the test run's own session).

Spark's own records prove that the work ran in the executors:
- the event log lists executors 0 and 1, each with its own block manager;
- every task ran on one of them, none on the driver, including the JDBC reads of the events' id
  ranges, which together read every event, and the Python stages;
- each executor's log, in the standalone worker's directory, names its own process id and shows
  the PostgreSQL jar and the package fetched from the driver.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from audit_export import run_export
from audit_export.cli import build_parser, options_from_args
from audit_export.findings import FINDING_TABLES
from audit_export.snapshot import SCHEMA_FILE, SNAPSHOT_TABLES
from audit_export.spark_submit import PACKAGE_ZIP
from tests.audit import tables as T
from tests.audit.driver import Driver
from tests.support.client import put_connector
from tests.support.coordinator import REPO, InProcessCoordinator

GROUP = "on-a-cluster"
DAY = "2026-04-01"
MASTER = "local-cluster[2,1,1024]"
"""Two workers of one core and 1024 MiB each, one executor per worker."""
EXECUTOR_TZ = "America/New_York"
GRACE_MS = 1
"""So short that the resources of the worker that left, unassigned until the next target,
are violations (UNASSIGNED_TOO_LONG): the violations table has rows to compare."""
EVENT_PARTITIONS = 4
PG_JAR = "/usr/share/java/postgresql.jar"
TABLES = (*SNAPSHOT_TABLES, "events", *(f"findings/{name}" for name in FINDING_TABLES))
RUN_CLOCK = ("exported_at", "as_of_ms")
"""Fields of the summary and the watermark that are the run's wall clock, not its data."""


def _scenario(database_url: str) -> None:
    """A small history: two connectors, three workers joining, one leaving."""
    with InProcessCoordinator(database_url) as coordinator:
        d = Driver(coordinator.stubs, GROUP)
        assert put_connector(d.stubs, GROUP, "A", 3).error_code == 0
        assert put_connector(d.stubs, GROUP, "B", 1).error_code == 0
        everything = ["A", "A-0", "A-1", "A-2", "B", "B-0"]
        d.rebalance(d.join("W1"), "member joined", "W1", {"W1": everything})
        d.rebalance(
            d.join("W2"),
            "member joined",
            "W2",
            {"W1": ["A", "A-0", "A-1"], "W2": ["A-2", "B", "B-0"]},
        )
        d.rebalance(
            d.join("W3"),
            "member joined",
            "W3",
            {"W1": ["A", "A-0"], "W2": ["A-2", "B"], "W3": ["A-1", "B-0"]},
        )
        d.rebalance(
            d.leave("W2"),
            "member left",
            "W2",
            {"W1": ["A", "A-0", "A-2"], "W3": ["A-1", "B-0", "B"]},
        )


def _spark_home(tmp_path: Path) -> Path:
    """A SPARK_HOME of links to the pip-installed Spark: a standalone worker writes its
    executors' directories (their logs) under SPARK_HOME/work, here in the test's directory
    rather than in the virtualenv."""
    import pyspark

    home = tmp_path / "spark-home"
    home.mkdir()
    installed = Path(pyspark.__file__).parent
    for name in ("bin", "jars", "python", "sbin"):
        (home / name).symlink_to(installed / name)
    return home


def _bare_python(tmp_path: Path) -> Path:
    """The executors' Python: this interpreter without its site-packages, so neither the project
    nor anything installed beside it (PySpark comes from Spark's own `python/lib`, which Spark
    puts on its Python workers' path), as on a cluster's hosts."""
    script = tmp_path / "executor-python"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    script.chmod(0o755)
    return script


def _submit(tmp_path: Path, args: list[str]) -> tuple[subprocess.Popen[str], Path, Path]:
    """Start the cluster run; returns the process, the event log directory and SPARK_HOME."""
    venv_bin = Path(REPO) / ".venv" / "bin"
    home = _spark_home(tmp_path)
    events = tmp_path / "eventlog"
    events.mkdir()
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYSPARK_PYTHON": str(_bare_python(tmp_path)),
        "TZ": "UTC",
    }
    env.pop("PYTHONPATH", None)  # the driver finds the package beside spark_submit.py
    conf = {
        "spark.executor.memory": "768m",
        # The first job waits for both executors (at most 30 s), so that both read.
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        # Short-lived JVMs on two cores: C1 only (the C2 compiler costs them more CPU than it
        # saves; the run takes half the time); the executors in another time zone.
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        "spark.executor.extraJavaOptions": (
            f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Duser.timezone={EXECUTOR_TZ}"
        ),
        "spark.executorEnv.TZ": EXECUTOR_TZ,
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }
    command = [str(venv_bin / "spark-submit"), "--master", MASTER, "--driver-memory", "1g"]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    command += ["--jars", PG_JAR, str(Path(REPO) / "audit_export" / "spark_submit.py"), *args]
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, events, home


def _tables(out: Path) -> set[str]:
    """Every Parquet table a run wrote (a directory with its schema or `export_date=`
    partitions): those of TABLES, and any other (the findings' carried state)."""
    found = {f.parent for f in out.rglob(SCHEMA_FILE)}
    found |= {d.parent for d in out.rglob("export_date=*") if d.is_dir()}
    return {d.relative_to(out).as_posix() for d in found if d != out / "reports"}


def _rows(spark: SparkSession, out: Path, table: str) -> list[str]:
    """A table's rows (partition columns included) as sorted canonical JSON."""
    if (out / table / SCHEMA_FILE).exists():
        df = T.read(spark, out.as_uri(), table)
    else:
        df = spark.read.parquet((out / table).as_uri())
    return sorted(
        json.dumps(r.asDict(recursive=True), sort_keys=True, default=repr) for r in df.collect()
    )


def _json(path: Path) -> dict[str, Any]:
    """A JSON record of the run (summary, watermark) without its wall-clock fields."""
    record = json.loads(path.read_text())
    assert isinstance(record, dict) and record["exported_at"], record
    for key in RUN_CLOCK:
        record.pop(key, None)
    return record


def _summary(out: Path) -> dict[str, Any]:
    return _json(out / "reports" / f"export_date={DAY}" / "summary.json")


def _watermark(out: Path) -> dict[str, Any]:
    return _json(out / "_watermarks" / f"export_date={DAY}.json")


def _check_executors(events_dir: Path, spark_home: Path, driver_pid: int, n_events: int) -> None:
    """The run's tasks ran in two executors, each a JVM of its own, never in the driver."""
    (log,) = events_dir.iterdir()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    app_id = next(r["App ID"] for r in records if r["Event"] == "SparkListenerApplicationStart")
    executors = {
        r["Executor ID"]: r["Executor Info"]
        for r in records
        if r["Event"] == "SparkListenerExecutorAdded"
    }
    assert sorted(executors) == ["0", "1"], executors
    block_managers = {
        r["Block Manager ID"]["Executor ID"]: r["Block Manager ID"]["Port"]
        for r in records
        if r["Event"] == "SparkListenerBlockManagerAdded"
    }
    assert sorted(block_managers) == ["0", "1", "driver"], block_managers
    assert len(set(block_managers.values())) == 3, block_managers

    # Every task ran in an executor; both executors ran some.
    tasks = [r for r in records if r["Event"] == "SparkListenerTaskEnd"]
    assert Counter(t["Task Info"]["Executor ID"] for t in tasks).keys() == {"0", "1"}
    assert all(t["Task End Reason"]["Reason"] == "Success" for t in tasks)

    # Every table was read over JDBC by the executors; the events in EVENT_PARTITIONS id
    # ranges, which together read every event.
    jdbc_stages = {
        r["Stage Info"]["Stage ID"]
        for r in records
        if r["Event"] == "SparkListenerStageSubmitted"
        and any(rdd["Name"] == "JDBCRDD" for rdd in r["Stage Info"]["RDD Info"])
    }
    reads: dict[int, list[dict[str, Any]]] = {stage: [] for stage in jdbc_stages}
    for t in tasks:
        reads.get(t["Stage ID"], []).append(t)
    assert len(jdbc_stages) >= len(SNAPSHOT_TABLES) + 1, reads
    assert {t["Task Info"]["Executor ID"] for ts in reads.values() for t in ts} == {"0", "1"}
    (events_read,) = [ts for ts in reads.values() if len(ts) == EVENT_PARTITIONS]
    records_read = sum(t["Task Metrics"]["Input Metrics"]["Records Read"] for t in events_read)
    assert records_read == n_events, (records_read, n_events)

    # The incremental findings fold groups in Python on the executors, whose Python has only
    # what spark_submit.py ships (see `_bare_python`).
    python_stages = {
        r["Stage Info"]["Stage ID"]
        for r in records
        if r["Event"] == "SparkListenerStageSubmitted"
        and any(rdd["Name"] == "PythonRDD" for rdd in r["Stage Info"]["RDD Info"])
    }
    assert any(t["Stage ID"] in python_stages for t in tasks), "no Python ran on the executors"

    # Each executor's own log: its process (not the driver's), and the JDBC driver jar it
    # fetched from the driver because of --jars; run in the executors' time zone.
    pids = {}
    for executor in ("0", "1"):
        stderr = (spark_home / "work" / app_id / executor / "stderr").read_text()
        started = re.search(r"Started daemon with process name: (\d+)@", stderr)
        assert started, stderr[-3000:]
        pids[executor] = int(started.group(1))
        assert re.search(r"Fetching spark://\S+/jars/postgresql\.jar", stderr), stderr[-3000:]
        assert re.search(rf"Fetching spark://\S+/files/{PACKAGE_ZIP}", stderr), stderr[-3000:]
        assert f"-Duser.timezone={EXECUTOR_TZ}" in stderr, stderr[:3000]
    assert len(set(pids.values())) == 2 and driver_pid not in pids.values(), (pids, driver_pid)


@pytest.mark.timeout(300)
def test_local_cluster_export_equals_the_local_one(
    request: pytest.FixtureRequest, database_url: str, tmp_path: Path
) -> None:
    _scenario(database_url)
    db = T.Database(database_url)
    try:
        n_events = len(db.events())
        max_event_id = db.max_event_id()
    finally:
        db.close()
    assert n_events >= EVENT_PARTITIONS

    def argv(out: Path) -> list[str]:
        return [
            "--database-url",
            database_url,
            "--output",
            str(out),
            "--export-date",
            DAY,
            "--grace-ms",
            str(GRACE_MS),
            "--partitions",
            str(EVENT_PARTITIONS),
            "--event-rows-per-partition",
            str(max_event_id // EVENT_PARTITIONS),  # so exactly EVENT_PARTITIONS reads
        ]

    cluster_out, local_out = tmp_path / "cluster", tmp_path / "local"
    started = time.monotonic()
    proc, events_dir, spark_home = _submit(tmp_path, argv(cluster_out))
    try:
        # Meanwhile, the same export in local mode, as `main_submit` runs it.
        spark: SparkSession = request.getfixturevalue("spark")
        options = options_from_args(build_parser(local=False).parse_args(argv(local_out)))
        local = run_export(spark, options)
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    print(f"local-cluster run and local run: {time.monotonic() - started:.1f} s")
    assert proc.returncode == 0, stdout[-3000:] + stderr[-6000:]
    assert f"audit export {DAY} from " in stdout, stdout

    _check_executors(events_dir, spark_home, proc.pid, n_events)

    assert local.run.until_event_id == max_event_id and local.run.event_rows == n_events
    tables = _tables(cluster_out)
    assert tables == _tables(local_out) and tables >= set(TABLES), tables
    for table in sorted(tables):
        cluster_rows = _rows(spark, cluster_out, table)
        assert cluster_rows == _rows(spark, local_out, table), table
    for table in TABLES:
        schema = (cluster_out / table / SCHEMA_FILE).read_text()
        assert schema == (local_out / table / SCHEMA_FILE).read_text(), table
    assert len(_rows(spark, cluster_out, "events")) == n_events
    assert len(_rows(spark, cluster_out, "findings/rebalances")) >= 4
    summary = _summary(cluster_out)
    assert summary == _summary(local_out)
    assert summary["violation_count"] >= 1 and summary["lost_resources"]["count"] >= 1
    assert _watermark(cluster_out) == _watermark(local_out)
