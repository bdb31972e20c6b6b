"""Lease ownership of groups (DESIGN 3.16, 3.21): taking a group's lease and loading its state
(re-arming its timers), renewing every lease held, adopting groups that need an owner, and letting
go (dropped, lost, released when idle or at shutdown). Letting a group go answers the classic
calls parked on it NOT_COORDINATOR (`parking`): their round lives only in this process's memory.
A group of a type (or classic state) this code does not know is never loaded: its lease is
released at once and the request refused COORDINATOR_NOT_AVAILABLE, nothing written (DESIGN
3.19 "Takeover": a newer release wrote it).

Leases never starve: the renewer runs every RENEW_FRACTION of the lease, and a renewal that fails
is retried every RETRY_FRACTION of it while any lease is still valid by the local clock, so an
outage shorter than the lease minus a renewal interval does not end any lease (same token after
it). A group is dropped only when the database says its lease is no longer ours; one whose local
validity ran out is extended under the same token by its next request if the database still
holds it for us (its state is kept). The renewer notices when it woke much later than it meant
to: that is this process being paused (SIGSTOP, a VM pause), logged as such.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import NoReturn, Protocol

from connect_protocol.errors import CoordinatorError, CoordinatorNotAvailable, ErrorCode
from connect_protocol.logs import fields

from ..core import replay
from ..core.classic_timers import classic_after_load
from ..core.model import GroupConfigDefaults, GroupState
from ..core.results import ScheduleTimer, TimerOp
from ..core.timers import timers_after_load
from ..metrics import Metrics
from ..store.errors import Lease, LeaseHolder, StoreUnavailable
from ..store.rows import UnknownGroupType
from .owned_group import OwnedGroup
from .parking import ParkingLot
from .refusals import NotOwner, database_unavailable
from .store_port import LeaseStore

log = logging.getLogger("coordinator")

#: An owned group with no members, holds or scheduled rebalance, and no request for this long,
#: gives its lease up and leaves memory (its next request takes it again).
IDLE_RELEASE_S = 60.0
#: Groups adopted per renewal pass (the rest on the next passes).
ADOPT_BATCH = 500
#: Renewals run every this fraction of the lease: an outage shorter than the lease minus one
#: interval (and a retry) leaves every lease in place.
RENEW_FRACTION = 0.25
#: A failed renewal is retried every this fraction of the lease (while a lease is still valid).
RETRY_FRACTION = 0.05
#: A renewer that wakes this much later than it meant to (at least) was paused.
MIN_PAUSE_S = 1.0


class TimerControl(Protocol):
    """What ownership does to the timers: re-arm a group's after a load, drop them with it."""

    def apply(self, group_id: str, ops: Iterable[TimerOp | ScheduleTimer]) -> None: ...

    def cancel_group(self, group_id: str) -> None: ...


def overslept(meant_s: float, woke_s: float, threshold_s: float) -> float:
    """How long a thread that meant to wake at `meant_s` and woke at `woke_s` (one monotonic
    clock) was not running beyond what scheduling explains: 0 below `threshold_s`."""
    late = woke_s - meant_s
    return late if late >= threshold_s else 0.0


