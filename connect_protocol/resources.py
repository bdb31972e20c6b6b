"""Resources (connectors and tasks) and immutable sets of them."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain, filterfalse, islice
from operator import itemgetter
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

_TASK_NUMBER = itemgetter(1)


class ConnectorTasks(frozenset[TaskId]):
    """One connector's tasks in a set kept by connector (`ResourceSet.by_connector`): a
    frozenset of its `TaskId`s (never empty), with what is derived from it once and kept: its
    tasks in order, and (kept by `connect_protocol.wire`) their wire entries' bytes. Shared, not
    copied, by every set that holds exactly these tasks of the connector, so that an operation
    on two sets skips a connector both hold the same object for in O(1)."""

    __slots__ = ("_ordered", "_runs", "wire")

    _ordered: tuple[TaskId, ...] | None
    _runs: tuple[tuple[int, int], ...] | None
    wire: bytes | None

    def __new__(
        cls, tasks: Iterable[TaskId] = (), ordered: tuple[TaskId, ...] | None = None
    ) -> ConnectorTasks:
        self = super().__new__(cls, tasks)
        self._ordered = ordered
        self._runs = None
        self.wire = None
        return self

    def order_if_known(self) -> tuple[TaskId, ...] | None:
        """`ordered()` if computed already, else None (nothing is sorted)."""
        return self._ordered

    def highest(self) -> TaskId:
        """Its task with the highest number (O(1) once its order is known)."""
        ordered = self._ordered
        return ordered[-1] if ordered is not None else max(self, key=_TASK_NUMBER)

    def lowest(self) -> TaskId:
        """Its task with the lowest number (O(1) once its order is known)."""
        ordered = self._ordered
        return ordered[0] if ordered is not None else min(self, key=_TASK_NUMBER)

    def ordered(self) -> tuple[TaskId, ...]:
        """Its tasks by number, sorted on the first call only."""
        ordered = self._ordered
        if ordered is None:
            ordered = self._ordered = tuple(sorted(self, key=_TASK_NUMBER))
        return ordered

    def runs(self) -> tuple[tuple[int, int], ...]:
        """Its task numbers as (first, last) runs without a gap, in order; computed once (one
        run without a look at each task when its numbers have no gap)."""
        runs = self._runs
        if runs is None:
            ordered = self.ordered()
            first, last = ordered[0][1], ordered[-1][1]
            if last - first == len(ordered) - 1:
                runs = ((first, last),)
            else:
                found: list[tuple[int, int]] = []
                start = previous = first
                for _, number in islice(ordered, 1, None):
                    if number != previous + 1:
                        found.append((start, previous))
                        start = number
                    previous = number
                found.append((start, previous))
                runs = tuple(found)
            self._runs = runs
        return runs


Shards = dict[str, ConnectorTasks]
"""A set's tasks by connector: connectors with no task in the set are absent."""


def _sharded(tasks: frozenset[TaskId], ordered: tuple[TaskId, ...] | None) -> Shards:
    """`tasks` by connector; from `ordered` (exactly `tasks`, sorted) by bisection when known."""
    shards: Shards = {}
    if ordered is not None:
        at, end = 0, len(ordered)
        while at < end:
            connector = ordered[at][0]
            stop = bisect_left(ordered, (connector, 1 << 62), at, end)
            run = ordered[at:stop]
            shards[connector] = ConnectorTasks(run, run)
            at = stop
        return shards
    grouped: dict[str, list[TaskId]] = {}
    for task in tasks:
        listed = grouped.get(task[0])
        if listed is None:
            grouped[task[0]] = [task]
        else:
            listed.append(task)
    for connector, listed in grouped.items():
        shards[connector] = ConnectorTasks(listed)
    return shards


SHARD_SMALL = 64
"""A set of at most this many tasks kept as one frozenset is split by connector to meet a set
kept by connector (cheaper than joining the other's connectors into one frozenset)."""

BY_CONNECTOR_FROM = 256
"""Two sets run the algebra by connector only if one holds at least this many tasks: below it,
one C call on their frozensets costs less than a Python step per connector (a group of 1,000
members of 100 tasks each formed twice as slowly when every small share went by connector)."""


