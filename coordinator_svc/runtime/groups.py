"""GroupManager: ownership of groups (one lease per group, DESIGN 3.16), their in-memory state,
serialised execution of core handlers, persistence before answering, and timers.

A request runs under its group's lock: the core handler computes records from the in-memory state;
the records are applied (replay asserts the invariants), then committed in one transaction that
the database refuses unless this process still holds the group's lease. Only then is the response
sent and are timers changed. A failed commit drops the in-memory copy; the next request reloads.
Requests that produce no records (steady heartbeats) touch no database.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from connect_protocol.configs import REBALANCE_TIMEOUT_MS
from connect_protocol.errors import (
    CoordinatorError,
    CoordinatorNotAvailable,
    NotCoordinator,
    PolicyViolation,
)
from connect_protocol.logs import fields

from ..core import replay
from ..core.errors import IllegalStateError
from ..core.model import GroupConfigDefaults, GroupState, GroupStatus
from ..core.records import EventRecord, EventType, Record
from ..core.results import CancelTimer, Result, ScheduleTimer, TimerKey, TimerOp
from ..core.timers import on_timer, timers_after_load
from ..metrics import UNSETTLED, GroupStats, Metrics
from ..store import GroupSummary, Lease, LeaseHolder, LeaseLost, SqlStore, StoreUnavailable
from .timer_service import TimerService

log = logging.getLogger("coordinator")

#: How often a database failure met by requests is logged (with its detail) at most.
UNAVAILABLE_LOG_INTERVAL_S = 10.0
_unavailable_logged = {"at": -UNAVAILABLE_LOG_INTERVAL_S}
#: Modules whose exceptions carry the database's or the driver's text.
DATABASE_MODULES = ("sqlalchemy", "psycopg", "sqlite3", "alembic")


def database_unavailable(error: StoreUnavailable) -> CoordinatorNotAvailable:
    """What a client is told of a database failure: its kind, no host, port or driver text
    (those are logged, at most every UNAVAILABLE_LOG_INTERVAL_S)."""
    now = time.monotonic()
    if now - _unavailable_logged["at"] >= UNAVAILABLE_LOG_INTERVAL_S:
        _unavailable_logged["at"] = now
        log.warning(
            "a request failed: %s",
            error,
            extra=fields(event="database_unavailable", kind=error.kind),
        )
    return CoordinatorNotAvailable(error.client_message)


def _failure_for_client(error: Exception) -> str:
    """A failure named for a client: the database's failure kind, or the exception's type
    unless it comes from the database's libraries (their names are driver text)."""
    if isinstance(error, StoreUnavailable):
        return error.client_message.removesuffix("; retry.")
    if type(error).__module__.split(".")[0] in DATABASE_MODULES:
        return "a database error"
    return type(error).__name__


R = TypeVar("R")
Handler = Callable[[GroupState | None, int], Result[R]]


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    """The coordinator's clock: wall-clock milliseconds (what coordinator_time_ms reports)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


#: Requests one commit carries at most (group commit, see `GroupManager.execute`).
MAX_BATCH = 256
#: An owned group with no members, holds or scheduled rebalance, and no request for this long,
#: gives its lease up and leaves memory (its next request takes it again).
IDLE_RELEASE_S = 60.0
#: Groups adopted per renewal pass (the rest on the next passes).
ADOPT_BATCH = 500
#: How often a request waiting for its group checks whether its caller gave up.
CANCEL_POLL_S = 0.05


DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class ListedGroup:
    """A group as ListGroups shows it."""

    group_id: str
    status: GroupStatus
    group_epoch: int
    member_count: int

    @staticmethod
    def of(summary: GroupSummary) -> ListedGroup:
        """The group's state from the database's counts, by `GroupState.status`'s rules."""
        if summary.member_count == 0:
            status = GroupStatus.EMPTY
        elif summary.group_epoch > summary.assignment_epoch:
            status = GroupStatus.ASSIGNING
        elif summary.unsettled_members > 0:
            status = GroupStatus.RECONCILING
        else:
            status = GroupStatus.STABLE
        return ListedGroup(summary.group_id, status, summary.group_epoch, summary.member_count)


