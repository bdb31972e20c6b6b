"""Sorting large collections without holding the interpreter for the whole sort.

`sorted()` is one C call: over 100,000 tasks it holds the GIL for 50-100 ms, and every other
thread of the process waits, other groups' heartbeats included (issue 24: a 100,000-task
PutConnector delayed another group's heartbeats by up to 300 ms, and the long holds were sorts).
Above `CHUNK` items, `sorted_in_chunks` sorts chunks (each a short C call) and merges them with
`heapq.merge`, whose loop runs in Python bytecode, so the interpreter passes between threads
every switch interval. The result is exactly `sorted(items)`; it costs somewhat more CPU in all,
paid only for large inputs.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")

CHUNK = 16_384
"""Items sorted by one C call (a few milliseconds of tuples on the 2-core machine)."""


def sorted_in_chunks(items: Iterable[T]) -> list[T]:
    """`sorted(items)`, with no single C call sorting more than `CHUNK` items."""
    listed: list[Any] = items if isinstance(items, list) else list(items)
    if len(listed) <= CHUNK:
        return sorted(listed)
    runs = [sorted(listed[at : at + CHUNK]) for at in range(0, len(listed), CHUNK)]
    return list(heapq.merge(*runs))
