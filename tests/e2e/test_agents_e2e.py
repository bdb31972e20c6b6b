"""End to end: a real coordinator (`coordinator-svc serve` on PostgreSQL, FAST_DEFAULTS: session
3000 ms, heartbeat 200 ms, scheduled.rebalance.max.delay.ms 2000 ms) and real worker agents
(`python -m worker_agent.cli run`), each with an exec hook that records every call.

Every test checks, from the hook records and DescribeGroups, (a) that no connector or task ever
ran on two workers at once, (b) that once the group is quiet every catalogue resource runs on
exactly one live worker, the one DescribeGroups names, and (c) that connectors and tasks are
each balanced within one when no delay is pending (`Fleet.wait_quiet` makes all three checks).

The catalogue of the seeds' scenarios is AC0, AT1, AT2, BC0, BT1, here connector `A` with tasks
`A-0`, `A-1` and connector `B` with task `B-0`. The seeds' scenarios are read as DESIGN's
"Where seed 000's case studies and seed 003's scenarios differ from this page" says: a worker
that returns within the delay gets its own work back at once, the delay survives the assignor
member leaving, and epochs are compared relative to the group's epoch before the step.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import pytest

from tests.support.agents import Fleet, HookRecord, Quiet
from tests.support.tcp_proxy import CutMode, TcpProxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

ALL = {"A", "A-0", "A-1", "B", "B-0"}
WORKERS = {"W1", "W2", "W3"}
SESSION_S = 3.0  # FAST_DEFAULTS.session_timeout_ms
DELAY_S = 2.0  # FAST_DEFAULTS.scheduled_rebalance_max_delay_ms
SLACK_S = 0.05  # one host, one clock: only rounding separates the coordinator's ms and ours
MAX_DELAY = "scheduled.rebalance.max.delay.ms"
LONG_DELAY_MS = 6_000  # where a worker must restart within the delay
STOP_COST_S = 0.2  # what the recording hook sleeps where a test emulates slow starts and stops
FENCE_STOP_COST_S = 0.1  # the same for the partitioned agent, whose stop must fit in its margin


# --- helpers ------------------------------------------------------------------------------------


def seed_catalogue(fleet: Fleet) -> None:
    fleet.put_connector("A", 2)
    fleet.put_connector("B", 1)


def three_workers(fleet: Fleet, delay_ms: int | None = None, **agent_args: object) -> Quiet:
    """W1 joins alone (and becomes the assignor member), then W2 and W3 join together.
    `delay_ms`: the group's scheduled.rebalance.max.delay.ms, if not the default."""
    seed_catalogue(fleet)
    if delay_ms is not None:
        fleet.alter_configs({MAX_DELAY: delay_ms})
    fleet.start("W1", **agent_args)
    fleet.wait_quiet({"W1"})
    fleet.start("W2", "W3", **agent_args)
    return fleet.wait_quiet(WORKERS)


def calls(
    fleet: Fleet, member: str, event: str | None = None, after: float = 0.0
) -> list[HookRecord]:
    return [r for r in fleet.records(member, after) if event is None or r.event == event]


def union(records: Iterable[HookRecord]) -> set[str]:
    out: set[str] = set()
    for r in records:
        out |= r.resources
    return out


def deadline_s(quiet: Quiet) -> float:
    """The pending delayed rebalance's time, on the coordinator's clock (= ours), in seconds."""
    assert quiet.delay_pending, quiet.group
    return float(quiet.group.scheduled_rebalance_at_ms) / 1000


def non_leader(quiet: Quiet) -> str:
    leader = quiet.group.assignor_member_id
    return next(m for m in ("W2", "W3", "W1") if m != leader and quiet.assigned.get(m))


def assert_untouched(fleet: Fleet, members: Iterable[str], since: float) -> None:
    """These workers neither stopped nor started anything since `since`."""
    for m in members:
        assert not calls(fleet, m, after=since), (m, calls(fleet, m, after=since))


def assert_only_took(fleet: Fleet, members: Iterable[str], since: float, allowed: set[str]) -> None:
    """These workers stopped nothing since `since` and started only resources of `allowed`."""
    for m in members:
        assert not calls(fleet, m, "revoked", since), (m, calls(fleet, m, "revoked", since))
        assert union(calls(fleet, m, "assigned", since)) <= allowed, m


@pytest.fixture
def proxy(fleet: Fleet) -> Iterator[TcpProxy]:
    with TcpProxy(fleet.coordinator) as p:
        yield p


