"""Partial release (DESIGN 3.11) and fencing tokens (DESIGN 3.18) in the core, step by step.

The hypothesis machine in test_core_properties checks the same rules over random histories;
these tests pin the concrete behaviour: what is released when, which events say so, that the
revocation timer is not re-armed by partial progress, and which token each grant gets.
"""

from __future__ import annotations

from connect_protocol.errors import ErrorCode
from connect_protocol.resources import TaskId
from connect_protocol.tokens import FencingTokens
from coordinator_svc.core.model import MemberState
from coordinator_svc.core.records import EventType
from coordinator_svc.core.results import REVOCATION
from tests.core.harness import (
    ALL,
    W1_SHARE,
    W2_SHARE,
    GroupHarness,
    catalogue_group,
    ok,
    rs,
    stable_group,
)


def w1_revoking_w2s_share() -> GroupHarness:
    """w1 ran everything; w2 joined and the new target gives it B and B-0: w1, at epoch 4, is
    told to revoke them (UNREVOKED), w2 waits for them at epoch 5 (UNRELEASED)."""
    h = catalogue_group()
    h.join("w1")
    h.compute("w1", {"w1": ALL})
    h.ack("w1")
    h.join("w2")
    h.compute("w1", {"w1": W1_SHARE, "w2": W2_SHARE})
    h.keepalive("w2")
    h.heartbeat("w1", 4, owned=ALL)
    w1 = h.member("w1")
    assert w1.state is MemberState.UNREVOKED and w1.pending_revocation == W2_SHARE
    return h


def test_a_heartbeat_that_drops_some_pending_resources_releases_them_at_once() -> None:
    h = w1_revoking_w2s_share()
    deadline = h.deadline((REVOCATION, "w1"))
    assert deadline is not None

    h.sleep(50)
    response = h.heartbeat("w1", 4, owned=W1_SHARE | rs("B"))  # B-0 has stopped, B has not

    ok(response)
    w1 = h.member("w1")
    assert w1.state is MemberState.UNREVOKED and w1.member_epoch == 4
    assert w1.pending_revocation == rs("B")
    assert h.events_of_last_call() == [EventType.REVOCATION_PARTIALLY_ACKNOWLEDGED]
    event = h.last_events(EventType.REVOCATION_PARTIALLY_ACKNOWLEDGED)[0]
    assert event.payload["released"] == rs("B-0").to_json()
    assert event.payload["pending"] == rs("B").to_json()
    assert h.deadline((REVOCATION, "w1")) == deadline, "partial progress does not re-arm it"

    # w2 gets B-0 at once, not B.
    response = h.keepalive("w2")
    assert response.assignment is not None
    assert response.assignment.resources == rs("B-0")
    assert h.member("w2").state is MemberState.UNRELEASED

    # The rest: a full acknowledgement, the timer cancelled, w2 complete.
    h.heartbeat("w1", 4, owned=W1_SHARE)
    assert h.member("w1").state is MemberState.STABLE
    assert EventType.REVOCATION_ACKNOWLEDGED in h.events_of_last_call()
    assert h.deadline((REVOCATION, "w1")) is None
    h.keepalive("w2")
    assert h.member("w2").assigned == W2_SHARE
    assert h.member("w2").state is MemberState.STABLE
    assert h.dump() == h.rebuilt()


def test_the_same_partial_heartbeat_twice_writes_nothing_the_second_time() -> None:
    h = w1_revoking_w2s_share()
    h.heartbeat("w1", 4, owned=W1_SHARE | rs("B"))

    h.heartbeat("w1", 4, owned=W1_SHARE | rs("B"))

    assert h.state_records_of_last_call() == []


def test_a_revocation_timing_out_after_a_partial_release_removes_the_member() -> None:
    h = w1_revoking_w2s_share()
    deadline = h.deadline((REVOCATION, "w1"))
    assert deadline is not None
    h.heartbeat("w1", 4, owned=W1_SHARE | rs("B"))

    h.sleep(deadline - h.now_ms)

    assert not h.has_member("w1")
    assert h.logged_events(EventType.REVOCATION_TIMED_OUT)


def tokens_of(h: GroupHarness, member_id: str) -> FencingTokens:
    return h.member(member_id).tokens


