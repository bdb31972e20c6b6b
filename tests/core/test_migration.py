"""Online migration between the protocols in the core (issue 27; DESIGN 3.19 "Migration policy",
"Upgrade", "Classic members of a connect group", "Downgrade"): one group whose workers restart one
by one with the other protocol, driven through the real handlers on a fake clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from connect_protocol.classic_messages import JoinGroupResponse, SyncGroupResponse
from connect_protocol.configs import MIGRATION_POLICY
from connect_protocol.errors import ErrorCode
from connect_protocol.messages import Assignor, HeartbeatRequest
from connect_protocol.resources import ResourceSet
from coordinator_svc.core.classic_model import ClassicState, GroupType
from coordinator_svc.core.heartbeat import heartbeat
from coordinator_svc.core.mixed_group import assignors_of
from coordinator_svc.core.model import MemberState
from coordinator_svc.core.records import EventType
from coordinator_svc.core.results import CLASSIC_MEMBER_DEADLINE, SESSION, Parked
from coordinator_svc.core.selection import select

from .classic_harness import (
    CLASSIC_DEFAULTS,
    REBALANCE_MS,
    SESSION_MS,
    ClassicHarness,
    protocols,
)
from .harness import GroupHarness, rs

#: Assignment batching off, so every epoch bump asks the assignor member at once.
DEFAULTS = replace(CLASSIC_DEFAULTS, assignment_interval_ms=0)
SESSIONED = (Assignor("incremental_cooperative", 1, 2, version=2), Assignor("eager", 0, 0))


class MixedHarness(ClassicHarness):
    """A classic harness whose connect calls are enabled too (the group changes type)."""

    def __init__(self) -> None:
        super().__init__("mg", DEFAULTS)

    def heartbeat(self, *args, **kw):  # type: ignore[no-untyped-def,override]
        return GroupHarness.heartbeat(self, *args, **kw)

    def connect_join(self, member_id: str, **kw):  # type: ignore[no-untyped-def]
        kw.setdefault("assignors", SESSIONED)
        return GroupHarness.join(self, member_id, **kw)

    def connect_keepalive(self, member_id: str):  # type: ignore[no-untyped-def]
        return GroupHarness.keepalive(self, member_id)

    def type(self) -> GroupType:
        assert self.state is not None
        return self.state.meta.group_type

    def policy(self, policy: str) -> None:
        assert self.alter_configs({MIGRATION_POLICY.name: policy}).error_code == 0

    def connect_ack(self, member_id: str):  # type: ignore[no-untyped-def]
        m = self.member(member_id)
        return GroupHarness.heartbeat(self, member_id, m.member_epoch, owned=m.assigned)

    def classic_round(
        self, member_id: str, allocation: ResourceSet, kind: str = "sessioned"
    ) -> tuple[JoinGroupResponse, SyncGroupResponse]:
        """A classic member's JoinGroup (reporting `allocation`) and SyncGroup, each answered."""
        joined = self.join(member_id, allocation=allocation, kind=kind)
        assert isinstance(joined, JoinGroupResponse), joined
        assert joined.error_code == ErrorCode.NONE, joined
        synced = self.sync(member_id, generation=joined.generation_id)
        assert isinstance(synced, SyncGroupResponse), synced
        return joined, synced


def classic_group_running(kind: str = "sessioned") -> MixedHarness:
    """c1 and c2 (classic, `kind`) STABLE, c1 holding connector A and A-0, c2 A-1."""
    h = MixedHarness()
    h.put_connector("A", 2)
    h.form(["c1", "c2"], {"c1": rs("A", "A-0"), "c2": rs("A-1")}, kind=kind)
    return h


def upgraded() -> MixedHarness:
    """The running classic group after w1 joined with the connect protocol."""
    h = classic_group_running()
    resp = h.connect_join("w1")
    assert resp.error_code in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT), resp
    return h


# --- the assignor mapping ----------------------------------------------------------------


