"""The complexity budget (README, "Cost"), held by counting: every Python call (and every call of
a builtin) a handler makes, seen by a profiler hook, at two group sizes four times apart.

A steady heartbeat, a join, a leave and a revocation's acknowledgement must not grow with the
group (O(1) or O(log n): at most 1.5x the calls at 4x the members); a Prepare, an Install and the
assignors at most linearly (at most 4 x 1.3 the calls). Every resource set built adds its size
to the count, so a set copied once per member (one call, O(resources) work) shows too. The
counts are deterministic, so this is no timing test; other work done inside C without a call is
measured by the benchmarks (`bench/run-scale`, `bench/assign_bench.py`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import pytest

from connect_protocol.messages import HeartbeatRequest, InstallRequest, MemberTarget, PrepareRequest
from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from coordinator_svc.core.assignment import install_assignment, prepare_assignment
from coordinator_svc.core.heartbeat import heartbeat
from tests.core.harness import DEFAULTS, SESSIONED, GroupHarness
from worker_agent.assignor import GroupView, MemberView
from worker_agent.assignors import EagerAssignor, IncrementalCooperativeAssignor

RESOURCE_SET_INIT = ResourceSet.__init__.__code__
SMALL, LARGE = 100, 400
TASKS_PER_MEMBER = 5
CONSTANT, LINEAR = 1.5, 4 * 1.3


def count_calls(call: Callable[[], Any]) -> int:
    """How many Python functions and builtins `call` calls, all nested calls included; plus,
    for each ResourceSet built, its size (copying a growing set per member is one call each
    time, but its size shows the O(members x resources) work)."""
    count = 0

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        nonlocal count
        if event == "c_call":
            count += 1
        elif event == "call":
            count += 1
            if frame.f_code is RESOURCE_SET_INIT:
                count += len(frame.f_locals["connectors"]) + len(frame.f_locals["tasks"])

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(previous)
    return count


@dataclass
class Group:
    """A stable group of `size` members, each running TASKS_PER_MEMBER tasks (and a tenth of
    them a connector), built through the core's own handlers."""

    harness: GroupHarness
    size: int

    @property
    def ids(self) -> list[str]:
        return [f"m{i:05d}" for i in range(self.size)]


def stable_group(size: int) -> Group:
    h = GroupHarness()
    connectors = size // 10
    for c in range(connectors):
        h.put_connector(f"connector-{c:04d}", 10 * TASKS_PER_MEMBER)
    group = Group(h, size)
    for member_id in group.ids:
        h.join(member_id)
    assert h.state is not None
    assignor = h.state.meta.assignor_member_id
    assert assignor is not None
    h.heartbeat(assignor, h.member(assignor).member_epoch)
    h.compute(assignor, round_robin(group))
    for member_id in group.ids:
        h.ack(member_id)
    for member_id in group.ids:
        h.ack(member_id)
    assert h.status().value == "STABLE"
    return group


def round_robin(group: Group) -> dict[str, ResourceSet]:
    state = group.harness.state
    assert state is not None
    ids = group.ids
    connectors: dict[str, list[str]] = {m: [] for m in ids}
    tasks: dict[str, list[TaskId]] = {m: [] for m in ids}
    for i, name in enumerate(sorted(state.catalogue)):
        connectors[ids[i % len(ids)]].append(name)
    all_tasks = sorted(state.catalogue_resources().tasks)
    for i, task in enumerate(all_tasks):
        tasks[ids[i % len(ids)]].append(task)
    return {m: ResourceSet.of(connectors[m], tasks[m]) for m in ids}


@pytest.fixture(scope="module")
def groups() -> dict[int, Group]:
    return {size: stable_group(size) for size in (SMALL, LARGE)}


def calls_at(groups: dict[int, Group], make: Callable[[Group], Callable[[], Any]]) -> list[int]:
    return [count_calls(make(groups[size])) for size in (SMALL, LARGE)]


def assert_growth(counts: list[int], bound: float) -> None:
    small, large = counts
    assert large <= bound * small, (
        f"{small} calls at {SMALL} members, {large} at {LARGE}: x{large / small:.2f} "
        f"for x{LARGE / SMALL:.0f} the members (allowed x{bound})"
    )


def test_a_join_does_not_grow_with_the_group(groups: dict[int, Group]) -> None:
    def make(group: Group) -> Callable[[], Any]:
        req = HeartbeatRequest(
            "connect-cluster",
            "newcomer",
            0,
            rebalance_timeout_ms=60_000,
            client_assignors=SESSIONED,
            owned=EMPTY,
        )
        return lambda: heartbeat(group.harness.state, req, group.harness.now_ms, DEFAULTS)

    assert_growth(calls_at(groups, make), CONSTANT)


