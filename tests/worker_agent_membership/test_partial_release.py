"""Per-resource release and fencing tokens in the agent's membership state machine
(worker_agent/membership.py; DESIGN 3.11 "Partial release", 3.15, 3.18), driven like
test_membership.py drives it: a fake clock, actions inspected, answers fed back.

- A cooperative revocation released resource by resource: each heartbeat's owned list shrinks
  step by step, the member stays at its epoch, nothing new starts until the whole batch is done.
- Coalescing: a release is reported no sooner than RELEASE_HEARTBEAT_GAP_MS after the previous
  heartbeat was sent (at once if that is past), never while one is in flight, never during a
  retry backoff; the end of the whole stop is acknowledged at once, as before.
- Stops that are not cooperative revocations (eager, leaving, lost membership) take no partial
  release: their heartbeats are exactly as before.
- Tokens: what StartWork/StopWork carry, kept for resources an assignment keeps, replaced by
  the tokens a new assignment carries, forgotten once a resource is neither assigned nor run.
- The random state machine of test_membership.py, with partial releases thrown in.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import JOIN_EPOCH, AssignmentMessage, HeartbeatResponse
from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from connect_protocol.tokens import FencingTokens
from tests.worker_agent_membership.test_membership import (
    INTERVAL,
    SESSION,
    UNIVERSE,
    Driver,
    MembershipMachine,
    assert_partial,
    error,
    heartbeats,
    joined,
    of_type,
    ok,
    only_heartbeat,
    rs,
)
from worker_agent.membership import (
    MIN_RETRY_BACKOFF_MS,
    RELEASE_HEARTBEAT_GAP_MS,
    Phase,
    StartWork,
    StopWork,
)

GAP = RELEASE_HEARTBEAT_GAP_MS
KEEP = rs("A", "A-0")
REVOKED = rs("B", "B-0", "B-1", "C")
ALL = KEEP | REVOKED


def released(d: Driver, resources: ResourceSet, at: int | None = None) -> ResourceSet:
    """The runtime reports part of the outstanding stop done (an `event.release`)."""
    now = d._at(at)
    accepted = d.m.work_released(resources, now)
    d.running = d.running - accepted
    assert d.m.running == d.running
    return accepted


def revoking(**overrides: object) -> Driver:
    """A member at epoch 1 running ALL; its heartbeat at INTERVAL is answered (at INTERVAL + 5)
    with the assignment KEEP, so REVOKED must be stopped. Polled: the StopWork is outstanding."""
    d = joined(ALL, epoch=1, **overrides)  # type: ignore[arg-type]
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(1, KEEP), at=INTERVAL + 5)
    assert of_type(d.poll(), StopWork) == [StopWork(REVOKED, 1, "revoked")]
    return d


def sent_owned(d: Driver, since: int = 0) -> list[ResourceSet]:
    return [req.owned for _, req in d.sent[since:] if req.owned is not None]


# --- partial release, step by step ---------------------------------------------------------


def test_releasing_one_by_one_shrinks_the_owned_list_of_each_heartbeat_step_by_step() -> None:
    d = revoking()
    before = len(d.sent)
    left = REVOKED
    for name in ("C", "B-1", "B-0"):
        assert released(d, rs(name), at=d.now + 100) == rs(name)
        left = left - rs(name)
        actions = d.poll()  # the previous heartbeat was sent > GAP ago: at once
        assert of_type(actions, StartWork) == []  # nothing starts while anything is revoked
        req = only_heartbeat(actions)
        assert_partial(req, epoch=1, owned=KEEP | left)  # the old epoch, only what runs
        d.answer(ok(1), at=d.now + 2)
    assert d.stops, "the batch is still being stopped (B is left)"
    d.stopped(at=d.now + 100)  # the listener returned: the rest (B) is acknowledged at once
    assert_partial(only_heartbeat(d.poll()), epoch=1, owned=KEEP)
    assert sent_owned(d, before) == [
        KEEP | rs("B", "B-0", "B-1"),
        KEEP | rs("B", "B-0"),
        KEEP | rs("B"),
        KEEP,
    ]


def test_after_a_partial_release_the_coordinator_may_move_the_member_on_and_start_new_work() -> (
    None
):
    d = revoking()
    released(d, rs("B", "B-0", "B-1"), at=d.now + 50)
    only_heartbeat(d.poll())
    d.answer(ok(1))  # still UNREVOKED for C: same epoch, nothing new
    assert of_type(d.poll(), StartWork) == []
    d.stopped(at=d.now + 10)
    only_heartbeat(d.poll())
    d.answer(ok(2, KEEP | rs("D")))
    assert of_type(d.poll(), StartWork) == [StartWork(rs("D"), 2)]


def test_a_listener_that_never_releases_is_acknowledged_as_a_whole_as_before() -> None:
    d = revoking()
    before = len(d.sent)
    for t in range(d.now, d.now + INTERVAL + 10, 10):
        for req in heartbeats(d.poll(t)):
            assert req.owned in (None, ALL)
            d.answer(ok(1), at=t + 1)
    d.stopped(at=d.now + 1)
    assert_partial(only_heartbeat(d.poll()), epoch=1, owned=KEEP)
    assert sent_owned(d, before) == [KEEP]


def test_releasing_everything_early_then_returning_reports_nothing_new() -> None:
    d = revoking()
    released(d, REVOKED, at=d.now + 100)
    assert_partial(only_heartbeat(d.poll()), epoch=1, owned=KEEP)
    d.answer(ok(1), at=d.now + 1)
    d.stopped(at=d.now + 1)  # nothing left: owned unchanged since the last report
    req = only_heartbeat(d.poll())
    assert req.owned is None  # a keepalive (sent at once, as after any stop): nothing new
    assert sent_owned(d)[-1] == KEEP


def test_releases_outside_the_stop_or_twice_or_without_a_stop_change_nothing() -> None:
    d = revoking()
    assert released(d, KEEP) == EMPTY  # kept, not being stopped
    assert released(d, rs("Z", "Z-0")) == EMPTY  # unknown
    assert released(d, rs("C")) == rs("C")
    assert released(d, rs("C")) == EMPTY  # twice
    assert released(d, rs("C", "B-1")) == rs("B-1")  # only the new part
    d.stopped()
    assert released(d, rs("B")) == EMPTY  # the stop is over
    assert d.m.running == KEEP


# --- coalescing --------------------------------------------------------------------------------


def test_a_release_right_after_a_heartbeat_waits_for_the_gap() -> None:
    d = revoking()
    only_heartbeat(d.poll(d.now + INTERVAL))  # a regular heartbeat...
    sent_at = d.now
    d.answer(ok(1), at=sent_at + 1)  # ...answered at once
    released(d, rs("C"), at=sent_at + 3)
    for t in range(sent_at + 3, sent_at + GAP):
        assert heartbeats(d.poll(t)) == [], t
    assert d.m.next_wakeup_ms() == sent_at + GAP  # the runtime's loop wakes for it
    req = only_heartbeat(d.poll(sent_at + GAP))
    assert req.owned == KEEP | rs("B", "B-0", "B-1")


def test_a_release_while_a_heartbeat_is_in_flight_goes_out_a_gap_after_that_one_was_sent() -> None:
    d = revoking()
    only_heartbeat(d.poll(d.now + INTERVAL))
    sent_at = d.now
    released(d, rs("C"), at=sent_at + 2)
    assert heartbeats(d.poll()) == []  # one in flight
    d.answer(ok(1), at=sent_at + 5)
    assert heartbeats(d.poll()) == []
    assert only_heartbeat(d.poll(sent_at + GAP)).owned == KEEP | rs("B", "B-0", "B-1")
    # A slow answer: once it arrives the gap has passed, so the release goes at once.
    released(d, rs("B-1"), at=d.now + 1)
    d.answer(ok(1), at=d.now + 3 * GAP)
    assert only_heartbeat(d.poll()).owned == KEEP | rs("B", "B-0")


def test_a_burst_of_releases_coalesces_to_at_most_one_heartbeat_per_gap() -> None:
    tasks = [f"T-{i}" for i in range(60)]
    d = joined(KEEP | rs(*tasks), epoch=3)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(3, KEEP), at=INTERVAL + 1)
    assert of_type(d.poll(), StopWork)[0].resources == rs(*tasks)
    start = d.now
    before = len(d.sent)
    for i, name in enumerate(tasks):  # one task stops every millisecond
        t = start + 1 + i
        released(d, rs(name), at=t)
        for _ in heartbeats(d.poll(t)):
            d.answer(ok(3), at=t)  # answered at once: only the gap holds heartbeats back
    end = d.now
    d.poll_until(end + GAP)
    if d.in_flight is not None:
        d.answer(ok(3))
    d.poll_until(end + 2 * GAP)
    times = [at for at, _ in d.sent[before:]]
    assert len(times) <= (end - start) // GAP + 2, times
    assert all(b - a >= GAP for a, b in itertools.pairwise(times)), times
    assert sent_owned(d, before)[-1] == KEEP  # every release reported, without waiting for
    assert d.stops  # ...the listener to return
    assert d.m.epoch == 3


def test_the_end_of_the_stop_is_acknowledged_at_once_even_within_the_gap() -> None:
    d = revoking()
    released(d, rs("C"), at=d.now + 100)
    only_heartbeat(d.poll())
    sent_at = d.now
    d.answer(ok(1), at=sent_at + 1)
    d.stopped(at=sent_at + 2)
    assert only_heartbeat(d.poll()).owned == KEEP  # not held back to sent_at + GAP


def test_a_release_during_a_retry_backoff_waits_for_the_backoff() -> None:
    d = revoking()
    only_heartbeat(d.poll(d.now + INTERVAL))
    failed_at = d.now + 1
    d.fail(at=failed_at)
    released(d, rs("C"), at=failed_at + 1)
    assert heartbeats(d.poll_until(failed_at + MIN_RETRY_BACKOFF_MS - 1)) == []
    req = only_heartbeat(d.poll(failed_at + MIN_RETRY_BACKOFF_MS))
    assert req.owned == KEEP | rs("B", "B-0", "B-1")  # full, after the error
    assert req.client_assignors is not None


# --- stops that take no partial release ------------------------------------------------------


def test_eager_takes_no_partial_release_and_still_reports_empty_then_starts() -> None:
    d = joined(ALL, epoch=1, eager=True)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(2, ALL), at=INTERVAL + 5)  # a new epoch: stop everything
    stop = of_type(d.poll(), StopWork)[0]
    assert (stop.resources, stop.reason) == (ALL, "eager rebalance")
    assert released(d, rs("B", "C")) == EMPTY
    before = len(d.sent)
    for t in range(d.now, d.now + 2 * INTERVAL, 10):
        for req in heartbeats(d.poll(t)):
            assert req.owned in (None, ALL), req.owned  # never a partly shrunk list
            d.answer(ok(2), at=t + 1)
    d.stopped()
    assert only_heartbeat(d.poll()).owned == EMPTY
    d.answer(ok(2))
    assert of_type(d.poll(), StartWork) == [StartWork(ALL, 2)]
    assert all(owned in (ALL, EMPTY) for owned in sent_owned(d, before))


def test_leaving_takes_no_partial_release() -> None:
    d = joined(ALL, epoch=1)
    d.leave(at=10)
    stop = of_type(d.poll(), StopWork)[0]
    assert stop.reason == "leaving"
    assert released(d, REVOKED) == EMPTY
    for t in range(d.now, d.now + 2 * INTERVAL, 10):
        for req in heartbeats(d.poll(t)):
            assert req.owned in (None, ALL)
            d.answer(ok(1), at=t + 1)
    d.stopped()
    leave = only_heartbeat(d.poll())
    assert leave.member_epoch == -1


def test_a_leave_waits_for_the_listener_even_when_everything_was_released_early() -> None:
    """Found by the machine below: a revocation of everything, all of it released before the
    listener returned, then SIGTERM. Nothing runs, but the stop is still in progress: the leave
    heartbeat goes only once the listener has returned (keepalives at the epoch meanwhile)."""
    d = joined(ALL, epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(1, EMPTY), at=INTERVAL + 5)
    assert of_type(d.poll(), StopWork) == [StopWork(ALL, 1, "revoked")]
    assert released(d, ALL) == ALL
    assert d.running == EMPTY and d.stops
    d.leave()
    for t in range(d.now, d.now + 2 * INTERVAL, 10):
        for req in heartbeats(d.poll(t)):
            assert req.member_epoch == 1, "a leave while the listener still runs"
            d.answer(ok(1), at=t + 1)
    d.stopped()
    leave = only_heartbeat(d.poll())
    assert leave.member_epoch == -1


def test_a_rejoin_waits_for_the_listener_even_when_everything_was_released_early() -> None:
    d = joined(ALL, epoch=1)
    only_heartbeat(d.poll(INTERVAL))
    d.answer(ok(1, EMPTY), at=INTERVAL + 5)
    d.poll()
    released(d, ALL, at=d.now + GAP)
    only_heartbeat(d.poll())
    d.answer(error(ErrorCode.FENCED_MEMBER_EPOCH))
    assert heartbeats(d.poll_until(d.now + 2 * INTERVAL, step=10)) == []
    d.stopped()
    join = only_heartbeat(d.poll())
    assert (join.member_epoch, join.owned) == (JOIN_EPOCH, EMPTY)


def test_membership_lost_during_a_partial_release_stops_the_rest_then_rejoins_empty() -> None:
    d = revoking()
    released(d, rs("C"), at=d.now + 100)
    only_heartbeat(d.poll())
    d.answer(error(ErrorCode.FENCED_MEMBER_EPOCH))
    assert d.m.phase is Phase.REJOINING
    assert released(d, rs("B-1")) == EMPTY  # no longer a member: nothing to acknowledge early
    d.stopped()  # the revoked batch, minus C released before
    assert d.running == KEEP
    stop = of_type(d.poll(), StopWork)[0]
    assert (stop.resources, stop.reason) == (KEEP, "membership lost")
    d.stopped()
    join = only_heartbeat(d.poll())
    assert (join.member_epoch, join.owned) == (JOIN_EPOCH, EMPTY)


# --- fencing tokens ---------------------------------------------------------------------------


def tokens(**named: int) -> FencingTokens:
    out: dict[str | TaskId, int] = {}
    for name, token in named.items():
        key = name.replace("_", "-")
        resources = rs(key)
        out.update(dict.fromkeys(resources.connectors, token))
        out.update(dict.fromkeys(resources.tasks, token))
    return FencingTokens(out)


def with_tokens(epoch: int, assigned: ResourceSet, sent: FencingTokens) -> HeartbeatResponse:
    return HeartbeatResponse(
        ErrorCode.NONE, "", epoch, INTERVAL, SESSION, AssignmentMessage(assigned, tokens=sent)
    )


def test_start_work_carries_the_tokens_of_what_it_starts() -> None:
    d = Driver.new()
    d.poll(0)
    d.answer(with_tokens(1, rs("A", "A-0"), tokens(A=7, A_0=8)))
    start = of_type(d.poll(), StartWork)[0]
    assert start.tokens == tokens(A=7, A_0=8)
    assert d.m.tokens == tokens(A=7, A_0=8)


def test_tokens_are_kept_for_kept_resources_and_taken_from_each_new_assignment() -> None:
    d = Driver.new()
    d.poll(0)
    d.answer(with_tokens(1, rs("A", "A-0"), tokens(A=7, A_0=8)))
    d.poll()
    d.started()
    only_heartbeat(d.poll())
    # Epoch 2 adds B; this answer has a token for B only (A and A-0 are kept with theirs).
    d.answer(with_tokens(2, rs("A", "A-0", "B"), tokens(B=3)))
    assert of_type(d.poll(), StartWork) == [StartWork(rs("B"), 2, tokens(B=3))]
    assert d.m.tokens == tokens(A=7, A_0=8, B=3)
    d.started()
    only_heartbeat(d.poll())
    # Epoch 3 resends every token (as the coordinator does), one of them new: it wins.
    d.answer(with_tokens(3, rs("A", "A-0", "B"), tokens(A=7, A_0=12, B=3)))
    assert d.m.tokens == tokens(A=7, A_0=12, B=3)


def test_an_assignment_without_tokens_keeps_the_known_ones() -> None:
    d = Driver.new()
    d.poll(0)
    d.answer(with_tokens(1, rs("A", "A-0"), tokens(A=7, A_0=8)))
    d.poll()
    d.started()
    only_heartbeat(d.poll())
    d.answer(ok(2, rs("A", "A-0", "B")))  # an older coordinator: no tokens at all
    assert of_type(d.poll(), StartWork) == [StartWork(rs("B"), 2)]
    assert d.m.tokens == tokens(A=7, A_0=8)


def test_stop_work_carries_the_tokens_they_ran_under_and_they_are_forgotten_once_stopped() -> None:
    d = Driver.new()
    d.poll(0)
    d.answer(with_tokens(1, rs("A", "A-0", "B"), tokens(A=7, A_0=8, B=9)))
    d.poll()
    d.started()
    only_heartbeat(d.poll())
    d.answer(with_tokens(1, rs("A"), tokens(A=7)))
    stop = of_type(d.poll(), StopWork)[0]
    assert stop == StopWork(rs("A-0", "B"), 1, "revoked", tokens(A_0=8, B=9))
    assert d.m.tokens == tokens(A=7, A_0=8, B=9)  # still running: still theirs
    released(d, rs("B"))
    assert d.m.tokens == tokens(A=7, A_0=8)
    d.stopped()
    assert d.m.tokens == tokens(A=7)


def test_a_resource_revoked_while_it_starts_is_stopped_under_its_token() -> None:
    """Found by the conformance suite (tests/clients/conformance): an answer that revokes B
    while B is still being started used to drop B's token (B was not yet running), so the
    `revoked` event that stopped B right after its start carried no token."""
    d = Driver.new()
    d.poll(0)
    d.answer(with_tokens(1, rs("A", "B"), tokens(A=7, B=9)))
    assert of_type(d.poll(), StartWork) == [StartWork(rs("A", "B"), 1, tokens(A=7, B=9))]
    only_heartbeat(d.poll(INTERVAL))  # the next heartbeat, while A and B still start
    d.answer(with_tokens(2, rs("A"), tokens(A=7)))  # B revoked meanwhile
    assert d.m.tokens == tokens(A=7, B=9)
    d.started()
    stop = of_type(d.poll(), StopWork)[0]
    assert stop == StopWork(rs("B"), 2, "revoked", tokens(B=9))
    d.stopped()
    assert d.m.tokens == tokens(A=7)


# --- the random state machine, with partial releases ---------------------------------------------


class PartialReleaseMachine(MembershipMachine):
    """test_membership's MembershipMachine (random answers, failures, clock steps and reports;
    Driver.poll checks every heartbeat's owned list against what runs), plus random partial
    releases of the outstanding stop, starting from a member that runs every resource of the
    base machine's universe (so that there is much to revoke). Its teardown checks convergence
    as before."""

    @initialize(eager=st.booleans(), static=st.booleans())
    def start(self, eager: bool, static: bool) -> None:
        self.d = joined(rs(*UNIVERSE), eager=eager, instance_id="pod-0" if static else None)
        self.poll()

    @precondition(
        lambda self: self.d is not None and self.d.in_flight is not None and bool(self.d.running)
    )
    @rule(data=st.data())
    def answer_revoking_some(self, data: st.DataObject) -> None:
        """An answer that revokes part of what runs (the base machine's random answers rarely
        do), so that stops, and releases during them, are common."""
        d = self.drv
        names = sorted(d.running.names())
        keep = data.draw(st.lists(st.sampled_from(names), max_size=len(names) - 1, unique=True))
        d.answer(ok(max(d.m.epoch, 1), rs(*keep)))
        self.poll()

    @precondition(
        lambda self: (
            self.d is not None and bool(self.d.stops and self.d.stops[0].resources & self.d.running)
        )
    )
    @rule(data=st.data())
    def release_some(self, data: st.DataObject) -> None:
        d = self.drv
        stop = d.stops[0]
        names = sorted((stop.resources & d.running).names())
        picked = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
        accepted = released(d, rs(*picked))
        taken = d.m.phase is Phase.MEMBER and stop.reason == "revoked" and not d.config.eager
        assert accepted == (rs(*picked) if taken else EMPTY)
        self.poll()


PartialReleaseMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_property_partial_release_machine = PartialReleaseMachine.TestCase
