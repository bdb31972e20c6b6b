"""Differential tests: the assignors against a frozen copy of the code before the linear-time
rewrite (`frozen_v1`), on thousands of seeded random inputs.

Both must return identical `AssignmentResult`s (members in the same order, state bytes, delay)
for any group an assignor might be shown: random catalogues (empty, zero-task connectors),
members with and without instance ids, previous targets and owned lists that overlap, are stale
or name deleted resources, state blobs (none, garbage, delays running or expired, shares held for
departed, present or returning members), various `scheduled.rebalance.max.delay.ms` including 0;
and multi-round histories where each round's result and state blob feed the next round while
members join, depart and return and the catalogue and the clock move. The module-level helpers
(`balance`, `quotas`, the state codec) are compared as well.

A failure names the seed: `_case(seed)` or `_history(seed)` rebuilds the input.

Since issue 13 (item 1) the two differ by design in one place: while a scheduled-rebalance delay
runs (the round holds something back, so no newcomer came), the assignor makes no load-balancing
revocations (DESIGN 3.18), where the frozen copy balanced what was not held. So the incremental
assignor is compared with the frozen copy whose final step, in those rounds only, is replaced by
an independent, plain statement of the rule (`_place_only`: each resource to place, in name
order, to the member holding the fewest, ties by member id; nobody gives anything up). Everything
else (what each member starts from, what is held and until when, the state blob, every round
without a delay) is still the frozen copy's own. The single-round test also checks that the rule
does change results there.

Since issue 13's paced waves (DESIGN 3.18) a result also says what its delay stands for; the
frozen copy's only delay is the lost-work delay, so its results are compared with
`lost_work_delay_ms` set to their delay (`_as_lost_work`). The wave configurations are never set
here: `rebalance.wave.max.resources` 0, pacing off, is the assignor before the change.
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar
from unittest import mock

import pytest

from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from tests.support import frozen_assignors_v1 as frozen_v1
from tests.support.frozen_assignors_v1 import balance as old_balance
from tests.support.frozen_assignors_v1 import incremental as old_incremental
from tests.support.frozen_assignors_v1 import state as old_state
from worker_agent.assignor import (
    SCHEDULED_REBALANCE_MAX_DELAY_MS,
    AssignmentResult,
    ConnectAssignor,
    GroupView,
    MemberView,
)
from worker_agent.assignors import EagerAssignor, IncrementalCooperativeAssignor
from worker_agent.assignors import balance as new_balance
from worker_agent.assignors import state as new_state

NEW_IC = IncrementalCooperativeAssignor()
FROZEN_IC = frozen_v1.IncrementalCooperativeAssignor()
NEW_EAGER = EagerAssignor()
OLD_EAGER = frozen_v1.EagerAssignor()

CONNECTORS = ["A", "B", "C", "AB", "D", "E", "F", "a", "connector-00000000000000000000000000000"]
STALE_CONNECTORS = ["Z", "Y", ""]
MEMBERS = [f"w{i}" for i in range(12)]
DEPARTED = ["g1", "g2", "g3", "g4"]
INSTANCES = ["i0", "i1", "i2", "i3", "i4", "i5"]
DELAYS: list[str | None] = [None, None, "0", "0", "1000", "5000", "300000", "-100", "soon"]

SINGLE_CASES = 3_000
HISTORIES = 600
LARGE_CASES = 30


# --- random inputs ------------------------------------------------------------------------------


def _catalogue(rng: random.Random, max_tasks: int = 8) -> dict[str, int]:
    names = rng.sample(CONNECTORS, rng.choice([0, 1, 2, 3, 3, 4, 5, 6]))
    out: dict[str, int] = {}
    for name in names:
        roll = rng.random()
        out[name] = 0 if roll < 0.15 else -1 if roll < 0.18 else rng.randint(1, max_tasks)
    return out


def _universe(rng: random.Random, catalogue: Mapping[str, int]) -> list[str | TaskId]:
    """The catalogue's resources plus stale ones (deleted connectors, tasks beyond the count)."""
    out: list[str | TaskId] = []
    for name, count in catalogue.items():
        out.append(name)
        out.extend(TaskId(name, t) for t in range(max(count, 0) + rng.choice([0, 0, 1, 2])))
    for name in rng.sample(STALE_CONNECTORS, rng.randint(0, 2)):
        if name or rng.random() < 0.3:
            out.append(name)
            out.extend(TaskId(name, t) for t in range(rng.randint(0, 3)))
    if out and rng.random() < 0.1:
        out.append(TaskId(rng.choice(list(catalogue) or ["A"]), -1))
    return out


