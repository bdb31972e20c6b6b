"""Empty conversions and cross-type refusals (issue 25 P3; DESIGN 3.19 "Empty conversions"):
an EMPTY group with no holds (no members at all, none LEFT either) changes type keeping its
catalogue, configurations and fencing token counter, with the group epoch and the generation one
counter that never goes down; a connect join into a non-empty classic group whose migration
policy forbids the upgrade is INCONSISTENT_GROUP_PROTOCOL naming the group's type and policy
(the upgrade itself: tests/core/test_migration.py), any other connect call on a classic group is
refused, and a refused join converts nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from connect_protocol.classic_messages import ClassicProtocol, ConnectWorkerMetadata
from connect_protocol.configs import MIGRATION_POLICY, SCHEDULED_REBALANCE_MAX_DELAY_MS
from connect_protocol.errors import ErrorCode
from coordinator_svc.core import replay
from coordinator_svc.core.change import GroupChange
from coordinator_svc.core.classic_model import (
    ClassicGroupMeta,
    ClassicMemberInfo,
    ClassicState,
    GroupType,
    PendingId,
)
from coordinator_svc.core.conversion import convertible, to_classic, to_connect
from coordinator_svc.core.errors import IllegalStateError
from coordinator_svc.core.model import Member
from coordinator_svc.core.records import EventType
from coordinator_svc.core.results import (
    CLASSIC_JOIN,
    CLASSIC_PENDING,
    CLASSIC_SYNC,
    SCHEDULED_REBALANCE,
    CancelTimer,
    Result,
)

from .harness import DEFAULTS, GroupHarness, rs


def run(h: GroupHarness, edit: Callable[[GroupChange], None]) -> Result[None]:
    """Apply `edit` to a change of the harness's group and apply its records, as a handler
    would (through the harness's own checks: the state given is never changed in place)."""
    result: list[Result[None]] = []

    def handler(state: object) -> Result[None]:
        change = GroupChange(h.state, h.group_id, h.now_ms, h.defaults)
        edit(change)
        result.append(change.result(None))
        return result[0]

    h._run(handler)  # the harness's plumbing: replay, timers, log
    return result[0]


def classic_member(member_id: str, generation: int, held: str = "") -> Member:
    return Member(
        member_id=member_id,
        member_epoch=generation,
        rebalance_timeout_ms=5_000,
        assigned=rs(held) if held else rs(),
        principal="",
        classic=ClassicMemberInfo(
            protocols=(
                ClassicProtocol("compatible", ConnectWorkerMetadata(1, f"http://{member_id}")),
            ),
            session_timeout_ms=6_000,
            last_joined_generation=generation,
        ),
    )


def used_connect_group() -> GroupHarness:
    """A group made by PutConnector, configured, that had a member which ran work (so its
    fencing token counter moved) and left: EMPTY, no holds."""
    h = GroupHarness()
    h.put_connector("A", 2, {"k": "v"})
    assert h.alter_configs({SCHEDULED_REBALANCE_MAX_DELAY_MS: "1234"}).error_code == 0
    h.join("w1")
    h.compute("w1", {"w1": rs("A", "A-0", "A-1")})
    h.ack("w1")
    assert h.member("w1").tokens, "w1 was granted its work"
    h.leave("w1")
    assert h.state is not None and not h.state.members and not h.state.meta.holds
    return h


def make_classic(h: GroupHarness) -> None:
    run(h, to_classic)


def test_a_connect_group_made_by_put_connector_converts_to_classic_keeping_what_it_had() -> None:
    h = used_connect_group()
    assert h.state is not None
    before = h.state.meta
    catalogue, configs = dict(h.state.catalogue), dict(h.state.configs)
    assert convertible(h.state)
    make_classic(h)
    state = h.state
    assert state.meta.group_type is GroupType.CLASSIC
    assert state.meta.classic == ClassicGroupMeta(ClassicState.EMPTY)
    assert state.display_state() == "EMPTY"
    # Generation = group epoch: the counter is kept, never goes down.
    assert state.group_epoch == before.group_epoch and state.assignment_epoch == before.group_epoch
    assert state.meta.last_fencing_token == before.last_fencing_token > 0
    assert dict(state.catalogue) == catalogue and dict(state.configs) == configs
    (event,) = h.last_events(EventType.GROUP_CONVERTED)
    assert event.payload == {
        "direction": "to_classic",
        "group_epoch_before": before.group_epoch,
        "generation": before.group_epoch,
        "members": {"classic": 0, "connect": 0},
    }
    assert event.group_epoch == before.group_epoch


def test_to_classic_drops_a_scheduled_rebalance_and_any_computation_state() -> None:
    h = used_connect_group()
    assert h.state is not None

    def scheduled(change: GroupChange) -> None:
        change.set_target(replace(change.target, scheduled_rebalance_at_ms=h.now_ms + 500))
        change.set_meta(assignor_member_id="gone", excluded_assignors=frozenset({"x"}))
        change.schedule((SCHEDULED_REBALANCE, ""), h.now_ms + 500)

    run(h, scheduled)
    result = run(h, to_classic)
    assert CancelTimer((SCHEDULED_REBALANCE, "")) in result.timers
    assert h.deadline((SCHEDULED_REBALANCE, "")) is None
    assert h.state is not None
    assert h.state.target.scheduled_rebalance_at_ms is None
    assert h.state.meta.assignor_member_id is None and not h.state.meta.excluded_assignors


def test_a_classic_group_converts_back_to_connect_with_epochs_at_the_generation() -> None:
    h = used_connect_group()
    make_classic(h)
    assert h.state is not None
    token = h.state.meta.last_fencing_token

    def later_generation(change: GroupChange) -> None:  # generations went on while classic
        change.set_meta(group_epoch=change.group_epoch + 5)
        change.put_pending_id("p1", PendingId("User:w", 6_000, h.now_ms + 6_000))
        change.schedule((CLASSIC_PENDING, "p1"), h.now_ms + 6_000)
        change.join_round("ghost")  # a stale round entry: dropped too
        change.set_round(reason="member joined", leader_unavailable_reason="nobody")

    run(h, later_generation)
    generation = h.state.group_epoch
    result = run(h, to_connect)
    state = h.state
    assert state.meta.group_type is GroupType.CONNECT and state.meta.classic is None
    assert state.group_epoch == state.assignment_epoch == generation
    assert state.meta.last_fencing_token == token
    assert state.round is not None and not state.round.pending_ids and not state.round.joined
    assert state.round.leader_unavailable_reason == ""
    for key in ((CLASSIC_PENDING, "p1"), (CLASSIC_JOIN, ""), (CLASSIC_SYNC, "")):
        assert CancelTimer(key) in result.timers
    assert h.deadline((CLASSIC_PENDING, "p1")) is None
    (event,) = h.last_events(EventType.GROUP_CONVERTED)
    assert event.payload["direction"] == "to_connect"
    assert event.payload["group_epoch_before"] == event.payload["generation"] == generation


def test_to_connect_never_makes_an_epoch_below_one() -> None:
    """A classic group at generation 0 (Kafka's first generation number; not one this core
    makes, but a stored row may say so) becomes a connect group at epoch 1."""
    change = GroupChange(None, "g0", 0, DEFAULTS)
    change.set_meta(
        group_epoch=0, group_type=GroupType.CLASSIC, classic=ClassicGroupMeta(ClassicState.EMPTY)
    )
    change.set_target(replace(change.target, assignment_epoch=0))
    state = replay.new_state(change.records())
    assert state.group_epoch == 0
    converting = GroupChange(state, "g0", 1, DEFAULTS)
    to_connect(converting)
    for record in converting.records():
        replay.apply(state, record)
    assert state.group_epoch == state.assignment_epoch == 1
    assert not state.meta.is_classic


def test_only_an_empty_group_without_holds_is_convertible() -> None:
    h = used_connect_group()
    assert h.state is not None and convertible(h.state)
    # A static member that left is still a member.
    h.join("s1", instance_id="i1")
    h.leave("s1", instance_id="i1")
    assert h.state.members["s1"].state.value == "LEFT"
    assert not convertible(h.state)
    with pytest.raises(IllegalStateError, match="members or holds"):
        run(h, to_classic)
    # A hold: a removed member may still run what it held.
    g = used_connect_group()
    run(g, lambda change: change.add_hold("gone", rs("A"), g.now_ms + 1_000))
    assert g.state is not None and not convertible(g.state)
    change = GroupChange(g.state, g.group_id, g.now_ms, g.defaults)
    assert not convertible(change)
    change.release_hold("gone")
    assert convertible(change)  # as the change leaves it


def test_conversions_refuse_the_wrong_direction() -> None:
    h = used_connect_group()
    with pytest.raises(IllegalStateError, match="not classic"):
        run(h, to_connect)
    make_classic(h)
    with pytest.raises(IllegalStateError, match="already classic"):
        run(h, to_classic)


def classic_group(members: int = 2, generation: int = 4) -> GroupHarness:
    """A STABLE classic group of `members` members at `generation` (built directly, as P1's
    join would), with connector A in its catalogue."""
    h = used_connect_group()
    make_classic(h)

    def fill(change: GroupChange) -> None:
        change.set_target(replace(change.target, assignment_epoch=generation))
        change.set_meta(
            group_epoch=generation,
            classic=ClassicGroupMeta(ClassicState.STABLE, "compatible", "c1" if members else None),
        )
        for i in range(members):
            change.put_member(classic_member(f"c{i + 1}", generation, "A" if i == 0 else ""))

    run(h, fill)
    return h


def test_a_connect_join_into_an_empty_classic_group_converts_it_and_joins() -> None:
    h = classic_group(members=0, generation=7)
    assert h.state is not None
    token = h.state.meta.last_fencing_token
    resp = h.join("w1")
    # w1 is the only member: asked to compute at once.
    assert resp.error_code in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT), resp
    state = h.state
    assert state.meta.group_type is GroupType.CONNECT and "w1" in state.members
    # group epoch = assignment epoch = generation, then the join bumps the group epoch.
    assert state.assignment_epoch == 7 and state.group_epoch == 8
    assert state.meta.last_fencing_token == token
    events = h.events_of_last_call()
    assert events.index(EventType.GROUP_CONVERTED) < events.index(EventType.MEMBER_JOINED)


