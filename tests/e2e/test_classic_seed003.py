"""Seed 003's five scenarios (KIP-415, `/work/shared/seeds/003_a57f00c211743318.txt`) end to end:
real classic agents (`ClassicAgent`, the agent's classic mode) with recording listeners, on a
real coordinator process, asserting Connect's behaviour (DESIGN 3.19, "Connect today" is
Connect's code). Line numbers are the seed file's.

The seed's resources AC0, AT1, AT2, BC0, BT1 are our connector A with tasks A-0, A-1 and
connector B with task B-0 (Connect numbers tasks from 0). The delay d is the group's
`scheduled.rebalance.max.delay.ms`, 1500 ms here. Timeouts are Connect's divided down: session
1000 ms, heartbeat 100 ms, rebalance 2000 ms.

None of these scenarios removes a member with a hold (DESIGN 3.19): workers leave with
LeaveGroup, which removes without one, or join; so all follow Connect's code and its delay.
Every test ends with the no-overlap check over every listener call of every worker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from connect_protocol.classic_messages import SyncGroupResponse
from tests.support.agents import wait_for
from tests.support.classic_agents import ClassicFleet, ClassicWorker
from tests.support.classic_agents import classic_coordinator as classic_coordinator_process
from tests.support.coordinator import CoordinatorProcess

DELAY_MS = 1_500
CATALOGUE = {"A": 2, "B": 1}
ALL = {"A", "A-0", "A-1", "B", "B-0"}


@pytest.fixture(scope="module")
def classic_coordinator(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    """One coordinator process (and database) for the module; each test has its own group."""
    with classic_coordinator_process(
        postgres_admin_url, tmp_path_factory.mktemp("classic"), DELAY_MS
    ) as proc:
        yield proc


@pytest.fixture
def fleet(classic_coordinator: CoordinatorProcess) -> Iterator[ClassicFleet]:
    fleet = ClassicFleet(classic_coordinator.address, f"seed003-{uuid.uuid4().hex[:8]}")
    for name, tasks in CATALOGUE.items():
        fleet.put_connector(name, tasks)
    try:
        yield fleet
        fleet.assert_no_overlap()
    finally:
        fleet.close()


def syncs(worker: ClassicWorker, after: int = 0) -> list[SyncGroupResponse]:
    """The SyncGroup answers `worker` got that carried an assignment, from the `after`-th on."""
    return [s for s in worker.transport.sync_answers() if s.assignment is not None][after:]


def names(resources: object) -> set[str]:
    return set(resources.names()) if resources is not None else set()  # type: ignore[attr-defined]


def test_first_member_joins(fleet: ClassicFleet) -> None:
    """Lines 88-98: W1 joins an empty group with no assignment, becomes leader, and is sent
    everything with nothing revoked and no delay (line 97)."""
    w1 = fleet.start("W1")
    group = fleet.wait_stable()
    assert group.classic.leader_id == w1.member_id
    assert group.classic.protocol_name == "sessioned"
    [answer] = syncs(w1)
    assert answer.assignment is not None
    assert names(answer.assignment.assignment) == ALL
    assert names(answer.assignment.revoked) == set()
    assert answer.assignment.delay == 0
    assert w1.running() == ALL


# --- helpers --------------------------------------------------------------------------------


def form(fleet: ClassicFleet, *labels: str) -> list[ClassicWorker]:
    """The first worker alone, then the others at once: the seed's starting group."""
    first = fleet.start(labels[0])
    fleet.wait_stable()
    rest = [fleet.start(label) for label in labels[1:]]
    fleet.wait_stable()
    return [first, *rest]


def next_sync(worker: ClassicWorker, seen: int, timeout_s: float = 10.0) -> SyncGroupResponse:
    """The first assignment-carrying SyncGroup answer after the `seen` first ones."""
    return wait_for(
        f"{worker.incarnation}'s SyncGroup answer #{seen + 1}",
        lambda: (syncs(worker, seen) or [None])[0],
        timeout_s,
    )


def given(answer: SyncGroupResponse) -> set[str]:
    assert answer.assignment is not None
    return names(answer.assignment.assignment)


def revoked(answer: SyncGroupResponse) -> set[str]:
    assert answer.assignment is not None
    return names(answer.assignment.revoked)


def delay(answer: SyncGroupResponse) -> int:
    assert answer.assignment is not None
    return answer.assignment.delay


