"""Resources (connectors and tasks) and immutable sets of them."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, order=True, slots=True)
class TaskId:
    """A task of a connector: `connector-task`, tasks numbered from 0."""

    connector: str
    task: int

    def __str__(self) -> str:
        return f"{self.connector}-{self.task}"


@dataclass(frozen=True, slots=True)
class ResourceSet:
    """An immutable set of connectors and tasks, with the usual set algebra."""

    connectors: frozenset[str] = frozenset()
    tasks: frozenset[TaskId] = frozenset()

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
        return sorted(self.tasks, key=_task_order)  # tuples compare in C, TaskId's __lt__ in Python

    def names(self) -> Iterator[str]:
        """Every resource as a display name: connectors as `A`, tasks as `A-0`, sorted."""
        yield from self.sorted_connectors()
        yield from (str(t) for t in self.sorted_tasks())

    def describe(self) -> str:
        return "[" + ", ".join(self.names()) + "]"

    def to_json(self) -> dict[str, object]:
        return {
            "connectors": self.sorted_connectors(),
            "tasks": [{"connector": t.connector, "task": t.task} for t in self.sorted_tasks()],
        }

    @staticmethod
    def from_json(data: object) -> ResourceSet:
        if not isinstance(data, dict):
            return EMPTY
        tasks = [TaskId(str(t["connector"]), int(t["task"])) for t in data.get("tasks", [])]
        return ResourceSet(frozenset(str(c) for c in data.get("connectors", [])), frozenset(tasks))


EMPTY = ResourceSet()

_task_order = operator.attrgetter("connector", "task")


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


def union(sets: Iterable[ResourceSet]) -> ResourceSet:
    """The union of many sets in one pass (O(total size)), not one copy per set."""
    connectors: set[str] = set()
    tasks: set[TaskId] = set()
    for s in sets:
        connectors.update(s.connectors)
        tasks.update(s.tasks)
    return ResourceSet(frozenset(connectors), frozenset(tasks))
