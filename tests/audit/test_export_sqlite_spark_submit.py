"""The same export from the embedded SQLite default, run the way a cluster runs it: `spark-submit`
with the job's script file (its own JVM and Spark session), then checked row by row against the
SQLite file with the test run's session."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from pyspark.sql import SparkSession

from audit_export.source import DEFAULT_JDBC_JARS
from tests.audit import tables as T
from tests.audit.driver import Driver
from tests.support.client import put_connector
from tests.support.coordinator import REPO, InProcessCoordinator

GROUP = "embedded"
DAY = "2026-03-01"


def test_spark_submit_exports_the_embedded_sqlite_database(
    spark: SparkSession, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'coordinator.db'}"
    with InProcessCoordinator(url) as coordinator:
        d = Driver(coordinator.stubs, GROUP)
        assert put_connector(d.stubs, GROUP, "A", 2).error_code == 0
        first = d.rebalance(d.join("W1"), "member joined", "W1", {"W1": ["A", "A-0", "A-1"]})
        second = d.rebalance(
            d.join("W2"), "member joined", "W2", {"W1": ["A", "A-0"], "W2": ["A-1"]}
        )

    out = tmp_path / "out"
    venv_bin = Path(REPO) / ".venv" / "bin"
    python = os.environ.get("PYSPARK_PYTHON", str(venv_bin / "python"))
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": python,
    }
    proc = subprocess.run(
        [
            str(venv_bin / "spark-submit"),
            "--master",
            "local[2]",
            "--driver-memory",
            "1g",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.ui.showConsoleProgress=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "--jars",
            ",".join(DEFAULT_JDBC_JARS),
            str(Path(REPO) / "audit_export" / "spark_submit.py"),
            "--database-url",
            url,
            "--output",
            str(out),
            "--export-date",
            DAY,
            "--grace-ms",
            "10000",
            "--fail-on-violations",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert f"audit export {DAY} from {url}" in proc.stdout
    assert "0 violation(s)" in proc.stdout

    db = T.Database(url)
    try:
        uri = f"file://{out}"
        for name in T.RAW_TABLES:
            assert T.exported_raw(spark, uri, name, DAY) == db.raw(name), name
        assert T.exported_derived(spark, uri, "catalogue", DAY) == db.catalogue()
        assert T.exported_derived(spark, uri, "target_assignment", DAY) == db.target_assignment()
        assert T.exported_derived(spark, uri, "current_assignment", DAY) == db.current_assignment()
        assert T.exported_events(spark, uri, DAY) == db.events()

        rebalances = {
            r["group_epoch"]: r.asDict(recursive=True)
            for r in T.read(spark, uri, "findings/rebalances", DAY).collect()
        }
        for expected in (first, second):
            found = rebalances[expected.epoch]
            assert found["status"] == "converged"
            assert set(found["moved"]) == expected.moved
            assert set(found["revoked"]) == expected.revoked
            assert expected.t_before_ms <= found["bumped_at_ms"]
            assert found["converged_at_ms"] <= expected.t_after_ms
        assert set(rebalances[second.epoch]["moved"]) == {"A-1"}
        summary = json.loads((out / "reports" / f"export_date={DAY}" / "summary.json").read_text())
        assert summary["violation_count"] == 0
        assert summary["watermark"]["until_event_id"] == db.max_event_id()
    finally:
        db.close()
