"""The agent's membership state machine (worker_agent/membership.py), driven like the runtime
drives it: `poll(now)` on a fake clock (plain integers), actions inspected, heartbeat answers and
failures fed back, stops/starts/computations/FindCoordinator reported done.

References: DESIGN 2.1, 2.3, 3.2, 3.11-3.15; seed 000 "Response Handling"; the heartbeat comments
in protos/connect/group/v1/coordinator.proto and the ErrorCode comments in common.proto.

The Driver plays the runtime and checks the safety invariants on every poll; the rule-based
state machine at the end throws random answers, failures, clock steps and reports at it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    AssignmentMessage,
    Assignor,
    HeartbeatRequest,
    HeartbeatResponse,
)
from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from worker_agent.membership import (
    MAX_RETRY_BACKOFF_MS,
    Action,
    ComputeAssignment,
    FindCoordinator,
    Membership,
    MembershipConfig,
    Phase,
    SendHeartbeat,
    StartWork,
    StopWork,
)

INTERVAL = 3_000
SESSION = 10_000
#: With these values the margin is exactly one heartbeat interval (DESIGN 3.13's minimum).
FENCE_AFTER = SESSION - INTERVAL
REBALANCE_TIMEOUT = 60_000
ASSIGNORS = (
    Assignor("incremental_cooperative", 1, 2, version=2, metadata=b"m"),
    Assignor("eager", 0, 0),
)

ActionT = TypeVar("ActionT")


def rs(*names: str) -> ResourceSet:
    """`rs("A", "A-0")`: connector A and its task 0."""
    connectors: list[str] = []
    tasks: list[TaskId] = []
    for name in names:
        if "-" in name:
            connector, task = name.rsplit("-", 1)
            tasks.append(TaskId(connector, int(task)))
        else:
            connectors.append(name)
    return ResourceSet.of(connectors, tasks)


def make_config(**overrides: Any) -> MembershipConfig:
    values: dict[str, Any] = {
        "group_id": "g",
        "member_id": "w1",
        "assignors": ASSIGNORS,
        "rebalance_timeout_ms": REBALANCE_TIMEOUT,
        "url": "http://w1:8083",
        "initial_heartbeat_interval_ms": INTERVAL,
        "initial_session_timeout_ms": SESSION,
    }
    values.update(overrides)
    return MembershipConfig(**values)


def ok(
    epoch: int,
    assigned: ResourceSet | None = None,
    *,
    code: ErrorCode = ErrorCode.NONE,
    interval: int = INTERVAL,
    session: int = SESSION,
) -> HeartbeatResponse:
    """A heartbeat answer; `assigned=None` leaves the assignment ABSENT (unchanged)."""
    assignment = AssignmentMessage(assigned) if assigned is not None else None
    return HeartbeatResponse(code, "", epoch, interval, session, assignment)


def error(code: ErrorCode, message: str = "no") -> HeartbeatResponse:
    return HeartbeatResponse(code, message)


def of_type(actions: list[Action], kind: type[ActionT]) -> list[ActionT]:
    return [a for a in actions if isinstance(a, kind)]


def heartbeats(actions: list[Action]) -> list[HeartbeatRequest]:
    return [a.request for a in of_type(actions, SendHeartbeat)]


def only_heartbeat(actions: list[Action]) -> HeartbeatRequest:
    sent = heartbeats(actions)
    assert len(sent) == 1, actions
    return sent[0]


def assert_full(
    req: HeartbeatRequest, config: MembershipConfig, epoch: int, owned: ResourceSet
) -> None:
    """Every field set (a join, or the first heartbeat after an error or a lost response)."""
    assert req.group_id == config.group_id
    assert req.member_id == config.member_id
    assert req.member_epoch == epoch
    assert req.instance_id == config.instance_id
    assert req.rebalance_timeout_ms == config.rebalance_timeout_ms
    assert req.client_assignors == config.assignors
    assert req.url == config.url
    assert req.owned == owned
    assert req.server_assignor is None


def assert_partial(req: HeartbeatRequest, epoch: int, owned: ResourceSet | None) -> None:
    """Only the fields that changed: the unchanged optional ones are ABSENT."""
    assert req.member_epoch == epoch
    assert req.instance_id is None
    assert req.rebalance_timeout_ms is None
    assert req.client_assignors is None
    assert req.url is None
    assert req.server_assignor is None
    assert req.owned == owned


@dataclass
class Driver:
    """Plays the runtime: tracks what is in flight and outstanding, and checks on every poll
    that no two heartbeats are in flight, that a heartbeat's owned list is what runs, and that
    nothing is started while anything is being stopped or runs outside the assignment."""

    m: Membership
    now: int = 0
    running: ResourceSet = EMPTY
    in_flight: HeartbeatRequest | None = None
    sent: list[tuple[int, HeartbeatRequest]] = field(default_factory=list)
    stops: list[StopWork] = field(default_factory=list)
    starts: list[StartWork] = field(default_factory=list)
    computes: list[ComputeAssignment] = field(default_factory=list)
    finds: list[FindCoordinator] = field(default_factory=list)
    log: list[tuple[int, Action]] = field(default_factory=list)

    @classmethod
    def new(cls, **overrides: Any) -> Driver:
        return cls(Membership(make_config(**overrides)))

    @property
    def starting(self) -> ResourceSet:
        out = EMPTY
        for start in self.starts:
            out = out | start.resources
        return out

    @property
    def config(self) -> MembershipConfig:
        return self.m.config

    def _at(self, at: int | None) -> int:
        if at is not None:
            assert at >= self.now, "the fake clock never goes back"
            self.now = at
        return self.now

    def poll(self, at: int | None = None) -> list[Action]:
        now = self._at(at)
        actions = self.m.poll(now)
        for action in actions:
            self.log.append((now, action))
            if isinstance(action, SendHeartbeat):
                assert self.in_flight is None, "two heartbeats in flight"
                owned = action.request.owned
                # never less than what runs (that would acknowledge a revocation too early),
                # never more than what runs or is being started
                assert owned is None or self.running <= owned <= self.running | self.starting, (
                    owned,
                    self.running,
                )
                self.in_flight = action.request
                self.sent.append((now, action.request))
            elif isinstance(action, StopWork):
                assert not self.stops, "a second StopWork before the first was reported"
                assert action.resources <= self.running
                self.stops.append(action)
            elif isinstance(action, StartWork):
                assert not self.stops, "StartWork while something is being stopped"
                assert not self.starts, "a second StartWork before the first was reported"
                assert self.running <= self.m.assigned, "StartWork while running unassigned work"
                assert action.resources.isdisjoint(self.running)
                self.starts.append(action)
            elif isinstance(action, ComputeAssignment):
                assert not self.computes, "a second ComputeAssignment while computing"
                self.computes.append(action)
            else:
                assert not self.finds, "a second FindCoordinator while finding"
                self.finds.append(action)
        return actions

    def poll_until(self, end: int, step: int = 1) -> list[Action]:
        """Poll at every `step` ms up to `end` (inclusive), answering nothing."""
        out: list[Action] = []
        t = self.now
        while t <= end:
            out += self.poll(t)
            t += step
        return out

    def answer(self, resp: HeartbeatResponse, at: int | None = None) -> HeartbeatRequest:
        req = self.in_flight
        assert req is not None, "no heartbeat in flight to answer"
        self.in_flight = None
        self.m.on_heartbeat_response(resp, self._at(at))
        return req

    def fail(self, at: int | None = None, why: str = "DEADLINE_EXCEEDED") -> HeartbeatRequest:
        req = self.in_flight
        assert req is not None, "no heartbeat in flight to fail"
        self.in_flight = None
        self.m.on_heartbeat_failed(why, self._at(at))
        return req

    def stopped(self, at: int | None = None) -> StopWork:
        stop = self.stops.pop(0)
        self.running = self.running - stop.resources
        self.m.work_stopped(stop.resources, self._at(at))
        assert self.m.running == self.running
        return stop

    def started(self, at: int | None = None) -> StartWork:
        start = self.starts.pop(0)
        self.running = self.running | start.resources
        self.m.work_started(start.resources, self._at(at))
        assert self.m.running == self.running
        return start

    def computed(self, at: int | None = None) -> None:
        self.computes.pop(0)
        self.m.compute_done(self._at(at))

    def found(self, at: int | None = None) -> None:
        self.finds.pop(0)
        self.m.coordinator_found(self._at(at))

    def leave(self, at: int | None = None) -> None:
        self.m.leave(self._at(at))


def joined(assignment: ResourceSet | None = None, epoch: int = 1, **overrides: Any) -> Driver:
    """A member at `epoch` that runs `assignment` (default: A, A-0), its last successful heartbeat
    sent at 0 and answered at once, so the next regular heartbeat is due at the interval. The
    answers carry the configured initial interval and session timeout."""
    if assignment is None:
        assignment = rs("A", "A-0")
    d = Driver.new(**overrides)
    timing = {
        "interval": d.config.initial_heartbeat_interval_ms,
        "session": d.config.initial_session_timeout_ms,
    }
    d.poll(0)
    d.answer(ok(epoch, assignment, **timing))
    if assignment:
        d.poll()
        d.started()
        only_heartbeat(d.poll())
        d.answer(ok(epoch, **timing))
    assert d.m.phase is Phase.MEMBER
    assert d.running == assignment
    assert d.in_flight is None
    return d


# --- joining and the heartbeat's fields --------------------------------------------------------


def test_first_poll_sends_a_full_join_at_epoch_0_with_every_field() -> None:
    d = Driver.new(instance_id="pod-0")
    actions = d.poll(0)
    assert len(actions) == 1
    join = only_heartbeat(actions)
    assert_full(join, d.config, JOIN_EPOCH, EMPTY)
    assert join.owned is not None  # present and empty: "runs nothing", not "unchanged"
    assert join.instance_id == "pod-0"
    assert d.m.phase is Phase.JOINING
    assert not d.m.ready


def test_join_answer_makes_a_member_at_the_coordinators_epoch() -> None:
    d = Driver.new()
    d.poll(0)
    d.answer(ok(4, EMPTY, interval=2_000, session=8_000), at=10)
    assert d.m.phase is Phase.MEMBER
    assert d.m.epoch == 4
    assert d.m.ready
    assert d.m.heartbeat_interval_ms == 2_000
    assert d.m.session_timeout_ms == 8_000
    assert d.m.last_success_sent_ms == 0


def test_no_second_heartbeat_while_one_is_in_flight() -> None:
    d = Driver.new()
    d.poll(0)
    assert heartbeats(d.poll_until(3 * SESSION, step=250)) == []
    d.answer(ok(1, EMPTY))
    assert d.m.epoch == 1


def test_next_heartbeat_only_after_the_interval_and_carries_only_changed_fields() -> None:
    d = joined(rs("A"), epoch=2)
    assert heartbeats(d.poll_until(INTERVAL - 1, step=100)) == []
    assert heartbeats(d.poll(INTERVAL - 1)) == []
    req = only_heartbeat(d.poll(INTERVAL))
    assert_partial(req, epoch=2, owned=None)
    d.answer(ok(2), at=INTERVAL + 40)
    assert heartbeats(d.poll(2 * INTERVAL + 39)) == []
    assert_partial(only_heartbeat(d.poll(2 * INTERVAL + 40)), epoch=2, owned=None)


def test_heartbeat_interval_comes_from_the_last_response() -> None:
    d = Driver.new()
    d.poll(0)
    d.answer(ok(1, EMPTY, interval=700))
    assert heartbeats(d.poll(699)) == []
    only_heartbeat(d.poll(700))
    d.answer(ok(1, interval=1_500))
    assert heartbeats(d.poll(2_199)) == []
    only_heartbeat(d.poll(2_200))


def test_unchanged_owned_list_is_never_repeated_in_later_heartbeats() -> None:
    d = joined(rs("A", "A-0"))
    for k in range(1, 5):
        req = only_heartbeat(d.poll(k * INTERVAL))
        assert req.owned is None, f"heartbeat {k} repeated an unchanged owned list"
        d.answer(ok(1))


def test_owned_is_sent_when_what_runs_changed() -> None:
    d = joined(rs("A"))
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(2, rs("A", "B")))
    d.poll()
    d.started(at=INTERVAL + 5)
    assert_partial(only_heartbeat(d.poll()), epoch=2, owned=rs("A", "B"))


def test_heartbeat_without_url_or_instance_id_leaves_them_absent_on_the_join() -> None:
    d = Driver.new(url=None, instance_id=None)
    join = only_heartbeat(d.poll(0))
    assert join.url is None
    assert join.instance_id is None
    assert join.rebalance_timeout_ms == REBALANCE_TIMEOUT
    assert join.client_assignors == ASSIGNORS


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.UNKNOWN_SERVER_ERROR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ],
)
def test_first_heartbeat_after_an_error_response_is_full_then_partial_again(
    code: ErrorCode,
) -> None:
    d = joined(rs("A", "A-0"), epoch=3)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(code))
    retry = only_heartbeat(d.poll_until(INTERVAL + INTERVAL, step=10))
    assert_full(retry, d.config, 3, rs("A", "A-0"))
    d.answer(ok(3))
    t = d.now
    assert_partial(only_heartbeat(d.poll(t + INTERVAL)), epoch=3, owned=None)


def test_first_heartbeat_after_a_transport_failure_is_full() -> None:
    d = joined(rs("A"), epoch=2, instance_id="pod-1")
    only_heartbeat(d.poll(INTERVAL))
    d.fail()
    retry = only_heartbeat(d.poll_until(INTERVAL + INTERVAL, step=10))
    assert_full(retry, d.config, 2, rs("A"))
    assert retry.instance_id == "pod-1"


def test_an_error_response_is_ignored_apart_from_its_code() -> None:
    """Only error_code/error_message are meaningful unless NONE or COMPUTE_ASSIGNMENT."""
    d = joined(rs("A", "A-0"), epoch=3)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(
        HeartbeatResponse(ErrorCode.UNKNOWN_SERVER_ERROR, "boom", 9, 5, 5, AssignmentMessage(EMPTY))
    )
    actions = d.poll_until(2 * INTERVAL, step=10)
    assert of_type(actions, StopWork) == []
    assert d.m.epoch == 3
    assert d.m.assigned == rs("A", "A-0")
    assert d.m.heartbeat_interval_ms == INTERVAL
    assert d.m.session_timeout_ms == SESSION
    assert d.m.phase is Phase.MEMBER


# --- assignment ---------------------------------------------------------------------------------


def test_assignment_starts_exactly_the_new_resources_then_reports_them_at_once() -> None:
    d = joined(rs("A", "A-0"), epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(2, rs("A", "A-0", "B", "B-0")), at=INTERVAL + 10)
    actions = d.poll()
    assert of_type(actions, StartWork) == [StartWork(rs("B", "B-0"), 2)]
    assert of_type(actions, StopWork) == []
    assert heartbeats(actions) == []
    assert of_type(d.poll(INTERVAL + 500), StartWork) == []  # not twice while starting
    d.started(at=INTERVAL + 600)
    report = only_heartbeat(d.poll())
    assert_partial(report, epoch=2, owned=rs("A", "A-0", "B", "B-0"))


def test_join_assignment_is_started_and_reported() -> None:
    d = Driver.new()
    d.poll(0)
    d.answer(ok(5, rs("A", "A-0", "A-1")))
    assert d.poll(1) == [StartWork(rs("A", "A-0", "A-1"), 5)]
    d.started(at=300)
    assert_partial(only_heartbeat(d.poll()), epoch=5, owned=rs("A", "A-0", "A-1"))


def test_absent_assignment_keeps_what_runs() -> None:
    d = joined(rs("A", "A-0"), epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(2))
    actions = d.poll_until(2 * INTERVAL - 1, step=50)
    assert of_type(actions, StopWork) == []
    assert of_type(actions, StartWork) == []
    assert d.m.assigned == rs("A", "A-0")
    assert d.m.epoch == 2


def test_empty_assignment_means_run_nothing() -> None:
    d = joined(rs("A", "A-0"), epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(1, EMPTY))
    assert of_type(d.poll(), StopWork) == [StopWork(rs("A", "A-0"), 1, "revoked")]


def test_ready_only_as_a_member_with_a_successful_heartbeat() -> None:
    d = Driver.new()
    assert not d.m.ready
    d.poll(0)
    assert not d.m.ready
    d.answer(ok(1, EMPTY))
    assert d.m.ready
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(ErrorCode.FENCED_MEMBER_EPOCH))
    assert not d.m.ready


# --- revocation ---------------------------------------------------------------------------------


def revoking(**overrides: Any) -> Driver:
    """A member running A, A-0, B, B-0 told at INTERVAL (epoch 1) to keep only A, A-0."""
    d = joined(rs("A", "A-0", "B", "B-0"), epoch=1, **overrides)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(1, rs("A", "A-0")))
    return d


def test_revocation_stops_exactly_the_revoked_resources() -> None:
    d = revoking()
    actions = d.poll()
    assert of_type(actions, StopWork) == [StopWork(rs("B", "B-0"), 1, "revoked")]
    assert of_type(actions, StartWork) == []
    assert of_type(d.poll(d.now + 1), StopWork) == []  # not twice while stopping


def test_no_heartbeat_acknowledges_the_revocation_before_work_stopped() -> None:
    d = revoking()
    d.poll()
    old = rs("A", "A-0", "B", "B-0")
    for t in range(d.now, d.now + 4 * INTERVAL, 100):
        for req in heartbeats(d.poll(t)):
            assert req.owned is None or req.owned == old, req
            d.answer(ok(1))
    assert d.stops, "still stopping"


def test_acknowledgement_goes_out_at_once_after_work_stopped() -> None:
    d = revoking()
    d.poll()
    if d.in_flight is not None:  # a heartbeat sent meanwhile: answered before the stop ends
        d.answer(ok(1))
    d.stopped(at=INTERVAL + 1_234)
    ack = only_heartbeat(d.poll())  # same `now`
    assert_partial(ack, epoch=1, owned=rs("A", "A-0"))
    assert d.now == INTERVAL + 1_234


def test_heartbeats_while_revoking_keep_the_heartbeat_interval() -> None:
    d = revoking()
    start = d.now
    count = 0
    for t in range(start, start + INTERVAL, 10):
        for _ in heartbeats(d.poll(t)):
            count += 1
            d.answer(ok(1), at=t + 5)
    assert count <= 1, f"{count} heartbeats within one interval while revoking"


def test_acknowledgement_goes_out_right_after_an_in_flight_heartbeat_is_answered() -> None:
    d = revoking()
    d.poll()
    if d.in_flight is None:  # make sure a heartbeat is in flight when the stop completes
        only_heartbeat(d.poll(d.now + INTERVAL))
    sent_at = d.now
    d.stopped(at=sent_at + 20)
    assert heartbeats(d.poll()) == []  # one in flight
    d.answer(ok(1), at=sent_at + 50)
    ack = only_heartbeat(d.poll())
    assert ack.owned == rs("A", "A-0")


def test_nothing_new_is_started_while_something_is_left_to_revoke() -> None:
    d = joined(rs("A", "B"), epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(1, rs("A", "C")))  # not what the coordinator sends, but must be safe
    actions = d.poll()
    assert of_type(actions, StopWork) == [StopWork(rs("B"), 1, "revoked")]
    assert of_type(actions, StartWork) == []
    for t in range(d.now, d.now + 2 * INTERVAL, 100):
        assert of_type(d.poll(t), StartWork) == []
        if d.in_flight is not None:
            d.answer(ok(1))
    d.stopped()
    actions = d.poll()
    assert of_type(actions, StartWork) == [StartWork(rs("C"), 1)]


def test_revocation_then_assignment_at_the_next_epoch() -> None:
    d = revoking()
    d.poll()
    if d.in_flight is not None:
        d.answer(ok(1))
    d.stopped()
    only_heartbeat(d.poll())
    d.answer(ok(2, rs("A", "A-0", "C")))
    assert of_type(d.poll(), StartWork) == [StartWork(rs("C"), 2)]
    assert d.m.epoch == 2


def test_a_further_shrink_while_stopping_is_stopped_after_the_first_stop() -> None:
    d = revoking()
    d.poll()
    if d.in_flight is None:
        only_heartbeat(d.poll(d.now + INTERVAL))
    d.answer(ok(1, rs("A")))
    assert of_type(d.poll(), StopWork) == []
    assert d.stopped().resources == rs("B", "B-0")
    actions = d.poll()
    assert of_type(actions, StopWork) == [StopWork(rs("A-0"), 1, "revoked")]
    assert heartbeats(actions) == [] or heartbeats(actions)[0].owned in (None, rs("A", "A-0"))


# --- COMPUTE_ASSIGNMENT ---------------------------------------------------------------------------


def test_compute_assignment_asks_once_and_applies_the_rest_of_the_response() -> None:
    d = joined(rs("A"), epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(2, rs("A", "B"), code=ErrorCode.COMPUTE_ASSIGNMENT, interval=1_000))
    actions = d.poll()
    assert of_type(actions, ComputeAssignment) == [ComputeAssignment(2)]
    assert of_type(actions, StartWork) == [StartWork(rs("B"), 2)]
    assert d.m.epoch == 2
    assert d.m.heartbeat_interval_ms == 1_000
    assert d.m.ready
    assert of_type(d.poll(d.now + 1), ComputeAssignment) == []


def test_compute_assignment_not_asked_again_while_computing() -> None:
    d = joined(EMPTY, epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(1, code=ErrorCode.COMPUTE_ASSIGNMENT))
    assert of_type(d.poll(), ComputeAssignment) == [ComputeAssignment(1)]
    for k in range(2, 6):
        only_heartbeat(d.poll(k * INTERVAL))
        d.answer(ok(1, code=ErrorCode.COMPUTE_ASSIGNMENT))
        assert of_type(d.poll(), ComputeAssignment) == []


def test_compute_assignment_again_after_compute_done_when_asked_again() -> None:
    d = joined(EMPTY, epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(1, code=ErrorCode.COMPUTE_ASSIGNMENT))
    d.poll()
    d.computed(at=INTERVAL + 100)
    actions = d.poll()
    assert of_type(actions, ComputeAssignment) == []
    only_heartbeat(actions)  # heartbeats at once to learn the outcome
    d.answer(ok(2, code=ErrorCode.COMPUTE_ASSIGNMENT))
    assert of_type(d.poll(), ComputeAssignment) == [ComputeAssignment(2)]


def test_repeats_received_while_computing_are_ignored_not_replayed() -> None:
    d = joined(EMPTY, epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(1, code=ErrorCode.COMPUTE_ASSIGNMENT))
    d.poll()
    only_heartbeat(d.poll(2 * INTERVAL))
    d.answer(ok(1, code=ErrorCode.COMPUTE_ASSIGNMENT))  # the repeat, while computing
    d.computed(at=2 * INTERVAL + 100)
    assert of_type(d.poll(), ComputeAssignment) == []


def test_compute_assignment_is_a_success_for_self_fencing() -> None:
    d = joined(rs("A"), epoch=1)
    for k in range(1, 8):
        only_heartbeat(d.poll(k * INTERVAL))
        d.answer(ok(1, code=ErrorCode.COMPUTE_ASSIGNMENT))
    assert d.m.phase is Phase.MEMBER
    assert all(not isinstance(a, StopWork) for _, a in d.log)


# --- FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID ------------------------------------------------------


@pytest.mark.parametrize("code", [ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID])
def test_lost_membership_stops_everything_then_rejoins_at_epoch_0(code: ErrorCode) -> None:
    d = joined(rs("A", "A-0", "B"), epoch=4, instance_id="pod-2")
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(code))
    actions = d.poll()
    assert of_type(actions, StopWork) == [
        StopWork(rs("A", "A-0", "B"), JOIN_EPOCH, "membership lost")
    ]
    assert heartbeats(actions) == []
    assert not d.m.ready
    assert heartbeats(d.poll_until(d.now + 2 * INTERVAL, step=50)) == []
    d.stopped()
    join = only_heartbeat(d.poll())
    assert_full(join, d.config, JOIN_EPOCH, EMPTY)
    assert d.m.phase is Phase.JOINING
    d.answer(ok(6, rs("B")))
    assert of_type(d.poll(), StartWork) == [StartWork(rs("B"), 6)]


def test_lost_membership_with_nothing_running_rejoins_at_once() -> None:
    d = joined(EMPTY, epoch=2)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(ErrorCode.UNKNOWN_MEMBER_ID))
    actions = d.poll()
    assert of_type(actions, StopWork) == []
    assert_full(only_heartbeat(actions), d.config, JOIN_EPOCH, EMPTY)


def test_lost_membership_during_a_revocation_stops_the_rest_before_rejoining() -> None:
    d = revoking()
    d.poll()
    if d.in_flight is None:
        only_heartbeat(d.poll(d.now + INTERVAL))
    d.answer(error(ErrorCode.FENCED_MEMBER_EPOCH))
    assert heartbeats(d.poll()) == []
    assert d.stopped().resources == rs("B", "B-0")
    actions = d.poll()
    assert of_type(actions, StopWork) == [StopWork(rs("A", "A-0"), JOIN_EPOCH, "membership lost")]
    assert heartbeats(actions) == []
    d.stopped()
    assert_full(only_heartbeat(d.poll()), d.config, JOIN_EPOCH, EMPTY)


def test_rejoin_waits_for_an_outstanding_start_and_stops_it_first() -> None:
    d = Driver.new()
    d.poll(0)
    d.answer(ok(1, rs("A", "A-0")))
    d.poll()  # StartWork outstanding
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(ErrorCode.FENCED_MEMBER_EPOCH))
    assert heartbeats(d.poll()) == [], "rejoined while a start was still in progress"
    d.started()
    assert of_type(d.poll(), StopWork) == [StopWork(rs("A", "A-0"), JOIN_EPOCH, "membership lost")]
    d.stopped()
    assert only_heartbeat(d.poll()).member_epoch == JOIN_EPOCH


def test_fenced_instance_id_stops_everything_and_never_heartbeats_with_that_instance_id() -> None:
    d = joined(rs("A", "A-0"), epoch=3, instance_id="pod-0")
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(ErrorCode.FENCED_INSTANCE_ID))
    stops = of_type(d.poll(), StopWork)
    assert [s.resources for s in stops] == [rs("A", "A-0")]
    d.stopped()
    for t in range(d.now, d.now + 3 * SESSION, 50):
        for req in heartbeats(d.poll(t)):
            assert req.instance_id is None and req.member_epoch == JOIN_EPOCH, req
            d.answer(error(ErrorCode.FENCED_INSTANCE_ID))
    assert any(n.level == "error" for n in d.m.drain_notices())
    assert d.m.phase is Phase.LEFT  # the agent may exit
    assert not d.m.ready


def test_fenced_instance_id_waits_for_an_outstanding_start_and_stops_it() -> None:
    d = Driver.new(instance_id="pod-0")
    d.poll(0)
    d.answer(ok(1, rs("A")))
    d.poll()  # StartWork outstanding
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(ErrorCode.FENCED_INSTANCE_ID))
    assert d.poll() == []
    assert d.m.phase is not Phase.LEFT
    d.started()
    assert [s.resources for s in of_type(d.poll(), StopWork)] == [rs("A")]
    d.stopped()
    assert heartbeats(d.poll_until(d.now + SESSION, step=100)) == []
    assert d.m.phase is Phase.LEFT


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.UNSUPPORTED_ASSIGNOR,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_GROUP_ID,
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ],
)
def test_a_join_refused_for_good_is_not_retried_unchanged(code: ErrorCode) -> None:
    d = Driver.new()
    join = only_heartbeat(d.poll(0))
    d.answer(error(code), at=5)
    for t in range(5, 3 * SESSION, 25):
        for req in heartbeats(d.poll(t)):
            assert req != join, f"the refused join was re-sent unchanged at {t}"
            d.answer(error(code))
    assert any(n.level == "error" for n in d.m.drain_notices())


# --- configuration errors of a join (DESIGN 3.19: migration policy, group.version) -------------

#: The coordinator's messages (coordinator_svc/core/mixed_group.py, "Feature flag" in DESIGN 3.19).
REFUSALS = {
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: (
        "group 'g' is a classic group with members, and its group.protocol.migration.policy is "
        "'downgrade', which does not allow converting it to the connect protocol"
    ),
    ErrorCode.UNSUPPORTED_VERSION: "group.version is 0: no new connect-protocol member",
}
#: What the agent tells the operator to do, per code.
FIXES = {
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: (
        "change the policy (coordinator-svc alter-configs GROUP --set "
        "group.protocol.migration.policy=upgrade, or bidirectional), or run this worker with "
        "--group-protocol classic"
    ),
    ErrorCode.UNSUPPORTED_VERSION: (
        "run this worker with --group-protocol classic, or raise group.version to 1 "
        "(coordinator-svc features update --feature group.version --level 1)"
    ),
}
CONFIGURATION_CODES = list(REFUSALS)


def assert_says_what_to_do(d: Driver, code: ErrorCode) -> None:
    """The fatal reason (the agent's exit line) and the one ERROR notice name the code, the
    coordinator's message and the fix."""
    assert d.m.fatal is not None
    assert d.m.fatal.startswith(f"{code.name}: {REFUSALS[code]} [configuration error: ")
    assert d.m.fatal.endswith(FIXES[code] + "]"), d.m.fatal
    errors = [n.message for n in d.m.drain_notices() if n.level == "error"]
    assert len(errors) == 1 and d.m.fatal in errors[0], errors


@pytest.mark.parametrize("code", CONFIGURATION_CODES)
def test_a_join_refused_as_a_configuration_error_is_fatal_and_never_retried(
    code: ErrorCode,
) -> None:
    d = Driver.new()
    only_heartbeat(d.poll(0))
    d.answer(error(code, REFUSALS[code]), at=5)
    assert d.poll(5) == []  # nothing runs, nothing to stop: done at once
    assert d.m.phase is Phase.LEFT  # the agent exits
    assert_says_what_to_do(d, code)
    assert heartbeats(d.poll_until(5 + 3 * SESSION, step=50)) == []
    assert len(d.sent) == 1


@pytest.mark.parametrize("code", CONFIGURATION_CODES)
def test_a_rejoin_refused_as_a_configuration_error_exits_after_stopping_everything(
    code: ErrorCode,
) -> None:
    """Membership lost while running work: everything is stopped before the rejoin, and the
    refused rejoin then ends the agent (no second rejoin, nothing started again)."""
    d = joined(rs("A", "A-0", "B"), epoch=4)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(ErrorCode.FENCED_MEMBER_EPOCH))
    d.poll()
    assert d.stopped().reason == "membership lost"
    rejoin = only_heartbeat(d.poll())
    assert rejoin.member_epoch == JOIN_EPOCH
    d.answer(error(code, REFUSALS[code]))
    assert d.poll() == []
    assert d.m.phase is Phase.LEFT and d.running == EMPTY and not d.m.ready
    assert_says_what_to_do(d, code)
    assert heartbeats(d.poll_until(d.now + 3 * SESSION, step=50)) == []
    joins = [req for _, req in d.sent if req.member_epoch == JOIN_EPOCH]
    assert len(joins) == 2  # the first join and the refused rejoin: never another
    assert len([a for _, a in d.log if isinstance(a, StartWork)]) == 1  # nothing started again


