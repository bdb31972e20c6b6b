"""The derived snapshot tables as the database computes them (`audit_export.snapshot_sql`), on
both dialects, against the test oracle (`tables.Database`, plain Python over the stored rows), for
the awkward shapes a coordinator can store: empty and partial resource sets, JSON null, a
connector without tasks, a target share of a member that is gone, a resource held by nobody in
the target, two groups with the same resource names, names that are not ASCII. Then the pinned
snapshot: reads through Spark see the database as it was when it was pinned."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pyspark.sql import SparkSession

from audit_export import snapshot, snapshot_sql, source
from connect_protocol.configs import config_digest
from connect_protocol.resources import ResourceSet
from coordinator_svc.core.status import trace_digest
from coordinator_svc.store import schema, stored_sets
from coordinator_svc.store.migrate import normalize_url, upgrade_to_head
from tests.audit import tables as T

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BIG = ResourceSet.of(["R"], [("R", n) for n in range(300) if n != 150] + [("S", 0)])
BIG_COLUMN = stored_sets.resources_column(BIG)
BIG_PENDING = ResourceSet.of([], [("P", n) for n in range(400)])


def _set(connectors: list[str] | None = None, tasks: list[tuple[str, int]] | None = None) -> Any:
    out: dict[str, Any] = {}
    if connectors is not None:
        out["connectors"] = connectors
    if tasks is not None:
        out["tasks"] = [{"connector": c, "task": t} for c, t in tasks]
    return out


def _group(group_id: str, epoch: int) -> dict[str, Any]:
    return {
        "group_id": group_id,
        "group_type": "connect",
        "group_epoch": epoch,
        "created_at_ms": 1,
        "assignor_member_id": None,
        "compute_requested_epoch": None,
        "excluded_assignors": [],
        "compute_not_before_ms": None,
        "last_assignment_error": 0,
        "last_assignment_error_message": "",
        "prepared": None,
        "holds": [],
    }


def _member(
    group_id: str, member_id: str, assigned: Any, pending: Any, **kw: Any
) -> dict[str, Any]:
    return {
        "group_id": group_id,
        "member_id": member_id,
        "instance_id": kw.get("instance_id"),
        "url": kw.get("url", f"http://{member_id}:8083"),
        "member_epoch": kw.get("epoch", 5),
        "previous_epoch": kw.get("epoch", 5) - 1,
        "state": kw.get("state", "STABLE"),
        "rebalance_timeout_ms": 60_000,
        "assignors": [{"name": "incremental_cooperative"}],
        "assigned": assigned,
        "pending_revocation": pending,
    }


def _connector(
    group_id: str, name: str, tasks: int, config: dict[str, str], key: bytes | None
) -> dict[str, Any]:
    """A connector row with its config's digest under `key` (None: unkeyed, as rows written
    before migration 0005 have it)."""
    return {
        "group_id": group_id,
        "name": name,
        "task_count": tasks,
        "config": config,
        "config_digest": config_digest(config, key),
    }


TRACE = "java.sql.SQLException: é\n\tat Conn(password=hunter2)\n"


def _status(
    group_id: str,
    connector: str,
    task: int,
    state: str,
    member_id: str,
    token: int,
    trace: str = "",
    restart_count: int = 0,
    key: bytes | None = None,
) -> dict[str, Any]:
    """A status row as the coordinator writes it: with a trace, its digest under `key` beside it
    (the database's key, as the coordinator's; None: unkeyed). The export copies the digest: it
    cannot compute a keyed one, as it never reads the key (nor the trace)."""
    return {
        "group_id": group_id,
        "connector": connector,
        "task": task,
        "state": state,
        "member_id": member_id,
        "fencing_token": token,
        "restart_count": restart_count,
        "trace": trace,
        "trace_digest": trace_digest(trace, key) if trace else "",
        "reported_at_ms": 1_000 + token,
    }


def fill(url: str) -> None:
    """Two groups whose rows cover the awkward cases."""
    db = T.Database(url)
    key = db.digest_key()
    db.close()
    engine = sa.create_engine(normalize_url(url))
    t = schema.Base.metadata.tables
    with engine.begin() as conn:
        conn.execute(
            sa.insert(t["groups"]),
            [_group("g1", 7), _group("g2", 3), _group("g3", 1), _group("g4", 2)],
        )
        conn.execute(
            sa.insert(t["connectors"]),
            [
                _connector("g1", "A", 2, {"k": "v"}, key),
                _connector("g1", "Zéro", 0, {}, key),
                # unkeyed (written before migration 0005 and not re-keyed: a restored row)
                _connector("g1", "B", 1, {"topic": "t-é", 'pass"word': "a\\b\n"}, None),
                # stored without a digest (by a coordinator older than the column)
                {**_connector("g2", "A", 1, {"k": "other"}, key), "config_digest": ""},
            ],
        )
        conn.execute(
            sa.insert(t["members"]),
            [
                # owns a connector and a task, must still give up another task
                _member("g1", "w1", _set(["A"], [("A", 0)]), _set([], [("B", 0)])),
                # a set without its tasks key, and JSON null for the pending set
                _member("g1", "w2", _set(["B", "Zéro"]), None, instance_id="i-2", url="http://wé"),
                # owns nothing
                _member("g1", "w3", _set([], []), _set(), state="UNREVOKED"),
                # same resource names in another group
                _member("g2", "w1", _set(["A"], [("A", 0)]), _set([], [])),
                # a group without a target assignment
                _member("g3", "solo", _set([], [("X", 3)]), _set([], [])),
                # large sets, stored as task ranges (R with a gap: two runs)
                _member("g4", "big", BIG_COLUMN, stored_sets.resources_column(BIG_PENDING)),
            ],
        )
        conn.execute(
            sa.insert(t["target_assignments"]),
            [
                {
                    "group_id": "g1",
                    "assignment_epoch": 6,
                    "assignor_state": b"\x00",
                    "scheduled_rebalance_at_ms": 99,
                    "lost_work_rebalance_at_ms": 98,
                    "next_wave_at_ms": 97,
                },
                {
                    "group_id": "g4",
                    "assignment_epoch": 2,
                    "assignor_state": b"",
                    "scheduled_rebalance_at_ms": None,
                    "lost_work_rebalance_at_ms": None,
                    "next_wave_at_ms": None,
                },
                {
                    "group_id": "g2",
                    "assignment_epoch": 3,
                    "assignor_state": b"",
                    "scheduled_rebalance_at_ms": None,
                    "lost_work_rebalance_at_ms": None,
                    "next_wave_at_ms": None,
                },
            ],
        )
        conn.execute(
            sa.insert(t["target_assignment_members"]),
            [
                {
                    "group_id": "g1",
                    "member_id": "w1",
                    "resources": _set(["A"], [("A", 0)]),
                    "version": 2,
                    "metadata": b"",
                },
                # B-0 goes to w2 in the target; w2's share has no connectors key
                {
                    "group_id": "g1",
                    "member_id": "w2",
                    "resources": _set(None, [("B", 0)]),
                    "version": 2,
                    "metadata": b"",
                },
                # a share of a member that has left
                {
                    "group_id": "g1",
                    "member_id": "gone",
                    "resources": _set(["B"], [("A", 1)]),
                    "version": 1,
                    "metadata": b"",
                },
                {
                    "group_id": "g2",
                    "member_id": "w1",
                    "resources": _set(["A"], [("A", 0)]),
                    "version": 2,
                    "metadata": b"",
                },
                {
                    "group_id": "g4",
                    "member_id": "big",
                    "resources": BIG_COLUMN,
                    "version": 2,
                    "metadata": b"",
                },
            ],
        )
        conn.execute(
            sa.insert(t["resource_statuses"]),
            [
                # a connector (stored as task -1), running, no trace
                _status("g1", "A", -1, "RUNNING", "w1", 11),
                # a task that failed, its trace not ASCII and over several lines
                _status("g1", "A", 0, "FAILED", "w1", 12, trace=TRACE, key=key),
                # the same names in another group; a restart requested (nobody reported it)
                _status("g2", "A", 0, "RESTARTING", "", 0, restart_count=2),
                _status("g1", "Zéro", 7, "PAUSED", "w2", 13),
            ],
        )
    engine.dispose()


@pytest.fixture(params=["postgresql", "sqlite"])
def filled(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgresql":
        url = request.getfixturevalue("database_url")
    else:
        url = f"sqlite:///{tmp_path / 'coordinator.db'}"
    upgrade_to_head(url)
    fill(url)
    yield url


def _query(url: str, table: snapshot_sql.DerivedTable, where: str | None = None) -> list[Any]:
    dialect: snapshot_sql.Dialect = "postgresql" if url.startswith("postgresql") else "sqlite"
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(table.sql(dialect, where)).all()
    finally:
        engine.dispose()
    out = []
    for row in rows:
        values = []
        for (name, kind), value in zip(table.columns, row, strict=True):
            if name == "config" and value is not None:
                value = json.dumps(
                    json.loads(value) if isinstance(value, str) else value, sort_keys=True
                )
            elif kind == "BOOLEAN" and value is not None:
                value = bool(value)
            values.append(value)
        out.append(tuple(values))
    return T._sorted(out)


def test_the_database_flattens_the_derived_tables_as_the_oracle_does(filled: str) -> None:
    db = T.Database(filled)
    try:
        catalogue = _query(filled, snapshot_sql.CATALOGUE)
        with_values = _query(filled, snapshot_sql.CATALOGUE_WITH_CONFIG_VALUES)
        target = _query(filled, snapshot_sql.TARGET_ASSIGNMENT)
        current = _query(filled, snapshot_sql.CURRENT_ASSIGNMENT)
        statuses = _query(filled, snapshot_sql.RESOURCE_STATUSES)
        key = db.digest_key()
        assert statuses == db.resource_statuses()
        assert catalogue == db.catalogue()
        assert with_values == db.catalogue(config_values=True)
        assert target == db.target_assignment()
        assert current == db.current_assignment()
    finally:
        db.close()
    # The cases are really there (the oracle could be wrong the same way).
    # Digests, no config values, unless asked; NULL where the row has no digest.
    keyed = config_digest({}, key)
    assert ("g1", "Zéro", "connector", "Zéro", None, 0, keyed, None, "STARTED") in catalogue
    assert ("g1", "Zéro", "connector", "Zéro", None, 0, keyed, "{}", "STARTED") in with_values
    older = config_digest({"topic": "t-é", 'pass"word': "a\\b\n"})  # copied as stored
    assert ("g1", "B", "connector", "B", None, 1, older, None, "STARTED") in catalogue
    assert ("g2", "A", "connector", "A", None, 1, None, None, "STARTED") in catalogue
    assert all(r[7] is None for r in catalogue)
    assert "other" not in repr(catalogue) and "other" in repr(with_values)
    assert not [r for r in catalogue if r[3] == "Zéro" and r[2] == "task"]
    gone = [r for r in target if r[1] == "gone"]
    assert {r[2] for r in gone} == {"B", "A-1"} and all(r[9] is None for r in gone)
    # The target's pending times (delayed rebalance, lost work, next wave), per row.
    assert {r[11:] for r in target if r[0] == "g1"} == {(99, 98, 97)}
    assert {r[11:] for r in target if r[0] == "g2"} == {(None, None, None)}
    b0 = [r for r in current if r[0] == "g1" and r[3] == "B-0"]
    assert b0 == [("g1", "w1", None, "B-0", "task", "B", 0, True, 5, 4, "STABLE", 7, 6, "w2")]
    assert [r for r in current if r[0] == "g3"] == [
        ("g3", "solo", None, "X-3", "task", "X", 3, False, 5, 4, "STABLE", 1, None, None)
    ]
    assert {(r[0], r[13]) for r in current if r[3] == "A"} == {("g1", "w1"), ("g2", "w1")}
    # Large sets stored as ranges are flattened task by task, the gap kept.
    assert "task_ranges" in BIG_COLUMN
    big = {r[3] for r in current if r[0] == "g4" and not r[7]}
    assert big == {"R", "S-0", *(f"R-{n}" for n in range(300) if n != 150)}
    assert {r[3] for r in current if r[0] == "g4" and r[7]} == {f"P-{n}" for n in range(400)}
    assert {r[2] for r in target if r[0] == "g4"} == big
    # Statuses named as the other tables name resources: a connector's with task NULL.
    assert ("g1", "A", "connector", "A", None, "RUNNING", "w1", 11, 0, 1011, None) in statuses
    assert ("g1", "Zéro-7", "task", "Zéro", 7, "PAUSED", "w2", 13, 0, 1013, None) in statuses
    assert ("g2", "A-0", "task", "A", 0, "RESTARTING", "", 0, 2, 1000, None) in statuses
    # A trace's digest as stored, keyed (no query names the trace: test_config_secrets.py).
    failed = ("g1", "A-0", "task", "A", 0, "FAILED", "w1", 12, 0, 1012, trace_digest(TRACE, key))
    assert failed in statuses


def test_a_condition_on_the_key_splits_the_rows_without_loss_or_overlap(filled: str) -> None:
    """What parallel reads rely on: the parts of a table are disjoint and make up the whole."""
    for table in (*snapshot_sql.DERIVED_TABLES, snapshot_sql.CATALOGUE_WITH_CONFIG_VALUES):
        whole = _query(filled, table)
        parts: list[Any] = []
        for first in "wgAB":
            parts += _query(filled, table, f"substr({{key}}, 1, 1) = '{first}'")
        parts += _query(filled, table, "substr({key}, 1, 1) NOT IN ('w', 'g', 'A', 'B')")
        assert T._sorted(parts) == whole, table.name
        assert len(whole) > 0


def test_reads_see_the_database_as_it_was_when_pinned(
    spark: SparkSession, database_url: str
) -> None:
    upgrade_to_head(database_url)
    fill(database_url)
    src = source.source_from_url(database_url)
    engine = sa.create_engine(normalize_url(database_url))
    members = schema.Base.metadata.tables["members"]
    try:
        with source.pinned_snapshot(spark, src) as pin:
            stats, session_init = pin.stats, pin.session_init
            assert session_init is not None
            assert stats.rows["members"] == 6
            # Committed after the pin: a new member, and w1 of g1 is given B as well.
            with engine.begin() as conn:
                conn.execute(sa.insert(members), [_member("g1", "late", _set(["B"]), _set())])
                conn.execute(
                    sa.update(members)
                    .where(members.c.group_id == "g1", members.c.member_id == "w1")
                    .values(assigned=_set(["A", "B"], [("A", 0)]))
                )
            pinned = snapshot.read(spark, src, stats, session_init=session_init)
            live = snapshot.read(spark, src, stats)
            pinned_members = {r["member_id"] for r in pinned["members"].collect()}
            pinned_current = {
                (r["member_id"], r["resource"])
                for r in pinned["current_assignment"].filter("group_id = 'g1'").collect()
            }
            live_members = {r["member_id"] for r in live["members"].collect()}
            live_current = {
                (r["member_id"], r["resource"])
                for r in live["current_assignment"].filter("group_id = 'g1'").collect()
            }
            w2 = pinned["members"].filter("member_id = 'w2'").collect()[0]
    finally:
        engine.dispose()
    assert "late" not in pinned_members and "late" in live_members
    assert ("w1", "B") not in pinned_current and ("w1", "B") in live_current
    assert ("late", "B") in live_current
    # Non-ASCII text arrives intact, in text columns and in JSON ones (read as their bytes).
    assert w2["url"] == "http://wé"
    assert json.loads(w2["assigned"]) == {"connectors": ["B", "Zéro"]}


def test_parallel_reads_of_the_snapshot_give_the_same_rows_as_one_read(
    spark: SparkSession, database_url: str
) -> None:
    """On PostgreSQL a large table is read by several connections, each taking the rows whose
    key hashes to it; split here into a partition per two source rows, at most three."""
    upgrade_to_head(database_url)
    fill(database_url)
    src = source.source_from_url(database_url)
    split = source.ReadTuning(max_partitions=3, state_rows_per_partition=2)
    with source.pinned_snapshot(spark, src) as pin:
        whole = snapshot.read(spark, src, pin.stats, session_init=pin.session_init)
        parts = snapshot.read(spark, src, pin.stats, tuning=split, session_init=pin.session_init)
        for name in (
            "members",
            "catalogue",
            "target_assignment",
            "current_assignment",
            "resource_statuses",
        ):
            assert parts[name].rdd.getNumPartitions() > 1, name
            one = sorted(map(repr, whole[name].collect()))
            three = sorted(map(repr, parts[name].collect()))
            assert three == one and one, name
        # The traces' stored digests, copied (keyed: not what Spark could compute from the
        # text), and the text itself in no column.
        db = T.Database(database_url)
        try:
            expected = db.resource_statuses()
            key = db.digest_key()
        finally:
            db.close()
        digested = T._sorted(
            tuple(r)
            for r in whole["resource_statuses"]
            .select(*T.EXPORTED_COLUMNS["resource_statuses"])
            .collect()
        )
        assert digested == expected
        [failed] = [r[-1] for r in digested if r[1] == "A-0" and r[0] == "g1"]
        assert failed == trace_digest(TRACE, key) != trace_digest(TRACE, None)
        assert "hunter2" not in repr(whole["resource_statuses"].collect())
