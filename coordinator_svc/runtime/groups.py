"""GroupManager: ownership of groups (one lease per group, DESIGN 3.16), their in-memory state,
serialised execution of core handlers, persistence before answering, and timers.

A request runs under its group's lock: the core handler computes records from the in-memory state;
the records are applied (replay asserts the invariants), then committed in one transaction that
the database refuses unless this process still holds the group's lease. Only then is the response
sent and are timers changed. A failed commit drops the in-memory copy; the next request reloads.
Requests that produce no records (steady heartbeats) touch no database.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ..core import replay
from ..core.errors import (
    CoordinatorError,
    CoordinatorNotAvailable,
    IllegalStateError,
    NotCoordinator,
)
from ..core.model import GroupConfigDefaults, GroupState, GroupStatus
from ..core.records import EventRecord, EventType, Record
from ..core.results import CancelTimer, Result, ScheduleTimer, TimerKey, TimerOp
from ..core.timers import on_timer, timers_after_load
from ..logs import fields
from ..metrics import Metrics
from ..store import Lease, LeaseHolder, LeaseLost, SqlStore, StoreUnavailable
from .timer_service import TimerService

log = logging.getLogger("coordinator")

R = TypeVar("R")
Handler = Callable[[GroupState | None, int], Result[R]]


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    """The coordinator's clock: wall-clock milliseconds (what coordinator_time_ms reports)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


@dataclass
class _OwnedGroup:
    lease: Lease
    state: GroupState | None
    lock: threading.Lock = field(default_factory=threading.Lock)


