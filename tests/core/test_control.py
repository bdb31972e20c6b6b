"""Target states, restarts and automatic restarts in the core (issue 29, DESIGN 3.20 "Target
states", "Restarts", "Automatic restarts"), driven through the handlers with a fake clock.

- PAUSED moves nothing and bumps no epoch, raising only the holders' revisions; the epoch bumps
  exactly on entering or leaving STOPPED and on a task count change while not STOPPED; Prepare
  carries effective task counts.
- A restart raises the selected resources' restart counts (persisted: a rebuilt group equals
  the live one) and their holders' revisions, and moves nothing.
- Automatic restarts: after the backoff, doubling, at most restart.failed.max.attempts in a row,
  reset only by RUNNING that lasted the backoff; cancelled by a pause, a stop, a move.
- The state machine of test_lifecycle with pause, resume, stop and restart thrown in: no
  resource is ever held by two workers, the epoch and the owned sets move exactly as the rules
  say, restart counts never go down."""

from __future__ import annotations

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from connect_protocol.errors import ErrorCode
from connect_protocol.lifecycle_messages import ReportedState, StatusEntry, TargetState
from connect_protocol.resources import ResourceSet, TaskId
from connect_protocol.tokens import Resource
from coordinator_svc.core.model import CONNECTOR_TASK, GroupConfigDefaults, StatusState
from coordinator_svc.core.records import EventType
from coordinator_svc.core.status import holder_of, view_of, views
from tests.core.harness import GroupHarness, rs, stable_group
from tests.core.test_lifecycle import CATALOGUE, LifecycleMachine, move

BACKOFF = 1_000


def group(**overrides: str) -> GroupHarness:
    """w1 runs A, A-0, A-1; w2 runs B, B-0 (stable), automatic restarts every BACKOFF ms."""
    h = stable_group()
    h.alter_configs(
        {
            "restart.failed.backoff.ms": str(BACKOFF),
            "restart.failed.max.attempts": "3",
            **overrides,
        }
    )
    return h


def wait(h: GroupHarness, ms: int) -> None:
    """Advance the clock by `ms`, both workers heartbeating (sessions are 1 s here)."""
    h.run_for(ms, "w1", "w2")


def revisions(h: GroupHarness) -> dict[str, int]:
    state = h.state
    assert state is not None
    return {m: member.lifecycle_revision for m, member in state.members.items()}


def owned(h: GroupHarness) -> dict[str, ResourceSet]:
    state = h.state
    assert state is not None
    return {m: member.owned for m, member in state.members.items()}


def fail(h: GroupHarness, member: str, resource: Resource, trace: str = "boom") -> None:
    token = h.member(member).tokens[resource]
    answer = h.report(member, StatusEntry(resource, token, ReportedState.FAILED, trace))
    assert answer.results[0].error_code == ErrorCode.NONE, answer


def running(h: GroupHarness, member: str, resource: Resource) -> None:
    token = h.member(member).tokens[resource]
    answer = h.report(member, StatusEntry(resource, token, ReportedState.RUNNING))
    assert answer.results[0].error_code == ErrorCode.NONE, answer


def restart_count(h: GroupHarness, connector: str, task: int) -> int:
    state = h.state
    assert state is not None
    return view_of(state, connector, task).restart_count


# --- target states -----------------------------------------------------------------------------


def test_pause_and_resume_raise_only_the_holders_revisions_and_move_nothing() -> None:
    h = group()
    before, epoch, shares = revisions(h), h.group_epoch, owned(h)
    answer = h.set_target_state("A", TargetState.PAUSED)
    assert (answer.changed, answer.rebalance_triggered, answer.holders_told) == (True, False, 1)
    assert h.group_epoch == epoch and owned(h) == shares
    assert revisions(h) == {**before, "w1": before["w1"] + 1}
    (held,) = h.configs("w1").connectors
    assert held.target_state is TargetState.PAUSED
    assert h.set_target_state("A", TargetState.PAUSED).changed is False
    assert h.records_of_last_call == []  # a repeat writes nothing
    h.set_target_state("A", TargetState.STARTED)
    assert h.group_epoch == epoch and owned(h) == shares
    assert revisions(h) == {**before, "w1": before["w1"] + 2}
    (changed, back) = h.logged_events(EventType.CONNECTOR_TARGET_STATE_CHANGED)
    assert (changed.payload["target_state"], back.payload["target_state"]) == (
        "PAUSED",
        "STARTED",
    )
    assert changed.payload["caller"] == "test"


