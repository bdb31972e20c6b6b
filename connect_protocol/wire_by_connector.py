"""A `ConnectorsAndTasks` message's tasks read and written by connector (issue 24).

A member's share is mostly whole connectors that do not change from one message to the next:
each connector's entries were sent (or received) before, byte for byte. So each connector's
tasks are kept as one `ConnectorTasks` by its entries' bytes (`SeenConnectorTasks`, bounded):
writing a set kept by connector joins its connectors' kept bytes, and reading a message finds
each connector's run of entries by one comparison of bytes (in C) against the runs seen with
the same first entry, and reads task by task only the runs it has not seen. A message read so
holds the very `ConnectorTasks` that were sent, so the set algebra on it and on the member's
sets skips those connectors in O(1) (`ResourceSet`).
"""

from __future__ import annotations

import threading
from itertools import islice
from operator import itemgetter, lt

from .resources import ConnectorTasks, ResourceSet, TaskId
from .wire_entries import NotPlain, task_entries, tasks_of_entries

_TASK_KEY = 0x12  # ConnectorsAndTasks.tasks (field 2, length-delimited)
_CONNECTOR_KEY = 0x0A  # ConnectorsAndTasks.connectors, and ConnectorTaskId.connector (field 1)
_NUMBER = itemgetter(1)


RUNS_PER_FIRST_ENTRY = 4
"""Runs kept per first entry (the newest): a connector's tasks split among many members, or
changing while a large group forms, start with the same entry in many runs, and trying them
all on every read made reading grow with the group (issue 24)."""


