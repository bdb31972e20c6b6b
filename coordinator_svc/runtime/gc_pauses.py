"""The interpreter's garbage collector in a coordinator that holds large groups: its start-up
heap frozen, and its pauses measured.

A collection holds the interpreter for its whole run, so every group of the process waits for
it. Its cost follows the containers alive, not the garbage: a coordinator holding a
100,000-task group keeps about 1.3 million references in sets, tuples and dicts, and a full
collection of that heap took 200-500 ms on the 2-core benchmark machine while the group changed
(measured with run-large, issue 24), collecting next to nothing. So:

- `tune` freezes what start-up built (modules, classes, configuration: never garbage) out of
  every later collection. CPython's thresholds stay: raised ones (50,000 / 20 / 100) halved the
  total time spent collecting with a 100,000-task group but cost the ordinary path 3-15 %
  (run-coordinator, same hour), and did not shorten the longest pauses.
- `observe` reports every collection's pause in `coordinator_gc_pause_seconds{generation}`
  and logs one over `SLOW_PAUSE_S`, at most once a minute, so that an operator can tell a GC
  pause from the coordinator's own work when heartbeats of unrelated groups slow down together.
- After a full collection that held the interpreter for `FREEZE_AFTER_S` or longer and freed
  fewer than `FREEZE_BELOW_COLLECTED` objects, the survivors are frozen too: a group loaded or
  grown by 100,000 tasks leaves a million long-lived references that every later full
  collection walked again for nothing (a 58 ms pause in the middle of a 100,000-task put, the
  longest hold of the interpreter left there). It is done at most once per `FREEZE_EVERY_S`
  (5 s) and logged (`gc_frozen`): while a 1,000-member group formed, full collections ran every
  1-2 s, each walking the growing group again for nothing, from 36 to 450 ms, when freezing was
  allowed once a minute (issue 24).
- The price of freezing: an object frozen while alive that later becomes part of unreachable
  cycles is not freed by a collection (objects without cycles, such as the sets, tuples and
  strings of a group's state, are freed as usual when dropped). So every `THAW_EVERY_S` (10
  minutes) after a freeze, the frozen objects are handed back to the collector
  (`gc.unfreeze`, logged `gc_thawed`): the next full collection walks the whole heap once,
  frees such cycles, and the freezing starts again. Nothing leaks for good; a frozen cycle
  waits at most that long.
(`gc.get_freeze_count()` walks every frozen object: never called here.)
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from prometheus_client import Histogram

from connect_protocol.logs import fields

log = logging.getLogger(__name__)

SLOW_PAUSE_S = 0.1
"""A pause this long or longer is logged (at most once per `LOG_EVERY_S`)."""

LOG_EVERY_S = 60.0

FREEZE_AFTER_S = 0.02
"""A full collection this long that freed little freezes its survivors."""

FREEZE_BELOW_COLLECTED = 1_000

FREEZE_EVERY_S = 5.0
"""Survivors are frozen at most this often."""

THAW_EVERY_S = 600.0
"""How long after the first freeze since the last thaw the frozen objects are handed back to
the collector."""


def tune() -> None:
    """Freeze the start-up heap out of later collections (the module docstring)."""
    gc.collect()
    gc.freeze()


class PauseObserver:
    """A `gc.callbacks` entry timing each collection (it runs on the collecting thread, which
    holds the interpreter, so two collections never overlap)."""

    def __init__(self, pauses: Histogram) -> None:
        self.pauses = pauses
        self._started = 0.0
        self._last_logged = -LOG_EVERY_S
        self._unlogged = 0
        self.frozen_times = 0
        self.thawed_times = 0
        self._last_frozen = -FREEZE_EVERY_S
        self._frozen_since: float | None = None  # the first freeze since the last thaw

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
            return
        pause = now - self._started
        generation = int(info.get("generation", 0))
        self.pauses.labels(str(generation)).observe(pause)
        collected = int(info.get("collected", 0))
        if self._frozen_since is not None and now - self._frozen_since >= THAW_EVERY_S:
            self._thaw()
        elif (
            generation == 2
            and pause >= FREEZE_AFTER_S
            and collected < FREEZE_BELOW_COLLECTED
            and now - self._last_frozen >= FREEZE_EVERY_S
        ):
            self._last_frozen = now
            if self._frozen_since is None:
                self._frozen_since = now
            self._freeze_survivors(pause, collected)
        if pause < SLOW_PAUSE_S:
            return
        if now - self._last_logged < LOG_EVERY_S:
            self._unlogged += 1
            return
        log.warning(
            "garbage collection held the interpreter for %.0f ms",
            pause * 1000,
            extra=fields(
                event="gc_pause",
                generation=generation,
                pause_ms=round(pause * 1000),
                collected=info.get("collected"),
                slow_pauses_not_logged=self._unlogged,
            ),
        )
        self._last_logged, self._unlogged = now, 0

    def _freeze_survivors(self, pause: float, collected: int) -> None:
        """Move every tracked object out of later collections (called when a collection has
        just ended: the generations hold the survivors and the youngest objects)."""
        gc.freeze()
        self.frozen_times += 1
        log.info(
            "froze the survivors of a %.0f ms full collection out of later ones",
            pause * 1000,
            extra=fields(
                event="gc_frozen",
                pause_ms=round(pause * 1000),
                collected=collected,
                times=self.frozen_times,
            ),
        )

    def _thaw(self) -> None:
        """Hand every frozen object back to the collector (O(1): the permanent generation is
        spliced into the oldest one); the next full collection walks them once."""
        gc.unfreeze()
        self.thawed_times += 1
        self._frozen_since = None
        log.info(
            "handed the frozen heap back to the garbage collector",
            extra=fields(event="gc_thawed", times=self.thawed_times),
        )


def observe(pauses: Histogram) -> PauseObserver:
    """Time every collection from now on into `pauses` (labelled by generation)."""
    observer = PauseObserver(pauses)
    gc.callbacks.append(observer)
    return observer


def stop_observing(observer: PauseObserver) -> None:
    if observer in gc.callbacks:
        gc.callbacks.remove(observer)
