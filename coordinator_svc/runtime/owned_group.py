"""A group this process owns, as the lease module (`ownership`) and the commit module
(`group_commit`) share it: its lease, its in-memory state, its lock and the requests queued for
it (DESIGN 3.16)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from connect_protocol.errors import CoordinatorNotAvailable

from ..core.model import GroupState
from ..core.results import Result
from ..store.errors import Lease

R = TypeVar("R")
Handler = Callable[[GroupState | None, int], Result[R]]

#: Requests one commit carries at most (group commit, see `GroupManager.execute`).
MAX_BATCH = 256


class RequestCancelled(CoordinatorNotAvailable):
    """The caller gave up while the request waited for its group: it is not run."""


@dataclass(eq=False)
class Pending:
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
class OwnedGroup:
    lease: Lease
    state: GroupState | None
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

    def lease_fresh(self) -> bool:
        """The lease is valid by the local clock (the database cannot have given it away)."""
        return time.monotonic() < self.lease.valid_until_monotonic

    def enqueue(self, pending: Pending) -> None:
        with self.queue_lock:
            self.queue.append(pending)

    def withdraw(self, pending: Pending) -> None:
        with self.queue_lock:
            if pending in self.queue:
                self.queue.remove(pending)

    def take(self) -> list[Pending]:
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
