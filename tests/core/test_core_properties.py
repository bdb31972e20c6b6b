"""Property tests of the core: a hypothesis state machine of 3-5 simulated workers around one group.

Each worker process is an honest agent (DESIGN 2.3, 3.13): it runs what it is told, stops what is
revoked before it reports it gone, reports its owned list, computes targets when asked, and stops
everything when it is fenced or when nearly a session timeout (minus one heartbeat interval) has
passed since its last successful heartbeat. Around it the world misbehaves: responses are lost,
revocations are acknowledged late, workers go silent (still running their work), crash, leave
(dynamically or statically) and come back under the same or a new member id, the catalogue
changes, the clock jumps, and the assignor installs balanced, rotated, delayed partial, failed or
invalid targets, sometimes long after its Prepare.

Invariants, after every step and every timer: no resource is in two members' current-plus-pending
sets or in a member's set and another's hold; no resource runs on two worker processes at once,
counting processes the coordinator has removed but not yet told; everything a process runs is
accounted for by the coordinator (its member's current-plus-pending set, or a hold for it);
group, assignment and member epochs never go down; assignment epoch <= group epoch. Once the
world calms down (teardown: every live worker heartbeats honestly while the clock runs), the group
converges: STABLE, every member at the target, every catalogue resource assigned and running on
exactly the worker it is assigned to. And a group rebuilt from every record equals the live one.

Revocation listeners may also finish one resource at a time, each reported at once (partial
release, DESIGN 3.11). Fencing tokens (DESIGN 3.18): every assigned resource has one, the
assignment a process is sent carries exactly the coordinator's, a resource's token never goes
down, and it goes strictly up whenever the resource goes to a member that did not hold it,
across a rebuild from the records (a restart or takeover loads the same).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import Assignor, HeartbeatResponse, PrepareResponse
from connect_protocol.resources import ResourceSet
from coordinator_svc.core.model import GroupConfigDefaults, GroupStatus, MemberState
from tests.core.harness import COMPATIBLE, EAGER, SESSIONED, GroupHarness, rs

SESSION = 1_000
INTERVAL = 100
REBALANCE = 400
MAX_DELAY = 1_500

DEFAULTS = GroupConfigDefaults(
    session_timeout_ms=SESSION,
    heartbeat_interval_ms=INTERVAL,
    rebalance_timeout_ms=REBALANCE,
    scheduled_rebalance_max_delay_ms=MAX_DELAY,
    assignment_error_backoff_ms=50,
)

PROTOCOLS: dict[str, tuple[Assignor, ...]] = {
    "sessioned": SESSIONED,
    "compatible": COMPATIBLE,
    "eager": EAGER,
}

Names = frozenset[str]
F = TypeVar("F", bound=Callable[..., Any])


def step(method: F) -> F:
    """Mark the machine broken while a rule or invariant runs, so that teardown does not run the
    convergence phase on top of a failure (which would hide it)."""

    @functools.wraps(method)
    def wrapper(self: CoreMachine, *args: Any, **kwargs: Any) -> Any:
        self.broken = True
        result = method(self, *args, **kwargs)
        self.broken = False
        return result

    return wrapper  # type: ignore[return-value]


@dataclass
class Process:
    """One worker process: an honest agent. `running` includes `stopping` (revoked, not yet
    stopped: a revocation listener still at work)."""

    member_id: str
    slot: int
    instance_id: str | None
    assignors: tuple[Assignor, ...]
    alive: bool = True
    silent: bool = False
    joined: bool = False
    epoch: int = 0
    running: Names = frozenset()
    stopping: Names = frozenset()
    last_success_ms: int | None = None
    session_ms: int = SESSION
    interval_ms: int = INTERVAL
    last_sent_owned: Names | None = None
    compute_pending: bool = False
    prepared: PrepareResponse | None = None

    def fence_deadline(self) -> int | None:
        """When the agent stops everything on its own (DESIGN 3.13)."""
        if not self.alive or not self.joined or self.last_success_ms is None:
            return None
        return self.last_success_ms + self.session_ms - self.interval_ms

    def stop_all(self) -> None:
        self.running = frozenset()
        self.stopping = frozenset()
        self.joined = False
        self.compute_pending = False
        self.prepared = None
        self.last_sent_owned = None


@dataclass
class Slot:
    """A place for a worker (a pod): its instance id if static, and its protocol."""

    index: int
    instance_id: str | None
    protocol: str
    generation: int = 0
    process: Process | None = None
    history: list[Process] = field(default_factory=list)


def catalogue_items(prepared: PrepareResponse) -> tuple[list[str], list[str]]:
    connectors = sorted(c.name for c in prepared.catalogue)
    tasks = sorted(f"{c.name}-{i}" for c in prepared.catalogue for i in range(c.task_count))
    return connectors, tasks


def balance(members: list[str], items: list[str], current: dict[str, Names]) -> dict[str, set[str]]:
    """Sticky balance: each member gets the floor or the ceiling, keeping what it has."""
    result: dict[str, set[str]] = {m: set() for m in members}
    if not members:
        return result
    base, extra = divmod(len(items), len(members))
    item_set = set(items)
    order = sorted(members, key=lambda m: (-len(current[m] & item_set), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
    taken: set[str] = set()
    for m in members:
        keep = sorted(current[m] & item_set)[: quota[m]]
        result[m].update(keep)
        taken.update(keep)
    free = [x for x in items if x not in taken]
    for m in members:
        while len(result[m]) < quota[m]:
            result[m].add(free.pop(0))
    return result


def rotate(members: list[str], items: list[str], offset: int) -> dict[str, set[str]]:
    """Non-sticky round robin (what an eager assignor does each round)."""
    result: dict[str, set[str]] = {m: set() for m in members}
    for i, item in enumerate(items):
        result[members[(i + offset) % len(members)]].add(item)
    return result


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = GroupHarness(defaults=DEFAULTS)
        self.slots: list[Slot] = []
        self.broken = False
        self.max_group_epoch = 0
        self.max_assignment_epoch = 0
        self.member_epochs: dict[str, int] = {}
        self.last_token: dict[str, tuple[str, int]] = {}  # resource -> (member, its token)

    # --- helpers ---

    def processes(self) -> list[Process]:
        return [p for s in self.slots for p in s.history]

    def live(self, slot: int) -> Process | None:
        p = self.slots[slot % len(self.slots)].process
        if p is None or not p.alive or p.silent:
            return None
        return p

    def new_process(self, slot: Slot, new_id: bool) -> None:
        if new_id:
            slot.generation += 1
        suffix = f".{slot.generation}" if slot.generation else ""
        p = Process(
            member_id=f"w{slot.index}{suffix}",
            slot=slot.index,
            instance_id=slot.instance_id,
            assignors=PROTOCOLS[slot.protocol],
        )
        slot.process = p
        slot.history.append(p)

    def send_heartbeat(
        self, p: Process, lose: bool, delay_ack: bool, omit_owned: bool = False
    ) -> None:
        h = self.h
        sent_at = h.now_ms
        if not p.joined:
            assert not p.running, "a (re)joining agent has abandoned everything"
            response = h.join(
                p.member_id,
                assignors=p.assignors,
                owned=rs(),
                instance_id=p.instance_id,
                rebalance_timeout_ms=REBALANCE,
            )
            p.last_sent_owned = frozenset()
        else:
            owned: ResourceSet | None = rs(*p.running)
            if omit_owned and p.last_sent_owned == p.running:
                owned = None
            else:
                p.last_sent_owned = p.running
            response = h.heartbeat(p.member_id, p.epoch, owned=owned, instance_id=p.instance_id)
        if not lose:
            self.receive(p, response, sent_at, delay_ack)

    def receive(
        self, p: Process, response: HeartbeatResponse, sent_at: int, delay_ack: bool
    ) -> None:
        code = response.error_code
        if code in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT):
            p.joined = True
            p.epoch = response.member_epoch
            p.last_success_ms = sent_at
            p.session_ms = response.session_timeout_ms
            p.interval_ms = response.heartbeat_interval_ms
            if response.assignment is not None:
                member = self.h.member(p.member_id)
                assert response.assignment.tokens == member.tokens, (response, member)
                new = frozenset(response.assignment.resources.names())
                to_stop = p.running - new
                p.stopping = p.stopping - new
                if delay_ack:
                    p.stopping = p.stopping | to_stop
                else:
                    p.running = p.running - to_stop
                    p.stopping = p.stopping - to_stop
                p.running = p.running | new
            if code == ErrorCode.COMPUTE_ASSIGNMENT:
                p.compute_pending = True
        elif code in (ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID):
            p.stop_all()
        elif code == ErrorCode.UNRELEASED_INSTANCE_ID:
            assert not p.joined and not p.running
        elif code == ErrorCode.FENCED_INSTANCE_ID:
            p.stop_all()
            p.alive = False
        else:
            raise AssertionError(f"unexpected heartbeat response {response}")

    def advance(self, ms: int) -> None:
        """Run the clock: agents fence themselves when due, before timers due at the same time."""
        h = self.h
        end = h.now_ms + ms
        while True:
            deadlines = [d for p in self.processes() if (d := p.fence_deadline()) is not None]
            timer = h.next_deadline()
            if timer is not None:
                deadlines.append(timer)
            t = min([end, *deadlines])
            t = max(t, h.now_ms)
            for p in self.processes():
                d = p.fence_deadline()
                if d is not None and d <= t:
                    p.stop_all()
            h.sleep(t - h.now_ms)
            self.check_all()
            if t >= end:
                return

    def targets(self, prepared: PrepareResponse, mode: str, offset: int) -> dict[str, ResourceSet]:
        members = [m.member_id for m in prepared.members]
        current = {m.member_id: frozenset(m.owned.names()) for m in prepared.members}
        connectors, tasks = catalogue_items(prepared)
        if mode == "rotate":
            shares = rotate(members, connectors, offset)
            for m, ts in rotate(members, tasks, offset + 1).items():
                shares[m] |= ts
        else:
            shares = balance(members, connectors, current)
            for m, ts in balance(members, tasks, current).items():
                shares[m] |= ts
        if mode == "partial":
            everything = sorted(connectors + tasks)
            dropped = set(everything[offset % max(1, len(everything)) :: 3])
            shares = {m: s - dropped for m, s in shares.items()}
        return {m: rs(*s) for m, s in shares.items()}

    # --- invariants ---

    def check_all(self) -> None:
        h = self.h
        s = h.state
        if s is None:
            return
        # Epochs never go down; the assignment epoch never passes the group epoch.
        assert s.group_epoch >= self.max_group_epoch
        assert s.assignment_epoch >= self.max_assignment_epoch
        assert s.assignment_epoch <= s.group_epoch
        self.max_group_epoch = s.group_epoch
        self.max_assignment_epoch = s.assignment_epoch
        for member_id, m in s.members.items():
            assert m.member_epoch >= self.member_epochs.get(member_id, 0), member_id
            assert m.member_epoch <= s.assignment_epoch
            assert m.assigned.isdisjoint(m.pending_revocation)
            if m.pending_revocation:
                assert m.state in (MemberState.UNREVOKED, MemberState.LEFT), m
        self.member_epochs = {mid: m.member_epoch for mid, m in s.members.items()}

        # Fencing tokens: one per assigned resource; per resource never down, and strictly up
        # on a grant to a member that did not hold it.
        for member_id, m in s.members.items():
            assert set(m.tokens) == {*m.assigned.connectors, *m.assigned.tasks}, m
            assert all(t <= s.meta.last_fencing_token for t in m.tokens.values())
            for resource, token in m.tokens.items():
                name = str(resource)
                previous = self.last_token.get(name)
                if previous is not None:
                    holder, seen = previous
                    assert token >= seen, f"{name}'s token went down: {seen} -> {token}"
                    if holder != member_id:
                        assert token > seen, f"{name} went to {member_id} with old token {seen}"
                self.last_token[name] = (member_id, token)

        # A resource is in at most one member's current-plus-pending set, and never in a member's
        # set while a hold of another keeps it.
        owners: dict[str, str] = {}
        for member_id, m in s.members.items():
            for name in m.owned.names():
                assert name not in owners, f"{name} owned by {owners[name]} and {member_id}"
                owners[name] = member_id
        held: dict[str, str] = {}
        for hold in s.meta.holds:
            for name in hold.resources.names():
                assert name not in owners, (
                    f"{name} held for {hold.member_id}, owned by {owners[name]}"
                )
                held[name] = hold.member_id

        # No resource runs on two processes, and all that runs is accounted for.
        running: dict[str, str] = {}
        for p in self.processes():
            if not p.alive:
                assert not p.running, f"{p.member_id} is dead but runs {sorted(p.running)}"
                continue
            assert p.stopping <= p.running
            for name in p.running:
                assert name not in running, (
                    f"{name} runs on {running[name]} and {p.member_id} at {h.now_ms}"
                )
                running[name] = p.member_id
                assert owners.get(name) == p.member_id or held.get(name) == p.member_id, (
                    f"{p.member_id} runs {name}, which the coordinator gives to "
                    f"{owners.get(name) or held.get(name) or 'nobody'} at {h.now_ms}"
                )

    @invariant()
    @step
    def invariants_hold(self) -> None:
        self.check_all()

    # --- setup ---

    @initialize(
        n=st.integers(3, 5),
        statics=st.lists(st.integers(0, 2).map(bool), min_size=5, max_size=5),
        protocols=st.lists(st.sampled_from(sorted(PROTOCOLS)), min_size=5, max_size=5),
        tasks=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    )
    @step
    def setup(
        self, n: int, statics: list[bool], protocols: list[str], tasks: tuple[int, int]
    ) -> None:
        self.h.put_connector("C0", tasks[0])
        self.h.put_connector("C1", tasks[1])
        for i in range(n):
            slot = Slot(i, f"i{i}" if statics[i] else None, protocols[i])
            self.slots.append(slot)
            self.new_process(slot, new_id=False)

    # --- workers ---

    def act_prepare(self, p: Process) -> None:
        """Prepare, unless already computing from an earlier Prepare (it installs that first)."""
        if not p.joined or not p.compute_pending or p.prepared is not None:
            return
        response = self.h.prepare(p.member_id, p.epoch)
        if response.error_code == ErrorCode.NONE:
            p.prepared = response
        elif response.error_code == ErrorCode.UNKNOWN_MEMBER_ID:
            p.compute_pending = False
            p.prepared = None
        else:
            assert response.error_code == ErrorCode.FENCED_MEMBER_EPOCH, response

    def act_install(self, p: Process, mode: str, offset: int, delay: int) -> None:
        prepared = p.prepared
        if prepared is None:
            return
        s = self.h.state
        assert s is not None
        fresh = (
            s.meta.prepared is not None
            and s.meta.prepared.group_epoch == prepared.group_epoch
            and s.assignment_epoch < prepared.group_epoch
            and s.meta.assignor_member_id == p.member_id
            and s.members[p.member_id].member_epoch == p.epoch
        )
        targets = self.targets(prepared, mode, offset)
        if mode == "invalid":
            targets = {**targets, prepared.members[0].member_id: rs("no-such-connector")}
        response = self.h.install(
            p.member_id,
            targets,
            group_epoch=prepared.group_epoch,
            member_epoch=p.epoch,
            delay_ms=delay if mode == "partial" else 0,
            error=1 if mode == "error" else 0,
            error_message="assignor failed" if mode == "error" else "",
            assignor_state=f"{mode}@{prepared.group_epoch}".encode(),
        )
        if mode == "invalid":
            assert response.error_code != ErrorCode.NONE
        elif fresh:
            # A valid install against the group's last Prepare is never refused.
            assert response.error_code == ErrorCode.NONE, response
        p.prepared = None
        p.compute_pending = False

    @rule(
        slot=st.integers(0, 4),
        lose=st.integers(0, 3).map(lambda x: x == 0),
        delay_ack=st.integers(0, 3).map(lambda x: x == 0),
        omit_owned=st.booleans(),
    )
    @step
    def heartbeat(self, slot: int, lose: bool, delay_ack: bool, omit_owned: bool) -> None:
        p = self.live(slot)
        if p is not None:
            self.send_heartbeat(p, lose, delay_ack, omit_owned)

    @rule(
        losses=st.lists(st.integers(0, 4).map(lambda x: x == 0), min_size=5, max_size=5),
        delays=st.lists(st.integers(0, 3).map(lambda x: x == 0), min_size=5, max_size=5),
        assign=st.sampled_from(
            ["balanced", "balanced", "rotate", "partial", "error", "invalid", "later", "later"]
        ),
        offset=st.integers(0, 7),
        delay=st.integers(1, 2 * MAX_DELAY),
        omit_owned=st.booleans(),
        order=st.permutations(range(5)),
    )
    @step
    def everyone_heartbeats(
        self,
        losses: list[bool],
        delays: list[bool],
        assign: str,
        offset: int,
        delay: int,
        omit_owned: bool,
        order: list[int],
    ) -> None:
        """Every live process heartbeats once, in some order; one asked to compute prepares at
        once and installs a target of kind `assign` (or, with "later", in a later step)."""
        for index in order:
            if index >= len(self.slots):
                continue
            s = self.slots[index]
            p = self.live(s.index)
            if p is None:
                continue
            self.send_heartbeat(p, losses[s.index], delays[s.index], omit_owned)
            self.act_prepare(p)
            if assign != "later":
                self.act_install(p, assign, offset, delay)

    @rule(slot=st.integers(0, 4))
    @step
    def finish_revocations(self, slot: int) -> None:
        """A slow revocation listener returns: what was revoked is now stopped."""
        p = self.live(slot)
        if p is not None:
            p.running = p.running - p.stopping
            p.stopping = frozenset()

    @rule(slot=st.integers(0, 4), which=st.integers(0, 7), report=st.booleans())
    @step
    def finish_one_revocation(self, slot: int, which: int, report: bool) -> None:
        """A per-resource listener finishes one revoked resource (and the agent may report it
        at once: a partial release)."""
        p = self.live(slot)
        if p is None or not p.stopping:
            return
        done = sorted(p.stopping)[which % len(p.stopping)]
        p.running = p.running - {done}
        p.stopping = p.stopping - {done}
        if report and p.joined:
            self.send_heartbeat(p, lose=False, delay_ack=True)

    @rule(
        slot=st.integers(0, 4),
        event=st.sampled_from(
            ["go_silent", "wake_up", "crash", "start", "leave"] + ["restart", "restart_new_id"] * 2
        ),
    )
    @step
    def lifecycle(self, slot: int, event: str) -> None:
        """Processes go silent (partitioned or hung: still running their work), wake up, crash
        (running nothing), start in an empty slot, leave for good, or restart (a rolling restart:
        SIGTERM stops everything, then leaves with -2 if static, keeping the assignment, or -1;
        a new process starts under the same or a new member id)."""
        s = self.slots[slot % len(self.slots)]
        p = s.process
        if event == "start":
            if p is None or not p.alive:
                self.new_process(s, new_id=False)
        elif p is None or not p.alive:
            return
        elif event == "go_silent":
            p.silent = True
        elif event == "wake_up":
            p.silent = False
        elif event == "crash":
            p.stop_all()
            p.alive = False
        elif not p.silent:
            p.stop_all()
            p.alive = False
            epoch = -1 if event == "leave" or p.instance_id is None else -2
            response = self.h.heartbeat(p.member_id, epoch, instance_id=p.instance_id)
            assert response.error_code in (
                ErrorCode.NONE,
                ErrorCode.UNKNOWN_MEMBER_ID,
                ErrorCode.FENCED_INSTANCE_ID,
            ), response
            if event != "leave":
                self.new_process(s, new_id=event == "restart_new_id")

    # --- the assignor ---

    @rule(slot=st.integers(0, 4))
    @step
    def prepare(self, slot: int) -> None:
        p = self.live(slot)
        if p is not None:
            self.act_prepare(p)

    @rule(
        slot=st.integers(0, 4),
        mode=st.sampled_from(["balanced", "balanced", "rotate", "partial", "error", "invalid"]),
        offset=st.integers(0, 7),
        delay=st.integers(1, 2 * MAX_DELAY),
    )
    @step
    def install(self, slot: int, mode: str, offset: int, delay: int) -> None:
        """Install what the last Prepare showed, maybe long after it (installs race)."""
        p = self.live(slot)
        if p is not None:
            if p.prepared is None:
                self.act_prepare(p)
            self.act_install(p, mode, offset, delay)

    # --- the world ---

    @rule(
        connector=st.integers(0, 3),
        tasks=st.integers(-1, 3),
        config=st.booleans(),
    )
    @step
    def catalogue(self, connector: int, tasks: int, config: bool) -> None:
        """Put a connector (a new one, a task count change or a config-only change), or delete
        it (tasks == -1)."""
        name = f"C{connector}"
        s = self.h.state
        if tasks >= 0:
            response = self.h.put_connector(name, tasks, {"v": "1"} if config else {})
            assert response.error_code == ErrorCode.NONE
        elif s is not None and name in s.catalogue:
            assert self.h.delete_connector(name).error_code == ErrorCode.NONE

    @rule(
        ms=st.one_of(
            st.integers(1, INTERVAL), st.integers(1, 3 * INTERVAL), st.integers(1, 2 * SESSION)
        )
    )
    @step
    def advance_clock(self, ms: int) -> None:
        self.advance(ms)

    # --- convergence ---

    def teardown(self) -> None:
        if self.broken or not self.slots:
            return
        h = self.h
        for s in self.slots:
            if s.process is not None:
                s.process.silent = False
        if not any(s.process is not None and s.process.alive for s in self.slots):
            self.new_process(self.slots[0], new_id=False)
        for _ in range(200):
            self.advance(INTERVAL)
            for s in self.slots:
                p = s.process
                if p is None or not p.alive:
                    continue
                p.running = p.running - p.stopping
                p.stopping = frozenset()
                self.send_heartbeat(p, lose=False, delay_ack=False)
                if p.compute_pending and p.alive:
                    response = h.prepare(p.member_id, p.epoch)
                    if response.error_code == ErrorCode.NONE:
                        installed = h.install(
                            p.member_id,
                            self.targets(response, "balanced", 0),
                            group_epoch=response.group_epoch,
                            member_epoch=p.epoch,
                        )
                        assert installed.error_code == ErrorCode.NONE, installed
                    p.compute_pending = False
            self.check_all()
            if self.converged():
                break
        self.assert_converged()
        assert h.dump() == h.rebuilt(), "replaying every record does not rebuild the group"

    def live_processes(self) -> list[Process]:
        return [s.process for s in self.slots if s.process is not None and s.process.alive]

    def converged(self) -> bool:
        try:
            self.assert_converged()
        except AssertionError:
            return False
        return True

    def assert_converged(self) -> None:
        s = self.h.state
        assert s is not None
        live = {p.member_id: p for p in self.live_processes()}
        assert set(s.members) == set(live), (sorted(s.members), sorted(live))
        assert s.status() is GroupStatus.STABLE, s.status()
        assert s.group_epoch == s.assignment_epoch
        assigned = rs()
        for member_id, m in s.members.items():
            p = live[member_id]
            assert m.state is MemberState.STABLE, m
            assert m.member_epoch == s.assignment_epoch
            assert m.assigned == s.target.of(member_id).resources
            assert p.joined and p.epoch == m.member_epoch
            assert p.running == frozenset(m.assigned.names()), (p, m)
            assigned = assigned | m.assigned
        assert assigned == s.catalogue_resources()
        assert s.meta.holds == ()


CoreMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=80,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCoreProperties = CoreMachine.TestCase
