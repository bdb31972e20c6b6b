"""The parking lot of classic calls (DESIGN 3.19 "Long polls hold no thread"): a JoinGroup or
SyncGroup whose core handler answered `Parked` waits here, as a future on the gRPC event loop,
until a committed batch of its group hands it its answer (a `Wakeup`), its park limit passes,
its caller gives up, or this process stops serving the group.

Thread-safety: `register` and `unregister` run on the event loop; `deliver` runs on the pool
thread that committed a batch, `fail_group` on whichever thread lets a group go. Every method
takes the lot's lock for its bookkeeping only; futures are completed on their own loop
(`call_soon_threadsafe`), never from another thread directly.

Ordering: a call registers its waiter BEFORE its handler runs, so a wakeup made by the same
batch (or a batch committed before the handler's answer reached the loop) is not lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from connect_protocol.errors import ErrorCode

from ..core.results import WAKE_JOIN, WAKE_SYNC, Wakeup

#: The kinds of call that park, as `coordinator_parked_calls{kind}` names them.
PARK_KINDS = (WAKE_JOIN, WAKE_SYNC)


@dataclass(frozen=True, slots=True)
class ParkFailure:
    """What a parked call is answered instead of a core response: an error its servicer turns
    into the RPC's error answer (NOT_COORDINATOR when the process lets the group go or stops)."""

    code: ErrorCode
    message: str


WaiterKey = tuple[str, str, str]
"""(group id, kind, member id)."""


@dataclass(eq=False)
class Waiter:
    """One call waiting for its answer: its key and its future (on `loop`)."""

    group_id: str
    kind: str
    member_id: str
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any] = field(init=False)

    def __post_init__(self) -> None:
        self.future = self.loop.create_future()

    @property
    def key(self) -> WaiterKey:
        return (self.group_id, self.kind, self.member_id)

    def answer(self, response: Any) -> None:
        """Complete the future with `response` (on its loop; a done future is left alone)."""
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self.loop.call_soon_threadsafe(_set_result, self.future, response)


def _set_result(future: asyncio.Future[Any], response: Any) -> None:
    if not future.done():
        future.set_result(response)


class ParkingLot:
    """Calls waiting for a wakeup, by (group, kind, member).

    A key may have several waiters: a member that asks again while its earlier call is still
    open (its client gave up on it, the server has not noticed yet), or a call of another
    principal naming the member's id (refused by its handler, unregistered at once). A wakeup
    answers every waiter of its key with the same answer, so no call can take another's answer
    away, and an unauthorized call naming a member's id cannot end that member's call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[WaiterKey, list[Waiter]] = {}
        self._by_group: dict[str, set[WaiterKey]] = {}
        self._counts: Counter[str] = Counter()
        #: Set at shutdown: later registrations are answered at once.
        self._closed: ParkFailure | None = None

    def register(
        self, group_id: str, kind: str, member_id: str, loop: asyncio.AbstractEventLoop
    ) -> Waiter:
        """A waiter for the member's `kind` call, registered before its handler runs. After
        `close`, it is answered at once with the closing failure."""
        waiter = Waiter(group_id, kind, member_id, loop)
        with self._lock:
            closed = self._closed
            if closed is None:
                self._waiters.setdefault(waiter.key, []).append(waiter)
                self._by_group.setdefault(group_id, set()).add(waiter.key)
                self._counts[kind] += 1
        if closed is not None:
            waiter.answer(closed)
        return waiter

    def unregister(self, waiter: Waiter) -> None:
        """Forget `waiter` (answered, timed out, given up, or its call was answered at once)."""
        with self._lock:
            self._remove(waiter)

    def deliver(self, group_id: str, wakeups: list[Wakeup]) -> None:
        """Answer the waiters the wakeups name (called after the batch that made them was
        committed, never before). A wakeup nobody waits for (the caller gave up) is dropped:
        the member asks again and is answered from the group's state."""
        answered: list[tuple[Waiter, Any]] = []
        with self._lock:
            for wakeup in wakeups:
                for waiter in list(
                    self._waiters.get((group_id, wakeup.kind, wakeup.member_id), ())
                ):
                    self._remove(waiter)
                    answered.append((waiter, wakeup.response))
        for waiter, response in answered:
            waiter.answer(response)

    def fail_group(self, group_id: str, code: ErrorCode, message: str) -> int:
        """Answer every call waiting on the group with (`code`, `message`): the process let the
        group go (lease lost, dropped, released). Returns how many were answered."""
        with self._lock:
            waiters = [
                waiter
                for key in list(self._by_group.get(group_id, ()))
                for waiter in self._waiters.get(key, ())
            ]
            for waiter in waiters:
                self._remove(waiter)
        failure = ParkFailure(code, message)
        for waiter in waiters:
            waiter.answer(failure)
        return len(waiters)

    def close(self, code: ErrorCode, message: str) -> int:
        """Answer every waiting call with (`code`, `message`), and every later registration too
        (graceful shutdown). Returns how many were answered."""
        failure = ParkFailure(code, message)
        with self._lock:
            self._closed = failure
            waiters = [waiter for waiters in self._waiters.values() for waiter in waiters]
            for waiter in waiters:
                self._remove(waiter)
        for waiter in waiters:
            waiter.answer(failure)
        return len(waiters)

    def counts(self) -> dict[str, int]:
        """Waiting calls by kind (every kind of PARK_KINDS present)."""
        with self._lock:
            return {kind: self._counts.get(kind, 0) for kind in PARK_KINDS}

    def waiting(self, group_id: str) -> int:
        """How many calls wait on the group."""
        with self._lock:
            return sum(len(self._waiters.get(key, ())) for key in self._by_group.get(group_id, ()))

    def _remove(self, waiter: Waiter) -> None:
        """Forget `waiter` if it is still registered. Called with the lock held."""
        key = waiter.key
        waiters = self._waiters.get(key)
        if waiters is None or waiter not in waiters:
            return
        waiters.remove(waiter)
        self._counts[waiter.kind] -= 1
        if waiters:
            return
        del self._waiters[key]
        keys = self._by_group.get(waiter.group_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_group[waiter.group_id]
