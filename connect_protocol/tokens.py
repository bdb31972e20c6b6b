"""Fencing tokens (DESIGN 3.18): one number per resource a member holds, strictly greater than
every earlier token of that resource. A value type shared by the coordinator (which grants them),
the wire conversions and the agent (which hands them to the worker)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import chain, repeat
from typing import Any

from .ordering import sorted_in_chunks
from .resources import ResourceSet, TaskId

Resource = str | TaskId
"""A connector (its name) or a task."""


class FencingTokens(Mapping[Resource, int]):
    """An immutable resource -> token map.

    Connectors and tasks are kept apart, and each kind's entries in order are computed once per
    value and kept (`connectors`, `tasks`): a member's tokens for 10,000 tasks are written to its
    row, sent in answers and described, and sorting them on every use was a fifth of the
    coordinator's time in a 100,000-task group (issue 24). A value restricted from another one
    takes its order from it instead of sorting again.
    """

    __slots__ = ("_by_connector", "_by_task", "_connectors", "_tasks")

    def __init__(self, tokens: Mapping[Resource, int] | None = None) -> None:
        by_connector: dict[str, int] = {}
        by_task: dict[TaskId, int] = {}
        for resource, token in (tokens or {}).items():
            if isinstance(resource, str):
                by_connector[resource] = token
            else:
                by_task[resource] = token
        self._init(by_connector, by_task)

    def _init(
        self,
        by_connector: dict[str, int],
        by_task: dict[TaskId, int],
        ordered_tasks: list[tuple[TaskId, int]] | None = None,
    ) -> None:
        self._by_connector = by_connector
        self._by_task = by_task
        self._connectors: list[tuple[str, int]] | None = None
        self._tasks = ordered_tasks

    @staticmethod
    def _of(
        by_connector: dict[str, int],
        by_task: dict[TaskId, int],
        ordered_tasks: list[tuple[TaskId, int]] | None = None,
    ) -> FencingTokens:
        """A value over these dicts (owned by it from now on), without copying them."""
        out = FencingTokens.__new__(FencingTokens)
        out._init(by_connector, by_task, ordered_tasks)
        return out

    @staticmethod
    def granted(resources: ResourceSet, token: int) -> FencingTokens:
        """Every one of `resources` with the same `token` (one grant)."""
        return FencingTokens._of(
            dict.fromkeys(resources.connectors, token), dict.fromkeys(resources.tasks, token)
        )

    def __getitem__(self, key: Resource) -> int:
        if isinstance(key, str):
            return self._by_connector[key]
        return self._by_task[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            return key in self._by_connector
        return key in self._by_task

    def __iter__(self) -> Iterator[Resource]:
        return chain(self._by_connector, self._by_task)

    def __len__(self) -> int:
        return len(self._by_connector) + len(self._by_task)

    def __bool__(self) -> bool:
        return bool(self._by_connector) or bool(self._by_task)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FencingTokens):
            return self._by_task == other._by_task and self._by_connector == other._by_connector
        return NotImplemented

    def __hash__(self) -> int:
        return hash((frozenset(self._by_connector.items()), frozenset(self._by_task.items())))

    def __repr__(self) -> str:
        return f"FencingTokens({dict(self.items())!r})"

    def restricted(self, resources: ResourceSet) -> FencingTokens:
        """Only the tokens of `resources` (O(len(resources)), or O(len(self)) once this value's
        order is known, which the result then keeps)."""
        by_connector, by_task = self._by_connector, self._by_task
        connectors = {c: by_connector[c] for c in resources.connectors if c in by_connector}
        ordered = self._tasks
        if ordered is not None and len(resources.tasks) * 4 >= len(ordered):
            keep = resources.tasks
            kept = [item for item in ordered if item[0] in keep]
            return FencingTokens._of(connectors, dict(kept), kept)
        tasks = {t: by_task[t] for t in resources.tasks if t in by_task}
        return FencingTokens._of(connectors, tasks)

    def with_grant(self, resources: ResourceSet, token: int) -> FencingTokens:
        """These tokens plus `resources` granted at `token`. Once this value's order is known,
        the result's is this order merged with the grant's (no sort of the whole)."""
        by_connector = dict(self._by_connector)
        by_connector.update(dict.fromkeys(resources.connectors, token))
        by_task = dict(self._by_task)
        granted = resources.tasks
        by_task.update(dict.fromkeys(granted, token))
        ordered = self._tasks
        if ordered is None:
            return FencingTokens._of(by_connector, by_task)
        if not granted:
            return FencingTokens._of(by_connector, by_task, ordered)
        if self._by_task.keys().isdisjoint(granted):
            merged = [*ordered]
        else:
            merged = [item for item in ordered if item[0] not in granted]
        merged.extend(zip(resources.ordered_tasks(), repeat(token)))
        merged.sort()  # two sorted runs, merged in one pass (timsort)
        return FencingTokens._of(by_connector, by_task, merged)

    def connectors(self) -> list[tuple[str, int]]:
        """(connector, token), sorted by connector."""
        ordered = self._connectors
        if ordered is None:
            ordered = self._connectors = sorted(self._by_connector.items())
        return list(ordered)

    def tasks(self) -> list[tuple[TaskId, int]]:
        """(task, token), sorted by task (sorted once per value; a copy)."""
        return list(self.ordered_tasks())

    def ordered_tasks(self) -> Sequence[tuple[TaskId, int]]:
        """(task, token), sorted by task: sorted on the first call only, not to be changed."""
        ordered = self._tasks
        if ordered is None:
            ordered = self._tasks = sorted_in_chunks(self._by_task.items())  # distinct tasks
        return ordered

    def to_json(self) -> dict[str, Any]:
        """{"connectors": {name: token}, "tasks": [{"connector", "task", "token"}]}, sorted: the
        shape of the database column, the audit events and the agent's listener events."""
        return {
            "connectors": dict(self.connectors()),
            "tasks": [
                {"connector": c, "task": n, "token": t} for (c, n), t in self.ordered_tasks()
            ],
        }

    @staticmethod
    def from_json(data: object) -> FencingTokens:
        """The inverse of `to_json` (an absent or empty value: no tokens)."""
        if not isinstance(data, Mapping):
            return NO_TOKENS
        by_connector: dict[str, int] = {}
        connectors = data.get("connectors") or {}
        if isinstance(connectors, Mapping):
            by_connector.update((str(c), int(t)) for c, t in connectors.items())
        by_task: dict[TaskId, int] = {}
        for entry in data.get("tasks") or ():
            by_task[TaskId(str(entry["connector"]), int(entry["task"]))] = int(entry["token"])
        return FencingTokens._of(by_connector, by_task)


NO_TOKENS = FencingTokens()