def _as_set(items: Sequence[str | TaskId]) -> ResourceSet:
    return ResourceSet(
        frozenset(i for i in items if isinstance(i, str)),
        frozenset(i for i in items if isinstance(i, TaskId)),
    )


def _subset(
    rng: random.Random, universe: Sequence[str | TaskId], p: float | None = None
) -> ResourceSet:
    if not universe:
        return EMPTY
    p = rng.choice([0.0, 0.1, 0.3, 0.6, 1.0]) if p is None else p
    return _as_set([r for r in universe if rng.random() < p])


def _partition(
    rng: random.Random, universe: Sequence[str | TaskId], holders: Sequence[str], unowned: float
) -> dict[str, ResourceSet]:
    """Each resource to one random holder (or none, with probability `unowned`)."""
    parts: dict[str, list[str | TaskId]] = {h: [] for h in holders}
    for resource in universe:
        if holders and rng.random() >= unowned:
            parts[rng.choice(list(holders))].append(resource)
    return {h: _as_set(items) for h, items in parts.items()}


def _members(
    rng: random.Random, ids: Sequence[str], owned: Callable[[str], ResourceSet]
) -> list[MemberView]:
    out = [
        MemberView(
            m,
            instance_id=rng.choice([None, None, *INSTANCES]),
            member_epoch=rng.randint(0, 5),
            owned=owned(m),
        )
        for m in ids
    ]
    if out and rng.random() < 0.03:  # a duplicate member id: the last one wins, as a dict does
        out.append(replace(rng.choice(out), owned=owned("dup"), instance_id="i9"))
    rng.shuffle(out)
    return out


def _state(
    rng: random.Random, universe: Sequence[str | TaskId], ids: Sequence[str], now: int
) -> bytes:
    kind = rng.random()
    if kind < 0.2:
        return b""
    if kind < 0.25:
        return rng.choice([b"garbage", b"{}", b'{"version":2}', b"\xff\xfe", b"[]", b"null"])
    if kind < 0.28:  # decodes as "no state": a bad field
        return json.dumps({"version": 1, "deadline_ms": True, "held": []}).encode()
    holders = rng.sample(DEPARTED + list(ids) + ["nobody"], rng.randint(0, 4))
    if holders and rng.random() < 0.1:
        holders.append(holders[0])  # the same member twice
    held = [
        new_state.HeldShare(h, rng.choice([None, *INSTANCES]), _subset(rng, universe))
        for h in holders
    ]
    deadline = rng.choice([None, now - rng.randint(1, 5_000), now, now + rng.randint(1, 400_000)])
    instances = {
        m: rng.choice(INSTANCES)
        for m in rng.sample(DEPARTED + list(ids), rng.randint(0, len(DEPARTED) + len(ids)))
    }
    document = {
        "version": 1,
        "deadline_ms": deadline,
        "held": [
            {
                "member_id": s.member_id,
                "instance_id": s.instance_id,
                "resources": s.resources.to_json(),
            }
            for s in held
        ],
        "instances": instances,
    }
    return json.dumps(document).encode()


def _configs(rng: random.Random) -> dict[str, str]:
    delay = rng.choice(DELAYS)
    return {} if delay is None else {SCHEDULED_REBALANCE_MAX_DELAY_MS: delay}


def _view(
    catalogue: Mapping[str, int],
    members: Sequence[MemberView],
    target: Mapping[str, ResourceSet],
    state: bytes,
    now: int,
    configs: Mapping[str, str],
) -> GroupView:
    return GroupView(
        group_epoch=5,
        assignor_name="incremental_cooperative",
        assignor_version=2,
        members=tuple(members),
        catalogue=dict(catalogue),
        assignment_epoch=4,
        target=dict(target),
        assignor_state=state,
        configs=dict(configs),
        coordinator_time_ms=now,
    )