def test_the_epoch_bumps_exactly_on_entering_or_leaving_stopped_and_counts_are_effective() -> None:
    h = group()
    epoch = h.group_epoch
    assert h.set_target_state("A", TargetState.STOPPED).rebalance_triggered
    assert h.group_epoch == epoch + 1
    counts = {c.name: c.task_count for c in h.prepare("w1").catalogue}
    assert counts == {"A": 0, "B": 1}
    h.put_connector("A", 5)  # a task count change while STOPPED: kept for resume, no bump
    assert h.group_epoch == epoch + 1
    h.set_target_state("A", TargetState.PAUSED)  # leaving STOPPED (to PAUSED): a bump
    assert h.group_epoch == epoch + 2
    assert {c.name: c.task_count for c in h.prepare("w1").catalogue} == {"A": 5, "B": 1}
    h.set_target_state("A", TargetState.STARTED)  # PAUSED -> STARTED: none
    assert h.group_epoch == epoch + 2
    h.put_connector("A", 2)  # a task count change while not STOPPED: a bump
    assert h.group_epoch == epoch + 3
    assert h.dump() == h.rebuilt()  # the target state is persisted


def test_stopping_a_connector_revokes_its_tasks_and_keeps_it_assigned() -> None:
    h = group(**{"restart.failed.max.attempts": "0"})
    fail(h, "w1", TaskId("A", 1))  # a failed task of a stopped connector is no longer shown
    running(h, "w2", TaskId("B", 0))
    state = h.state
    assert state is not None and state.status_counts[StatusState.FAILED] == 1
    h.set_target_state("A", TargetState.STOPPED)
    h.compute("w1", {"w1": rs("A"), "w2": rs("B", "B-0")})
    for _ in range(3):
        h.ack("w1")
        h.ack("w2")
    assert h.member("w1").owned == rs("A")
    (held,) = h.configs("w1").connectors
    assert held.target_state is TargetState.STOPPED
    assert [(v.connector, v.task) for v in views(state)] == [("A", -1), ("B", -1), ("B", 0)]
    assert state.status_counts.get(StatusState.FAILED, 0) == 0  # nor counted (alerts)
    late = h.report("w1", StatusEntry(TaskId("A", 1), 1, ReportedState.FAILED, "late"))
    assert late.results[0].error_code is ErrorCode.NOT_RESOURCE_OWNER  # nothing comes back
    assert "STOPPED" in late.results[0].error_message
    assert state.resource_status("B", 0) is not None
    h.put_connector("B", 0)  # a lower task count drops the statuses of the tasks gone too
    assert state.resource_status("B", 0) is None
    assert h.dump() == h.rebuilt()


def test_on_a_classic_group_stopping_starts_a_rebalance_and_pausing_does_not() -> None:
    """DESIGN 3.19/3.20: where a connect group's epoch would bump, a classic group with members
    starts a rebalance (the leader's next catalogue carries the effective count)."""
    from coordinator_svc.core.classic_model import ClassicState
    from tests.core.test_conversions import classic_group

    h = classic_group(members=2, generation=4)
    h.set_target_state("A", TargetState.PAUSED)
    state = h.state
    assert state is not None and state.meta.classic is not None
    assert state.meta.classic.state is ClassicState.STABLE  # pausing moves nothing
    assert h.last_events(EventType.CLASSIC_REBALANCE_STARTED) == []
    answer = h.set_target_state("A", TargetState.STOPPED)
    assert answer.rebalance_triggered
    assert state.meta.classic.state is ClassicState.PREPARING_REBALANCE
    (started,) = h.last_events(EventType.CLASSIC_REBALANCE_STARTED)
    assert started.payload["connector"] == "A"


# --- restarts ----------------------------------------------------------------------------------


def test_a_restart_raises_counts_and_the_holders_revisions_and_moves_nothing() -> None:
    h = group()
    fail(h, "w1", TaskId("A", 1))
    running(h, "w1", TaskId("A", 0))
    before, epoch, shares = revisions(h), h.group_epoch, owned(h)
    answer = h.restart("A", include_tasks=True, only_failed=True)
    assert [(p.resource, p.restart_count, p.worker_id) for p in answer.restarts] == [
        (TaskId("A", 1), 1, "w1")
    ]
    assert h.group_epoch == epoch and owned(h) == shares
    assert revisions(h) == {**before, "w1": before["w1"] + 1}
    state = h.state
    assert state is not None
    assert view_of(state, "A", 1).state is StatusState.RESTARTING
    assert h.configs("w1").restart_counts == {TaskId("A", 1): 1}
    answer = h.restart("A", include_tasks=True)  # everything of A: one revision raise for w1
    assert [p.restart_count for p in answer.restarts] == [1, 1, 2]
    assert revisions(h)["w1"] == before["w1"] + 2
    h.ack("w1")
    h.ack("w1")  # answers resent: nothing is restarted again
    assert h.configs("w1").restart_counts == {"A": 1, TaskId("A", 0): 1, TaskId("A", 1): 2}
    assert h.dump() == h.rebuilt()