@pytest.mark.parametrize("code", CONFIGURATION_CODES)
def test_a_configuration_error_answered_to_an_admitted_member_stops_its_work_and_exits(
    code: ErrorCode,
) -> None:
    """The coordinator checks both on a join only; were a member's heartbeat answered so, it is
    fatal too: everything is stopped (no heartbeat meanwhile), then the agent exits."""
    d = joined(rs("A", "A-0"), epoch=3)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(code, REFUSALS[code]))
    assert of_type(d.poll(), StopWork) == [StopWork(rs("A", "A-0"), JOIN_EPOCH, "fatal error")]
    assert_says_what_to_do(d, code)
    assert heartbeats(d.poll_until(d.now + SESSION, step=50)) == []
    assert d.m.phase is Phase.STOPPING
    d.stopped()
    assert d.poll() == [] and d.m.phase is Phase.LEFT
    assert heartbeats(d.poll_until(d.now + 3 * SESSION, step=50)) == []


# --- coordinator moves ----------------------------------------------------------------------------


@pytest.mark.parametrize("code", [ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE])
def test_not_coordinator_asks_find_coordinator_and_waits_for_it(code: ErrorCode) -> None:
    d = joined(rs("A"), epoch=2)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(code), at=INTERVAL + 5)
    actions = d.poll()
    assert len(of_type(actions, FindCoordinator)) == 1
    assert of_type(actions, StopWork) == []
    # no heartbeat and no second FindCoordinator until found (well inside the fencing time)
    assert heartbeats(d.poll_until(FENCE_AFTER - 100, step=10)) == []
    assert len(d.finds) == 1
    d.found()
    retry = only_heartbeat(d.poll())
    assert_full(retry, d.config, 2, rs("A"))
    d.answer(ok(2))
    assert d.m.phase is Phase.MEMBER
    assert d.running == rs("A")


