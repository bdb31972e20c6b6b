"""Work done outside the group's lock (issue 10): a Prepare's answer built from what it captured,
and an install planned before the lock, give exactly what the one-step handlers give; a plan
the group moved past is not used."""

from __future__ import annotations

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import InstallRequest, MemberTarget, PrepareRequest
from connect_protocol.resources import ResourceSet
from coordinator_svc.core.assignment import (
    finish_prepare,
    install_assignment,
    plan_install,
    prepare_assignment,
    start_prepare,
)
from tests.core.harness import DEFAULTS, GroupHarness, rs


def assigning_group() -> tuple[GroupHarness, str]:
    h = GroupHarness()
    h.put_connector("A", 3)
    h.put_connector("B", 2)
    for m in ("w1", "w2", "w3"):
        h.join(m)
    assert h.state is not None and h.state.meta.assignor_member_id is not None
    assignor = h.state.meta.assignor_member_id
    h.heartbeat(assignor, h.member(assignor).member_epoch)
    return h, assignor


def test_a_prepare_in_two_steps_answers_what_one_step_answers() -> None:
    h, assignor = assigning_group()
    req = PrepareRequest(h.group_id, assignor, h.member(assignor).member_epoch)

    one = prepare_assignment(h.state, req, h.now_ms, DEFAULTS)
    started = start_prepare(h.state, req, h.now_ms, DEFAULTS)

    assert started.records == one.records
    assert finish_prepare(started.response) == one.response
    assert one.response.error_code is ErrorCode.NONE and len(one.response.members) == 3


def install_request(
    h: GroupHarness, assignor: str, shares: dict[str, ResourceSet]
) -> InstallRequest:
    prepared = h.prepare(assignor)
    return InstallRequest(
        h.group_id,
        assignor,
        h.member(assignor).member_epoch,
        prepared.group_epoch,
        members=tuple(MemberTarget(m, r, 2, b"") for m, r in shares.items()),
    )


SHARES = {"w1": rs("A", "A-0", "A-1"), "w2": rs("B", "A-2"), "w3": rs("B-0", "B-1")}


def test_a_planned_install_installs_what_an_unplanned_one_installs() -> None:
    h, assignor = assigning_group()
    req = install_request(h, assignor, SHARES)

    plan = plan_install(h.state, req)
    assert plan is not None and h.state is not None and plan.applies_to(h.state, req)
    planned = install_assignment(h.state, req, h.now_ms, DEFAULTS, plan)
    unplanned = install_assignment(h.state, req, h.now_ms, DEFAULTS)

    assert planned == unplanned
    assert planned.response.error_code is ErrorCode.NONE


def test_a_plan_is_not_used_once_the_group_moved_on() -> None:
    h, assignor = assigning_group()
    req = install_request(h, assignor, SHARES)
    plan = plan_install(h.state, req)
    assert plan is not None

    h.leave("w3")  # a member of the plan left: the target must drop its share
    assert h.state is not None and not plan.applies_to(h.state, req)
    result = install_assignment(h.state, req, h.now_ms, DEFAULTS, plan)

    assert result == install_assignment(h.state, req, h.now_ms, DEFAULTS)
    assert result.response.error_code is ErrorCode.NONE


def test_an_install_the_full_path_refuses_gets_no_plan() -> None:
    h, assignor = assigning_group()
    bad = install_request(h, assignor, {**SHARES, "w3": rs("B-0", "B-1", "A-0")})  # A-0 twice
    assert plan_install(h.state, bad) is None
    result = install_assignment(h.state, bad, h.now_ms, DEFAULTS)
    assert result.response.error_code is ErrorCode.INVALID_ASSIGNMENT
