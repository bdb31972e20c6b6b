"""Resources (connectors and tasks) and immutable sets of them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import filterfalse, islice
from typing import NamedTuple, Protocol

from .logs import LOG_LIST_ITEMS, clipped
from .ordering import sorted_in_chunks


class TaskId(NamedTuple):
    """A task of a connector: `connector-task`, tasks numbered from 0.

    A tuple, so that hashing, equality and ordering run in C: a group's sets hold 100,000 of
    them, and every set operation, sort and lookup on them was a Python call per task when this
    was a dataclass (issue 24). It equals the plain tuple `(connector, task)`.
    """

    connector: str
    task: int

    def __str__(self) -> str:
        return f"{self.connector}-{self.task}"


DESCRIBE_ITEMS = 20
"""Names a `ResourceSet.describe` writes before it only counts."""


@dataclass(frozen=True, slots=True)
class ResourceSet:
    """An immutable set of connectors and tasks, with the usual set algebra.

    Its tasks in order are computed once per set and kept (`ordered_tasks`): a member's
    10,000-task assignment is written to its row, sent in answers and described, and a sort of
    10,000 tasks costs milliseconds each time (issue 24). So are the tasks' JSON objects
    (`to_json`), which a member's row and the event of the same change both write.
    """

    connectors: frozenset[str] = frozenset()
    tasks: frozenset[TaskId] = frozenset()
    _ordered_tasks: tuple[TaskId, ...] | None = field(
        default=None, init=False, repr=False, compare=False, hash=False
    )
    _tasks_json: list[dict[str, object]] | None = field(
        default=None, init=False, repr=False, compare=False, hash=False
    )

    @staticmethod
    def of(
        connectors: Iterable[str] = (), tasks: Iterable[TaskId | tuple[str, int]] = ()
    ) -> ResourceSet:
        return ResourceSet(
            frozenset(connectors),
            frozenset(t if isinstance(t, TaskId) else TaskId(t[0], t[1]) for t in tasks),
        )

    @staticmethod
    def in_order(
        connectors: frozenset[str], tasks: frozenset[TaskId], ordered: tuple[TaskId, ...] | None
    ) -> ResourceSet:
        """A set whose tasks' order is already known (`ordered`: exactly `tasks`, sorted)."""
        out = ResourceSet(connectors, tasks)
        if ordered is not None:
            object.__setattr__(out, "_ordered_tasks", ordered)
        return out

    # The set algebra keeps a known order: a share changes by a few tasks at a time, and sorting
    # 10,000 tasks again after each change cost more than the change (issue 24). A result's
    # order is taken from an operand's (filtered in C, or two sorted runs merged by one timsort
    # pass) when that operand's order is known and not much longer than the result.

    def __or__(self, other: ResourceSet) -> ResourceSet:
        # Sets are immutable: a union with nothing is the other side itself, not a copy.
        if not other.tasks and other.connectors <= self.connectors:
            return self
        if not self.tasks and self.connectors <= other.connectors:
            return other
        tasks = self.tasks | other.tasks
        ordered: tuple[TaskId, ...] | None = None
        mine, theirs = self._ordered_tasks, other._ordered_tasks
        if mine is not None and (theirs is not None or len(other.tasks) * 4 <= len(mine)):
            added = [*filterfalse(self.tasks.__contains__, theirs or other.tasks)]
            if theirs is None:
                added = sorted_in_chunks(added)
            ordered = tuple(sorted((*mine, *added))) if added else mine
        elif theirs is not None and len(self.tasks) * 4 <= len(theirs):
            added = sorted_in_chunks(filterfalse(other.tasks.__contains__, self.tasks))
            ordered = tuple(sorted((*theirs, *added))) if added else theirs
        return ResourceSet.in_order(self.connectors | other.connectors, tasks, ordered)

    def __and__(self, other: ResourceSet) -> ResourceSet:
        tasks = self.tasks & other.tasks
        source = self._ordered_tasks
        theirs = other._ordered_tasks
        if theirs is not None and (source is None or len(theirs) < len(source)):
            source = theirs
        return ResourceSet.in_order(
            self.connectors & other.connectors, tasks, _kept_order(tasks, source)
        )

    def __sub__(self, other: ResourceSet) -> ResourceSet:
        tasks = self.tasks - other.tasks
        return ResourceSet.in_order(
            self.connectors - other.connectors, tasks, _kept_order(tasks, self._ordered_tasks)
        )

    def __le__(self, other: ResourceSet) -> bool:
        return self.connectors <= other.connectors and self.tasks <= other.tasks

    def __bool__(self) -> bool:
        return bool(self.connectors) or bool(self.tasks)

    def __len__(self) -> int:
        return len(self.connectors) + len(self.tasks)

    def isdisjoint(self, other: ResourceSet) -> bool:
        return self.connectors.isdisjoint(other.connectors) and self.tasks.isdisjoint(other.tasks)

    def sorted_connectors(self) -> list[str]:
        return sorted(self.connectors)

    def sorted_tasks(self) -> list[TaskId]:
        return list(self.ordered_tasks())

    def ordered_tasks(self) -> tuple[TaskId, ...]:
        """The tasks sorted by (connector, task), sorted on the first call only."""
        ordered = self._ordered_tasks
        if ordered is None:
            ordered = tuple(sorted_in_chunks(self.tasks))  # (connector, task) tuples: in C
            object.__setattr__(self, "_ordered_tasks", ordered)
        return ordered

    def names(self) -> Iterator[str]:
        """Every resource as a display name: connectors as `A`, tasks as `A-0`, sorted."""
        yield from self.sorted_connectors()
        yield from (str(t) for t in self.sorted_tasks())

    def describe(self, limit: int = DESCRIBE_ITEMS) -> str:
        """The set for a message: its first `limit` names, then how many there are in all (an
        install refused for 100,000 unassigned tasks was answered with all their names)."""
        size = len(self.connectors) + len(self.tasks)
        shown = ", ".join(islice(self.names(), limit))
        if size <= limit:
            return f"[{shown}]"
        return f"[{shown}, ... {size:,} in all]"

    def to_json(self) -> dict[str, object]:
        """{"connectors": [name], "tasks": [{"connector", "task"}]}, each sorted: the shape of
        the database's columns and the audit events. The lists are new; the task objects are
        built once per set and shared by every result (not to be changed)."""
        tasks_json = self._tasks_json
        if tasks_json is None:
            tasks_json = [{"connector": c, "task": n} for c, n in self.ordered_tasks()]
            object.__setattr__(self, "_tasks_json", tasks_json)
        return {"connectors": self.sorted_connectors(), "tasks": list(tasks_json)}

    def payload(self) -> SetJson:
        """The set as an event's payload value: `to_json`'s mapping, its task objects built only
        if something reads them (the store writes a large set as runs straight from the set)."""
        return SetJson(self)

    @staticmethod
    def from_json(data: object) -> ResourceSet:
        if not isinstance(data, dict):
            return EMPTY
        tasks = [TaskId(str(t["connector"]), int(t["task"])) for t in data.get("tasks", [])]
        return ResourceSet(frozenset(str(c) for c in data.get("connectors", [])), frozenset(tasks))


