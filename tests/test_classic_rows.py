"""Classic groups in the store (issue 25 P0, DESIGN 3.19 "Takeover"): a classic group's metadata
and its members' classic fields survive rows and the database and come back through replay as
they were; a classic group's round is never written; a group of a type (or state) this code
does not know is refused at load and never adopted."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from connect_protocol.classic_messages import ClassicProtocol, ConnectWorkerMetadata
from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from connect_protocol.tokens import FencingTokens
from coordinator_svc.core import replay
from coordinator_svc.core.change import GroupChange
from coordinator_svc.core.classic_model import (
    AcceptedAssignment,
    ClassicGroupMeta,
    ClassicMemberInfo,
    ClassicState,
    GroupType,
    PendingId,
)
from coordinator_svc.core.model import GroupConfigDefaults, GroupState, Member, MemberState
from coordinator_svc.core.records import ClassicRoundRecord, Record
from coordinator_svc.store import Lease, SqlStore, rows
from coordinator_svc.store.rows import UnknownGroupType

GROUP = "classic-cluster"
DEFAULTS = GroupConfigDefaults()
NOW = 1_800_000_000_000


def rs(*names: str) -> ResourceSet:
    connectors = [n for n in names if "-" not in n]
    tasks = [TaskId(n.rsplit("-", 1)[0], int(n.rsplit("-", 1)[1])) for n in names if "-" in n]
    return ResourceSet.of(connectors, tasks)


CLASSIC_META = ClassicGroupMeta(ClassicState.STABLE, "compatible", "w1")
W1 = Member(
    member_id="w1",
    member_epoch=4,
    previous_epoch=3,
    url="http://w1:8083",
    rebalance_timeout_ms=60_000,
    state=MemberState.UNREVOKED,
    assigned=rs("A", "A-0"),
    pending_revocation=rs("A-1"),
    principal="User:worker",
    tokens=FencingTokens({"A": 3, TaskId("A", 0): 4}),
    last_grant_at_ms=NOW - 5,
    stable_since_epoch=4,
    classic=ClassicMemberInfo(
        protocols=(
            ClassicProtocol(
                "compatible", ConnectWorkerMetadata(1, "http://w1:8083", 0, rs("A", "A-0", "A-1"))
            ),
            ClassicProtocol("default", ConnectWorkerMetadata(0, "http://w1:8083")),
        ),
        session_timeout_ms=10_000,
        last_joined_generation=4,
        accepted=AcceptedAssignment(
            generation=4, version=1, assignment=rs("A-0"), revoked=rs("A-1"), delay=0, answered=True
        ),
    ),
)
W2 = Member(
    member_id="w2",
    member_epoch=4,
    rebalance_timeout_ms=30_000,
    assigned=rs("A-1") - rs("A-1"),
    principal="User:worker",
    classic=ClassicMemberInfo(
        protocols=(ClassicProtocol("compatible", ConnectWorkerMetadata(1, "", 0, EMPTY)),),
        session_timeout_ms=6_000,
        last_joined_generation=4,
        accepted=None,
    ),
)


def classic_records() -> list[Record]:
    """A classic group created and filled through a GroupChange (as the core will)."""
    change = GroupChange(None, GROUP, NOW, DEFAULTS, creator="User:worker")
    change.set_meta(group_type=GroupType.CLASSIC, classic=CLASSIC_META, group_epoch=4)
    change.put_member(W1)
    change.put_member(W2)
    change.put_pending_id("w3", PendingId("User:worker", 10_000, NOW + 10_000))
    change.join_round("w1")
    return change.records()


def as_stored(row: dict[str, Any]) -> dict[str, Any]:
    """A row as the database hands it back: JSON columns through JSON text."""
    stored: dict[str, Any] = json.loads(json.dumps(row))
    return stored


def test_classic_meta_and_members_round_trip_through_rows() -> None:
    meta = classic_state().meta
    assert meta.group_type is GroupType.CLASSIC and meta.classic == CLASSIC_META
    assert rows.meta_from_row(as_stored(rows.group_row(meta))) == meta
    for member in (W1, W2):
        assert rows.member_from_row(as_stored(rows.member_row(GROUP, member))) == member
    row = rows.member_row(GROUP, W1)
    assert row["group_protocol"] == "classic" and row["session_timeout_ms"] == 10_000


def test_a_connect_group_and_member_keep_their_rows_as_before() -> None:
    connect = Member(member_id="c1", member_epoch=2)
    row = rows.member_row(GROUP, connect)
    assert row["group_protocol"] == "connect"
    assert row["classic_protocols"] is None and row["classic_assignment"] is None
    assert rows.member_from_row(as_stored(row)) == connect
    meta = dataclasses.replace(classic_state().meta, group_type=GroupType.CONNECT, classic=None)
    group = rows.group_row(meta)
    assert (group["group_type"], group["classic_state"], group["leader_id"]) == (
        "connect",
        None,
        None,
    )
    assert rows.meta_from_row(as_stored(group)) == meta


def classic_state() -> GroupState:
    return replay.new_state(classic_records())


def test_rows_rebuild_the_classic_group_through_replay() -> None:
    state = classic_state()
    rebuilt = replay.new_state(
        rows.group_records(
            as_stored(rows.group_row(state.meta)),
            rows.target_row(GROUP, state.target),
            rows.target_member_rows(GROUP, state.target),
            [],
            [],
            [as_stored(rows.member_row(GROUP, m)) for m in state.members.values()],
        )
    )
    assert rebuilt.meta == state.meta
    assert rebuilt.members == state.members
    assert rebuilt.connector_owner == state.connector_owner == {"A": "w1"}
    assert rebuilt.task_owner == state.task_owner
    assert rebuilt.round is None  # the round is not persisted
    assert state.round is not None and state.round.joined == {"w1": 0}
    assert rebuilt.display_state() == "STABLE"


@pytest.mark.parametrize(
    ("column", "value", "what"),
    [
        ("group_type", "streams", "of type 'streams'"),
        ("classic_state", "ASSIGNING_PARTITIONS", "in state 'ASSIGNING_PARTITIONS'"),
    ],
)
def test_a_group_this_code_does_not_know_is_refused(column: str, value: str, what: str) -> None:
    row = {**as_stored(rows.group_row(classic_state().meta)), column: value}
    with pytest.raises(UnknownGroupType, match=what) as refused:
        rows.meta_from_row(row)
    assert refused.value.group_id == GROUP


def test_a_member_of_a_protocol_this_code_does_not_know_is_refused() -> None:
    row = {**as_stored(rows.member_row(GROUP, W2)), "group_protocol": "streams"}
    with pytest.raises(UnknownGroupType, match="'streams'"):
        rows.member_from_row(row)


# --- the database -------------------------------------------------------------------------


@pytest.fixture(params=["postgresql", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'coordinator.db'}"
    else:
        url = str(request.getfixturevalue("database_url"))
    opened = SqlStore(url, "coord-a", "10.0.0.1:7000")
    opened.migrate()
    yield opened
    opened.close()


def leased(store: SqlStore) -> Lease:
    lease = store.try_acquire(GROUP)
    assert isinstance(lease, Lease)
    return lease


def test_a_classic_group_is_loaded_as_it_was_committed(store: SqlStore) -> None:
    lease = leased(store)
    store.commit(lease, classic_records())
    loaded, expected = store.load_group(GROUP), classic_state()
    assert loaded is not None
    assert loaded.meta == expected.meta
    assert loaded.members == expected.members
    assert loaded.task_owner == expected.task_owner
    assert loaded.round is None
    assert store.groups_needing_owner(10) == []  # leased
    store.release(lease)
    assert store.groups_needing_owner(10) == [GROUP]


def test_a_commit_of_round_records_only_writes_nothing(store: SqlStore) -> None:
    lease = leased(store)
    store.commit(lease, classic_records())
    change = GroupChange(classic_state(), GROUP, NOW + 1, DEFAULTS)
    change.join_round("w2")
    change.put_pending_id("w4", PendingId("User:worker", 10_000, NOW + 10_001))
    records = change.records()
    assert records and all(isinstance(r, ClassicRoundRecord) for r in records)
    events = store.list_events(GROUP)
    # Not even the lease is checked: there is no transaction (a lease never held would raise).
    store.commit(dataclasses.replace(lease, token=lease.token + 1), records)
    assert store.list_events(GROUP) == events


def test_a_group_of_a_newer_type_is_neither_adopted_nor_loaded(database_url: str) -> None:
    """A newer release's migration widens the type CHECK; this release must leave such a group
    alone (DESIGN 3.19 "Takeover")."""
    store = SqlStore(database_url, "coord-a", "10.0.0.1:7000")
    try:
        store.migrate()
        store.commit(leased(store), classic_records())
        engine = sa.create_engine(database_url, poolclass=sa.NullPool)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql("ALTER TABLE groups DROP CONSTRAINT ck_groups_group_type")
                conn.exec_driver_sql(
                    "UPDATE groups SET group_type = 'streams' WHERE group_id = %(g)s", {"g": GROUP}
                )
                conn.exec_driver_sql("DELETE FROM group_leases")
        finally:
            engine.dispose()
        assert store.groups_needing_owner(10) == []
        with pytest.raises(UnknownGroupType):
            store.load_group(GROUP)
    finally:
        store.close()
