"""Properties of the epoch-only moves (DESIGN 3.21): a hypothesis state machine of three honest
workers around one group whose assignor installs targets that keep every share, move one
resource, or rebalance, while workers' responses are lost, workers go silent, expire, rejoin and
fence themselves, and the catalogue changes.

- A member whose share is unchanged across any number of installs between two of its heartbeats
  is accepted (never fenced), and told the member epoch it was moved to.
- No member whose assignment changed, and none that was removed, is ever accepted with an old
  epoch: a heartbeat at an epoch other than the member's is accepted only by the lost-response
  rule (3.12), or when every epoch the member held from that one on carried its current
  assignment, STABLE with nothing pending (checked against a log of every member's states kept
  by the test, per incarnation, not against `stable_since_epoch`).
- The single-ownership properties still hold: no resource in two members' current-plus-pending
  sets or in a member's and a hold; no resource runs on two workers; everything a worker runs is
  its member's or held for it. And a group rebuilt from its records equals the live one.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import HeartbeatResponse
from connect_protocol.resources import ResourceSet
from coordinator_svc.core.model import GroupConfigDefaults, Member, MemberState
from tests.core.harness import SESSIONED, GroupHarness, rs

SESSION = 1_000
INTERVAL = 100
DEFAULTS = GroupConfigDefaults(
    session_timeout_ms=SESSION,
    heartbeat_interval_ms=INTERVAL,
    rebalance_timeout_ms=400,
    scheduled_rebalance_max_delay_ms=1_500,
    assignment_error_backoff_ms=50,
)
MEMBERS = ("w0", "w1", "w2")
ACCEPTED = (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT)

Names = frozenset[str]
#: A member as the log keeps it: epoch, assigned, pending, state.
Snapshot = tuple[int, Names, Names, MemberState]


@dataclass
class Worker:
    """An honest agent: runs exactly its last assignment (revoked work stops at once)."""

    member_id: str
    joined: bool = False
    silent: bool = False
    epoch: int = 0
    running: Names = frozenset()
    last_success_ms: int | None = None
    #: Its member was STABLE with nothing pending, running exactly this, at the epoch it holds,
    #: and nothing but epoch moves happened to the member since.
    clean: bool = False

    def fence_deadline(self) -> int | None:
        if not self.joined or self.last_success_ms is None:
            return None
        return self.last_success_ms + SESSION - INTERVAL

    def stop_all(self) -> None:
        self.joined = False
        self.running = frozenset()
        self.clean = False


def _snapshot(m: Member) -> Snapshot:
    return (m.member_epoch, frozenset(m.assigned.names()), frozenset(m.pending_revocation.names()),
            m.state)  # fmt: skip


class EpochMoveMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = GroupHarness(defaults=DEFAULTS)
        self.workers = {m: Worker(m) for m in MEMBERS}
        #: Per member id, the states of its current incarnation, in order (a new list on rejoin
        #: after a removal).
        self.history: dict[str, list[Snapshot]] = {}

    # --- bookkeeping ---

    def observe(self) -> None:
        """Log each member's state if it changed; drop what a removal ended; a worker's `clean`
        ends when its member's assignment, pending set or state changes."""
        s = self.h.state
        assert s is not None
        for member_id in list(self.history):
            if member_id not in s.members:
                del self.history[member_id]
                self.workers[member_id].clean = False
        for member_id, m in s.members.items():
            log = self.history.setdefault(member_id, [])
            snap = _snapshot(m)
            if not log or log[-1] != snap:
                if log and log[-1][1:] != snap[1:]:
                    self.workers[member_id].clean = False
                log.append(snap)

    def heartbeat_of(self, w: Worker, lose: bool, with_owned: bool) -> None:
        h = self.h
        if not w.joined:
            response = h.join(w.member_id, assignors=SESSIONED, owned=rs())
        else:
            before = h.member(w.member_id) if h.has_member(w.member_id) else None
            owned = rs(*w.running) if with_owned else None
            was_clean = w.clean
            response = h.heartbeat(w.member_id, w.epoch, owned=owned)
            if was_clean:
                if before is not None and before.member_epoch > w.epoch:
                    event("a worker moved since its last heartbeat heartbeats")
                # Property 1: unchanged across any number of installs: accepted, and told the
                # epoch it was moved to.
                assert before is not None
                assert response.error_code in ACCEPTED, (response, before, w)
                assert response.member_epoch >= before.member_epoch, (response, before)
            if response.error_code in ACCEPTED and before is not None:
                self.check_old_epoch_accepted(w, before, owned)
        self.observe()
        if not lose:  # a lost answer: the worker learns nothing and runs on (a hold covers it)
            self.receive(w, response)

    def check_old_epoch_accepted(
        self, w: Worker, before: Member, owned: ResourceSet | None
    ) -> None:
        """Property 2: an epoch other than the member's is accepted only by the lost-response
        rule or when every epoch it held from that one on carried its current assignment."""
        e = w.epoch
        if e == before.member_epoch:
            return
        if e == before.previous_epoch and owned is not None and owned <= before.assigned:
            return
        event("a heartbeat at an older epoch accepted by the move rule")
        current = _snapshot(before)
        assert current[3] is MemberState.STABLE and not current[2], (w, before)
        log = self.history[w.member_id]
        held = [snap for snap in log if snap[0] >= e]
        assert any(snap[0] == e for snap in held), (e, log)
        last_at_e = max(i for i, snap in enumerate(log) if snap[0] == e)
        for snap in log[last_at_e:]:
            assert snap[1:] == current[1:], (f"accepted at {e}, but its state changed since", log)

    def receive(self, w: Worker, response: HeartbeatResponse) -> None:
        if response.error_code in ACCEPTED:
            w.joined = True
            w.epoch = response.member_epoch
            w.last_success_ms = self.h.now_ms
            if response.assignment is not None:
                w.running = frozenset(response.assignment.resources.names())
            m = self.h.member(w.member_id)
            w.clean = (
                m.state is MemberState.STABLE
                and not m.pending_revocation
                and m.member_epoch == w.epoch
                and frozenset(m.assigned.names()) == w.running
            )
        else:
            assert response.error_code in (
                ErrorCode.FENCED_MEMBER_EPOCH,
                ErrorCode.UNKNOWN_MEMBER_ID,
            ), response
            w.stop_all()

    # --- invariants ---

    @invariant()
    def single_ownership(self) -> None:
        s = self.h.state
        if s is None:
            return
        owners: dict[str, str] = {}
        for member_id, m in s.members.items():
            assert m.member_epoch <= s.assignment_epoch <= s.group_epoch
            for name in m.owned.names():
                assert name not in owners, f"{name} owned by {owners[name]} and {member_id}"
                owners[name] = member_id
        held: dict[str, str] = {}
        for hold in s.meta.holds:
            for name in hold.resources.names():
                assert name not in owners, f"{name} held and owned by {owners[name]}"
                held[name] = hold.member_id
        running: dict[str, str] = {}
        for w in self.workers.values():
            for name in w.running:
                assert name not in running, f"{name} runs on {running[name]} and {w.member_id}"
                running[name] = w.member_id
                assert w.member_id in (owners.get(name), held.get(name)), (name, w)

    # --- rules ---

    @initialize(tasks=st.tuples(st.integers(0, 3), st.integers(0, 2)))
    def setup(self, tasks: tuple[int, int]) -> None:
        self.h.put_connector("C0", tasks[0])
        self.h.put_connector("C1", tasks[1])
        for w in self.workers.values():
            self.heartbeat_of(w, lose=False, with_owned=True)

    @rule(
        worker=st.sampled_from(MEMBERS),
        lose=st.integers(0, 3).map(lambda x: x == 0),
        with_owned=st.booleans(),
    )
    def heartbeat(self, worker: str, lose: bool, with_owned: bool) -> None:
        w = self.workers[worker]
        if not w.silent:
            self.heartbeat_of(w, lose, with_owned)

    @rule(mode=st.sampled_from(["keep", "keep", "move_one", "rebalance"]), pick=st.integers(0, 9))
    def install(self, mode: str, pick: int) -> None:
        """The assignor computes (when a computation is due) and installs a target that keeps
        every share (what is new stays unassigned behind a delay), moves one resource, or
        spreads everything evenly."""
        h, s = self.h, self.h.state
        if s is None or s.group_epoch == s.assignment_epoch or s.meta.assignor_member_id is None:
            return
        assignor = s.meta.assignor_member_id
        prepared = h.prepare(assignor)
        if prepared.error_code != ErrorCode.NONE:
            return
        members = sorted(m.member_id for m in prepared.members)
        catalogue = sorted(
            [c.name for c in prepared.catalogue]
            + [f"{c.name}-{i}" for c in prepared.catalogue for i in range(c.task_count)]
        )
        current = {m: frozenset(s.target.of(m).resources.names()) & set(catalogue) for m in members}
        shares = {m: set(current[m]) for m in members}
        delay = 0
        if mode == "rebalance":
            shares = {m: set(catalogue[i :: len(members)]) for i, m in enumerate(members)}
        else:
            if mode == "move_one" and catalogue:
                name = catalogue[pick % len(catalogue)]
                for share in shares.values():
                    share.discard(name)
                shares[members[pick % len(members)]].add(name)
            if set().union(*shares.values()) != set(catalogue):
                delay = 500  # new resources stay unassigned for now: no share changes
        response = h.install(
            assignor, {m: rs(*names) for m, names in shares.items()}, delay_ms=delay
        )
        assert response.error_code == ErrorCode.NONE, response
        self.observe()

    @rule(name=st.sampled_from(["C0", "C1", "C2"]), tasks=st.integers(-1, 2))
    def catalogue(self, name: str, tasks: int) -> None:
        s = self.h.state
        if tasks >= 0:
            self.h.put_connector(name, tasks)
        elif s is not None and name in s.catalogue:
            self.h.delete_connector(name)
        self.observe()

    @rule(worker=st.sampled_from(MEMBERS), silent=st.booleans())
    def go_silent(self, worker: str, silent: bool) -> None:
        self.workers[worker].silent = silent

    @rule(ms=st.sampled_from([INTERVAL // 2, INTERVAL, 3 * INTERVAL, SESSION]))
    def advance_clock(self, ms: int) -> None:
        """Time passes: workers fence themselves when due, before timers due then."""
        h = self.h
        end = h.now_ms + ms
        while True:
            deadlines = [d for w in self.workers.values() if (d := w.fence_deadline()) is not None]
            timer = h.next_deadline()
            t = max(h.now_ms, min([end, *deadlines, *([timer] if timer is not None else [])]))
            for w in self.workers.values():
                d = w.fence_deadline()
                if d is not None and d <= t:
                    w.stop_all()
            h.sleep(t - h.now_ms)
            self.observe()
            if t >= end:
                return

    def teardown(self) -> None:
        if self.h.state is not None:
            assert self.h.dump() == self.h.rebuilt(), "replaying the records differs"


EpochMoveMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestEpochMoveProperties = EpochMoveMachine.TestCase
