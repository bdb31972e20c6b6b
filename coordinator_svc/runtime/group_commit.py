"""Group commit: requests queue for their group; whoever holds the group's lock runs every queued
core handler in order on the in-memory state and applies their records (replay asserts the
invariants); then, with the lock free and the batch marked in flight (`OwnedGroup.committing`),
commits them in one transaction under the group's lease (DESIGN 3.16), and only then answers them
and changes timers. The next batch of the group waits for that commit to finish (batches stay in
order, each computed from a state whose every earlier change is committed).

While a batch is in flight, a heartbeat that changes nothing may be answered from the in-memory
state (`execute_if_steady`, and a queued one in `execute`), which holds the uncommitted batch, so
only when its answer cannot show anything the batch changed and a failed commit would take back
(DESIGN 3.11, 3.13: no resource on two workers, whatever fails):

- never to a member a record of the batch writes, removes or moves to a new epoch (an epoch-only
  move too: told an epoch the undo takes back, the member's next heartbeat would name an epoch
  the coordinator never committed and be FENCED_MEMBER_EPOCH, losing its whole share to a
  rebalance for a failure it had no part in; it waits for one commit instead);
- never an answer that carries an assignment (resources and their fencing tokens);
- never while the batch creates the group.

What such an answer may still show of the batch is group-wide and carries no resource: a
heartbeat interval or session timeout of an uncommitted AlterGroupConfigs, or COMPUTE_ASSIGNMENT
to the assignor member after an uncommitted epoch bump. If the commit fails, the next answer
shows the restored values; a Prepare for an epoch that was taken back is refused as for any stale
epoch.

A commit that fails while the lease is still ours takes the batch back in memory (an undo log of
what its records changed: O(what changed), never a copy of the group), under the lock, before the
next request runs; refuses that batch's requests with COORDINATOR_NOT_AVAILABLE and keeps serving
the group (DESIGN 3.21): steady heartbeats, which write nothing, go on being answered from memory
through a short database outage. The group is dropped (and reloaded by its next request) only
when the lease is lost, when the outcome of the commit is unknown (the connection died during
COMMIT), or when an invariant broke.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from connect_protocol.errors import (
    CoordinatorError,
    CoordinatorNotAvailable,
    NotCoordinator,
    PolicyViolation,
)
from connect_protocol.logs import fields

from ..core import replay
from ..core.change import continuing
from ..core.errors import IllegalStateError
from ..core.model import GroupConfigDefaults, GroupState, Tombstone
from ..core.records import (
    ClassicRoundRecord,
    ConfigRecord,
    ConnectorRecord,
    ConnectorRemovedRecord,
    EventRecord,
    EventType,
    GroupDeletedRecord,
    GroupMetaRecord,
    MemberRecord,
    MemberRemovedRecord,
    MembersMovedRecord,
    Record,
    StatusRecord,
    TargetRecord,
    visit,
)
from ..core.results import Result, ScheduleTimer, TimerOp, Wakeup
from ..metrics import Metrics
from ..store.errors import LeaseLost, StoreUnavailable
from .owned_group import Handler, InFlight, OwnedGroup, Pending, RequestCancelled, Steady
from .refusals import NotOwner, database_unavailable, failure_for_client
from .store_port import CommitStore

log = logging.getLogger("coordinator")

R = TypeVar("R")

#: How often a request waiting for its group checks whether its caller gave up.
CANCEL_POLL_S = 0.05


class Owners(Protocol):
    """What the commit needs of lease ownership (`ownership.GroupLeases`)."""

    def own(self, group_id: str) -> OwnedGroup: ...

    def current(self, group_id: str) -> OwnedGroup | None: ...

    def drop(self, group_id: str, owned: OwnedGroup, keep_lease: bool = False) -> bool: ...

    def lose(self, group_id: str, owned: OwnedGroup) -> None: ...

    def release_unused(self, group_id: str, owned: OwnedGroup) -> None: ...


class Timers(Protocol):
    def apply(self, group_id: str, ops: Iterable[TimerOp | ScheduleTimer]) -> None: ...


Deliver = Callable[[str, list[Wakeup]], None]
"""Answers parked calls (`group id, wakeups`): called after the batch that made the wakeups is
committed, never before, never when its commit failed (DESIGN 3.19)."""


class GroupCommit:
    """Runs requests on owned groups (see the module docstring)."""

    def __init__(
        self,
        store: CommitStore,
        owners: Owners,
        timers: Timers,
        defaults: GroupConfigDefaults,
        metrics: Metrics,
        now_ms: Callable[[], int],
        deliver: Deliver | None = None,
    ) -> None:
        """`deliver`: where the wakeups of committed batches go (the parking lot of classic
        calls); None drops them (no classic calls are served)."""
        self.store = store
        self.owners = owners
        self.timers = timers
        self.defaults = defaults
        self.metrics = metrics
        self.now_ms = now_ms
        self.deliver = deliver

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
        """`GroupManager.execute`."""
        pending = Pending(handler, cancelled, on_create, member_id)
        for _attempt in range(3):
            owned = self.owners.own(group_id)
            owned.enqueue(pending)
            self._lock(owned, pending)
            try:
                tried: InFlight | None = None
                while not pending.done:
                    if owned.committing is not None:
                        if owned.committing is not tried and steady is not None:
                            tried = owned.committing  # once per commit: it may take long
                            self._answer_steady(group_id, owned, pending, steady)
                        if not pending.done:
                            self._await_commit(owned, pending)
                        continue
                    if self.owners.current(group_id) is not owned:
                        break  # dropped while we waited: start again
                    if not owned.lease_fresh():
                        break  # `own` extends it (state kept) or lets the group go
                    self._run_batch(group_id, owned)
            finally:
                owned.lock.release()
            if pending.done:
                return pending.outcome()  # type: ignore[no-any-return]
            owned.withdraw(pending)
        raise CoordinatorNotAvailable(f"group {group_id!r} is changing owner; retry.")

    def execute_if_steady(
        self,
        group_id: str,
        handler: Handler[R],
        member_id: str | None = None,
        steady: Steady | None = None,
    ) -> tuple[bool, R | None]:
        """`GroupManager.execute_if_steady`."""
        owned = self.owners.current(group_id)
        if owned is None or not owned.lease_fresh():
            return False, None
        if not owned.lock.acquire(blocking=False):
            return False, None
        try:
            if self.owners.current(group_id) is not owned:
                return False, None
            if member_id is None:
                if owned.queue:
                    return False, None
            elif owned.queued_for(member_id):
                return False, None  # an earlier request of this member is answered first
            return self._steady(group_id, owned, handler, member_id, steady)
        finally:
            owned.lock.release()

    def _steady(
        self,
        group_id: str,
        owned: OwnedGroup,
        handler: Handler[R],
        member_id: str | None,
        steady: Steady | None,
    ) -> tuple[bool, R | None]:
        """Run `handler` and keep its answer if it changes nothing and, with a commit in flight,
        cannot show what that commit would take back if it failed (the module docstring).
        Called with the group's lock held."""
        committing = owned.committing
        if committing is not None and (
            member_id is None
            or steady is None
            or committing.created
            or member_id in committing.members
        ):
            return False, None
        if steady is not None and not steady.worth_trying(owned.state):
            return False, None
        result = handler(owned.state, self.now_ms())
        if result.records:
            return False, None  # a change: it is committed by `execute`, run again there
        response = result.response
        if committing is not None and steady is not None and steady.carries_resources(response):
            return False, None
        owned.last_used = time.monotonic()
        self.timers.apply(group_id, result.timers)
        return True, response

    def _answer_steady(
        self,
        group_id: str,
        owned: OwnedGroup,
        pending: Pending,
        steady: Steady,
    ) -> None:
        """While a commit is in flight, answer the queued `pending` at once if it is a steady
        heartbeat that may be answered then (`_steady`), taking it out of the queue. Called
        with the group's lock held."""
        member_id = pending.member_id
        if member_id is None or not pending.queued or owned.queued_for(member_id) != 1:
            return  # taken into a batch already, or behind another request of its member
        try:
            done, response = self._steady(group_id, owned, pending.handler, member_id, steady)
        except Exception:  # answered on the ordinary path, which reports it
            return
        if done and owned.withdraw(pending):
            pending.succeed(response)

    def _await_commit(self, owned: OwnedGroup, pending: Pending) -> None:
        """Wait (the lock held, released meanwhile) for the commit in flight to finish, unless
        the caller gives up while its request is still queued (not yet run)."""
        owned.settled.wait(timeout=CANCEL_POLL_S)
        cancelled = pending.cancelled
        if (
            owned.committing is not None
            and cancelled is not None
            and not pending.done
            and cancelled()
            and owned.withdraw(pending)
        ):
            raise RequestCancelled("the caller gave up before its request ran.")

    def _lock(self, owned: OwnedGroup, pending: Pending) -> None:
        """Take the group's lock, unless the request is answered by another thread meanwhile
        (then the lock is taken all the same, briefly) or its caller gives up."""
        cancelled = pending.cancelled
        if cancelled is None:
            owned.lock.acquire()
            return
        while not owned.lock.acquire(timeout=CANCEL_POLL_S):
            if not pending.done and cancelled() and owned.withdraw(pending):
                raise RequestCancelled("the caller gave up before its request ran.")

    def _run_batch(self, group_id: str, owned: OwnedGroup) -> None:
        """Run the queued handlers in order and commit their records together. Called with the
        group's lock held."""
        batch = owned.take()
        owned.last_used = time.monotonic()
        ran: list[tuple[Pending, Result[Any]]] = []
        records: list[Record] = []
        created = owned.state is None  # a failed batch that created the group leaves none
        undo = replay.Undo()
        deleted: _Deleted | None = None
        for index, pending in enumerate(batch):
            if deleted is not None:  # the rest run on the group as the deletion leaves it
                owned.put_back(batch[index:])
                break
            if pending.cancelled is not None and pending.cancelled():
                pending.fail(RequestCancelled("the caller gave up before its request ran."))
                continue
            try:
                result = _run_handler(owned, pending.handler, self.now_ms())
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
                    self._apply(owned, result.records, undo)
                except IllegalStateError as error:
                    self.owners.drop(group_id, owned)
                    log.exception(
                        "invariant violated; group reloaded from the database",
                        extra=fields(group=group_id),
                    )
                    pending.fail(error)
                    _fail_unanswered(batch, group_id)
                    return
                records.extend(result.records)
                deleted = _deletion(owned, result.records)
            ran.append((pending, result))
        if records:
            try:
                try:
                    self._commit(group_id, owned, records, undo, created, deleted)
                finally:
                    _settle(owned)
            except CoordinatorError as error:
                for pending, _result in ran:
                    pending.fail(error)
                if owned.state is None and self.owners.current(group_id) is owned:
                    self.owners.release_unused(group_id, owned)
                return
            self.metrics.commit_batch.observe(sum(1 for _, r in ran if r.records))
            state = owned.state
            if state is not None:
                epochs = (state.group_epoch, state.assignment_epoch)
                if epochs != owned.rebalance[0]:  # a bump, or a target installed
                    owned.rebalance = (epochs, self.now_ms())
        for pending, result in ran:
            self.timers.apply(group_id, result.timers)
            if result.wakeups:
                self._deliver(group_id, result.wakeups)
            pending.succeed(result.response)
        if owned.state is None:
            self.owners.release_unused(group_id, owned)

    def _deliver(self, group_id: str, wakeups: list[Wakeup]) -> None:
        """Hand a committed batch's wakeups on. Never fails the (committed) request."""
        if self.deliver is None:
            return
        try:
            self.deliver(group_id, wakeups)
        except Exception:
            log.exception("could not deliver wakeups", extra=fields(group=group_id))

    def _may_create(self, group_id: str, pending: Pending) -> None:
        """Raise unless `pending` may create the group: its caller's creation rate, then the
        number of groups in the database (all coordinators'; two creating at once may both
        pass the count: the limit is approximate by the number of coordinators)."""
        if pending.on_create is not None:
            pending.on_create()
        limit = self.defaults.max_groups
        if limit <= 0:
            return
        try:
            count = self.store.count_groups()
        except StoreUnavailable as error:
            raise database_unavailable(error) from error
        if count >= limit:
            raise PolicyViolation(
                f"group {group_id!r} cannot be created: the database holds the maximum of "
                f"{limit:,} groups (--max-groups)."
            )

    @staticmethod
    def _apply(owned: OwnedGroup, records: list[Record], undo: replay.Undo) -> None:
        """Apply records to the in-memory state (replay checks the invariants), remembering in
        `undo` what they change."""
        if owned.state is None:
            owned.state = replay.new_state(records)  # taken back by forgetting it
        else:
            for record in records:
                replay.apply(owned.state, record, undo)

    def _commit(
        self,
        group_id: str,
        owned: OwnedGroup,
        records: list[Record],
        undo: replay.Undo,
        created: bool,
        deleted: _Deleted | None = None,
    ) -> None:
        """Commit records already applied in memory (`deleted`: the batch ends by deleting
        the group, whose state is put back if the commit fails). On failure, raise what to
        answer, having taken the records back in memory (the group served on while its lease
        is valid) or dropped the group (lease lost, or the commit's outcome unknown). Called
        with the group's lock held; returns (or raises) with it held, the records committed or
        taken back, and no commit in flight."""
        try:
            self._commit_unlocked(owned, records, created)
        except LeaseLost as lost:
            self.owners.lose(group_id, owned)
            if lost.holder is not None:
                raise NotOwner(group_id, lost.holder) from lost
            raise NotCoordinator(
                f"this coordinator lost the lease of group {group_id!r}; retry."
            ) from lost
        except Exception as error:
            unknown = isinstance(error, StoreUnavailable) and error.outcome_unknown
            if unknown or not owned.lease_fresh():
                # Whether it was written is not known (the connection died on COMMIT), or the
                # lease may be lapsing: the next request reloads the group, under the same
                # tenure if the database still holds the lease for us.
                self.owners.drop(group_id, owned, keep_lease=True)
                outcome = "reloaded on its next request"
            else:
                if deleted is not None:
                    owned.state, owned.tombstone = deleted.state, deleted.tombstone
                if created:
                    owned.state = None
                elif owned.state is not None:
                    undo.rollback(owned.state)
                outcome = "taken back; the group is served on"
            # The database's text (SQL, parameters) goes to the log, never to the client.
            log.warning(
                "could not persist a change; %s",
                outcome,
                exc_info=error,
                extra=fields(event="commit_failed", group=group_id, undone=not unknown),
            )
            raise CoordinatorNotAvailable(
                f"could not persist the change to group {group_id!r} "
                f"({failure_for_client(error)}; the coordinator's log has the details); retry."
            ) from error

    def _commit_unlocked(self, owned: OwnedGroup, records: list[Record], created: bool) -> None:
        """`store.commit` with the group's lock free and the batch marked in flight: the next
        batch waits for it (`execute`), a steady heartbeat may be answered meanwhile (`_steady`).
        The lock is held again before this returns or raises; the marker is cleared by the
        caller (`_settle`), after a failed batch was taken back."""
        owned.committing = InFlight(_members_written(records), created)
        owned.lock.release()
        try:
            self.store.commit(owned.lease, records)
            self._observe(records)  # the events' log lines, in commit order
        finally:
            owned.lock.acquire()

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
                elif (
                    record.event_type is EventType.CONNECTOR_RESTART_REQUESTED
                    and payload.get("reason") == "auto"
                ):
                    self.metrics.automatic_restarts.inc()
                message = record.event_type.value.lower().replace("_", " ")
                log.info(message, extra=fields(**line))
            except Exception:
                log.exception("could not log event %s", record.event_type)


