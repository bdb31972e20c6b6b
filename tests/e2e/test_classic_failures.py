"""Classic agents under failure, end to end (issue 26; DESIGN 3.19, 3.13): the leader killed
between its JoinGroup and its SyncGroup, churn with kills in eager and sessioned groups, a
worker's heartbeats while its JoinGroup is held. Real classic agents on threads, a real
coordinator process; every test ends with the no-overlap check over every listener call.

Timeouts: session 1000 ms, heartbeat 100 ms, rebalance 2000 ms (rebalance > session, so a
member that dies after its JoinGroup is removed by session expiry, which leaves no hold:
`classic_timers`, DESIGN 3.13).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from connect_protocol.classic_messages import JoinGroupResponse
from connect_protocol.errors import ErrorCode
from tests.support.agents import wait_for
from tests.support.classic_agents import Answer, ClassicFleet
from tests.support.classic_agents import classic_coordinator as classic_coordinator_process
from tests.support.coordinator import CoordinatorProcess

SESSION_MS = 1_000


@pytest.fixture(scope="module")
def classic_coordinator(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    """One coordinator process (and database) for the module; each test has its own group."""
    with classic_coordinator_process(
        postgres_admin_url, tmp_path_factory.mktemp("classic-failures"), 1_000
    ) as proc:
        yield proc


def new_fleet(coordinator: CoordinatorProcess, protocol: str = "sessioned") -> ClassicFleet:
    return ClassicFleet(
        coordinator.address,
        f"classic-failures-{uuid.uuid4().hex[:8]}",
        protocol=protocol,
        session_timeout_ms=SESSION_MS,
    )


def test_leader_killed_between_join_and_sync(classic_coordinator: CoordinatorProcess) -> None:
    """The leader dies on receiving its JoinGroup answer (before its SyncGroup): the other
    members' held SyncGroups end within the leader's session timeout (the coordinator expires
    its session and answers them REBALANCE_IN_PROGRESS; GroupMetadataManagerTest
    testLeaderFailureInSyncGroup's behaviour), a new generation has a new leader, and the group
    is STABLE again with every resource running on exactly one live worker."""
    with new_fleet(classic_coordinator) as fleet:
        fleet.put_connector("A", 4)
        fleet.put_connector("B", 2)
        for label in ("W1", "W2", "W3"):
            fleet.start(label)
        fleet.wait_stable()
        leader = fleet.by_member_id(fleet.leader_id())
        followers = [w for w in fleet.live() if w is not leader]

        def leader_answer(answer: Answer) -> bool:
            m = answer.message
            return (
                isinstance(m, JoinGroupResponse)
                and m.error_code is ErrorCode.NONE
                and (m.leader == m.member_id)
            )

        leader.transport.kill_when(leader_answer)
        fleet.put_connector("C", 1)  # a catalogue change starts a rebalance (DESIGN 3.19)
        killed_at = wait_for("the leader's death", lambda: leader.transport.killed_at, 10)
        fleet.kill(leader)
        for w in followers:
            ended = wait_for(
                f"{w.label}'s SyncGroup after the kill",
                lambda w=w: next(
                    (a for a in w.transport.answers if a.kind == "sync" and a.at > killed_at),
                    None,
                ),
                5,
            )
            assert ended.at - killed_at < SESSION_MS / 1000 + 0.5, ended
            assert ended.message.error_code in (
                ErrorCode.REBALANCE_IN_PROGRESS,
                ErrorCode.NONE,
            ), ended
        group = fleet.wait_stable(timeout_s=10)
        assert group.classic.leader_id in {w.member_id for w in followers}
        assert {m.member_id for m in group.members} == {w.member_id for w in followers}
        assert "C" in set().union(*(w.running() for w in followers))
        fleet.assert_no_overlap()


@pytest.mark.parametrize("protocol", ["eager", "sessioned"])
def test_no_resource_on_two_workers_under_churn(
    classic_coordinator: CoordinatorProcess, protocol: str
) -> None:
    """Four workers over 3 connectors x 4 tasks, each listener call taking 5 ms; then a
    graceful restart, a scale-out to six, a connector added and a follower killed, without
    waiting for the group in between; then quiet. No resource ever ran on two workers (the
    conservative reading of the listener calls: from the start of the call that started it to
    the end of the call that stopped it, or the kill), and the group ends STABLE with every
    resource running once."""
    with new_fleet(classic_coordinator, protocol) as fleet:
        for name in ("A", "B", "C"):
            fleet.put_connector(name, 4)
        workers = [fleet.start(f"W{i}") for i in range(1, 5)]
        for w in workers:
            w.slow.update(revoked=0.005, assigned=0.005)
        fleet.wait_stable()
        fleet.leave(workers[1])
        restarted = fleet.start("W2")
        restarted.slow.update(revoked=0.005, assigned=0.005)
        time.sleep(0.3)
        for label in ("W5", "W6"):
            fleet.start(label).slow.update(revoked=0.005, assigned=0.005)
        time.sleep(0.3)
        fleet.put_connector("D", 3)
        time.sleep(0.3)
        leader_id = fleet.leader_id()
        victim = next(w for w in fleet.live() if w.member_id and w.member_id != leader_id)
        fleet.kill(victim)
        try:
            group = fleet.wait_stable(timeout_s=20)
        except AssertionError:
            fleet.assert_no_overlap()  # safety first, whatever happened to liveness
            raise
        assert len(group.members) == 5
        fleet.assert_no_overlap()


def test_heartbeats_go_on_while_a_join_group_is_held(
    classic_coordinator: CoordinatorProcess,
) -> None:
    """Eager: every worker stops everything before its JoinGroup; W2's stop takes 1.5 s (more
    than a session timeout), so W1's JoinGroup is held that long. W1 keeps heartbeating
    meanwhile (a Departure from Kafka, which pauses heartbeats while joining: the coordinator
    answers REBALANCE_IN_PROGRESS and renews the session), and nobody is removed."""
    with new_fleet(classic_coordinator, "eager") as fleet:
        fleet.put_connector("A", 2)
        w1, w2 = fleet.start("W1"), fleet.start("W2")
        fleet.wait_stable()
        generation = fleet.describe().classic.generation_id
        w2.slow["revoked"] = 1.5
        before = w1.agent.metrics.heartbeats.value()
        joins = len(w1.transport.join_answers())
        fleet.put_connector("B", 1)
        wait_for("W1's JoinGroup answered", lambda: len(w1.transport.join_answers()) > joins, 10)
        sent = w1.agent.metrics.heartbeats.value() - before
        assert sent >= 8, f"only {sent} heartbeats while the JoinGroup was held"
        group = fleet.wait_stable()
        assert group.classic.generation_id == generation + 1  # one join phase: nobody removed
        assert {m.member_id for m in group.members} == {w1.member_id, w2.member_id}
        fleet.assert_no_overlap()


def test_a_slow_revoker_is_removed_with_a_hold_and_its_work_then_placed_at_once(
    classic_coordinator: CoordinatorProcess,
) -> None:
    """The one scenario here in which a member is removed with a hold (DESIGN 3.19), so it
    follows DESIGN's hold rule, not Connect's delay: W3 takes 2.5 s to stop the work it is told
    to revoke when two workers join (it held everything), more than its rebalance timeout
    (2 s), while it heartbeats; later stops are quick. (A stop that outlasted the hold too
    would overlap: the hold is the bound, DESIGN 3.13.) The coordinator removes it with a
    hold (REVOCATION_TIMED_OUT): the work it did not release is held away from everyone (listed
    as `withheld` to the leader) for its session timeout, and W3, told UNKNOWN_MEMBER_ID, stops
    it (its fence deadline at the latest). When the hold ends the leader's ports see that work
    as new and place it at once: delay 0, not the scheduled rebalance delay Connect would apply
    to lost work."""
    with new_fleet(classic_coordinator) as fleet:
        fleet.put_connector("A", 5)
        w3 = fleet.start("W3")
        fleet.wait_stable()
        slow_id, slow_share = w3.member_id, w3.running()
        w3.slow_once["revoked"] = 2.5
        for label in ("W1", "W2"):  # new members: W3 is told to revoke most of its work
            fleet.start(label)
        withheld = wait_for(
            "a JoinGroup answer withholding W3's unreleased work",
            lambda: next(
                (
                    set(j.withheld.names())
                    for w in fleet.live()
                    for j in w.transport.join_answers()
                    if j.withheld
                ),
                None,
            ),
            15,
            diagnostics=fleet.diagnostics,
        )
        assert withheld <= slow_share, (withheld, slow_share)
        group = fleet.wait_stable(timeout_s=20)
        assert slow_id not in {m.member_id for m in group.members}
        # Placed at once when the hold ended: every SyncGroup answer that handed out withheld
        # work carried no delay.
        placed = [
            s.assignment
            for w in fleet.live()
            for s in w.transport.sync_answers()
            if s.assignment is not None and set(s.assignment.assignment.names()) & withheld
        ]
        assert placed, "the withheld work was never placed"
        assert all(a.delay == 0 for a in placed), [a.delay for a in placed]
        fleet.assert_no_overlap()