SELF_FENCED = "membership lost"  # what the agent logs when it fences itself or is fenced


def assert_never_fenced(fleet: Fleet, *members: str) -> None:
    """These workers' current runs never lost their membership: they could reach the
    coordinator throughout, so they must never have fenced themselves (nor been fenced)."""
    for m in members:
        lines = fleet.agents[m].current.log_lines(SELF_FENCED)
        assert not lines, f"{m} dropped out of the group although connected: {lines}"


# --- seed 003 (KIP-415): worker joins ----------------------------------------------------------


def test_first_worker_joins_and_gets_everything_at_once(fleet: Fleet) -> None:
    """Seed 003's "First new member joins": W1 computes and gets everything, at once (not a
    heartbeat interval later), in one epoch bump, and, being connected, never fences itself."""
    seed_catalogue(fleet)
    before = fleet.describe().group_epoch
    [agent] = fleet.start("W1")
    quiet = fleet.wait_quiet({"W1"})
    assert quiet.assigned == {"W1": ALL}
    assert quiet.group.assignor_member_id == "W1"
    assert_never_fenced(fleet, "W1")
    assert quiet.group.group_epoch == before + 1  # the join, and nothing else
    records = calls(fleet, "W1")
    assert [(r.event, r.resources, r.member_epoch) for r in records] == [
        ("assigned", frozenset(ALL), before + 1)
    ]
    waited = records[0].t_start - agent.current.logged_at("agent starting")
    assert waited < 1.0, f"W1 started its work {waited:.2f} s after it started"


def test_non_first_workers_join_and_only_needed_moves_happen(fleet: Fleet) -> None:
    """Seed 003's "Non-first new member joins": W2 and W3 join while the rebalance is active.
    W1 gives up exactly what balance requires (3 of its 5), nothing is moved twice, nobody
    else stops anything, and W1 keeps running the rest throughout."""
    seed_catalogue(fleet)
    fleet.start("W1", hook_sleep_s=STOP_COST_S)
    alone = fleet.wait_quiet({"W1"})
    t_join = time.time()
    fleet.start("W2", "W3", hook_sleep_s=STOP_COST_S)
    quiet = fleet.wait_quiet(WORKERS)
    kept = quiet.assigned["W1"]
    assert kept < alone.assigned["W1"]
    assert len(kept) == 2  # one connector, one task: the ceiling of 2/3 and of 3/3
    revoked = calls(fleet, "W1", "revoked", t_join)
    assert union(revoked) == ALL - kept
    assert sum(len(r.resources) for r in revoked) == 3  # each revoked once
    assert not calls(fleet, "W1", "assigned", t_join)  # W1 got nothing back
    for m in ("W2", "W3"):
        assert not calls(fleet, m, "revoked"), m
    moves = [r for m in ("W2", "W3") for r in calls(fleet, m, "assigned")]
    assert sum(len(r.resources) for r in moves) == 3  # every moved resource moved once
    assert quiet.group.assignor_member_id == "W1"  # the assignor member is sticky


# --- seed 000's case studies: W2 joins, W3 joins ----------------------------------------------


def test_case_study_w2_joins_then_w3_joins(fleet: Fleet) -> None:
    """Seed 000's "W2 joins the Group" at the process level: W1 gives up W2's share at its old
    epoch, and W2 starts it at the new target epoch only after W1 has stopped it (DESIGN 3.11).
    Then W3 joins: only one task moves (connectors are already balanced)."""
    seed_catalogue(fleet)
    fleet.start("W1", hook_sleep_s=STOP_COST_S)
    one = fleet.wait_quiet({"W1"})
    e1 = one.group.group_epoch

    t2 = time.time()
    fleet.start("W2", hook_sleep_s=STOP_COST_S)
    two = fleet.wait_quiet({"W1", "W2"})
    assert_never_fenced(fleet, "W1", "W2")
    e2 = two.group.group_epoch
    assert e2 == e1 + 1
    moved = two.assigned["W2"]
    assert len(moved) == 2 and len(two.assigned["W1"]) == 3  # floor/ceiling of 2 and of 3
    [w1_stop] = calls(fleet, "W1", "revoked", t2)
    [w2_start] = calls(fleet, "W2", "assigned", t2)
    assert w1_stop.resources == moved == w2_start.resources
    assert w1_stop.member_epoch == e1  # given up at its old epoch
    assert w2_start.member_epoch == e2  # received at the new target epoch
    assert w2_start.t_start > w1_stop.t_end  # revoke before assign, in real time

    t3 = time.time()
    fleet.start("W3", hook_sleep_s=STOP_COST_S)
    three = fleet.wait_quiet(WORKERS)
    assert_never_fenced(fleet, "W1", "W2", "W3")
    e3 = three.group.group_epoch
    assert e3 == e2 + 1
    assert_untouched(fleet, ["W2"], t3)
    [w3_start] = calls(fleet, "W3", "assigned", t3)
    [stop] = [r for m in ("W1", "W2") for r in calls(fleet, m, "revoked", t3)]
    assert stop.resources == w3_start.resources == three.assigned["W3"]
    assert len(w3_start.resources) == 1 and w3_start.resources <= {"A-0", "A-1", "B-0"}
    assert w3_start.member_epoch == e3 and stop.member_epoch == e2
    assert w3_start.t_start > stop.t_end