def _run_handler(owned: OwnedGroup, handler: Handler[R], now_ms: int) -> Result[R]:
    """Run a handler on the group's state. On an absent group that was deleted, a group the
    handler creates continues the tombstone's counters (`core.change.continuing`); an existing
    group (the steady case) pays nothing for it."""
    if owned.state is None and owned.tombstone is not None:
        with continuing(owned.tombstone):
            return handler(None, now_ms)
    return handler(owned.state, now_ms)


@dataclass(frozen=True, slots=True)
class _Deleted:
    """A batch deleted its group (DESIGN 3.20): the state and tombstone before, to put back if
    its commit fails."""

    state: GroupState
    tombstone: Tombstone | None


def _deletion(owned: OwnedGroup, records: list[Record]) -> _Deleted | None:
    """If `records` delete the group: drop its state in memory (the requests after it see no
    group, and one that creates it continues the new tombstone's counters) and say what to put
    back. The deletion is the last state record of its handler's result."""
    deleted = records[-1]
    if not isinstance(deleted, GroupDeletedRecord) or owned.state is None:
        return None
    before = _Deleted(owned.state, owned.tombstone)
    owned.state, owned.tombstone = None, deleted.tombstone
    return before


def _settle(owned: OwnedGroup) -> None:
    """No commit of the group in flight any more: wake the requests waiting for it. Called with
    the group's lock held, after a failed batch was taken back."""
    owned.committing = None
    owned.settled.notify_all()