class GroupManager:
    def __init__(
        self,
        store: SqlStore,
        defaults: GroupConfigDefaults,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
        renew_interval_s: float | None = None,
    ) -> None:
        self.store = store
        self.defaults = defaults
        self.metrics = metrics or Metrics()
        self.clock = clock or SystemClock()
        self._groups: dict[str, _OwnedGroup] = {}
        self._acquire_lock = threading.Lock()
        self._timers = TimerService(self.clock.now_ms, self._fire)
        self._renew_interval_s = renew_interval_s or store.lease_ms / 3000
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew_loop, name="lease-renewer", daemon=True)
        self.metrics.watch_groups(self._group_counts)

    # --- lifecycle ---

    def start(self) -> None:
        self._timers.start()
        self.adopt_free_groups()
        self._renewer.start()

    def stop(self) -> None:
        """Stop timers and renewal, and release every lease so another process takes over at
        once."""
        self._stop.set()
        if self._renewer.is_alive():
            self._renewer.join(timeout=5)
        self._timers.stop()
        with self._acquire_lock:
            owned = list(self._groups.values())
            self._groups.clear()
        for group in owned:
            with group.lock:
                try:
                    self.store.release(group.lease)
                except Exception:
                    log.warning("could not release lease of %s", group.lease.group_id)

    # --- requests ---

    def execute(self, group_id: str, handler: Handler[R], *, create: bool = True) -> R:
        """Run a core handler on the group this process owns (taking it over if its lease is
        free). Raises NotCoordinator / CoordinatorNotAvailable when it cannot serve."""
        for _attempt in range(3):
            owned = self._own(group_id)
            with owned.lock:
                if self._groups.get(group_id) is not owned:
                    continue  # dropped while we waited for the lock
                if not self._lease_fresh(owned):
                    self._drop(group_id, owned)
                    continue
                result = handler(owned.state, self.clock.now_ms())
                if result.records:
                    self._persist(group_id, owned, result.records)
                self._apply_timers(group_id, result.timers)
                if owned.state is None:
                    self._release_unused(group_id, owned)
                return result.response
        raise CoordinatorNotAvailable(f"group {group_id!r} is changing owner; retry.")

    def owner_address(self, group_id: str) -> str:
        """Which process serves the group (FindCoordinator): this one if it owns or can take it
        (for a group that does not exist yet: if nobody holds its lease now)."""
        self.execute(group_id, _no_change)
        return self.store.advertised_address

    def owned_group_ids(self) -> list[str]:
        return sorted(self._groups)

    # --- ownership ---

    def _lease_fresh(self, owned: _OwnedGroup) -> bool:
        return time.monotonic() < owned.lease.valid_until_monotonic

    def _own(self, group_id: str) -> _OwnedGroup:
        owned = self._groups.get(group_id)
        if owned is not None and self._lease_fresh(owned):
            return owned
        with self._acquire_lock:
            owned = self._groups.get(group_id)
            if owned is not None and self._lease_fresh(owned):
                return owned
            try:
                got = self.store.try_acquire(group_id, owned.lease if owned else None)
            except StoreUnavailable as error:
                raise CoordinatorNotAvailable(f"the database is unavailable: {error}") from error
            if isinstance(got, LeaseHolder):
                if owned is not None:
                    self._drop(group_id, owned)
                if got.advertised_address == self.store.advertised_address:
                    # Another process with our address (a predecessor that is paused, or a
                    # reused node id): naming it would send the client back here.
                    raise CoordinatorNotAvailable(
                        f"group {group_id!r} is leased to another process at this address "
                        f"({got.owner_id!r}) until {got.expires_at.isoformat()}; retry then."
                    )
                raise NotOwner(group_id, got)
            if owned is not None and owned.lease.token == got.token:
                owned.lease = got  # renewed, still ours, state in memory is current
                return owned
            state = self.store.load_group(group_id)
            owned = _OwnedGroup(got, state)
            self._groups[group_id] = owned
            if state is not None:
                now = self.clock.now_ms()
                self._apply_timers(group_id, list(timers_after_load(state, now, self.defaults)))
                log.info(
                    "took over group",
                    extra=fields(
                        event="group_loaded",
                        group=group_id,
                        group_epoch=state.group_epoch,
                        assignment_epoch=state.assignment_epoch,
                        members=len(state.members),
                        lease_token=got.token,
                    ),
                )
            return owned

    def _drop(self, group_id: str, owned: _OwnedGroup) -> None:
        if self._groups.get(group_id) is owned:
            del self._groups[group_id]
            self._timers.cancel_group(group_id)
            log.warning(
                "stopped serving group", extra=fields(event="group_dropped", group=group_id)
            )

    def _release_unused(self, group_id: str, owned: _OwnedGroup) -> None:
        """Give up the lease of a group that does not exist (a describe, a FindCoordinator or a
        refused request named it), so that no process keeps renewing it for nothing."""
        if self._groups.get(group_id) is not owned:
            return
        del self._groups[group_id]
        self._timers.cancel_group(group_id)
        with contextlib.suppress(StoreUnavailable):  # if so, it lapses on its own
            self.store.release(owned.lease)

    def adopt_free_groups(self) -> None:
        """Take over every group whose lease is free, so its timers run (takeover, restart)."""
        try:
            group_ids = self.store.group_ids()
        except StoreUnavailable:
            return
        for group_id in group_ids:
            if group_id in self._groups:
                continue
            if self.store.holder(group_id) is not None:
                continue
            try:
                self._own(group_id)
            except CoordinatorError:
                continue

    def _renew_loop(self) -> None:
        while not self._stop.wait(self._renew_interval_s):
            try:
                self._renew_owned()
                self.adopt_free_groups()
            except Exception:
                log.exception("lease renewal failed")

    def _renew_owned(self) -> None:
        """Renew the leases of the groups owned when the renewal starts, and drop those the
        database did not renew. Only those: a group taken (or re-taken, with a new token) while
        the renewal was on its way holds a lease newer than the renewal knows of."""
        sent = list(self._groups.items())
        renewed = {lease.group_id: lease for lease in self.store.renew([o.lease for _, o in sent])}
        for group_id, owned in sent:
            new = renewed.get(group_id)
            if new is None:
                with owned.lock:
                    self._drop(group_id, owned)  # unless it was replaced meanwhile
            elif (
                owned.lease.token == new.token
                and new.valid_until_monotonic > owned.lease.valid_until_monotonic
            ):
                owned.lease = new

    # --- persistence and timers ---

    def _persist(self, group_id: str, owned: _OwnedGroup, records: list[Record]) -> None:
        try:
            if owned.state is None:
                owned.state = replay.new_state(records)
            else:
                for record in records:
                    replay.apply(owned.state, record)
        except IllegalStateError:
            self._drop(group_id, owned)
            log.exception(
                "invariant violated; group reloaded from the database", extra=fields(group=group_id)
            )
            raise
        try:
            self.store.commit(owned.lease, records)
        except LeaseLost as lost:
            self._drop(group_id, owned)
            if lost.holder is not None:
                raise NotOwner(group_id, lost.holder) from lost
            raise NotCoordinator(
                f"this coordinator lost the lease of group {group_id!r}; retry."
            ) from lost
        except Exception as error:
            self._drop(group_id, owned)
            raise CoordinatorNotAvailable(
                f"could not persist the change to group {group_id!r}: {error}"
            ) from error
        self._observe(records)

    def _observe(self, records: list[Record]) -> None:
        """Metrics and one structured log line per event. Never fails the (committed) request."""
        for record in records:
            if not isinstance(record, EventRecord):
                continue
            try:
                payload: dict[str, Any] = dict(record.payload)
                line = {
                    **payload,
                    "event": record.event_type.value.lower(),
                    "group": record.group_id,
                    "group_epoch": record.group_epoch,
                    "member": record.member_id,
                }
                if record.event_type is EventType.GROUP_EPOCH_BUMPED:
                    self.metrics.rebalances.labels(str(payload.get("reason", ""))).inc()
                elif record.event_type is EventType.TARGET_INSTALLED:
                    self.metrics.assignment_computations.labels("installed").inc()
                elif record.event_type is EventType.ASSIGNOR_FAILED:
                    self.metrics.assignment_computations.labels("failed").inc()
                message = record.event_type.value.lower().replace("_", " ")
                log.info(message, extra=fields(**line))
            except Exception:
                log.exception("could not log event %s", record.event_type)

    def _apply_timers(self, group_id: str, ops: list[TimerOp] | list[ScheduleTimer]) -> None:
        for op in ops:
            if isinstance(op, CancelTimer):
                self._timers.cancel(group_id, op.key)
            else:
                self._timers.schedule(group_id, op.key, op.deadline_ms)

    def _fire(self, group_id: str, key: TimerKey) -> None:
        owned = self._groups.get(group_id)
        if owned is None or owned.state is None:
            return
        state = owned.state

        def handle(s: GroupState | None, now: int) -> Result[None]:
            # Under the group's lock: if a request re-armed this timer after it popped (a
            # heartbeat that was answered normally), it is superseded and must not act.
            if self._timers.deadline(group_id, key) is not None:
                return Result([], None)
            return on_timer(s or state, key, now, self.defaults)

        try:
            self.execute(group_id, handle)
        except CoordinatorError as error:
            log.warning("timer %s of group %s not handled: %s", key, group_id, error.message)

    def pending_timers(self, group_id: str) -> dict[TimerKey, int]:
        return self._timers.pending(group_id)

    def _group_counts(self) -> tuple[dict[GroupStatus, int], int]:
        by_state: dict[GroupStatus, int] = {}
        members = 0
        for owned in list(self._groups.values()):
            if owned.state is None:
                continue
            status = owned.state.status()
            by_state[status] = by_state.get(status, 0) + 1
            members += len(owned.state.members)
        return by_state, members


def _no_change(_state: GroupState | None, _now: int) -> Result[None]:
    return Result([], None)


class NotOwner(NotCoordinator):
    """NOT_COORDINATOR, with the address of the process that serves the group."""

    def __init__(self, group_id: str, holder: LeaseHolder) -> None:
        super().__init__(_not_coordinator_message(group_id, holder))
        self.owner_address = holder.advertised_address


def _not_coordinator_message(group_id: str, holder: LeaseHolder) -> str:
    return (
        f"group {group_id!r} is served by the coordinator at {holder.advertised_address} "
        f"({holder.owner_id}); send its requests there."
    )