def test_load_in_progress_retries_the_same_coordinator_without_find_coordinator() -> None:
    d = joined(rs("A"), epoch=2)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
    actions = d.poll_until(d.now + INTERVAL, step=10)
    assert of_type(actions, FindCoordinator) == []
    assert_full(only_heartbeat(actions), d.config, 2, rs("A"))


def test_coordinator_found_alone_does_not_cause_a_second_heartbeat_in_flight() -> None:
    d = joined(rs("A"), epoch=2)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(ErrorCode.NOT_COORDINATOR))
    d.poll()
    d.found(at=INTERVAL + 500)
    only_heartbeat(d.poll())
    assert heartbeats(d.poll_until(d.now + SESSION // 2, step=50)) == []  # in flight


# --- transport failures --------------------------------------------------------------------------


def retry_delays(d: Driver, failures: int) -> list[int]:
    """Fail `failures` heartbeats in a row; return the delay before each retry."""
    delays: list[int] = []
    for _ in range(failures):
        failed_at = d.now
        d.fail()
        t = failed_at
        while True:
            actions = d.poll(t)
            if d.finds:
                d.found()
                actions += d.poll()
            if heartbeats(actions):
                break
            t += 1
        delays.append(d.now - failed_at)
    return delays


def test_transport_failures_retry_with_growing_capped_backoff() -> None:
    d = joined(
        rs("A"), epoch=1, initial_heartbeat_interval_ms=10_000, initial_session_timeout_ms=600_000
    )
    only_heartbeat(d.poll(10_000))
    delays = retry_delays(d, 10)
    assert delays[0] < 10_000
    assert delays[1] > delays[0]
    assert delays[2] > delays[1]
    assert all(b >= a for a, b in itertools.pairwise(delays))
    assert max(delays) <= MAX_RETRY_BACKOFF_MS
    assert delays[-1] == delays[-2] == MAX_RETRY_BACKOFF_MS  # capped
    assert d.m.phase is Phase.MEMBER


def test_backoff_never_exceeds_the_heartbeat_interval() -> None:
    d = joined(
        rs("A"), epoch=1, initial_heartbeat_interval_ms=300, initial_session_timeout_ms=600_000
    )
    only_heartbeat(d.poll(300))
    assert max(retry_delays(d, 8)) <= 300


def test_a_success_resets_the_backoff() -> None:
    d = joined(
        rs("A"), epoch=1, initial_heartbeat_interval_ms=10_000, initial_session_timeout_ms=600_000
    )
    only_heartbeat(d.poll(10_000))
    first = retry_delays(d, 2)
    d.answer(ok(1, interval=10_000, session=600_000))
    only_heartbeat(d.poll(d.now + 10_000))
    assert retry_delays(d, 2) == first


def test_find_coordinator_after_repeated_transport_failures() -> None:
    d = joined(
        rs("A"), epoch=1, initial_heartbeat_interval_ms=10_000, initial_session_timeout_ms=600_000
    )
    only_heartbeat(d.poll(10_000))
    d.fail()
    assert of_type(d.poll_until(d.now + 100, step=1), FindCoordinator) == []
    d.fail()
    assert of_type(d.poll_until(d.now + 200, step=1), FindCoordinator) == []
    d.fail()
    actions = d.poll()
    assert len(of_type(actions, FindCoordinator)) == 1
    assert heartbeats(d.poll_until(d.now + 5_000, step=10)) == []
    d.found()
    assert_full(only_heartbeat(d.poll()), d.config, 1, rs("A"))


@pytest.mark.parametrize(
    "code", [ErrorCode.GROUP_MAX_SIZE_REACHED, ErrorCode.UNRELEASED_INSTANCE_ID]
)
def test_a_refused_join_is_retried_as_a_full_join_after_a_backoff(code: ErrorCode) -> None:
    d = Driver.new(instance_id="pod-0")
    d.poll(0)
    d.answer(error(code), at=10)
    assert heartbeats(d.poll(10)) == []
    retry = only_heartbeat(d.poll_until(10 + INTERVAL, step=1))
    assert 10 < d.now <= 10 + INTERVAL
    assert_full(retry, d.config, JOIN_EPOCH, EMPTY)
    assert d.m.phase is Phase.JOINING


def test_unknown_server_error_keeps_epoch_and_work() -> None:
    d = joined(rs("A", "A-0"), epoch=5)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(ErrorCode.UNKNOWN_SERVER_ERROR))
    actions = d.poll_until(d.now + INTERVAL, step=10)
    assert of_type(actions, StopWork) == []
    assert_full(only_heartbeat(actions), d.config, 5, rs("A", "A-0"))
    d.answer(ok(5))
    assert d.m.phase is Phase.MEMBER


# --- self-fencing ---------------------------------------------------------------------------------


def test_self_fence_exactly_at_session_timeout_minus_one_interval_then_rejoin() -> None:
    d = joined(rs("A", "A-0"), epoch=3)  # last success sent at 0
    only_heartbeat(d.poll(INTERVAL))  # never answered: the coordinator hangs
    assert of_type(d.poll_until(FENCE_AFTER - 1, step=1), StopWork) == []
    assert d.m.phase is Phase.MEMBER
    actions = d.poll(FENCE_AFTER)
    assert of_type(actions, StopWork) == [StopWork(rs("A", "A-0"), JOIN_EPOCH, "membership lost")]
    assert d.m.phase is not Phase.MEMBER
    assert not d.m.ready
    assert any(n.level == "warning" for n in d.m.drain_notices())
    d.fail(at=FENCE_AFTER + 10)
    assert heartbeats(d.poll_until(FENCE_AFTER + 2 * INTERVAL, step=10)) == []  # still stopping
    d.stopped()
    assert_full(only_heartbeat(d.poll()), d.config, JOIN_EPOCH, EMPTY)


def test_self_fence_is_measured_from_when_the_last_success_was_sent() -> None:
    d = joined(rs("A"), epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(1), at=INTERVAL + 2_500)  # a slow answer: sent at 3000
    only_heartbeat(d.poll(2 * INTERVAL + 2_500))  # never answered
    assert of_type(d.poll(INTERVAL + FENCE_AFTER - 1), StopWork) == []
    assert of_type(d.poll(INTERVAL + FENCE_AFTER), StopWork) == [
        StopWork(rs("A"), JOIN_EPOCH, "membership lost")
    ]


def test_error_answers_do_not_postpone_self_fencing() -> None:
    d = joined(rs("A"), epoch=1)
    stopped_at: int | None = None
    for t in range(INTERVAL, SESSION + 1, 10):
        actions = d.poll(t)
        if of_type(actions, StopWork):
            stopped_at = t
            break
        if d.in_flight is not None:
            d.answer(error(ErrorCode.UNKNOWN_SERVER_ERROR))
    assert stopped_at == FENCE_AFTER


def test_self_fence_uses_the_coordinators_smaller_session_timeout() -> None:
    d = joined(rs("A"), epoch=1, initial_session_timeout_ms=60_000)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(1, session=SESSION))  # sent at 3000
    only_heartbeat(d.poll(2 * INTERVAL))  # never answered
    assert of_type(d.poll(INTERVAL + FENCE_AFTER - 1), StopWork) == []
    assert of_type(d.poll(INTERVAL + FENCE_AFTER), StopWork) != []