# --- seed 003: worker leaves, worker bounces -----------------------------------------------


def test_worker_killed_its_work_returns_after_the_delay_not_before(fleet: Fleet) -> None:
    """Seed 003's "Worker leaves" (SIGKILL): the coordinator removes it after the session
    timeout; its work is held back, unassigned, for scheduled.rebalance.max.delay.ms, and only
    then spread over the others, who keep what they had."""
    start = three_workers(fleet, hook_sleep_s=STOP_COST_S)
    victim = non_leader(start)
    survivors = WORKERS - {victim}
    lost = start.assigned[victim]
    t_kill = fleet.agents[victim].kill()

    held = fleet.wait_quiet(survivors, delay=True)
    assert held.unassigned == lost
    assert {m: held.assigned[m] for m in survivors} == {m: start.assigned[m] for m in survivors}
    due = deadline_s(held)
    assert t_kill + DELAY_S <= due <= t_kill + SESSION_S + DELAY_S + 2.0

    done = fleet.wait_quiet(survivors)
    for m in survivors:
        assert done.assigned[m] >= start.assigned[m], m  # kept theirs
    assert_only_took(fleet, survivors, t_kill, lost)
    taken = [r for m in survivors for r in calls(fleet, m, "assigned", t_kill)]
    assert union(taken) == lost
    for r in taken:
        assert r.t_start >= due - SLACK_S, f"{r} started before the delay's end {due:.3f}"


def test_worker_bounces_within_the_delay_and_gets_its_own_work_back_at_once(
    fleet: Fleet,
) -> None:
    """Seed 003's "Worker bounces" as DESIGN 3.8 has it: the worker (same --member-id) comes
    back while its work is held and gets exactly that work back at once, before the delay
    ends; the others are never disturbed. (The delay is raised to LONG_DELAY_MS so that a slow
    restart on a loaded machine still fits in it.)"""
    start = three_workers(fleet, delay_ms=LONG_DELAY_MS)
    victim = non_leader(start)
    survivors = WORKERS - {victim}
    t_kill = fleet.agents[victim].kill()
    held = fleet.wait_quiet(survivors, delay=True)
    due = deadline_s(held)

    fleet.agents[victim].start()
    back = fleet.wait_quiet(WORKERS)
    assert back.assigned == start.assigned
    second = fleet.agents[victim].current.records()
    assert [(r.event, set(r.resources)) for r in second] == [("assigned", start.assigned[victim])]
    assert second[0].t_start < due, "the returning worker waited for the delay"
    assert_untouched(fleet, survivors, t_kill)


def test_worker_restarted_before_its_session_expires_keeps_everything(fleet: Fleet) -> None:
    """DESIGN 3.2: a worker that rejoins at epoch 0 under an id the group still has is that
    member: it gets its whole assignment again, with no group epoch bump. (With the stall, the
    restarted agent fences itself 3 s after its rejoin, just when the coordinator expires the
    session it did not refresh: the member is removed and joins anew, a bump, some of the
    time; the fence itself, checked first, happens every time.)"""
    start = three_workers(fleet)
    victim = non_leader(start)
    t_kill = fleet.agents[victim].kill()
    fleet.agents[victim].start()
    back = fleet.wait_quiet(WORKERS)
    assert_never_fenced(fleet, victim)
    assert back.assigned == start.assigned
    assert back.group.group_epoch == start.group.group_epoch
    second = fleet.agents[victim].current.records()
    assert [(r.event, set(r.resources)) for r in second] == [("assigned", start.assigned[victim])]
    assert_untouched(fleet, WORKERS - {victim}, t_kill)


