"""The event pruner (DESIGN 3.20 "Event retention bounded by the export"): a background thread
that `serve` starts when `--event-retention-ms` is set. Every coordinator runs one; the one
holding the pruning lease (`store.retention`) deletes, in short batches of their own
transactions and at most `--event-prune-rows-per-s` rows a second (10,000 at most), the events
older than the retention that no registered audit export still needs (`retention_rules`), and
records the highest id it pruned. Every pruner also reads, at each look, what the metrics report:
the oldest event's time, each registration's latest run, the floor.

A look happens every `interval_s`; one that finds prunable events goes on batch after batch
until a batch deletes less than a full batch (nothing more is prunable now), the lease is lost,
or the coordinator stops. Database failures are logged and the next look tries again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from connect_protocol.logs import fields

from ..metrics import RetentionStats
from ..store.errors import StoreUnavailable
from ..store.retention import Registration, RetentionStore
from .retention_rules import MAX_ROWS_PER_S, batch_rows, pause_after_batch, prune_ceiling

log = logging.getLogger("coordinator.event_pruner")

#: During a long run of batches, progress is logged at most this often (seconds).
PROGRESS_LOG_S = 60.0
#: During a long run of batches, the registrations (and so the ceiling) are read again at least
#: this often (seconds): a removed export or a new run counts within it. Reading them before
#: the batches rather than in them is safe: a new run only ever raises an export's ceiling, and
#: a re-run of an older date reads its pinned snapshot (DESIGN 3.20; README "Event retention").
CEILING_REFRESH_S = 1.0


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """What `serve`'s flags ask of the pruner.

    Attributes:
        retention_ms: events older than this may be pruned (> 0).
        without_export: `--prune-events-without-export`: with no audit export registered,
            prune by age alone (otherwise nothing is pruned then).
        rows_per_s: at most this many events deleted per second (1 .. MAX_ROWS_PER_S).
        interval_s: how often the pruner looks for prunable events (and refreshes its metrics).
    """

    retention_ms: int
    without_export: bool = False
    rows_per_s: int = MAX_ROWS_PER_S
    interval_s: float = 30.0

    def __post_init__(self) -> None:
        if self.retention_ms <= 0:
            raise ValueError("retention_ms must be positive (0 means keep events forever)")
        if not 1 <= self.rows_per_s <= MAX_ROWS_PER_S:
            raise ValueError(f"rows_per_s must be between 1 and {MAX_ROWS_PER_S}")
        if self.interval_s <= 0:
            raise ValueError("interval_s must be positive")


@dataclass(frozen=True, slots=True)
class LookResult:
    """What one look did: events deleted, whether this process held the lease, and the
    ceiling it pruned under (None: nothing may be pruned)."""

    deleted: int
    held_lease: bool
    ceiling: int | None


class EventPruner:
    """See the module docstring. `now` is the clock of the retention's cutoff (UTC)."""

    def __init__(
        self,
        store: RetentionStore,
        policy: RetentionPolicy,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._store = store
        self._policy = policy
        self._now = now
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pruned_total = 0
        self._stats = RetentionStats()
        self._warned_unregistered = False

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="event-pruner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the batch in flight, and give the lease up."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self._store.release_lease()
        except StoreUnavailable as error:
            log.warning("could not release the pruning lease (it lapses by itself): %s", error)

    def stats(self) -> RetentionStats:
        """What the metrics report (as of the last look)."""
        with self._lock:
            return self._stats

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.look()
            except StoreUnavailable as error:
                log.warning(
                    "event pruning: database unavailable, trying again in %.0f s: %s",
                    self._policy.interval_s,
                    error,
                    extra=fields(event="event_pruning_failed"),
                )
            except Exception:
                log.exception(
                    "event pruning failed; trying again in %.0f s",
                    self._policy.interval_s,
                    extra=fields(event="event_pruning_failed"),
                )
            self._stop.wait(self._policy.interval_s)

    # --- one look ----------------------------------------------------------------------------

    def look(self) -> LookResult:
        """Refresh what the metrics report; if this process holds (or can take) the pruning
        lease, prune batch after batch until nothing more is prunable now."""
        held = self._store.take_lease()
        deleted, ceiling = self._prune() if held else (0, None)
        self._refresh(held)
        return LookResult(deleted, held, ceiling)

    def _ceiling(self, registrations: list[Registration]) -> int | None:
        ceiling = prune_ceiling(registrations, self._policy.without_export)
        if ceiling is None and not self._warned_unregistered:
            self._warned_unregistered = True
            log.warning(
                "event retention is on (%d ms) but no audit export is registered: nothing is "
                "pruned until an export run records its progress (or start with "
                "--prune-events-without-export)",
                self._policy.retention_ms,
                extra=fields(event="event_pruning_waits_for_export"),
            )
        elif ceiling is not None:
            self._warned_unregistered = False
        return ceiling

    def _prune(self) -> tuple[int, int | None]:
        policy = self._policy
        limit = batch_rows(policy.rows_per_s)
        started = time.monotonic()
        logged_at = started
        deleted = 0
        floor = 0
        ceiling: int | None = None
        read_at = -math.inf
        while not self._stop.is_set():
            if time.monotonic() - read_at >= CEILING_REFRESH_S:
                ceiling = self._ceiling(self._store.registrations())
                read_at = time.monotonic()
            if ceiling is None or ceiling <= 0:
                break
            cutoff = self._now() - timedelta(milliseconds=policy.retention_ms)
            began = time.monotonic()
            batch = self._store.prune_batch(ceiling, cutoff, limit)
            if batch is None:  # the lease lapsed or was taken over meanwhile
                break
            deleted += batch.deleted
            floor = batch.pruned_through_event_id
            with self._lock:  # the metrics follow every batch, not only each look
                self._pruned_total += batch.deleted
                self._stats = replace(
                    self._stats,
                    pruned_total=self._pruned_total,
                    pruned_through_event_id=floor,
                    holds_lease=True,
                )
            if batch.deleted < limit:
                break
            now = time.monotonic()
            if now - logged_at >= PROGRESS_LOG_S:
                logged_at = now
                self._log_pruned("pruning events", deleted, floor, ceiling, now - started)
            self._stop.wait(pause_after_batch(batch.deleted, now - began, policy.rows_per_s))
        if deleted:
            self._log_pruned("pruned events", deleted, floor, ceiling, time.monotonic() - started)
        return deleted, ceiling

    def _log_pruned(
        self, what: str, deleted: int, floor: int, ceiling: int | None, seconds: float
    ) -> None:
        log.info(
            "%s: %d deleted in %.1f s, pruned through event id %d",
            what,
            deleted,
            seconds,
            floor,
            extra=fields(
                event="events_pruned",
                deleted=deleted,
                pruned_through_event_id=floor,
                ceiling=ceiling,
                seconds=round(seconds, 1),
                retention_ms=self._policy.retention_ms,
            ),
        )

    def _refresh(self, held: bool) -> None:
        registrations = self._store.registrations()
        state = self._store.pruning()
        oldest = self._store.oldest_event_at()
        with self._lock:
            self._stats = RetentionStats(
                pruned_total=self._pruned_total,
                pruned_through_event_id=state.pruned_through_event_id,
                oldest_event_at_s=None if oldest is None else oldest.timestamp(),
                registered_at_s={r.export_name: r.at.timestamp() for r in registrations},
                holds_lease=held,
            )