class SeenConnectorTasks:
    """Connectors' tasks lately written or read, by their entries' bytes; bounded by the tasks
    it holds (it starts afresh)."""

    def __init__(self, max_tasks: int) -> None:
        self.max_tasks = max_tasks
        self._by_bytes: dict[bytes, ConnectorTasks] = {}
        self._by_first: dict[bytes, list[ConnectorTasks]] = {}  # the newest first
        self._tasks = 0
        self._lock = threading.Lock()  # what is kept changes under it; reads take none

    def entries(self, held: ConnectorTasks) -> bytes:
        """`held`'s entries in order (built once per `ConnectorTasks`), and `held` remembered
        for them in place of any other: what is written is what the coordinator holds (its
        catalogue, its members' sets), so a message that echoes it is read as those objects
        (an Install's shares as the catalogue's connectors: checked against it in O(1))."""
        entries = held.wire
        if entries is None:
            entries = held.wire = task_entries(held.ordered())
        if self._by_bytes.get(entries) is not held:
            self._keep(entries, held, replace=True)
        return entries

    def decoded(
        self, entries: bytes, first_entry: bytes, ordered: tuple[TaskId, ...]
    ) -> ConnectorTasks:
        """The `ConnectorTasks` of one connector's `entries` (its tasks `ordered`)."""
        held = self._by_bytes.get(entries)
        if held is None:
            held = ConnectorTasks(ordered, ordered)
            held.wire = entries
            self._keep(entries, held, first_entry)
        return held

    def _keep(
        self,
        entries: bytes,
        held: ConnectorTasks,
        first_entry: bytes | None = None,
        replace: bool = False,
    ) -> None:
        if first_entry is None:
            first_entry = _first_entry(entries)
        with self._lock:
            self._keep_locked(entries, held, first_entry, replace)

    def _keep_locked(
        self, entries: bytes, held: ConnectorTasks, first_entry: bytes, replace: bool
    ) -> None:
        if self._tasks + len(held) > self.max_tasks:
            self._by_bytes.clear()
            self._by_first.clear()
            self._tasks = 0
        before = self._by_bytes.get(entries)
        if before is not None and not replace:
            return
        self._by_bytes[entries] = held
        runs = self._by_first.setdefault(first_entry, [])
        if before is not None and before in runs:
            runs.remove(before)
        if before is None:
            self._tasks += len(held)
        runs.insert(0, held)  # the newest first; at most RUNS_PER_FIRST_ENTRY tried
        del runs[RUNS_PER_FIRST_ENTRY:]

    def read(self, data: bytes) -> ResourceSet | None:
        """The set a serialized `ConnectorsAndTasks` names, kept by connector, when its tasks
        are in order without a task twice (as every encoder here writes them) and it holds
        nothing but the two fields in their usual encoding; else None (the caller reads it
        another way)."""
        connectors: list[str] = []
        shards: dict[str, ConnectorTasks] = {}
        size = 0
        previous = ""
        pos, end = 0, len(data)
        try:
            while pos < end:
                key = data[pos]
                start, stop = _field(data, pos)
                if key == _CONNECTOR_KEY:
                    connectors.append(data[start:stop].decode())
                    pos = stop
                    continue
                if key != _TASK_KEY:
                    return None
                name = _connector_bytes(data, start, stop)
                connector = name.decode()
                if shards and connector <= previous:
                    return None  # out of order, or a connector's tasks in two runs
                held, pos = self._run(data, pos, stop, name)
                if held is None:
                    return None
                shards[connector] = held
                size += len(held)
                previous = connector
            return ResourceSet.kept_by_connector_from(frozenset(connectors), shards, size)
        except (IndexError, UnicodeDecodeError, NotPlain):
            return None

    def _run(
        self, data: bytes, here: int, first_stop: int, name: bytes
    ) -> tuple[ConnectorTasks | None, int]:
        """The run of entries of connector `name` starting at `here` (its first entry ends at
        `first_stop`): a run seen before if one matches and ends where the connector does (at
        most one can: of two that match, one is the start of the other), else read entry by
        entry. Returns it (None: not in order) and where it ends."""
        first = data[here:first_stop]
        for seen in self._by_first.get(first, ()):
            wire = seen.wire
            assert wire is not None
            after = here + len(wire)
            if data.startswith(wire, here) and not _same_connector_at(data, after, name):
                return seen, after
        entries: list[bytes] = []
        pos, end = here, len(data)
        while pos < end and data[pos] == _TASK_KEY:
            start, stop = _field(data, pos)
            if pos != here and _connector_bytes(data, start, stop) != name:
                break
            entries.append(data[pos:stop])
            pos = stop
        tasks = tasks_of_entries(entries)
        numbers = list(map(_NUMBER, tasks))
        if not all(map(lt, numbers, islice(numbers, 1, None))):
            return None, pos
        return self.decoded(data[here:pos], first, tuple(tasks)), pos


def _field(data: bytes, pos: int) -> tuple[int, int]:
    """The (start, stop) of the length-delimited field whose key is at `pos` (its length a
    varint of one or two bytes; NotPlain otherwise)."""
    length = data[pos + 1]
    start = pos + 2
    if length & 0x80:
        if data[start] & 0x80:
            raise NotPlain
        length = (length & 0x7F) | (data[start] << 7)
        start += 1
    stop = start + length
    if stop > len(data):
        raise NotPlain
    return start, stop


def _connector_bytes(data: bytes, start: int, stop: int) -> bytes:
    """The connector name's bytes of the task entry whose body is data[start:stop] (its first
    field, as every encoder writes it; NotPlain otherwise)."""
    if start >= stop or data[start] != _CONNECTOR_KEY or data[start + 1] & 0x80:
        raise NotPlain
    return data[start + 2 : start + 2 + data[start + 1]]


def _same_connector_at(data: bytes, pos: int, name: bytes) -> bool:
    """Whether a task entry of connector `name` starts at `pos`."""
    if pos >= len(data) or data[pos] != _TASK_KEY:
        return False
    start, stop = _field(data, pos)
    return _connector_bytes(data, start, stop) == name


def _first_entry(entries: bytes) -> bytes:
    return entries[: _field(entries, 0)[1]]
