"""Event retention in the coordinator (DESIGN 3.20), against real PostgreSQL and SQLite: the
pruner deletes only old events that no registered export needs (its latest run's start, its
unfilled ids), nothing without a registration unless forced, in bounded batches, under a lease
that one coordinator holds at a time, and raises the floor, which never goes down; the
`audit-exports` command; and `serve` running it (flags, metrics, the lease given up on SIGTERM)."""

from __future__ import annotations

import re
import threading
import urllib.request
from collections.abc import Callable, Collection, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from coordinator_svc.cli import main
from coordinator_svc.runtime.event_pruner import EventPruner, RetentionPolicy
from coordinator_svc.store import SqlStore, schema
from tests.deploy.local import wait_for
from tests.support.coordinator import CoordinatorProcess, free_port

OLD = datetime.now(UTC) - timedelta(days=30)
RETENTION_MS = 86_400_000  # a day


@pytest.fixture(params=["postgresql", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database: the PostgreSQL fixture, or an embedded SQLite file."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'coordinator.db'}"
    else:
        url = str(request.getfixturevalue("database_url"))
    with SqlStore(url, "migrator", "-") as store:
        store.migrate()
    return url


@pytest.fixture
def open_store(store_url: str) -> Iterator[Callable[..., SqlStore]]:
    opened: list[SqlStore] = []

    def open_(owner_id: str = "coord-a", **kw: Any) -> SqlStore:
        store = SqlStore(store_url, owner_id, "-", **kw)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


def add_events(url: str, count: int, young: Collection[int] = ()) -> None:
    """Events 1..count (ids from the sequence), 30 days old but those numbered in `young`."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            for n in range(1, count + 1):
                at = datetime.now(UTC) if n in young else OLD + timedelta(seconds=n)
                conn.execute(
                    sa.insert(schema.events).values(
                        occurred_at=at,
                        at_ms=int(at.timestamp() * 1000),
                        group_id="g",
                        group_epoch=n,
                        event_type="MEMBER_JOINED",
                        member_id="m",
                        payload={"n": n},
                    )
                )
    finally:
        engine.dispose()


def register(url: str, name: str, since: int, until: int, lowest_unfilled: int) -> None:
    """What an export run appends after committing (as `audit_export.source.record_progress`)."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.insert(schema.audit_export_progress).values(
                    export_name=name,
                    since_event_id=since,
                    until_event_id=until,
                    lowest_unfilled_id=lowest_unfilled,
                    at=datetime.now(UTC),
                )
            )
    finally:
        engine.dispose()


