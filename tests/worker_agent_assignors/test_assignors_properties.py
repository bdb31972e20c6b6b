"""Property tests of both assignors (hypothesis): every output installs, nothing is assigned twice,
every catalogue resource is assigned or declared held, balance within one once no delay runs and
nothing taken from anyone while one does (issue 13 has its own history tests), minimal movement,
order-independence and idempotence; and a state machine of joins, departures, returns, catalogue
changes and time across many rounds."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from tests.worker_agent_assignors.test_assignors_support import (
    Sim,
    assert_installable,
    assigned,
    view,
)
from worker_agent.assignor import AssignmentResult, GroupView, MemberView
from worker_agent.assignors import (
    DEFAULT_MAX_DELAY_MS,
    EagerAssignor,
    IncrementalCooperativeAssignor,
)
from worker_agent.assignors.state import AssignorState, HeldShare, decode_state, encode_state

IC = IncrementalCooperativeAssignor()
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

CONNECTORS = ["A", "B", "C", "D", "E"]
MEMBERS = ["w0", "w1", "w2", "w3", "w4", "w5"]
DEPARTED = ["gone1", "gone2", "gone3"]
INSTANCES = ["i0", "i1", "i2", "i3"]


def resources_of(catalogue: dict[str, int]) -> list[str | TaskId]:
    out: list[str | TaskId] = []
    for name in sorted(catalogue):
        out.append(name)
        out.extend(TaskId(name, t) for t in range(catalogue[name]))
    return out


def as_set(items: Iterable[str | TaskId]) -> ResourceSet:
    items = list(items)
    return ResourceSet(
        frozenset(i for i in items if isinstance(i, str)),
        frozenset(i for i in items if isinstance(i, TaskId)),
    )


@st.composite
def resource_subsets(draw: st.DrawFn, universe: list[str | TaskId]) -> ResourceSet:
    if not universe:
        return EMPTY
    return as_set(draw(st.lists(st.sampled_from(universe), max_size=len(universe))))


@st.composite
def states(draw: st.DrawFn, universe: list[str | TaskId], present: list[str]) -> bytes:
    kind = draw(st.sampled_from(["none", "garbage", "state"]))
    if kind == "none":
        return b""
    if kind == "garbage":
        return draw(st.binary(max_size=24))
    holders = draw(st.lists(st.sampled_from(DEPARTED + present), unique=True, max_size=3))
    held = tuple(
        HeldShare(
            h,
            draw(st.none() | st.sampled_from(INSTANCES)),
            draw(resource_subsets(universe)),
        )
        for h in holders
    )
    deadline = draw(st.none() | st.integers(0, 20_000))
    instances = draw(
        st.dictionaries(st.sampled_from(DEPARTED + present), st.sampled_from(INSTANCES))
    )
    return encode_state(AssignorState(deadline, held, instances))


@st.composite
def groups(draw: st.DrawFn) -> GroupView:
    """Any group an assignor might be shown, including inconsistent leftovers."""
    catalogue = draw(st.dictionaries(st.sampled_from(CONNECTORS), st.integers(0, 4), max_size=5))
    previous = {**catalogue, **draw(st.dictionaries(st.just("Z"), st.integers(0, 2)))}
    universe = resources_of(previous)
    present = draw(st.lists(st.sampled_from(MEMBERS), min_size=1, max_size=5, unique=True))
    instance_ids = draw(st.permutations(INSTANCES + [None] * 5))
    members = [
        MemberView(m, instance_id=instance_ids[i], owned=draw(resource_subsets(universe)))
        for i, m in enumerate(present)
    ]
    n = len(universe)
    owners = draw(st.lists(st.sampled_from([*present, *DEPARTED, None]), min_size=n, max_size=n))
    target: dict[str, ResourceSet] = {m: EMPTY for m in present + DEPARTED if draw(st.booleans())}
    for resource, owner in zip(universe, owners, strict=True):
        if owner is not None:
            target[owner] = target.get(owner, EMPTY) | as_set([resource])
    max_delay = draw(st.sampled_from([None, 0, 1_000, 5_000]))
    return view(
        catalogue,
        members,
        target=target,
        state=draw(states(universe, present)),
        now_ms=draw(st.integers(0, 20_000)),
        max_delay_ms=max_delay,
    )


def max_delay_of(group: GroupView) -> int:
    return group.config_int("scheduled.rebalance.max.delay.ms", DEFAULT_MAX_DELAY_MS)


def within_one(counts: Iterable[int]) -> bool:
    counts = list(counts)
    return not counts or max(counts) - min(counts) <= 1


def sticky_starts(group: GroupView) -> dict[str, ResourceSet]:
    """What each present member starts from: its previous target share, or what it owns if it
    has none; within the catalogue, each resource once (target shares first, then by id)."""
    catalogue, taken = group.all_resources(), EMPTY
    present = {m.member_id: m for m in group.members}
    in_target = sorted(m for m in present if m in group.target)
    others = sorted(m for m in present if m not in group.target)
    out: dict[str, ResourceSet] = {}
    for member in in_target + others:
        start = group.target[member] if member in group.target else present[member].owned
        out[member] = (start & catalogue) - taken
        taken = taken | out[member]
    return out


def assert_accounted_and_balanced(group: GroupView, result: AssignmentResult) -> None:
    """Installable; every catalogue resource assigned once or declared held; the delay declared
    exactly when something is held; balance within one, per kind, over what is assigned, once
    no delay runs; while one runs, every member keeps what it starts from (DESIGN 3.18: nothing
    that runs is moved)."""
    assert_installable(group, result)
    assert set(result.members) == {m.member_id for m in group.members}
    state = decode_state(result.assignor_state)
    held = state.held_resources()
    catalogue = group.all_resources()
    total = sum(len(share) for share in result.members.values())
    assert total == len(assigned(result)), "a resource is assigned twice"
    assert held <= catalogue
    assert held.isdisjoint(assigned(result))
    assert assigned(result) | held == catalogue
    assert (result.scheduled_rebalance_delay_ms > 0) == bool(held)
    if held:
        assert state.deadline_ms == group.coordinator_time_ms + result.scheduled_rebalance_delay_ms
        assert result.scheduled_rebalance_delay_ms <= max_delay_of(group)
        for member, start in sticky_starts(group).items():
            assert start <= result.members[member], f"{member} lost work during a delay"
        return
    assert state.deadline_ms is None
    assert within_one(len(share.connectors) for share in result.members.values())
    assert within_one(len(share.tasks) for share in result.members.values())


def shuffled(group: GroupView, rng: random.Random) -> GroupView:
    members = list(group.members)
    rng.shuffle(members)
    names = list(group.catalogue)
    rng.shuffle(names)
    target = list(group.target.items())
    rng.shuffle(target)
    return replace(
        group,
        members=tuple(members),
        catalogue={n: group.catalogue[n] for n in names},
        target=dict(target),
    )


# --- incremental cooperative ------------------------------------------------------------------


@FAST
@given(groups())
def test_every_result_installs_and_accounts_for_every_resource(group: GroupView) -> None:
    assert_accounted_and_balanced(group, IC.assign(group))


@FAST
@given(groups(), st.randoms(use_true_random=False))
def test_shuffled_inputs_give_the_same_result(group: GroupView, rng: random.Random) -> None:
    assert IC.assign(shuffled(group, rng)) == IC.assign(group)


@FAST
@given(groups())
def test_a_second_round_on_its_own_output_changes_nothing(group: GroupView) -> None:
    first = IC.assign(group)
    again = replace(
        group,
        members=tuple(replace(m, owned=first.members[m.member_id]) for m in group.members),
        target=first.members,
        assignor_state=first.assignor_state,
        group_epoch=group.group_epoch + 1,
    )

    assert IC.assign(again) == first


def movement_lower_bound(counts: list[int], total: int) -> int:
    """The fewest resources that must leave their members for every count to be the floor or the
    ceiling of total / members: surplus above the ceiling, plus one for each member above the
    floor that cannot have one of the ceilings."""
    floor, ceilings = divmod(total, len(counts))
    above = [c for c in counts if c > floor]
    return sum(c - floor - 1 for c in above) + max(0, len(above) - ceilings)


@st.composite
def sticky_groups(draw: st.DrawFn) -> GroupView:
    """Present members with disjoint target shares, some deleted and some new resources; no
    departures and no state."""
    catalogue = draw(st.dictionaries(st.sampled_from(CONNECTORS), st.integers(0, 6), max_size=5))
    universe = resources_of({**catalogue, "Z": 2})
    present = draw(st.lists(st.sampled_from(MEMBERS), min_size=1, max_size=6, unique=True))
    target = {m: EMPTY for m in present}
    for resource in universe:
        owner = draw(st.sampled_from([*present, None]))
        if owner is not None:
            target[owner] = target[owner] | as_set([resource])
    members = [MemberView(m, owned=draw(resource_subsets(universe))) for m in present]
    return view(catalogue, members, target=target)


@FAST
@given(sticky_groups())
def test_only_what_balance_requires_moves(group: GroupView) -> None:
    result = IC.assign(group)
    catalogue = group.all_resources()
    assert_accounted_and_balanced(group, result)
    for kind in ("connectors", "tasks"):
        start = {m: getattr(group.target[m] & catalogue, kind) for m in group.target}
        end = {m: getattr(result.members[m], kind) for m in start}
        moved = sum(len(start[m] - end[m]) for m in start)
        total = len(getattr(catalogue, kind))
        assert moved == movement_lower_bound([len(s) for s in start.values()], total), kind


@FAST
@given(sticky_groups())
def test_a_balanced_start_moves_nothing(group: GroupView) -> None:
    balanced = IC.assign(group)
    members = tuple(replace(m, owned=EMPTY) for m in group.members)

    assert IC.assign(replace(group, members=members, target=balanced.members)) == balanced


# --- eager --------------------------------------------------------------------------------------


@FAST
@given(groups(), st.randoms(use_true_random=False))
def test_eager_installs_balanced_and_ignores_input_order(
    group: GroupView, rng: random.Random
) -> None:
    result = EagerAssignor().assign(group)

    assert_installable(group, result)
    assert assigned(result) == group.all_resources()
    assert set(result.members) == {m.member_id for m in group.members}
    assert within_one(len(s.connectors) for s in result.members.values())
    assert within_one(len(s.tasks) for s in result.members.values())
    assert within_one(len(s) for s in result.members.values())
    assert EagerAssignor().assign(shuffled(group, rng)) == result


# --- many rounds --------------------------------------------------------------------------------


class Rounds(RuleBasedStateMachine):
    """Workers join, leave, come back (by member id or instance id), the catalogue changes and
    the clock moves; after each change one round runs, as the coordinator would ask."""

    def __init__(self) -> None:
        super().__init__()
        self.sim = Sim(IC, {"A": 2, "B": 1}, max_delay_ms=1_000)
        self.departed: dict[str, str | None] = {}
        self.serial = 0
        self.result: AssignmentResult | None = None
        self.join(None)

    def new_id(self) -> str:
        self.serial += 1
        return f"m{self.serial}"

    def round(self) -> None:
        before = decode_state(self.sim.state)
        now = self.sim.now_ms
        self.result = self.sim.round()
        assert self.sim.last_view is not None
        assert_accounted_and_balanced(self.sim.last_view, self.result)
        after = decode_state(self.sim.state)
        still_held = before.held_resources() & after.held_resources()
        if before.deadline_ms is not None and now < before.deadline_ms and still_held:
            assert after.deadline_ms == before.deadline_ms, "a delay never restarts"

    @rule(instance=st.none() | st.sampled_from(INSTANCES))
    def join(self, instance: str | None) -> None:
        taken = {m.instance_id for m in self.sim.members.values()}
        self.sim.join(self.new_id(), None if instance in taken else instance)
        self.round()

    @precondition(lambda self: len(self.sim.members) > 1)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        member = data.draw(st.sampled_from(sorted(self.sim.members)))
        self.departed[member] = self.sim.members[member].instance_id
        self.sim.leave(member)
        self.round()

    @precondition(lambda self: bool(self.departed))
    @rule(data=st.data(), by_instance=st.booleans())
    def come_back(self, data: st.DataObject, by_instance: bool) -> None:
        member = data.draw(st.sampled_from(sorted(self.departed)))
        instance = self.departed.pop(member)
        if instance in {m.instance_id for m in self.sim.members.values()}:
            instance = None  # a newcomer took it meanwhile (and with it any held share)
        share = {s.member_id: s.resources for s in decode_state(self.sim.state).held}.get(
            member, EMPTY
        )
        receiver = self.new_id() if by_instance and instance is not None else member
        self.sim.join(receiver, instance)
        self.round()
        assert self.result is not None and self.sim.last_view is not None
        # It gets its own work back: all of it while a delay still runs (DESIGN 3.18), else all
        # of it unless that is more than balance allows now (the catalogue may have changed
        # during the delay).
        catalogue, got = self.sim.last_view.all_resources(), self.result.members[receiver]
        if self.result.scheduled_rebalance_delay_ms > 0:
            assert share & catalogue <= got
        floor_connectors = len(catalogue.connectors) // len(self.sim.members)
        floor_tasks = len(catalogue.tasks) // len(self.sim.members)
        if len(share.connectors) <= floor_connectors:
            assert share.connectors <= got.connectors
        if len(share.tasks) <= floor_tasks:
            assert share.tasks <= got.tasks

    @rule(connector=st.sampled_from(CONNECTORS), tasks=st.integers(0, 5))
    def put_connector(self, connector: str, tasks: int) -> None:
        self.sim.catalogue[connector] = tasks
        self.round()

    @precondition(lambda self: bool(self.sim.catalogue))
    @rule(data=st.data())
    def delete_connector(self, data: st.DataObject) -> None:
        del self.sim.catalogue[data.draw(st.sampled_from(sorted(self.sim.catalogue)))]
        self.round()

    @rule(ms=st.integers(1, 1_500))
    def time_passes(self, ms: int) -> None:
        self.sim.now_ms += ms
        self.round()

    @invariant()
    def delays_are_declared(self) -> None:
        if self.result is not None:
            held = decode_state(self.sim.state).held_resources()
            assert bool(held) == (self.result.scheduled_rebalance_delay_ms > 0)


Rounds.TestCase.settings = settings(
    max_examples=60, stateful_step_count=20, deadline=None, suppress_health_check=list(HealthCheck)
)
test_many_rounds = Rounds.TestCase