def test_self_fence_uses_the_coordinators_larger_session_timeout_from_the_last_response() -> None:
    d = Driver.new()
    d.poll(0)
    d.answer(ok(1, rs("A"), session=30_000))
    d.poll()
    d.started()
    only_heartbeat(d.poll())
    d.answer(ok(1, session=10_000))  # the last response lowers it again...
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(1, session=30_000))  # ...and raises it: sent at 3000
    only_heartbeat(d.poll(2 * INTERVAL))  # never answered
    # the initial (and previous) 10 s would have fenced at 10 000
    assert of_type(d.poll_until(INTERVAL + 15_000, step=100), StopWork) == []
    # a margin of at least one interval: fenced by session - interval after the send
    assert of_type(d.poll_until(INTERVAL + 30_000 - INTERVAL, step=100), StopWork) != []


def test_self_fence_margin_is_at_least_one_heartbeat_interval() -> None:
    d = joined(
        rs("A"), epoch=1, initial_heartbeat_interval_ms=4_000, initial_session_timeout_ms=10_000
    )
    only_heartbeat(d.poll(4_000))  # never answered
    assert of_type(d.poll_until(10_000 - 4_000, step=10), StopWork) != []


def test_no_self_fence_while_heartbeats_succeed() -> None:
    d = joined(rs("A"), epoch=1)
    for t in range(INTERVAL, 20 * SESSION, 50):
        actions = d.poll(t)
        assert of_type(actions, StopWork) == []
        if d.in_flight is not None:
            d.answer(ok(1), at=t + 40)
    assert d.m.phase is Phase.MEMBER


