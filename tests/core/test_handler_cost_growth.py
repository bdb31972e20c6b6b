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

from connect_protocol.messages import (
    HeartbeatRequest,
    InstallRequest,
    MemberTarget,
    PrepareRequest,
    PutConnectorRequest,
)
from connect_protocol.resources import (
    EMPTY,
    ConnectorTasks,
    ResourceSet,
    TaskId,
    catalogue_resources,
)
from coordinator_svc.core import replay
from coordinator_svc.core.admin import put_connector
from coordinator_svc.core.assignment import install_assignment, prepare_assignment
from coordinator_svc.core.heartbeat import heartbeat
from tests.core.harness import DEFAULTS, SESSIONED, GroupHarness
from worker_agent.assignor import GroupView, MemberView
from worker_agent.assignors import EagerAssignor, IncrementalCooperativeAssignor

RESOURCE_SET_INIT = ResourceSet.__init__.__code__
KEPT_BY_CONNECTOR = ResourceSet._kept_by_connector.__code__
CONNECTOR_TASKS_NEW = ConnectorTasks.__new__.__code__
SMALL, LARGE = 100, 400
TASKS_PER_MEMBER = 5
CONSTANT, LINEAR = 1.5, 4 * 1.3


def count_calls(call: Callable[[], Any]) -> int:
    """How many Python functions and builtins `call` calls, all nested calls included; plus,
    for each ResourceSet built, its size (copying a growing set per member is one call each
    time, but its size shows the O(members x resources) work); a set kept by connector counts
    its connectors, and each connector's tasks built count their size."""
    count = 0

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        nonlocal count
        if event == "c_call":
            count += 1
        elif event == "call":
            count += 1
            code = frame.f_code
            if code is RESOURCE_SET_INIT:
                count += len(frame.f_locals["connectors"]) + len(frame.f_locals["tasks"])
            elif code is KEPT_BY_CONNECTOR:  # a set kept by connector: its connector map
                count += len(frame.f_locals["connectors"]) + len(frame.f_locals["shards"])
            elif code is CONNECTOR_TASKS_NEW:  # one connector's tasks, built from a sized value
                count += len(frame.f_locals["tasks"])

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


# --- unsettled groups and large catalogues (issue 24) -------------------------------------------
#
# A heartbeat in an ASSIGNING or RECONCILING group costs O(that member's share and what changed
# for it): counted with its records applied (replay is part of what a heartbeat costs), at two
# member counts and at two catalogue sizes with the member's share fixed; a PutConnector costs
# O(1) in the catalogue and in its own task count (its tasks stay a count until a Prepare).

SMALL_CATALOGUE, LARGE_CATALOGUE = 100, 100_000
FIXED_MEMBERS = 10


def handled(h: GroupHarness, call: Callable[[], Any]) -> Callable[[], Any]:
    """`call` (a handler on h's state) with its records applied to the state, as the
    coordinator does after the commit."""

    def run() -> Any:
        result = call()
        assert h.state is not None
        for record in result.records:
            replay.apply(h.state, record)
        return result

    return run


def assigning(group: Group) -> Group:
    """The group with a new connector: its group epoch is ahead of the target (ASSIGNING)."""
    group.harness.put_connector("extra", 1)
    assert group.harness.status().value == "ASSIGNING"
    return group


def reconciling(group: Group, targets: dict[str, ResourceSet] | None = None) -> Group:
    """The group after a target that moves one task from the first member to the second: every
    member is now behind the target epoch (RECONCILING)."""
    h = group.harness
    h.put_connector("extra", 0)
    targets = round_robin(group) if targets is None else targets
    first, second = group.ids[0], group.ids[1]
    moved = ResourceSet.of([], [min(targets[first].tasks)])
    targets[first] -= moved
    targets[second] |= moved
    assert h.state is not None and h.state.meta.assignor_member_id is not None
    assignor = h.state.meta.assignor_member_id
    h.heartbeat(assignor, h.member(assignor).member_epoch)
    h.compute(assignor, targets, delay_ms=60_000)
    assert h.status().value == "RECONCILING"
    return group