def test_every_grant_gets_a_token_above_every_earlier_one() -> None:
    h = w1_revoking_w2s_share()
    w1 = tokens_of(h, "w1")
    assert set(w1) == {"A", TaskId("A", 0), TaskId("A", 1)}, "what it gave up has no token"
    first_b0 = h.logged_events(EventType.ASSIGNMENT_DELIVERED)[0].payload["fencing_token"]

    h.heartbeat("w1", 4, owned=W1_SHARE)
    response = h.keepalive("w2")
    delivered = h.last_events(EventType.ASSIGNMENT_DELIVERED)[-1]

    assert response.assignment is not None
    sent = response.assignment.tokens
    assert sent == tokens_of(h, "w2")
    assert set(sent) == {"B", TaskId("B", 0)}
    assert len(set(sent.values())) == 1, "one grant, one token"
    assert sent[TaskId("B", 0)] > first_b0
    assert sent[TaskId("B", 0)] > max(w1.values())
    h.heartbeat("w1", 5, owned=W1_SHARE)
    assert tokens_of(h, "w1") == w1, "kept across epochs, kept its token"
    assert h.state is not None and h.state.meta.last_fencing_token == sent["B"]
    assert delivered.member_id == "w2"
    assert delivered.payload["fencing_token"] == sent["B"]
    assert h.dump() == h.rebuilt()


def test_a_resent_assignment_keeps_its_tokens() -> None:
    h = stable_group()
    before = tokens_of(h, "w2")

    response = h.join("w2")  # a rejoin: sent its whole assignment again

    assert response.assignment is not None
    assert response.assignment.tokens == before
    assert tokens_of(h, "w2") == before


def test_a_static_takeover_is_a_grant_with_new_tokens() -> None:
    h = GroupHarness()
    h.put_connector("A", 1)
    h.join("s1", instance_id="pod-0")
    h.compute("s1", {"s1": rs("A", "A-0")})
    h.ack("s1")
    before = tokens_of(h, "s1")
    assert set(before) == {"A", TaskId("A", 0)}
    h.leave("s1", instance_id="pod-0")

    response = h.join("s2", instance_id="pod-0")

    assert response.error_code is ErrorCode.NONE
    assert response.assignment is not None
    assert response.assignment.resources == rs("A", "A-0")
    after = response.assignment.tokens
    assert set(after) == set(before)
    assert all(after[r] > before[r] for r in before)
    assert h.dump() == h.rebuilt()


def test_an_install_records_what_its_scheduled_rebalance_stands_for() -> None:
    h = stable_group()
    h.join("w3")
    h.prepare("w1")
    response = h.install(
        "w1",
        {"w1": W1_SHARE, "w2": W2_SHARE},
        delay_ms=400,
        lost_work_delay_ms=900,
        next_wave_delay_ms=400,
    )

    assert response.error_code is ErrorCode.NONE
    assert h.state is not None
    target = h.state.target
    assert target.scheduled_rebalance_at_ms == h.now_ms + 400
    assert target.next_wave_at_ms == h.now_ms + 400
    assert target.lost_work_rebalance_at_ms == h.now_ms + 900
    assert h.dump() == h.rebuilt()


def test_an_install_whose_delay_is_not_the_earlier_of_its_reasons_is_refused() -> None:
    h = stable_group()
    h.join("w3")
    h.prepare("w1")

    response = h.install(
        "w1", {"w1": W1_SHARE, "w2": W2_SHARE}, delay_ms=900, next_wave_delay_ms=400
    )

    assert response.error_code is ErrorCode.INVALID_REQUEST
    assert "smaller of LostWorkDelayMs and NextWaveDelayMs" in response.error_message


def test_a_next_wave_is_not_cut_short_by_a_max_delay_of_0() -> None:
    """scheduled.rebalance.max.delay.ms caps lost-work delays; the next wave is capped by the
    longest of it, the wave pause and the heartbeat interval, so a paced plan cannot spin."""
    h = stable_group()
    h.alter_configs({"scheduled.rebalance.max.delay.ms": "0", "rebalance.wave.pause.ms": "700"})
    h.join("w3")
    h.prepare("w1")

    response = h.install(
        "w1", {"w1": W1_SHARE, "w2": W2_SHARE}, delay_ms=600, next_wave_delay_ms=600
    )

    assert response.error_code is ErrorCode.NONE
    assert h.state is not None
    assert h.state.target.next_wave_at_ms == h.now_ms + 600
    assert h.state.target.scheduled_rebalance_at_ms == h.now_ms + 600