def test_a_leave_does_not_grow_with_the_group(groups: dict[int, Group]) -> None:
    def make(group: Group) -> Callable[[], Any]:
        req = HeartbeatRequest("connect-cluster", group.ids[3], -1)
        return lambda: heartbeat(group.harness.state, req, group.harness.now_ms, DEFAULTS)

    assert_growth(calls_at(groups, make), CONSTANT)


def test_the_assignor_members_leave_does_not_grow_with_the_group(
    groups: dict[int, Group],
) -> None:
    def make(group: Group) -> Callable[[], Any]:
        state = group.harness.state
        assert state is not None and state.meta.assignor_member_id is not None
        req = HeartbeatRequest("connect-cluster", state.meta.assignor_member_id, -1)
        return lambda: heartbeat(state, req, group.harness.now_ms, DEFAULTS)

    assert_growth(calls_at(groups, make), CONSTANT)


def test_a_steady_heartbeat_does_not_grow_with_the_group(groups: dict[int, Group]) -> None:
    def make(group: Group) -> Callable[[], Any]:
        member = group.harness.member(group.ids[5])
        req = HeartbeatRequest("connect-cluster", member.member_id, member.member_epoch)
        return lambda: heartbeat(group.harness.state, req, group.harness.now_ms, DEFAULTS)

    assert_growth(calls_at(groups, make), CONSTANT)


def test_acknowledging_a_revocation_does_not_grow_with_the_group() -> None:
    def make(group: Group) -> Callable[[], Any]:
        h = group.harness
        h.put_connector("extra", 0)  # a new group epoch to compute for
        # One task moves from the first member to the second: the first must revoke it.
        targets = round_robin(group)
        first, second = group.ids[0], group.ids[1]
        moved = ResourceSet.of([], [min(targets[first].tasks)])
        targets[first] = targets[first] - moved
        targets[second] = targets[second] | moved
        assignor = h.state.meta.assignor_member_id if h.state else None
        assert assignor is not None
        h.heartbeat(assignor, h.member(assignor).member_epoch)
        h.compute(assignor, targets)
        h.heartbeat(first, h.member(first).member_epoch)
        member = h.member(first)
        assert member.pending_revocation == moved
        req = HeartbeatRequest("connect-cluster", first, member.member_epoch, owned=member.assigned)
        return lambda: heartbeat(h.state, req, h.now_ms, DEFAULTS)

    counts = [count_calls(make(stable_group(size))) for size in (SMALL, LARGE)]
    assert_growth(counts, CONSTANT)


def test_prepare_grows_at_most_linearly(groups: dict[int, Group]) -> None:
    def make(group: Group) -> Callable[[], Any]:
        h = group.harness
        state = h.state
        assert state is not None and state.meta.assignor_member_id is not None
        member = h.member(state.meta.assignor_member_id)
        req = PrepareRequest("connect-cluster", member.member_id, member.member_epoch)
        return lambda: prepare_assignment(state, req, h.now_ms, DEFAULTS)

    assert_growth(calls_at(groups, make), LINEAR)


def test_install_grows_at_most_linearly() -> None:
    def make(group: Group) -> Callable[[], Any]:
        h = group.harness
        h.put_connector("extra", 0)
        assert h.state is not None and h.state.meta.assignor_member_id is not None
        assignor = h.state.meta.assignor_member_id
        h.heartbeat(assignor, h.member(assignor).member_epoch)
        prepared = h.prepare(assignor)
        targets = round_robin(group)
        req = InstallRequest(
            "connect-cluster",
            assignor,
            h.member(assignor).member_epoch,
            prepared.group_epoch,
            members=tuple(MemberTarget(m, r, 2, b"") for m, r in targets.items()),
        )
        return lambda: install_assignment(h.state, req, h.now_ms, DEFAULTS)

    counts = [count_calls(make(stable_group(size))) for size in (SMALL, LARGE)]
    assert_growth(counts, LINEAR)


def group_view(group: Group, newcomer: bool) -> GroupView:
    state = group.harness.state
    assert state is not None
    members = [
        MemberView(m.member_id, member_epoch=m.member_epoch, owned=m.owned)
        for m in state.members.values()
    ]
    if newcomer:
        members.append(MemberView("newcomer"))
    return GroupView(
        group_epoch=state.group_epoch + 1,
        assignor_name="incremental_cooperative",
        assignor_version=2,
        members=tuple(members),
        catalogue={c.name: c.task_count for c in state.catalogue.values()},
        assignment_epoch=state.assignment_epoch,
        target={m: e.resources for m, e in state.target.members.items()},
    )


@pytest.mark.parametrize("assignor", [IncrementalCooperativeAssignor(), EagerAssignor()])
def test_the_assignors_grow_at_most_linearly(groups: dict[int, Group], assignor: Any) -> None:
    def make(group: Group) -> Callable[[], Any]:
        view = group_view(group, newcomer=True)
        return lambda: assignor.assign(view)

    assert_growth(calls_at(groups, make), LINEAR)
