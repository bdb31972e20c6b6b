"""DeleteGroup and RemoveMember in the core (issue 30, DESIGN 3.20 "DeleteGroup and
RemoveMember"), driven through the handlers with a fake clock.

- DeleteGroup is refused NON_EMPTY_GROUP, saying why, for a live member, a static member that
  left, a hold, a classic group not EMPTY, and connectors without with_catalogue; it changes
  nothing when refused. Deleted, its tombstone keeps the last epoch and fencing token, and a
  group created again continues both.
- RemoveMember removes a member of either protocol as a fence does: its work held for a session
  timeout (a classic member's own), its ids bound meanwhile, then placed; a static member that
  had left holds nothing.
- A state machine (test_control's, with removals and deletions thrown in): no resource is ever
  held by two workers or a worker and a hold, and neither the group epoch nor the fencing
  tokens ever go down, across any number of deletions and re-creations."""

from __future__ import annotations

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from connect_protocol.errors import ErrorCode
from coordinator_svc.core.classic_model import ClassicState
from coordinator_svc.core.records import EventType, GroupDeletedRecord
from coordinator_svc.core.results import HOLD, Parked

from .classic_harness import SESSION_MS as CLASSIC_SESSION_MS
from .classic_harness import ClassicHarness
from .harness import ALL, W2_SHARE, GroupHarness, ok, rs, stable_group
from .test_control import ControlMachine
from .test_lifecycle import CATALOGUE, MEMBERS


def refused(h: GroupHarness, *words: str, with_catalogue: bool = True) -> None:
    before = h.dump()
    answer = h.delete_group(with_catalogue=with_catalogue)
    assert answer.error_code is ErrorCode.NON_EMPTY_GROUP, answer
    for word in words:
        assert word in answer.error_message, answer.error_message
    assert h.records_of_last_call == [] and h.dump() == before


def session_ms(h: GroupHarness) -> int:
    return h.defaults.session_timeout_ms


# --- DeleteGroup ------------------------------------------------------------------------------


def test_delete_is_refused_for_members_left_static_members_holds_and_connectors() -> None:
    h = stable_group()
    h.join("w3", instance_id="pod-3")
    refused(h, "3 members")
    h.leave("w3", instance_id="pod-3")
    assert h.member("w3").state.value == "LEFT"
    h.leave("w1")
    refused(h, "2 members", "1 of them static")
    ok(h.remove_member(instance_id="pod-3"))
    held = h.remove_member("w2")
    assert (held.error_code, held.resources_held) == (ErrorCode.NONE, len(W2_SHARE))
    refused(h, "holds the work of 1 removed member")
    h.sleep(session_ms(h))
    assert not h.state.meta.holds  # type: ignore[union-attr]
    refused(h, "2 connectors", "with_catalogue", with_catalogue=False)
    answer = h.delete_group(with_catalogue=True)
    assert answer.error_code is ErrorCode.NONE, answer
    assert (answer.connectors_deleted, answer.tasks_deleted) == (2, 3)
    assert h.state is None


def test_delete_of_an_unknown_group_is_group_id_not_found() -> None:
    h = GroupHarness()
    assert h.delete_group().error_code is ErrorCode.GROUP_ID_NOT_FOUND
    assert h.remove_member("w1").error_code is ErrorCode.GROUP_ID_NOT_FOUND


