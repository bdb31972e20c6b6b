"""Fold a history in several runs, as the incremental export does (the state carried through
its JSON form, the runs' rows merged as `incremental.current` merges export dates), to compare
with one fold over all of it."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

from audit_export import incremental
from audit_export.fold import Event, GroupState, Outputs, fold_group

TABLES = ("rebalances", "lost_resources", "connector_moves", "violations", "ownership")


def fold_in_runs(
    events: list[Event], cuts: list[int], as_of_ms: int, grace_ms: int
) -> dict[str, list[str]]:
    """Fold `events` in runs cut before each index of `cuts`, carrying each group's state through
    JSON, and merge the runs' rows as `incremental.current` does."""
    bounds = [0, *cuts, len(events)]
    states: dict[str, str] = {}
    runs: list[Outputs] = []
    for lo, hi in itertools.pairwise(bounds):
        part = events[lo:hi]
        run = Outputs()
        for group in sorted({*states, *(e.group_id for e in part)}):
            state = GroupState.from_json(states[group]) if group in states else GroupState(group)
            mine = [e for e in part if e.group_id == group]
            got, new_state = fold_group(state, mine, as_of_ms=as_of_ms, grace_ms=grace_ms)
            for name in TABLES:
                getattr(run, name).extend(getattr(got, name))
            states[group] = new_state.to_json()
        runs.append(run)
    merged: dict[str, list[str]] = {}
    for name in TABLES:
        keys = incremental.KEYS[name]
        latest: dict[str, dict[str, Any]] = {}
        for i, run in enumerate(runs):
            for row in getattr(run, name):
                if row["open"] and i < len(runs) - 1:
                    continue  # only the last run's open rows hold
                latest[json.dumps([row[k] for k in keys])] = row  # a later run's row wins
        merged[name] = sorted(json.dumps(r, sort_keys=True) for r in latest.values())
    return merged


def check_every_split(events: list[Event], as_of_ms: int, grace_ms: int, samples: int = 40) -> None:
    """Folding `events` cut anywhere (every single point, and `samples` random sets of points)
    gives what one fold gives."""
    whole = fold_in_runs(events, [], as_of_ms, grace_ms)
    for cut in range(1, len(events)):
        assert fold_in_runs(events, [cut], as_of_ms, grace_ms) == whole, (
            f"split before event {events[cut].id}"
        )
    rng = random.Random(15)
    for _ in range(samples):
        cuts = sorted(rng.sample(range(1, len(events)), rng.randint(2, 6)))
        assert fold_in_runs(events, cuts, as_of_ms, grace_ms) == whole, f"split at {cuts}"


def assert_any_cuts_fold_alike(events: list[Event], cut_lists: Any, grace_ms: int) -> None:
    """Folding `events` in runs cut where `cut_lists` (a hypothesis `DataObject`) draws equals
    folding them whole (the split-point property of the incremental export)."""
    from hypothesis import strategies as st

    as_of = events[-1].at_ms + 1_000
    whole = fold_in_runs(events, [], as_of, grace_ms)
    if len(events) > 1:
        cuts = cut_lists.draw(
            st.lists(st.integers(1, len(events) - 1), max_size=4, unique=True).map(sorted)
        )
        assert fold_in_runs(events, cuts, as_of, grace_ms) == whole