def test_protocols_map_to_assignor_ranges_in_order() -> None:
    assert assignors_of(protocols("sessioned")) == (
        Assignor("incremental_cooperative", 1, 2, version=2),
        Assignor("eager", 0, 0, version=0),
    )
    assert assignors_of(protocols("compatible")) == (
        Assignor("incremental_cooperative", 1, 1, version=1),
        Assignor("eager", 0, 0, version=0),
    )
    assert assignors_of(protocols("default")) == (Assignor("eager", 0, 0, version=0),)


# --- upgrade ------------------------------------------------------------------------------


def test_the_first_connect_join_upgrades_a_running_classic_group_moving_nothing() -> None:
    h = classic_group_running()
    generation = h.generation
    resp = h.connect_join("w1")
    assert resp.error_code == ErrorCode.COMPUTE_ASSIGNMENT, resp  # w1 is the only one to compute
    assert h.type() is GroupType.CONNECT
    (converted,) = h.logged_events(EventType.GROUP_CONVERTED)[-1:]
    assert converted.payload["direction"] == "to_connect"
    assert converted.payload["members"] == {"classic": 2, "connect": 0}
    assert converted.payload["generation"] == generation
    for member_id, held in (("c1", rs("A", "A-0")), ("c2", rs("A-1"))):
        m = h.member(member_id)
        assert m.member_epoch == generation and m.assigned == held
        assert m.state is MemberState.STABLE and m.classic is not None
        assert h.target_of(member_id) == held  # the target is what they hold: nothing moves
    assert h.assignment_epoch == generation
    assert h.group_epoch == generation + 1  # w1's join
    assert h.state is not None and h.state.meta.assignor_member_id == "w1"
    assert h.member("w1").assigned == rs()


def test_an_upgrade_keeps_a_pending_revocation_and_its_member_unrevoked() -> None:
    h = classic_group_running()
    h.put_connector("B", 0)  # a classic rebalance: PREPARING
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    joined = h.join("c1", allocation=rs("A", "A-0"))  # parked in the join phase
    assert isinstance(joined, Parked)
    resp = h.connect_join("w1")
    assert resp.error_code == ErrorCode.COMPUTE_ASSIGNMENT
    # The parked JoinGroup is answered REBALANCE_IN_PROGRESS: the worker sends it again.
    (wakeup,) = [w for w in h.wakeups_of_last_call if w.member_id == "c1"]
    assert wakeup.response.error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert h.type() is GroupType.CONNECT