def test_a_refused_connect_join_leaves_the_empty_classic_group_classic() -> None:
    h = classic_group(members=0, generation=7)
    resp = h.join("w1", assignors=())  # no assignor: refused after the conversion was made
    assert resp.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
    assert h.records_of_last_call == []
    assert h.state is not None and h.state.meta.group_type is GroupType.CLASSIC


@pytest.mark.parametrize("policy", ["downgrade", "disabled"])
def test_a_connect_join_into_a_non_empty_classic_group_is_refused_where_the_policy_forbids(
    policy: str,
) -> None:
    h = classic_group(members=2)
    assert h.alter_configs({MIGRATION_POLICY.name: policy}).error_code == 0
    before = h.dump()
    resp = h.join("w1")
    assert resp.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert "classic group" in resp.error_message and repr(policy) in resp.error_message
    assert MIGRATION_POLICY.name in resp.error_message
    assert h.records_of_last_call == [] and h.dump() == before


def test_a_connect_join_into_an_empty_classic_group_with_a_hold_upgrades_it() -> None:
    """Not convertible as empty (a removed member may still run its held work): an upgrade,
    which keeps the hold."""
    h = classic_group(members=0)
    run(h, lambda change: change.add_hold("gone", rs("A"), h.now_ms + 6_000))
    resp = h.join("w1")
    assert resp.error_code in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT), resp
    assert h.state is not None and h.state.meta.group_type is GroupType.CONNECT
    assert [hold.member_id for hold in h.state.meta.holds] == ["gone"]
    (event,) = h.last_events(EventType.GROUP_CONVERTED)
    assert event.payload["direction"] == "to_connect"


