"""Issue 13, item 1: while a scheduled-rebalance delay runs, nothing that runs is moved.

DESIGN 3.18 (and Kafka Connect's IncrementalCooperativeAssignor: no load-balancing revocations
while a delay is active). During a delay, which only runs while no newcomer has arrived (a
newcomer ends it, 3.8): new resources are placed at once on the least loaded members, deleted
ones leave holes, a returning worker gets its own held work back, and every member keeps the
whole of its previous target share that is still in the catalogue. Balance (the floor or the
ceiling of each kind for every member) is restored when the delay ends or a newcomer ends it,
exactly as before the change.

Two drivers over the same event model (workers leave and return, by member id or instance id;
newcomers join; connectors are added, resized and deleted; the clock and the configured delay
move), one round after each event with every member converged onto its target:

- a hypothesis test over thousands of histories (derandomized, so CI runs the same ones), which
  checks every round against the rules above;
- a counting test on seeded `random` histories, which counts the running resources moved in
  rounds that declare a delay, for the assignor before the change (the frozen copy of the code
  before the linear-time rewrite, which the differential test kept identical to it) and after:
  it must find the issue's moves before, and none after.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connect_protocol.resources import EMPTY, ResourceSet, union
from tests.support import frozen_assignors_v1 as frozen_v1
from tests.worker_agent_assignors.test_assignors_support import Sim, assert_installable, rs, view
from worker_agent.assignor import AssignmentResult, ConnectAssignor, GroupView
from worker_agent.assignors import IncrementalCooperativeAssignor
from worker_agent.assignors.balance import balance_sorted, place_sorted
from worker_agent.assignors.state import AssignorState, HeldShare, decode_state, encode_state

IC = IncrementalCooperativeAssignor()
BEFORE_FIX = frozen_v1.IncrementalCooperativeAssignor()

CONNECTORS = [f"c{i}" for i in range(8)]
#: Event kinds, repeated for weight: departures and returns are the point, newcomers rarer.
KINDS = (
    ["leave"] * 6 + ["return"] * 6 + ["join"] * 2 + ["put"] * 4 + ["delete"] * 2 + ["time"] * 4
) + ["config"]
STEPS_MS = [1, 100, 1_000, 3_000, 4_000, 12_000]
DELAYS_MS = [10_000, 10_000, 1_000, 0]
MAX_DELAY_MS = 10_000

HISTORIES = 2_000  # hypothesis examples
COUNTED_HISTORIES = 800  # seeded histories for the before/after count
COUNTED_EVENTS = 30


@dataclass(frozen=True)
class Event:
    """One change to the group. `a` and `b` pick among what exists when it applies (modulo the
    choices), so any sequence of events is a valid history."""

    kind: str
    a: int = 0
    b: int = 0
    flag: bool = False


@dataclass(frozen=True)
class Round:
    """What one round saw and returned."""

    view: GroupView
    result: AssignmentResult
    before: Mapping[str, ResourceSet]  # the previous target: what runs
    previous: AssignorState  # the previous state blob, decoded


class History:
    """A group driven by events; after each one the assignor computes a round, its result
    becomes the target and every member converges onto it (as `Sim` does)."""

    def __init__(
        self,
        assignor: ConnectAssignor,
        catalogue: Mapping[str, int],
        workers: Iterable[bool],
        *,
        validate: bool = True,
    ) -> None:
        self.sim = Sim(assignor, dict(catalogue), max_delay_ms=MAX_DELAY_MS, now_ms=50_000)
        self.validate = validate
        self.serial = 0
        self.departed: dict[str, str | None] = {}
        for with_instance in workers:
            self.add(with_instance)
        self.round()

    def add(self, with_instance: bool) -> None:
        self.serial += 1
        member = f"w{self.serial:02d}"
        self.sim.join(member, f"i{self.serial:02d}" if with_instance else None)

    def apply(self, event: Event) -> None:
        sim = self.sim
        if event.kind == "leave" and len(sim.members) > 1:
            member = sorted(sim.members)[event.a % len(sim.members)]
            self.departed[member] = sim.members[member].instance_id
            sim.leave(member)
        elif event.kind == "return" and self.departed:
            member = sorted(self.departed)[event.a % len(self.departed)]
            instance = self.departed.pop(member)
            if instance in {m.instance_id for m in sim.members.values()}:
                instance = None  # a newcomer took it meanwhile
            if event.flag and instance is not None:  # a restart: new member id, same instance
                self.serial += 1
                sim.join(f"w{self.serial:02d}", instance)
            else:
                sim.join(member, instance)
        elif event.kind == "join":
            self.add(event.flag)
        elif event.kind == "put":
            sim.catalogue[CONNECTORS[event.a % len(CONNECTORS)]] = event.b % 9
        elif event.kind == "delete" and sim.catalogue:
            del sim.catalogue[sorted(sim.catalogue)[event.a % len(sim.catalogue)]]
        elif event.kind == "time":
            sim.now_ms += STEPS_MS[event.a % len(STEPS_MS)]
        elif event.kind == "config":
            sim.max_delay_ms = DELAYS_MS[event.a % len(DELAYS_MS)]

    def round(self) -> Round:
        sim = self.sim
        before, previous = dict(sim.target), decode_state(sim.state)
        sim.group_epoch += 1
        group = sim.view()
        result = sim.assignor.assign(group)
        if self.validate:
            assert_installable(group, result)
        sim.target = {m: r for m, r in result.members.items() if m in sim.members}
        sim.state = result.assignor_state
        sim.members = {
            m: replace(v, owned=sim.target.get(m, EMPTY)) for m, v in sim.members.items()
        }
        return Round(group, result, before, previous)

    def step(self, event: Event) -> Round:
        self.apply(event)
        return self.round()


def random_event(rng: random.Random) -> Event:
    return Event(rng.choice(KINDS), rng.randrange(100), rng.randrange(100), rng.random() < 0.5)


def random_start(rng: random.Random) -> tuple[dict[str, int], list[bool]]:
    """A catalogue, and the first workers (whether each has an instance id)."""
    catalogue = {name: rng.randint(0, 8) for name in rng.sample(CONNECTORS, rng.randint(1, 6))}
    workers = [rng.random() < 0.6 for _ in range(rng.randint(2, 5))]
    return catalogue, workers


# --- what a round must show ---------------------------------------------------------------------


def moved(r: Round) -> int:
    """Running resources (in a present member's previous target share, still in the catalogue)
    that the round's result takes away from that member."""
    catalogue = r.view.all_resources()
    return sum(
        len((share & catalogue) - r.result.members[m])
        for m, share in r.before.items()
        if m in r.result.members
    )


def given_back(r: Round) -> dict[str, ResourceSet]:
    """Per present member not in the previous target: the previously held shares it is owed
    (its own member id, or its instance id for a departed member id), within the catalogue."""
    catalogue = r.view.all_resources()
    present = {m.member_id: m for m in r.view.members}
    by_instance = {m.instance_id: m.member_id for m in r.view.members if m.instance_id}
    out: dict[str, ResourceSet] = {}
    for share in r.previous.held:
        receiver = share.member_id if share.member_id in present else None
        if receiver is None and share.instance_id is not None:
            receiver = by_instance.get(share.instance_id)
        if receiver is not None and receiver not in r.before:
            out[receiver] = out.get(receiver, EMPTY) | (share.resources & catalogue)
    return out


def newcomers(r: Round) -> list[str]:
    """Members not in the previous target that are owed nothing held."""
    owed = given_back(r)
    return [
        m.member_id
        for m in r.view.members
        if m.member_id not in r.before and not owed.get(m.member_id)
    ]


def check(r: Round) -> None:
    result, catalogue = r.result, r.view.all_resources()
    shares = list(result.members.values())
    assigned = union(shares)
    held = decode_state(result.assignor_state).held_resources()
    assert sum(len(s) for s in shares) == len(assigned), "a resource is assigned twice"
    assert assigned <= catalogue and held <= catalogue and held.isdisjoint(assigned)
    assert assigned | held == catalogue, "a catalogue resource is neither assigned nor held"
    if result.scheduled_rebalance_delay_ms == 0:
        assert assigned == catalogue, "nothing may stay unassigned once no delay runs"
        for kind in ("connectors", "tasks"):
            counts = [len(getattr(s, kind)) for s in shares]
            assert max(counts) - min(counts) <= 1, f"unbalanced {kind} with no delay running"
        # Balanced as today: the rule changes nothing outside a delay.
        assert BEFORE_FIX.assign(r.view) == result
        return
    assert not newcomers(r), "a newcomer ends the delay"
    assert moved(r) == 0, "a running resource moved during a delay"
    for member, share in given_back(r).items():
        assert share <= result.members[member], "a returning worker gets its own back"
    # New and released resources go to the least loaded: whoever receives one ends at most one
    # above the least loaded member of that kind.
    owed = given_back(r)
    for kind in ("connectors", "tasks"):
        held_by = {m: len(getattr(s, kind)) for m, s in result.members.items()}
        lowest = min(held_by.values())
        for m, share in result.members.items():
            start = (r.before.get(m, EMPTY) | owed.get(m, EMPTY)) & catalogue
            if getattr(share, kind) - getattr(start, kind):
                assert held_by[m] <= lowest + 1, (
                    f"{m} got a new {kind[:-1]} but is not least loaded"
                )


# --- hypothesis: thousands of histories ---------------------------------------------------------

events = st.builds(
    Event,
    st.sampled_from(KINDS),
    st.integers(0, 99),
    st.integers(0, 99),
    st.booleans(),
)
starts = st.tuples(
    st.dictionaries(st.sampled_from(CONNECTORS), st.integers(0, 8), min_size=1, max_size=6),
    st.lists(st.booleans(), min_size=2, max_size=5),
)


@settings(
    max_examples=HISTORIES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(starts, st.lists(events, min_size=8, max_size=30))
def test_during_a_delay_nothing_that_runs_moves(
    start: tuple[dict[str, int], list[bool]], history: list[Event]
) -> None:
    catalogue, workers = start
    group = History(IC, catalogue, workers)
    for event in history:
        check(group.step(event))


# --- the count, before and after ----------------------------------------------------------------


@dataclass
class Count:
    rounds: int = 0
    delay_rounds: int = 0
    moved: int = 0
    rounds_with_moves: int = 0


def count_moves(assignor: ConnectAssignor) -> Count:
    """Running resources moved in rounds that declare a delay, over the seeded histories."""
    count = Count()
    for seed in range(COUNTED_HISTORIES):
        rng = random.Random(seed)
        catalogue, workers = random_start(rng)
        group = History(assignor, catalogue, workers, validate=False)
        for _ in range(COUNTED_EVENTS):
            r = group.step(random_event(rng))
            count.rounds += 1
            if r.result.scheduled_rebalance_delay_ms > 0:
                count.delay_rounds += 1
                n = moved(r)
                count.moved += n
                count.rounds_with_moves += n > 0
    return count


def test_the_count_of_resources_moved_during_delays_is_zero() -> None:
    before, after = count_moves(BEFORE_FIX), count_moves(IC)
    report = f"before the fix: {before}; after: {after}"
    print(report)
    assert before.moved > 0, f"the histories no longer reproduce the issue's finding: {report}"
    assert after.moved == 0, report
    assert after.rounds == before.rounds and after.delay_rounds > before.rounds // 5, report


# --- the rule, by example -----------------------------------------------------------------------


def uneven_after_a_deletion(assignor: ConnectAssignor = IC) -> Sim:
    """w1, w2, w3 over A (two tasks), B and C (one each); w2 departs, then B is deleted: w1 runs
    two tasks and w3 none, while w2's A-1 is held."""
    sim = Sim(assignor, {"A": 2, "B": 1, "C": 1}, max_delay_ms=MAX_DELAY_MS)
    for member in ("w1", "w2", "w3"):
        sim.join(member)
    sim.round()
    assert sim.shares() == {"w1": ["A", "A-0", "C-0"], "w2": ["B", "A-1"], "w3": ["C", "B-0"]}
    sim.leave("w2")
    sim.round()
    sim.now_ms = 100
    del sim.catalogue["B"]
    return sim


def test_a_deleted_connector_leaves_a_hole_during_a_delay() -> None:
    sim = uneven_after_a_deletion()

    result = sim.round()

    assert result.members == {"w1": rs("A", "A-0", "C-0"), "w3": rs("C")}
    assert held(sim) == {"w2": ["A-1"]}
    assert result.scheduled_rebalance_delay_ms == MAX_DELAY_MS - 100
    # Before the fix, w1 stopped C-0 for w3 to start it, and w2's A-1 still waited.
    before = uneven_after_a_deletion(BEFORE_FIX).round()
    assert before.members == {"w1": rs("A", "A-0"), "w3": rs("C", "C-0")}


def held(sim: Sim) -> dict[str, list[str]]:
    return {s.member_id: list(s.resources.names()) for s in decode_state(sim.state).held}


def test_new_tasks_go_to_the_least_loaded_during_a_delay() -> None:
    sim = uneven_after_a_deletion()
    sim.round()
    sim.catalogue["E"] = 3

    result = sim.round()

    # Connectors 1 and 1: E to w1 (by member id). Tasks 2 and 0: E-0 and E-1 to w3, then E-2
    # by member id. Nobody gives anything up, though w1 now runs two connectors and three tasks.
    assert result.members == {"w1": rs("A", "E", "A-0", "C-0", "E-2"), "w3": rs("C", "E-0", "E-1")}
    assert held(sim) == {"w2": ["A-1"]}


def test_a_returning_worker_gets_all_of_its_own_back_while_another_share_is_held() -> None:
    blob = encode_state(
        AssignorState(
            deadline_ms=5_000,
            held=(
                HeldShare("w2", None, rs("A", "A-0", "A-1", "A-2")),
                HeldShare("w3", None, rs("B", "B-0")),
            ),
        )
    )
    group = view(
        {"A": 3, "B": 1, "C": 0},
        ["w1", "w2"],
        target={"w1": rs("C")},
        state=blob,
        now_ms=1_000,
        max_delay_ms=MAX_DELAY_MS,
    )

    result = IC.assign(group)

    assert result.members == {"w1": rs("C"), "w2": rs("A", "A-0", "A-1", "A-2")}
    assert result.scheduled_rebalance_delay_ms == 4_000  # w3's share is still held
    # Before the fix, w2 got two of its three tasks back and w1 the third.
    assert BEFORE_FIX.assign(group).members == {
        "w1": rs("C", "A-2"),
        "w2": rs("A", "A-0", "A-1"),
    }


def ends_with_a_revocation() -> Sim:
    """A to D, of which only D has tasks (two); w2 departs, B and C are deleted: w1 runs two
    connectors and w3 nothing, while w2's D-1 is held."""
    sim = Sim(IC, {"A": 0, "B": 0, "C": 0, "D": 2}, max_delay_ms=MAX_DELAY_MS)
    for member in ("w1", "w2", "w3"):
        sim.join(member)
    sim.round()
    assert sim.shares() == {"w1": ["A", "D", "D-0"], "w2": ["B", "D-1"], "w3": ["C"]}
    sim.leave("w2")
    sim.round()
    del sim.catalogue["B"], sim.catalogue["C"]
    assert sim.round().members == {"w1": rs("A", "D", "D-0"), "w3": EMPTY}
    return sim


def test_when_the_delay_ends_balance_is_restored() -> None:
    sim = ends_with_a_revocation()
    sim.now_ms = MAX_DELAY_MS  # the deadline: w2 departed at 0

    result = sim.round()

    # D-1 is released to w3, and w1 gives up D so that both run one connector and one task.
    assert result.scheduled_rebalance_delay_ms == 0
    assert result.members == {"w1": rs("A", "D-0"), "w3": rs("D", "D-1")}


def test_a_newcomer_ends_the_delay_and_balance_is_restored_at_once() -> None:
    sim = ends_with_a_revocation()
    sim.join("w4")

    result = sim.round()

    assert result.scheduled_rebalance_delay_ms == 0
    assert decode_state(sim.state).held == ()
    # Balanced as before the fix (the newcomer's round is not a delay round): w1 gives up D.
    assert result.members == {"w1": rs("A", "D-0"), "w3": rs("D", "D-1"), "w4": EMPTY}
    assert sim.last_view is not None
    assert BEFORE_FIX.assign(sim.last_view) == result


def place_one_by_one(
    shares: Mapping[str, frozenset[str]], pool: list[str]
) -> dict[str, frozenset[str]]:
    """The rule as plainly as it can be said: each resource, in name order, to the member that
    holds the fewest, ties by member id."""
    heap = [(len(share), member) for member, share in shares.items()]
    heapq.heapify(heap)
    got: dict[str, set[str]] = {member: set(share) for member, share in shares.items()}
    for resource in sorted(pool):
        count, member = heapq.heappop(heap)
        got[member].add(resource)
        heapq.heappush(heap, (count + 1, member))
    return {m: frozenset(v) for m, v in got.items()}


@st.composite
def placements(draw: st.DrawFn) -> tuple[dict[str, frozenset[str]], list[str]]:
    names = [f"r{i:02d}" for i in range(draw(st.integers(0, 40)))]
    ids = draw(st.lists(st.sampled_from([f"m{i}" for i in range(8)]), min_size=1, unique=True))
    owner = draw(st.lists(st.sampled_from([*ids, None]), min_size=len(names), max_size=len(names)))
    shares = {m: frozenset(r for r, o in zip(names, owner, strict=True) if o == m) for m in ids}
    return shares, [r for r, o in zip(names, owner, strict=True) if o is None]


@settings(max_examples=500, derandomize=True, database=None, deadline=None)
@given(placements())
def test_place_sorted_gives_each_resource_to_the_least_loaded(
    case: tuple[dict[str, frozenset[str]], list[str]],
) -> None:
    shares, pool = case
    ids = sorted(shares)

    placed = place_sorted(ids, shares, list(pool))

    assert placed == place_one_by_one(shares, pool)
    for member in ids:
        assert shares[member] <= placed[member]
        if placed[member] == shares[member]:
            assert placed[member] is shares[member]  # passed through, not copied
    # Where balancing would take nothing from anyone, placing is balancing.
    balanced = balance_sorted(ids, shares, list(pool), {})
    if all(shares[m] <= balanced[m] for m in ids):
        assert placed == balanced