# --- seed 003: leader leaves, leader bounces ----------------------------------------------


def test_leader_leaves_its_work_is_held_then_spread(fleet: Fleet) -> None:
    """Seed 003's "Leader leaves" as DESIGN 3.5 has it: another member computes, and, since the
    assignor keeps everything it needs in the coordinator's assignor state, the departed
    leader's work is treated like any departed worker's: held for the delay, then spread."""
    start = three_workers(fleet)
    leader = start.group.assignor_member_id
    assert leader in WORKERS
    survivors = WORKERS - {leader}
    lost = start.assigned[leader]
    t_kill = fleet.agents[leader].kill()

    held = fleet.wait_quiet(survivors, delay=True)
    assert held.group.assignor_member_id in survivors
    assert held.unassigned == lost
    due = deadline_s(held)

    done = fleet.wait_quiet(survivors)
    assert_only_took(fleet, survivors, t_kill, lost)
    taken = [r for m in survivors for r in calls(fleet, m, "assigned", t_kill)]
    assert union(taken) == lost
    assert all(r.t_start >= due - SLACK_S for r in taken), (taken, due)
    assert done.group.assignor_member_id in survivors


def test_leader_bounces_during_a_delay_the_delay_survives(fleet: Fleet) -> None:
    """Seed 003's "Leader bounces" as DESIGN 3.5/3.8 have it: W2 leaves (delay d); during it the
    leader leaves too: the new assignor member keeps the same deadline and holds both shares;
    the leader comes back and gets its own work back at once while W2's stays held until the
    deadline, then is spread. (The delay is raised to LONG_DELAY_MS so that two leaves and a
    restart fit in it even on a loaded machine.)"""
    start = three_workers(fleet, delay_ms=LONG_DELAY_MS)
    leader = start.group.assignor_member_id
    other = non_leader(start)
    third = (WORKERS - {leader, other}).pop()

    t_other = time.time()
    assert fleet.agents[other].stop() == 0
    held1 = fleet.wait_quiet({leader, third}, delay=True)
    due = deadline_s(held1)
    assert held1.unassigned == start.assigned[other]

    assert fleet.agents[leader].stop() == 0
    held2 = fleet.wait_quiet({third}, delay=True)
    assert held2.group.assignor_member_id == third
    assert abs(deadline_s(held2) - due) < 0.3, "the new assignor member moved the deadline"
    assert held2.unassigned == start.assigned[other] | start.assigned[leader]

    t_back = time.time()
    fleet.agents[leader].start()
    held3 = fleet.wait_quiet({leader, third}, delay=True)
    assert time.time() < due, "too slow: the delay ended before the leader was back"
    assert held3.assigned[leader] == start.assigned[leader]
    assert held3.unassigned == start.assigned[other]
    assert abs(deadline_s(held3) - due) < 0.3
    first = fleet.agents[leader].current.records()
    assert [(r.event, set(r.resources)) for r in first] == [("assigned", start.assigned[leader])]

    done = fleet.wait_quiet({leader, third})
    taken = [r for m in (leader, third) for r in calls(fleet, m, "assigned", t_back)]
    late = [r for r in taken if r.resources & start.assigned[other]]
    assert union(late) >= start.assigned[other]
    assert all(r.t_start >= due - SLACK_S for r in late), (late, due)
    assert not calls(fleet, third, "revoked", t_other)
    assert done.unassigned == set()


# --- seed 000's "Worker Bounces": an unresponsive worker comes back -------------------------


def test_unresponsive_worker_fences_itself_and_gets_its_work_back(fleet: Fleet) -> None:
    """Seed 000's "Worker Bounces" with SIGSTOP: W2 stops heartbeating and is removed; its
    work is held. When it resumes it finds its session lapsed, stops everything itself
    (DESIGN 3.13), rejoins at epoch 0 (DESIGN's differences section) and gets exactly its work
    back at once; the others never notice. (The delay is raised to LONG_DELAY_MS, as for the
    bounce above; returning ends the hold, so it costs no time.)"""
    start = three_workers(fleet, delay_ms=LONG_DELAY_MS)
    victim = non_leader(start)
    survivors = WORKERS - {victim}
    lost = start.assigned[victim]
    t_pause = fleet.agents[victim].pause()

    # Not `check`ed: the paused worker still runs its share, which nobody else may get.
    held = fleet.wait_quiet(survivors, delay=True, check=False)
    assert held.unassigned == lost
    running = fleet.running()
    assert all(not (running[m] & lost) for m in survivors)
    due = deadline_s(held)
    fleet.check_no_overlap()

    t_resume = fleet.agents[victim].resume()
    back = fleet.wait_quiet(WORKERS)
    assert back.assigned == start.assigned
    after = calls(fleet, victim, after=t_resume)
    assert [(r.event, set(r.resources)) for r in after] == [("revoked", lost), ("assigned", lost)]
    assert after[1].t_start < due, "the returning worker waited for the delay"
    assert after[1].member_epoch > start.group.group_epoch
    assert_untouched(fleet, survivors, t_pause)


