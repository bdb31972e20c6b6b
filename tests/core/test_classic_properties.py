"""A hypothesis state machine of 3-6 classic members (DESIGN 3.19, 3.11, 3.18): members join
(some never use the id they were handed), rejoin honestly or without releasing, sync, heartbeat,
leave or fall silent while the clock runs; the leader assigns honestly or not (resources twice,
held by others, outside the catalogue, to strangers); connectors are added. After every step:
the owner index never raised (replay checks it), held and pending sets and holds never overlap,
generations strictly increase across completions and a rebuild from the records gives the same
group, and fencing tokens never go down."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from connect_protocol.classic_messages import ConnectWorkerAssignment, JoinGroupResponse
from connect_protocol.resources import ResourceSet
from coordinator_svc.core.classic_model import ClassicState
from coordinator_svc.core.records import EventType

from .classic_harness import ClassicHarness, given, rs

NAMES = ("w0", "w1", "w2", "w3", "w4", "w5")


class ClassicMembers(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = ClassicHarness()
        self.names: tuple[str, ...] = ()
        self.tokens_seen: dict[Any, int] = {}
        self.last_token = 0
        self.connectors = 0

    @initialize(count=st.integers(3, 6))
    def setup(self, count: int) -> None:
        self.names = NAMES[:count]
        self.h.put_connector("A", 2)
        self.h.put_connector("B", 1)
        for name in self.names:  # the first generation: everyone in, the leader honest
            self.h.new_member(name)
        self.h.run_for(500, *self.names)
        for name in self.names[1:]:
            self.h.sync(name)
        self.h.sync(self.names[0], self.honest())
        assert self.h.classic_state is ClassicState.STABLE

    # --- members ---

    @rule(i=st.integers(0, 5), use_id=st.booleans())
    def join_new(self, i: int, use_id: bool) -> None:
        name = self.names[i % len(self.names)]
        h = self.h
        if h.has_member(name) or (h.state and h.state.round and name in h.state.round.pending_ids):
            return
        h.join("", new_id=name)
        if use_id:  # else the MEMBER_ID_REQUIRED answer was lost: the id lapses
            h.join(name)

    @rule(i=st.integers(0, 5), honest=st.booleans())
    def rejoin(self, i: int, honest: bool) -> None:
        name = self.names[i % len(self.names)]
        if not self.h.has_member(name):
            return
        member = self.h.member(name)
        # An honest worker has stopped what it was told to revoke; a slow one has not.
        allocation = member.assigned if honest else member.owned
        self.h.join(name, allocation=allocation)

    @rule(i=st.integers(0, 5))
    def follower_sync(self, i: int) -> None:
        name = self.names[i % len(self.names)]
        if self.h.has_member(name) and name != self.h.leader:
            self.h.sync(name, generation=self.h.member(name).member_epoch)

    @precondition(lambda self: self.h.state is not None and self.h.state.meta.classic is not None)
    @rule(data=st.data(), honest=st.booleans())
    def leader_syncs(self, data: st.DataObject, honest: bool) -> None:
        self.leader_sync(data, honest)

    def leader_sync(self, data: st.DataObject, honest: bool) -> None:
        h = self.h
        leader = h.leader
        if leader is None or not h.has_member(leader):
            return
        if h.classic_state is not ClassicState.COMPLETING_REBALANCE:
            h.sync(leader, generation=h.member(leader).member_epoch)
            return
        assignments = self.honest() if honest else self.buggy(data)
        h.sync(leader, assignments, generation=h.member(leader).member_epoch)

    def honest(self) -> dict[str, ConnectWorkerAssignment]:
        """What a faithful assignor may do: give the free resources it was shown round-robin,
        and revoke one resource from the member holding the most."""
        h = self.h
        answer = h.answers.get(("join", h.leader or ""))
        assert h.state is not None
        generation = [
            m for m in sorted(h.state.members) if h.member(m).member_epoch == h.generation
        ]
        if not isinstance(answer, JoinGroupResponse) or answer.generation_id != h.generation:
            return {}
        version = 0 if h.protocol == "default" else 2
        shown = rs()
        for c in answer.catalogue:
            shown = shown | rs(c.name, *(f"{c.name}-{t}" for t in range(c.task_count)))
        shown = shown - answer.withheld
        owned = rs()
        for m in h.state.members.values():
            owned = owned | m.owned
        free = sorted((shown - owned).names())
        out: dict[str, list[str]] = {m: [] for m in generation}
        for n, name in enumerate(free):
            out[generation[n % len(generation)]].append(name)
        busiest = max(generation, key=lambda m: len(h.member(m).assigned), default=None)
        revoke = rs()
        if version > 0 and busiest is not None and h.member(busiest).assigned:
            revoke = rs(sorted(h.member(busiest).assigned.names())[0])
        return {
            m: given(
                rs(*names),
                revoked=revoke if m == busiest and version > 0 else None,
                version=version,
            )
            for m, names in out.items()
        }

    def buggy(self, data: st.DataObject) -> dict[str, ConnectWorkerAssignment]:
        pool = ["A", "A-0", "A-1", "B", "B-0", "Z", "Z-0"]
        targets = [*self.names, "stranger"]
        out: dict[str, ConnectWorkerAssignment] = {}
        for _ in range(data.draw(st.integers(1, 3))):
            member = data.draw(st.sampled_from(targets))
            names = data.draw(st.lists(st.sampled_from(pool), max_size=3))
            version = 0 if self.h.protocol == "default" else 2
            out[member] = given(rs(*names), version=version)
        return out

    @rule(data=st.data(), honest=st.booleans(), releasing=st.booleans())
    def a_whole_rebalance(self, data: st.DataObject, honest: bool, releasing: bool) -> None:
        """Every member rejoins (releasing what it was told to, or not), the phase completes
        while they heartbeat, the followers sync, then the leader."""
        h = self.h
        if h.state is None or not h.state.members:
            return
        members = sorted(h.state.members)
        for name in members:
            if h.has_member(name):
                member = h.member(name)
                h.join(name, allocation=member.assigned if releasing else member.owned)
        for _ in range(10):
            if h.classic_state is not ClassicState.PREPARING_REBALANCE:
                break
            h.run_for(100, *members)
        if h.classic_state is not ClassicState.COMPLETING_REBALANCE:
            return
        for name in members:
            if h.has_member(name) and name != h.leader:
                h.sync(name, generation=h.member(name).member_epoch)
        self.leader_sync(data, honest)

    @rule(i=st.integers(0, 5))
    def heartbeat(self, i: int) -> None:
        name = self.names[i % len(self.names)]
        if self.h.has_member(name):
            self.h.hb(name, generation=self.h.member(name).member_epoch)

    @rule(i=st.integers(0, 5))
    def leave(self, i: int) -> None:
        name = self.names[i % len(self.names)]
        if self.h.state is not None:
            self.h.leave_group(name)

    @rule(ms=st.sampled_from([50, 200, 600, 1_100]), alive=st.sets(st.integers(0, 5)))
    def time_passes(self, ms: int, alive: set[int]) -> None:
        """Time passes; the members in `alive` heartbeat, the others are silent."""
        if self.h.state is None:
            return
        keep = [self.names[i % len(self.names)] for i in sorted(alive)]
        self.h.run_for(ms, *keep, step_ms=100)

    @rule()
    def add_connector(self) -> None:
        if self.connectors < 2:
            self.h.put_connector("CD"[self.connectors], 1)
            self.connectors += 1

    # --- invariants ---

    @invariant()
    def owned_sets_and_holds_never_overlap(self) -> None:
        state = self.h.state
        if state is None:
            return
        sets: list[tuple[str, ResourceSet]] = [
            (m.member_id, m.owned) for m in state.members.values()
        ]
        sets += [(f"hold:{h.member_id}", h.resources) for h in state.meta.holds]
        for i, (a, sa) in enumerate(sets):
            for b, sb in sets[i + 1 :]:
                assert sa.isdisjoint(sb), f"{a} and {b} both own {sorted((sa & sb).names())}"

    @invariant()
    def generations_strictly_increase_and_replay_agrees(self) -> None:
        completed = [
            e.payload["generation"] for e in self.h.logged_events(EventType.CLASSIC_JOIN_COMPLETED)
        ]
        assert completed == sorted(set(completed)), completed
        if completed:
            assert self.h.generation == completed[-1]
        assert self.h.rebuilt() == self.h.dump()

    @invariant()
    def tokens_never_go_down(self) -> None:
        state = self.h.state
        if state is None:
            return
        assert state.meta.last_fencing_token >= self.last_token
        self.last_token = state.meta.last_fencing_token
        for member in state.members.values():
            for resource, token in member.tokens.items():
                assert token <= self.last_token
                assert token >= self.tokens_seen.get(resource, 0), (resource, token)
                self.tokens_seen[resource] = token
            assert set(member.tokens) == set(member.assigned.connectors) | set(
                member.assigned.tasks
            )


ClassicMembers.TestCase.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
test_classic_members = ClassicMembers.TestCase
