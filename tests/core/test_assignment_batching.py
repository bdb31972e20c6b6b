"""Assignment batching (issue 24 item 4, DESIGN 3.21 with 3.4 and 3.9), at the default
`assignment.interval.ms` of 1000: a new computation is requested only when none is outstanding
and the interval has passed since the last request; epoch bumps meanwhile are folded into that
request; while it is outstanding the assignor member is sent COMPUTE_ASSIGNMENT on every
heartbeat; joins are answered at once; an install that raced asks again as soon as the interval
allows; DescribeGroups shows when the next computation may be requested. Every other core test
runs with the interval 0 (tests/core/harness.py), as the seeds' step tables assume."""

from __future__ import annotations

from dataclasses import replace

import pytest

from connect_protocol.configs import ASSIGNMENT_INTERVAL, ASSIGNMENT_INTERVAL_MS
from connect_protocol.errors import ErrorCode
from coordinator_svc.core.model import GroupConfigDefaults
from coordinator_svc.core.records import EventType
from coordinator_svc.core.results import ASSIGNOR
from coordinator_svc.describe_view import render_group
from coordinator_svc.grpc_api.convert import described_group
from tests.core.harness import DEFAULTS, GroupHarness, rs

COMPUTE = ErrorCode.COMPUTE_ASSIGNMENT
NONE = ErrorCode.NONE
INTERVAL = 1_000
#: The harness's defaults with the default interval, and sessions long enough to sleep through it.
BATCHED = replace(
    DEFAULTS, assignment_interval_ms=ASSIGNMENT_INTERVAL.default, session_timeout_ms=10_000
)


def test_the_default_interval_is_one_second_and_test_harnesses_use_zero() -> None:
    assert ASSIGNMENT_INTERVAL.default == INTERVAL
    assert GroupConfigDefaults().assignment_interval_ms == INTERVAL
    assert BATCHED.as_map()[ASSIGNMENT_INTERVAL_MS] == "1000"
    assert DEFAULTS.assignment_interval_ms == 0


def one_member_group() -> GroupHarness:
    """Connector A (1 task); w1 joined at t=0, was asked at once, and installed A, A-0 at
    t=10: group and assignment epoch 3, the last request at t=0."""
    h = GroupHarness(defaults=BATCHED)
    h.put_connector("A", 1)
    assert h.join("w1").error_code == COMPUTE  # never asked before: at once
    assert h.state is not None and h.state.meta.compute_requested_at_ms == 0
    h.sleep(10)
    h.compute("w1", {"w1": rs("A", "A-0")})
    h.ack("w1")
    assert (h.group_epoch, h.assignment_epoch) == (3, 3)
    return h


def requests(h: GroupHarness) -> list[int]:
    """The group epoch of every ASSIGNMENT_REQUESTED so far."""
    return [int(e.payload["group_epoch"]) for e in h.logged_events(EventType.ASSIGNMENT_REQUESTED)]


def test_no_second_request_before_the_interval_has_passed_since_the_last() -> None:
    h = one_member_group()
    h.sleep(90)  # t=100
    joined = h.join("w2")
    assert h.group_epoch == 4
    for at in (200, 500, 999):
        h.sleep(at - h.now_ms)
        assert h.keepalive("w1").error_code == NONE, at
    assert requests(h) == [3]
    h.sleep(1)  # t=1000: the interval has passed since the request at t=0
    assert h.keepalive("w1").error_code == COMPUTE
    assert requests(h) == [3, 4]
    assert h.state is not None and h.state.meta.compute_requested_at_ms == 1_000
    assert joined.error_code == NONE


def test_a_joining_member_is_answered_at_once_with_its_current_share() -> None:
    h = one_member_group()
    h.sleep(90)
    joined = h.join("w2")
    assert joined.error_code == NONE
    assert joined.member_epoch == 3  # the current assignment epoch, not the new group epoch
    assert joined.assignment is not None and joined.assignment.resources == rs()
    assert h.member("w2").member_epoch == 3


def test_compute_assignment_is_repeated_on_every_heartbeat_while_a_request_is_outstanding() -> None:
    h = one_member_group()
    h.sleep(INTERVAL)
    h.put_connector("B", 1)
    assert h.keepalive("w1").error_code == COMPUTE
    deadline = h.deadline((ASSIGNOR, ""))
    for _ in range(3):
        h.sleep(100)
        assert h.keepalive("w1").error_code == COMPUTE
        assert h.last_events(EventType.ASSIGNMENT_REQUESTED) == []
    assert requests(h) == [3, 4]
    assert h.deadline((ASSIGNOR, "")) == deadline  # the rebalance timeout runs from the request


def test_epoch_bumps_meanwhile_are_folded_into_the_outstanding_request() -> None:
    h = one_member_group()
    h.sleep(INTERVAL)
    h.put_connector("B", 1)
    assert h.keepalive("w1").error_code == COMPUTE  # requested at epoch 4
    h.put_connector("C", 1)
    h.join("w2")
    assert h.group_epoch == 6
    assert h.keepalive("w1").error_code == COMPUTE
    prepared = h.compute("w1", {"w1": rs("A", "A-0", "B", "B-0"), "w2": rs("C", "C-0")})
    assert prepared.group_epoch == 6  # one computation for three bumps
    assert h.assignment_epoch == 6
    assert requests(h) == [3, 4]
    assert h.keepalive("w1").error_code == NONE