def test_deleted_group_keeps_its_counters_and_a_new_one_continues_them() -> None:
    h = stable_group()
    tokens_before = {t for m in ("w1", "w2") for t in h.member(m).tokens.values()}
    h.leave("w1")
    h.leave("w2")
    epoch, last_token = h.group_epoch, h.state.meta.last_fencing_token  # type: ignore[union-attr]
    answer = h.delete_group(with_catalogue=True)
    assert (answer.group_epoch, answer.last_fencing_token) == (epoch, last_token)
    assert last_token == max(tokens_before)
    (deleted,) = [r for r in h.records_of_last_call if isinstance(r, GroupDeletedRecord)]
    assert (deleted.tombstone.group_epoch, deleted.tombstone.last_fencing_token) == (
        epoch,
        last_token,
    )
    (event_,) = h.last_events(EventType.GROUP_DELETED)
    assert event_.group_epoch == epoch and event_.payload["tasks_deleted"] == 3

    # Created again under the same id: epochs continue above, tokens above every earlier one.
    h.put_connector("A", 2)
    assert h.group_epoch == epoch + 2  # created at epoch + 1, bumped by the connector
    (created,) = h.logged_events(EventType.GROUP_CREATED)[-1:]
    assert created.group_epoch == epoch + 1
    assert created.payload["continues_from_epoch"] == epoch
    h.join("w1")
    h.compute("w1", {"w1": rs("A", "A-0", "A-1")})
    h.ack("w1")
    assert min(h.member("w1").tokens.values()) > max(tokens_before)
    assert h.rebuilt() == h.dump()  # a takeover loads the new incarnation as it is


def test_a_group_created_fresh_under_another_id_ignores_the_tombstone() -> None:
    h = GroupHarness()
    h.put_connector("A", 1)
    h.delete_group(with_catalogue=True)
    other = GroupHarness(group_id="other")
    other.tombstone = h.tombstone  # another group's tombstone never applies
    other.put_connector("A", 1)
    assert other.logged_events(EventType.GROUP_CREATED)[0].group_epoch == 1


def test_a_classic_group_is_deletable_only_once_empty() -> None:
    h = ClassicHarness()
    h.put_connector("A", 1)
    h.form(["w1"], {"w1": rs("A", "A-0")})
    refused(h, "is STABLE, not EMPTY (1 members)")
    removed = h.remove_member("w1", reason="host gone")
    assert removed.error_code is ErrorCode.NONE, removed
    assert removed.held_until_ms == h.now_ms + CLASSIC_SESSION_MS
    assert h.classic_state is ClassicState.EMPTY  # nobody left to rejoin
    refused(h, "holds the work of 1 removed member")
    h.sleep(CLASSIC_SESSION_MS)
    assert h.classic_state is ClassicState.EMPTY
    ok(h.delete_group(with_catalogue=True))
    assert h.state is None


# --- RemoveMember -----------------------------------------------------------------------------


def test_a_removed_member_is_fenced_its_work_held_for_a_session_then_placed() -> None:
    h = stable_group()
    epoch = h.group_epoch
    answer = h.remove_member("w2", reason="decommissioned")
    assert answer.error_code is ErrorCode.NONE, answer
    assert (answer.member_id, answer.group_epoch) == ("w2", epoch + 1)
    assert answer.held_until_ms == h.now_ms + session_ms(h)
    (removed,) = h.last_events(EventType.MEMBER_REMOVED)
    assert removed.payload["reason"] == "decommissioned"
    assert removed.payload["caller"] == "test"
    assert h.deadline((HOLD, "w2")) == answer.held_until_ms
    assert not h.has_member("w2")
    # The assignor gives w1 everything; it gets B and B-0 only once the hold ends.
    h.compute("w1", {"w1": ALL})
    h.ack("w1")
    assert h.member("w1").owned == rs("A", "A-0", "A-1")
    h.run_for(session_ms(h) - 200, "w1")
    h.ack("w1")
    assert h.member("w1").owned == rs("A", "A-0", "A-1")
    h.run_for(400, "w1")
    h.ack("w1")
    assert h.member("w1").owned == ALL
    assert h.logged_events(EventType.HOLD_RELEASED)[-1].member_id == "w2"


def test_a_removed_members_id_stays_bound_while_its_work_is_held() -> None:
    h = stable_group()
    h.remove_member("w2")
    assert h.state is not None
    (hold,) = h.state.meta.holds
    assert hold.member_id == "w2" and hold.resources == W2_SHARE


