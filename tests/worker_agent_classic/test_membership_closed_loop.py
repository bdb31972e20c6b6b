"""Classic membership machines in a closed loop against the coordinator's real pure core
(`coordinator_svc.core.classic_*` through `tests.core.classic_harness.ClassicHarness`, a fake
clock and timer wheel): every call a machine asks for is handled by the core, parked calls are
answered by its wakeups, and the work a machine starts or stops is done at once.

Checked at every step: no resource is owned (running or being started) by two machines, a
machine starts only what the coordinator says it holds, and a JoinGroup reports exactly what
runs (cooperative) or goes out with nothing running (eager), so revoked work is always stopped
before it (DESIGN 3.19, "Connect today")."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connect_protocol.classic_messages import JoinGroupResponse, SyncGroupResponse
from connect_protocol.errors import ErrorCode
from connect_protocol.resources import EMPTY, catalogue_resources
from coordinator_svc.core.classic_heartbeat import heartbeat as classic_heartbeat
from coordinator_svc.core.classic_heartbeat import leave_group
from coordinator_svc.core.classic_join import join_group
from coordinator_svc.core.classic_model import ClassicState
from coordinator_svc.core.classic_sync import sync_group
from tests.core.classic_harness import ClassicHarness
from worker_agent.classic.membership import (
    ClassicAction,
    ClassicConfig,
    ClassicMembership,
    ClassicPhase,
    SendClassicHeartbeat,
    SendJoinGroup,
    SendLeaveGroup,
    SendSyncGroup,
)
from worker_agent.membership import FindCoordinator, StartWork, StopWork

STEP_MS = 10
CATALOGUE = (("c1", 4), ("c2", 4))


@dataclass
class Record:
    at: int
    action: ClassicAction


class Fleet:
    """Machines named w1, w2, ... against one classic group of the real core."""

    def __init__(self, protocol: str, catalogue: tuple[tuple[str, int], ...] = CATALOGUE) -> None:
        self.protocol = protocol
        self.h = ClassicHarness("cg")
        for name, count in catalogue:
            self.h.put_connector(name, count)
        assert self.h.state is not None
        self.everything = catalogue_resources(self.h.state.catalogue.values())
        self.machines: dict[str, ClassicMembership] = {}
        self.owner_of_id: dict[str, str] = {}
        self.delivered = 0
        self.ids = itertools.count(1)
        self.log: dict[str, list[Record]] = defaultdict(list)
        #: Machines that die instead of sending their next SyncGroup.
        self.die_before_sync: set[str] = set()
        #: Machines cut off from the coordinator until the time given: their calls get no
        #: answer, though FindCoordinator does (so KAFKA-9184's revoke does not come first and
        #: the self-fence is what keeps them from running work given to others).
        self.partitioned: dict[str, int] = {}
        #: How long each listener call takes (ms), in turn; empty: none (done at once). A call
        #: that takes a while leaves a window in which answers arrive while work is starting
        #: or stopping, as on a real worker.
        #: Machines whose calls reach the coordinator but whose answers are lost until the
        #: time given (a deadline passed after the coordinator acted): they see a failure.
        self.lossy: dict[str, int] = {}
        self.work_ms: list[int] = []
        self._work_calls = 0
        self.pending_work: list[tuple[int, str, StopWork | StartWork]] = []

    @property
    def now(self) -> int:
        return self.h.now_ms

    def add(self, name: str) -> ClassicMembership:
        m = ClassicMembership(
            ClassicConfig(
                "cg",
                self.protocol,
                url=f"http://{name}",
                session_timeout_ms=1_000,
                rebalance_timeout_ms=500,
                heartbeat_interval_ms=100,
                retry_backoff_ms=20,
                retry_backoff_max_ms=160,
                request_timeout_ms=400,
                scheduled_rebalance_max_delay_ms=3_000,
            )
        )
        self.machines[name] = m
        return m

    def crash(self, name: str) -> None:
        """The process dies: its work dies with it; its member expires on the coordinator."""
        del self.machines[name]

    # --- the loop ---------------------------------------------------------------------------

    def perform(self, name: str, m: ClassicMembership, action: ClassicAction) -> None:
        h, now = self.h, self.now
        self.log[name].append(Record(now, action))
        cut_off = self.partitioned.get(name, -1) > now
        calls = (SendJoinGroup, SendSyncGroup, SendClassicHeartbeat, SendLeaveGroup)
        if cut_off and isinstance(action, calls):
            kind = {
                SendJoinGroup: "join",
                SendSyncGroup: "sync",
                SendClassicHeartbeat: "heartbeat",
                SendLeaveGroup: "leave",
            }[type(action)]
            m.on_call_failed(kind, "partitioned", now)
        elif isinstance(action, SendJoinGroup):
            self.check_join(m, action)
            new_id = f"{name}-{next(self.ids)}"
            req = action.request
            answer = h._run(lambda s: join_group(s, req, now, h.defaults, new_member_id=new_id))
            if isinstance(answer, JoinGroupResponse):
                if answer.error_code is ErrorCode.MEMBER_ID_REQUIRED:
                    self.owner_of_id[answer.member_id] = name
                if self.lossy.get(name, -1) > now:
                    m.on_call_failed("join", "answer lost", now)
                else:
                    m.on_join_response(answer, now)
        elif isinstance(action, SendSyncGroup) and name in self.die_before_sync:
            self.crash(name)
        elif isinstance(action, SendSyncGroup):
            sreq = action.request
            sync = h._run(lambda s: sync_group(s, sreq, now, h.defaults))
            if isinstance(sync, SyncGroupResponse):
                if self.lossy.get(name, -1) > now:
                    m.on_call_failed("sync", "answer lost", now)
                else:
                    m.on_sync_response(sync, now)
        elif isinstance(action, SendClassicHeartbeat):
            hreq = action.request
            beat = h._run(lambda s: classic_heartbeat(s, hreq, now, h.defaults))
            if self.lossy.get(name, -1) > now:
                m.on_call_failed("heartbeat", "answer lost", now)
            else:
                m.on_heartbeat_response(beat, now)
        elif isinstance(action, SendLeaveGroup):
            lreq = action.request
            m.on_leave_response(h._run(lambda s: leave_group(s, lreq, now, h.defaults)), now)
        elif isinstance(action, StopWork | StartWork):
            if isinstance(action, StartWork):
                held = h.held(m.member_id) if h.has_member(m.member_id) else EMPTY
                assert action.resources <= held, (name, action.resources, held)
            took = self.work_ms[self._work_calls % len(self.work_ms)] if self.work_ms else 0
            self._work_calls += 1
            if took:
                self.pending_work.append((now + took, name, action))
            else:
                self.finish_work(m, action)
        elif isinstance(action, FindCoordinator):
            m.coordinator_found(now)
        self.check_single_owner()

    def finish_work(self, m: ClassicMembership, action: StopWork | StartWork) -> None:
        if isinstance(action, StopWork):
            m.work_stopped(action.resources, self.now)
        else:
            m.work_started(action.resources, self.now)

    def finish_due_work(self) -> bool:
        due = [p for p in self.pending_work if p[0] <= self.now]
        self.pending_work = [p for p in self.pending_work if p[0] > self.now]
        for _at, name, action in due:
            m = self.machines.get(name)
            if m is not None:
                self.finish_work(m, action)
        return bool(due)

    def check_join(self, m: ClassicMembership, join: SendJoinGroup) -> None:
        """Revoked work is stopped before the JoinGroup that reports the allocation."""
        assert m._stopping is None and m._starting is None
        if m.eager:
            assert not m.running, "an eager worker joins with nothing running"
        for p in join.request.protocols:
            if p.metadata.version > 0:
                reported = p.metadata.allocation
                assert (reported or EMPTY) == m.running

    def check_single_owner(self) -> None:
        seen: dict[object, str] = {}
        for name, m in self.machines.items():
            for r in list(m.owned.connectors) + list(m.owned.tasks):
                assert r not in seen, f"{r} owned by {seen[r]} and {name}"
                seen[r] = name

    def deliver(self) -> bool:
        delivered = False
        while self.delivered < len(self.h.wakeups):
            w = self.h.wakeups[self.delivered]
            self.delivered += 1
            name = self.owner_of_id.get(w.member_id)
            m = self.machines.get(name) if name is not None else None
            if m is None:
                continue
            delivered = True
            cut = max(self.partitioned.get(name or "", -1), self.lossy.get(name or "", -1))
            if cut > self.now:
                m.on_call_failed(w.kind, "partitioned or answer lost", self.now)
            elif w.kind == "join":
                assert isinstance(w.response, JoinGroupResponse)
                m.on_join_response(w.response, self.now)
            else:
                assert isinstance(w.response, SyncGroupResponse)
                m.on_sync_response(w.response, self.now)
        return delivered

    def settle(self) -> None:
        for _ in range(500):
            busy = self.deliver()
            busy = self.finish_due_work() or busy
            for name, m in list(self.machines.items()):
                for action in m.poll(self.now):
                    busy = True
                    self.perform(name, m, action)
            if not busy:
                return
        raise AssertionError("the loop does not settle")

    def step(self, ms: int = STEP_MS) -> None:
        self.h.sleep(ms)
        self.settle()

    def run(self, ms: int) -> None:
        for _ in range(ms // STEP_MS):
            self.step()

    def converged(self) -> bool:
        if self.h.state is None or self.h.classic_state is not ClassicState.STABLE:
            return False
        running = EMPTY
        for m in self.machines.values():
            if m.phase is not ClassicPhase.STABLE or m._rejoin_needed:
                return False
            if m.scheduled_rebalance_ms is not None or m.owned != m.snapshot:
                return False
            # What it runs is what the coordinator counts as its own (a worker running work the
            # coordinator counts as nobody's would keep the group from ever being quiet).
            held = self.h.held(m.member_id) if self.h.has_member(m.member_id) else EMPTY
            if m.running != held:
                return False
            running = running | m.running
        return running == self.everything

    def run_until_converged(self, limit_ms: int = 10_000) -> int:
        start = self.now
        self.settle()
        while not self.converged():
            assert self.now - start < limit_ms, self.describe()
            self.step()
        return self.now - start

    def describe(self) -> str:
        return "; ".join(
            f"{n}: {m.phase.name} gen {m.generation} runs {m.running.describe()}"
            for n, m in self.machines.items()
        )

    def actions_of(self, name: str, kind: type) -> list[Record]:
        return [r for r in self.log[name] if isinstance(r.action, kind)]


def balanced(fleet: Fleet) -> bool:
    counts = [len(m.running) for m in fleet.machines.values()]
    return max(counts) - min(counts) <= 2


def test_sessioned_group_of_three_forms_and_a_fourth_gets_work_incrementally() -> None:
    """Three sessioned workers form; a fourth joins: it receives work through revocations of
    only what moves (Connect's incremental cooperative rebalance, two rounds), nobody stops work
    it keeps, and no resource ever runs twice."""
    fleet = Fleet("sessioned")
    for name in ("w1", "w2", "w3"):
        fleet.add(name)
    fleet.run_until_converged()
    assert all(m.running for m in fleet.machines.values())
    assert fleet.h.protocol == "sessioned"
    before = {n: m.running for n, m in fleet.machines.items()}
    marks = {n: len(fleet.log[n]) for n in before}

    fleet.add("w4")
    fleet.run_until_converged()
    after = {n: m.running for n, m in fleet.machines.items()}
    assert after["w4"], fleet.describe()
    moved = EMPTY
    for name, mark in marks.items():
        stops = [r.action for r in fleet.log[name][mark:] if isinstance(r.action, StopWork)]
        stopped = EMPTY
        for stop in stops:
            assert stop.reason == "revoked"
            stopped = stopped | stop.resources
        assert stopped.isdisjoint(after[name]), "stopped work it keeps"
        assert before[name] - stopped == after[name] - (after[name] - before[name])
        moved = moved | stopped
    assert moved == after["w4"]
    assert balanced(fleet)


def test_eager_group_stops_everything_on_every_rebalance() -> None:
    """Eager (protocol `default`): when a fourth worker joins, every worker stops all it runs
    before its JoinGroup (WorkerCoordinator.onJoinPrepare), then runs its new share."""
    fleet = Fleet("default")
    for name in ("w1", "w2", "w3"):
        fleet.add(name)
    fleet.run_until_converged()
    assert fleet.h.protocol == "default"
    before = {n: m.running for n, m in fleet.machines.items()}
    marks = {n: len(fleet.log[n]) for n in before}
    fleet.add("w4")
    fleet.run_until_converged()
    for name, mark in marks.items():
        records = fleet.log[name][mark:]
        stops = [r for r in records if isinstance(r.action, StopWork)]
        joins = [r for r in records if isinstance(r.action, SendJoinGroup)]
        assert stops and joins
        first_stop = records.index(stops[0])
        assert first_stop < records.index(joins[0])
        assert stops[0].action.resources == before[name]
        assert stops[0].action.reason == "eager rebalance"
    assert all(m.running for m in fleet.machines.values())


def test_a_worker_that_leaves_stops_then_its_work_moves() -> None:
    fleet = Fleet("sessioned")
    for name in ("w1", "w2", "w3"):
        fleet.add(name)
    fleet.run_until_converged()
    leaving = fleet.machines["w2"]
    leaving.leave(fleet.now)
    fleet.settle()
    while leaving.phase is not ClassicPhase.LEFT:
        fleet.step()
    assert not leaving.running and fleet.actions_of("w2", SendLeaveGroup)
    del fleet.machines["w2"]
    fleet.run_until_converged()


def test_leader_killed_between_join_and_sync() -> None:
    """The leader dies after the JoinGroup answer, before its SyncGroup: the others' SyncGroups
    end (REBALANCE_IN_PROGRESS or a new generation) within the leader's session timeout, no
    resource runs twice, and the group is STABLE again with every resource running."""
    fleet = Fleet("sessioned")
    for name in ("w1", "w2", "w3"):
        fleet.add(name)
    fleet.run_until_converged()
    leader = fleet.h.leader
    assert leader is not None
    leader_name = fleet.owner_of_id[leader]
    fleet.die_before_sync.add(leader_name)
    fleet.add("w4")  # a rebalance: the leader rejoins, gets the JoinGroup answer, dies
    start = fleet.now
    while leader_name in fleet.machines:
        fleet.step()
    died = fleet.now
    waiting = {n for n, m in fleet.machines.items() if m.phase is ClassicPhase.SYNCING}
    while waiting:
        fleet.step()
        waiting = {n for n in waiting if fleet.machines[n].phase is ClassicPhase.SYNCING}
        assert fleet.now - died <= 1_000, "a SyncGroup outlived the leader's session timeout"
    fleet.run_until_converged()
    assert fleet.now - start < 10_000


@pytest.mark.parametrize("protocol", ["sessioned", "default"])
def test_a_partitioned_worker_fences_itself_before_its_work_moves(protocol: str) -> None:
    """DESIGN 3.13/3.19: cut off for longer than its session, a worker stops everything
    before the coordinator expires it and hands its work on; then it rejoins."""
    fleet = Fleet(protocol)
    for name in ("w1", "w2", "w3"):
        fleet.add(name)
    fleet.run_until_converged()
    fleet.partitioned["w2"] = fleet.now + 2_000
    fleet.run(2_000)
    stops = [r.action for r in fleet.actions_of("w2", StopWork)]
    assert any(s.reason == "membership lost" for s in stops)  # type: ignore[attr-defined]
    fleet.run_until_converged()
    assert fleet.machines["w2"].running


def test_a_crashed_worker_s_work_waits_for_the_leaders_delay() -> None:
    """A worker dies (its session expires: no hold): the leader's incremental assignor keeps its
    work unassigned for scheduled.rebalance.max.delay.ms (the group's 3000 ms), the survivors
    rejoin when the delay ends (DistributedHerder's scheduledRebalance) and take it, without
    stopping anything they run (IncrementalCooperativeAssignorTest's WorkerLeavesPermanently)."""
    fleet = Fleet("sessioned")
    for name in ("w1", "w2", "w3"):
        fleet.add(name)
    fleet.run_until_converged()
    marks = {n: len(fleet.log[n]) for n in ("w1", "w2")}
    fleet.crash("w3")
    start = fleet.now
    delays: set[int] = set()
    while not fleet.converged():
        fleet.step()
        delays |= {
            m.scheduled_rebalance_ms - fleet.now
            for m in fleet.machines.values()
            if m.scheduled_rebalance_ms is not None
        }
        assert fleet.now - start < 10_000, fleet.describe()
    assert fleet.now - start >= 3_000 and delays
    for name, mark in marks.items():
        assert not [r for r in fleet.log[name][mark:] if isinstance(r.action, StopWork)]


def test_a_worker_bouncing_within_the_delay_gets_its_work_back() -> None:
    """IncrementalCooperativeAssignorTest's WorkerBounces, closed loop: w3 dies and a new
    process (a new member id) comes back within the delay; when the delay ends the lost work
    goes to it, the one worker seen empty during the delay."""
    fleet = Fleet("sessioned")
    for name in ("w1", "w2", "w3"):
        fleet.add(name)
    fleet.run_until_converged()
    lost = fleet.machines["w3"].running
    fleet.crash("w3")
    fleet.run(1_500)  # the session expires, the leader starts its delay
    assert any(m.scheduled_rebalance_ms is not None for m in fleet.machines.values())
    fleet.add("w3b")
    fleet.run_until_converged()
    assert fleet.machines["w3b"].running == lost


EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("wait"), st.integers(1, 40)),
        st.tuples(st.just("add"), st.integers(0, 0)),
        st.tuples(st.just("leave"), st.integers(0, 5)),
        st.tuples(st.just("crash"), st.integers(0, 5)),
        st.tuples(st.just("partition"), st.integers(0, 5)),
        st.tuples(st.just("lose_answers"), st.integers(0, 5)),
    ),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    protocol=st.sampled_from(["sessioned", "default"]),
    events=EVENTS,
    work_ms=st.lists(st.sampled_from([0, 0, 10, 30, 120]), max_size=4),
)
def test_no_resource_on_two_machines_whatever_the_order_of_events(
    protocol: str, events: list[tuple[str, int]], work_ms: list[int]
) -> None:
    """Random joins, leaves, crashes, partitions and waits, and listener calls that take a
    while: no resource is ever owned by two machines (the check runs after every action); the
    group converges once the events end, every machine running what the coordinator counts as
    its own."""
    fleet = Fleet(protocol, (("c1", 3), ("c2", 2)))
    fleet.work_ms = work_ms
    fleet.add("w1")
    fleet.add("w2")
    fleet.run(200)
    names = itertools.count(3)
    for kind, arg in events:
        alive = sorted(fleet.machines)
        if kind == "wait":
            fleet.run(arg * STEP_MS)
        elif kind == "add":
            fleet.add(f"w{next(names)}")
        elif kind == "leave" and alive:
            fleet.machines[alive[arg % len(alive)]].leave(fleet.now)
        elif kind == "crash" and len(alive) > 1:
            fleet.crash(alive[arg % len(alive)])
        elif kind == "partition" and alive:
            fleet.partitioned[alive[arg % len(alive)]] = fleet.now + 300 * (arg + 1)
        elif kind == "lose_answers" and alive:
            fleet.lossy[alive[arg % len(alive)]] = fleet.now + 60 * (arg + 1)
        fleet.step()
    for name in [n for n, m in fleet.machines.items() if m.phase is ClassicPhase.LEFT]:
        del fleet.machines[name]
    if not fleet.machines:
        fleet.add("w99")
    while any(m.phase is ClassicPhase.LEAVING for m in fleet.machines.values()):
        fleet.step()
    for name in [n for n, m in fleet.machines.items() if m.phase is ClassicPhase.LEFT]:
        del fleet.machines[name]
    if not fleet.machines:
        fleet.add("w98")
    fleet.run_until_converged(limit_ms=20_000)