# --- catalogue changes while agents run ----------------------------------------------------


def test_connector_added_is_placed_at_once_and_nothing_moves(fleet: Fleet) -> None:
    start = three_workers(fleet)
    t_put = time.time()
    fleet.put_connector("C", 2)
    quiet = fleet.wait_quiet(WORKERS)
    assert quiet.group.group_epoch == start.group.group_epoch + 1
    for m in WORKERS:
        assert quiet.assigned[m] >= start.assigned[m], m
        assert not calls(fleet, m, "revoked", t_put), m
    started = [r for m in WORKERS for r in calls(fleet, m, "assigned", t_put)]
    assert sorted(x for r in started for x in r.resources) == ["C", "C-0", "C-1"]


def test_task_count_changes_and_connector_deleted(fleet: Fleet) -> None:
    start = three_workers(fleet, hook_sleep_s=STOP_COST_S)

    t_up = time.time()
    fleet.put_connector("A", 4)
    up = fleet.wait_quiet(WORKERS)
    for m in WORKERS:
        assert up.assigned[m] >= start.assigned[m], m
        assert not calls(fleet, m, "revoked", t_up), m
    started = [x for m in WORKERS for r in calls(fleet, m, "assigned", t_up) for x in r.resources]
    assert sorted(started) == ["A-2", "A-3"]

    t_down = time.time()
    fleet.put_connector("A", 1)
    down = fleet.wait_quiet(WORKERS)
    gone = {"A-1", "A-2", "A-3"}
    stopped = union(r for m in WORKERS for r in calls(fleet, m, "revoked", t_down))
    assert stopped >= gone
    restarted = union(r for m in WORKERS for r in calls(fleet, m, "assigned", t_down))
    assert not restarted & gone
    assert restarted == stopped - gone  # anything else stopped moved for balance, once
    assert set().union(*down.assigned.values()) == {"A", "A-0", "B", "B-0"}

    t_del = time.time()
    fleet.delete_connector("B")
    deleted = fleet.wait_quiet(WORKERS)
    stopped = union(r for m in WORKERS for r in calls(fleet, m, "revoked", t_del))
    assert stopped >= {"B", "B-0"}
    restarted = union(r for m in WORKERS for r in calls(fleet, m, "assigned", t_del))
    assert not restarted & {"B", "B-0"}
    assert set().union(*deleted.assigned.values()) == {"A", "A-0"}
    assert [c.name for c in deleted.group.catalogue] == ["A"]


# --- eager ----------------------------------------------------------------------------------


def assert_stopped_the_world(fleet: Fleet, before: dict[str, set[str]], since: float) -> None:
    """Every worker that ran something first stopped all of it, in one revocation."""
    for m, ran in before.items():
        if not ran:
            continue
        first = calls(fleet, m, after=since)
        assert first, f"{m} did not react"
        assert (first[0].event, set(first[0].resources)) == ("revoked", ran), (m, first)


def test_eager_protocol_stops_the_world_and_stays_correct(fleet: Fleet) -> None:
    """DESIGN 3.15: eager agents stop everything on every change, then take a fresh
    round-robin share; correct (never two owners) and balanced, and no delay ever."""
    seed_catalogue(fleet)
    fleet.start("W1", protocol="eager")
    one = fleet.wait_quiet({"W1"})
    assert one.group.assignor_name == "eager"
    assert one.assigned == {"W1": ALL}

    members = {"W1"}
    for newcomer in ("W2", "W3"):
        before, t = fleet.running(), time.time()
        fleet.start(newcomer, protocol="eager")
        members.add(newcomer)
        fleet.wait_quiet(members)
        assert_stopped_the_world(fleet, before, t)

    before, t = fleet.running(), time.time()
    fleet.put_connector("C", 1)
    fleet.wait_quiet(WORKERS)
    assert_stopped_the_world(fleet, before, t)

    before, t = fleet.running(), time.time()
    assert fleet.agents["W3"].stop() == 0
    done = fleet.wait_quiet({"W1", "W2"}, delay=False)  # eager holds nothing back
    assert_stopped_the_world(fleet, {m: before[m] for m in ("W1", "W2")}, t)
    assert done.group.assignor_name == "eager"
    assert set().union(*done.assigned.values()) == ALL | {"C", "C-0"}


