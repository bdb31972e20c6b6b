"""Identity binding as a property (issue 23): whatever heartbeats two principals send, from any
member id with any instance id, at any epoch, with timers firing in between, no principal ever
gets an instance id (or a member id) that a live member or a hold of another principal binds at
that moment (DESIGN 3.13, 3.14). The core's main state machine (`test_core_properties`) plays
one principal; this one plays two and keeps to the ids."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import HeartbeatRequest
from connect_protocol.resources import EMPTY
from coordinator_svc.core.heartbeat import heartbeat
from coordinator_svc.core.model import GroupState, Member
from coordinator_svc.core.records import EventRecord, EventType
from tests.core.harness import REBALANCE_MS, SESSION_MS, SESSIONED, GroupHarness, rs

PRINCIPALS = ("User:alice", "User:bob")
MEMBER_IDS = ("m0", "m1", "m2")
INSTANCE_IDS = ("pod-0", "pod-1")

REMOVED_WITH_A_HOLD = (EventType.MEMBER_FENCED, EventType.REVOCATION_TIMED_OUT)

principals = st.sampled_from(PRINCIPALS)
member_ids = st.sampled_from(MEMBER_IDS)
instance_ids = st.sampled_from((None, *INSTANCE_IDS))


def binders(
    state: GroupState | None, held_instances: dict[str, str]
) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Who binds each instance id and each member id: the principal of the live member that
    has it, and of every hold that keeps it (`held_instances`: the instance id the member had
    when it was removed with the hold, as the test saw it)."""
    instances: dict[str, set[str]] = {}
    members: dict[str, set[str]] = {}
    if state is None:
        return instances, members
    for member in state.members.values():
        members.setdefault(member.member_id, set()).add(member.principal)
        if member.instance_id is not None:
            instances.setdefault(member.instance_id, set()).add(member.principal)
    for hold in state.meta.holds:
        members.setdefault(hold.member_id, set()).add(hold.principal)
        instance_id = held_instances.get(hold.member_id)
        if instance_id is not None:
            instances.setdefault(instance_id, set()).add(hold.principal)
    return instances, members


class BindingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = GroupHarness()
        self.held_instances: dict[str, str] = {}  # member id of a hold -> its instance id

    def track_holds(self, before: dict[str, Member]) -> None:
        """After a call: a member removed with a hold on its work (fenced, revocation timed
        out) binds the instance id it had until that hold ends."""
        state = self.h.state
        holds = set() if state is None else {h.member_id for h in state.meta.holds}
        for record in self.h.records_of_last_call:
            if isinstance(record, EventRecord) and record.event_type in REMOVED_WITH_A_HOLD:
                member = before.get(record.member_id or "")
                if member is not None and member.instance_id and member.member_id in holds:
                    self.held_instances[member.member_id] = member.instance_id
        for member_id in set(self.held_instances) - holds:
            del self.held_instances[member_id]

    def members_now(self) -> dict[str, Member]:
        return {} if self.h.state is None else dict(self.h.state.members)

    @initialize()
    def catalogue(self) -> None:
        self.h.put_connector("A", 2)
        self.h.put_connector("B", 1)

    def send(self, principal: str, req: HeartbeatRequest) -> ErrorCode:
        """One heartbeat as `principal`; record every id it gained against who bound it."""
        h = self.h
        instances_before, members_before = binders(h.state, self.held_instances)
        before = self.members_now()
        had = {m: x.instance_id for m, x in before.items()}
        response = h._run(lambda s: heartbeat(s, req, h.now_ms, h.defaults, principal=principal))
        self.track_holds(before)
        assert h.state is not None
        for member in h.state.members.values():
            if member.principal != principal:
                continue
            gained_member = member.member_id not in had
            gained_instance = member.instance_id is not None and (
                gained_member or had[member.member_id] != member.instance_id
            )
            if gained_member:
                others = members_before.get(member.member_id, set()) - {principal, ""}
                assert not others, f"{principal} took member id {member.member_id} of {others}"
            if gained_instance:
                assert member.instance_id is not None
                others = instances_before.get(member.instance_id, set()) - {principal, ""}
                assert not others, f"{principal} took instance id {member.instance_id} of {others}"
        return ErrorCode(response.error_code)

    @rule(principal=principals, member_id=member_ids, instance_id=instance_ids)
    def join(self, principal: str, member_id: str, instance_id: str | None) -> None:
        self.send(
            principal,
            HeartbeatRequest(
                self.h.group_id,
                member_id,
                0,
                instance_id=instance_id,
                rebalance_timeout_ms=REBALANCE_MS,
                client_assignors=SESSIONED,
                owned=EMPTY,
            ),
        )

    @rule(
        principal=principals,
        member_id=member_ids,
        instance_id=instance_ids,
        stale=st.booleans(),
    )
    def heartbeat(
        self, principal: str, member_id: str, instance_id: str | None, stale: bool
    ) -> None:
        """A steady heartbeat (possibly naming another instance id), or one at a wrong epoch,
        which fences the member and holds its work."""
        state = self.h.state
        member = None if state is None else state.members.get(member_id)
        epoch = 1 if member is None else member.member_epoch
        self.send(
            principal,
            HeartbeatRequest(
                self.h.group_id,
                member_id,
                epoch + 7 if stale else epoch,
                instance_id=instance_id,
                owned=None if member is None else member.assigned,
            ),
        )

    @rule(which=st.integers(0, len(MEMBER_IDS) - 1))
    def fenced_by_its_own_mistake(self, which: int) -> None:
        """A member's own principal sends a wrong epoch, after the group computed and ran its
        shares: removed, its work held."""
        self.compute_and_run()
        live = sorted(self.members_now().values(), key=lambda m: m.member_id)
        if live:
            member = live[which % len(live)]
            stale = HeartbeatRequest(
                self.h.group_id, member.member_id, member.member_epoch + 7, owned=member.assigned
            )
            self.send(member.principal, stale)

    @rule(principal=principals, member_id=member_ids, instance_id=instance_ids)
    def leave(self, principal: str, member_id: str, instance_id: str | None) -> None:
        epoch = -1 if instance_id is None else -2
        self.send(
            principal, HeartbeatRequest(self.h.group_id, member_id, epoch, instance_id=instance_id)
        )

    @rule()
    def compute_and_run(self) -> None:
        """The assignor member (if asked) deals the catalogue round-robin, and every member
        runs what it is told: so that members hold work, and fencing them leaves holds."""
        h = self.h
        state = h.state
        if state is None or state.meta.assignor_member_id is None:
            return
        if state.group_epoch > state.assignment_epoch:
            assignor = state.meta.assignor_member_id
            live = sorted(m for m, x in state.members.items() if x.state.value != "LEFT")
            if assignor not in live:
                return
            prepared = h.prepare(assignor)
            if prepared.error_code != ErrorCode.NONE:
                return
            items = ["A", "A-0", "A-1", "B", "B-0"]
            members = sorted(p.member_id for p in prepared.members)
            targets = {m: rs(*items[i :: len(members)]) for i, m in enumerate(members)}
            h.install(assignor, targets)
        for member_id in sorted(h.state.members if h.state else ()):
            member = h.member(member_id)
            if member.state.value != "LEFT":
                self.send(
                    member.principal,
                    HeartbeatRequest(
                        h.group_id, member_id, member.member_epoch, owned=member.assigned
                    ),
                )

    @rule(ms=st.sampled_from((100, SESSION_MS // 2, SESSION_MS)))
    def time_passes(self, ms: int) -> None:
        before = self.members_now()
        self.h.sleep(ms)
        self.track_holds(before)

    @invariant()
    def a_live_instance_id_has_one_member(self) -> None:
        state = self.h.state
        if state is not None:
            ids = [m.instance_id for m in state.members.values() if m.instance_id is not None]
            assert len(ids) == len(set(ids)), ids


TestBinding = BindingMachine.TestCase
TestBinding.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