def test_self_fence_while_finding_the_coordinator() -> None:
    d = joined(rs("A"), epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(ErrorCode.NOT_COORDINATOR))
    d.poll()
    assert d.finds
    assert of_type(d.poll(FENCE_AFTER - 1), StopWork) == []
    assert of_type(d.poll(FENCE_AFTER), StopWork) != []


def test_a_late_answer_to_a_heartbeat_sent_before_the_self_fence_is_ignored() -> None:
    d = joined(rs("A"), epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    d.poll(FENCE_AFTER)
    d.stopped(at=FENCE_AFTER + 10)
    d.answer(ok(2, rs("A", "B"), code=ErrorCode.COMPUTE_ASSIGNMENT), at=FENCE_AFTER + 20)
    actions = d.poll()
    assert of_type(actions, StartWork) == []
    assert of_type(actions, ComputeAssignment) == []
    assert d.m.epoch == JOIN_EPOCH
    assert d.m.assigned == EMPTY
    assert_full(only_heartbeat(actions), d.config, JOIN_EPOCH, EMPTY)
    d.answer(ok(4, rs("B")))
    assert d.m.epoch == 4
    assert of_type(d.poll(), StartWork) == [StartWork(rs("B"), 4)]


def test_next_wakeup_is_the_next_heartbeat_in_steady_state() -> None:
    d = joined(rs("A"), epoch=1)
    assert d.m.next_wakeup_ms() == INTERVAL
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(1), at=INTERVAL + 30)
    assert d.m.next_wakeup_ms() == 2 * INTERVAL + 30


