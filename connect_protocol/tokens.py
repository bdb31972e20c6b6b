"""Fencing tokens (DESIGN 3.18): one number per resource a member holds, strictly greater than
every earlier token of that resource. A value type shared by the coordinator (which grants them),
the wire conversions and the agent (which hands them to the worker)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from .resources import ResourceSet, TaskId

Resource = str | TaskId
"""A connector (its name) or a task."""


class FencingTokens(Mapping[Resource, int]):
    """An immutable resource -> token map."""

    __slots__ = ("_tokens",)

    def __init__(self, tokens: Mapping[Resource, int] | None = None) -> None:
        self._tokens: Mapping[Resource, int] = MappingProxyType(dict(tokens or {}))

    @staticmethod
    def granted(resources: ResourceSet, token: int) -> FencingTokens:
        """Every one of `resources` with the same `token` (one grant)."""
        out: dict[Resource, int] = dict.fromkeys(resources.connectors, token)
        out.update(dict.fromkeys(resources.tasks, token))
        return FencingTokens(out)

    def __getitem__(self, key: Resource) -> int:
        return self._tokens[key]

    def __iter__(self) -> Iterator[Resource]:
        return iter(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FencingTokens):
            return self._tokens == other._tokens
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._tokens.items()))

    def __repr__(self) -> str:
        return f"FencingTokens({dict(self._tokens)!r})"

    def restricted(self, resources: ResourceSet) -> FencingTokens:
        """Only the tokens of `resources` (O(len(resources)))."""
        tokens = self._tokens
        out: dict[Resource, int] = {c: tokens[c] for c in resources.connectors if c in tokens}
        out.update((t, tokens[t]) for t in resources.tasks if t in tokens)
        return FencingTokens(out)

    def with_grant(self, resources: ResourceSet, token: int) -> FencingTokens:
        """These tokens plus `resources` granted at `token`."""
        out = dict(self._tokens)
        out.update(dict.fromkeys(resources.connectors, token))
        out.update(dict.fromkeys(resources.tasks, token))
        return FencingTokens(out)

    def connectors(self) -> list[tuple[str, int]]:
        """(connector, token), sorted by connector."""
        return sorted((r, t) for r, t in self._tokens.items() if isinstance(r, str))

    def tasks(self) -> list[tuple[TaskId, int]]:
        """(task, token), sorted by task."""
        return sorted((r, t) for r, t in self._tokens.items() if isinstance(r, TaskId))

    def to_json(self) -> dict[str, Any]:
        """{"connectors": {name: token}, "tasks": [{"connector", "task", "token"}]}, sorted: the
        shape of the database column, the audit events and the agent's listener events."""
        return {
            "connectors": {c: t for c, t in sorted(self.connectors())},
            "tasks": [
                {"connector": task.connector, "task": task.task, "token": t}
                for task, t in sorted(
                    self.tasks(), key=lambda item: (item[0].connector, item[0].task)
                )
            ],
        }

    @staticmethod
    def from_json(data: object) -> FencingTokens:
        """The inverse of `to_json` (an absent or empty value: no tokens)."""
        if not isinstance(data, Mapping):
            return NO_TOKENS
        out: dict[Resource, int] = {}
        connectors = data.get("connectors") or {}
        if isinstance(connectors, Mapping):
            out.update((str(c), int(t)) for c, t in connectors.items())
        for entry in data.get("tasks") or ():
            out[TaskId(str(entry["connector"]), int(entry["task"]))] = int(entry["token"])
        return FencingTokens(out)


NO_TOKENS = FencingTokens()
