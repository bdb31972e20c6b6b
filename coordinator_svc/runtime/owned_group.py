"""A group this process owns, as the lease module (`ownership`) and the commit module
(`group_commit`) share it: its lease, its in-memory state, its lock, the requests queued for it
and the commit in flight, if any (DESIGN 3.16)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from connect_protocol.errors import CoordinatorNotAvailable

from ..core.model import GroupState, Tombstone
from ..core.results import Result
from ..store.errors import Lease

R = TypeVar("R")
Handler = Callable[[GroupState | None, int], Result[R]]

#: Requests one commit carries at most (group commit, see `GroupManager.execute`).
MAX_BATCH = 256


@dataclass(frozen=True, slots=True)
class Steady:
    """How a request that may change nothing (a heartbeat) is answered without a batch of its
    own (`group_commit`): `carries_resources(response)` tells an answer that hands the member
    resources (never sent while a commit is in flight); `worth_trying(state)` tells, in O(1),
    whether its handler is likely to change nothing (else it is not run outside a batch: a
    handler that reconciles a big share costs 100+ ms, run once is enough)."""

    carries_resources: Callable[[Any], bool]
    worth_trying: Callable[[GroupState | None], bool] = lambda _state: True


class RequestCancelled(CoordinatorNotAvailable):
    """The caller gave up while the request waited for its group: it is not run."""


@dataclass(eq=False)
class Pending:
    """A request waiting for its group: the handler, and once run, its outcome."""

    handler: Handler[Any]
    cancelled: Callable[[], bool] | None = None
    #: Called before the request's records create its group; raises to refuse that.
    on_create: Callable[[], None] | None = None
    #: The member the request speaks for (a heartbeat, Prepare, Install), if any: a later
    #: steady heartbeat of the same member is never answered before it.
    member_id: str | None = None
    #: In its group's queue (not yet taken into a batch, nor withdrawn).
    queued: bool = False
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


@dataclass(frozen=True, slots=True)
class InFlight:
    """A batch applied in memory whose commit has not finished: what in the state is not
    (yet) in the database. `members`: every member a record of the batch writes, removes or
    moves to a new epoch; `created`: the batch creates the group."""

    members: frozenset[str]
    created: bool


@dataclass(eq=False)
class OwnedGroup:
    lease: Lease
    state: GroupState | None
    #: What DeleteGroup kept of the group when it does not exist (DESIGN 3.20): a group the
    #: next request creates continues its counters (`core.change.continuing`).
    tombstone: Tombstone | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    queue: list[Pending] = field(default_factory=list)
    queue_lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)
    #: For the metrics: ((group epoch, assignment epoch) last seen, when the group entered the
    #: state it is in: coordinator ms, None once a scrape saw it settled). A group epoch bump
    #: makes it ASSIGNING, a target installed (the assignment epoch catching up) RECONCILING.
    #: One tuple, replaced whole: a commit that moves either epoch sets it (O(1)); the scrape
    #: reads it, and clears it (`group_stats`).
    rebalance: tuple[tuple[int, int], int | None] = ((0, 0), None)
    #: The batch being committed (set and cleared under `lock`, which is free meanwhile), and
    #: the condition (over `lock`) notified when it finished (`group_commit`).
    committing: InFlight | None = None
    settled: threading.Condition = field(init=False)
    #: How many queued requests each member has (`Pending.member_id`).
    queued_members: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.settled = threading.Condition(self.lock)

    def lease_fresh(self) -> bool:
        """The lease is valid by the local clock (the database cannot have given it away)."""
        return time.monotonic() < self.lease.valid_until_monotonic

    def enqueue(self, pending: Pending) -> None:
        with self.queue_lock:
            self.queue.append(pending)
            pending.queued = True
            if pending.member_id is not None:
                self.queued_members[pending.member_id] += 1

    def withdraw(self, pending: Pending) -> bool:
        """Take `pending` out of the queue; False if it was not there (taken into a batch)."""
        with self.queue_lock:
            if not pending.queued:
                return False
            self.queue.remove(pending)
            self._unqueued([pending])
            return True

    def take(self) -> list[Pending]:
        with self.queue_lock:
            batch, self.queue = self.queue[:MAX_BATCH], self.queue[MAX_BATCH:]
            self._unqueued(batch)
        return batch

    def put_back(self, pendings: list[Pending]) -> None:
        """Return requests taken into a batch, unrun, to the head of the queue (in order)."""
        with self.queue_lock:
            self.queue[:0] = pendings
            for pending in pendings:
                pending.queued = True
                if pending.member_id is not None:
                    self.queued_members[pending.member_id] += 1

    def queued_for(self, member_id: str) -> int:
        """How many requests of `member_id` wait in the queue."""
        with self.queue_lock:
            return self.queued_members.get(member_id, 0)

    def _unqueued(self, pendings: list[Pending]) -> None:
        for pending in pendings:
            pending.queued = False
            member_id = pending.member_id
            if member_id is not None:
                left = self.queued_members[member_id] - 1
                if left > 0:
                    self.queued_members[member_id] = left
                else:
                    del self.queued_members[member_id]

    def wait_settled(self) -> None:
        """Wait (holding `lock`) until no commit of the group is in flight."""
        while self.committing is not None:
            self.settled.wait()

    def idle(self) -> bool:
        """Nothing to serve and no timer to run: safe to let go of. A classic group whose
        round has anyone in it (joined, MEMBER_ID_REQUIRED ids, awaiting or parked syncs) is
        not: that round lives only here."""
        state = self.state
        return (
            self.committing is None
            and state is not None
            and not state.members
            and not state.meta.holds
            and state.target.scheduled_rebalance_at_ms is None
            and (state.round is None or state.round.is_idle())
        )