def member_heartbeat(group: Group, with_owned: bool) -> Callable[[], Any]:
    """A heartbeat of a member the new target does not change (the agent sends the owned list
    only when it changed; `with_owned` sends it anyway)."""
    h = group.harness
    member = h.member(group.ids[5])
    req = HeartbeatRequest(
        "connect-cluster",
        member.member_id,
        member.member_epoch,
        owned=member.assigned if with_owned else None,
    )
    return handled(h, lambda: heartbeat(h.state, req, h.now_ms, DEFAULTS))


def revoking_heartbeat(group: Group) -> Callable[[], Any]:
    """The heartbeat of the member that must give a task up (told to revoke)."""
    h = group.harness
    member = h.member(group.ids[0])
    req = HeartbeatRequest("connect-cluster", member.member_id, member.member_epoch)
    return handled(h, lambda: heartbeat(h.state, req, h.now_ms, DEFAULTS))


@pytest.mark.parametrize("with_owned", [False, True])
def test_a_heartbeat_in_an_assigning_group_does_not_grow_with_the_group(with_owned: bool) -> None:
    counts = [
        count_calls(member_heartbeat(assigning(stable_group(size)), with_owned))
        for size in (SMALL, LARGE)
    ]
    assert_growth(counts, CONSTANT)


@pytest.mark.parametrize("with_owned", [False, True])
def test_a_heartbeat_in_a_reconciling_group_does_not_grow_with_the_group(
    with_owned: bool,
) -> None:
    counts = [
        count_calls(member_heartbeat(reconciling(stable_group(size)), with_owned))
        for size in (SMALL, LARGE)
    ]
    assert_growth(counts, CONSTANT)


def test_a_revoking_heartbeat_does_not_grow_with_the_group() -> None:
    counts = [
        count_calls(revoking_heartbeat(reconciling(stable_group(size)))) for size in (SMALL, LARGE)
    ]
    assert_growth(counts, CONSTANT)


@pytest.mark.parametrize("status", ["STABLE", "RECONCILING"])
def test_the_group_status_does_not_grow_with_the_group(status: str) -> None:
    """A metrics scrape asks every group its status (a settled group is the worst case for a
    scan: every member is looked at)."""
    groups = [stable_group(size) for size in (SMALL, LARGE)]
    if status == "RECONCILING":
        groups = [reconciling(g) for g in groups]
    states = [g.harness.state for g in groups]
    assert all(s is not None and s.status().value == status for s in states)
    counts = [count_calls(s.status) for s in states if s is not None]
    assert_growth(counts, CONSTANT)


def catalogue_group(tasks: int) -> Group:
    """FIXED_MEMBERS members, each with TASKS_PER_MEMBER tasks of connector `assigned`, in a
    catalogue of `tasks` tasks: the rest (connector `rest`) is left unassigned by installs that
    declare a delay (DESIGN 3.6), so the members' shares do not grow with the catalogue."""
    h = GroupHarness()
    shared = FIXED_MEMBERS * TASKS_PER_MEMBER
    h.put_connector("assigned", shared)
    h.put_connector("rest", tasks - shared)
    group = Group(h, FIXED_MEMBERS)
    for member_id in group.ids:
        h.join(member_id)
    assert h.state is not None and h.state.meta.assignor_member_id is not None
    assignor = h.state.meta.assignor_member_id
    h.heartbeat(assignor, h.member(assignor).member_epoch)
    h.compute(assignor, shares(group), delay_ms=60_000)
    for member_id in group.ids:
        h.ack(member_id)
    for member_id in group.ids:
        h.ack(member_id)
    assert h.status().value == "STABLE"
    return group


def shares(group: Group) -> dict[str, ResourceSet]:
    return {
        m: ResourceSet.of(
            [], [TaskId("assigned", i * TASKS_PER_MEMBER + k) for k in range(TASKS_PER_MEMBER)]
        )
        for i, m in enumerate(group.ids)
    }


def catalogue_calls(make: Callable[[Group], Callable[[], Any]]) -> list[int]:
    return [count_calls(make(catalogue_group(size))) for size in (SMALL_CATALOGUE, LARGE_CATALOGUE)]