def _case(seed: int) -> GroupView:
    """One random group, including inconsistent leftovers."""
    rng = random.Random(seed)
    catalogue = _catalogue(rng)
    universe = _universe(rng, catalogue)
    present = rng.sample(MEMBERS, rng.choice([0, 1, 1, 2, 3, 4, 5, 6, 8]))
    departed = rng.sample(DEPARTED, rng.randint(0, 3))
    in_target = [m for m in present if rng.random() < 0.7] + departed
    if rng.random() < 0.6:
        target = _partition(rng, universe, in_target, unowned=rng.choice([0.0, 0.2, 0.6]))
    else:
        target = {m: _subset(rng, universe) for m in in_target}
    mode = rng.choice(["target", "subset", "random", "nothing", "mixed"])

    def owned(member: str) -> ResourceSet:
        share = target.get(member, EMPTY)
        if mode == "target":
            return share
        if mode == "subset":
            items: list[str | TaskId] = [*share.connectors, *share.tasks]
            return _as_set([r for r in items if rng.random() < 0.5])
        if mode == "random":
            return _subset(rng, universe)
        if mode == "nothing":
            return EMPTY
        return share | _subset(rng, universe, 0.2) if rng.random() < 0.5 else _subset(rng, universe)

    now = rng.choice([0, 1, 1_000, 10_000, 400_000])
    members = _members(rng, present, owned)
    return _view(
        catalogue, members, target, _state(rng, universe, present, now), now, _configs(rng)
    )


def _large_case(seed: int) -> GroupView:
    """A bigger group (tens of members, a few thousand resources): many levels of handing out,
    large surpluses."""
    rng = random.Random(seed)
    catalogue = {f"conn-{i:03d}": rng.randint(0, 120) for i in range(rng.randint(5, 40))}
    universe = _universe(rng, catalogue)
    present = [f"m{i:03d}" for i in rng.sample(range(200), rng.randint(1, 60))]
    departed = [f"d{i:03d}" for i in range(rng.randint(0, 8))]
    skew = rng.sample(present, min(len(present), rng.randint(1, 4)))
    holders = present + departed + skew * rng.randint(0, 20)  # some members hold far more
    target = _partition(rng, universe, holders, unowned=rng.choice([0.0, 0.05, 0.5]))
    target = {m: s for m, s in target.items() if rng.random() < 0.9}
    members = [
        MemberView(m, instance_id=rng.choice([None, f"inst-{m}"]), owned=target.get(m, EMPTY))
        for m in present
    ]
    now = 50_000
    state = _state(rng, universe, present, now)
    return _view(catalogue, members, target, state, now, _configs(rng))


# --- the frozen copy, with issue 13's rule -------------------------------------------------------

R = TypeVar("R", str, TaskId)
_FROZEN_BALANCED = old_incremental._balanced


def _place_only(shares: Mapping[str, frozenset[R]], pool: Iterable[R]) -> dict[str, frozenset[R]]:
    """Each resource of `pool`, in name order, to the member holding the fewest (ties by member
    id); nothing is taken from anyone."""
    heap = [(len(share), member) for member, share in shares.items()]
    heapq.heapify(heap)
    got: dict[str, set[R]] = {member: set() for member in shares}
    for resource in sorted(pool):
        count, member = heapq.heappop(heap)
        got[member].add(resource)
        heapq.heappush(heap, (count + 1, member))
    return {m: shares[m] | got[m] for m in shares}


def _balanced_with_the_delay_rule(
    shares: Mapping[str, ResourceSet],
    unassigned: ResourceSet,
    held: Iterable[old_state.HeldShare],
    members: Mapping[str, MemberView],
) -> dict[str, ResourceSet]:
    """The frozen `_balanced`, except while something is held (a delay runs): then place only."""
    held = tuple(held)
    if not held:
        return _FROZEN_BALANCED(shares, unassigned, held, members)
    to_place = unassigned - old_incremental._union(s.resources for s in held)
    connectors = _place_only({m: s.connectors for m, s in shares.items()}, to_place.connectors)
    tasks = _place_only({m: s.tasks for m, s in shares.items()}, to_place.tasks)
    return {m: ResourceSet(connectors[m], tasks[m]) for m in sorted(shares)}


