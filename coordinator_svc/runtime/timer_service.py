"""Keyed timers on one background thread.

Re-arming a key is a dict write (heartbeats re-arm their session timer every time), so the heap
holds at most one entry per key; a popped entry whose key was moved later is pushed again, and one
whose key was cancelled is dropped. A superseded timer therefore never fires.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable

from ..core.results import TimerKey

log = logging.getLogger(__name__)

FullKey = tuple[str, TimerKey]  # (group id, timer key)
Fire = Callable[[str, TimerKey], None]
NowMs = Callable[[], int]


class TimerService:
    def __init__(self, now_ms: NowMs, fire: Fire) -> None:
        self._now_ms = now_ms
        self._fire = fire
        self._deadlines: dict[FullKey, int] = {}
        self._in_heap: dict[FullKey, int] = {}
        self._heap: list[tuple[int, int, FullKey]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="coordinator-timers", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def schedule(self, group_id: str, key: TimerKey, deadline_ms: int) -> None:
        full = (group_id, key)
        with self._cond:
            self._deadlines[full] = deadline_ms
            queued = self._in_heap.get(full)
            if queued is None or deadline_ms < queued:
                self._in_heap[full] = deadline_ms
                heapq.heappush(self._heap, (deadline_ms, next(self._seq), full))
                if self._heap[0][2] == full:
                    self._cond.notify()

    def cancel(self, group_id: str, key: TimerKey) -> None:
        with self._cond:
            self._deadlines.pop((group_id, key), None)

    def cancel_group(self, group_id: str) -> None:
        with self._cond:
            for full in [k for k in self._deadlines if k[0] == group_id]:
                del self._deadlines[full]

    def deadline(self, group_id: str, key: TimerKey) -> int | None:
        """The key's armed deadline, or None. None while a popped key is being fired, unless it
        was scheduled again meanwhile."""
        with self._cond:
            return self._deadlines.get((group_id, key))

    def pending(self, group_id: str) -> dict[TimerKey, int]:
        with self._cond:
            return {k[1]: d for k, d in self._deadlines.items() if k[0] == group_id}

    def _next_due(self) -> FullKey | None:
        """Pop the next due key, or wait. Called with the condition held."""
        while not self._stopped:
            if not self._heap:
                self._cond.wait()
                continue
            deadline, _, full = self._heap[0]
            now = self._now_ms()
            if deadline > now:
                self._cond.wait(timeout=(deadline - now) / 1000)
                continue
            heapq.heappop(self._heap)
            if self._in_heap.get(full) == deadline:
                del self._in_heap[full]
            current = self._deadlines.get(full)
            if current is None:
                continue
            if current > deadline:
                if full not in self._in_heap:
                    self._in_heap[full] = current
                    heapq.heappush(self._heap, (current, next(self._seq), full))
                continue
            del self._deadlines[full]
            return full
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                full = self._next_due()
            if full is None:
                return
            try:
                self._fire(full[0], full[1])
            except Exception:  # a timer must never kill the timer thread
                log.exception("timer %s of group %s failed", full[1], full[0])