def tasks_of(resources: set[str]) -> set[str]:
    return {r for r in resources if r[-1].isdigit() and "-" in r}


def balanced(shares: list[set[str]]) -> bool:
    """Connectors and, separately, tasks within one of each other (Connect's balance)."""
    connectors = [len(s - tasks_of(s)) for s in shares]
    tasks = [len(tasks_of(s)) for s in shares]
    return max(connectors) - min(connectors) <= 1 and max(tasks) - min(tasks) <= 1


def leader_of(fleet: ClassicFleet) -> ClassicWorker:
    return fleet.by_member_id(fleet.leader_id())


# --- the scenarios --------------------------------------------------------------------------


def test_non_first_members_join(fleet: ClassicFleet) -> None:
    """Lines 100-125: W1 holds everything; W2 and W3 join while the rebalance is active (line
    108). W1 is told to revoke one connector and two tasks and gets nothing new (line 112);
    W2 and W3 get nothing (113-114); W1 stops the revoked work, then rejoins (115-116); in the
    next generation W2 and W3 get the revoked work, nothing is revoked (122-124)."""
    w1 = fleet.start("W1")
    fleet.wait_stable()
    w2, w3 = fleet.start("W2"), fleet.start("W3")
    first = next_sync(w1, 1)
    assert given(first) == set()
    assert len(revoked(first)) == 3
    assert len(tasks_of(revoked(first))) == 2  # line 112's shape: 1 connector, 2 tasks
    fleet.wait_stable()
    # W1's on_revoked returned before its next JoinGroup was answered (its rejoin, line 116).
    stop = next(r for r in w1.records if r.event == "revoked")
    assert stop.resources == revoked(first)
    second_join = w1.transport.join_answers()[-1]
    assert second_join.generation_id > w1.transport.join_answers()[1].generation_id
    later = [s for s in syncs(w2) + syncs(w3)]
    moved = set().union(*(given(s) for s in later))
    assert moved == revoked(first)
    assert all(revoked(s) == set() for s in later)
    assert all(delay(s) == 0 for s in later)
    shares = [w1.running(), w2.running(), w3.running()]
    assert set().union(*shares) == ALL
    assert balanced(shares), shares
    if all(len(syncs(w)) == 2 for w in (w2, w3)):
        # Both joined in W1's revoking generation (the seed's two rounds): their first answer
        # was empty (lines 113-114).
        assert given(syncs(w2)[0]) == given(syncs(w3)[0]) == set()


def test_worker_leaves(fleet: ClassicFleet) -> None:
    """Lines 131-153: from the balanced 3-worker group W2 leaves. The survivors' next answers
    revoke nothing, assign nothing and carry delay d (lines 143-144): W2's work runs nowhere;
    when the delay ends they rejoin on their own (145-147) and W2's work is spread over them
    with delay 0 (151-152)."""
    w1, w2, w3 = form(fleet, "W1", "W2", "W3")
    lost = w2.running()
    seen = {w: len(syncs(w)) for w in (w1, w3)}
    left_at = time.monotonic()
    fleet.leave(w2)
    for w in (w1, w3):
        answer = next_sync(w, seen[w])
        assert (given(answer), revoked(answer), delay(answer)) == (set(), set(), DELAY_MS)
    fleet.wait_stable(timeout_s=DELAY_MS / 1000 + 10)
    placed = [(w, s) for w in (w1, w3) for s in syncs(w, seen[w] + 1) if given(s) & lost]
    assert set().union(*(given(s) for _, s in placed)) == lost
    assert all(delay(s) == 0 and revoked(s) == set() for _, s in placed)
    first_run = min(
        r.t_start
        for w in (w1, w3)
        for r in w.records
        if r.event == "assigned" and r.resources & lost and r.t_start > left_at
    )
    assert first_run - left_at >= DELAY_MS / 1000 - 0.1, "lost work placed before the delay"
    assert balanced([w1.running(), w3.running()])
    assert w1.running() | w3.running() == ALL


