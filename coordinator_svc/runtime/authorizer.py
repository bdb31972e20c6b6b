"""Authorization at run time: the ACLs in force (loaded from the database, re-read when the
ACL table's revision moves: a trigger raises it on every INSERT, UPDATE or DELETE, so an edit in
place is enforced within one refresh interval), a cache of decisions so that a steady heartbeat
pays one dict lookup, super users, the recording of ACL changes made directly in the database
(ACL_CHANGED, once, by whichever coordinator notices first), and the denials: counted in
metrics at once, and written to the audit trail aggregated per principal and operation, one row
each per interval with a count and a bounded sample of groups, for at most
`MAX_DENIAL_PRINCIPALS` principals (one overflow row counts the rest), so that a hostile client
can neither make the coordinator write once per request nor hide another principal's denials
(DESIGN 3.17). Its refresher also re-reads, at the same cadence, what else each coordinator keeps
in memory of the database's cluster-wide settings (`refreshers`: the feature levels, DESIGN
3.19)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from connect_protocol.logs import fields

from ..core.acls import AclSet, Operation, ResourceType
from ..metrics import Metrics
from ..store.acl_store import CLUSTER_EVENT_GROUP, AclStore, Denials
from ..store.errors import StoreUnavailable

log = logging.getLogger("coordinator.authorizer")

#: Decisions kept before the cache starts over (a hostile client naming many groups).
MAX_CACHED_DECISIONS = 100_000
#: Principals whose denials get rows of their own per interval; the denials of any further
#: principal are counted in one overflow row.
MAX_DENIAL_PRINCIPALS = 100
#: Group ids kept as a sample in each aggregated denial row.
MAX_SAMPLED_GROUPS = 10
#: Distinct groups counted exactly per row (beyond: "at least", `distinct_groups_capped`).
MAX_COUNTED_GROUPS = 1_000
#: Distinct principals counted exactly by the overflow row.
MAX_COUNTED_PRINCIPALS = 10_000


@dataclass
class _Pending:
    """The denials of one (principal, operation, resource type) in this interval."""

    first_ms: int
    last_ms: int
    count: int = 0
    rpcs: set[str] = field(default_factory=set)
    sample: list[str] = field(default_factory=list)
    #: Hashes of the distinct groups named, at most MAX_COUNTED_GROUPS.
    distinct: set[int] = field(default_factory=set)
    capped: bool = False
    #: Hashes of the distinct principals and the operations (the overflow row only).
    principals: set[int] = field(default_factory=set)
    operations: set[str] = field(default_factory=set)

    def add(self, rpc: str, group: str | None, now: int) -> None:
        self.count += 1
        self.first_ms = min(self.first_ms, now)
        self.last_ms = max(self.last_ms, now)
        self.rpcs.add(rpc)
        if group is None:
            return
        if len(self.sample) < MAX_SAMPLED_GROUPS and group not in self.sample:
            self.sample.append(group)
        if len(self.distinct) < MAX_COUNTED_GROUPS:
            self.distinct.add(hash(group))
        elif hash(group) not in self.distinct:
            self.capped = True

    def merge(self, other: _Pending) -> None:
        """Fold in `other` (denials kept back when the database was unavailable)."""
        self.count += other.count
        self.first_ms = min(self.first_ms, other.first_ms)
        self.last_ms = max(self.last_ms, other.last_ms)
        self.rpcs |= other.rpcs
        for group in other.sample:
            if len(self.sample) < MAX_SAMPLED_GROUPS and group not in self.sample:
                self.sample.append(group)
        for h in other.distinct:
            if len(self.distinct) < MAX_COUNTED_GROUPS:
                self.distinct.add(h)
            elif h not in self.distinct:
                self.capped = True
        self.capped = self.capped or other.capped
        for h in other.principals:
            if len(self.principals) < MAX_COUNTED_PRINCIPALS:
                self.principals.add(h)
        self.operations |= other.operations


#: The key of the overflow row.
_OVERFLOW = ("", "", "")


class Authorizer:
    """`enabled` False: everything is allowed (denials by identity binding are still counted).
    `super_users` are allowed everything. ACLs are re-read every `refresh_s` when the table's
    revision moved (and direct edits recorded, enabled or not); denials are written every
    `denial_interval_s`. Each of `refreshers` (what it reads -> how) is called at start and
    every `refresh_s`, whether authorization is on or not (a failure at start stops the start;
    later, the values in force are kept and the failure logged)."""

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
        refreshers: Mapping[str, Callable[[], object]] | None = None,
    ) -> None:
        self._store = acls
        self._metrics = metrics
        self.enabled = enabled
        self.super_users = frozenset(super_users)
        self._refresh_s = refresh_s
        self._denial_interval_s = denial_interval_s
        self._wall_ms = wall_ms
        self._refreshers = dict(refreshers or {})
        #: The ACL table's revision the ACLs in force were read at (None: not read yet).
        self._revision: int | None = None
        # The ACLs in force and the decisions made from them, swapped as one (one attribute).
        self._generation: tuple[AclSet, dict[tuple[str, Operation, ResourceType, str], bool]] = (
            AclSet(),
            {},
        )
        # Per (principal, operation, resource type); `_OVERFLOW` counts principals beyond
        # MAX_DENIAL_PRINCIPALS.
        self._pending: dict[tuple[str, str, str], _Pending] = {}
        self._pending_principals: set[str] = set()
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Load the ACLs (a database failure here stops the start: deny-by-default with an
        unknown ACL set would refuse everyone) and whatever `refreshers` read, and start the
        refresher."""
        if self.enabled:
            self.refresh()
        for refresh in self._refreshers.values():
            refresh()
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
            # With authorization off nothing reads the ACLs, and the coordinator touches the
            # database only for what its requests change (steady heartbeats need none): a
            # direct edit is then recorded by the next coordinator that enforces ACLs, or by
            # the next ACL change made through the command or an RPC.
            if self.enabled:
                try:
                    self.refresh()
                except StoreUnavailable as error:
                    log.warning("cannot re-read the ACLs; keeping the ones in force: %s", error)
            for what, refresh in self._refreshers.items():
                try:
                    refresh()
                except StoreUnavailable as error:
                    log.warning("cannot re-read %s; keeping what is in force: %s", what, error)
                except Exception:  # never let it end the ACLs' refresher
                    log.exception("cannot re-read %s; keeping what is in force", what)
            if time.monotonic() >= next_flush:
                next_flush = time.monotonic() + self._denial_interval_s
                self.flush_denials()

    def refresh(self) -> bool:
        """Record a change made directly in the ACL table (once among all coordinators), and
        re-read the ACLs if their revision moved (only when enabled); whether they were."""
        revision = self._store.revision()
        if revision.unaudited:
            try:
                if self._store.audit_direct_changes():
                    log.warning(
                        "ACLs changed directly in the database (recorded as ACL_CHANGED)",
                        extra=fields(event="acl_changed", principal="database"),
                    )
            except StoreUnavailable as error:
                log.warning("cannot record a direct change of the ACLs yet: %s", error)
        if not self.enabled or revision.revision == self._revision:
            return False
        loaded, entries = self._store.load()
        self._generation = (AclSet(entries), {})
        self._revision = loaded
        log.info(
            "ACLs loaded",
            extra=fields(event="acls_loaded", entries=len(entries), revision=loaded),
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

    def denied(
        self,
        rpc: str,
        principal: str,
        operation: Operation,
        resource: str,
        resource_type: ResourceType = ResourceType.GROUP,
    ) -> None:
        """Count a denial and keep it for the next aggregated event (every principal,
        `User:ANONYMOUS` included)."""
        self._metrics.authorization_denials.labels(rpc, operation.value).inc()
        now = self._wall_ms()
        group = resource if resource_type is ResourceType.GROUP else None
        with self._pending_lock:
            if (
                principal not in self._pending_principals
                and len(self._pending_principals) >= MAX_DENIAL_PRINCIPALS
            ):
                overflow = self._pending.get(_OVERFLOW)
                if overflow is None:
                    overflow = self._pending[_OVERFLOW] = _Pending(now, now)
                overflow.add(rpc, group, now)
                overflow.operations.add(operation.value)
                if len(overflow.principals) < MAX_COUNTED_PRINCIPALS:
                    overflow.principals.add(hash(principal))
                return
            self._pending_principals.add(principal)
            key = (principal, operation.value, resource_type.value)
            pending = self._pending.get(key)
            if pending is None:
                pending = self._pending[key] = _Pending(now, now)
            pending.add(rpc, group, now)

    def flush_denials(self) -> int:
        """Write the pending denials as events; how many rows. Kept for the next try if the
        database is unavailable."""
        with self._pending_lock:
            pending, self._pending = self._pending, {}
            self._pending_principals = set()
        if not pending:
            return 0
        rows = [_denials(key, p) for key, p in pending.items()]
        try:
            self._store.record_denials(rows)
        except StoreUnavailable as error:
            log.warning("cannot record authorization denials yet: %s", error)
            with self._pending_lock:
                for key, p in pending.items():
                    current = self._pending.get(key)
                    if current is None:
                        self._pending[key] = p
                    else:
                        current.merge(p)
                    if key != _OVERFLOW:
                        self._pending_principals.add(key[0])
            return 0
        return len(rows)


def _denials(key: tuple[str, str, str], p: _Pending) -> Denials:
    """The event row of one aggregate: its group id is the one group all its denials named,
    else "" (many groups, the cluster, the overflow row)."""
    one_group = len(p.distinct) == 1 and not p.capped and len(p.sample) == 1
    overflow = key == _OVERFLOW
    principal, operation, resource_type = key
    return Denials(
        principal=None if overflow else principal,
        operation=",".join(sorted(p.operations)) if overflow else operation,
        resource_type=resource_type,
        group_id=p.sample[0] if one_group else CLUSTER_EVENT_GROUP,
        count=p.count,
        first_ms=p.first_ms,
        last_ms=p.last_ms,
        rpcs=tuple(sorted(p.rpcs)),
        groups=tuple(p.sample),
        distinct_groups=len(p.distinct),
        distinct_groups_capped=p.capped,
        principals=len(p.principals) if overflow else 1,
    )
