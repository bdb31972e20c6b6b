"""Authorization at run time: the ACLs in force (loaded from the database, re-read when their
stamp changes), a cache of decisions so that a steady heartbeat pays one dict lookup, super
users, and the denials: counted in metrics at once, and written to the audit trail aggregated
per principal, operation and group, at most one row each per interval, so that a hostile client
cannot make the coordinator write once per request."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from connect_protocol.logs import fields

from ..core.acls import ANONYMOUS, AclSet, Operation, ResourceType
from ..metrics import Metrics
from ..store.acl_store import AclStore, Denials
from ..store.errors import StoreUnavailable

log = logging.getLogger("coordinator.authorizer")

#: Decisions kept before the cache starts over (a hostile client naming many groups).
MAX_CACHED_DECISIONS = 100_000
#: Distinct (principal, operation, group) denials kept per interval before new ones are only
#: counted in metrics.
MAX_PENDING_DENIALS = 10_000


@dataclass
class _Pending:
    first_ms: int
    last_ms: int
    count: int = 0
    rpcs: set[str] = field(default_factory=set)


class Authorizer:
    """`enabled` False: everything is allowed (denials by identity binding are still counted).
    `super_users` are allowed everything. ACLs are re-read every `refresh_s` when their stamp
    changed; denials are written every `denial_interval_s`."""

    def __init__(
        self,
        acls: AclStore,
        metrics: Metrics,
        *,
        enabled: bool,
        super_users: Iterable[str] = (),
        refresh_s: float = 2.0,
        denial_interval_s: float = 60.0,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._store = acls
        self._metrics = metrics
        self.enabled = enabled
        self.super_users = frozenset(super_users)
        self._refresh_s = refresh_s
        self._denial_interval_s = denial_interval_s
        self._wall_ms = wall_ms
        self._stamp: tuple[int, int] | None = None
        # The ACLs in force and the decisions made from them, swapped as one (one attribute).
        self._generation: tuple[AclSet, dict[tuple[str, Operation, ResourceType, str], bool]] = (
            AclSet(),
            {},
        )
        self._pending: dict[tuple[str, str, str], _Pending] = {}
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Load the ACLs (a database failure here stops the start: deny-by-default with an
        unknown ACL set would refuse everyone) and start the refresher."""
        if self.enabled:
            self.refresh()
        self._thread = threading.Thread(target=self._run, name="authorizer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush_denials()

    def _run(self) -> None:
        next_flush = time.monotonic() + self._denial_interval_s
        while not self._stop.wait(self._refresh_s):
            if self.enabled:
                try:
                    self.refresh()
                except StoreUnavailable as error:
                    log.warning("cannot re-read the ACLs; keeping the ones in force: %s", error)
            if time.monotonic() >= next_flush:
                next_flush = time.monotonic() + self._denial_interval_s
                self.flush_denials()

    def refresh(self) -> bool:
        """Re-read the ACLs if their stamp changed; whether they did."""
        stamp = self._store.stamp()
        if stamp == self._stamp:
            return False
        stamp, entries = self._store.load()
        self._generation = (AclSet(entries), {})
        self._stamp = stamp
        log.info(
            "ACLs loaded",
            extra=fields(event="acls_loaded", entries=len(entries)),
        )
        return True

    # --- decisions ---------------------------------------------------------------------------

    def allowed(
        self, principal: str, operation: Operation, resource_type: ResourceType, name: str
    ) -> bool:
        if not self.enabled or principal in self.super_users:
            return True
        key = (principal, operation, resource_type, name)
        # The ACLs and the cache of one generation: a decision worked out while `refresh`
        # swaps them goes into the old cache, which is dropped, never into the new one.
        acls, decisions = self._generation
        decision = decisions.get(key)
        if decision is None:
            decision = acls.allows(principal, operation, resource_type, name)
            if len(decisions) >= MAX_CACHED_DECISIONS:
                decisions.clear()
            decisions[key] = decision
        return decision

    def denied(self, rpc: str, principal: str, operation: Operation, resource: str) -> None:
        """Count a denial; an authenticated one is also kept for the next aggregated event."""
        self._metrics.authorization_denials.labels(rpc, operation.value).inc()
        if principal == ANONYMOUS:
            return
        now = self._wall_ms()
        key = (principal, operation.value, resource)
        with self._pending_lock:
            pending = self._pending.get(key)
            if pending is None:
                if len(self._pending) >= MAX_PENDING_DENIALS:
                    return
                pending = self._pending[key] = _Pending(now, now)
            pending.count += 1
            pending.last_ms = now
            pending.rpcs.add(rpc)

    def flush_denials(self) -> int:
        """Write the pending denials as events; how many rows. Kept for the next try if the
        database is unavailable."""
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return 0
        rows = [
            Denials(principal, op, resource, p.count, p.first_ms, p.last_ms, tuple(sorted(p.rpcs)))
            for (principal, op, resource), p in pending.items()
        ]
        try:
            self._store.record_denials(rows)
        except StoreUnavailable as error:
            log.warning("cannot record authorization denials yet: %s", error)
            with self._pending_lock:
                for key, p in pending.items():
                    self._pending.setdefault(key, p)
            return 0
        return len(rows)