@pytest.mark.parametrize("policy", ["bidirectional", "upgrade"])
def test_upgrade_allowed_by_policy(policy: str) -> None:
    h = classic_group_running()
    h.policy(policy)
    assert h.connect_join("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    assert h.type() is GroupType.CONNECT


# --- classic members of a connect group: the translated calls ----------------------------


def test_classic_heartbeats_after_the_upgrade_are_answered_without_a_write() -> None:
    h = upgraded()
    resp = h.hb("c1", generation=h.member("c1").member_epoch)
    assert resp.error_code == ErrorCode.NONE
    assert h.records_of_last_call == []
    assert h.deadline((SESSION, "c1")) == h.now_ms + SESSION_MS


def test_a_new_target_makes_classic_members_rejoin_and_revoke_before_it_is_given() -> None:
    h = upgraded()
    c1_epoch = h.member("c1").member_epoch
    h.compute("w1", {"c1": rs("A"), "c2": rs("A-1"), "w1": rs("A-0")})
    # Classic members are never moved at install: c1 and c2 learn the epoch by JoinGroup.
    assert h.member("c2").member_epoch == c1_epoch
    hb = h.hb("c1", generation=c1_epoch)
    assert hb.error_code == ErrorCode.REBALANCE_IN_PROGRESS
    deadline = h.deadline((CLASSIC_MEMBER_DEADLINE, "c1"))
    assert deadline == h.now_ms + REBALANCE_MS
    h.sleep(10)
    assert h.hb("c1", generation=c1_epoch).error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert h.deadline((CLASSIC_MEMBER_DEADLINE, "c1")) == deadline  # the first answer's
    # w1 waits for A-0, which c1 still runs.
    h.connect_ack("w1")
    assert h.member("w1").assigned == rs() and h.member("w1").state is MemberState.UNRELEASED
    joined, synced = h.classic_round("c1", rs("A", "A-0"))
    assert joined.generation_id == c1_epoch  # UNREVOKED: still at its epoch
    assert joined.leader == "" and joined.members == () and joined.protocol_name == "sessioned"
    assert synced.error_code == ErrorCode.NONE
    assert synced.assignment is not None
    assert synced.assignment.revoked == rs("A-0") and synced.assignment.assignment == rs()
    assert h.member("c1").state is MemberState.UNREVOKED
    # Connect's worker stops A-0 and rejoins reporting what it still runs.
    joined, synced = h.classic_round("c1", rs("A"))
    assert joined.generation_id == h.assignment_epoch
    assert synced.assignment is not None
    assert synced.assignment.revoked == rs() and synced.assignment.assignment == rs()
    assert h.member("c1").state is MemberState.STABLE and h.member("c1").assigned == rs("A")
    assert h.deadline((CLASSIC_MEMBER_DEADLINE, "c1")) is None
    h.connect_ack("w1")
    assert h.member("w1").assigned == rs("A-0")


def test_a_sync_retry_gets_the_same_answer_and_writes_nothing() -> None:
    h = upgraded()
    h.compute("w1", {"c1": rs("A"), "c2": rs("A-1"), "w1": rs("A-0")})
    joined, first = h.classic_round("c1", rs("A", "A-0"))
    again = h.sync("c1", generation=joined.generation_id)
    assert again == first and h.records_of_last_call == []


def test_sync_refusals() -> None:
    h = upgraded()
    epoch = h.member("c2").member_epoch
    wrong = h.sync("c2", generation=epoch + 5)
    assert isinstance(wrong, SyncGroupResponse)
    assert wrong.error_code == ErrorCode.ILLEGAL_GENERATION
    other = h.sync("c2", generation=epoch, protocol_name="default")
    assert isinstance(other, SyncGroupResponse)
    assert other.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    h.compute("w1", {"c1": rs("A", "A-0"), "c2": rs(), "w1": rs("A-1")})
    behind = h.sync("c2", generation=epoch)  # a newer target: rejoin first
    assert isinstance(behind, SyncGroupResponse)
    assert behind.error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert h.hb("c2", generation=epoch + 1).error_code == ErrorCode.ILLEGAL_GENERATION


def test_a_new_classic_worker_joins_a_connect_group_answered_at_once() -> None:
    h = upgraded()
    first = h.join("", new_id="c3")
    assert isinstance(first, JoinGroupResponse)
    assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED and first.member_id == "c3"
    epoch_before = h.group_epoch
    joined = h.join("c3")
    assert isinstance(joined, JoinGroupResponse) and joined.error_code == ErrorCode.NONE
    assert joined.generation_id == h.assignment_epoch
    assert h.group_epoch == epoch_before + 1
    (event,) = h.last_events(EventType.MEMBER_JOINED)
    assert event.payload["group_protocol"] == "classic"
    assert h.member("c3").assignors == assignors_of(protocols("sessioned"))
    assert h.deadline((CLASSIC_MEMBER_DEADLINE, "c3")) == h.now_ms + REBALANCE_MS


def test_an_eager_member_is_given_its_whole_set() -> None:
    h = MixedHarness()
    h.put_connector("A", 2)
    h.form(["c1"], {"c1": rs("A", "A-0", "A-1")}, kind="default")
    h.connect_join("w1", assignors=(Assignor("eager", 0, 0),))
    h.compute("w1", {"c1": rs("A", "A-0"), "w1": rs("A-1")})
    # The eager worker stopped everything before it rejoined: it reports nothing.
    joined, synced = h.classic_round("c1", rs(), kind="default")
    assert joined.generation_id == h.assignment_epoch
    assert synced.assignment is not None and synced.assignment.version == 0
    assert synced.assignment.assignment == rs("A", "A-0") and synced.assignment.revoked is None


def test_a_missed_sync_deadline_removes_the_member_with_a_hold() -> None:
    h = upgraded()
    h.compute("w1", {"c1": rs("A"), "c2": rs("A-1"), "w1": rs("A-0")})
    joined = h.join("c2", allocation=rs("A-1"))  # c2's share is unchanged: STABLE
    assert isinstance(joined, JoinGroupResponse)
    assert h.member("c2").state is MemberState.STABLE
    h.run_for(REBALANCE_MS + 50, "w1")
    assert not h.has_member("c2")
    fenced = h.logged_events(EventType.MEMBER_FENCED)[-1]
    assert fenced.member_id == "c2" and "deadline" in fenced.payload["reason"]
    assert h.state is not None and [x.member_id for x in h.state.meta.holds] == ["c2"]


def test_a_classic_member_leaves_a_connect_group_without_a_hold() -> None:
    h = upgraded()
    before = h.group_epoch
    left = h.leave_group("c2")
    assert left.members[0].error_code == ErrorCode.NONE
    assert not h.has_member("c2") and h.group_epoch == before + 1
    assert h.state is not None and h.state.meta.holds == ()


def test_connect_calls_naming_a_classic_member_are_unknown_member() -> None:
    h = upgraded()
    epoch = h.member("c1").member_epoch
    assert h.heartbeat("c1", epoch).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.connect_join("c1").error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_classic_join_naming_a_connect_member_is_unknown_member() -> None:
    h = upgraded()
    resp = h.join("w1")
    assert isinstance(resp, JoinGroupResponse)
    assert resp.error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_only_a_connect_member_computes() -> None:
    """A classic worker cannot call Prepare or Install: with the policy keeping the group
    connect after its connect member left, nobody computes and the reason is shown."""
    h = upgraded()
    h.policy("upgrade")
    h.leave("w1")
    assert h.type() is GroupType.CONNECT
    assert h.state is not None and h.state.meta.assignor_member_id is None
    (unavailable,) = h.logged_events(EventType.ASSIGNOR_UNAVAILABLE)[-1:]
    assert "classic-protocol worker cannot compute" in unavailable.payload["reason"]
    # The classic members keep their work.
    assert h.member("c1").assigned == rs("A", "A-0") and h.member("c2").assigned == rs("A-1")


def test_selection_never_chooses_a_classic_member() -> None:
    h = upgraded()
    assert h.state is not None
    members = list(h.state.members.values())
    chosen = select(members)
    assert not isinstance(chosen, str) and getattr(chosen, "assignor_member_id", None) == "w1"
    classic_only = [m for m in members if m.classic is not None]
    assert getattr(select(classic_only), "assignor_member_id", None) is None


def test_a_connect_member_that_cannot_cover_the_classic_ones_is_unsupported_assignor() -> None:
    h = classic_group_running(kind="default")  # eager-only workers
    resp = h.connect_join("w1", assignors=(Assignor("incremental_cooperative", 2, 2, version=2),))
    assert resp.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
    assert h.type() is GroupType.CLASSIC  # the refused join converted nothing


def test_a_classic_worker_no_connect_member_can_cover_is_refused() -> None:
    h = upgraded()  # w1: incremental_cooperative [1-2], eager [0-0]
    h.connect_join("w2", assignors=(Assignor("incremental_cooperative", 2, 2, version=2),))
    h.leave("w1")
    resp = h.join("", new_id="c9", kind="default")
    assert isinstance(resp, JoinGroupResponse)
    joined = h.join("c9", kind="default")
    assert isinstance(joined, JoinGroupResponse)
    assert joined.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


# --- the policy: classic joins into a non-empty connect group ------------------------------


def connect_group_running() -> MixedHarness:
    h = MixedHarness()
    h.put_connector("A", 2)
    assert h.connect_join("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    h.compute("w1", {"w1": rs("A", "A-0", "A-1")})
    h.connect_ack("w1")
    return h


@pytest.mark.parametrize("policy", ["bidirectional", "upgrade", "downgrade"])
def test_classic_workers_join_a_connect_group_unless_the_policy_is_disabled(policy: str) -> None:
    h = connect_group_running()
    h.policy(policy)
    h.join("", new_id="c1")
    joined = h.join("c1")
    assert isinstance(joined, JoinGroupResponse) and joined.error_code == ErrorCode.NONE
    assert h.type() is GroupType.CONNECT


def test_disabled_refuses_classic_joins_to_a_non_empty_connect_group() -> None:
    """KAFKA-20640."""
    h = connect_group_running()
    h.policy("disabled")
    before = h.dump()
    resp = h.join("", new_id="c1")
    assert isinstance(resp, JoinGroupResponse)
    assert resp.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert "'disabled'" in resp.error_message and MIGRATION_POLICY.name in resp.error_message
    assert h.dump() == before


@pytest.mark.parametrize("policy", ["bidirectional", "upgrade", "downgrade", "disabled"])
def test_empty_groups_convert_under_every_policy(policy: str) -> None:
    h = MixedHarness()
    h.put_connector("A", 1)
    h.policy(policy)
    h.join("", new_id="c1")
    h.join("c1")
    assert h.type() is GroupType.CLASSIC
    h.sleep(REBALANCE_MS)
    h.leave_group("c1")
    assert h.connect_join("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    assert h.type() is GroupType.CONNECT


# --- downgrade ---------------------------------------------------------------------------


def test_the_last_connect_member_leaving_downgrades_the_group() -> None:
    h = upgraded()
    h.compute("w1", {"c1": rs("A"), "c2": rs("A-1"), "w1": rs("A-0")})
    h.classic_round("c1", rs("A", "A-0"))  # told to revoke A-0; still runs it
    h.leave("w1")
    assert h.type() is GroupType.CLASSIC
    converted = h.logged_events(EventType.GROUP_CONVERTED)[-1]
    assert converted.payload["direction"] == "to_classic"
    assert converted.payload["members"] == {"classic": 2, "connect": 0}
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    assert h.protocol == "sessioned"
    # Each member holds its current plus pending sets: nothing is given while held.
    assert h.member("c1").owned == rs("A", "A-0")
    # The members learn it by heartbeat and rejoin with what they run.
    old = h.member("c2").member_epoch
    assert h.hb("c2", generation=old).error_code in (
        ErrorCode.ILLEGAL_GENERATION,
        ErrorCode.REBALANCE_IN_PROGRESS,
    )


def test_the_policy_can_forbid_the_downgrade_and_a_later_change_allows_it() -> None:
    h = upgraded()
    h.policy("upgrade")
    h.leave("w1")
    assert h.type() is GroupType.CONNECT
    h.policy("downgrade")
    assert h.type() is GroupType.CLASSIC
    assert h.classic_state is ClassicState.PREPARING_REBALANCE


def test_a_fenced_last_connect_member_downgrades_too() -> None:
    h = upgraded()
    epoch = h.member("w1").member_epoch
    assert h.heartbeat("w1", epoch + 7).error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert h.type() is GroupType.CLASSIC


def test_epochs_never_go_down_across_conversions() -> None:
    h = classic_group_running()
    seen = [h.group_epoch]
    h.connect_join("w1")
    seen.append(h.group_epoch)
    h.leave("w1")
    seen.append(h.group_epoch)
    h.rejoin_all()
    h.sleep(REBALANCE_MS)
    seen.append(h.group_epoch)
    assert seen == sorted(seen), seen


@pytest.mark.parametrize(
    ("policy", "downgrades"),
    [("bidirectional", True), ("downgrade", True), ("upgrade", False), ("disabled", False)],
)
def test_the_downgrade_follows_the_policy(policy: str, downgrades: bool) -> None:
    h = upgraded()
    h.policy(policy)
    h.leave("w1")
    assert h.type() is (GroupType.CLASSIC if downgrades else GroupType.CONNECT)
    # Either way the classic workers keep what they run.
    assert h.member("c1").owned == rs("A", "A-0") and h.member("c2").owned == rs("A-1")


def test_an_unreleased_classic_member_is_told_to_rejoin_once_what_it_waits_for_is_free() -> None:
    h = upgraded()
    h.join("", new_id="c3")
    joined = h.join("c3")
    assert isinstance(joined, JoinGroupResponse)
    h.sync("c3", generation=joined.generation_id)
    h.compute("w1", {"c1": rs("A"), "c2": rs("A-1"), "c3": rs("A-0"), "w1": rs()})
    c3_epoch = h.member("c3").member_epoch
    assert h.hb("c3", generation=c3_epoch).error_code == ErrorCode.REBALANCE_IN_PROGRESS
    joined, _ = h.classic_round("c3", rs())
    assert h.member("c3").state is MemberState.UNRELEASED  # A-0 is still c1's
    epoch = h.member("c3").member_epoch
    assert h.hb("c3", generation=epoch).error_code == ErrorCode.NONE  # nothing free yet
    h.classic_round("c1", rs("A", "A-0"))  # told to revoke A-0
    assert h.hb("c3", generation=epoch).error_code == ErrorCode.NONE
    h.classic_round("c1", rs("A"))  # released
    assert h.hb("c3", generation=epoch).error_code == ErrorCode.REBALANCE_IN_PROGRESS
    _, synced = h.classic_round("c3", rs())
    assert synced.assignment is not None and synced.assignment.assignment == rs("A-0")
    assert h.member("c3").state is MemberState.STABLE


def test_an_unrevoked_classic_member_is_told_to_rejoin() -> None:
    h = upgraded()
    h.compute("w1", {"c1": rs("A"), "c2": rs("A-1"), "w1": rs("A-0")})
    joined, _ = h.classic_round("c1", rs("A", "A-0"))
    assert h.member("c1").state is MemberState.UNREVOKED
    assert h.hb("c1", generation=joined.generation_id).error_code == (
        ErrorCode.REBALANCE_IN_PROGRESS
    )


def test_a_missed_join_deadline_after_rebalance_in_progress_removes_the_member() -> None:
    h = upgraded()
    h.compute("w1", {"c1": rs("A"), "c2": rs("A-1"), "w1": rs("A-0")})
    epoch = h.member("c2").member_epoch
    assert h.hb("c2", generation=epoch).error_code == ErrorCode.REBALANCE_IN_PROGRESS
    h.run_for(REBALANCE_MS + 50, "w1")  # c2 keeps silent: no JoinGroup
    assert not h.has_member("c2")
    assert h.state is not None and [x.member_id for x in h.state.meta.holds] == ["c2"]
    # Its work is held, not given, until the hold ends.
    h.compute("w1", {"c1": rs("A", "A-0"), "w1": rs("A-1")})
    h.connect_ack("w1")
    assert "A-1" not in {str(t) for t in h.member("w1").assigned.tasks}


@pytest.mark.parametrize("kind", ["compatible", "sessioned"])
def test_cooperative_versions_get_revoked_and_new_work_in_connects_terms(kind: str) -> None:
    h = MixedHarness()
    h.put_connector("A", 2)
    h.form(["c1", "c2"], {"c1": rs("A", "A-0"), "c2": rs("A-1")}, kind=kind)
    h.connect_join("w1")
    h.compute("w1", {"c1": rs("A-1"), "c2": rs("A"), "w1": rs("A-0")})
    _, synced = h.classic_round("c1", rs("A", "A-0"), kind=kind)
    assert synced.assignment is not None
    assert synced.assignment.version == (1 if kind == "compatible" else 2)
    assert synced.assignment.revoked == rs("A", "A-0")
    assert synced.assignment.assignment == rs()  # A-1 is c2's until it releases it
    _, synced = h.classic_round("c2", rs("A-1"), kind=kind)
    assert synced.assignment is not None and synced.assignment.revoked == rs("A-1")
    _, synced = h.classic_round("c2", rs(), kind=kind)
    assert synced.assignment is not None and synced.assignment.assignment == rs()  # A: c1's
    _, synced = h.classic_round("c1", rs(), kind=kind)
    assert synced.assignment is not None and synced.assignment.assignment == rs("A-1")
    _, synced = h.classic_round("c2", rs(), kind=kind)
    assert synced.assignment is not None and synced.assignment.assignment == rs("A")


def test_assignor_principals_choose_the_assignor_member_of_a_converted_group() -> None:
    h = classic_group_running()
    h.policy("bidirectional")
    assert h.alter_configs({"assignor.principals": "User:admin"}).error_code == 0
    resp = GroupHarness.heartbeat(
        h, "w1", 0, owned=rs(), rebalance_timeout_ms=REBALANCE_MS, assignors=SESSIONED
    )
    assert resp.error_code == ErrorCode.NONE  # converted, but w1 may not compute
    assert h.type() is GroupType.CONNECT
    assert h.state is not None and h.state.meta.assignor_member_id is None
    # A member of a listed principal joins: it computes.
    joined = h._run(
        lambda st: heartbeat(
            st,
            HeartbeatRequest(
                group_id=h.group_id,
                member_id="w2",
                member_epoch=0,
                rebalance_timeout_ms=REBALANCE_MS,
                client_assignors=SESSIONED,
                owned=rs(),
            ),
            h.now_ms,
            h.defaults,
            principal="User:admin",
        )
    )
    assert joined.error_code == ErrorCode.COMPUTE_ASSIGNMENT
    assert h.state is not None and h.state.meta.assignor_member_id == "w2"


def test_a_classic_join_into_a_connect_group_holding_only_held_work_downgrades_it() -> None:
    """Not empty (a fenced member's work is held), but no connect member to compute: the join
    proceeds on a classic group, the hold kept; under a policy without downgrades the group
    stays connect, and the classic worker is refused (no connect member covers it: nobody
    could compute for it)."""
    for policy, expected in (("bidirectional", GroupType.CLASSIC), ("upgrade", GroupType.CONNECT)):
        h = connect_group_running()
        h.policy(policy)
        epoch = h.member("w1").member_epoch
        assert h.heartbeat("w1", epoch + 3).error_code == ErrorCode.FENCED_MEMBER_EPOCH
        assert h.state is not None and not h.state.members and h.state.meta.holds
        h.join("", new_id="c1")
        answer = h.join("c1")
        assert h.type() is expected, policy
        assert h.state is not None and [x.member_id for x in h.state.meta.holds] == ["w1"]
        if expected is GroupType.CLASSIC:
            assert isinstance(answer, Parked)  # the classic join phase
        else:
            assert isinstance(answer, JoinGroupResponse)
            assert answer.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
            assert "cannot compute" in answer.error_message


def test_a_protocol_list_change_bumps_the_epoch_and_a_url_change_does_not() -> None:
    h = upgraded()
    epoch = h.group_epoch
    h.join("c1", allocation=rs("A", "A-0"), url="http://elsewhere:8083")
    assert h.group_epoch == epoch and h.member("c1").url == "http://elsewhere:8083"
    h.join("c1", allocation=rs("A", "A-0"), kind="compatible")
    assert h.group_epoch == epoch + 1
    assert h.member("c1").assignors == assignors_of(protocols("compatible"))