def test_an_install_that_raced_asks_again_as_soon_as_the_interval_allows() -> None:
    """DESIGN 3.9's "at once" after an install for an older epoch than the group's."""
    h = one_member_group()
    h.sleep(INTERVAL)  # t=1010
    h.put_connector("B", 1)
    assert h.keepalive("w1").error_code == COMPUTE  # requested at t=1010, epoch 4
    h.prepare("w1")
    h.sleep(20)
    h.join("w2")  # epoch 5, while w1 computes epoch 4
    h.install("w1", {"w1": rs("A", "A-0", "B", "B-0")})
    assert (h.group_epoch, h.assignment_epoch) == (5, 4)
    h.ack("w1")
    assert h.keepalive("w1").error_code == NONE  # t=1030: not before t=2010
    h.sleep(2_009 - h.now_ms)
    assert h.keepalive("w1").error_code == NONE
    h.sleep(1)
    assert h.keepalive("w1").error_code == COMPUTE
    assert requests(h) == [3, 4, 5]


def test_a_group_that_sets_the_interval_to_zero_is_asked_at_every_bump() -> None:
    h = one_member_group()
    assert h.alter_configs({ASSIGNMENT_INTERVAL_MS: "0"}).error_code == NONE
    h.sleep(5)
    h.put_connector("B", 1)
    assert h.keepalive("w1").error_code == COMPUTE
    assert requests(h) == [3, 4]


def test_describe_shows_when_the_next_computation_may_be_requested() -> None:
    h = one_member_group()
    h.sleep(90)
    h.join("w2")
    assert h.state is not None
    shown = described_group(h.state, BATCHED, h.now_ms, "", "incremental_cooperative")
    assert shown.next_assignment_request_at_ms == INTERVAL  # the request at t=0, plus 1 s
    assert not shown.HasField("assignment_requested_epoch")
    assert shown.group_configs[ASSIGNMENT_INTERVAL_MS] == "1000"
    text = render_group(shown, h.now_ms)
    assert "next computation may be requested in 0.9s (coordinator time 1000)" in text

    h.sleep(INTERVAL)
    assert h.keepalive("w1").error_code == COMPUTE
    shown = described_group(h.state, BATCHED, h.now_ms, "", "incremental_cooperative")
    assert shown.assignment_requested_epoch == 4
    assert shown.next_assignment_request_at_ms == h.now_ms + INTERVAL
    assert "computation requested at group epoch 4, outstanding" in render_group(shown, h.now_ms)


def test_describe_of_a_group_never_asked_shows_no_request_time() -> None:
    h = GroupHarness(defaults=BATCHED)
    h.put_connector("A", 1)
    assert h.state is not None
    shown = described_group(h.state, BATCHED, h.now_ms, "", "")
    assert not shown.HasField("next_assignment_request_at_ms")
    assert "a new computation may be requested now" in render_group(shown, h.now_ms)


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("-1", "assignment.interval.ms must be >= 0, got -1."),
        ("3600001", "assignment.interval.ms must be <= 3600000, got 3600001."),
        ("1s", "assignment.interval.ms must be an integer number of milliseconds, got '1s'."),
    ],
)
def test_the_interval_is_refused_outside_its_bounds(value: str, rule: str) -> None:
    h = one_member_group()
    answer = h.alter_configs({ASSIGNMENT_INTERVAL_MS: value})
    assert answer.error_code == ErrorCode.INVALID_REQUEST
    assert answer.error_message == rule
    for value in ("0", "3600000"):
        assert h.alter_configs({ASSIGNMENT_INTERVAL_MS: value}).error_code == NONE


def test_a_scheduled_rebalance_below_the_interval_is_paced_by_it() -> None:
    """A wave pause (or any scheduled rebalance) shorter than the interval: the timer still
    fires and bumps the epoch at once; the computation it needs waits for the interval."""
    h = one_member_group()
    h.sleep(INTERVAL)  # t=1010
    h.put_connector("B", 1)
    assert h.keepalive("w1").error_code == COMPUTE  # requested at t=1010
    h.compute("w1", {"w1": rs("A", "A-0", "B", "B-0")}, delay_ms=200, next_wave_delay_ms=200)
    h.ack("w1")
    h.sleep(200)  # t=1210: the wave's scheduled rebalance fires
    assert h.logged_events(EventType.SCHEDULED_REBALANCE_FIRED)
    assert h.group_epoch == h.assignment_epoch + 1
    assert h.keepalive("w1").error_code == NONE
    h.sleep(2_009 - h.now_ms)
    assert h.keepalive("w1").error_code == NONE
    h.sleep(1)  # t=2010: the interval since the request at t=1010
    assert h.keepalive("w1").error_code == COMPUTE