class ResourceSet:
    """An immutable set of connectors and tasks, with the usual set algebra.

    Its tasks are kept in one of two forms, or both, each built from the other when first
    needed and kept: one frozenset of `TaskId`s (`tasks`), or a `ConnectorTasks` per connector
    (`by_connector`). A set built from a list of tasks starts as the first; the coordinator's
    shares and catalogue (decoded from the wire, built from the catalogue, and every result of
    an operation on two such sets) as the second. An operation on two sets kept by connector
    costs O(connectors + the tasks of connectors whose tasks differ): a connector whose tasks
    both sets share (the same `ConnectorTasks`) is skipped in O(1), so a 10,000-task share
    changed by a few tasks is not walked task by task, nor sorted again (issue 24). Otherwise the
    operation runs on the frozensets in C, as it always has.

    Its tasks in order are computed once per set and kept (`ordered_tasks`); so are the tasks'
    JSON objects (`to_json`), which a member's row and the event of the same change both write.
    """

    __slots__ = ("_ordered_tasks", "_shards", "_size", "_tasks", "_tasks_json", "connectors")

    connectors: frozenset[str]
    _tasks: frozenset[TaskId] | None
    _shards: Shards | None
    _size: int
    _ordered_tasks: tuple[TaskId, ...] | None
    _tasks_json: list[dict[str, object]] | None

    def __init__(
        self, connectors: frozenset[str] = frozenset(), tasks: frozenset[TaskId] = frozenset()
    ) -> None:
        self.connectors = connectors
        self._tasks = tasks
        self._shards = None if tasks else {}
        self._size = len(tasks)
        self._ordered_tasks = None
        self._tasks_json = None

    @staticmethod
    def kept_by_connector_from(
        connectors: frozenset[str], shards: Shards, size: int | None = None
    ) -> ResourceSet:
        """The set of `connectors` and the tasks of `shards` (each non-empty, each holding only
        its connector's tasks; `size`: their total, when known), owned by it from now on."""
        return ResourceSet._kept_by_connector(connectors, shards, size)

    @staticmethod
    def _kept_by_connector(
        connectors: frozenset[str], shards: Shards, size: int | None = None
    ) -> ResourceSet:
        out = ResourceSet.__new__(ResourceSet)
        out.connectors = connectors
        out._tasks = None if shards else frozenset()
        out._shards = shards
        out._size = sum(map(len, shards.values())) if size is None else size
        out._ordered_tasks = None
        out._tasks_json = None
        return out

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
        out._ordered_tasks = ordered
        return out

    @staticmethod
    def by_connector_of(
        connectors: frozenset[str], ordered: tuple[TaskId, ...] | list[TaskId]
    ) -> ResourceSet:
        """The set of `connectors` and the tasks `ordered` (sorted, no task twice), kept by
        connector: split by bisection, O(connectors x log tasks) plus copies in C."""
        listed = ordered if isinstance(ordered, tuple) else tuple(ordered)
        out = ResourceSet._kept_by_connector(connectors, _sharded(frozenset(), listed), len(listed))
        out._ordered_tasks = listed
        return out

    # --- the two forms ---------------------------------------------------------------------

    @property
    def tasks(self) -> frozenset[TaskId]:
        """Every task, as one frozenset (joined from the connectors' on first use)."""
        tasks = self._tasks
        if tasks is None:
            tasks = self._tasks = frozenset().union(*self._shards.values())  # type: ignore[union-attr]
        return tasks

    def by_connector(self) -> Mapping[str, ConnectorTasks]:
        """Its tasks by connector (split from `tasks` on first use). Not to be changed."""
        shards = self._shards
        if shards is None:
            shards = self._shards = _sharded(self.tasks, self._ordered_tasks)
        return shards

    def kept_by_connector(self) -> Mapping[str, ConnectorTasks] | None:
        """`by_connector` if the set is kept so already, else None (nothing is split)."""
        return self._shards

    def task_count(self) -> int:
        return self._size

    def _shards_with(self, other: ResourceSet) -> tuple[Shards, Shards] | None:
        """Both sets' tasks by connector, when the operation should run on them: both kept so,
        or one kept so and the other small."""
        if self._size < BY_CONNECTOR_FROM and other._size < BY_CONNECTOR_FROM:
            return None
        mine, theirs = self._shards, other._shards
        if mine is not None:
            if theirs is not None:
                return mine, theirs
            if other._size <= SHARD_SMALL:
                return mine, other.by_connector()  # type: ignore[return-value]
        elif theirs is not None and self._size <= SHARD_SMALL:
            return self.by_connector(), theirs  # type: ignore[return-value]
        return None

    # --- the set algebra -------------------------------------------------------------------
    #
    # On frozensets, the algebra keeps a known order: a share changes by a few tasks at a time,
    # and sorting 10,000 tasks again after each change cost more than the change (issue 24). A
    # result's order is taken from an operand's (filtered in C, or two sorted runs merged by one
    # timsort pass) when that operand's order is known and not much longer than the result. By
    # connector, each connector's order is kept the same way, and a set's order is its
    # connectors' orders joined.

    def __or__(self, other: ResourceSet) -> ResourceSet:
        # Sets are immutable: a union with nothing is the other side itself, not a copy.
        if not other._size and other.connectors <= self.connectors:
            return self
        if not self._size and self.connectors <= other.connectors:
            return other
        both = self._shards_with(other)
        if both is not None:
            mine, theirs = both
            if len(theirs) > len(mine):
                mine, theirs = theirs, mine
            shards = dict(mine)
            for connector, t in theirs.items():
                s = shards.get(connector)
                if s is None:
                    shards[connector] = t
                elif s is not t:
                    shards[connector] = _joined(s, t)
            return ResourceSet._kept_by_connector(self.connectors | other.connectors, shards)
        tasks = self.tasks | other.tasks
        ordered: tuple[TaskId, ...] | None = None
        mine_o, theirs_o = self._ordered_tasks, other._ordered_tasks
        if mine_o is not None and (theirs_o is not None or other._size * 4 <= len(mine_o)):
            added = [*filterfalse(self.tasks.__contains__, theirs_o or other.tasks)]
            if theirs_o is None:
                added = sorted_in_chunks(added)
            ordered = tuple(sorted((*mine_o, *added))) if added else mine_o
        elif theirs_o is not None and self._size * 4 <= len(theirs_o):
            added = sorted_in_chunks(filterfalse(other.tasks.__contains__, self.tasks))
            ordered = tuple(sorted((*theirs_o, *added))) if added else theirs_o
        return ResourceSet.in_order(self.connectors | other.connectors, tasks, ordered)

    def __and__(self, other: ResourceSet) -> ResourceSet:
        both = self._shards_with(other)
        if both is not None:
            mine, theirs = both
            if len(theirs) < len(mine):
                mine, theirs = theirs, mine
            shards: Shards = {}
            for connector, s in mine.items():
                t = theirs.get(connector)
                if t is None:
                    continue
                if t is s:
                    shards[connector] = s
                    continue
                common = s & t
                if common:
                    shards[connector] = _narrowed(common, s, t)
            return ResourceSet._kept_by_connector(self.connectors & other.connectors, shards)
        tasks = self.tasks & other.tasks
        source = self._ordered_tasks
        theirs_o = other._ordered_tasks
        if theirs_o is not None and (source is None or len(theirs_o) < len(source)):
            source = theirs_o
        return ResourceSet.in_order(
            self.connectors & other.connectors, tasks, _kept_order(tasks, source)
        )

    def __sub__(self, other: ResourceSet) -> ResourceSet:
        both = self._shards_with(other)
        if both is not None:
            mine, theirs = both
            if not theirs:
                shards = mine
            elif len(theirs) < len(mine):  # walk the smaller side's connectors
                shards = dict(mine)
                for connector, t in theirs.items():
                    held = shards.get(connector)
                    if held is not None:
                        _put_difference(shards, connector, held, t)
            else:
                shards = {}
                for connector, s in mine.items():
                    taken = theirs.get(connector)
                    if taken is None:
                        shards[connector] = s
                    else:
                        _put_difference(shards, connector, s, taken)
            if shards is mine and not (self.connectors & other.connectors):
                return self
            return ResourceSet._kept_by_connector(self.connectors - other.connectors, shards)
        tasks = self.tasks - other.tasks
        return ResourceSet.in_order(
            self.connectors - other.connectors, tasks, _kept_order(tasks, self._ordered_tasks)
        )

    def __le__(self, other: ResourceSet) -> bool:
        if self._size > other._size or not self.connectors <= other.connectors:
            return False
        both = self._shards_with(other)
        if both is None:
            return self.tasks <= other.tasks
        mine, theirs = both
        for connector, s in mine.items():
            t = theirs.get(connector)
            if t is None or (t is not s and not s <= t):
                return False
        return True

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, ResourceSet):
            return NotImplemented
        if self._size != other._size or self.connectors != other.connectors:
            return False
        mine, theirs = self._shards, other._shards
        if mine is not None and theirs is not None:
            return mine == theirs  # per connector: the same object, or equal frozensets (in C)
        return self.tasks == other.tasks

    def __hash__(self) -> int:
        return hash((self.connectors, self.tasks))

    def __repr__(self) -> str:
        return f"ResourceSet(connectors={self.connectors!r}, tasks={self.tasks!r})"

    def __bool__(self) -> bool:
        return bool(self.connectors) or bool(self._size)

    def __len__(self) -> int:
        return len(self.connectors) + self._size

    def isdisjoint(self, other: ResourceSet) -> bool:
        if not self.connectors.isdisjoint(other.connectors):
            return False
        both = self._shards_with(other)
        if both is None:
            return self.tasks.isdisjoint(other.tasks)
        mine, theirs = both
        if len(theirs) < len(mine):
            mine, theirs = theirs, mine
        for connector, s in mine.items():
            t = theirs.get(connector)
            if t is not None and (t is s or not s.isdisjoint(t)):
                return False
        return True

    def sorted_connectors(self) -> list[str]:
        return sorted(self.connectors)

    def sorted_tasks(self) -> list[TaskId]:
        return list(self.ordered_tasks())

    def ordered_tasks(self) -> tuple[TaskId, ...]:
        """The tasks sorted by (connector, task), sorted on the first call only (kept by
        connector: each connector's order, kept with its tasks, joined)."""
        ordered = self._ordered_tasks
        if ordered is None:
            shards = self._shards
            if shards is not None:
                ordered = tuple(chain.from_iterable(shards[c].ordered() for c in sorted(shards)))
            else:
                ordered = tuple(sorted_in_chunks(self.tasks))  # (connector, task) tuples: in C
            self._ordered_tasks = ordered
        return ordered

    def first_tasks(self, limit: int) -> list[TaskId]:
        """The first `limit` of `ordered_tasks()`; a set kept by connector orders only the
        connectors they come from (a log line names a few tasks of a 10,000-task share)."""
        shards = self._shards
        if self._ordered_tasks is None and shards is not None:
            ordered = chain.from_iterable(shards[c].ordered() for c in sorted(shards))
            return list(islice(ordered, limit))
        return list(islice(self.ordered_tasks(), limit))

    def names(self) -> Iterator[str]:
        """Every resource as a display name: connectors as `A`, tasks as `A-0`, sorted."""
        yield from self.sorted_connectors()
        yield from (str(t) for t in self.ordered_tasks())

    def describe(self, limit: int = DESCRIBE_ITEMS) -> str:
        """The set for a message: its first `limit` names, then how many there are in all (an
        install refused for 100,000 unassigned tasks was answered with all their names)."""
        size = len(self)
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
            self._tasks_json = tasks_json
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
        """Its log form (`logs.brief`'s for the dict): the first tasks in order, without
        ordering the rest of a set kept by connector."""
        resources = self.resources
        first = [{"connector": c, "task": n} for c, n in resources.first_tasks(LOG_LIST_ITEMS)]
        return {
            "connectors": clipped(resources.sorted_connectors(), len(resources.connectors)),
            "tasks": clipped(first, resources.task_count()),
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


def _joined(mine: ConnectorTasks, theirs: ConnectorTasks) -> ConnectorTasks:
    """One connector's tasks in either of two sets (an operand itself when it holds them all)."""
    tasks = mine | theirs
    if len(tasks) == len(mine):
        return mine
    if len(tasks) == len(theirs):
        return theirs
    ordered = None
    if mine._ordered is not None and theirs._ordered is not None:  # two runs: one merge pass
        added = filterfalse(mine.__contains__, theirs._ordered)
        ordered = tuple(sorted((*mine._ordered, *added), key=_TASK_NUMBER))
    return ConnectorTasks(tasks, ordered)


def _narrowed(
    common: frozenset[TaskId], mine: ConnectorTasks, theirs: ConnectorTasks
) -> ConnectorTasks:
    """One connector's tasks in both of two sets (an operand itself when it is all of them)."""
    if len(common) == len(mine):
        return mine
    if len(common) == len(theirs):
        return theirs
    source = mine if len(mine) <= len(theirs) else theirs
    return ConnectorTasks(common, _kept_order(common, source._ordered))


def _put_difference(
    shards: Shards, connector: str, mine: ConnectorTasks, theirs: ConnectorTasks
) -> None:
    """`shards[connector]` = `mine` without `theirs` (absent when that is empty)."""
    rest = mine - theirs if theirs is not mine else frozenset()
    if not rest:
        shards.pop(connector, None)
    elif len(rest) == len(mine):
        shards[connector] = mine
    else:
        shards[connector] = ConnectorTasks(rest, _kept_order(rest, mine._ordered))


def _numbered(name: str, task_count: int) -> ConnectorTasks:
    """Tasks 0..task_count-1 of connector `name`, in order."""
    ordered = tuple(TaskId(name, i) for i in range(task_count))
    return ConnectorTasks(ordered, ordered)


def connector_resources(name: str, task_count: int) -> ResourceSet:
    """The resources of one connector: the connector itself and tasks 0..task_count-1."""
    shards = {name: _numbered(name, task_count)} if task_count > 0 else {}
    return ResourceSet._kept_by_connector(frozenset((name,)), shards)


class _HasResources(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def task_count(self) -> int: ...


def catalogue_resources(connectors: Iterable[_HasResources]) -> ResourceSet:
    """Every connector and task of a catalogue, kept by connector, built in one pass
    (O(resources))."""
    names: list[str] = []
    shards: Shards = {}
    for connector in connectors:
        names.append(connector.name)
        if connector.task_count > 0:
            shards[connector.name] = _numbered(connector.name, connector.task_count)
    return ResourceSet._kept_by_connector(frozenset(names), shards)


CatalogueChange = tuple[str, int | None, int | None]
"""A connector's name, its task count before and after a change (None: absent)."""


def catalogue_with(base: ResourceSet, changes: Iterable[CatalogueChange]) -> ResourceSet:
    """`base` (a catalogue's resources: each connector's tasks numbered from 0) with connectors
    added, resized or removed, kept by connector: one copy of `base`'s connector map (in C)
    plus the changed connectors' tasks, never a task of an unchanged connector touched."""
    connectors = set(base.connectors)
    shards = dict(base.by_connector())
    for name, _was, now in changes:
        after = 0 if now is None else now
        if now is None:
            connectors.discard(name)
        else:
            connectors.add(name)
        kept = shards.get(name)
        before = 0 if kept is None else len(kept)
        if after == before:
            continue
        if after == 0:
            shards.pop(name, None)
        elif kept is not None and after < before:
            ordered = kept.ordered()[:after]
            shards[name] = ConnectorTasks(ordered, ordered)
        else:
            ordered = (
                *(kept.ordered() if kept is not None else ()),
                *(TaskId(name, i) for i in range(before, after)),
            )
            shards[name] = ConnectorTasks(ordered, ordered)
    return ResourceSet._kept_by_connector(frozenset(connectors), shards)


def within_catalogue(share: ResourceSet, catalogue: ResourceSet) -> bool:
    """`share <= catalogue` for a catalogue (`catalogue_resources`: each connector's tasks
    numbered from 0 without a gap), in O(share's connectors) once their order is known: a
    connector's tasks are within it when their lowest and highest numbers are. A small share
    is one subset test of its tasks (the catalogue's joined once per catalogue)."""
    if not share.connectors <= catalogue.connectors:
        return False
    if share.task_count() < BY_CONNECTOR_FROM:  # a small share: one subset test in C
        return share.tasks <= catalogue.tasks
    mine, theirs = share.by_connector(), catalogue.by_connector()
    for connector, held in mine.items():
        known = theirs.get(connector)
        if known is None:
            return False
        if held is known:
            continue
        if known.runs() != ((0, len(known) - 1),):  # not numbered from 0: compared as sets
            if not held <= known:
                return False
        elif not (held.lowest()[1] >= 0 and held.highest()[1] < len(known)):
            return False
    return True


def union(sets: Iterable[ResourceSet]) -> ResourceSet:
    """The union of many sets in one pass (O(total size)), not one copy per set; kept by
    connector when every set is and they hold `BY_CONNECTOR_FROM` tasks or more (each
    connector's tasks joined once, a connector in one set only kept as it is)."""
    listed = list(sets)
    if (
        listed
        and all(s._shards is not None for s in listed)
        and sum(s._size for s in listed) >= BY_CONNECTOR_FROM
    ):
        names: set[str] = set()
        held: dict[str, list[ConnectorTasks]] = {}
        for s in listed:
            names.update(s.connectors)
            for connector, part in s._shards.items():  # type: ignore[union-attr]
                held.setdefault(connector, []).append(part)
        shards: Shards = {}
        for connector, parts in held.items():
            first = parts[0]
            if all(part is first for part in parts):
                shards[connector] = first
            else:
                shards[connector] = ConnectorTasks(frozenset().union(*parts))
        return ResourceSet._kept_by_connector(frozenset(names), shards)
    connectors: set[str] = set()
    tasks: set[TaskId] = set()
    for s in listed:
        connectors.update(s.connectors)
        tasks.update(s.tasks)
    return ResourceSet(frozenset(connectors), frozenset(tasks))
