"""The stored form of resource sets and fencing tokens in the members and target tables.

A small set is stored as the core writes it everywhere (`ResourceSet.to_json`,
`FencingTokens.to_json`: one object per task), so that rows of small groups read as before.
A set of more than `RANGES_ABOVE` (32) tasks is stored with its tasks as runs of consecutive task
numbers per connector (`task_ranges`: `{"connector", "first", "last"}`, plus `"token"` for
tokens): a reconciling member of a 100,000-task group holds 10,000 tasks, and its row was about
a megabyte of JSONB written on every change of its state, 30-50 ms of each commit (issue 24);
a catalogue's connectors are whole runs, so such a share is a few hundred entries.

    {"connectors": [...], "task_ranges": [{"connector": "A", "first": 0, "last": 99}]}
    {"connectors": {...}, "task_ranges": [{"connector": "A", "first": 0, "last": 9, "token": 7}]}

Both forms are read, whichever a row holds (rows written before this form, and small sets). The
audit export's snapshot queries flatten both (`audit_export.snapshot_sql`). The form is a
function of the set alone, so equal sets are equal text (the group listing compares a member's
`assigned` with its target's `resources`).

Events carry whole sets too (an ASSIGNMENT_DELIVERED names everything its member now holds):
a set in an event's payload of more than `RANGES_ABOVE` tasks is stored the same way
(`event_payload_column`); the audit export reads both forms (`audit_export.events`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from itertools import islice
from operator import lt
from typing import Any

from connect_protocol.resources import EMPTY, ConnectorTasks, ResourceSet, SetJson, TaskId
from connect_protocol.tokens import NO_TOKENS, FencingTokens

RANGES_ABOVE = 32
"""Sets of more tasks than this are stored as ranges. Was 256: while 1,000 members form over
100,000 tasks, each holds about 100 tasks, and the rows and events of their every change of
state wrote one JSON object per task (task and token), a tenth of the coordinator's time; as
runs, a share of one connector is one entry (issue 24). Below it the plain form costs no more."""

STORED_SET_FORMS = ("plain", "ranges")
"""The values of the database's `stored_set_form` setting (migration 0008)."""

_ranges = True


def use_ranges(enabled: bool) -> None:
    """Write large sets as ranges (the default) or plain, as the database's `stored_set_form`
    setting says (`serve` reads it at start): a release before this form reads a ranged set
    as one without tasks, so a database that may still have older coordinators running
    during a rolling update keeps the plain form until an operator switches it (migration
    0008). Both forms are always read."""
    global _ranges
    _ranges = enabled


def ranges_in_use() -> bool:
    return _ranges


_AFTER_EVERY_TASK = 1 << 64
"""A task number above any task's: (connector, it) sorts after each of the connector's tasks."""


def resources_column(resources: ResourceSet) -> dict[str, Any]:
    """The stored form of `resources` (see the module docstring)."""
    if resources.task_count() <= RANGES_ABOVE or not _ranges:
        return resources.to_json()
    return {"connectors": resources.sorted_connectors(), "task_ranges": task_runs(resources)}


def task_runs(resources: ResourceSet) -> list[dict[str, Any]]:
    """The task runs in order, `{"connector", "first", "last"}` each. A connector's tasks are
    found by bisection in the set's order, and those numbered from the first to the last
    without a gap are one run found without a look at each task: O(connectors x log(tasks))
    for whole connectors."""
    shards = resources.kept_by_connector()
    if shards is not None:  # each connector's runs found once and kept with its tasks
        return [
            {"connector": connector, "first": first, "last": last}
            for connector in sorted(shards)
            for first, last in shards[connector].runs()
        ]
    ordered = resources.ordered_tasks()
    runs: list[dict[str, Any]] = []
    for connector, at, stop in _connector_spans(ordered, paired=False):
        first, last = ordered[at][1], ordered[stop - 1][1]
        if last - first == stop - at - 1:  # distinct and sorted: no gap
            runs.append({"connector": connector, "first": first, "last": last})
        else:
            run: dict[str, Any] | None = None
            for _, number in ordered[at:stop]:
                if run is not None and run["last"] == number - 1:
                    run["last"] = number
                else:
                    run = {"connector": connector, "first": number, "last": number}
                    runs.append(run)
    return runs