def test_next_wakeup_with_a_heartbeat_in_flight_is_no_later_than_the_fence() -> None:
    d = joined(rs("A"), epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    assert INTERVAL < d.m.next_wakeup_ms() <= FENCE_AFTER


def test_next_wakeup_is_later_than_now_while_waiting_only_for_work_stopped() -> None:
    d = joined(rs("A"), epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(ErrorCode.FENCED_MEMBER_EPOCH), at=INTERVAL + 10)
    assert of_type(d.poll(), StopWork) != []
    assert d.poll() == []
    assert d.m.next_wakeup_ms() > d.now


# --- leave ----------------------------------------------------------------------------------------


def test_leave_stops_everything_then_sends_epoch_minus_1_then_left() -> None:
    d = joined(rs("A", "A-0"), epoch=3)
    d.leave(at=100)
    actions = d.poll()
    assert of_type(actions, StopWork) == [StopWork(rs("A", "A-0"), 3, "leaving")]
    assert heartbeats(actions) == []
    # While it stops it only keeps its session (epoch 3, never the leave).
    keepalives = heartbeats(d.poll_until(100 + INTERVAL // 2, step=10))
    assert [h.member_epoch for h in keepalives] in ([], [3])
    d.stopped()
    leave = only_heartbeat(d.poll())
    assert leave.member_epoch == LEAVE_EPOCH
    assert (leave.group_id, leave.member_id) == ("g", "w1")
    assert d.m.phase is Phase.LEAVING
    d.answer(HeartbeatResponse(member_epoch=LEAVE_EPOCH))
    assert d.m.phase is Phase.LEFT
    assert d.poll_until(d.now + 3 * SESSION, step=100) == []


def test_a_leaving_member_keeps_heartbeating_while_it_stops_its_work() -> None:
    d = joined(rs("A", "A-0"), epoch=3)
    d.leave(at=100)
    assert of_type(d.poll(), StopWork) == [StopWork(rs("A", "A-0"), 3, "leaving")]
    sent: list[HeartbeatRequest] = []
    for t in range(100, 100 + 2 * SESSION, 50):
        for req in heartbeats(d.poll(t)):
            sent.append(req)
            d.answer(ok(3))
    assert d.stops, "still stopping"
    assert len(sent) >= (2 * SESSION) // INTERVAL - 1, "no heartbeats while stopping to leave"
    assert all(req.member_epoch == 3 for req in sent)  # not the leave: that comes after the stop
    assert all(req.owned in (None, rs("A", "A-0")) for req in sent)
    d.stopped()
    assert only_heartbeat(d.poll_until(d.now + INTERVAL, step=10)).member_epoch == LEAVE_EPOCH


def test_static_member_leaves_with_epoch_minus_2() -> None:
    d = joined(rs("A"), epoch=3, instance_id="pod-7")
    d.leave(at=100)
    d.poll()
    d.stopped()
    leave = only_heartbeat(d.poll())
    assert leave.member_epoch == STATIC_LEAVE_EPOCH
    assert leave.instance_id == "pod-7"
    d.answer(HeartbeatResponse(member_epoch=STATIC_LEAVE_EPOCH))
    assert d.m.phase is Phase.LEFT


def test_leave_with_nothing_running_sends_the_leave_at_once() -> None:
    d = joined(EMPTY, epoch=2)
    d.leave(at=50)
    assert only_heartbeat(d.poll()).member_epoch == LEAVE_EPOCH


def test_leave_before_joining_sends_nothing() -> None:
    d = Driver.new()
    d.leave(at=0)
    assert d.poll_until(3 * SESSION, step=100) == []
    assert d.m.phase is Phase.LEFT


def test_leave_after_losing_membership_sends_nothing() -> None:
    d = joined(rs("A"), epoch=2)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(error(ErrorCode.FENCED_MEMBER_EPOCH))
    d.poll()
    d.leave()
    assert heartbeats(d.poll()) == []
    d.stopped()
    assert heartbeats(d.poll_until(d.now + SESSION, step=100)) == []
    assert d.m.phase is Phase.LEFT


def test_leave_while_the_join_is_in_flight_leaves_properly_and_starts_nothing() -> None:
    d = Driver.new()
    d.poll(0)
    d.leave(at=10)
    assert d.poll() == []
    d.answer(ok(3, rs("A")), at=20)
    actions = d.poll()
    assert of_type(actions, StartWork) == []
    assert only_heartbeat(actions).member_epoch == LEAVE_EPOCH
    d.answer(HeartbeatResponse(member_epoch=LEAVE_EPOCH))
    assert d.m.phase is Phase.LEFT


def test_leave_ignores_an_answer_to_a_heartbeat_sent_before_it() -> None:
    d = joined(rs("A"), epoch=2)
    only_heartbeat(d.poll(INTERVAL))
    d.leave(at=INTERVAL + 10)
    assert of_type(d.poll(), StopWork) == [StopWork(rs("A"), 2, "leaving")]
    d.answer(ok(3, rs("A", "B"), code=ErrorCode.COMPUTE_ASSIGNMENT))
    actions = d.poll()
    assert of_type(actions, StartWork) == []
    assert of_type(actions, ComputeAssignment) == []
    d.stopped()
    assert only_heartbeat(d.poll()).member_epoch == LEAVE_EPOCH


def test_leave_during_a_revocation_stops_the_rest_with_reason_leaving() -> None:
    d = revoking()
    d.poll()
    if d.in_flight is not None:
        d.answer(ok(1))
    d.leave()
    assert d.stopped().resources == rs("B", "B-0")
    actions = d.poll()
    assert of_type(actions, StopWork) == [StopWork(rs("A", "A-0"), 1, "leaving")]
    # The revocation of B is acknowledged at once (a keepalive at epoch 1, never the leave).
    assert [(h.member_epoch, h.owned) for h in heartbeats(actions)] == [(1, rs("A", "A-0"))]
    d.answer(ok(1))
    d.stopped()
    assert only_heartbeat(d.poll()).member_epoch == LEAVE_EPOCH


def test_a_failed_leave_is_retried() -> None:
    d = joined(EMPTY, epoch=2)
    d.leave(at=10)
    d.poll()
    d.fail(at=20)
    retry = only_heartbeat(d.poll_until(20 + INTERVAL, step=1))
    assert retry.member_epoch == LEAVE_EPOCH
    d.answer(HeartbeatResponse(member_epoch=LEAVE_EPOCH))
    assert d.m.phase is Phase.LEFT


def test_leave_answered_not_coordinator_finds_it_and_leaves_there() -> None:
    d = joined(EMPTY, epoch=2)
    d.leave(at=10)
    d.poll()
    d.answer(error(ErrorCode.NOT_COORDINATOR))
    assert of_type(d.poll(), FindCoordinator) != []
    d.found()
    assert only_heartbeat(d.poll_until(d.now + INTERVAL, step=1)).member_epoch == LEAVE_EPOCH


def test_leave_answered_fenced_is_left() -> None:
    d = joined(EMPTY, epoch=2)
    d.leave(at=10)
    d.poll()
    d.answer(error(ErrorCode.FENCED_MEMBER_EPOCH))
    assert d.poll_until(d.now + INTERVAL, step=10) == []
    assert d.m.phase is Phase.LEFT


def test_give_up_leaving() -> None:
    d = joined(EMPTY, epoch=2)
    d.leave(at=10)
    d.poll()
    d.fail(at=20)
    d.m.give_up_leaving()
    assert d.m.phase is Phase.LEFT
    assert d.poll_until(d.now + SESSION, step=100) == []


def test_leave_waits_for_an_outstanding_start_and_stops_it_first() -> None:
    d = Driver.new()
    d.poll(0)
    d.answer(ok(1, rs("A")))
    d.poll()  # StartWork outstanding
    d.leave(at=10)
    assert heartbeats(d.poll()) == [], "left while a start was still in progress"
    d.started(at=20)
    actions = d.poll()
    assert of_type(actions, StopWork) == [StopWork(rs("A"), 1, "leaving")]
    assert [h.member_epoch for h in heartbeats(actions)] in ([], [1])  # a keepalive, not a leave
    if d.in_flight is not None:
        d.answer(ok(1))
    d.stopped()
    assert only_heartbeat(d.poll()).member_epoch == LEAVE_EPOCH


# --- eager and cooperative ------------------------------------------------------------------------


def test_eager_new_epoch_stops_everything_reports_empty_then_starts_the_whole_share() -> None:
    d = joined(rs("A", "A-0"), epoch=1, eager=True)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(2, rs("A", "B")))
    actions = d.poll()
    assert of_type(actions, StopWork) == [StopWork(rs("A", "A-0"), 2, "eager rebalance")]
    assert of_type(actions, StartWork) == []
    if d.in_flight is not None:
        d.answer(ok(2))
    d.stopped()
    actions = d.poll()
    assert of_type(actions, StartWork) == []
    report = only_heartbeat(actions)
    assert report.owned == EMPTY
    assert of_type(d.poll(d.now + 1), StartWork) == []  # not before the answer
    d.answer(ok(2))
    assert of_type(d.poll(), StartWork) == [StartWork(rs("A", "B"), 2)]


def test_eager_new_epoch_with_the_same_assignment_still_restarts_everything() -> None:
    d = joined(rs("A", "A-0"), epoch=1, eager=True)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(2))
    assert of_type(d.poll(), StopWork) == [StopWork(rs("A", "A-0"), 2, "eager rebalance")]
    if d.in_flight is not None:
        d.answer(ok(2))
    d.stopped()
    assert only_heartbeat(d.poll()).owned == EMPTY
    d.answer(ok(2))
    assert of_type(d.poll(), StartWork) == [StartWork(rs("A", "A-0"), 2)]


def test_eager_changed_assignment_at_the_same_epoch_restarts_everything() -> None:
    d = joined(rs("A", "A-0"), epoch=1, eager=True)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(1, rs("A")))
    assert of_type(d.poll(), StopWork) == [StopWork(rs("A", "A-0"), 1, "eager rebalance")]