def test_a_restart_refuses_what_cannot_be_restarted() -> None:
    h = group()
    assert h.restart("Z").error_code is ErrorCode.INVALID_REQUEST
    assert h.restart("A", task=2).error_code is ErrorCode.INVALID_REQUEST
    h.set_target_state("B", TargetState.STOPPED)
    refused = h.restart("B")
    assert refused.error_code is ErrorCode.INVALID_REQUEST and "STOPPED" in refused.error_message
    assert h.records_of_last_call == []


# --- automatic restarts ----------------------------------------------------------------------


def test_automatic_restarts_back_off_doubling_and_give_up_at_the_maximum() -> None:
    h = group()
    task = TaskId("A", 0)
    restarted_at: list[int] = []
    for attempt in range(3):
        failed_at = h.now_ms
        fail(h, "w1", task)
        wait(h, BACKOFF * 2**attempt - 1)
        assert restart_count(h, "A", 0) == attempt  # not yet
        wait(h, 1)
        assert restart_count(h, "A", 0) == attempt + 1
        restarted_at.append(h.now_ms - failed_at)
    assert restarted_at == [1_000, 2_000, 4_000]
    fail(h, "w1", task)  # a fourth failure: 3 attempts spent
    wait(h, 60_000)
    state = h.state
    assert state is not None
    view = view_of(state, "A", 0)
    assert (view.state, view.restart_count, view.auto_exhausted) == (StatusState.FAILED, 3, True)
    assert state.exhausted == 1
    autos = h.logged_events(EventType.CONNECTOR_RESTART_REQUESTED)
    assert [(e.payload["reason"], e.payload["attempt"]) for e in autos] == [
        ("auto", 1),
        ("auto", 2),
        ("auto", 3),
    ]
    assert h.dump() == h.rebuilt()