class GroupLeases:
    """The groups this process owns (`groups`: group id -> OwnedGroup) and the renewer thread
    that keeps their leases.

    Args:
        store: the lease operations of the store.
        timers: re-armed after a load, cancelled with a group dropped.
        renew_interval_s: renewal period (default RENEW_FRACTION of the lease).
        monotonic: the renewer's clock (tests simulate a pause with it).
        parking: the parked classic calls, answered when their group is let go.
    """

    def __init__(
        self,
        store: LeaseStore,
        defaults: GroupConfigDefaults,
        metrics: Metrics,
        now_ms: Callable[[], int],
        timers: TimerControl,
        renew_interval_s: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        parking: ParkingLot | None = None,
    ) -> None:
        self.store = store
        self.parking = parking
        self.defaults = defaults
        self.metrics = metrics
        self.now_ms = now_ms
        self.timers = timers
        lease_s = store.lease_ms / 1000
        self.renew_interval_s = renew_interval_s or lease_s * RENEW_FRACTION
        self.retry_interval_s = max(0.02, min(self.renew_interval_s, lease_s * RETRY_FRACTION))
        self.pause_threshold_s = max(MIN_PAUSE_S, self.renew_interval_s)
        self.monotonic = monotonic
        self.groups: dict[str, OwnedGroup] = {}
        self.kept_leases: dict[str, Lease] = {}  # of groups dropped after a failed commit
        self.acquire_lock = threading.Lock()
        self._failing_since: float | None = None  # first failed renewal of an outage
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew_loop, name="lease-renewer", daemon=True)

    # --- lifecycle ---

    def start(self) -> None:
        self._renewer.start()

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._renewer.is_alive():
            self._renewer.join(timeout=5)

    def release_all(self) -> None:
        """Release every lease (graceful shutdown), each under its group's lock, so another
        process takes over at once."""
        with self.acquire_lock:
            owned = list(self.groups.values())
            self.groups.clear()
        for group in owned:
            self._answer_parked(group.lease.group_id, "this coordinator is shutting down")
            with group.lock:
                group.wait_settled()  # a commit in flight finishes under the lease it holds
                try:
                    self.store.release(group.lease)
                    self.metrics.lease_changes.labels("released").inc()
                except Exception:
                    log.warning("could not release lease of %s", group.lease.group_id)

    # --- taking ---

    def current(self, group_id: str) -> OwnedGroup | None:
        return self.groups.get(group_id)

    def own(self, group_id: str) -> OwnedGroup:
        """The group, held here under a lease valid by the local clock: taken, extended (same
        token: the state in memory is kept) or taken over (loaded, timers re-armed). Raises
        NotOwner / CoordinatorNotAvailable when it cannot be."""
        owned = self.groups.get(group_id)
        if owned is not None and owned.lease_fresh():
            return owned
        with self.acquire_lock:
            owned = self.groups.get(group_id)
            if owned is not None and owned.lease_fresh():
                return owned
            try:
                held = owned.lease if owned else self.kept_leases.get(group_id)
                got = self.store.try_acquire(group_id, held)
                self.kept_leases.pop(group_id, None)
            except StoreUnavailable as error:
                raise database_unavailable(error) from error
            if isinstance(got, LeaseHolder):
                # Ours no more: the group in memory, or the lease kept after a failed commit.
                if (owned is not None and self.drop(group_id, owned)) or (
                    owned is None and held is not None
                ):
                    self.metrics.lease_changes.labels("lost").inc()
                if got.advertised_address == self.store.advertised_address:
                    # Another process with our address (a predecessor that is paused, or a
                    # reused node id): naming it would send the client back here.
                    raise CoordinatorNotAvailable(
                        f"group {group_id!r} is leased to another process at this address "
                        f"({got.owner_id!r}) until {got.expires_at.isoformat()}; retry then."
                    )
                raise NotOwner(group_id, got)
            if owned is not None and owned.lease.token == got.token:
                owned.lease = got  # extended, still ours, state in memory is current
                return owned
            if held is None or held.token != got.token:
                # A new tenure (a kept lease extended with its token is the same one); the one
                # held before, if any, ended meanwhile.
                if held is not None:
                    self.metrics.lease_changes.labels("lost").inc()
                self.metrics.lease_changes.labels("acquired").inc()
            return self._load(group_id, got)

    def _load(self, group_id: str, lease: Lease) -> OwnedGroup:
        """Load the group under `lease` and re-arm its timers (a classic group is first
        normalised in memory by `classic_after_load`: a phase in progress starts again). A
        group this code does not know is refused (the module docstring)."""
        try:
            state = self.store.load_group(group_id)
        except UnknownGroupType as unknown:
            self._refuse_unknown(lease, unknown)
        if group_id in self.groups:  # a new tenure: what was parked on the old one is lost
            self._answer_parked(group_id, "this coordinator's lease of the group lapsed")
        owned = OwnedGroup(lease, state)
        if state is None:  # deleted? A group created now continues its counters
            owned.tombstone = self.store.load_tombstone(group_id)
        self.groups[group_id] = owned
        if state is not None:
            now = self.now_ms()
            # When its rebalance (if any) reached its state is not known: from now, as the
            # timers armed below also restart.
            owned.rebalance = ((state.group_epoch, state.assignment_epoch), now)
            self.timers.apply(group_id, self._after_load(state, now))
            log.info(
                "took over group",
                extra=fields(
                    event="group_loaded",
                    group=group_id,
                    group_epoch=state.group_epoch,
                    assignment_epoch=state.assignment_epoch,
                    members=len(state.members),
                    lease_token=lease.token,
                ),
            )
        return owned

    def _after_load(self, state: GroupState, now: int) -> list[ScheduleTimer]:
        """The timers to arm for a loaded group; a classic group's in-memory normalisation
        (`classic_after_load`'s records: never committed by themselves, the next change writes
        the state they lead to) is applied first."""
        if not state.meta.is_classic:
            return timers_after_load(state, now, self.defaults)
        records, timers = classic_after_load(state, now, self.defaults)
        for record in records:
            replay.apply(state, record)
        return timers

    def _refuse_unknown(self, lease: Lease, unknown: UnknownGroupType) -> NoReturn:
        """Give the lease of a group of an unknown type back at once (another process, of the
        release that wrote it, may serve it) and refuse the request; nothing is written."""
        log.error(
            "refused to load a group this release does not know; its lease is released",
            extra=fields(event="group_type_unknown", group=lease.group_id, detail=str(unknown)),
        )
        try:
            self.store.release(lease)
            self.metrics.lease_changes.labels("released").inc()
        except StoreUnavailable:
            pass  # it lapses on its own
        raise CoordinatorNotAvailable(
            f"group {lease.group_id!r} was written by a newer coordinator release ({unknown}); "
            "this one does not serve it: retry on an upgraded coordinator."
        )

    def adopt_free_groups(self) -> int:
        """Take over groups whose lease is free and that have timers to run (members, holds, a
        scheduled rebalance): after a takeover or restart. At most ADOPT_BATCH per call, found
        by one query; idle groups are not adopted (their first request takes them). Returns
        how many were adopted."""
        try:
            group_ids = self.store.groups_needing_owner(ADOPT_BATCH)
        except StoreUnavailable:
            return 0
        adopted = 0
        for group_id in group_ids:
            if self._stop.is_set():
                break
            if group_id in self.groups:
                continue
            try:
                self.own(group_id)
                adopted += 1
            except CoordinatorError:
                continue
        return adopted

    # --- letting go ---

    def drop(self, group_id: str, owned: OwnedGroup, keep_lease: bool = False) -> bool:
        """Stop serving the group (its state is reloaded by the next request). With
        `keep_lease`, the lease is remembered, so that the next request can extend it (same
        token) if the database says it is still ours. Returns whether it was still served
        (False: dropped or replaced already)."""
        if self.groups.get(group_id) is owned:
            if keep_lease:
                self.kept_leases[group_id] = owned.lease
            del self.groups[group_id]
            self.timers.cancel_group(group_id)
            self._answer_parked(group_id, "this coordinator stopped serving the group")
            log.warning(
                "stopped serving group", extra=fields(event="group_dropped", group=group_id)
            )
            return True
        return False

    def _answer_parked(self, group_id: str, why: str) -> None:
        """Answer the classic calls parked on a group let go: NOT_COORDINATOR (their client
        finds the group's coordinator again and rejoins there)."""
        if self.parking is not None:
            self.parking.fail_group(
                group_id, ErrorCode.NOT_COORDINATOR, f"{why}; find its coordinator and retry."
            )

    def lose(self, group_id: str, owned: OwnedGroup) -> None:
        """Stop serving a group whose lease is no longer ours (counted as lost)."""
        if self.drop(group_id, owned):
            self.metrics.lease_changes.labels("lost").inc()

    def release_unused(self, group_id: str, owned: OwnedGroup) -> None:
        """Give up the lease of a group that does not exist (a describe, a FindCoordinator or a
        refused request named it: its lease row is deleted, so read-only calls leave nothing
        behind), or of an idle one, so that no process keeps renewing it for nothing."""
        # Under the acquisition lock, and the row gone before the group leaves memory: a
        # request for the group meanwhile would otherwise find our own lease row and take it
        # for another process's.
        with self.acquire_lock:
            if self.groups.get(group_id) is not owned:
                return
            try:
                if owned.state is None:  # no such group: its lease row goes too
                    self.store.forget(owned.lease)
                else:  # an idle group: the row stays, so the lease token keeps counting up
                    self.store.release(owned.lease)
                self.metrics.lease_changes.labels("released").inc()
            except StoreUnavailable:  # it lapses on its own; the next request may extend it
                self.kept_leases[group_id] = owned.lease
            del self.groups[group_id]
            self.timers.cancel_group(group_id)
            self._answer_parked(group_id, "this coordinator let the group go")

    def release_idle(self) -> None:
        """Let go of owned groups with nothing to serve and no request for IDLE_RELEASE_S, so a
        process does not renew the leases of every group it ever touched."""
        horizon = time.monotonic() - IDLE_RELEASE_S
        for group_id, owned in list(self.groups.items()):
            if owned.last_used > horizon or not owned.idle():
                continue
            if not owned.lock.acquire(blocking=False):
                continue
            try:
                if self.groups.get(group_id) is owned and owned.idle() and not owned.queue:
                    self.release_unused(group_id, owned)
            finally:
                owned.lock.release()

    # --- renewing ---

    def renew_owned(self) -> None:
        """Renew the leases of the groups owned when the renewal starts, and drop those the
        database did not renew (no longer ours by its clock). Only those: a group taken (or
        re-taken, with a new token) while the renewal was on its way holds a lease newer than
        the renewal knows of. Never waits for a group's lock (a commit in flight): a group
        dropped meanwhile is refused by its commit's lease check anyway. Raises
        StoreUnavailable if the database did not answer."""
        sent = list(self.groups.items())
        renewed = {lease.group_id: lease for lease in self.store.renew([o.lease for _, o in sent])}
        for group_id, owned in sent:
            new = renewed.get(group_id)
            if new is None:
                self.lose(group_id, owned)  # unless it was replaced meanwhile
            elif (
                owned.lease.token == new.token
                and new.valid_until_monotonic > owned.lease.valid_until_monotonic
            ):
                owned.lease = new

    def _any_lease_valid(self) -> bool:
        return any(owned.lease_fresh() for owned in list(self.groups.values()))

    def _renew_once(self) -> bool:
        """One renewal attempt; False if the database did not answer (logged once per
        outage, and when it answers again)."""
        try:
            self.renew_owned()
        except StoreUnavailable as error:
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                log.warning(
                    "lease renewal failed; retrying every %.2f s while a lease is valid: %s",
                    self.retry_interval_s,
                    error,
                    extra=fields(event="lease_renewal_failed", kind=error.kind),
                )
            return False
        if self._failing_since is not None:
            failed_s = time.monotonic() - self._failing_since
            self._failing_since = None
            log.info(
                "lease renewal succeeded again after %.1f s",
                failed_s,
                extra=fields(event="lease_renewal_recovered", failed_s=round(failed_s, 3)),
            )
        return True

    def _notice_pause(self, meant_s: float, woke_s: float) -> None:
        paused = overslept(meant_s, woke_s, self.pause_threshold_s)
        if paused <= 0:
            return
        lease_s = self.store.lease_ms / 1000
        log.warning(
            "this process was paused for %.1f s (its lease renewer woke %.1f s late; not a "
            "database failure)%s",
            paused,
            paused,
            f": leases of {lease_s:g} s may have lapsed meanwhile" if paused >= lease_s else "",
            extra=fields(event="process_paused", paused_s=round(paused, 3), lease_s=lease_s),
        )

    def _renew_loop(self) -> None:
        wait = 0.0  # adopt at once on start
        while True:
            meant = self.monotonic() + wait
            if self._stop.wait(wait):
                return
            self._notice_pause(meant, self.monotonic())
            try:
                if not self._renew_once():
                    wait = self.renew_interval_s
                    if self._any_lease_valid():
                        wait = self.retry_interval_s
                    continue
                wait = self.renew_interval_s
                self.release_idle()
                if self.adopt_free_groups() >= ADOPT_BATCH:
                    wait = 0.0  # more to adopt: go on after this renewal
            except Exception:
                log.exception("lease renewal failed")
                wait = self.retry_interval_s
