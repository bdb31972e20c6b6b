"""Issue 12: the authorizer's aggregated AUTHORIZATION_DENIED rows reach the audit export, and
the findings and the report run over a history that has them (group_epoch -1, a group that may
not exist, no member)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from audit_export import ExportOptions, run_export
from coordinator_svc.core.acls import Operation
from coordinator_svc.metrics import Metrics
from coordinator_svc.runtime.authorizer import Authorizer
from coordinator_svc.store import SqlStore
from tests.audit import tables as T


@pytest.mark.timeout(240)
def test_denial_events_are_exported_and_the_findings_run_over_them(
    spark: SparkSession, database_url: str, tmp_path: Path
) -> None:
    store = SqlStore(database_url, owner_id="denials", advertised_address="-")
    store.migrate()
    try:
        authorizer = Authorizer(store.acls, Metrics(), enabled=True, wall_ms=lambda: 1_000)
        for _ in range(5):
            authorizer.denied("PutConnector", "User:CN=mallory", Operation.ALTER, "payments")
        authorizer.denied("ListGroups", "User:CN=mallory", Operation.DESCRIBE, "cluster")
        authorizer.denied("PutConnector", "User:ANONYMOUS", Operation.ALTER, "payments")
        assert authorizer.flush_denials() == 2
    finally:
        store.close()

    out = tmp_path / "audit"
    result = run_export(
        spark, ExportOptions(database_url, str(out), export_date="2026-11-24", findings=True)
    )
    assert result is not None
    events = T.read(spark, f"file://{out}", "events", "2026-11-24")
    rows = [r.asDict() for r in events.collect()]
    denied = [r for r in rows if r["event_type"] == "AUTHORIZATION_DENIED"]
    assert sorted(r["group_id"] for r in denied) == ["cluster", "payments"]
    payments = next(r for r in denied if r["group_id"] == "payments")
    assert '"count": 5' in payments["payload"] or '"count":5' in payments["payload"]
    assert "User:CN=mallory" in payments["payload"]
    assert not any("ANONYMOUS" in str(r["payload"]) for r in denied)
    assert (out / "report.html").exists() or any(out.rglob("report.html"))
