"""Protobuf bytes of the wire's per-task entries, built once per task and kept.

A 10,000-task share sent through protobuf's Python API costs a message object and two field
writes per task (about 1.7 us each on the 2-core machine, so 17 ms a share, 170 ms for a
100,000-task PrepareAssignment answer). The entries are small and fixed: `ConnectorTaskId` in
`ConnectorsAndTasks.tasks` (field 2) and `FencingToken` in an `Assignment` or a described member
(`fencing_tokens`). Each entry's bytes are built the first time its task (or task and token)
is sent and kept, bounded by `MAX_ENTRIES`, so that a set in order is encoded by one
`bytes.join` over a dict lookup per task (C calls only) and merged into its message
(`MergeFromString`, protobuf's parser). The bytes are exactly what protobuf itself writes
(tests compare them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from .resources import TaskId

MAX_ENTRIES = 800_000
"""Entries kept per kind before the kind's cache starts afresh (about 100 bytes each)."""

task_of_entry: dict[bytes, TaskId] = {}
"""The reverse of the task entries kept: an entry's bytes -> its task (bounded alike)."""

_TASKS_FIELD = 2  # ConnectorsAndTasks.tasks
_WIRE_LEN = 2  # protobuf's length-delimited wire type
_TASK_ENTRY_KEY = bytes([_TASKS_FIELD << 3 | _WIRE_LEN])


def _encode_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int32 and int64 negatives take ten bytes, as protobuf writes them
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


_SMALL_VARINTS = tuple(_encode_varint(n) for n in range(1 << 14))
"""The varints of 0..16383 (one or two bytes): task numbers and most tokens, looked up."""


def _varint(value: int) -> bytes:
    if 0 <= value < 16384:
        return _SMALL_VARINTS[value]
    if 0 <= value < 1 << 21:  # three bytes: task numbers of a 100,000-task connector
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    return _encode_varint(value)


def _key(field: int) -> bytes:
    return _varint(field << 3 | _WIRE_LEN)


def _string_field(number: int, text: str) -> bytes:
    data = text.encode()
    return _key(number) + _varint(len(data)) + data


_connector_fields: dict[str, bytes] = {}
"""A connector name's field 1 bytes (the first field of both entry kinds), by name: built once
per connector, not once per task (a first delivery of 100,000 tasks built them 200,000 times).
Bounded like the entries."""


def _connector_field(connector: str) -> bytes:
    field = _connector_fields.get(connector)
    if field is None:
        field = _string_field(1, connector)
        if len(_connector_fields) >= MAX_ENTRIES:
            _connector_fields.clear()
        _connector_fields[connector] = field
    return field


def _entry(field_key: bytes, body: bytes) -> bytes:
    return field_key + _varint(len(body)) + body


def length_delimited(field: int, data: bytes) -> bytes:
    """Field `field` holding `data` (a message's or a string's bytes), as protobuf writes it."""
    return _entry(_key(field), data)


def connector_entries(connectors: Sequence[str]) -> bytes:
    """The `ConnectorsAndTasks.connectors` entries (field 1) of `connectors`, in order."""
    return b"".join([_connector_fields.get(c) or _connector_field(c) for c in connectors])


class _Entries:
    """Entry bytes by key; the missing ones built together by `build_many` (one call over
    the misses, not one per entry); bounded (the cache starts afresh)."""

    def __init__(
        self, build_many: Callable[[list[Any]], list[bytes]], max_entries: int = MAX_ENTRIES
    ) -> None:
        self._build_many = build_many
        self._bytes: dict[Any, bytes] = {}
        self._max = max_entries
        self._lock = threading.Lock()
        self.built = 0

    def join(self, keys: Sequence[Any]) -> bytes:
        kept = self._bytes
        found = list(map(kept.get, keys))
        if None in found:
            with self._lock:
                if len(kept) + len(keys) > self._max:
                    kept.clear()
                at = [i for i, entry in enumerate(found) if entry is None]
                missing = [keys[i] for i in at]
                built = self._build_many(missing)
                kept.update(zip(missing, built, strict=True))
                for i, entry in zip(at, built, strict=True):
                    found[i] = entry
                self.built += len(built)
        return b"".join(found)  # type: ignore[arg-type]


def _task_entries(tasks: list[TaskId]) -> list[bytes]:
    """`ConnectorTaskId` entries in `ConnectorsAndTasks.tasks`: proto3 omits a task number of
    0. Kept for `split_resources` too (a member echoes what it was sent)."""
    fields, small, key = _connector_fields, _SMALL_VARINTS, _TASK_ENTRY_KEY
    out: list[bytes] = []
    for task in tasks:
        connector, number = task
        body = fields.get(connector) or _connector_field(connector)
        if number:
            body += b"\x10" + (small[number] if 0 < number < 16384 else _varint(number))
        size = len(body)
        out.append(key + (small[size] if size < 16384 else _varint(size)) + body)
    if len(task_of_entry) < MAX_ENTRIES:
        task_of_entry.update(zip(out, tasks, strict=True))
    return out


def _token_entries(field_key: bytes) -> Callable[[list[tuple[TaskId, int]]], list[bytes]]:
    def build_many(items: list[tuple[TaskId, int]]) -> list[bytes]:
        """`FencingToken`s for tasks: `task` is optional, so 0 is written; token 0 omitted."""
        fields, small = _connector_fields, _SMALL_VARINTS
        out: list[bytes] = []
        for (connector, number), token in items:
            body = (
                (fields.get(connector) or _connector_field(connector))
                + b"\x10"
                + (small[number] if 0 <= number < 16384 else _varint(number))
            )
            if token:
                body += b"\x18" + (small[token] if 0 < token < 16384 else _varint(token))
            size = len(body)
            out.append(field_key + (small[size] if size < 16384 else _varint(size)) + body)
        return out

    return build_many