def _as_lost_work(result: AssignmentResult) -> AssignmentResult:
    """A frozen copy's result, saying what its delay stands for: held-back lost work, its only
    kind of delay."""
    return replace(result, lost_work_delay_ms=result.scheduled_rebalance_delay_ms)


class _FrozenWithTheDelayRule(ConnectAssignor):
    """The frozen incremental cooperative assignor with issue 13's rule."""

    name = "incremental_cooperative"
    minimum_version = 1
    maximum_version = 2

    def assign(self, group: GroupView) -> AssignmentResult:
        with mock.patch.object(old_incremental, "_balanced", _balanced_with_the_delay_rule):
            return _as_lost_work(FROZEN_IC.assign(group))


OLD_IC = _FrozenWithTheDelayRule()


# --- comparing ----------------------------------------------------------------------------------


def _outcome(assignor: ConnectAssignor, group: GroupView) -> AssignmentResult | str:
    try:
        return assignor.assign(group)
    except Exception as error:  # both must fail alike
        return f"raised {type(error).__name__}"


def _assert_same(new: ConnectAssignor, old: ConnectAssignor, group: GroupView, label: str) -> None:
    expected = _outcome(old, group)
    actual = _outcome(new, group)
    assert actual == expected, f"{label}: the results differ\n  old: {expected}\n  new: {actual}"
    if isinstance(actual, AssignmentResult) and isinstance(expected, AssignmentResult):
        assert list(actual.members) == list(expected.members), f"{label}: member order differs"


def _both(group: GroupView, label: str) -> AssignmentResult:
    _assert_same(NEW_IC, OLD_IC, group, f"{label} incremental")
    _assert_same(NEW_EAGER, OLD_EAGER, group, f"{label} eager")
    return OLD_IC.assign(group)


# --- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", range(6))
def test_single_rounds_match_the_frozen_copy(chunk: int) -> None:
    per_chunk = SINGLE_CASES // 6
    differ = 0
    for seed in range(chunk * per_chunk, (chunk + 1) * per_chunk):
        group = _case(seed)
        result = _both(group, f"_case({seed})")
        if group.members and len(group.members) > 1:  # the same group in another member order
            _both(replace(group, members=group.members[::-1]), f"_case({seed}) reversed")
        _both(replace(group, assignor_state=result.assignor_state), f"_case({seed}) own state")
        frozen = _outcome(FROZEN_IC, group)
        if isinstance(frozen, AssignmentResult):
            frozen = _as_lost_work(frozen)
        if frozen != result:  # only where the rule applies, and only in who holds what
            assert isinstance(frozen, AssignmentResult), seed
            assert result.scheduled_rebalance_delay_ms > 0, seed
            assert (frozen.assignor_state, frozen.scheduled_rebalance_delay_ms) == (
                result.assignor_state,
                result.scheduled_rebalance_delay_ms,
            ), seed
            differ += 1
    assert differ > 0, "the delay rule no longer shows in these cases"


def test_large_rounds_match_the_frozen_copy() -> None:
    for seed in range(LARGE_CASES):
        group = _large_case(seed)
        result = _both(group, f"_large_case({seed})")
        following = replace(
            group,
            target=dict(result.members),
            assignor_state=result.assignor_state,
            coordinator_time_ms=group.coordinator_time_ms + 1,
        )
        _both(following, f"_large_case({seed}) next round")