# --- a partition: the agent fences itself before its work moves --------------------------


@pytest.mark.parametrize(
    "mode",
    [
        "refuse",
        "blackhole",
        "freeze",
    ],
)
def test_partitioned_agent_stops_its_work_before_anyone_else_starts_it(
    fleet: Fleet, proxy: TcpProxy, mode: CutMode
) -> None:
    """DESIGN 3.13: W3 reaches the coordinator through a proxy that the test cuts. W3 must stop
    its work (its revoked record) before the coordinator hands that work to another worker (that
    worker's assigned record starts after W3's revoked record ends). The delay is set to 0 so
    the work moves as soon as the coordinator expires W3's session: the tightest race. After the
    proxy is restored W3 rejoins and the group rebalances."""
    seed_catalogue(fleet)
    fleet.alter_configs({MAX_DELAY: 0})
    fleet.start("W1", hook_sleep_s=FENCE_STOP_COST_S)
    fleet.wait_quiet({"W1"})
    fleet.agent("W3", coordinator=proxy.address, hook_sleep_s=FENCE_STOP_COST_S)
    fleet.start("W2", "W3", hook_sleep_s=FENCE_STOP_COST_S)
    start = fleet.wait_quiet(WORKERS)
    lost = start.assigned["W3"]
    assert lost

    t_cut = time.time()
    proxy.cut(mode)
    fleet.wait_quiet({"W1", "W2"}, timeout_s=20)
    fences = calls(fleet, "W3", "revoked", t_cut)
    assert union(fences) == lost
    fenced_at = {x: r.t_end for r in fences for x in r.resources}
    taken = [r for m in ("W1", "W2") for r in calls(fleet, m, "assigned", t_cut)]
    assert union(taken) >= lost
    for r in taken:
        for x in r.resources & lost:
            assert r.t_start > fenced_at[x], (
                f"{x} started on {r.worker} at {r.t_start:.3f}, W3 stopped it at "
                f"{fenced_at[x]:.3f} (cut at {t_cut:.3f})"
            )

    proxy.restore()
    back = fleet.wait_quiet(WORKERS, timeout_s=20)
    assert back.assigned["W3"], "W3 rejoined but got nothing"


# --- SIGTERM ----------------------------------------------------------------------------------


def test_sigterm_revokes_everything_and_leaves_at_once(fleet: Fleet) -> None:
    """DESIGN 2.2: on SIGTERM the agent stops all its work through the hook, then leaves the
    group (epoch -1): the coordinator drops it at once, not after a session timeout. Its work
    is then held for the delay (KIP-415's "Worker leaves") and spread."""
    start = three_workers(fleet)
    victim = non_leader(start)
    survivors = WORKERS - {victim}
    ran = start.assigned[victim]

    t_term = time.time()
    assert fleet.agents[victim].stop() == 0
    t_exit = time.time()
    # Gone as soon as the agent has exited (the leave is answered before it exits) ...
    assert victim not in {m.member_id for m in fleet.describe().members}
    assert t_exit - t_term < SESSION_S, "the agent took longer than a session to leave"
    # ... because it left, not because its session expired.
    assert len(fleet.coordinator_events("member_left", victim)) == 1
    assert not fleet.coordinator_events("member_session_expired", victim)
    last = calls(fleet, victim, after=t_term)
    assert [(r.event, set(r.resources)) for r in last] == [("revoked", ran)]
    assert last[0].t_end < t_exit

    held = fleet.wait_quiet(survivors, delay=True)
    assert held.unassigned == ran
    due = deadline_s(held)
    fleet.wait_quiet(survivors)
    taken = [r for m in survivors for r in calls(fleet, m, "assigned", t_term)]
    assert union(taken) == ran
    assert all(r.t_start >= due - SLACK_S for r in taken), (taken, due)