def test_eager_empty_report_lost_is_repeated_before_starting() -> None:
    d = joined(rs("A"), epoch=1, eager=True)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(2, rs("B")))
    d.poll()
    if d.in_flight is not None:
        d.answer(ok(2))
    d.stopped()
    assert only_heartbeat(d.poll()).owned == EMPTY
    d.fail()
    actions = d.poll_until(d.now + INTERVAL, step=1)
    assert of_type(actions, StartWork) == []
    assert only_heartbeat(actions).owned == EMPTY
    d.answer(ok(2))
    assert of_type(d.poll(), StartWork) == [StartWork(rs("B"), 2)]


def test_eager_unchanged_epoch_and_assignment_moves_nothing() -> None:
    d = joined(rs("A"), epoch=1, eager=True)
    for k in range(1, 4):
        only_heartbeat(d.poll(k * INTERVAL))
        d.answer(ok(1, rs("A") if k == 2 else None))
    assert all(not isinstance(a, StopWork | StartWork) for t, a in d.log if t >= INTERVAL)


def test_eager_join_starts_its_share_directly() -> None:
    d = Driver.new(eager=True)
    d.poll(0)
    d.answer(ok(3, rs("A", "B")))
    actions = d.poll()
    assert of_type(actions, StopWork) == []
    assert of_type(actions, StartWork) == [StartWork(rs("A", "B"), 3)]