@pytest.mark.parametrize("epoch", [4, 1, -1])
def test_other_connect_heartbeats_to_a_classic_group_are_unknown_member(epoch: int) -> None:
    """Even naming a classic member's id and generation: no connect member is in it."""
    h = classic_group(members=2, generation=4)
    before = h.dump()
    resp = h.heartbeat("c1", epoch)
    assert resp.error_code == ErrorCode.UNKNOWN_MEMBER_ID, resp
    assert "classic group" in resp.error_message
    assert h.dump() == before


def test_a_static_leave_to_a_classic_group_is_unknown_member() -> None:
    h = classic_group(members=1)
    resp = h.heartbeat("c1", -2, instance_id="i1")
    assert resp.error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_prepare_and_install_on_a_classic_group_are_inconsistent_protocol() -> None:
    h = classic_group(members=2, generation=4)
    before = h.dump()
    prepared = h.prepare("c1", 4)
    assert prepared.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert "classic group" in prepared.error_message
    installed = h.install("c1", {"c1": rs("A")}, group_epoch=4, member_epoch=4)
    assert installed.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert "classic group" in installed.error_message
    assert h.dump() == before


def test_connect_to_classic_to_connect_never_lowers_the_counter() -> None:
    h = used_connect_group()
    assert h.state is not None
    seen = [h.state.group_epoch]
    make_classic(h)
    seen.append(h.state.group_epoch)
    h.join("w1")  # converts back and joins
    seen.append(h.state.group_epoch)
    assert seen == sorted(seen) and seen[-1] > seen[0]
    directions = [e.payload["direction"] for e in h.logged_events(EventType.GROUP_CONVERTED)]
    assert directions == ["to_classic", "to_connect"]


def test_a_group_created_in_the_same_change_converts() -> None:
    """What a classic JoinGroup creating its group may do (P1): create, then convert, in one
    change; the records replay into a new classic group."""
    change = GroupChange(None, "fresh", 5, DEFAULTS, creator="User:w")
    assert convertible(change)
    to_classic(change)
    state = replay.new_state(change.records())
    assert state.meta.is_classic and state.group_epoch == state.assignment_epoch == 1
    assert state.meta.created_by == "User:w"
