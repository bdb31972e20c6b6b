"""Ownership in classic groups (DESIGN 3.19, 3.13): holds withheld from the leader until they
end, the end of a hold starting a rebalance, the revocation bound, releases by allocation, and
the after-load normalisation of a takeover."""

from __future__ import annotations

from connect_protocol.errors import ErrorCode
from coordinator_svc.core import replay
from coordinator_svc.core.classic_model import ClassicState
from coordinator_svc.core.classic_timers import classic_after_load
from coordinator_svc.core.records import EventRecord, EventType
from coordinator_svc.core.results import CLASSIC_JOIN, HOLD, REVOCATION, SESSION, Parked
from coordinator_svc.core.timers import timers_after_load

from .classic_harness import REBALANCE_MS, SESSION_MS, ClassicHarness, given, rs


def three_members() -> ClassicHarness:
    """A (1 task), B (1 task); w1 leader runs A, w3 runs B; STABLE."""
    h = ClassicHarness()
    h.put_connector("A", 1)
    h.put_connector("B", 1)
    h.form(["w1", "w2", "w3"], {"w1": rs("A", "A-0"), "w3": rs("B", "B-0")})
    return h


def test_a_hold_hides_its_resources_from_the_leader_until_it_ends() -> None:
    h = three_members()
    h.join("w1", allocation=rs("A", "A-0"))
    h.join("w2", allocation=rs())
    h.sleep(REBALANCE_MS)  # w3 never rejoins: removed, B and B-0 held
    hold_end = h.now_ms + SESSION_MS
    leader = h.join_answer("w1")
    assert leader.withheld == rs("B", "B-0")
    assert [c.name for c in leader.catalogue] == ["A", "B"]  # withheld resources listed apart
    assert all(not c.config for c in leader.catalogue)
    h.sync_all({})
    # The hold ends: HOLD_RELEASED and a rebalance whose leader sees B again.
    h.run_for(hold_end - h.now_ms, "w1", "w2")
    assert h.logged_events(EventType.HOLD_RELEASED)[0].member_id == "w3"
    started = h.logged_events(EventType.CLASSIC_REBALANCE_STARTED)[-1]
    assert started.payload["reason"] == "hold ended"
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    h.join("w1", allocation=rs("A", "A-0"))
    h.join("w2", allocation=rs())
    assert h.join_answer("w1").withheld == rs()
    h.sync_all({"w2": rs("B", "B-0")})
    assert h.held("w2") == rs("B", "B-0")


def test_an_unreleased_revocation_removes_the_member_with_a_hold_at_its_rebalance_timeout() -> None:
    h = three_members()
    h.join("w1", allocation=rs("A", "A-0"))
    h.join("w2", allocation=rs())
    h.join("w3", allocation=rs("B", "B-0"))
    h.sync("w2")
    h.sync("w3")
    h.sync("w1", {"w3": given(revoked=rs("B-0"))})
    assert h.member("w3").pending_revocation == rs("B-0")
    assert h.member("w3").assigned == rs("B")
    (requested,) = h.logged_events(EventType.REVOCATION_REQUESTED)
    assert requested.member_id == "w3"
    assert h.deadline((REVOCATION, "w3")) == h.now_ms + REBALANCE_MS
    h.run_for(REBALANCE_MS, "w1", "w2", "w3")  # w3 heartbeats but never releases
    assert not h.has_member("w3")
    (timed_out,) = h.logged_events(EventType.REVOCATION_TIMED_OUT)
    assert timed_out.payload["unrevoked"] == rs("B-0").to_json()
    assert h.state is not None and h.state.meta.holds[0].resources == rs("B", "B-0")
    assert h.classic_state is ClassicState.PREPARING_REBALANCE


def test_a_releasing_join_acknowledges_the_revocation_and_ends_its_bound() -> None:
    h = three_members()
    h.join("w1", allocation=rs("A", "A-0"))
    h.join("w2", allocation=rs())
    h.join("w3", allocation=rs("B", "B-0"))
    h.sync("w2")
    h.sync("w3")
    h.sync("w1", {"w3": given(revoked=rs("B-0"))})
    h.join("w3", allocation=rs("B"))  # released B-0: rejoins at once, as Connect does
    assert h.member("w3").pending_revocation == rs() and h.member("w3").assigned == rs("B")
    (ack,) = h.logged_events(EventType.REVOCATION_ACKNOWLEDGED)
    assert ack.payload["revoked"] == rs("B-0").to_json()
    assert h.deadline((REVOCATION, "w3")) is None
    h.fire((REVOCATION, "w3"))  # a late bound finds nothing pending: it does nothing
    assert h.has_member("w3") and not h.logged_events(EventType.REVOCATION_TIMED_OUT)


