"""Paced waves (seed 002 Design III, DESIGN 3.18) in the incremental cooperative assignor.

With `rebalance.wave.max.resources` = N > 0, a target moves at most N running resources for
balancing (taken from a member that runs them), and no new wave starts while resources of the
previous one are in motion (moved by a target, not yet in their new owner's owned list), nor
before `rebalance.wave.pause.ms` after the previous wave's last delivery. Lost and new resources
are placed at once, as without pacing. The next wave is asked for through the one scheduled
rebalance, which is the earlier of the lost-work delay and the next wave; the result says each.
With N = 0 (the default) every round is the assignor's one-shot result, exactly as before.

The properties run over `Paced`, a group driven by random events under a reconciliation model
of the coordinator: a target is installed (members are told to stop what it takes from them),
then time passes in ticks, in which members acknowledge their revocations (some, at random) and
are sent each target resource nobody else holds any more (which sets their `last_grant_at_ms`),
and the scheduled rebalance fires when it is due. The model tracks, independently of the
assignor, which resources are in motion for balancing and when the last one arrived.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connect_protocol.configs import (
    HEARTBEAT_INTERVAL_MS,
    REBALANCE_WAVE_MAX_RESOURCES,
    REBALANCE_WAVE_PAUSE_MS,
    SCHEDULED_REBALANCE_MAX_DELAY_MS,
)
from connect_protocol.resources import EMPTY, ResourceSet, TaskId, union
from tests.support.frozen_assignors_v1 import state as old_state
from tests.worker_agent_assignors.test_assignors_differential import OLD_IC, _case
from tests.worker_agent_assignors.test_assignors_support import assert_installable, rs
from worker_agent.assignor import AssignmentResult, GroupView, MemberView
from worker_agent.assignors import IncrementalCooperativeAssignor
from worker_agent.assignors.balance import balance_planned, balance_sorted, plan_surplus
from worker_agent.assignors.state import (
    AssignorState,
    HeldShare,
    WaveShare,
    decode_state,
    encode_state,
)

IC = IncrementalCooperativeAssignor()

Resource = str | TaskId

CONNECTORS = [f"c{i}" for i in range(6)]
#: Event kinds, repeated for weight: time passing drives the waves.
KINDS = ["tick"] * 10 + ["join"] * 2 + ["leave"] * 2 + ["return"] * 2 + ["put"] * 3 + ["delete"]
TICKS_MS = [1, 50, 300, 1_000, 3_000]
PACES = [1, 2, 3, 5]
PAUSES = [0, 700, 5_000]
MAX_DELAYS = [0, 2_000, 10_000]
HEARTBEATS: list[int | None] = [None, 500]  # heartbeat.interval.ms: the default (3 s), or 500

HISTORIES = 1_500  # hypothesis examples for the bound
CONVERGING_HISTORIES = 500
PAUSE_HISTORIES = 500
COUNTED_HISTORIES = 150  # seeded histories, to show the properties are not vacuous


def items(resources: ResourceSet) -> list[Resource]:
    return [*resources.connectors, *resources.tasks]


def has(resources: ResourceSet, resource: Resource) -> bool:
    if isinstance(resource, str):
        return resource in resources.connectors
    return resource in resources.tasks


def is_balanced(shares: Iterable[ResourceSet]) -> bool:
    """Floor or ceiling of each kind for every member (counts within one)."""
    shares = list(shares)
    for kind in ("connectors", "tasks"):
        counts = [len(getattr(s, kind)) for s in shares]
        if counts and max(counts) - min(counts) > 1:
            return False
    return True


@dataclass
class Worker:
    """One member as the coordinator holds it: what it runs, what it was told to stop and has
    not yet acknowledged, and when it was last sent a resource it did not hold."""

    instance_id: str | None
    assigned: ResourceSet = EMPTY
    pending: ResourceSet = EMPTY
    last_grant_at_ms: int = 0

    @property
    def owned(self) -> ResourceSet:
        return self.assigned | self.pending


@dataclass(frozen=True)
class Event:
    """One change; `a` and `b` pick among what exists when it applies (so any list of events
    is a valid history)."""

    kind: str
    a: int = 0
    b: int = 0
    flag: bool = False


@dataclass(frozen=True)
class Config:
    pace: int
    pause_ms: int
    max_delay_ms: int
    heartbeat_ms: int | None

    def configs(self, pace: int | None = None) -> dict[str, str]:
        out = {
            REBALANCE_WAVE_MAX_RESOURCES: str(self.pace if pace is None else pace),
            REBALANCE_WAVE_PAUSE_MS: str(self.pause_ms),
            SCHEDULED_REBALANCE_MAX_DELAY_MS: str(self.max_delay_ms),
        }
        if self.heartbeat_ms is not None:
            out[HEARTBEAT_INTERVAL_MS] = str(self.heartbeat_ms)
        return out


@dataclass
class Tally:
    """What the rounds of a history showed (to prove the properties are exercised)."""

    rounds: int = 0
    waves: int = 0
    limited_waves: int = 0  # waves that moved N, less than a one-shot target would
    full_motion: int = 0  # rounds that left exactly N in motion
    held_back_by_motion: int = 0  # rounds that wanted to move but waited for a delivery
    both_delays: int = 0  # rounds with a lost-work delay and a next wave
    newcomer_rounds_in_a_plan: int = 0  # a newcomer came while a plan was unfinished
    pause_waits: int = 0  # rounds that waited for the pause after a delivery


@dataclass
class Paced:
    """A group under the reconciliation model described in the module docstring."""

    catalogue: dict[str, int]
    config: Config
    rng: random.Random
    now: int = 100_000
    epoch: int = 1
    workers: dict[str, Worker] = field(default_factory=dict)
    departed: dict[str, str | None] = field(default_factory=dict)
    target: dict[str, ResourceSet] = field(default_factory=dict)
    state: bytes = b""
    deadline: int | None = None
    serial: int = 0
    #: In motion for balancing, as this model sees it: resource -> its new owner.
    motion: dict[Resource, str] = field(default_factory=dict)
    #: The latest delivery of an in-motion resource since the last wave started.
    delivered_at: int | None = None
    #: Whether, since then, an in-motion resource left the wave undelivered (its receiver
    #: departed, or it was deleted): the assignor then pauses from the round that sees it.
    dropped: bool = False
    tally: Tally = field(default_factory=Tally)
    last: AssignmentResult | None = None

    # --- events --------------------------------------------------------------------------

    def add(self, with_instance: bool) -> None:
        self.serial += 1
        self.workers[f"w{self.serial:02d}"] = Worker(
            f"i{self.serial:02d}" if with_instance else None
        )

    def apply(self, event: Event) -> None:
        """Apply `event`; a tick passes time (and fires the scheduled rebalance when due), any
        other change computes a round."""
        if event.kind == "tick":
            self.tick(TICKS_MS[event.a % len(TICKS_MS)], ack=0.3 + 0.7 * event.flag)
            return
        if event.kind == "leave" and len(self.workers) > 1:
            member = sorted(self.workers)[event.a % len(self.workers)]
            self.departed[member] = self.workers.pop(member).instance_id  # released at once
            self.forget(lambda r, m: m != member)
        elif event.kind == "return" and self.departed:
            member = sorted(self.departed)[event.a % len(self.departed)]
            instance = self.departed.pop(member)
            if instance in {w.instance_id for w in self.workers.values()}:
                instance = None
            if event.flag and instance is not None:  # a restart: new member id, same instance
                self.serial += 1
                member = f"w{self.serial:02d}"
            self.workers[member] = Worker(instance)
        elif event.kind == "join":
            self.add(event.flag)
        elif event.kind == "put":
            self.catalogue[CONNECTORS[event.a % len(CONNECTORS)]] = event.b % 13
            self.forget(lambda r, m: self.exists(r))
        elif event.kind == "delete" and self.catalogue:
            del self.catalogue[sorted(self.catalogue)[event.a % len(self.catalogue)]]
            self.forget(lambda r, m: self.exists(r))
        else:
            return
        self.round()

    def exists(self, r: Resource) -> bool:
        if isinstance(r, str):
            return r in self.catalogue
        return r.task < self.catalogue.get(r.connector, 0)

    def forget(self, keep: Callable[[Resource, str], bool]) -> None:
        """Resources no longer in motion, undelivered: their receiver departed or they were
        deleted."""
        motion = {r: m for r, m in self.motion.items() if keep(r, m)}
        self.dropped = self.dropped or len(motion) < len(self.motion)
        self.motion = motion

    def tick(self, ms: int, *, ack: float) -> None:
        """Time passes: some members acknowledge their revocations, then every member is sent
        what its target holds that nobody else holds any more; the scheduled rebalance fires
        if due."""
        self.now += ms
        for member in sorted(self.workers):
            if self.rng.random() < ack:
                self.workers[member].pending = EMPTY
        held = union(w.owned for w in self.workers.values())
        for member in sorted(self.workers):
            worker = self.workers[member]
            free = (self.target.get(member, EMPTY) - worker.assigned) - held
            if free:
                worker.assigned = worker.assigned | free
                worker.last_grant_at_ms = self.now
                held = held | free
        for resource, member in list(self.motion.items()):
            if has(self.workers[member].assigned, resource):
                del self.motion[resource]
                self.delivered_at = self.now
        owners = [w.owned for w in self.workers.values()]
        assert sum(len(o) for o in owners) == len(union(owners)), "a resource on two members"
        if self.deadline is not None and self.now >= self.deadline:
            self.round()

    # --- a round -------------------------------------------------------------------------

    def view(self, configs: Mapping[str, str] | None = None) -> GroupView:
        return GroupView(
            group_epoch=self.epoch,
            assignor_name="incremental_cooperative",
            assignor_version=2,
            members=tuple(
                MemberView(
                    m,
                    instance_id=w.instance_id,
                    owned=w.owned,
                    last_grant_at_ms=w.last_grant_at_ms,
                )
                for m, w in sorted(self.workers.items())
            ),
            catalogue=dict(self.catalogue),
            assignment_epoch=self.epoch - 1,
            target=dict(self.target),
            assignor_state=self.state,
            configs=self.config.configs() if configs is None else dict(configs),
            coordinator_time_ms=self.now,
        )

    def round(self) -> AssignmentResult:
        self.epoch += 1
        group = self.view()
        result = IC.assign(group)
        assert_installable(group, result)
        self.check(group, result)
        self.target = {m: r for m, r in result.members.items() if m in self.workers}
        for member, worker in self.workers.items():
            mine = self.target.get(member, EMPTY)
            worker.pending = worker.pending | (worker.assigned - mine)
            worker.assigned = worker.assigned & mine
        self.state = result.assignor_state
        delay = result.scheduled_rebalance_delay_ms
        self.deadline = self.now + delay if delay > 0 else None
        self.last = result
        return result

    def check(self, group: GroupView, result: AssignmentResult) -> None:
        """Every rule a round must keep; see the module docstring."""
        config, now, tally = self.config, self.now, self.tally
        tally.rounds += 1
        state, previous = decode_state(result.assignor_state), decode_state(group.assignor_state)
        catalogue = group.all_resources()
        assigned = union(result.members.values())
        held = state.held_resources()
        assert assigned | held == catalogue, "lost and new work is placed at once (or held)"

        # The one deadline and what it stands for.
        lost, wave = result.lost_work_delay_ms, result.next_wave_delay_ms
        assert result.scheduled_rebalance_delay_ms == min(
            (d for d in (lost, wave) if d > 0), default=0
        )
        assert lost == (0 if state.deadline_ms is None else state.deadline_ms - now) >= 0
        assert wave == (0 if state.next_wave_ms is None else state.next_wave_ms - now) >= 0
        assert (lost > 0) == bool(held)
        if lost and wave:
            assert wave >= lost, "no wave is asked before the lost-work delay ends"
            tally.both_delays += 1
        if config.pace == 0:
            assert result == OLD_IC.assign(group), "with N = 0 a round is the one-shot result"
            assert state.wave == () and wave == 0
            return

        # The balancing moves: resources taken from a present member that runs them.
        owner = {r: m for m, share in result.members.items() for r in items(share)}
        moves: dict[Resource, str] = {}
        for member in group.members:
            before = group.target.get(member.member_id, EMPTY)
            running = before & catalogue & member.owned
            for resource in items(running - result.members[member.member_id]):
                assert resource in owner, "a running resource was taken and left unassigned"
                moves[resource] = owner[resource]
        if lost:
            assert not moves, "nothing that runs moves during a lost-work delay"
        for resource, receiver in self.motion.items():
            assert owner.get(resource) == receiver, "a resource in motion was moved again"
        if newcomers(group, previous):
            assert lost == 0, "a newcomer ends the lost-work delay"
            if previous.next_wave_ms is not None:
                tally.newcomer_rounds_in_a_plan += 1

        one_shot = IC.assign(replace(group, configs=config.configs(pace=0)))
        wanted = sum(
            len((group.target.get(m.member_id, EMPTY) & catalogue & m.owned) - share)
            for m in group.members
            for share in [one_shot.members[m.member_id]]
        )
        if moves:
            assert not self.motion, "a wave starts only when the previous one has arrived"
            if self.delivered_at is not None:
                assert now >= self.delivered_at + config.pause_ms, "the pause is from delivery"
            assert len(moves) == min(config.pace, wanted), "a wave moves N, or all that is left"
            if wanted <= config.pace:
                assert result.members == one_shot.members, "the last wave is the one-shot target"
            else:
                tally.limited_waves += 1
            tally.waves += 1
            self.delivered_at, self.dropped = None, False
            self.motion.update(moves)
        elif wanted and not lost:
            if self.motion:
                tally.held_back_by_motion += 1
            else:
                tally.pause_waits += 1
                assert self.delivered_at is not None or self.dropped, "nothing held it back"
        assert len(self.motion) <= config.pace, "more than N resources in motion for balancing"
        tally.full_motion += len(self.motion) == config.pace
        assert bool(wave) != is_balanced(result.members.values()), "a next wave iff a plan"

    # --- after the events ------------------------------------------------------------------

    def settle(self) -> int:
        """With no further changes, deliver everything and fire each scheduled rebalance until
        none is asked: the rounds it took."""
        rounds = 0
        limit = 4 * (len(self.view().all_resources()) + 4)
        while True:
            self.tick(1, ack=1.0)
            self.tick(1, ack=1.0)
            if self.deadline is None:
                return rounds
            rounds += 1
            assert rounds <= limit, "the paced plan did not converge"
            self.now = max(self.now, self.deadline - 2)
            self.tick(2, ack=1.0)  # fires the round


def newcomers(group: GroupView, previous: AssignorState) -> list[str]:
    """Members not in the previous target that are owed no held share (by member id, or by
    instance id)."""
    present = {m.member_id for m in group.members}
    by_instance = {m.instance_id: m.member_id for m in group.members if m.instance_id}
    owed = set()
    for share in previous.held:
        if share.member_id in present:
            owed.add(share.member_id)
        elif share.instance_id in by_instance:
            owed.add(by_instance[share.instance_id])
    return [m for m in sorted(present) if m not in group.target and m not in owed]


def history(config: Config, catalogue: dict[str, int], workers: list[bool], seed: int) -> Paced:
    group = Paced(dict(catalogue), config, random.Random(seed))
    for with_instance in workers:
        group.add(with_instance)
    group.round()
    return group


# --- hypothesis: thousands of histories ---------------------------------------------------------

events = st.builds(
    Event, st.sampled_from(KINDS), st.integers(0, 99), st.integers(0, 99), st.booleans()
)
starts = st.tuples(
    st.dictionaries(st.sampled_from(CONNECTORS), st.integers(0, 12), min_size=1, max_size=5),
    st.lists(st.booleans(), min_size=1, max_size=4),
)


def histories(examples: int) -> settings:
    """Derandomized (CI runs the same histories every time), no deadline."""
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def configs(paces: list[int] = PACES, pauses: list[int] = PAUSES) -> st.SearchStrategy[Config]:
    return st.builds(
        Config,
        st.sampled_from(paces),
        st.sampled_from(pauses),
        st.sampled_from(MAX_DELAYS),
        st.sampled_from(HEARTBEATS),
    )


@histories(HISTORIES)
@given(configs(), starts, st.lists(events, min_size=10, max_size=40), st.integers(0, 2**16))
def test_no_more_than_n_resources_are_ever_in_motion_for_balancing(
    config: Config, start: tuple[dict[str, int], list[bool]], events: list[Event], seed: int
) -> None:
    group = history(config, *start, seed)
    for event in events:
        group.apply(event)


@histories(CONVERGING_HISTORIES)
@given(
    configs(paces=[0, *PACES]),
    starts,
    st.lists(events, min_size=5, max_size=25),
    st.integers(0, 2**16),
)
def test_paced_plans_converge_to_the_floor_and_ceiling_balance(
    config: Config, start: tuple[dict[str, int], list[bool]], events: list[Event], seed: int
) -> None:
    group = history(config, *start, seed)
    for event in events:
        group.apply(event)

    group.settle()

    assert group.last is not None
    assert is_balanced(group.target.values()), "the plan finished outside the balance"
    state = decode_state(group.state)
    assert state.held == () and state.next_wave_ms is None and state.deadline_ms is None
    assert not group.motion, "everything in motion has arrived"
    assert union(group.target.values()) == group.view().all_resources()
    for member, worker in group.workers.items():
        assert worker.assigned == group.target[member] and not worker.pending


@histories(PAUSE_HISTORIES)
@given(
    configs(pauses=[700, 5_000]),
    starts,
    st.lists(events, min_size=10, max_size=40).map(
        lambda es: [replace(e, kind="join") if i == 0 else e for i, e in enumerate(es)]
    ),
    st.integers(0, 2**16),
)
def test_no_wave_starts_before_the_pause_after_the_last_delivery(
    config: Config, start: tuple[dict[str, int], list[bool]], events: list[Event], seed: int
) -> None:
    # `check` asserts it of every wave; this runs it with a pause on every history, each
    # starting with a scale-out.
    group = history(config, *start, seed)
    for event in events:
        group.apply(event)
    group.settle()


def test_the_histories_exercise_paced_waves() -> None:
    """The properties above are not vacuous: seeded histories of the same kind show waves
    limited to N, rounds at the bound, rounds held back by a wave in motion or by the pause,
    both delays at once, and newcomers during a plan."""
    total = Tally()
    for seed in range(COUNTED_HISTORIES):
        rng = random.Random(seed)
        config = Config(
            rng.choice(PACES), rng.choice(PAUSES), rng.choice(MAX_DELAYS), rng.choice(HEARTBEATS)
        )
        catalogue = {c: rng.randint(0, 12) for c in rng.sample(CONNECTORS, rng.randint(1, 5))}
        group = history(config, catalogue, [rng.random() < 0.5 for _ in range(3)], seed)
        for _ in range(40):
            group.apply(
                Event(rng.choice(KINDS), rng.randrange(100), rng.randrange(100), rng.random() < 0.5)
            )
        group.settle()
        for name, value in vars(group.tally).items():
            setattr(total, name, getattr(total, name) + value)
    print(total)
    assert total.waves > 200 and total.limited_waves > 100, total
    assert total.full_motion > 100 and total.held_back_by_motion > 50, total
    assert total.pause_waits > 20 and total.both_delays > 5, total
    assert total.newcomer_rounds_in_a_plan > 5, total


def test_with_n_zero_every_round_is_the_one_shot_result() -> None:
    """Any group (the differential test's random inputs): N = 0 with any pause is the
    assignor without the wave configurations, and so the frozen one-shot assignor."""
    for seed in range(600):
        group = _case(seed)
        configs = {**group.configs, REBALANCE_WAVE_MAX_RESOURCES: "0"}
        configs[REBALANCE_WAVE_PAUSE_MS] = str(random.Random(seed).choice([0, 1, 60_000]))
        paced = IC.assign(replace(group, configs=configs))
        assert paced == IC.assign(group) == OLD_IC.assign(group), seed


@st.composite
def plans(
    draw: st.DrawFn,
) -> tuple[list[str], dict[str, frozenset[str]], list[str], dict[str, frozenset[str]], int]:
    """Members' shares (some far above the quota), what each runs of its share, the unassigned
    pool, and a limit."""
    names = [f"r{i:02d}" for i in range(draw(st.integers(0, 40)))]
    ids = sorted(
        draw(st.lists(st.sampled_from([f"m{i}" for i in range(6)]), min_size=1, unique=True))
    )
    owner = draw(
        st.lists(st.sampled_from([*ids, ids[0], None]), min_size=len(names), max_size=len(names))
    )
    shares = {m: frozenset(r for r, o in zip(names, owner, strict=True) if o == m) for m in ids}
    running = {m: frozenset(r for r in shares[m] if draw(st.booleans())) for m in ids}
    pool = [r for r, o in zip(names, owner, strict=True) if o is None]
    return ids, shares, pool, running, draw(st.integers(0, 12))


@histories(1_000)
@given(plans())
def test_a_limited_plan_moves_at_most_the_limit_of_running_resources_from_the_most_loaded(
    case: tuple[list[str], dict[str, frozenset[str]], list[str], dict[str, frozenset[str]], int],
) -> None:
    ids, shares, pool, running, limit = case
    plan = plan_surplus(ids, shares, len(pool), running)
    unlimited = balance_sorted(ids, shares, list(pool), running)

    out, moved = balance_planned(ids, shares, list(pool), plan, limit=limit)

    stopped = {m: (shares[m] & running[m]) - out[m] for m in ids}
    taken = sum(len(v) for v in stopped.values())
    assert taken == min(limit, plan.running_total)
    assert sorted(r for got in moved.values() for r in got) == sorted(
        set().union(*stopped.values())
    )
    for m in ids:
        assert stopped[m] <= shares[m] - unlimited[m], "only what the one-shot plan would move"
        assert len(out[m]) >= min(len(shares[m]), plan.quota[m]), "nobody goes below its quota"
        for r in moved.get(m, []):
            assert r in out[m] and len(out[m]) <= plan.quota[m], "received below its quota"
    assert sorted(r for m in ids for r in out[m]) == sorted(
        [*pool, *(r for m in ids for r in shares[m])]
    )
    if limit >= plan.running_total:
        assert out == unlimited
    # Relieved from the top: a giver that kept running surplus holds no more than one above any
    # giver that gave some up.
    kept = [len(out[m]) - plan.quota[m] for m in plan.running if len(out[m]) > plan.quota[m]]
    gave = [len(out[m]) - plan.quota[m] for m in plan.running if stopped[m]]
    if kept and gave:
        assert max(kept) <= min(gave) + 1


# --- by example -----------------------------------------------------------------------------


def converged(
    shares: Mapping[str, ResourceSet], at_ms: int, previous: Mapping[str, MemberView]
) -> list[MemberView]:
    """Every member runs its share; those that got something new got it at `at_ms`."""
    out = []
    for member, share in sorted(shares.items()):
        before = previous.get(member, MemberView(member))
        grant = at_ms if share - before.owned else before.last_grant_at_ms
        out.append(replace(before, owned=share, last_grant_at_ms=grant))
    return out


def scale_out_view(pace: int, pause_ms: int = 1_000) -> GroupView:
    """w1, w2, w3 run connectors A, B, C and ten tasks each (A's on w1 and so on); w4, w5, w6
    join."""
    target = {f"w{i + 1}": rs(c, *(f"{c}-{t}" for t in range(10))) for i, c in enumerate("ABC")}
    members = [MemberView(m, owned=share) for m, share in target.items()]
    members += [MemberView(m) for m in ("w4", "w5", "w6")]
    return GroupView(
        group_epoch=3,
        assignor_name="incremental_cooperative",
        assignor_version=2,
        members=tuple(members),
        catalogue={"A": 10, "B": 10, "C": 10},
        assignment_epoch=2,
        target=target,
        configs={
            REBALANCE_WAVE_MAX_RESOURCES: str(pace),
            REBALANCE_WAVE_PAUSE_MS: str(pause_ms),
            HEARTBEAT_INTERVAL_MS: "500",
        },
        coordinator_time_ms=10_000,
    )


def next_round(
    group: GroupView, result: AssignmentResult, at_ms: int, *, delivered: bool
) -> GroupView:
    """The round after `result`, at `at_ms`; its resources delivered at `at_ms` if `delivered`,
    else nobody has received anything new yet (revocations acknowledged or not)."""
    previous = {m.member_id: m for m in group.members}
    if delivered:
        members = converged(result.members, at_ms, previous)
    else:
        members = [
            replace(previous[m], owned=previous[m].owned & share)
            for m, share in sorted(result.members.items())
        ]
    return replace(
        group,
        group_epoch=group.group_epoch + 1,
        assignment_epoch=group.group_epoch,
        members=tuple(members),
        target=dict(result.members),
        assignor_state=result.assignor_state,
        coordinator_time_ms=at_ms,
    )


def task_counts(result: AssignmentResult) -> list[int]:
    return [len(result.members[m].tasks) for m in sorted(result.members)]


def running_moves(group: GroupView, result: AssignmentResult) -> int:
    return sum(
        len((group.target.get(m.member_id, EMPTY) & m.owned) - result.members[m.member_id])
        for m in group.members
    )


def test_a_scale_out_moves_in_waves_of_n_until_each_runs_its_share() -> None:
    group = scale_out_view(pace=3)
    counts, delays = [], []
    for _ in range(10):
        result = IC.assign(group)
        assert_installable(group, result)
        assert running_moves(group, result) <= 3
        counts.append(task_counts(result))
        delays.append(result.next_wave_delay_ms)
        if not result.scheduled_rebalance_delay_ms:
            break
        # Delivered at once; the next round is the one the result asked for.
        at = group.coordinator_time_ms + result.scheduled_rebalance_delay_ms
        group = next_round(group, result, group.coordinator_time_ms, delivered=True)
        group = replace(group, coordinator_time_ms=at)

    assert counts == [
        [9, 9, 9, 1, 1, 1],
        [8, 8, 8, 2, 2, 2],
        [7, 7, 7, 3, 3, 3],
        [6, 6, 6, 4, 4, 4],
        [5, 5, 5, 5, 5, 5],
    ]
    # Each wave asks for the next a pause after it (delivered at once; the pause beats the
    # heartbeat interval); the last asks for nothing. Connectors (one each for three of six)
    # never move, and the lost-work delay is never set.
    assert delays == [1_000, 1_000, 1_000, 1_000, 0]
    assert all(len(s.connectors) <= 1 for s in result.members.values())
    assert decode_state(result.assignor_state).wave  # the last wave is followed to delivery


def test_without_pacing_the_scale_out_is_one_target() -> None:
    group = scale_out_view(pace=0)

    result = IC.assign(group)

    assert task_counts(result) == [5] * 6 and running_moves(group, result) == 15
    assert result == OLD_IC.assign(replace(group, configs={}))
    assert (result.scheduled_rebalance_delay_ms, result.next_wave_delay_ms) == (0, 0)


def test_the_pause_is_measured_from_the_last_delivery() -> None:
    first = scale_out_view(pace=3, pause_ms=1_000)
    wave = IC.assign(first)  # at 10 000: three tasks to w4, w5, w6
    assert running_moves(first, wave) == 3
    assert wave.next_wave_delay_ms == 1_000  # max(pause, heartbeat interval)

    # 11 000: not delivered yet (w1-w3 have stopped them, w4-w6 not yet sent them).
    waiting = next_round(first, wave, 11_000, delivered=False)
    result = IC.assign(waiting)
    assert running_moves(waiting, result) == 0 and result.members == wave.members
    assert result.next_wave_delay_ms == 1_000
    assert decode_state(result.assignor_state).wave == decode_state(wave.assignor_state).wave

    # Delivered at 11 500; a round at 12 000 (the poll) waits for 12 500.
    delivered = next_round(waiting, result, 11_500, delivered=True)
    polled = replace(delivered, coordinator_time_ms=12_000)
    result = IC.assign(polled)
    assert running_moves(polled, result) == 0
    assert result.next_wave_delay_ms == 500
    assert decode_state(result.assignor_state).wave_delivered_ms == 11_500

    # Fired early (at 12 499, e.g. a coordinator that clamps the delay): still nothing.
    early = replace(polled, coordinator_time_ms=12_499, assignor_state=result.assignor_state)
    result = IC.assign(early)
    assert running_moves(early, result) == 0 and result.next_wave_delay_ms == 1

    # At 12 500, the second wave.
    due = replace(early, coordinator_time_ms=12_500, assignor_state=result.assignor_state)
    result = IC.assign(due)
    assert running_moves(due, result) == 3
    assert task_counts(result) == [8, 8, 8, 2, 2, 2]


def test_the_one_deadline_is_the_earlier_and_a_newcomer_ends_only_the_lost_work_delay() -> None:
    group = scale_out_view(pace=3, pause_ms=5_000)
    group = replace(group, configs={**group.configs, SCHEDULED_REBALANCE_MAX_DELAY_MS: "2000"})
    wave = IC.assign(group)
    assert (wave.lost_work_delay_ms, wave.next_wave_delay_ms) == (0, 5_000)

    # w5 (a receiver) departs before it got its task; w4 and w6 got theirs.
    after = next_round(group, wave, 10_100, delivered=True)
    after = replace(after, members=tuple(m for m in after.members if m.member_id != "w5"))
    result = IC.assign(after)
    assert_installable(after, result)
    assert result.lost_work_delay_ms == 2_000  # w5's task is held for it
    assert result.next_wave_delay_ms == 5_000  # the pause from the delivery, at 10 100
    assert result.scheduled_rebalance_delay_ms == 2_000  # the earlier of the two
    assert running_moves(after, result) == 0 and result.members == {
        m: s for m, s in wave.members.items() if m != "w5"
    }
    state = decode_state(result.assignor_state)
    assert (state.deadline_ms, state.next_wave_ms) == (12_100, 15_100)
    assert state.held and state.held[0].member_id == "w5"

    # A newcomer, w7, at 10 200: the lost-work delay ends (w5's task is placed at once, on w7,
    # the least loaded), the wave plan does not: the pause after the delivery still runs.
    joined = next_round(after, result, 10_200, delivered=True)
    joined = replace(joined, members=(*joined.members, MemberView("w7")))
    result = IC.assign(joined)
    assert_installable(joined, result)
    assert result.lost_work_delay_ms == 0
    assert result.next_wave_delay_ms == result.scheduled_rebalance_delay_ms == 4_900
    assert running_moves(joined, result) == 0
    assert result.members["w7"] == ResourceSet(tasks=wave.members["w5"].tasks)
    assert decode_state(result.assignor_state).held == ()

    # When the pause has passed, the next wave moves N.
    due = next_round(joined, result, 10_300, delivered=True)
    due = replace(due, coordinator_time_ms=15_100)
    result = IC.assign(due)
    assert running_moves(due, result) == 3 and result.next_wave_delay_ms > 0


def test_a_newcomer_during_a_wave_in_motion_gets_only_new_work_until_it_arrives() -> None:
    group = scale_out_view(pace=3)
    wave = IC.assign(group)
    waiting = next_round(group, wave, 10_050, delivered=False)
    waiting = replace(
        waiting,
        members=(*waiting.members, MemberView("w7")),
        catalogue={**waiting.catalogue, "D": 2},
    )

    result = IC.assign(waiting)

    assert_installable(waiting, result)
    assert running_moves(waiting, result) == 0
    new = rs("D", "D-0", "D-1")
    assert result.members["w7"] and result.members["w7"] <= new  # new work at once
    for member, share in wave.members.items():
        assert share <= result.members[member]  # nobody gave up anything
    assert result.lost_work_delay_ms == 0 and result.next_wave_delay_ms == 1_000


def test_setting_n_back_to_zero_moves_everything_at_once() -> None:
    group = scale_out_view(pace=3)
    wave = IC.assign(group)
    following = next_round(group, wave, 10_050, delivered=False)
    unpaced = replace(following, configs={})

    result = IC.assign(unpaced)

    assert task_counts(result) == [5] * 6
    assert result == OLD_IC.assign(unpaced)  # the wave bookkeeping is dropped
    assert decode_state(result.assignor_state) == AssignorState()


# --- the state blob ----------------------------------------------------------------------------

#: A blob as the assignor wrote it before paced waves (from test_assignors.py's format test).
OLD_BLOB = (
    b'{"deadline_ms":5,"held":[{"instance_id":null,"member_id":"w","resources":'
    b'{"connectors":["A"],"tasks":[]}}],"instances":{"w1":"i1"},"version":1}'
)


def test_a_blob_from_before_paced_waves_still_decodes() -> None:
    state = decode_state(OLD_BLOB)

    assert state.deadline_ms == 5
    assert state.held == (HeldShare("w", None, rs("A")),)
    assert dict(state.instances) == {"w1": "i1"}
    assert (state.wave, state.wave_delivered_ms, state.next_wave_ms) == ((), None, None)
    assert encode_state(state) == OLD_BLOB  # no wave plan: the same bytes as before


def test_a_paced_round_reads_a_blob_from_before() -> None:
    group = replace(scale_out_view(pace=3), assignor_state=OLD_BLOB)

    result = IC.assign(group)

    assert running_moves(group, result) == 3  # no wave in motion, no pause: a wave starts


@histories(300)
@given(
    st.none() | st.integers(0, 10**12),
    st.lists(st.sampled_from(["w1", "w2", "g1"]), unique=True),
    st.lists(st.sampled_from(["w3", "w4"]), unique=True),
    st.none() | st.integers(0, 10**12),
    st.none() | st.integers(0, 10**12),
)
def test_the_blob_round_trips_and_an_assignor_from_before_reads_its_delay_and_held_shares(
    deadline: int | None,
    holders: list[str],
    receivers: list[str],
    delivered: int | None,
    next_wave: int | None,
) -> None:
    state = AssignorState(
        deadline_ms=deadline,
        held=tuple(HeldShare(h, None, rs(f"C{h}", f"C{h}-0")) for h in sorted(holders)),
        instances={"w1": "i1"},
        wave=tuple(WaveShare(r, rs(f"T{r}-1", f"T{r}-2")) for r in sorted(receivers)),
        wave_delivered_ms=delivered,
        next_wave_ms=next_wave,
    )
    blob = encode_state(state)

    assert decode_state(blob) == state
    old = old_state.decode_state(blob)
    assert old.deadline_ms == deadline and dict(old.instances) == {"w1": "i1"}
    assert [(s.member_id, s.resources) for s in old.held] == [
        (s.member_id, s.resources) for s in state.held
    ]
    if not receivers and delivered is None and next_wave is None:
        assert blob == old_state.encode_state(old)


def test_malformed_wave_keys_drop_the_wave_bookkeeping_only() -> None:
    document = json.loads(OLD_BLOB)
    for bad in (
        {"wave": 5},
        {"wave": [{"member_id": 7, "resources": {}}]},
        {"wave": [{"member_id": "w", "resources": []}]},
        {"wave_delivered_ms": "soon"},
        {"next_wave_ms": True},
    ):
        state = decode_state(json.dumps({**document, **bad}).encode())
        assert state.held == (HeldShare("w", None, rs("A")),), bad
        assert (state.wave, state.wave_delivered_ms, state.next_wave_ms) == ((), None, None)


def test_the_wave_keys_encode_sorted_and_only_when_set() -> None:
    state = AssignorState(
        wave=(WaveShare("w5", rs("B-1")), WaveShare("w4", rs("A", "A-3"))),
        wave_delivered_ms=7,
        next_wave_ms=9,
    )

    assert encode_state(state) == (
        b'{"deadline_ms":null,"held":[],"instances":{},"next_wave_ms":9,"version":1,'
        b'"wave":[{"member_id":"w4","resources":{"connectors":["A"],"tasks":'
        b'[{"connector":"A","task":3}]}},{"member_id":"w5","resources":{"connectors":[],'
        b'"tasks":[{"connector":"B","task":1}]}}],"wave_delivered_ms":7}'
    )
    assert b"wave" not in encode_state(AssignorState(deadline_ms=3))
