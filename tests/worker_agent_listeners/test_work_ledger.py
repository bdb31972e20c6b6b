"""The agent's ledger of target states and restarts (worker_agent/lifecycle.py `WorkLedger`,
DESIGN 3.20): what a ConnectGroupConfigs answer makes due for the running resources.

- A grant records the count its start read: a fresh start satisfies every earlier restart, so a
  move or an answer sent again repeats nothing; only a higher count later is due.
- A failed start is due for a restart like any, but gets no target-state event.
- STOPPED is applied to connectors only; a task of a stopped connector is revoked instead.
- Property: whatever the answers, a restart is due exactly when the count rose above the one
  last acted on, and acting on it makes nothing due."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from connect_protocol.lifecycle_messages import TargetState
from connect_protocol.resources import ResourceSet, TaskId
from connect_protocol.tokens import Resource
from worker_agent.lifecycle import WorkLedger

A0, A1 = TaskId("A", 0), TaskId("A", 1)
RUNNING = ResourceSet.of(["A"], [A0, A1])
STARTED = {"A": TargetState.STARTED}


def started(counts: dict[Resource, int] | None = None, ok: bool = True) -> WorkLedger:
    ledger = WorkLedger()
    ledger.started(RUNNING, counts or {}, STARTED, ok=ok)
    return ledger


def test_a_grant_records_the_count_it_started_with() -> None:
    ledger = started({A0: 3})
    assert not ledger.due_restarts(RUNNING, {A0: 3})  # an answer sent again: nothing
    assert ledger.due_restarts(RUNNING, {A0: 4}) == ResourceSet.of((), [A0])
    ledger.started(ResourceSet.of((), [A0]), {A0: 4}, STARTED, ok=True)
    assert not ledger.due_restarts(RUNNING, {A0: 4})


def test_what_is_not_running_or_was_forgotten_is_never_due() -> None:
    ledger = started()
    assert not ledger.due_restarts(ResourceSet.of(["A"], []), {A0: 1})
    ledger.forget(ResourceSet.of((), [A0]))
    assert not ledger.due_restarts(RUNNING, {A0: 1})  # stopped: its next grant starts it anew
    assert ledger.due_restarts(RUNNING, {A1: 1}) == ResourceSet.of((), [A1])


def test_target_state_changes_skip_failed_starts_and_stop_connectors_only() -> None:
    ledger = started()
    assert ledger.target_changes(RUNNING, STARTED) == {}
    assert ledger.target_changes(RUNNING, {"A": TargetState.PAUSED}) == {
        TargetState.PAUSED: RUNNING
    }
    assert ledger.target_changes(RUNNING, {"A": TargetState.STOPPED}) == {
        TargetState.STOPPED: ResourceSet.of(["A"], [])
    }
    ledger.applied(RUNNING, TargetState.PAUSED)
    assert ledger.target_changes(RUNNING, {"A": TargetState.PAUSED}) == {}
    assert ledger.target_changes(RUNNING, STARTED) == {TargetState.STARTED: RUNNING}
    failed = started(ok=False)
    assert failed.target_changes(RUNNING, {"A": TargetState.PAUSED}) == {}
    assert failed.failed(A0) and failed.due_restarts(RUNNING, {A0: 1})


@given(
    st.lists(
        st.tuples(st.sampled_from(["A", A0, A1]), st.integers(0, 5), st.booleans()),
        max_size=30,
    )
)
def test_a_restart_is_due_exactly_when_the_count_rose_above_the_one_acted_on(
    steps: list[tuple[Resource, int, bool]],
) -> None:
    ledger = started()
    acted: dict[Resource, int] = {"A": 0, A0: 0, A1: 0}
    counts: dict[Resource, int] = {}
    for resource, count, act in steps:
        counts[resource] = max(counts.get(resource, 0), count)  # counts never go down
        due = ledger.due_restarts(RUNNING, counts)
        expected = [r for r in ("A", A0, A1) if counts.get(r, 0) > acted[r]]
        assert due == ResourceSet.of(
            [r for r in expected if isinstance(r, str)],
            [r for r in expected if not isinstance(r, str)],
        )
        if act and due:
            ledger.started(due, counts, STARTED, ok=True)
            for r in expected:
                acted[r] = counts.get(r, 0)
            assert not ledger.due_restarts(RUNNING, counts)
