"""Fencing tokens (DESIGN 3.18): one number per resource a member holds, strictly greater than
every earlier token of that resource. A value type shared by the coordinator (which grants them),
the wire conversions and the agent (which hands them to the worker)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain, filterfalse, repeat
from operator import itemgetter
from typing import Any

from .resources import ConnectorTasks, ResourceSet, TaskId

Resource = str | TaskId
"""A connector (its name) or a task."""

_NUMBER = itemgetter(1)


class ConnectorTokens:
    """The tokens of one connector's tasks in a `FencingTokens`: the tasks (a `ConnectorTasks`,
    shared with the sets they were granted from) and either one token for all of them (a grant
    gives one token to everything it grants, so that is the usual case) or a token per task.
    Immutable; what is derived from it is computed once and kept: the (task, token) pairs in
    order, the runs of tasks with one token, and (kept by `connect_protocol.wire`) wire entries.
    """

    __slots__ = ("_ordered", "_runs", "by_task", "tasks", "token", "wire")

    tasks: ConnectorTasks
    token: int | None
    by_task: dict[TaskId, int] | None
    wire: dict[int, bytes] | None

    def __init__(
        self,
        tasks: ConnectorTasks,
        token: int | None,
        by_task: dict[TaskId, int] | None = None,
    ) -> None:
        self.tasks = tasks
        self.token = token
        self.by_task = by_task  # exactly `tasks`' keys, when `token` is None
        self._ordered: tuple[tuple[TaskId, int], ...] | None = None
        self._runs: tuple[tuple[int, int, int], ...] | None = None
        self.wire = None

    @staticmethod
    def of(by_task: dict[TaskId, int]) -> ConnectorTokens:
        """One connector's tokens from a task -> token dict (not empty; owned from now on)."""
        tasks = ConnectorTasks(by_task)
        first = next(iter(by_task.values()))
        if all(t == first for t in by_task.values()):
            return ConnectorTokens(tasks, first)
        return ConnectorTokens(tasks, None, by_task)

    def get(self, task: TaskId) -> int | None:
        if task not in self.tasks:
            return None
        return self.token if self.token is not None else self.by_task[task]  # type: ignore[index]

    def as_dict(self) -> dict[TaskId, int]:
        if self.token is not None:
            return dict.fromkeys(self.tasks, self.token)
        return self.by_task  # type: ignore[return-value]

    def ordered(self) -> tuple[tuple[TaskId, int], ...]:
        """(task, token) in task order, computed once."""
        ordered = self._ordered
        if ordered is None:
            tasks = self.tasks.ordered()
            if self.token is not None:
                ordered = tuple(zip(tasks, repeat(self.token)))
            else:
                by_task: dict[TaskId, int] = self.by_task  # type: ignore[assignment]
                ordered = tuple(zip(tasks, map(by_task.__getitem__, tasks), strict=True))
            self._ordered = ordered
        return ordered

    def runs(self) -> tuple[tuple[int, int, int], ...]:
        """(first, last, token): the runs of tasks numbered without a gap under one token, in
        order; computed once (from the tasks' runs when all share one token)."""
        runs = self._runs
        if runs is None:
            if self.token is not None:
                token = self.token
                runs = tuple((first, last, token) for first, last in self.tasks.runs())
            else:
                found: list[tuple[int, int, int]] = []
                for (_, number), token in self.ordered():
                    if found and found[-1][1] == number - 1 and found[-1][2] == token:
                        found[-1] = (found[-1][0], number, token)
                    else:
                        found.append((number, number, token))
                runs = tuple(found)
            self._runs = runs
        return runs

    def restricted(self, keep: ConnectorTasks) -> ConnectorTokens | None:
        """Only the tokens of the tasks in `keep` (None: none)."""
        if keep is self.tasks:
            return self
        common = self.tasks & keep
        if not common:
            return None
        if len(common) == len(self.tasks):
            return self
        ordered = self.tasks.order_if_known()  # the same value's order, filtered
        if len(common) == len(keep):
            tasks = keep
        elif ordered is not None and len(common) * 4 >= len(ordered):
            tasks = ConnectorTasks(common, tuple(filter(common.__contains__, ordered)))
        else:
            tasks = ConnectorTasks(common)
        if self.token is not None:
            return ConnectorTokens(tasks, self.token)
        by_task = self.by_task
        return ConnectorTokens.of({t: by_task[t] for t in tasks})  # type: ignore[index]

    def with_grant(self, granted: ConnectorTasks, token: int) -> ConnectorTokens:
        """These tokens plus `granted` at `token`."""
        if self.token == token:
            joined = self.tasks | granted
            if len(joined) == len(self.tasks):
                return self
            if len(joined) == len(granted):
                return ConnectorTokens(granted, token)
            mine, theirs = self.tasks.order_if_known(), granted.order_if_known()
            ordered = None
            if mine is not None and theirs is not None:  # two runs: one merge pass
                added = filterfalse(self.tasks.__contains__, theirs)
                ordered = tuple(sorted((*mine, *added), key=_NUMBER))
            return ConnectorTokens(ConnectorTasks(joined, ordered), token)
        if granted is self.tasks or self.tasks <= granted:
            return ConnectorTokens(granted, token)
        by_task = self.as_dict().copy() if self.token is None else self.as_dict()
        by_task.update(dict.fromkeys(granted, token))
        return ConnectorTokens(ConnectorTasks(by_task), None, by_task)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, ConnectorTokens):
            return NotImplemented
        if self.tasks != other.tasks:
            return False
        if self.token is not None and other.token is not None:
            return self.token == other.token
        return self.as_dict() == other.as_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ConnectorTokens({self.as_dict()!r})"