class RequestCancelled(CoordinatorNotAvailable):
    """The caller gave up while the request waited for its group: it is not run."""


@dataclass(eq=False)
class _Pending:
    """A request waiting for its group: the handler, and once run, its outcome."""

    handler: Handler[Any]
    cancelled: Callable[[], bool] | None = None
    #: Called before the request's records create its group; raises to refuse that.
    on_create: Callable[[], None] | None = None
    done: bool = False
    response: Any = None
    error: BaseException | None = None

    def succeed(self, response: Any) -> None:
        self.response, self.done = response, True

    def fail(self, error: BaseException) -> None:
        self.error, self.done = error, True

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.response


@dataclass(eq=False)
class _OwnedGroup:
    lease: Lease
    state: GroupState | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    queue: list[_Pending] = field(default_factory=list)
    queue_lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)
    #: For the metrics: ((group epoch, assignment epoch) last seen, when the group entered the
    #: state it is in: coordinator ms, None once a scrape saw it settled). A group epoch bump
    #: makes it ASSIGNING, a target installed (the assignment epoch catching up) RECONCILING.
    #: One tuple, replaced whole: a commit that moves either epoch sets it (O(1)); the scrape
    #: reads it, and clears it (`group_stats`).
    rebalance: tuple[tuple[int, int], int | None] = ((0, 0), None)

    def enqueue(self, pending: _Pending) -> None:
        with self.queue_lock:
            self.queue.append(pending)

    def withdraw(self, pending: _Pending) -> None:
        with self.queue_lock:
            if pending in self.queue:
                self.queue.remove(pending)

    def take(self) -> list[_Pending]:
        with self.queue_lock:
            batch, self.queue = self.queue[:MAX_BATCH], self.queue[MAX_BATCH:]
        return batch

    def idle(self) -> bool:
        """Nothing to serve and no timer to run: safe to let go of."""
        state = self.state
        return (
            state is not None
            and not state.members
            and not state.meta.holds
            and state.target.scheduled_rebalance_at_ms is None
        )


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
        if defaults.config_digest_key is None:  # every digest this coordinator computes is keyed
            defaults = replace(defaults, config_digest_key=store.config_digest_key())
        self.defaults = defaults
        self.metrics = metrics or Metrics()
        self.clock = clock or SystemClock()
        self._groups: dict[str, _OwnedGroup] = {}
        self._kept_leases: dict[str, Lease] = {}  # of groups dropped after a failed commit
        self._acquire_lock = threading.Lock()
        self._timers = TimerService(self.clock.now_ms, self._fire)
        self._renew_interval_s = renew_interval_s or store.lease_ms / 3000
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew_loop, name="lease-renewer", daemon=True)
        self.metrics.watch_groups(self.group_stats)

    # --- lifecycle ---

    def start(self) -> None:
        """Start timers and the renewer thread, which adopts groups that need an owner in the
        background (start-up does not wait for them: the port can open at once)."""
        self._timers.start()
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
                    self.metrics.lease_changes.labels("released").inc()
                except Exception:
                    log.warning("could not release lease of %s", group.lease.group_id)

    # --- requests ---

    def execute(
        self,
        group_id: str,
        handler: Handler[R],
        *,
        cancelled: Callable[[], bool] | None = None,
        on_create: Callable[[], None] | None = None,
    ) -> R:
        """Run a core handler on the group this process owns (taking it over if its lease is
        free). Raises NotCoordinator / CoordinatorNotAvailable when it cannot serve, and
        RequestCancelled if `cancelled()` turns true before the handler ran.

        Group commit: requests queue for their group; whoever holds the group's lock runs every
        queued handler in order (each sees the state the previous ones left), commits all their
        records in one transaction, and only then answers each of them. So a burst of state
        changes (a rolling restart, a revocation round) costs one commit, not one per member;
        a failed commit fails the whole batch and nothing of it is answered as done.

        A request whose records would create the group is refused with POLICY_VIOLATION when
        the database holds `defaults.max_groups` groups, or by what `on_create` raises (the
        caller's creation rate)."""
        pending = _Pending(handler, cancelled, on_create)
        for _attempt in range(3):
            owned = self._own(group_id)
            owned.enqueue(pending)
            self._lock(owned, pending)
            try:
                while not pending.done:
                    if self._groups.get(group_id) is not owned:
                        break  # dropped while we waited: start again
                    if not self._lease_fresh(owned):
                        self._lose(group_id, owned)
                        break
                    self._run_batch(group_id, owned)
            finally:
                owned.lock.release()
            if pending.done:
                return pending.outcome()  # type: ignore[no-any-return]
            owned.withdraw(pending)
        raise CoordinatorNotAvailable(f"group {group_id!r} is changing owner; retry.")

    def execute_if_steady(self, group_id: str, handler: Handler[R]) -> tuple[bool, R | None]:
        """Run a core handler at once on the calling thread, if that needs neither a wait nor
        the database: the group is held here under a fresh lease, nothing is queued for it, its
        lock is free, and the handler changes nothing (no records). Returns (True, response)
        then, else (False, None) and nothing happened (the caller goes through `execute`).

        This is the steady heartbeat's path: it lets the event loop answer it without handing
        it to a thread (`grpc_api.aio`)."""
        owned = self._groups.get(group_id)
        if owned is None or owned.queue or not self._lease_fresh(owned):
            return False, None
        if not owned.lock.acquire(blocking=False):
            return False, None
        try:
            if self._groups.get(group_id) is not owned or owned.queue:
                return False, None
            result = handler(owned.state, self.clock.now_ms())
            if result.records:
                return False, None  # a change: it is committed by `execute`, run again there
            owned.last_used = time.monotonic()
            self._apply_timers(group_id, result.timers)
            return True, result.response
        finally:
            owned.lock.release()

    def _lock(self, owned: _OwnedGroup, pending: _Pending) -> None:
        """Take the group's lock, unless the request is answered by another thread meanwhile
        (then the lock is taken all the same, briefly) or its caller gives up."""
        cancelled = pending.cancelled
        if cancelled is None:
            owned.lock.acquire()
            return
        while not owned.lock.acquire(timeout=CANCEL_POLL_S):
            if not pending.done and cancelled():
                owned.withdraw(pending)
                if not pending.done:
                    raise RequestCancelled("the caller gave up before its request ran.")

    def _run_batch(self, group_id: str, owned: _OwnedGroup) -> None:
        """Run the queued handlers in order and commit their records together. Called with the
        group's lock held."""
        batch = owned.take()
        owned.last_used = time.monotonic()
        ran: list[tuple[_Pending, Result[Any]]] = []
        records: list[Record] = []
        for pending in batch:
            if pending.cancelled is not None and pending.cancelled():
                pending.fail(RequestCancelled("the caller gave up before its request ran."))
                continue
            try:
                result = pending.handler(owned.state, self.clock.now_ms())
            except Exception as error:  # a handler bug fails its own request only
                pending.fail(error)
                continue
            if result.records and owned.state is None:
                try:
                    self._may_create(group_id, pending)
                except CoordinatorError as error:
                    pending.fail(error)
                    continue
            if result.records:
                try:
                    self._apply(owned, result.records)
                except IllegalStateError as error:
                    self._drop(group_id, owned)
                    log.exception(
                        "invariant violated; group reloaded from the database",
                        extra=fields(group=group_id),
                    )
                    pending.fail(error)
                    self._fail_unanswered(batch, group_id)
                    return
                records.extend(result.records)
            ran.append((pending, result))
        if records:
            try:
                self._commit(group_id, owned, records)
            except CoordinatorError as error:
                for pending, _result in ran:
                    pending.fail(error)
                return
            self.metrics.commit_batch.observe(sum(1 for _, r in ran if r.records))
            state = owned.state
            if state is not None:
                epochs = (state.group_epoch, state.assignment_epoch)
                if epochs != owned.rebalance[0]:  # a bump, or a target installed
                    owned.rebalance = (epochs, self.clock.now_ms())
        for pending, result in ran:
            self._apply_timers(group_id, result.timers)
            pending.succeed(result.response)
        if owned.state is None:
            self._release_unused(group_id, owned)

    def _may_create(self, group_id: str, pending: _Pending) -> None:
        """Raise unless `pending` may create the group: its caller's creation rate, then the
        number of groups in the database (all coordinators'; two creating at once may both
        pass the count: the limit is approximate by the number of coordinators)."""
        if pending.on_create is not None:
            pending.on_create()
        limit = self.defaults.max_groups
        if limit > 0 and self.store.count_groups() >= limit:
            raise PolicyViolation(
                f"group {group_id!r} cannot be created: the database holds the maximum of "
                f"{limit:,} groups (--max-groups)."
            )

    def check_groups_created_by(self, principal: str) -> None:
        """POLICY_VIOLATION if `principal` created `defaults.max_groups_per_principal` groups
        already (0: no such limit). Like --max-groups, approximate by the number of groups
        being created at the same moment."""
        limit = self.defaults.max_groups_per_principal
        if limit <= 0:
            return
        try:
            created = self.store.count_groups_created_by(principal)
        except StoreUnavailable as error:
            raise database_unavailable(error) from error
        if created >= limit:
            raise PolicyViolation(
                f"{principal} has created {created:,} groups, the most one principal may "
                f"(--max-groups-per-principal {limit:,}); use an existing group."
            )

    def existing_groups(self, group_ids: list[str]) -> set[str]:
        """Which of `group_ids` exist: those this process serves from memory, the rest from
        one read of the database (a statement per 10,000 ids), without taking any lease."""
        found: set[str] = set()
        ask: list[str] = []
        for group_id in group_ids:
            owned = self._groups.get(group_id)
            if owned is not None and owned.state is not None:
                found.add(group_id)
            else:
                ask.append(group_id)
        if ask:
            try:
                found |= self.store.existing_group_ids(ask)
            except StoreUnavailable as error:
                raise database_unavailable(error) from error
        return found

    def _fail_unanswered(self, batch: list[_Pending], group_id: str) -> None:
        """Fail every request of the batch not yet answered (those that ran too: their records
        were applied to a state that is now dropped, and nothing was committed)."""
        error = CoordinatorNotAvailable(f"group {group_id!r} is being reloaded; retry.")
        for pending in batch:
            if not pending.done:
                pending.fail(error)

    def owner_address(self, group_id: str) -> str:
        """Which process serves the group (FindCoordinator): this one if it owns or can take it
        (for a group that does not exist yet: if nobody holds its lease now)."""
        self.execute(group_id, _no_change)
        return self.store.advertised_address

    def peek(self, group_id: str) -> GroupState | None:
        """The group's in-memory state if this process holds it, without taking the group's
        lock: only for reading values that are replaced, never changed in place (the meta, the
        target, the cached catalogue), as `assignment.plan_install` does."""
        owned = self._groups.get(group_id)
        return None if owned is None else owned.state

    def list_groups(self, page_token: str, page_size: int) -> tuple[list[ListedGroup], str]:
        """One page of every group in the database (those other processes own included), in
        group id order, with each group's state computed by the database (no group is loaded);
        and the token of the next page ("" after the last)."""
        size = DEFAULT_PAGE_SIZE if page_size <= 0 else min(page_size, MAX_PAGE_SIZE)
        try:
            summaries = self.store.group_summaries(page_token, size + 1)
        except StoreUnavailable as error:
            raise database_unavailable(error) from error
        page = [ListedGroup.of(s) for s in summaries[:size]]
        return page, (page[-1].group_id if len(summaries) > size else "")

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
                held = owned.lease if owned else self._kept_leases.get(group_id)
                got = self.store.try_acquire(group_id, held)
                self._kept_leases.pop(group_id, None)
            except StoreUnavailable as error:
                raise database_unavailable(error) from error
            if isinstance(got, LeaseHolder):
                # Ours no more: the group in memory, or the lease kept after a failed commit.
                if (owned is not None and self._drop(group_id, owned)) or (
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
                owned.lease = got  # renewed, still ours, state in memory is current
                return owned
            if held is None or held.token != got.token:
                # A new tenure (a kept lease extended with its token is the same one); the one
                # held before, if any, ended meanwhile.
                if held is not None:
                    self.metrics.lease_changes.labels("lost").inc()
                self.metrics.lease_changes.labels("acquired").inc()
            state = self.store.load_group(group_id)
            owned = _OwnedGroup(got, state)
            self._groups[group_id] = owned
            if state is not None:
                now = self.clock.now_ms()
                # When its rebalance (if any) reached its state is not known: from now, as the
                # timers armed below also restart.
                owned.rebalance = ((state.group_epoch, state.assignment_epoch), now)
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

    def _drop(self, group_id: str, owned: _OwnedGroup, keep_lease: bool = False) -> bool:
        """Stop serving the group (its state is reloaded by the next request). With
        `keep_lease`, the lease is remembered, so that the next request can extend it (same
        token) if the database says it is still ours. Returns whether it was still served
        (False: dropped or replaced already)."""
        if self._groups.get(group_id) is owned:
            if keep_lease:
                self._kept_leases[group_id] = owned.lease
            del self._groups[group_id]
            self._timers.cancel_group(group_id)
            log.warning(
                "stopped serving group", extra=fields(event="group_dropped", group=group_id)
            )
            return True
        return False

    def _lose(self, group_id: str, owned: _OwnedGroup) -> None:
        """Stop serving a group whose lease is no longer ours (counted as lost)."""
        if self._drop(group_id, owned):
            self.metrics.lease_changes.labels("lost").inc()

    def _release_unused(self, group_id: str, owned: _OwnedGroup) -> None:
        """Give up the lease of a group that does not exist (a describe, a FindCoordinator or a
        refused request named it: its lease row is deleted, so read-only calls leave nothing
        behind), or of an idle one, so that no process keeps renewing it for nothing."""
        # Under the acquisition lock, and the row gone before the group leaves memory: a
        # request for the group meanwhile would otherwise find our own lease row and take it
        # for another process's.
        with self._acquire_lock:
            if self._groups.get(group_id) is not owned:
                return
            try:
                if owned.state is None:  # no such group: its lease row goes too
                    self.store.forget(owned.lease)
                else:  # an idle group: the row stays, so the lease token keeps counting up
                    self.store.release(owned.lease)
                self.metrics.lease_changes.labels("released").inc()
            except StoreUnavailable:  # it lapses on its own; the next request may extend it
                self._kept_leases[group_id] = owned.lease
            del self._groups[group_id]
            self._timers.cancel_group(group_id)

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
            if group_id in self._groups:
                continue
            try:
                self._own(group_id)
                adopted += 1
            except CoordinatorError:
                continue
        return adopted

    def _renew_loop(self) -> None:
        wait = 0.0  # adopt at once on start
        while not self._stop.wait(wait):
            wait = self._renew_interval_s
            try:
                self._renew_owned()
                self._release_idle()
                if self.adopt_free_groups() >= ADOPT_BATCH:
                    wait = 0.0  # more to adopt: go on after this renewal
            except Exception:
                log.exception("lease renewal failed")

    def _release_idle(self) -> None:
        """Let go of owned groups with nothing to serve and no request for IDLE_RELEASE_S, so a
        process does not renew the leases of every group it ever touched."""
        horizon = time.monotonic() - IDLE_RELEASE_S
        for group_id, owned in list(self._groups.items()):
            if owned.last_used > horizon or not owned.idle():
                continue
            if not owned.lock.acquire(blocking=False):
                continue
            try:
                if self._groups.get(group_id) is owned and owned.idle() and not owned.queue:
                    self._release_unused(group_id, owned)
            finally:
                owned.lock.release()

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
                    self._lose(group_id, owned)  # unless it was replaced meanwhile
            elif (
                owned.lease.token == new.token
                and new.valid_until_monotonic > owned.lease.valid_until_monotonic
            ):
                owned.lease = new

    # --- persistence and timers ---

    def _apply(self, owned: _OwnedGroup, records: list[Record]) -> None:
        """Apply records to the in-memory state (replay checks the invariants)."""
        if owned.state is None:
            owned.state = replay.new_state(records)
        else:
            for record in records:
                replay.apply(owned.state, record)

    def _commit(self, group_id: str, owned: _OwnedGroup, records: list[Record]) -> None:
        """Commit records already applied in memory; on failure drop the group (the next
        request reloads it) and raise what to answer."""
        try:
            self.store.commit(owned.lease, records)
        except LeaseLost as lost:
            self._lose(group_id, owned)
            if lost.holder is not None:
                raise NotOwner(group_id, lost.holder) from lost
            raise NotCoordinator(
                f"this coordinator lost the lease of group {group_id!r}; retry."
            ) from lost
        except Exception as error:
            # The lease is most likely still ours: keep it, so the next request reloads the
            # group at once under the same tenure instead of waiting for the lease to lapse.
            self._drop(group_id, owned, keep_lease=True)
            # The database's text (SQL, parameters) goes to the log, never to the client.
            log.warning(
                "could not persist a change; group reloaded on its next request",
                exc_info=error,
                extra=fields(event="commit_failed", group=group_id),
            )
            raise CoordinatorNotAvailable(
                f"could not persist the change to group {group_id!r} "
                f"({_failure_for_client(error)}; the coordinator's log has the details); retry."
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

    def group_stats(self) -> GroupStats:
        """The groups this process owns, for a metrics scrape: O(groups), plus O(members) for
        each group not STABLE. Reads the states without their locks (a group changing meanwhile
        is counted as it was, or skipped). How long an unsettled group has been in its state
        runs from the commit that moved an epoch (ASSIGNING: the bump; RECONCILING: the target
        installed) or from when this process took the group over; the scrape clears it when it
        sees the group settled and starts it when it sees the group unsettled with no epoch
        moved (a member's change alone), so an age is at most a scrape interval short."""
        now = self.clock.now_ms()
        by_state: dict[GroupStatus, int] = {}
        members = 0
        oldest_ms: dict[GroupStatus, int] = {}
        overdue: dict[GroupStatus, float] = {}
        for owned in list(self._groups.values()):
            state = owned.state
            if state is None:
                continue
            epochs, since = owned.rebalance
            try:
                status = state.status()
                count = len(state.members)
                timeout_ms = 0
                if status in UNSETTLED:
                    timeout_ms = max(
                        (m.rebalance_timeout_ms for m in list(state.members.values())), default=0
                    )
            except RuntimeError:  # its members changed while being read: next scrape
                continue
            by_state[status] = by_state.get(status, 0) + 1
            members += count
            if status not in UNSETTLED:
                if since is not None and owned.rebalance == (epochs, since):
                    owned.rebalance = (epochs, None)  # unless a commit replaced it meanwhile
                continue
            if since is None:
                since = now
                if owned.rebalance == (epochs, None):
                    owned.rebalance = (epochs, now)
            age_ms = max(0, now - since)
            if timeout_ms <= 0:
                timeout_ms = state.config_int(REBALANCE_TIMEOUT_MS, self.defaults)
            oldest_ms[status] = max(oldest_ms.get(status, 0), age_ms)
            overdue[status] = max(overdue.get(status, 0.0), age_ms / max(1, timeout_ms))
        return GroupStats(
            by_state=by_state,
            members=members,
            oldest_rebalance_s={s: ms / 1000 for s, ms in oldest_ms.items()},
            oldest_rebalance_timeouts=overdue,
        )


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