def test_worker_bounces(fleet: ClassicFleet) -> None:
    """Lines 159-192: W2 leaves (delay d) and a new incarnation W2' joins before d ends (line
    174): classic has no static membership, so W2' is a new member. Its first answer assigns
    nothing, with the remaining delay d' (lines 178-181); when d' ends W2' gets exactly W2's
    former resources, delay 0 (line 190). (On the connect protocol W2 would get its work back
    at once, DESIGN 3.8; that is not Connect's behaviour.)"""
    w1, w2, w3 = form(fleet, "W1", "W2", "W3")
    lost = w2.running()
    seen = {w: len(syncs(w)) for w in (w1, w3)}
    fleet.leave(w2)
    first = next_sync(w1, seen[w1])
    assert delay(first) == DELAY_MS
    delayed_at = time.monotonic()
    time.sleep(0.3)
    w2b = fleet.start("W2")
    answer = next_sync(w2b, 0)
    elapsed_ms = (time.monotonic() - delayed_at) * 1000
    assert given(answer) == set()
    assert 0 < delay(answer) < DELAY_MS
    assert abs(delay(answer) - (DELAY_MS - elapsed_ms)) < 400, (delay(answer), elapsed_ms)
    fleet.wait_stable(timeout_s=DELAY_MS / 1000 + 10)
    assert w2b.running() == lost
    final = syncs(w2b)[-1]
    assert (given(final), delay(final)) == (lost, 0)
    assert w1.running() | w3.running() == ALL - lost


def test_leader_leaves(fleet: ClassicFleet) -> None:
    """Lines 201-216: the leader leaves with no delay in progress; a survivor becomes the
    leader (line 211; here the earliest to rejoin, DESIGN 3.19) and places the old leader's
    work at once, delay 0, balanced (lines 212-215; ICAT
    testTaskAssignmentWhenLeaderLeavesPermanently)."""
    workers = form(fleet, "W1", "W2", "W3")
    leader = leader_of(fleet)
    lost = leader.running()
    survivors = [w for w in workers if w is not leader]
    seen = {w: len(syncs(w)) for w in survivors}
    fleet.leave(leader)
    answers = [next_sync(w, seen[w]) for w in survivors]
    assert all(delay(a) == 0 and revoked(a) == set() for a in answers)
    assert set().union(*(given(a) for a in answers)) == lost
    group = fleet.wait_stable()
    assert group.classic.leader_id in {w.member_id for w in survivors}
    assert balanced([w.running() for w in survivors])


def test_leader_bounces(fleet: ClassicFleet) -> None:
    """Lines 220-269 as DESIGN 3.19 says (and DESIGN's "Where seed 003's scenarios differ"):
    W2 leaves (delay d) and W2' joins before d ends (d'); then the leader W1 leaves. The new
    leader did not compute the last completed generation, so it has no memory (KAFKA-9848;
    ICAT testTaskAssignmentWhenLeaderBounces): its first answer has delay 0 and places all
    four unowned resources at once over W2' and W3, unlike the seed's d'' (246-250). Then W1'
    joins as a new worker: one revoking round, then an assigning one, delay 0, balanced."""
    w1, w2, w3 = form(fleet, "W1", "W2", "W3")
    leader = leader_of(fleet)
    others = [w for w in (w1, w2, w3) if w is not leader]
    bouncer, keeper = others
    seen = len(syncs(keeper))
    fleet.leave(bouncer)
    assert delay(next_sync(keeper, seen)) == DELAY_MS
    bounced = fleet.start(bouncer.label)
    assert 0 < delay(next_sync(bounced, 0)) < DELAY_MS  # d'
    assert 0 < delay(next_sync(keeper, seen + 1)) < DELAY_MS  # the same generation's d'
    unowned = ALL - keeper.running()
    seen_keeper, seen_bounced = len(syncs(keeper)), len(syncs(bounced))
    fleet.leave(leader)
    answers = [next_sync(keeper, seen_keeper), next_sync(bounced, seen_bounced)]
    assert all(delay(a) == 0 for a in answers), [delay(a) for a in answers]
    assert set().union(*(given(a) for a in answers)) == unowned
    fleet.wait_stable()
    assert balanced([keeper.running(), bounced.running()])
    returned = fleet.start(leader.label)
    group = fleet.wait_stable(timeout_s=10)
    assert returned.running(), "the returning worker got nothing"
    assert all(delay(s) == 0 for s in syncs(returned))
    shares = [keeper.running(), bounced.running(), returned.running()]
    assert balanced(shares), shares
    assert set().union(*shares) == ALL
    assert group.classic.leader_id != leader.member_id