class FencingTokens(Mapping[Resource, int]):
    """An immutable resource -> token map.

    Connectors' tokens are a dict; tasks' are kept by connector (`ConnectorTokens`), so that a
    grant or a restriction to a share changed in a few connectors costs O(connectors + those
    connectors' tasks) and keeps every other connector's tokens as the very same object, with
    their order, runs and wire entries computed once (issue 24: a member's tokens for 10,000
    tasks are written to its row and sent in answers on every change of its share).
    """

    __slots__ = ("_by_connector", "_connectors", "_shards", "_size", "_tasks")

    def __init__(self, tokens: Mapping[Resource, int] | None = None) -> None:
        by_connector: dict[str, int] = {}
        grouped: dict[str, dict[TaskId, int]] = {}
        for resource, token in (tokens or {}).items():
            if isinstance(resource, str):
                by_connector[resource] = token
            else:
                of = grouped.get(resource[0])
                if of is None:
                    grouped[resource[0]] = {resource: token}
                else:
                    of[resource] = token
        self._init(by_connector, {c: ConnectorTokens.of(d) for c, d in grouped.items()})

    def _init(self, by_connector: dict[str, int], shards: dict[str, ConnectorTokens]) -> None:
        self._by_connector = by_connector
        self._shards = shards
        self._size = sum(len(s.tasks) for s in shards.values())
        self._connectors: list[tuple[str, int]] | None = None
        self._tasks: tuple[tuple[TaskId, int], ...] | None = None

    @staticmethod
    def _of(by_connector: dict[str, int], shards: dict[str, ConnectorTokens]) -> FencingTokens:
        """A value over these dicts (owned by it from now on), without copying them."""
        out = FencingTokens.__new__(FencingTokens)
        out._init(by_connector, shards)
        return out

    @staticmethod
    def granted(resources: ResourceSet, token: int) -> FencingTokens:
        """Every one of `resources` with the same `token` (one grant)."""
        return FencingTokens._of(
            dict.fromkeys(resources.connectors, token),
            {c: ConnectorTokens(held, token) for c, held in resources.by_connector().items()},
        )

    @staticmethod
    def from_runs(
        connectors: Mapping[str, int], runs: Iterable[tuple[str, int, int, int]]
    ) -> FencingTokens:
        """Tokens from (connector, first, last, token) runs of tasks (a later one wins)."""
        grouped: dict[str, dict[TaskId, int]] = {}
        for connector, first, last, token in runs:
            of = grouped.setdefault(connector, {})
            of.update(dict.fromkeys((TaskId(connector, n) for n in range(first, last + 1)), token))
        return FencingTokens._of(
            dict(connectors), {c: ConnectorTokens.of(d) for c, d in grouped.items() if d}
        )

    def __getitem__(self, key: Resource) -> int:
        if isinstance(key, str):
            return self._by_connector[key]
        held = self._shards.get(key[0]) if isinstance(key, tuple) and len(key) == 2 else None
        token = None if held is None else held.get(key)
        if token is None:
            raise KeyError(key)
        return token

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            return key in self._by_connector
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        held = self._shards.get(key[0])
        return held is not None and key in held.tasks

    def __iter__(self) -> Iterator[Resource]:
        return chain(self._by_connector, *(s.tasks for s in self._shards.values()))

    def __len__(self) -> int:
        return len(self._by_connector) + self._size

    def __bool__(self) -> bool:
        return bool(self._by_connector) or bool(self._size)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FencingTokens):
            return (
                self._size == other._size
                and self._by_connector == other._by_connector
                and self._shards == other._shards
            )
        return NotImplemented

    def __hash__(self) -> int:
        return hash((frozenset(self._by_connector.items()), frozenset(self.ordered_tasks())))

    def __repr__(self) -> str:
        return f"FencingTokens({dict(self.items())!r})"

    def by_connector(self) -> Mapping[str, ConnectorTokens]:
        """The tasks' tokens by connector (not to be changed)."""
        return self._shards

    def restricted(self, resources: ResourceSet) -> FencingTokens:
        """Only the tokens of `resources`: O(connectors + the tasks of connectors whose tasks
        differ); a connector whose tasks are the very object `resources` holds is kept as is."""
        by_connector = self._by_connector
        connectors = {c: by_connector[c] for c in resources.connectors if c in by_connector}
        keep = resources.by_connector() if self._shards else {}
        shards: dict[str, ConnectorTokens] = {}
        for connector, held in self._shards.items():
            tasks = keep.get(connector)
            if tasks is not None:
                restricted = held.restricted(tasks)
                if restricted is not None:
                    shards[connector] = restricted
        return FencingTokens._of(connectors, shards)

    def with_grant(self, resources: ResourceSet, token: int) -> FencingTokens:
        """These tokens plus `resources` granted at `token`: O(connectors + the granted
        connectors' tasks)."""
        by_connector = dict(self._by_connector)
        by_connector.update(dict.fromkeys(resources.connectors, token))
        shards = dict(self._shards)
        for connector, granted in resources.by_connector().items():
            held = shards.get(connector)
            shards[connector] = (
                ConnectorTokens(granted, token) if held is None else held.with_grant(granted, token)
            )
        return FencingTokens._of(by_connector, shards)

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
        """(task, token), sorted by task: each connector's sorted once, not to be changed."""
        ordered = self._tasks
        if ordered is None:
            shards = self._shards
            ordered = self._tasks = tuple(
                chain.from_iterable(shards[c].ordered() for c in sorted(shards))
            )
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
        tokens: dict[Resource, int] = {}
        connectors = data.get("connectors") or {}
        if isinstance(connectors, Mapping):
            tokens.update((str(c), int(t)) for c, t in connectors.items())
        for entry in data.get("tasks") or ():
            tokens[TaskId(str(entry["connector"]), int(entry["task"]))] = int(entry["token"])
        return FencingTokens(tokens)


NO_TOKENS = FencingTokens()
