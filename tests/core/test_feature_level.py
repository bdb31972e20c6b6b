"""The cluster feature group.version in the connect heartbeat (DESIGN 3.19 "Feature flag"): at
level 0 no new member is admitted with the connect protocol (UNSUPPORTED_VERSION, nothing
changed), while members already admitted go on, leave and rejoin under their member id (a
static member that left, a fenced member whose work is held); a classic group admits no connect
joiner, an empty one included. Level 1 is what every other core test runs at."""

from __future__ import annotations

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import HeartbeatRequest, HeartbeatResponse
from coordinator_svc.core.classic_model import GroupType
from coordinator_svc.core.conversion import to_classic
from coordinator_svc.core.heartbeat import heartbeat
from coordinator_svc.core.model import MemberState

from .harness import W1_SHARE, GroupHarness, ok, stable_group
from .test_conversions import run, used_connect_group

UNSUPPORTED_VERSION = ErrorCode.UNSUPPORTED_VERSION


def at_level(h: GroupHarness, level: int) -> GroupHarness:
    """`h` whose heartbeats are handled at group.version `level` from now on."""

    def send(req: HeartbeatRequest) -> HeartbeatResponse:
        return h._run(lambda s: heartbeat(s, req, h.now_ms, h.defaults, group_version=level))

    h.send = send  # type: ignore[method-assign]
    return h


def refused(h: GroupHarness, response: HeartbeatResponse) -> None:
    """UNSUPPORTED_VERSION naming the feature, its level and both ways out; nothing written."""
    assert response.error_code == UNSUPPORTED_VERSION, response
    assert "group.version is at level 0" in response.error_message
    assert "classic protocol" in response.error_message
    assert "coordinator-svc features update" in response.error_message
    assert h.records_of_last_call == []


def test_level_0_refuses_the_first_member_of_a_new_group_and_creates_nothing() -> None:
    h = at_level(GroupHarness(), 0)
    refused(h, h.join("w1"))
    assert h.state is None


def test_level_0_refuses_a_new_member_of_a_running_group_and_changes_nothing() -> None:
    h = stable_group()
    before = h.dump()
    at_level(h, 0)
    refused(h, h.join("w3"))
    assert h.dump() == before


def test_admitted_members_keep_heartbeating_and_may_leave_at_level_0() -> None:
    h = at_level(stable_group(), 0)
    ok(h.ack("w1"))
    ok(h.keepalive("w2"))
    assert h.member("w1").assigned == W1_SHARE
    ok(h.leave("w2"))
    assert not h.has_member("w2")
    refused(h, h.join("w2"))  # gone: now a new member


def test_a_member_rejoining_with_its_member_id_is_admitted_at_level_0() -> None:
    h = at_level(stable_group(), 0)
    response = h.join("w1", owned=W1_SHARE)
    ok(response)
    assert h.member("w1").assigned == W1_SHARE


def test_a_static_member_that_left_rejoins_under_its_member_id_but_a_new_pod_is_new() -> None:
    h = stable_group()
    ok(h.join("w3", instance_id="i3"))
    ok(h.leave("w3", instance_id="i3"))
    assert h.member("w3").state is MemberState.LEFT
    at_level(h, 0)
    # A restarted pod has a new member id: a new member, refused (DESIGN: "a member id the
    # group does not have"); its work stays held as a LEFT member's until its session expires.
    refused(h, h.join("w4", instance_id="i3"))
    ok(h.join("w3", instance_id="i3"))
    assert h.member("w3").state is MemberState.STABLE


def test_a_fenced_member_whose_work_is_held_rejoins_at_level_0() -> None:
    h = stable_group()
    fenced = h.heartbeat("w1", h.member("w1").member_epoch + 7, owned=W1_SHARE)
    assert fenced.error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert not h.has_member("w1")
    at_level(h, 0)
    ok(h.join("w1"))
    assert h.has_member("w1")


def test_an_empty_classic_group_admits_no_connect_joiner_at_level_0_and_converts_at_1() -> None:
    h = used_connect_group()
    run(h, to_classic)
    assert h.state is not None and h.state.meta.group_type is GroupType.CLASSIC
    at_level(h, 0)
    refused(h, h.join("w1"))
    assert h.state.meta.group_type is GroupType.CLASSIC
    at_level(h, 1)
    ok(h.join("w1"))
    assert h.state.meta.group_type is GroupType.CONNECT
