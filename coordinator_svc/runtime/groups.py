"""GroupManager: the groups this process serves (DESIGN 3.16, 3.21), composed of one module per
job behind the store port (`store_port.GroupStore`, which `store.SqlStore` satisfies):

- `ownership`: lease ownership (take, renew with retries, adopt, release, load and re-arm);
- `group_commit`: serialised execution of core handlers, group commit, undo of a failed commit;
- `group_timers`: timer wiring (a timer runs as a request of its group);
- `listing`: listings and creation limits, read without taking a lease;
- `group_stats`: the owned groups as a metrics scrape sees them;
- `parking`: classic calls waiting for their group's join or sync phase (answered by the
  wakeups of committed batches, or NOT_COORDINATOR when the group is let go).

A request runs under its group's lock: the core handler computes records from the in-memory state;
the records are applied (replay asserts the invariants), then committed, the lock free but the
next batch waiting, in one transaction that the database refuses unless this process still holds
the group's lease. Only then is the response sent and are timers changed. A failed commit is
taken back in memory while the lease is ours. Requests that produce no records (steady
heartbeats) touch no database, and may be answered during another batch's commit when they
cannot show what it changed (`group_commit`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from ..core.model import GroupConfigDefaults, GroupState
from ..core.results import Result, TimerKey
from ..metrics import GroupStats, Metrics
from .group_commit import CANCEL_POLL_S, GroupCommit
from .group_stats import group_stats
from .group_timers import GroupTimers
from .listing import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, GroupListing, ListedGroup
from .owned_group import MAX_BATCH, Handler, OwnedGroup, R, RequestCancelled, Steady
from .ownership import ADOPT_BATCH, IDLE_RELEASE_S, GroupLeases
from .parking import ParkingLot
from .refusals import (
    DATABASE_MODULES,
    UNAVAILABLE_LOG_INTERVAL_S,
    NotOwner,
    database_unavailable,
)
from .store_port import GroupStore

__all__ = [
    "ADOPT_BATCH",
    "CANCEL_POLL_S",
    "DATABASE_MODULES",
    "DEFAULT_PAGE_SIZE",
    "IDLE_RELEASE_S",
    "MAX_BATCH",
    "MAX_PAGE_SIZE",
    "UNAVAILABLE_LOG_INTERVAL_S",
    "Clock",
    "GroupManager",
    "ListedGroup",
    "NotOwner",
    "RequestCancelled",
    "Steady",
    "SystemClock",
    "database_unavailable",
]


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    """The coordinator's clock: wall-clock milliseconds (what coordinator_time_ms reports)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class GroupManager:
    """The groups this process serves; see the module docstring for the jobs it composes.

    Args:
        store: the store port (`store.SqlStore`).
        defaults: the group configuration defaults.
        renew_interval_s: lease renewal period (default `ownership.RENEW_FRACTION` of the lease).
        monotonic: the lease renewer's clock (tests simulate a pause of the process with it).
    """

    def __init__(
        self,
        store: GroupStore,
        defaults: GroupConfigDefaults,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
        renew_interval_s: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        if defaults.config_digest_key is None:  # every digest this coordinator computes is keyed
            defaults = replace(defaults, config_digest_key=store.config_digest_key())
        self.defaults = defaults
        self.metrics = metrics or Metrics()
        self.clock = clock or SystemClock()
        now_ms = self.clock.now_ms
        self.timers = GroupTimers(now_ms, defaults, self._current)
        #: Classic calls waiting for a wakeup (`grpc_api.aio` registers them).
        self.parking = ParkingLot()
        self.leases = GroupLeases(
            store,
            defaults,
            self.metrics,
            now_ms,
            self.timers,
            renew_interval_s,
            monotonic,
            parking=self.parking,
        )
        self.commits = GroupCommit(
            store,
            self.leases,
            self.timers,
            defaults,
            self.metrics,
            now_ms,
            deliver=self.parking.deliver,
        )
        self.timers.execute = self.commits.execute
        self.listing = GroupListing(store, defaults, self._current)
        #: The owned groups (group id -> OwnedGroup), shared with `leases`.
        self._groups: dict[str, OwnedGroup] = self.leases.groups
        self._timers = self.timers.service
        self.metrics.watch_groups(self.group_stats)
        self.metrics.watch_parked(self.parking.counts)

    def _current(self, group_id: str) -> OwnedGroup | None:
        return self._groups.get(group_id)

    # --- lifecycle ---

    def start(self) -> None:
        """Start timers and the renewer thread, which adopts groups that need an owner in the
        background (start-up does not wait for them: the port can open at once)."""
        self.timers.start()
        self.leases.start()

    def stop(self) -> None:
        """Stop timers and renewal, and release every lease so another process takes over at
        once."""
        self.leases.stop_renewing()
        self.timers.stop()
        self.leases.release_all()

    # --- requests ---

    def execute(
        self,
        group_id: str,
        handler: Handler[R],
        *,
        cancelled: Callable[[], bool] | None = None,
        on_create: Callable[[], None] | None = None,
        member_id: str | None = None,
        steady: Steady | None = None,
    ) -> R:
        """Run a core handler on the group this process owns (taking it over if its lease is
        free). Raises NotCoordinator / CoordinatorNotAvailable when it cannot serve, and
        RequestCancelled if `cancelled()` turns true before the handler ran.

        Group commit: requests queue for their group; whoever holds the group's lock runs every
        queued handler in order (each sees the state the previous ones left), commits all their
        records in one transaction, and only then answers each of them. So a burst of state
        changes (a rolling restart, a revocation round) costs one commit, not one per member;
        a failed commit fails the whole batch, nothing of it is answered as done, and its
        records are taken back in memory.

        A request whose records would create the group is refused with POLICY_VIOLATION when
        the database holds `defaults.max_groups` groups, or by what `on_create` raises (the
        caller's creation rate).

        The group's lock is held while handlers run and their records are applied, not while
        they are committed: the next batch waits for the commit, but a `steady` request of
        `member_id` (a heartbeat) whose handler changes nothing may be answered meanwhile,
        from the in-memory state, if the commit in flight writes nothing of that member and the
        answer carries no resources (`group_commit`'s docstring says why that is safe).
        Requests of one member are answered in the order they were queued."""
        return self.commits.execute(
            group_id,
            handler,
            cancelled=cancelled,
            on_create=on_create,
            member_id=member_id,
            steady=steady,
        )

    def execute_if_steady(
        self,
        group_id: str,
        handler: Handler[R],
        member_id: str | None = None,
        steady: Steady | None = None,
    ) -> tuple[bool, R | None]:
        """Run a core handler at once on the calling thread, if that needs neither a wait nor
        the database: the group is held here under a fresh lease, no request of `member_id`
        (of anyone, without one) is queued for it, its lock is free, and the handler changes
        nothing (no records); not tried unless `steady.worth_trying`. While a commit of the
        group is in flight, only for a member that commit writes nothing of, and only if the
        answer does not `steady.carries_resources` (see `execute`). Returns (True, response)
        then, else (False, None) and nothing happened (the caller goes through `execute`).

        This is the steady heartbeat's path: it lets the event loop answer it without handing
        it to a thread (`grpc_api.aio`)."""
        return self.commits.execute_if_steady(group_id, handler, member_id, steady)

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

    def owned_group_ids(self) -> list[str]:
        return sorted(self._groups)

    def adopt_free_groups(self) -> int:
        """Take over groups whose lease is free and that have timers to run (`ownership`)."""
        return self.leases.adopt_free_groups()

    # --- listing ---

    def check_groups_created_by(self, principal: str) -> None:
        """POLICY_VIOLATION if `principal` created its maximum of groups (`listing`)."""
        self.listing.check_groups_created_by(principal)

    def existing_groups(self, group_ids: list[str]) -> set[str]:
        """Which of `group_ids` exist, without taking any lease (`listing`)."""
        return self.listing.existing_groups(group_ids)

    def list_groups(self, page_token: str, page_size: int) -> tuple[list[ListedGroup], str]:
        """One page of every group in the database and the next page's token (`listing`)."""
        return self.listing.list_groups(page_token, page_size)

    # --- timers and stats ---

    def pending_timers(self, group_id: str) -> dict[TimerKey, int]:
        return self.timers.pending(group_id)

    def group_stats(self) -> GroupStats:
        """The owned groups for a metrics scrape (`group_stats.group_stats`)."""
        return group_stats(list(self._groups.values()), self.clock.now_ms(), self.defaults)


def _no_change(_state: GroupState | None, _now: int) -> Result[None]:
    return Result([], None)