EMPTY = ResourceSet()


class SetJson(Mapping[str, object]):
    """`ResourceSet.to_json`'s mapping for an event's payload, built when it is read.

    An ASSIGNMENT_DELIVERED names everything its member holds: the JSON objects of a
    10,000-task share were built for every change of a reconciling member, and then walked
    again to store the set as task runs, a quarter of the heartbeat's time (issue 24). The
    store (`stored_sets.event_payload_column`) and the log lines (`logs.brief`, through
    `log_brief`) read `resources` instead; anything else reads the mapping, equal to the dict.
    """

    __slots__ = ("resources",)

    def __init__(self, resources: ResourceSet) -> None:
        self.resources = resources

    def __getitem__(self, key: str) -> object:
        return self.resources.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(("connectors", "tasks"))

    def __len__(self) -> int:
        return 2

    def __repr__(self) -> str:
        return f"SetJson({self.resources.describe()})"

    def log_brief(self) -> dict[str, object]:
        """Its log form (`logs.brief`'s for the dict), built in O(LOG_LIST_ITEMS)."""
        tasks = self.resources.ordered_tasks()
        first = [{"connector": c, "task": n} for c, n in islice(tasks, LOG_LIST_ITEMS)]
        return {
            "connectors": clipped(
                self.resources.sorted_connectors(), len(self.resources.connectors)
            ),
            "tasks": clipped(first, len(tasks)),
        }


