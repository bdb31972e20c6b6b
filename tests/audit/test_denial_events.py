"""Issue 12: the authorizer's aggregated AUTHORIZATION_DENIED rows reach the audit export, and
the findings and the report run over a history that has them (group_epoch -1, a group that may
not exist, no member). Issue 23: rows per principal and operation (`User:ANONYMOUS` included),
cluster-level rows (cluster denials, ACL_ADDED, ACL_CHANGED) with group id "", which the export
keeps and the findings leave alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from pyspark.sql import SparkSession

from audit_export import ExportOptions, run_export
from coordinator_svc.core.acls import CLUSTER_NAME, AclEntry, Operation, ResourceType
from coordinator_svc.metrics import Metrics
from coordinator_svc.runtime.authorizer import Authorizer
from coordinator_svc.store import SqlStore
from coordinator_svc.store.acl_store import AclCaller
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
        authorizer.denied(
            "ListGroups", "User:CN=mallory", Operation.DESCRIBE, CLUSTER_NAME, ResourceType.CLUSTER
        )
        authorizer.denied("PutConnector", "User:ANONYMOUS", Operation.ALTER, "payments")
        assert authorizer.flush_denials() == 3
        entry = AclEntry("User:CN=ops", Operation.ALTER, ResourceType.GROUP, "payments")
        assert store.acls.add(entry, AclCaller("User:CN=admin", "ipv4:127.0.0.1:1", "AddAcl"))
        with sa.create_engine(database_url).begin() as conn:
            conn.execute(sa.text("UPDATE acls SET permission = 'DENY'"))
        assert store.acls.audit_direct_changes()
    finally:
        store.close()

    out = tmp_path / "audit"
    result = run_export(
        spark, ExportOptions(database_url, str(out), export_date="2026-11-24", findings=True)
    )
    assert result is not None
    events = T.read(spark, f"file://{out}", "events", "2026-11-24")
    rows = [r.asDict() for r in events.collect()]
    # Group id "" is an empty partition value: Spark writes it as
    # group_id=__HIVE_DEFAULT_PARTITION__ and reads it back as null (README, "ACLs").
    for r in rows:
        r["group_id"] = "" if r["group_id"] is None else r["group_id"]
    denied = [r for r in rows if r["event_type"] == "AUTHORIZATION_DENIED"]
    assert sorted(r["group_id"] for r in denied) == ["", "payments", "payments"]
    mallory = [r for r in denied if "User:CN=mallory" in r["payload"]]
    payments = next(r for r in mallory if r["group_id"] == "payments")
    assert '"count": 5' in payments["payload"] or '"count":5' in payments["payload"]
    assert sum("ANONYMOUS" in str(r["payload"]) for r in denied) == 1
    acl = sorted(
        (r["event_type"], r["group_id"]) for r in rows if r["event_type"].startswith("ACL_")
    )
    assert acl == [("ACL_ADDED", ""), ("ACL_CHANGED", "")]
    # No finding about the cluster-level rows (the findings read group events only).
    assert not any("__HIVE_DEFAULT_PARTITION__" in str(p) for p in (out / "findings").rglob("*"))
    assert (out / "report.html").exists() or any(out.rglob("report.html"))