def assert_flat_in_catalogue(counts: list[int]) -> None:
    small, large = counts
    assert large <= CONSTANT * small, (
        f"{small} calls at {SMALL_CATALOGUE} catalogue tasks, {large} at {LARGE_CATALOGUE}: "
        f"x{large / small:.2f} (allowed x{CONSTANT})"
    )


@pytest.mark.parametrize("with_owned", [False, True])
def test_a_heartbeat_in_an_assigning_group_does_not_grow_with_the_catalogue(
    with_owned: bool,
) -> None:
    assert_flat_in_catalogue(catalogue_calls(lambda g: member_heartbeat(assigning(g), with_owned)))


@pytest.mark.parametrize("with_owned", [False, True])
def test_a_heartbeat_in_a_reconciling_group_does_not_grow_with_the_catalogue(
    with_owned: bool,
) -> None:
    assert_flat_in_catalogue(
        catalogue_calls(lambda g: member_heartbeat(reconciling(g, shares(g)), with_owned))
    )


def test_a_revoking_heartbeat_does_not_grow_with_the_catalogue() -> None:
    assert_flat_in_catalogue(
        catalogue_calls(lambda g: revoking_heartbeat(reconciling(g, shares(g))))
    )


def put(group: Group, name: str, task_count: int) -> Callable[[], Any]:
    h = group.harness
    req = PutConnectorRequest(h.group_id, name, task_count, {}, "test")
    return handled(h, lambda: put_connector(h.state, req, h.now_ms, DEFAULTS))


def test_a_put_connector_does_not_grow_with_the_catalogue() -> None:
    """After a Prepare built the catalogue's resources (the cache a put used to drop)."""

    def make(group: Group) -> Callable[[], Any]:
        assert group.harness.state is not None
        group.harness.state.catalogue_resources()
        return put(group, "new", 100)

    assert_flat_in_catalogue(catalogue_calls(make))


def test_a_put_connector_does_not_grow_with_its_own_task_count() -> None:
    """A connector's tasks stay a count until a Prepare needs them."""
    group = catalogue_group(SMALL_CATALOGUE)
    counts = [count_calls(put(group, f"new-{n}", n)) for n in (100, 100_000)]
    assert counts[1] <= CONSTANT * counts[0], counts


def test_the_next_prepare_after_a_put_builds_only_the_connectors_changed() -> None:
    """The catalogue's resources after a put are the last ones built plus the put connector's
    tasks (O(its tasks)), and equal to a build from nothing."""

    def make(group: Group) -> Callable[[], Any]:
        state = group.harness.state
        assert state is not None
        state.catalogue_resources()
        put(group, "new", 100)()
        return state.catalogue_resources

    groups = [catalogue_group(size) for size in (SMALL_CATALOGUE, LARGE_CATALOGUE)]
    counts = [count_calls(make(g)) for g in groups]
    # One ResourceSet of the whole catalogue is built either way (its size counted); the
    # Python work beside it is the new connector's 100 tasks, not the catalogue's.
    assert counts[1] - LARGE_CATALOGUE - 100 <= CONSTANT * (counts[0] - SMALL_CATALOGUE - 100)
    for g in groups:
        state = g.harness.state
        assert state is not None
        assert state.catalogue_resources() == catalogue_resources(state.catalogue.values())


def test_the_catalogue_resources_follow_puts_resizes_and_deletes() -> None:
    group = catalogue_group(SMALL_CATALOGUE)
    h = group.harness
    state = h.state
    assert state is not None
    state.catalogue_resources()
    h.put_connector("grown", 3)
    h.put_connector("grown", 7)
    h.put_connector("rest", 10)  # shrunk
    h.put_connector("gone", 4)
    h.delete_connector("gone")
    h.put_connector("assigned", FIXED_MEMBERS * TASKS_PER_MEMBER, {"k": "v"})  # config only
    assert state.catalogue_resources() == catalogue_resources(state.catalogue.values())
    h.delete_connector("grown")
    assert state.catalogue_resources() == catalogue_resources(state.catalogue.values())
