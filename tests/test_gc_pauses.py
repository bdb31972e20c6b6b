"""The coordinator's garbage-collector settings and pause metric (runtime/gc_pauses.py)."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Histogram

from coordinator_svc.runtime import gc_pauses


@pytest.fixture
def pauses() -> Histogram:
    return Histogram("test_gc_pause_seconds", "t", ["generation"], registry=CollectorRegistry())


@pytest.fixture
def restored() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()


def _count(h: Histogram, generation: str) -> float:
    for metric in h.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count") and sample.labels["generation"] == generation:
                return sample.value
    return 0.0


def test_every_collection_is_observed_by_generation(pauses: Histogram) -> None:
    observer = gc_pauses.observe(pauses)
    try:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    finally:
        gc_pauses.stop_observing(observer)
    assert _count(pauses, "0") >= 1
    assert _count(pauses, "2") >= 2
    assert observer not in gc.callbacks


def test_a_slow_pause_is_logged_once_a_minute(
    pauses: Histogram,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    restored: None,
) -> None:
    observer = gc_pauses.PauseObserver(pauses)
    clock = iter([0.0, 0.5, 1.0, 1.5, 70.0, 70.5])  # start/stop pairs: 0.5 s pauses
    monkeypatch.setattr(gc_pauses.time, "perf_counter", lambda: next(clock))
    with caplog.at_level(logging.WARNING, logger=gc_pauses.__name__):
        for _ in range(3):
            observer("start", {"generation": 2})
            observer("stop", {"generation": 2, "collected": 0})
    lines = [r for r in caplog.records if "garbage collection" in r.getMessage()]
    assert len(lines) == 2  # the second pause, 1 s after the first, only counted
    assert lines[1].fields["slow_pauses_not_logged"] == 1  # type: ignore[attr-defined]
    assert lines[0].fields["pause_ms"] == 500  # type: ignore[attr-defined]
    assert _count(pauses, "2") == 3


def test_tune_freezes_the_start_up_heap(restored: None) -> None:
    thresholds = gc.get_threshold()
    gc_pauses.tune()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == thresholds


@pytest.mark.parametrize(
    ("generation", "pause_s", "collected", "freezes"),
    [
        (2, 0.05, 0, True),  # long, freed nothing: the survivors are frozen
        (2, 0.05, 5_000, False),  # long but freed much: garbage is still being made
        (2, 0.005, 0, False),  # short
        (1, 0.05, 0, False),  # not a full collection
    ],
)
def test_a_long_full_collection_that_freed_little_freezes_its_survivors(
    pauses: Histogram,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    restored: None,
    generation: int,
    pause_s: float,
    collected: int,
    freezes: bool,
) -> None:
    gc.unfreeze()
    kept = [[i] for i in range(10_000)]  # tracked survivors
    observer = gc_pauses.PauseObserver(pauses)
    clock = iter([1.0, 1.0 + pause_s])
    monkeypatch.setattr(gc_pauses.time, "perf_counter", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger=gc_pauses.__name__):
        observer("start", {"generation": generation})
        observer("stop", {"generation": generation, "collected": collected})
    assert (observer.frozen_times == 1) is freezes
    assert (gc.get_freeze_count() >= len(kept)) is freezes
    assert any(r.getMessage().startswith("froze") for r in caplog.records) is freezes


def test_survivors_are_frozen_at_most_every_five_seconds(
    pauses: Histogram, monkeypatch: pytest.MonkeyPatch, restored: None
) -> None:
    observer = gc_pauses.PauseObserver(pauses)
    clock = iter([1.0, 1.05, 3.0, 3.05, 6.1, 6.15])  # three long, fruitless collections
    monkeypatch.setattr(gc_pauses.time, "perf_counter", lambda: next(clock))
    for _ in range(3):
        observer("start", {"generation": 2})
        observer("stop", {"generation": 2, "collected": 0})
    assert observer.frozen_times == 2  # at 1.05 and 6.15, not at 3.05


def test_the_frozen_heap_is_handed_back_ten_minutes_after_the_first_freeze(
    pauses: Histogram,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    restored: None,
) -> None:
    """So that a cycle frozen while alive is freed by a later collection: nothing is frozen
    for good (the module docstring)."""
    gc.unfreeze()
    kept = [[i] for i in range(10_000)]
    observer = gc_pauses.PauseObserver(pauses)
    times = [1.0, 1.05, 300.0, 300.05, 600.0, 600.01, 601.0, 601.06, 1_300.0, 1_300.01]
    clock = iter(times)
    monkeypatch.setattr(gc_pauses.time, "perf_counter", lambda: next(clock))

    def collection(generation: int) -> None:
        observer("start", {"generation": generation})
        observer("stop", {"generation": generation, "collected": 0})

    with caplog.at_level(logging.INFO, logger=gc_pauses.__name__):
        collection(2)  # 50 ms, fruitless: frozen at 1.05
        assert observer.frozen_times == 1 and gc.get_freeze_count() >= len(kept)
        collection(2)  # 300.05: a second freeze, but the thaw still counts from 1.05
        assert observer.frozen_times == 2 and observer.thawed_times == 0
        collection(0)  # 600.01: 599 s after the first freeze, not yet
        assert observer.thawed_times == 0
        collection(0)  # 601.06: any collection's end hands the frozen heap back
        assert observer.thawed_times == 1
        assert gc.get_freeze_count() == 0
        collection(0)  # nothing frozen since: no thaw
    assert observer.thawed_times == 1
    assert any(r.getMessage().startswith("handed the frozen heap") for r in caplog.records)