def test_an_eager_join_releases_everything_it_held() -> None:
    h = ClassicHarness()
    h.put_connector("A", 1)
    h.form(["w1", "w2"], {"w2": rs("A", "A-0")}, kind="default")
    assert h.protocol == "default" and h.held("w2") == rs("A", "A-0")
    h.join("w2", kind="default")
    assert h.held("w2") == rs()
    assert not h.member("w2").tokens


def test_a_grant_keeps_tokens_increasing_and_a_kept_resource_keeps_its_token() -> None:
    h = three_members()
    token_a = h.member("w1").tokens["A"]
    h.join("w1", allocation=rs("A", "A-0"))
    h.join("w2", allocation=rs())
    h.join("w3", allocation=rs("B", "B-0"))
    h.sync_all({})
    assert h.member("w1").tokens["A"] == token_a  # kept across generations: same token
    # B moves from w3 to w2 in two rounds: revoked, released, then given.
    h.join("w1", allocation=rs("A", "A-0"))
    h.join("w2", allocation=rs())
    h.join("w3", allocation=rs("B", "B-0"))
    h.sync("w2")
    h.sync("w3")
    h.sync("w1", {"w3": given(revoked=rs("B", "B-0"))})
    h.join("w3", allocation=rs())
    h.join("w1", allocation=rs("A", "A-0"))
    h.join("w2", allocation=rs())
    h.sync_all({"w2": rs("B", "B-0")})
    assert h.member("w2").tokens["B"] > token_a
    assert h.state is not None
    assert h.member("w2").tokens["B"] == h.state.meta.last_fencing_token


def test_after_load_preparing_or_completing_becomes_preparing_with_timers_from_now() -> None:
    h = ClassicHarness()
    h.put_connector("A", 1)
    for name in ("w1", "w2"):
        h.new_member(name)
    h.sleep(REBALANCE_MS)
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE
    generation = h.generation
    loaded = replay.new_state(r for r in h.log if type(r).__name__ != "ClassicRoundRecord")
    assert loaded.round is None  # the round is never persisted
    now = h.now_ms + 10_000
    records, timers = classic_after_load(loaded, now, h.defaults)
    for record in records:
        replay.apply(loaded, record)
    assert loaded.meta.classic is not None
    assert loaded.meta.classic.state is ClassicState.PREPARING_REBALANCE
    assert loaded.group_epoch == generation
    keys = {t.key: t.deadline_ms for t in timers}
    assert keys[(CLASSIC_JOIN, "")] == now + REBALANCE_MS
    assert keys[(SESSION, "w1")] == now + SESSION_MS
    assert timers_after_load(loaded, now, h.defaults) == timers
    # A member's SyncGroup after the takeover is told to rejoin; its JoinGroup completes the
    # next generation, after the persisted one.
    h.state = loaded
    h.timers = {k: (d, i) for i, (k, d) in enumerate(keys.items())}
    h.now_ms = now
    answer = h.sync("w1", generation=generation)
    assert not isinstance(answer, Parked)
    assert answer.error_code == ErrorCode.REBALANCE_IN_PROGRESS
    h.join("w1")
    h.join("w2")
    assert h.generation == generation + 1
    assert h.deadline((HOLD, "w1")) is None
    # The load wrote nothing; the completion records why this generation began, at the
    # generation it follows, before the completion itself.
    completing = [
        (r.event_type, r.group_epoch, dict(r.payload))
        for r in h.records_of_last_call
        if isinstance(r, EventRecord)
        and r.event_type in (EventType.CLASSIC_REBALANCE_STARTED, EventType.CLASSIC_JOIN_COMPLETED)
    ]
    assert completing[0] == (
        EventType.CLASSIC_REBALANCE_STARTED,
        generation,
        {
            "reason": "coordinator takeover",
            "generation": generation,
            "from_state": "COMPLETING_REBALANCE",
        },
    )
    assert [(t, e) for t, e, _ in completing[1:]] == [
        (EventType.CLASSIC_JOIN_COMPLETED, generation + 1)
    ]
    # Once: the next rebalance is an ordinary one.
    h.sync_all({})
    h.leave_group("w2")
    h.join("w1")
    assert h.generation == generation + 2
    reasons = [e.payload["reason"] for e in h.logged_events(EventType.CLASSIC_REBALANCE_STARTED)]
    assert reasons.count("coordinator takeover") == 1
    assert reasons[-1] != "coordinator takeover"
