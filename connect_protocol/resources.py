"""Resources (connectors and tasks) and immutable sets of them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol


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

    def __or__(self, other: ResourceSet) -> ResourceSet:
        return ResourceSet(self.connectors | other.connectors, self.tasks | other.tasks)

    def __and__(self, other: ResourceSet) -> ResourceSet:
        return ResourceSet(self.connectors & other.connectors, self.tasks & other.tasks)

    def __sub__(self, other: ResourceSet) -> ResourceSet:
        return ResourceSet(self.connectors - other.connectors, self.tasks - other.tasks)

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
            ordered = tuple(sorted(self.tasks))  # (connector, task) tuples: compared in C
            object.__setattr__(self, "_ordered_tasks", ordered)
        return ordered

    def names(self) -> Iterator[str]:
        """Every resource as a display name: connectors as `A`, tasks as `A-0`, sorted."""
        yield from self.sorted_connectors()
        yield from (str(t) for t in self.sorted_tasks())

    def describe(self) -> str:
        return "[" + ", ".join(self.names()) + "]"

    def to_json(self) -> dict[str, object]:
        """{"connectors": [name], "tasks": [{"connector", "task"}]}, each sorted: the shape of
        the database's columns and the audit events. The lists are new; the task objects are
        built once per set and shared by every result (not to be changed)."""
        tasks_json = self._tasks_json
        if tasks_json is None:
            tasks_json = [{"connector": c, "task": n} for c, n in self.ordered_tasks()]
            object.__setattr__(self, "_tasks_json", tasks_json)
        return {"connectors": self.sorted_connectors(), "tasks": list(tasks_json)}

    @staticmethod
    def from_json(data: object) -> ResourceSet:
        if not isinstance(data, dict):
            return EMPTY
        tasks = [TaskId(str(t["connector"]), int(t["task"])) for t in data.get("tasks", [])]
        return ResourceSet(frozenset(str(c) for c in data.get("connectors", [])), frozenset(tasks))


EMPTY = ResourceSet()


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
    connector built again."""
    connectors = set(base.connectors)
    tasks = set(base.tasks)
    for name, was, now in changes:
        before = 0 if was is None else was
        after = 0 if now is None else now
        if now is None:
            connectors.discard(name)
        else:
            connectors.add(name)
        if after < before:
            tasks.difference_update(TaskId(name, i) for i in range(after, before))
        elif after > before:
            tasks.update(TaskId(name, i) for i in range(before, after))
    return ResourceSet(frozenset(connectors), frozenset(tasks))


def union(sets: Iterable[ResourceSet]) -> ResourceSet:
    """The union of many sets in one pass (O(total size)), not one copy per set."""
    connectors: set[str] = set()
    tasks: set[TaskId] = set()
    for s in sets:
        connectors.update(s.connectors)
        tasks.update(s.tasks)
    return ResourceSet(frozenset(connectors), frozenset(tasks))
