"""Helpers for the assignor tests, and tests that the helpers themselves catch what they must.

`assert_installable` runs the coordinator's own install validation (`validate_install` and the
check against the group a Prepare showed) on an assignor's result. `Sim` is a pure stand-in for
the coordinator across rounds (the target becomes the result, members converge onto it, the state
blob is handed to the next round). `Coordinated` drives a real core `GroupState` through
PrepareAssignment and InstallAssignment (tests/core/harness.py) with a real assignor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import pytest

from connect_protocol.errors import ErrorCode, InvalidAssignment, InvalidRequest
from connect_protocol.messages import InstallRequest, MemberTarget, PrepareResponse
from connect_protocol.resources import EMPTY, ResourceSet
from coordinator_svc.core.assignment import _validate_against
from coordinator_svc.core.model import PreparedSnapshot
from coordinator_svc.core.validation import validate_install
from tests.core.harness import GroupHarness, rs
from worker_agent.assignor import (
    SCHEDULED_REBALANCE_MAX_DELAY_MS,
    AssignmentResult,
    ConnectAssignor,
    GroupView,
    MemberView,
)

__all__ = ["Coordinated", "Sim", "assert_installable", "assigned", "rs", "view", "view_of_prepare"]


def view(
    catalogue: Mapping[str, int],
    members: Iterable[str | MemberView],
    *,
    target: Mapping[str, ResourceSet] | None = None,
    state: bytes = b"",
    now_ms: int = 0,
    max_delay_ms: int | None = None,
    group_epoch: int = 2,
) -> GroupView:
    """A GroupView; members given by id own nothing and have no instance id."""
    views = tuple(m if isinstance(m, MemberView) else MemberView(m) for m in members)
    configs = {} if max_delay_ms is None else {SCHEDULED_REBALANCE_MAX_DELAY_MS: str(max_delay_ms)}
    return GroupView(
        group_epoch=group_epoch,
        assignor_name="incremental_cooperative",
        assignor_version=2,
        members=views,
        catalogue=dict(catalogue),
        assignment_epoch=group_epoch - 1,
        target=dict(target or {}),
        assignor_state=state,
        configs=configs,
        coordinator_time_ms=now_ms,
    )


def install_request(group: GroupView, result: AssignmentResult) -> InstallRequest:
    return InstallRequest(
        group_id="g",
        member_id=group.members[0].member_id if group.members else "w",
        member_epoch=1,
        group_epoch=group.group_epoch,
        error=result.error,
        error_message=result.error_message,
        members=tuple(MemberTarget(m, r) for m, r in result.members.items()),
        assignor_state=result.assignor_state,
        scheduled_rebalance_delay_ms=result.scheduled_rebalance_delay_ms,
    )


def assert_installable(group: GroupView, result: AssignmentResult) -> None:
    """The coordinator would accept `result` as the install for `group` (DESIGN 3.6)."""
    req = install_request(group, result)
    snapshot = PreparedSnapshot(
        group_epoch=group.group_epoch,
        member_ids=frozenset(m.member_id for m in group.members),
        catalogue=group.all_resources(),
    )
    try:
        validate_install(req)
        _validate_against(snapshot, req)
    except (InvalidRequest, InvalidAssignment) as error:
        raise AssertionError(f"the coordinator refuses the install: {error.message}") from error
    assert result.error == 0, result


def assigned(result: AssignmentResult) -> ResourceSet:
    out = EMPTY
    for share in result.members.values():
        out = out | share
    return out


@dataclass
class Sim:
    """The coordinator, reduced to what an assignor sees between rounds.

    After each round the target is the result, every member owns its target share (it has
    converged) and the state blob goes to the next round. `now_ms` is the coordinator's clock.
    """

    assignor: ConnectAssignor
    catalogue: dict[str, int]
    max_delay_ms: int | None = None
    now_ms: int = 0
    members: dict[str, MemberView] = field(default_factory=dict)
    target: dict[str, ResourceSet] = field(default_factory=dict)
    state: bytes = b""
    group_epoch: int = 1
    last_view: GroupView | None = None

    def join(self, member_id: str, instance_id: str | None = None) -> None:
        self.members[member_id] = MemberView(member_id, instance_id=instance_id)

    def leave(self, member_id: str) -> None:
        del self.members[member_id]

    def view(self) -> GroupView:
        return view(
            self.catalogue,
            [self.members[m] for m in sorted(self.members)],
            target=self.target,
            state=self.state,
            now_ms=self.now_ms,
            max_delay_ms=self.max_delay_ms,
            group_epoch=self.group_epoch,
        )

    def round(self) -> AssignmentResult:
        self.group_epoch += 1
        group = self.view()
        self.last_view = group
        result = self.assignor.assign(group)
        assert_installable(group, result)
        self.target = {m: r for m, r in result.members.items() if m in self.members}
        self.state = result.assignor_state
        self.members = {
            m: replace(v, owned=self.target.get(m, EMPTY)) for m, v in self.members.items()
        }
        return result

    def shares(self) -> dict[str, list[str]]:
        """The target as display names, for readable assertions."""
        return {m: list(r.names()) for m, r in sorted(self.target.items())}


def view_of_prepare(p: PrepareResponse) -> GroupView:
    """A core PrepareResponse as the assignor sees it (what the agent's transport decodes)."""
    return GroupView(
        group_epoch=p.group_epoch,
        assignor_name=p.assignor_name,
        assignor_version=p.assignor_version,
        members=tuple(
            MemberView(
                member_id=m.member_id,
                instance_id=m.instance_id,
                url=m.url,
                member_epoch=m.member_epoch,
                reason=m.assignor.reason,
                version=m.assignor.version,
                metadata=m.assignor.metadata,
                owned=m.owned,
            )
            for m in p.members
        ),
        catalogue={c.name: c.task_count for c in p.catalogue},
        assignment_epoch=p.assignment_epoch,
        target={t.member_id: t.resources for t in p.target},
        assignor_state=p.assignor_state,
        configs=dict(p.group_configs),
        coordinator_time_ms=p.coordinator_time_ms,
        scheduled_rebalance_at_ms=p.scheduled_rebalance_at_ms,
    )


class Coordinated:
    """A real core group (GroupHarness) whose assignor member computes with `assignor`."""

    def __init__(self, assignor: ConnectAssignor, harness: GroupHarness | None = None) -> None:
        self.assignor = assignor
        self.h = harness or GroupHarness()

    def compute(self) -> tuple[GroupView, AssignmentResult]:
        """Prepare as the chosen member, assign, install; the install must be accepted."""
        h = self.h
        assert h.state is not None
        member = h.state.meta.assignor_member_id
        assert member is not None, "no assignor member"
        prepared = h.prepare(member)
        assert prepared.error_code == ErrorCode.NONE, prepared
        group = view_of_prepare(prepared)
        result = self.assignor.assign(group)
        installed = h.install(
            member,
            result.members,
            delay_ms=result.scheduled_rebalance_delay_ms,
            assignor_state=result.assignor_state,
        )
        assert installed.error_code == ErrorCode.NONE, installed
        return group, result

    def converge(self) -> None:
        """Every member acknowledges until it runs exactly its target."""
        h = self.h
        assert h.state is not None
        for _ in range(4):
            for member_id in sorted(h.state.members):
                h.ack(member_id)
        for member_id in sorted(h.state.members):
            assert h.member(member_id).assigned == h.target_of(member_id), member_id

    def targets(self) -> dict[str, list[str]]:
        h = self.h
        assert h.state is not None
        return {m: list(h.target_of(m).names()) for m in sorted(h.state.members)}


# --- the helpers can fail ---------------------------------------------------------------------


def test_assert_installable_refuses_a_resource_assigned_twice() -> None:
    group = view({"A": 1}, ["w1", "w2"])
    result = AssignmentResult(members={"w1": rs("A", "A-0"), "w2": rs("A")})

    with pytest.raises(AssertionError, match="more than once"):
        assert_installable(group, result)


def test_assert_installable_refuses_unassigned_resources_without_a_delay() -> None:
    group = view({"A": 1}, ["w1"])

    with pytest.raises(AssertionError, match="unassigned"):
        assert_installable(group, AssignmentResult(members={"w1": rs("A")}))
    assert_installable(
        group, AssignmentResult(members={"w1": rs("A")}, scheduled_rebalance_delay_ms=1)
    )


def test_assert_installable_refuses_unknown_members_and_resources() -> None:
    group = view({"A": 0}, ["w1"])

    with pytest.raises(AssertionError, match="not in the group"):
        assert_installable(group, AssignmentResult(members={"w1": rs("A"), "w9": EMPTY}))
    with pytest.raises(AssertionError, match="not in the catalogue"):
        assert_installable(group, AssignmentResult(members={"w1": rs("A", "B")}))