class _MembersWritten:
    """The members records write, remove or move (a `RecordVisitor`)."""

    __slots__ = ("members",)

    def __init__(self) -> None:
        self.members: set[str] = set()

    def meta(self, record: GroupMetaRecord) -> None:
        pass

    def target(self, record: TargetRecord) -> None:
        pass

    def member(self, record: MemberRecord) -> None:
        self.members.add(record.member.member_id)

    def members_moved(self, record: MembersMovedRecord) -> None:
        self.members.update(record.member_ids)

    def member_removed(self, record: MemberRemovedRecord) -> None:
        self.members.add(record.member_id)

    def connector(self, record: ConnectorRecord) -> None:
        pass

    def connector_removed(self, record: ConnectorRemovedRecord) -> None:
        pass

    def configs(self, record: ConfigRecord) -> None:
        pass

    def statuses(self, record: StatusRecord) -> None:
        pass

    def classic_round(self, record: ClassicRoundRecord) -> None:
        pass  # the round is volatile: no member row is written

    def group_deleted(self, record: GroupDeletedRecord) -> None:
        pass  # the group has no member left (DeleteGroup refuses one)

    def event(self, record: EventRecord) -> None:
        pass


def _members_written(records: list[Record]) -> frozenset[str]:
    written = _MembersWritten()
    for record in records:
        visit(record, written)
    return frozenset(written.members)


def _fail_unanswered(batch: list[Pending], group_id: str) -> None:
    """Fail every request of the batch not yet answered (those that ran too: their records
    were applied to a state that is now dropped, and nothing was committed)."""
    error = CoordinatorNotAvailable(f"group {group_id!r} is being reloaded; retry.")
    for pending in batch:
        if not pending.done:
            pending.fail(error)
