"""Events that commit out of id order are not lost by the watermark.

Ids come from a sequence: a transaction of one group can take an id, stay open, and commit after
a transaction of another group has committed a higher id. The export that runs in between sees
the higher id but not the lower one; the watermark moves past it. The run records the missing
id and the next export date looks for it again: in the end every event is exported exactly
once, and re-running the older date gives the same output as its first run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession

from audit_export import ExportOptions, run_export
from audit_export.fs import OutputFS
from audit_export.watermark import RunRecord, load_runs
from coordinator_svc.store.migrate import upgrade_to_head
from tests.audit import tables as T
from tests.support.pgcluster import libpq_url

INSERT = """INSERT INTO events (occurred_at, at_ms, group_id, group_epoch, event_type, member_id,
                                payload)
            VALUES (now(), 1, %s, 1, 'GROUP_CREATED', NULL, %s::jsonb) RETURNING id"""


def _insert(conn: psycopg.Connection[Any], group: str) -> int:
    row = conn.execute(INSERT, (group, json.dumps({"note": group}))).fetchone()
    assert row is not None
    return int(row[0])


def _exported_ids(spark: SparkSession, out: Path, day: str) -> list[int]:
    df = T.read(spark, f"file://{out}", "events", day)
    return sorted(int(r["id"]) for r in df.select("id").collect())


@pytest.mark.timeout(240)
def test_an_event_committed_after_a_later_id_is_exported_by_the_next_date(
    spark: SparkSession, database_url: str, tmp_path: Path
) -> None:
    upgrade_to_head(database_url)
    out = tmp_path / "audit"

    def export(day: str, findings: bool = False) -> Any:
        return run_export(
            spark, ExportOptions(database_url, str(out), export_date=day, findings=findings)
        )

    with (
        psycopg.connect(libpq_url(database_url), autocommit=True) as fast,
        psycopg.connect(libpq_url(database_url)) as slow,
    ):
        before = [_insert(fast, "g-fast") for _ in range(3)]
        late = _insert(slow, "g-slow")  # taken, not committed
        after = [_insert(fast, "g-fast") for _ in range(2)]
        assert before[-1] < late < after[0]

        export("2026-04-01")
        assert _exported_ids(spark, out, "2026-04-01") == before + after
        # The JSON payload is stored plainly (no dictionary, no min/max), the other columns not.
        columns = _column_chunks(spark, next(out.glob("events/export_date=2026-04-01/*/*.parquet")))
        assert columns["payload"] == (False, False)
        assert columns["event_type"] == (True, True)
        (day1,) = load_runs_local(spark, out)
        assert day1.until_event_id == after[-1]
        assert [event_id for event_id, _ in day1.unfilled] == [late]

        slow.commit()
        newest = _insert(fast, "g-fast")

    result = export("2026-04-02", findings=True)
    assert _exported_ids(spark, out, "2026-04-02") == [late, newest]
    assert result.summary["watermark"]["rechecked_event_ids"] == [late]
    assert result.summary["watermark"]["unfilled_event_ids"] == []
    day1, day2 = load_runs_local(spark, out)
    assert day2.rechecked == (late,) and day2.unfilled == ()

    # Every event exactly once over both dates.
    everything = [*before, late, *after, newest]
    exported = _exported_ids(spark, out, "2026-04-01") + _exported_ids(spark, out, "2026-04-02")
    assert sorted(exported) == everything

    # The older date re-run: the same output and record as its first run (the late event stays
    # with the date that exported it).
    export("2026-04-01")
    assert _exported_ids(spark, out, "2026-04-01") == before + after
    again, _ = load_runs_local(spark, out)
    assert again.unfilled == day1.unfilled and again.until_event_id == day1.until_event_id


def _column_chunks(spark: SparkSession, file: Path) -> dict[str, tuple[bool, bool]]:
    """Per column of a Parquet file's first row group: (has a dictionary page, has min/max)."""
    jvm: Any = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    parquet = jvm.org.apache.parquet.hadoop
    reader = parquet.ParquetFileReader.open(
        parquet.util.HadoopInputFile.fromPath(jvm.org.apache.hadoop.fs.Path(str(file)), conf)
    )
    try:
        block = reader.getFooter().getBlocks().get(0)
        return {
            str(c.getPath().toDotString()): (
                bool(c.hasDictionaryPage()),
                bool(c.getStatistics().hasNonNullValue()),
            )
            for c in block.getColumns()
        }
    finally:
        reader.close()


def load_runs_local(spark: SparkSession, out: Path) -> list[RunRecord]:
    return load_runs(OutputFS(spark), f"file://{out}")