def _connector_spans(ordered: Sequence[Any], paired: bool) -> Iterator[tuple[str, int, int]]:
    """(connector, start, stop) of each connector's entries in `ordered`, sorted tasks (or with
    `paired`, sorted (task, token) pairs), each connector's end found by bisection."""
    at, end = 0, len(ordered)
    while at < end:
        connector = ordered[at][0][0] if paired else ordered[at][0]
        probe = (connector, _AFTER_EVERY_TASK)  # after each of the connector's tasks
        stop = bisect_right(ordered, (probe,) if paired else probe, at)
        yield connector, at, stop
        at = stop


def resources_from_column(data: Any) -> ResourceSet:
    """A stored set in either form (absent or malformed: empty)."""
    if not isinstance(data, dict):
        return EMPTY
    runs = data.get("task_ranges")
    if runs is None:
        return ResourceSet.from_json(data)
    if isinstance(runs, dict):  # the Prepare snapshot's form: {connector: [[first, last]]}
        runs = [
            {"connector": connector, "first": first, "last": last}
            for connector, spans in runs.items()
            for first, last in spans
        ]
    listed: dict[str, list[TaskId]] = {}
    for run in runs:
        connector = str(run["connector"])
        tasks = listed.setdefault(connector, [])
        tasks.extend(TaskId(connector, n) for n in range(int(run["first"]), int(run["last"]) + 1))
    shards: dict[str, ConnectorTasks] = {}
    for connector, tasks in listed.items():
        if tasks:  # kept by connector, each connector's order kept when the runs were in order
            in_order = all(map(lt, tasks, islice(tasks, 1, None)))
            shards[connector] = ConnectorTasks(tasks, tuple(tasks) if in_order else None)
    connectors = frozenset(str(c) for c in data.get("connectors") or ())
    return ResourceSet.kept_by_connector_from(connectors, shards)


def tokens_column(tokens: FencingTokens) -> dict[str, Any]:
    """The stored form of `tokens`: runs of consecutive tasks of a connector with one token."""
    shards = tokens.by_connector()
    if len(tokens) - len(tokens.connectors()) <= RANGES_ABOVE or not _ranges:
        return tokens.to_json()
    runs = [  # each connector's runs found once and kept with its tokens
        {"connector": connector, "first": first, "last": last, "token": token}
        for connector in sorted(shards)
        for first, last, token in shards[connector].runs()
    ]
    return {"connectors": dict(tokens.connectors()), "task_ranges": runs}


def tokens_from_column(data: Any) -> FencingTokens:
    """Stored tokens in either form (absent or malformed: none)."""
    if not isinstance(data, dict):
        return NO_TOKENS
    runs = data.get("task_ranges")
    if runs is None:
        return FencingTokens.from_json(data)
    connectors = data.get("connectors") or {}
    return FencingTokens.from_runs(
        {str(c): int(t) for c, t in connectors.items()} if isinstance(connectors, dict) else {},
        (
            (str(run["connector"]), int(run["first"]), int(run["last"]), int(run["token"]))
            for run in runs
        ),
    )


def event_payload_column(payload: Mapping[str, Any]) -> dict[str, Any]:
    """An event's payload as stored: every resource set in it (`ResourceSet.to_json`'s shape,
    `{"connectors", "tasks"}`, or a `SetJson`) of more than `RANGES_ABOVE` tasks with its
    tasks as runs, as `resources_column` writes a row's set; the rest as it is. The sets' task
    lists are in order, so a whole connector is one run."""
    out = dict(payload)
    for key, value in payload.items():
        if isinstance(value, SetJson):  # written from the set itself, never as task objects
            out[key] = resources_column(value.resources)
        elif (
            _ranges
            and isinstance(value, dict)
            and isinstance(value.get("tasks"), list)
            and len(value["tasks"]) > RANGES_ABOVE
            and value.keys() <= {"connectors", "tasks"}
        ):
            out[key] = {
                "connectors": value.get("connectors", []),
                "task_ranges": _listed_runs(value["tasks"]),
            }
    return out


def _listed_runs(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of `{"connector", "task"}` objects, consecutive numbers of one connector each (in
    the order given: sorted tasks give the fewest)."""
    runs: list[dict[str, Any]] = []
    run: dict[str, Any] | None = None
    for task in tasks:
        connector, number = task["connector"], task["task"]
        if run is not None and run["last"] == number - 1 and run["connector"] == connector:
            run["last"] = number
        else:
            run = {"connector": connector, "first": number, "last": number}
            runs.append(run)
    return runs
