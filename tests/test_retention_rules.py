"""Event retention's rules, pure (DESIGN 3.20 "Event retention bounded by the export"): the prune
ceiling against a brute-force reading of what each export needs, the pacing, and, across the two
packages, that whatever the pruner may delete under the ceiling of an export's latest recorded
run is never read by a re-run of that export's latest date or by its next date (and that a run
which does not refuse never reads a pruned id)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit_export.watermark import (
    PrunedRangeError,
    RunRecord,
    check_not_pruned,
    plan_range,
    progress_row,
    still_unfilled,
)
from coordinator_svc.runtime.retention_rules import (
    MAX_ROWS_PER_S,
    NO_ID_BOUND,
    batch_rows,
    pause_after_batch,
    prune_ceiling,
)


@dataclass(frozen=True)
class Position:
    since_event_id: int
    lowest_unfilled_id: int


positions = st.builds(
    lambda since, extra, unfilled: Position(since, unfilled if unfilled else since + extra + 1),
    st.integers(0, 60),
    st.integers(0, 20),
    st.one_of(st.none(), st.integers(1, 80)),
)


def needed(p: Position, event_id: int) -> bool:
    """Does the export whose latest run is `p` still read `event_id` (a re-run of its latest
    date reads every id after its start; its unfilled ids are looked for again)?"""
    return event_id > p.since_event_id or event_id >= p.lowest_unfilled_id


@given(st.lists(positions, max_size=4), st.booleans())
def test_the_ceiling_is_the_highest_id_below_which_no_export_needs_anything(
    latest: list[Position], without_export: bool
) -> None:
    ceiling = prune_ceiling(latest, without_export)
    if not latest:
        assert ceiling == (NO_ID_BOUND if without_export else None)
        return
    assert ceiling is not None  # registrations bound it whatever the flag says
    assert not any(needed(p, i) for p in latest for i in range(1, ceiling + 1))
    assert ceiling == 0 or ceiling >= 1
    assert any(needed(p, ceiling + 1) for p in latest)  # the highest such id


def test_an_unfilled_id_and_everything_after_it_is_kept() -> None:
    assert prune_ceiling([Position(since_event_id=50, lowest_unfilled_id=42)], False) == 41
    assert prune_ceiling([Position(50, 51), Position(30, 31)], False) == 30
    assert prune_ceiling([Position(0, 1)], True) == 0  # a first run: nothing to prune


@given(
    st.integers(1, MAX_ROWS_PER_S * 2),
    st.lists(st.tuples(st.integers(0, 5000), st.floats(0, 0.5)), max_size=20),
)
def test_the_pauses_hold_the_pruner_to_its_rate(
    rows_per_s: int, batches: list[tuple[int, float]]
) -> None:
    rate = min(rows_per_s, MAX_ROWS_PER_S)
    assert 1 <= batch_rows(rows_per_s) <= max(1, rate // 10)
    elapsed = deleted = 0.0
    for rows, took in batches:
        pause = pause_after_batch(rows, took, rows_per_s)
        assert pause >= 0
        elapsed += took + pause
        deleted += rows
        assert deleted <= rate * elapsed + 1e-6


# --- across the packages: the export's progress and the pruner's ceiling ------------------------

DATES = [f"2026-02-{d:02d}" for d in range(1, 10)]


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[RunRecord], int]:
    """Runs of consecutive export dates (sometimes the latest re-run), each missing arbitrary
    ids of what it looked for, as `job.run_export` records them; and the database's max id."""
    runs: list[RunRecord] = []
    max_id = 0
    for i in range(draw(st.integers(1, 5))):
        date = DATES[i]
        for _ in range(draw(st.integers(1, 2))):  # a second pass re-runs the date
            max_id += draw(st.integers(0, 15))
            rng = plan_range(runs, date, max_id, None)
            looked_for = list(range(rng.since_event_id + 1, rng.until_event_id + 1))
            looked_for += list(rng.recheck)
            missing = draw(st.lists(st.sampled_from(looked_for), max_size=4)) if looked_for else []
            unfilled = still_unfilled(
                rng, missing, (i + 1) * 1000, draw(st.sampled_from([0, 10**9]))
            )
            run = RunRecord(
                date,
                rng.since_event_id,
                rng.until_event_id,
                max_id,
                "",
                0,
                rechecked=rng.recheck,
                unfilled=unfilled,
            )
            runs = [r for r in runs if r.export_date != date] + [run]
    return runs, max_id


def reads(rng_since: int, rng_until: int, recheck: tuple[int, ...]) -> set[int]:
    return set(range(rng_since + 1, rng_until + 1)) | set(recheck)


@settings(max_examples=300)
@given(histories(), st.integers(0, 10), st.data())
def test_what_the_pruner_may_delete_no_latest_or_next_run_needs(
    history: tuple[list[RunRecord], int], more: int, data: st.DataObject
) -> None:
    runs, max_id = history
    ceiling = prune_ceiling([progress_row(runs[-1])], without_export=False)
    assert ceiling is not None
    floor = data.draw(st.integers(0, ceiling), label="pruned through")
    latest, following = runs[-1].export_date, DATES[DATES.index(runs[-1].export_date) + 1]
    for date in (latest, following):
        rng = plan_range(runs, date, max_id + more, None)
        assert (
            min(reads(rng.since_event_id, rng.until_event_id, rng.recheck), default=ceiling + 1)
            > ceiling
        )
        check_not_pruned(rng, floor)  # never refused
    # Any date, older ones included: a run that does not refuse reads no pruned id.
    for run in runs:
        rng = plan_range(runs, run.export_date, max_id + more, None)
        try:
            check_not_pruned(rng, floor)
        except PrunedRangeError:
            continue
        assert all(i > floor for i in reads(rng.since_event_id, rng.until_event_id, rng.recheck))


def test_an_older_date_whose_events_were_pruned_refuses_and_says_what_to_do() -> None:
    runs = [
        RunRecord(DATES[0], 0, 10, 10, "", 10),
        RunRecord(DATES[1], 10, 25, 25, "", 15),
    ]
    ceiling = prune_ceiling([progress_row(runs[-1])], without_export=False)
    assert ceiling == 10
    with pytest.raises(PrunedRangeError, match=r"pruned events through id 10.*--since-event-id 10"):
        check_not_pruned(plan_range(runs, DATES[0], 30, None), 10)
    check_not_pruned(plan_range(runs, DATES[1], 30, None), 10)  # the latest date re-runs


def test_the_progress_keeps_the_ids_a_run_looks_for_again() -> None:
    run = RunRecord(DATES[1], 10, 25, 25, "", 12, rechecked=(7, 9), unfilled=((9, 1), (20, 2)))
    assert progress_row(run).lowest_unfilled_id == 7
    assert progress_row(RunRecord(DATES[1], 10, 25, 25, "", 15)).lowest_unfilled_id == 26