def test_cooperative_new_epoch_moves_only_the_difference() -> None:
    d = joined(rs("A", "A-0"), epoch=1, eager=False)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(2, rs("A", "A-0", "B")))
    actions = d.poll()
    assert of_type(actions, StopWork) == []
    assert of_type(actions, StartWork) == [StartWork(rs("B"), 2)]


def test_cooperative_new_epoch_without_assignment_moves_nothing() -> None:
    d = joined(rs("A", "A-0"), epoch=1, eager=False)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(2))
    actions = d.poll_until(2 * INTERVAL - 1, step=10)
    assert of_type(actions, StopWork) == []
    assert of_type(actions, StartWork) == []


# --- properties ---------------------------------------------------------------------------------

UNIVERSE = ["A", "B", "A-0", "B-0"]
TARGET = rs("A", "B-0")
CODES = [ErrorCode.NONE] * 6 + [
    ErrorCode.COMPUTE_ASSIGNMENT,
    ErrorCode.FENCED_MEMBER_EPOCH,
    ErrorCode.UNKNOWN_MEMBER_ID,
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.UNKNOWN_SERVER_ERROR,
]
assignments = st.one_of(
    st.none(), st.frozensets(st.sampled_from(UNIVERSE)).map(lambda names: rs(*names))
)
responses = st.builds(
    ok,
    epoch=st.integers(1, 4),
    assigned=assignments,
    code=st.sampled_from(CODES),
    interval=st.sampled_from([500, 1_000, 3_000]),
    session=st.sampled_from([6_000, 10_000, 30_000]),
)


class MembershipMachine(RuleBasedStateMachine):
    """Random coordinator answers, transport failures, clock steps and runtime reports, in any
    order. Every rule polls, and Driver.poll checks on every action: no StartWork while anything
    runs outside the latest assignment or is being stopped; a heartbeat's owned list, when
    present, covers what runs and claims nothing that neither runs nor is being started; never
    two heartbeats in flight. Then the teardown checks that the machine converges once the
    coordinator is healthy and the worker completes everything."""

    def __init__(self) -> None:
        super().__init__()
        self.d: Driver | None = None
        self.left = False
        self.leaving = False

    @initialize(eager=st.booleans(), static=st.booleans())
    def start(self, eager: bool, static: bool) -> None:
        self.d = Driver.new(eager=eager, instance_id="pod-0" if static else None)
        self.poll()

    @property
    def drv(self) -> Driver:
        assert self.d is not None
        return self.d

    def poll(self, at: int | None = None) -> None:
        d = self.drv
        left_before = d.m.phase is Phase.LEFT
        actions = d.poll(at)
        assert d.m.running == d.running
        for req in heartbeats(actions):
            assert not left_before, "a heartbeat after LEFT"
            if req.member_epoch == JOIN_EPOCH:
                assert_full(req, d.config, JOIN_EPOCH, EMPTY)
            if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                assert self.leaving, "a leave nobody asked for"
                assert not d.running and not d.stops and not d.starts, "left with work"

    @rule(ms=st.integers(0, 3_000))
    def advance(self, ms: int) -> None:
        self.poll(self.drv.now + ms)

    @rule()
    def sleep_until_wakeup(self) -> None:
        self.poll(max(self.drv.now, self.drv.m.next_wakeup_ms()))

    @precondition(lambda self: self.d is not None and self.d.in_flight is not None)
    @rule(resp=responses)
    def answer(self, resp: HeartbeatResponse) -> None:
        self.drv.answer(resp)
        self.poll()

    @precondition(lambda self: self.d is not None and self.d.in_flight is not None)
    @rule()
    def fail(self) -> None:
        self.drv.fail()
        self.poll()

    @precondition(lambda self: self.d is not None and bool(self.d.stops))
    @rule()
    def stopped(self) -> None:
        self.drv.stopped()
        self.poll()

    @precondition(lambda self: self.d is not None and bool(self.d.starts))
    @rule()
    def started(self) -> None:
        self.drv.started()
        self.poll()

    @precondition(lambda self: self.d is not None and bool(self.d.computes))
    @rule()
    def computed(self) -> None:
        self.drv.computed()
        self.poll()

    @precondition(lambda self: self.d is not None and bool(self.d.finds))
    @rule()
    def found(self) -> None:
        self.drv.found()
        self.poll()

    @rule(sigterm=st.integers(0, 15))
    def maybe_leave(self, sigterm: int) -> None:
        if sigterm == 0:  # rare: most runs never leave
            self.leaving = True
            self.drv.leave()
            self.poll()

    def teardown(self) -> None:
        if self.d is None:
            return
        d = self.d
        for _ in range(300):
            self.poll(d.now + 50)
            for _ in range(10):
                if not (d.stops or d.starts or d.computes or d.finds):
                    break
                if d.stops:
                    d.stopped()
                if d.starts:
                    d.started()
                if d.computes:
                    d.computed()
                if d.finds:
                    d.found()
                self.poll()
            if d.in_flight is not None:
                epoch = d.in_flight.member_epoch
                if epoch < 0:
                    d.answer(HeartbeatResponse(member_epoch=epoch))
                else:
                    d.answer(ok(epoch or 7, TARGET))
                self.poll()
        if self.leaving:
            assert d.m.phase is Phase.LEFT
            assert d.running == EMPTY
        else:
            assert d.m.phase is Phase.MEMBER
            assert d.running == TARGET
            assert d.m.assigned == TARGET
        assert not d.stops and not d.starts


MembershipMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_property_membership_machine = MembershipMachine.TestCase
