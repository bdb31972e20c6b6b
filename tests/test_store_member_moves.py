"""The store writes the members an install moves with their share unchanged (DESIGN 3.21) with a
constant number of statements, however many they are: one UPDATE on PostgreSQL (the ids as one
array parameter), one per chunk of ids on SQLite. Counted with a SQLAlchemy event listener on the
store's engine, on both databases; the group loaded back equals the one in memory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import (
    HeartbeatRequest,
    InstallRequest,
    MemberTarget,
    PrepareRequest,
    PutConnectorRequest,
)
from connect_protocol.resources import ResourceSet
from coordinator_svc.core.admin import put_connector
from coordinator_svc.core.assignment import install_assignment, prepare_assignment
from coordinator_svc.core.heartbeat import heartbeat
from coordinator_svc.core.records import EventType, MembersMovedRecord
from coordinator_svc.store import SqlStore
from coordinator_svc.store.state_writes import MOVE_CHUNK
from tests.test_store import GROUP, Driver, join, leased_driver, open_store, store_url

__all__ = ["open_store", "store_url"]  # the fixtures, used by name


@contextmanager
def statements_of(store: SqlStore) -> Iterator[list[str]]:
    """The SQL text of every statement the store's engine runs inside the block."""
    seen: list[str] = []
    engine = store._db.engine

    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", before)


def _install(driver: Driver, shares: dict[str, ResourceSet], assignor: str) -> None:
    epoch = driver.member_epoch(assignor)
    prepared = driver.run(prepare_assignment, PrepareRequest(GROUP, assignor, epoch))
    assert prepared.error_code is ErrorCode.NONE, prepared.error_message
    members = tuple(MemberTarget(m, r, 1, b"") for m, r in shares.items())
    request = InstallRequest(GROUP, assignor, epoch, prepared.group_epoch, members=members)
    installed = driver.run(install_assignment, request)
    assert installed.error_code is ErrorCode.NONE, installed.error_message


def _group_with_every_member_running_one_task(driver: Driver, members: int) -> list[str]:
    """`members` members, each STABLE with one task of A (w0 also runs A)."""
    ids = [f"w{i:04d}" for i in range(members)]
    driver.run(put_connector, PutConnectorRequest(GROUP, "A", members, {}, caller="t"))
    for member_id in ids:
        driver.run(heartbeat, join(member_id))
    shares = {m: ResourceSet.of([], [("A", i)]) for i, m in enumerate(ids)}
    shares[ids[0]] = shares[ids[0]] | ResourceSet.of(["A"])
    _install(driver, shares, ids[0])
    for member_id in ids:
        epoch = driver.member_epoch(member_id)
        driver.run(
            heartbeat, HeartbeatRequest(GROUP, member_id, epoch, owned=driver.owned(member_id))
        )
    return ids


def _move_statements(open_store: Callable[..., SqlStore], members: int) -> list[str]:
    """The statements of an install that gives the new connector B to the first member and
    keeps every other share: the others are moved."""
    driver = leased_driver(open_store)
    ids = _group_with_every_member_running_one_task(driver, members)
    assert driver.state is not None
    shares = {m: driver.state.target.of(m).resources for m in ids}
    driver.run(put_connector, PutConnectorRequest(GROUP, "B", 0, {}, caller="t"))
    before = driver.state.target.assignment_epoch
    with statements_of(driver.store) as seen:
        _install(driver, {**shares, ids[0]: shares[ids[0]] | ResourceSet.of(["B"])}, ids[0])
    moved = [r for r in driver.committed if isinstance(r, MembersMovedRecord)]
    assert moved[-1].member_ids == tuple(ids[1:])
    installed = [
        r for r in driver.committed if getattr(r, "event_type", None) is EventType.TARGET_INSTALLED
    ]
    assert installed[-1].payload["moved_members"] == ids[1:]
    for member_id in ids[1:]:
        assert driver.member_epoch(member_id) == driver.state.target.assignment_epoch > before
    driver.assert_loaded_equals_memory()
    return [s for s in seen if s.upper().startswith("UPDATE MEMBERS")]


@pytest.mark.parametrize("members", [3, 120])
def test_an_install_moves_its_unchanged_members_with_one_statement(
    open_store: Callable[..., SqlStore], store_url: str, members: int
) -> None:
    updates = _move_statements(open_store, members)

    assert len(updates) == 1, updates
    assert "member_epoch" in updates[0] and "stable_since_epoch" not in updates[0]
    if store_url.startswith("postgresql"):
        assert "ANY" in updates[0].upper(), updates[0]


def test_a_move_of_more_members_than_a_sqlite_chunk_is_written_in_chunks(
    open_store: Callable[..., SqlStore], store_url: str
) -> None:
    members = MOVE_CHUNK + 20

    updates = _move_statements(open_store, members)

    expected = 1 if store_url.startswith("postgresql") else 2
    assert len(updates) == expected, updates