def event_ids(url: str) -> list[int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [int(i) for i in conn.scalars(sa.select(schema.events.c.id).order_by("id"))]
    finally:
        engine.dispose()


def test_nothing_is_pruned_without_a_registered_export_unless_forced(
    store_url: str, open_store: Callable[..., SqlStore]
) -> None:
    add_events(store_url, 12)
    store = open_store()
    waiting = EventPruner(store.retention, RetentionPolicy(RETENTION_MS))
    assert waiting.look().deleted == 0
    assert event_ids(store_url) == list(range(1, 13))
    forced = EventPruner(store.retention, RetentionPolicy(RETENTION_MS, without_export=True))
    done = forced.look()
    assert (done.deleted, done.held_lease) == (12, True)
    assert event_ids(store_url) == []
    assert store.retention.pruning().pruned_through_event_id == 12


def test_the_pruner_keeps_what_each_exports_latest_run_needs_and_young_events(
    store_url: str, open_store: Callable[..., SqlStore]
) -> None:
    add_events(store_url, 30, young={3})
    # Export a: an older run, then its latest (events 11..20, id 14 missing from its snapshot);
    # export b: its latest run started at 18.
    register(store_url, "a", 0, 10, 11)
    register(store_url, "a", 10, 20, 14)
    register(store_url, "b", 18, 25, 26)
    store = open_store()
    pruner = EventPruner(store.retention, RetentionPolicy(RETENTION_MS))
    look = pruner.look()
    assert (look.deleted, look.ceiling) == (9, 10)  # 1..10 but the young 3
    assert event_ids(store_url) == [3, *range(11, 31)]
    assert store.retention.pruning().pruned_through_event_id == 10
    stats = pruner.stats()
    assert (stats.pruned_total, stats.pruned_through_event_id, stats.holds_lease) == (9, 10, True)
    assert set(stats.registered_at_s) == {"a", "b"}
    assert stats.oldest_event_at_s is not None  # event 3's, now
    assert stats.oldest_event_at_s > (datetime.now(UTC) - timedelta(minutes=5)).timestamp()

    # b is forgotten; a's next run still needs its unfilled 14 and what follows its start.
    assert store.retention.remove("b") == 1
    register(store_url, "a", 20, 30, 14)
    assert pruner.look().ceiling == 13
    assert event_ids(store_url) == [3, *range(14, 31)]
    # A new export's first run (from 0) prunes nothing more, and the floor never goes down.
    register(store_url, "c", 0, 30, 31)
    assert pruner.look().deleted == 0
    assert store.retention.pruning().pruned_through_event_id == 13
    assert [r.export_name for r in store.retention.registrations()] == ["a", "c"]


def test_a_batch_deletes_at_most_its_limit(
    store_url: str, open_store: Callable[..., SqlStore]
) -> None:
    add_events(store_url, 7)
    retention = open_store().retention
    assert retention.take_lease()
    cutoff = datetime.now(UTC) - timedelta(days=1)
    sizes = []
    while (batch := retention.prune_batch(6, cutoff, 4)) is not None and batch.deleted:
        sizes.append((batch.deleted, batch.highest_deleted, batch.pruned_through_event_id))
    assert sizes == [(4, 4, 4), (2, 6, 6)]
    assert event_ids(store_url) == [7]


def test_one_coordinator_prunes_at_a_time(
    store_url: str, open_store: Callable[..., SqlStore]
) -> None:
    add_events(store_url, 5)
    cutoff = datetime.now(UTC) - timedelta(days=1)
    a, b = open_store("coord-a").retention, open_store("coord-b").retention
    assert a.take_lease() and not b.take_lease()
    assert b.prune_batch(5, cutoff, 10) is None
    assert event_ids(store_url) == [1, 2, 3, 4, 5]
    a.release_lease()
    assert b.take_lease() and not a.take_lease()
    assert a.prune_batch(5, cutoff, 10) is None
    # A lease that lapses is taken over, and the lapsed holder's batches are refused.
    b.release_lease()
    short_a, short_b = open_store("coord-a", lease_ms=300), open_store("coord-b", lease_ms=300)
    assert short_a.retention.take_lease()

    def lapsed() -> bool:
        until = short_a.retention.pruning().lease_until
        return until is not None and until < datetime.now(UTC) - timedelta(milliseconds=50)

    wait_for("the lease to lapse", lapsed, 5)
    assert short_a.retention.prune_batch(5, cutoff, 10) is None  # not renewed once lapsed
    assert short_b.retention.take_lease()
    assert short_a.retention.prune_batch(5, cutoff, 10) is None
    assert event_ids(store_url) == [1, 2, 3, 4, 5]


def test_of_racing_coordinators_exactly_one_takes_the_lease(database_url: str) -> None:
    with SqlStore(database_url, "migrator", "-") as store:
        store.migrate()
    stores = [SqlStore(database_url, f"coord-{i}", "-") for i in range(4)]
    taken: list[str] = []
    start = threading.Barrier(len(stores))

    def race(store: SqlStore) -> None:
        start.wait()
        for _ in range(10):
            if store.retention.take_lease():
                taken.append(store.owner_id)

    threads = [threading.Thread(target=race, args=(s,)) for s in stores]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(set(taken)) == 1 and len(taken) == 10, taken
    finally:
        for s in stores:
            s.close()


def test_audit_exports_lists_and_removes_registrations(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    register(store_url, "nightly", 0, 40, 41)
    register(store_url, "nightly", 40, 90, 77)
    assert main(["audit-exports", "list", "--database-url", store_url]) == 0
    out = capsys.readouterr().out
    assert "nightly: latest run exported events 41..90 (unfilled ids: from 77)" in out
    assert "2 run(s)" in out and "up to 40 " in out and "pruned through event id 0" in out
    assert main(["audit-exports", "remove", "nightly", "--database-url", store_url]) == 0
    assert "removed 'nightly' (2 recorded run(s))" in capsys.readouterr().out
    assert main(["audit-exports", "remove", "nightly", "--database-url", store_url]) == 1
    assert "no export is registered as 'nightly'" in capsys.readouterr().err
    assert main(["audit-exports", "list", "--database-url", store_url]) == 0
    assert "no audit export registered" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, problem",
    [
        (["--prune-events-without-export"], "needs --event-retention-ms"),
        (["--event-retention-ms", "-1"], "--event-retention-ms must be"),
        (["--event-retention-ms", "1", "--event-prune-rows-per-s", "20000"], "between 1 and"),
        (["--event-retention-ms", "1", "--event-prune-interval-ms", "5"], "between 100"),
    ],
)
def test_serve_refuses_unusable_retention_flags(
    flags: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", *flags]) == 2
    assert problem in capsys.readouterr().err


def _metric(port: int, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return None if m is None else float(m.group(1))


def test_serve_prunes_reports_it_and_gives_the_lease_up_on_sigterm(
    database_url: str, tmp_path: Path
) -> None:
    with SqlStore(database_url, "migrator", "-") as store:
        store.migrate()
    add_events(database_url, 40, young={40})
    register(database_url, "nightly", 35, 40, 41)
    metrics = free_port()
    log = tmp_path / "coordinator.log"
    coordinator = CoordinatorProcess(
        database_url,
        *("--event-retention-ms", str(RETENTION_MS), "--event-prune-interval-ms", "200"),
        *("--metrics-port", str(metrics), "--metrics-host", "127.0.0.1"),
        log_path=log,
    )
    coordinator.start()
    try:
        wait_for("35 pruned", lambda: _metric(metrics, "coordinator_events_pruned_total") == 35, 15)
        assert _metric(metrics, "coordinator_events_pruned_through_id") == 35
        assert _metric(metrics, "coordinator_event_pruner_lease") == 1
        age = _metric(metrics, "coordinator_audit_export_registration_age_seconds")
        assert age is not None and 0 <= age < 60
        oldest = _metric(metrics, "coordinator_events_oldest_age_seconds")
        assert oldest is not None and oldest > 20 * 86_400  # event 36's: 30 days old
        assert event_ids(database_url) == list(range(36, 41))
        assert coordinator.terminate() == 0
    finally:
        coordinator.close()
    assert '"event":"events_pruned"' in log.read_text().replace(" ", "")
    with SqlStore(database_url, "reader", "-") as store:
        assert store.retention.pruning().owner_id is None  # released