def test_a_static_member_that_left_holds_nothing_when_removed() -> None:
    h = stable_group()
    h.join("w3", instance_id="pod-3")
    h.leave("w3", instance_id="pod-3")
    answer = h.remove_member(instance_id="pod-3")
    assert (answer.member_id, answer.resources_held, answer.held_until_ms) == ("w3", 0, 0)
    assert h.state is not None and not [x for x in h.state.meta.holds if x.member_id == "w3"]
    (removed,) = h.last_events(EventType.MEMBER_REMOVED)
    assert removed.payload["static_left"] is True


def test_remove_member_refuses_unknown_members_and_bad_names() -> None:
    h = stable_group()
    before = h.dump()
    assert h.remove_member("nobody").error_code is ErrorCode.UNKNOWN_MEMBER_ID
    assert h.remove_member(instance_id="nobody").error_code is ErrorCode.UNKNOWN_MEMBER_ID
    assert h.remove_member().error_code is ErrorCode.INVALID_REQUEST
    assert h.remove_member("w1", instance_id="x").error_code is ErrorCode.INVALID_REQUEST
    too_long = h.remove_member("w1", reason="r" * 300)
    assert too_long.error_code is ErrorCode.INVALID_REQUEST
    assert h.dump() == before


def test_removing_a_classic_member_holds_its_work_for_its_own_session() -> None:
    h = ClassicHarness()
    h.put_connector("A", 1)
    h.form(["w1", "w2"], {"w1": rs("A", "A-0")})
    answer = h.remove_member("w1")
    assert answer.resources_held == 2
    assert answer.held_until_ms == h.now_ms + CLASSIC_SESSION_MS
    assert h.classic_state is ClassicState.PREPARING_REBALANCE  # a rebalance started
    answer_ = h.join("w2", allocation=rs())
    joined = answer_ if not isinstance(answer_, Parked) else h.join_answer("w2")
    assert joined.generation_id > 0 and joined.withheld == rs("A", "A-0"), joined


# --- the machine ------------------------------------------------------------------------------


class RemovalMachine(ControlMachine):
    """test_control's machine with RemoveMember, and DeleteGroup (with its catalogue) once
    every member is gone, then the catalogue put back: across incarnations the group epoch and
    the last fencing token never go down, and every grant's token is above every token the
    group granted before."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch = 0
        self.last_token = 0
        self.deletions = 0

    @rule(member=st.sampled_from(MEMBERS))
    def remove(self, member: str) -> None:
        if member not in self.joined():
            return
        held = self.h.member(member).owned
        answer = self.h.remove_member(member)
        assert answer.error_code is ErrorCode.NONE, answer
        assert answer.resources_held == len(held)
        event("member removed")

    @rule()
    def time_passes(self) -> None:
        self.h.run_for(self.h.defaults.session_timeout_ms, *self.joined())

    @rule()
    def delete_and_recreate(self) -> None:
        state = self.h.state
        assert state is not None
        answer = self.h.delete_group(with_catalogue=True)
        if state.members or any(x.until_ms > self.h.now_ms for x in state.meta.holds):
            assert answer.error_code is ErrorCode.NON_EMPTY_GROUP, answer
            return
        assert answer.error_code is ErrorCode.NONE, answer
        self.deletions += 1
        event("group deleted")
        for name, tasks in CATALOGUE.items():
            self.h.put_connector(name, tasks, {"v": "0"})
        self.counts.clear()  # restart counts start afresh with the new catalogue

    @invariant()
    def counters_never_go_down(self) -> None:
        state = self.h.state
        if state is None:
            return
        assert state.group_epoch >= self.epoch
        assert state.meta.last_fencing_token >= self.last_token
        for member in state.members.values():
            for token in member.tokens.values():
                assert token <= state.meta.last_fencing_token
        self.epoch, self.last_token = state.group_epoch, state.meta.last_fencing_token


RemovalMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_removal_machine = RemovalMachine.TestCase