def _kept_order(
    tasks: frozenset[TaskId], source: tuple[TaskId, ...] | None
) -> tuple[TaskId, ...] | None:
    """`tasks` in the order of `source` (a sorted superset of them), when that costs less than
    sorting them: `source` known and at most four times as long."""
    if source is None or len(tasks) * 4 < len(source):
        return None
    if len(tasks) == len(source):
        return source
    return tuple(filter(tasks.__contains__, source))


def connector_resources(name: str, task_count: int) -> ResourceSet:
    """The resources of one connector: the connector itself and tasks 0..task_count-1."""
    return ResourceSet(frozenset((name,)), frozenset(TaskId(name, i) for i in range(task_count)))


class _HasResources(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def task_count(self) -> int: ...


def catalogue_resources(connectors: Iterable[_HasResources]) -> ResourceSet:
    """Every connector and task of a catalogue, built in one pass (O(resources))."""
    names: list[str] = []
    tasks: list[TaskId] = []
    for connector in connectors:
        names.append(connector.name)
        tasks.extend(TaskId(connector.name, i) for i in range(connector.task_count))
    return ResourceSet(frozenset(names), frozenset(tasks))


CatalogueChange = tuple[str, int | None, int | None]
"""A connector's name, its task count before and after a change (None: absent)."""


def catalogue_with(base: ResourceSet, changes: Iterable[CatalogueChange]) -> ResourceSet:
    """`base` (a catalogue's resources) with connectors added, resized or removed: one copy of
    `base`'s sets (in C) plus O(tasks added or removed) in Python, never a task of an unchanged
    connector built again. When `base`'s order is known the result's is too (the kept tasks
    filtered and the added merged in, in C), so a Prepare after the change does not sort the
    whole catalogue."""
    connectors = set(base.connectors)
    tasks = set(base.tasks)
    added: list[TaskId] = []
    shrunk = False
    for name, was, now in changes:
        before = 0 if was is None else was
        after = 0 if now is None else now
        if now is None:
            connectors.discard(name)
        else:
            connectors.add(name)
        if after < before:
            tasks.difference_update(TaskId(name, i) for i in range(after, before))
            shrunk = True
        elif after > before:
            more = [TaskId(name, i) for i in range(before, after)]
            tasks.update(more)
            added.extend(more)
    frozen = frozenset(tasks)
    ordered = base._ordered_tasks
    if ordered is not None and (added or shrunk):
        # The kept tasks in base's order, then the new ones (every task not in base was added).
        kept = [*filter(frozen.__contains__, ordered)] if shrunk else [*ordered]
        kept.extend(sorted_in_chunks(frozen.intersection(added).difference(base.tasks)))
        kept.sort()  # two sorted runs: one merge pass
        ordered = tuple(kept)
    return ResourceSet.in_order(frozenset(connectors), frozen, ordered)


def union(sets: Iterable[ResourceSet]) -> ResourceSet:
    """The union of many sets in one pass (O(total size)), not one copy per set."""
    connectors: set[str] = set()
    tasks: set[TaskId] = set()
    for s in sets:
        connectors.update(s.connectors)
        tasks.update(s.tasks)
    return ResourceSet(frozenset(connectors), frozenset(tasks))