def _history(seed: int) -> list[GroupView]:
    """Rounds of one group, each built from the previous round's (frozen) result."""
    rng = random.Random(seed)
    catalogue = _catalogue(rng, max_tasks=rng.choice([3, 8, 20]))
    configs = _configs(rng)
    now = rng.randint(0, 10_000)
    instance_of: dict[str, str | None] = {}
    present: list[str] = []
    departed: list[str] = []
    for m in rng.sample(MEMBERS, rng.randint(0, 4)):
        present.append(m)
        instance_of[m] = rng.choice([None, *INSTANCES])
    owned: dict[str, ResourceSet] = {}
    target: dict[str, ResourceSet] = {}
    state = b""
    views: list[GroupView] = []
    for _ in range(rng.randint(3, 12)):
        members = [
            MemberView(m, instance_id=instance_of[m], owned=owned.get(m, EMPTY)) for m in present
        ]
        rng.shuffle(members)
        group = _view(catalogue, members, target, state, now, configs)
        views.append(group)
        result = OLD_IC.assign(group)
        target, state = dict(result.members), result.assignor_state
        # Members converge onto the target, some only part-way (revocations not yet acknowledged).
        for m in present:
            mine = target.get(m, EMPTY)
            roll = rng.random()
            owned[m] = (
                mine
                if roll < 0.6
                else owned.get(m, EMPTY) | mine
                if roll < 0.8
                else owned.get(m, EMPTY)
            )
        # Something happens.
        for _ in range(rng.choice([0, 1, 1, 2])):
            event = rng.choice(["join", "leave", "return", "rejoin", "catalogue", "time", "config"])
            if event == "join":
                fresh = [m for m in MEMBERS if m not in present and m not in departed]
                if fresh:
                    m = rng.choice(fresh)
                    present.append(m)
                    instance_of[m] = rng.choice([None, *INSTANCES])
            elif event == "leave" and present:
                m = rng.choice(present)
                present.remove(m)
                departed.append(m)
                owned.pop(m, None)
            elif event == "return" and departed:  # the same member id comes back
                m = rng.choice(departed)
                departed.remove(m)
                present.append(m)
            elif event == "rejoin" and departed:  # a new member id with a departed instance id
                gone = rng.choice(departed)
                fresh = [m for m in MEMBERS if m not in present and m not in departed]
                if fresh and instance_of.get(gone):
                    m = rng.choice(fresh)
                    present.append(m)
                    instance_of[m] = instance_of[gone]
            elif event == "catalogue":
                catalogue = dict(catalogue)
                name = rng.choice(CONNECTORS)
                if name in catalogue and rng.random() < 0.4:
                    del catalogue[name]
                else:
                    catalogue[name] = rng.randint(0, 10)
            elif event == "time":
                now += rng.choice([1, 500, 4_000, 300_001])
            else:
                configs = _configs(rng)
        now += rng.choice([0, 10, 1_000])
    return views


def test_multi_round_histories_match_the_frozen_copy() -> None:
    rounds = 0
    for seed in range(HISTORIES):
        for k, group in enumerate(_history(seed)):
            _both(group, f"_history({seed})[{k}]")
            rounds += 1
    assert rounds > HISTORIES * 3


def test_balance_and_quotas_match_the_frozen_copy() -> None:
    for seed in range(1_000):
        rng = random.Random(seed)
        ids = rng.sample(MEMBERS, rng.randint(0, 8))
        universe: list[str] = [f"r{i:02d}" for i in range(rng.randint(0, 40))]
        shares = {m: frozenset(r for r in universe if rng.random() < 0.2) for m in ids}
        unassigned = [r for r in universe if rng.random() < 0.3] * rng.choice([1, 2])
        running = {m: frozenset(r for r in universe if rng.random() < 0.5) for m in ids}
        assert new_balance.balance(shares, unassigned, running) == old_balance.balance(
            shares, unassigned, running
        ), seed
        counts = {m: rng.randint(0, 9) for m in ids}
        total = rng.randint(0, 80)
        assert new_balance.quotas(counts, total) == old_balance.quotas(counts, total), seed
        tasks = {m: frozenset(TaskId(r[:2], len(r)) for r in s) for m, s in shares.items()}
        assert new_balance.balance(tasks, [], {}) == old_balance.balance(tasks, [], {}), seed


def test_the_state_codec_matches_the_frozen_copy() -> None:
    for seed in range(1_000):
        rng = random.Random(seed)
        catalogue = _catalogue(rng)
        universe = _universe(rng, catalogue)
        now = rng.randint(0, 1_000)
        blob = _state(rng, universe, rng.sample(MEMBERS, 3), now)
        new, old = new_state.decode_state(blob), old_state.decode_state(blob)
        assert (new.deadline_ms, dict(new.instances)) == (old.deadline_ms, dict(old.instances))
        assert [(s.member_id, s.instance_id, s.resources) for s in new.held] == [
            (s.member_id, s.instance_id, s.resources) for s in old.held
        ], seed
        assert new.held_resources() == old.held_resources(), seed
        assert new_state.encode_state(new) == old_state.encode_state(old), seed