_tasks = _Entries(_task_entries)

_CONNECTOR_KEY = 0x0A  # ConnectorsAndTasks.connectors (field 1, length-delimited)
_TASK_KEY = 0x12  # ConnectorsAndTasks.tasks (field 2, length-delimited)


class NotPlain(Exception):
    """The bytes hold something `split_resources` does not read (an unknown field, a varint over
    two bytes): the caller decodes them with protobuf."""


def split_resources(data: bytes) -> tuple[list[str], list[TaskId]] | None:
    """`split_entries` without the entries."""
    split = split_entries(data)
    return None if split is None else (split[0], split[2])


def split_entries(data: bytes) -> tuple[list[str], list[bytes], list[TaskId]] | None:
    """A serialized `ConnectorsAndTasks` read without a protobuf object per task: its connector
    names, its task entries' bytes and its tasks, in the order sent. A task whose entry bytes
    were seen before is looked up; others are read from the entry. The loop runs in Python
    bytecode, so other threads get the interpreter between entries (one C call over 100,000
    tasks held it for the whole decode, delaying every other group's heartbeats). None when the
    bytes hold anything but the two fields in their usual encoding (the caller then decodes
    with protobuf)."""
    connectors: list[str] = []
    entries: list[bytes] = []
    add_entry = entries.append
    pos, end = 0, len(data)
    try:
        while pos < end:
            here, key, length = pos, data[pos], data[pos + 1]
            start = pos + 2
            if length & 0x80:
                if data[start] & 0x80:
                    return None
                length = (length & 0x7F) | (data[start] << 7)
                start += 1
            pos = start + length
            if key == _TASK_KEY:
                add_entry(data[here:pos])
            elif key == _CONNECTOR_KEY:
                connectors.append(data[start:pos].decode())
            else:
                return None
        if pos != end:
            return None
        return connectors, entries, tasks_of_entries(entries)
    except (IndexError, UnicodeDecodeError, NotPlain):
        return None


def tasks_of_entries(entries: list[bytes]) -> list[TaskId]:
    """The tasks of `ConnectorTaskId` entries' bytes: each one seen before looked up (in C),
    the others read and remembered (bounded). NotPlain for an entry it does not read."""
    known = task_of_entry
    found = list(map(known.get, entries))
    if None in found:
        for i, task in enumerate(found):
            if task is None:
                found[i] = known[entries[i]] = read_task_entry(entries[i])
        if len(known) > MAX_ENTRIES:
            known.clear()
    return found  # type: ignore[return-value]  # every None was read above


def read_task_entry(entry: bytes) -> TaskId:
    """A `ConnectorTaskId` from its entry bytes (key and length first)."""
    pos = 2 if entry[1] < 0x80 else 3
    connector, number = "", 0
    end = len(entry)
    while pos < end:
        key = entry[pos]
        if key == 0x0A:
            length = entry[pos + 1]
            if length & 0x80:
                raise NotPlain
            connector = entry[pos + 2 : pos + 2 + length].decode()
            pos += 2 + length
        elif key == 0x10:
            number, shift, pos = 0, 0, pos + 1
            while True:
                byte = entry[pos]
                number |= (byte & 0x7F) << shift
                pos += 1
                shift += 7
                if not byte & 0x80:
                    break
            number &= 0xFFFFFFFF  # an int32: the low 32 bits, signed, as protobuf reads it
            if number >= 1 << 31:
                number -= 1 << 32
        else:
            raise NotPlain
    return TaskId(connector, number)


_tokens: dict[int, _Entries] = {}
_tokens_lock = threading.Lock()


def task_entries(ordered: Sequence[TaskId]) -> bytes:
    """`ConnectorsAndTasks.tasks` entries for `ordered`, in that order, as protobuf bytes."""
    return _tasks.join(ordered)


def one_token_entries(field: int, ordered: Sequence[TaskId], token: int) -> bytes:
    """Entries of a repeated `FencingToken` field numbered `field` for the tasks `ordered` (of
    one connector), all at `token`, in that order, as protobuf bytes: built from the task
    numbers alone (no (task, token) pair per task, none kept: the caller keeps the result)."""
    if not ordered:
        return b""
    key, small = _key(field), _SMALL_VARINTS
    head = _connector_field(ordered[0][0]) + b"\x10"
    tail = b"\x18" + (small[token] if 0 < token < 16384 else _varint(token)) if token else b""
    parts: list[bytes] = []
    add = parts.append
    for _, number in ordered:
        body = head + (small[number] if 0 <= number < 16384 else _varint(number)) + tail
        size = len(body)
        add(key + (small[size] if size < 16384 else _varint(size)) + body)
    return b"".join(parts)


def token_entries(field: int, ordered: Sequence[tuple[TaskId, int]]) -> bytes:
    """Entries of a repeated `FencingToken` field numbered `field` for the (task, token) pairs
    `ordered`, in that order, as protobuf bytes."""
    entries = _tokens.get(field)
    if entries is None:
        with _tokens_lock:
            entries = _tokens.setdefault(field, _Entries(_token_entries(_key(field))))
    return entries.join(ordered)