def test_the_attempts_reset_only_after_running_lasted_the_backoff() -> None:
    h = group()
    task = TaskId("A", 0)
    fail(h, "w1", task)
    wait(h, BACKOFF)
    assert restart_count(h, "A", 0) == 1
    running(h, "w1", task)
    wait(h, BACKOFF // 2)  # a crash loop: RUNNING, then FAILED before the backoff passed
    fail(h, "w1", task)
    wait(h, 2 * BACKOFF)  # attempt 2 waits twice as long: the attempts were not reset
    assert restart_count(h, "A", 0) == 2
    running(h, "w1", task)
    wait(h, BACKOFF)  # RUNNING lasted the backoff
    fail(h, "w1", task)
    wait(h, BACKOFF)  # attempt 1 again: back to the first wait
    assert restart_count(h, "A", 0) == 3
    state = h.state
    assert state is not None
    assert view_of(state, "A", 0).auto_attempts == 1


def test_a_crash_loop_is_restarted_at_most_max_attempts_times() -> None:
    h = group()
    task = TaskId("A", 1)
    for _ in range(10):
        running(h, "w1", task)
        wait(h, 100)
        fail(h, "w1", task)
        wait(h, 20_000)
    assert restart_count(h, "A", 1) == 3


def test_pausing_stopping_or_moving_cancels_a_pending_automatic_restart() -> None:
    h = group()
    fail(h, "w1", TaskId("A", 0))
    fail(h, "w2", "B")
    h.set_target_state("A", TargetState.PAUSED)
    state = h.state
    assert state is not None
    assert view_of(state, "A", 0).next_restart_at_ms is None
    (paused,) = h.logged_events(EventType.CONNECTOR_TARGET_STATE_CHANGED)
    assert paused.payload["auto_restarts_cancelled"] == 1
    move(h, rs("A", "A-0", "A-1", "B"), rs("B-0"))  # B moves from w2 to w1
    for _ in range(4):
        h.ack("w1")
        h.ack("w2")
    assert holder_of(state, "B", CONNECTOR_TASK) is not None
    wait(h, 5 * BACKOFF)
    assert restart_count(h, "A", 0) == 0 and restart_count(h, "B", CONNECTOR_TASK) == 0
    assert h.logged_events(EventType.CONNECTOR_RESTART_REQUESTED) == []


def test_automatic_restarts_are_off_at_zero_attempts_and_survive_a_takeover() -> None:
    off = group(**{"restart.failed.max.attempts": "0"})
    fail(off, "w1", TaskId("A", 0))
    wait(off, 10 * BACKOFF)
    assert restart_count(off, "A", 0) == 0
    state = off.state
    assert state is not None and state.exhausted == 0  # off is not "gave up"

    h = group()
    fail(h, "w1", TaskId("A", 0))
    taken = GroupHarness(h.group_id, h.defaults)
    from coordinator_svc.core import replay
    from coordinator_svc.core.timers import timers_after_load

    taken.state = replay.new_state(h.log)
    taken.now_ms = h.now_ms
    assert taken.state is not None
    for timer in timers_after_load(taken.state, taken.now_ms, taken.defaults):
        taken.timers[timer.key] = (timer.deadline_ms, len(taken.timers))
    wait(taken, BACKOFF)
    assert restart_count(taken, "A", 0) == 1


# --- the state machine ---------------------------------------------------------------------------

TARGETS = list(TargetState)


class ControlMachine(LifecycleMachine):
    """test_lifecycle's machine with target-state changes and restarts (manual, and automatic
    through the clock), checking the rules after each and, after every step, that no resource
    is held by two workers or by a worker and a hold, and that restart counts never go down."""

    def __init__(self) -> None:
        super().__init__()
        self.h = GroupHarness(
            defaults=GroupConfigDefaults(restart_failed_backoff_ms=500, heartbeat_interval_ms=500)
        )
        self.counts: dict[tuple[str, int], int] = {}

    @rule(name=st.sampled_from(sorted(CATALOGUE)), to=st.sampled_from(TARGETS))
    def change_target(self, name: str, to: TargetState) -> None:
        target = to
        state = self.h.state
        assert state is not None
        before = state.catalogue[name].target_state
        epoch, shares, revs = self.h.group_epoch, owned(self.h), revisions(self.h)
        answer = self.h.set_target_state(name, target)
        assert answer.error_code is ErrorCode.NONE, answer
        assert answer.changed == (before is not target)
        stopped_changed = (before is TargetState.STOPPED) != (target is TargetState.STOPPED)
        assert self.h.group_epoch == epoch + (1 if stopped_changed else 0)
        assert owned(self.h) == shares  # nothing moves now (a bump moves things later)
        raised = {m for m in revs if revisions(self.h)[m] != revs[m]}
        assert len(raised) == answer.holders_told
        event(f"target {before.value} -> {target.value}")

    @rule(
        name=st.sampled_from(sorted(CATALOGUE)),
        task=st.one_of(st.none(), st.integers(0, 2)),
        include_tasks=st.booleans(),
        only_failed=st.booleans(),
    )
    def restart(self, name: str, task: int | None, include_tasks: bool, only_failed: bool) -> None:
        epoch, shares = self.h.group_epoch, owned(self.h)
        answer = self.h.restart(name, task, include_tasks, only_failed)
        if answer.error_code is not ErrorCode.NONE:
            state = self.h.state
            assert state is not None
            spec = state.catalogue[name]
            assert spec.target_state is TargetState.STOPPED or (
                task is not None and task >= spec.task_count
            ), answer
            return
        assert self.h.group_epoch == epoch and owned(self.h) == shares
        event(f"restart planned {len(answer.restarts)}")

    @rule()
    def delete_and_restore_b(self) -> None:
        super().delete_and_restore_b()
        self.counts = {k: v for k, v in self.counts.items() if k[0] != "B"}

    @invariant()
    def never_two_holders(self) -> None:
        state = self.h.state
        if state is None:
            return
        seen: dict[str, str] = {}
        for member_id, member in state.members.items():
            for name in member.owned.names():
                assert name not in seen, (name, seen.get(name), member_id)
                seen[name] = member_id
        for hold in state.meta.holds:
            for name in hold.resources.names():
                assert name not in seen, (name, "hold", seen.get(name))

    @invariant()
    def restart_counts_never_go_down(self) -> None:
        state = self.h.state
        if state is None:
            return
        seen: dict[tuple[str, int], int] = {}
        for connector, by_task in state.statuses.items():
            for task, status in by_task.items():
                key = (connector, task)
                assert status.restart_count >= self.counts.get(key, 0), key
                seen[key] = status.restart_count
        # A status dropped (its task no longer exists: a STOPPED connector, a lower task count,
        # issue 29) takes its count with it; a task that exists again starts from 0.
        self.counts = seen


ControlMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_control_machine = ControlMachine.TestCase
