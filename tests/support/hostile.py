"""Hostile requests for every RPC of connect.group.v1, how to judge the coordinator's answers, and
the checks after a fuzz run (issue 12). Shared by the fuzz tests (`tests/fuzz/`, which draw
through hypothesis) and the fuzz benchmark (`bench/fuzz_bench.py`, which draws from a seeded
`random.Random`): every generator takes a `Source` of choices, so both use the same code.

Two kinds of request:

- **well-formed** (`well_formed`): a valid protobuf message of the RPC whose fields hold hostile
  values: boundary, negative and huge integers, NUL and other control characters, odd unicode,
  strings at and over every length limit, empty strings, duplicated entries, unknown assignor
  names, the member ids and epochs of other members, connector names that look like task names,
  ... Names come mostly from small pools (`World`), and epochs mostly from what earlier answers
  said, so that requests get past the first checks and reach the deep paths (joins, revocations,
  Prepare and Install by the chosen member, catalogue changes) with one field gone wrong.
- **raw** (`raw_body`): bytes sent as the body as they are: random bytes, valid encodings with
  bytes flipped, cut, inserted or duplicated, merged encodings, unknown fields, invalid UTF-8,
  overlong varints, deeply nested groups, and (rarely) bodies over the server's size limit.

`judge` says whether an answer is one the contract allows: gRPC OK with an in-band error code
of the contract (never UNKNOWN_SERVER_ERROR), INVALID_ARGUMENT exactly for bodies that do not
decode, RESOURCE_EXHAUSTED only for a request or an answer over the server's size limit;
nothing else. `LogWatch`/`log_findings` scan the server's log for tracebacks,
`check_invariants` checks the database with plain SQL afterwards.

Writers never name the healthy group (`HealthyGroup`), which must go on being served without a
single error while the fuzzing runs; read-only RPCs may name it.
"""

from __future__ import annotations

import random
import re
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
import sqlalchemy as sa
from connect.group.v1 import admin_pb2, classic_pb2, common_pb2, coordinator_pb2
from google.protobuf.message import DecodeError, Message

from connect_protocol import configs
from connect_protocol.errors import ErrorCode
from tests.support.client import ScriptedWorker
from tests.support.coordinator import Stubs

T = TypeVar("T")

# --- sources of choices ---------------------------------------------------------------------------


class Source(Protocol):
    """Where every choice of a generator comes from. Simpler choices come first (hypothesis
    shrinks towards the lower bound of `integer` and the first option of `pick`)."""

    def integer(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]."""
        ...

    def pick(self, options: Sequence[T]) -> T:
        """One of `options`."""
        ...

    def blob(self, max_size: int) -> bytes:
        """Arbitrary bytes, at most `max_size` of them."""
        ...

    def chars(self, max_size: int) -> str:
        """Arbitrary unicode text (no surrogates: a protobuf string cannot hold one)."""
        ...


#: Code point ranges RandomSource draws text from (surrogates excluded).
_CODE_POINTS = ((0x00, 0x7F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF))


class RandomSource:
    """A `Source` on a seeded `random.Random` (the benchmark's: fast, reproducible)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def pick(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def blob(self, max_size: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, max_size))

    def chars(self, max_size: int) -> str:
        out = []
        for _ in range(self.rng.randint(0, max_size)):
            lo, hi = _CODE_POINTS[self.rng.randrange(len(_CODE_POINTS))]
            out.append(chr(self.rng.randint(lo, hi)))
        return "".join(out)


def weighted(src: Source, options: Sequence[tuple[int, T]]) -> T:
    """One of `options` ((weight, value) pairs) with probability proportional to its weight
    under a random source; hypothesis shrinks towards the first."""
    total = sum(w for w, _ in options)
    n = src.integer(0, total - 1)
    for w, value in options:
        if n < w:
            return value
        n -= w
    raise AssertionError("unreachable")


def lazy(src: Source, options: Sequence[tuple[int, Callable[[], T]]]) -> T:
    """`weighted` over ways to make a value: only the chosen one is called (draws nothing
    for the others)."""
    return weighted(src, options)()


# --- hostile values -------------------------------------------------------------------------------

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

INT32_EDGES = (
    0, 1, -1, -2, -3, 2, 127, 128, -128, -129, 255, 256, 1000, 65_535, 100_000, 100_001,
    2**30, INT32_MAX - 1, INT32_MAX, INT32_MIN, INT32_MIN + 1,
)  # fmt: skip
INT64_EDGES = (*INT32_EDGES, 2**31, 2**32, 2**53, INT64_MAX - 1, INT64_MAX, INT64_MIN)

#: Fragments that hostile strings are made of.
ODD_TEXT = (
    "\x00", "\x01", "\x07\x08\x1b[2J", "\x7f", "\t\r\n", " ", "\u00a0", "\u200b", "\u200d",
    "\u202e", "\u2028", "\ufeff", "\ufffd", "\uffff", "\U0010ffff", "\U0001f600", "e\u0301",
    "\u03a9", "\u4e2d\u6587", "\U000e0041", "'", '"', "\\", "%s%n%x", "{0}{}", "${jndi:x}",
    "'; DROP TABLE groups; --", "../", "<script>", "null", "-1", "NaN", "%", "_", "*",
    "hold:m0", "m0", "c0", "c0-0", "-0", "\\u0000", "\x00\x00",
)  # fmt: skip

#: The string length limits the coordinator enforces (names, urls, error messages).
NAME_LIMIT, URL_LIMIT, ERROR_MESSAGE_LIMIT = 249, 2_048, 4_096

ASSIGNOR_NAMES = ("incremental_cooperative", "eager")
#: Every group configuration (the table's, so keys added later are drawn too: the automatic
#: restarts' restart.failed.*), and the bounds of the integer ones (values at and next to each).
CONFIG_KEYS = configs.CONFIG_KEYS
CONFIG_BOUNDS = tuple(
    sorted(
        {
            bound
            for row in configs.GROUP_CONFIGS
            if isinstance(row, configs.IntConfig)
            for bound in (row.minimum, row.maximum)
        }
    )
)
NUMBERS_AS_TEXT = (
    "3000", "-1", "0", "1", "2", "999", "1000", "2147483647", "2147483648", "-2147483648",
    "99999999999999999999999", "1e3", "0x10", " 5", "5 ", "+5", "\u0663", "5\x00", "",
    "00010", "-0", "1_000", "\uff15",
)  # fmt: skip


def int32(src: Source, near: Iterable[int] = ()) -> int:
    """Mostly a boundary value or one next to a value that matters (`near`), else any."""
    close = [v + d for v in near for d in (0, 1, -1) if INT32_MIN <= v + d <= INT32_MAX]
    return lazy(
        src,
        [
            (3 if close else 0, lambda: src.pick(close)),
            (3, lambda: src.pick(INT32_EDGES)),
            (1, lambda: src.integer(0, 10)),
            (1, lambda: src.integer(INT32_MIN, INT32_MAX)),
        ],
    )


def int64(src: Source) -> int:
    return lazy(
        src,
        [
            (3, lambda: src.pick(INT64_EDGES)),
            (1, lambda: src.integer(0, 10)),
            (1, lambda: src.integer(-1, 2**40)),
        ],
    )


def text(src: Source, pool: Sequence[str] = (), limit: int = NAME_LIMIT) -> str:
    """A hostile string: mostly one of `pool` (a valid name), else empty, odd fragments glued
    together, random unicode, or one character repeated up to, at and beyond `limit`."""
    kind = weighted(
        src,
        [(14 if pool else 0, "pool"), (1, "empty"), (4, "glued"), (1, "random"), (2, "long")],
    )
    if kind == "pool":
        return src.pick(pool)
    if kind == "empty":
        return ""
    if kind == "random":
        return src.chars(64)
    if kind == "long":
        length = src.pick((limit, limit + 1, limit - 1, 4 * limit, 100_000))
        return src.pick(("x", "\u00e9", "\U0001f600", "\x00", " ")) * length
    parts = []
    for _ in range(src.integer(1, 3)):
        parts.append(
            lazy(src, [(2 if pool else 0, lambda: src.pick(pool)), (3, lambda: src.pick(ODD_TEXT))])
        )
    return "".join(parts)


def blob(src: Source) -> bytes:
    return lazy(
        src,
        [
            (4, lambda: b""),
            (3, lambda: src.blob(64)),
            (1, lambda: b"\xff" * 200_000),
            (1, lambda: b"\x01" * 60_000),  # just under the default 64 KiB metadata limit
            (1, lambda: bytes(range(256)) * 4),
        ],
    )


# --- the world: pools of names and what answers taught --------------------------------------------

Key = tuple[str, str]


@dataclass
class Prepared:
    """What a PrepareAssignment answer showed: enough to build an install that may pass."""

    group_epoch: int
    member_ids: tuple[str, ...]
    connectors: tuple[str, ...]
    tasks: tuple[tuple[str, int], ...]


#: The admin RPCs whose answer carries the group's epoch after the call (entering or leaving
#: STOPPED bumps it, as a task count change does).
EPOCH_ANSWERS = frozenset(
    {
        "PutConnector",
        "DeleteConnector",
        "PauseConnector",
        "ResumeConnector",
        "StopConnector",
        "RestartConnector",
        "RemoveMember",
    }
)


@dataclass
class World:
    """The names requests use, and what earlier answers said about the fuzzed groups (member
    epochs, group epochs, the chosen assignor member, assignments, Prepare snapshots), so that
    many requests are right about everything but one field. Thread-safe."""

    prefix: str = "fz"
    healthy_group: str = "healthy"
    groups: tuple[str, ...] = ()
    members: tuple[str, ...] = ()
    connectors: tuple[str, ...] = ()
    instances: tuple[str, ...] = ()
    epochs: dict[Key, int] = field(default_factory=dict)
    group_epochs: dict[str, int] = field(default_factory=dict)
    computing: dict[str, str] = field(default_factory=dict)
    assigned: dict[Key, common_pb2.ConnectorsAndTasks] = field(default_factory=dict)
    prepared: dict[str, Prepared] = field(default_factory=dict)
    #: Classic groups (their own names: a classic call on a connect group is refused, and a
    #: connect call on a classic group likewise, each in one step), the member ids their
    #: MEMBER_ID_REQUIRED answers handed out (the latest CLASSIC_IDS_KEPT), their generations
    #: and the members their leader was shown.
    classic_groups: tuple[str, ...] = ()
    classic_ids: dict[str, list[str]] = field(default_factory=dict)
    generations: dict[str, int] = field(default_factory=dict)
    shown_members: dict[Key, tuple[str, ...]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        p = self.prefix
        if not self.groups:
            # Valid but odd ids too: the longest allowed, non-ASCII, spaces, a ':'.
            self.groups = (
                f"{p}-g0", f"{p}-g1", f"{p}-g2", f"{p} \u00e9\u202e:g3", (p + "-") * 83,
            )  # fmt: skip
        if not self.members:
            # "hold:m0" mimics the coordinator's own owner labels for held work.
            self.members = ("m0", "m1", "m2", "m3", "hold:m0", "m-1", "\u00b5" * NAME_LIMIT)
        if not self.connectors:
            # "c0-1" is also how task 1 of connector c0 is written.
            self.connectors = ("c0", "c1", "c2", "c0-1", "\u00e7-\U0001f600", "k" * NAME_LIMIT)
        if not self.instances:
            self.instances = ("i0", "i1", "i-\u00e9")
        if not self.classic_groups:
            self.classic_groups = (f"{p}-k0", f"{p}-k1", f"{p} \u00e9:k2")

    # -- reading --

    def group(self, src: Source) -> str:
        """A group for a writing RPC: never the healthy one."""
        value = text(src, self.groups)
        return self.groups[0] if value == self.healthy_group else value

    def any_group(self, src: Source) -> str:
        """A group for a read-only RPC: the healthy one too."""
        return lazy(src, [(6, lambda: self.group(src)), (1, lambda: self.healthy_group)])

    def member_epoch(self, group: str, member: str) -> int:
        with self.lock:
            return self.epochs.get((group, member), 0)

    def group_epoch(self, group: str) -> int:
        with self.lock:
            return self.group_epochs.get(group, 1)

    def classic_member(self, src: Source, group: str, empty: int = 1) -> str:
        """A member id for a classic call: mostly one the group handed out, else empty (weight
        `empty`), one of the pool, or hostile. What the world learned changes the value, never
        how many choices are drawn (hypothesis replays choice sequences)."""
        with self.lock:
            ids = tuple(self.classic_ids.get(group, ()))
        kind = weighted(src, [(6, "learned"), (empty, "empty"), (2, "pool")])
        if kind == "learned":
            i = src.integer(0, CLASSIC_IDS_KEPT - 1)
            return ids[i % len(ids)] if ids else ""
        if kind == "empty":
            return ""
        return text(src, self.members)

    def classic_group(self, src: Source) -> str:
        """A classic group: mostly a valid one (so calls reach its state), else hostile."""
        return lazy(
            src,
            [
                (6, lambda: src.pick(self.classic_groups)),
                (1, lambda: text(src, self.classic_groups)),
            ],
        )

    def generation(self, group: str) -> int:
        with self.lock:
            return self.generations.get(group, 0)

    # -- learning --

    def learn(self, rpc: str, request: Message, response: Message) -> None:
        with self.lock:
            self._learn(rpc, request, response)

    def _learn(self, rpc: str, req: Any, resp: Any) -> None:
        ok = (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT)
        if rpc == "ConnectGroupHeartbeat":
            key = (req.group_id, req.member_id)
            if resp.error_code in ok and req.member_epoch >= 0:
                self.epochs[key] = resp.member_epoch
                if resp.HasField("assignment"):
                    self.assigned[key] = resp.assignment.connectors_and_tasks
                if resp.error_code == ErrorCode.COMPUTE_ASSIGNMENT:
                    self.computing[req.group_id] = req.member_id
            elif resp.error_code in ok or resp.error_code in (
                ErrorCode.UNKNOWN_MEMBER_ID,
                ErrorCode.FENCED_MEMBER_EPOCH,
            ):
                self.epochs.pop(key, None)
                self.assigned.pop(key, None)
        elif rpc == "ConnectGroupPrepareAssignment" and resp.error_code == ErrorCode.NONE:
            self.group_epochs[req.group_id] = resp.group_epoch
            for m in resp.members:
                self.epochs[(req.group_id, m.member_id)] = m.member_epoch
            self.prepared[req.group_id] = Prepared(
                resp.group_epoch,
                tuple(m.member_id for m in resp.members),
                tuple(c.name for c in resp.catalogue),
                tuple((c.name, t) for c in resp.catalogue for t in range(min(c.task_count, 64))),
            )
        elif rpc in EPOCH_ANSWERS and resp.error_code == ErrorCode.NONE:
            self.group_epochs[req.group_id] = resp.group_epoch
        elif rpc == "JoinGroup":
            if resp.error_code == ErrorCode.MEMBER_ID_REQUIRED and resp.member_id:
                ids = self.classic_ids.setdefault(req.group_id, [])
                ids.append(resp.member_id)
                del ids[:-CLASSIC_IDS_KEPT]
            elif resp.error_code == ErrorCode.NONE:
                self.generations[req.group_id] = resp.generation_id
                if resp.leader == resp.member_id:
                    self.shown_members[(req.group_id, resp.member_id)] = tuple(
                        m.member_id for m in resp.members
                    )


# --- well-formed hostile messages, per RPC --------------------------------------------------------

IC = ("incremental_cooperative", 1, 2, 0, 2)


def _assignor(src: Source, msg: common_pb2.Assignor) -> None:
    _, lo, hi, reason, version = IC
    msg.name = lazy(
        src, [(4, lambda: src.pick(ASSIGNOR_NAMES)), (1, lambda: text(src, ASSIGNOR_NAMES))]
    )
    if src.integer(0, 2) == 0:
        lo, hi = int32(src, (lo,)), int32(src, (hi,))
        reason, version = int32(src, (0,)), int32(src, (lo, hi))
    msg.minimum_version, msg.maximum_version, msg.reason, msg.version = lo, hi, reason, version
    msg.metadata = blob(src)


def _assignors(src: Source, msg: common_pb2.AssignorList) -> None:
    msg.SetInParent()  # present, maybe with zero elements
    for _ in range(weighted(src, [(4, 1), (1, 0), (2, 2), (1, 3)])):
        _assignor(src, msg.assignors.add())
    if msg.assignors and src.integer(0, 5) == 0:
        msg.assignors.add().CopyFrom(msg.assignors[0])  # a duplicated entry


def _resources(src: Source, world: World, msg: common_pb2.ConnectorsAndTasks) -> None:
    """A hostile set of resources: hostile names, negative and huge task ids, duplicates, or
    thousands of entries."""
    msg.SetInParent()
    count = weighted(src, [(3, 1), (2, 0), (2, 2), (1, 5), (1, 3_000)])
    if count > 5:  # many, made without a choice each
        stem = text(src, world.connectors)[:64]
        msg.connectors.extend(f"{stem}{i}" for i in range(count))
        msg.tasks.extend(common_pb2.ConnectorTaskId(connector=stem, task=i) for i in range(count))
        return
    for _ in range(count):
        msg.connectors.append(text(src, world.connectors))
    for _ in range(weighted(src, [(3, 1), (1, 0), (2, 3), (1, 6)])):
        msg.tasks.add(
            connector=text(src, world.connectors),
            task=lazy(src, [(3, lambda: src.integer(0, 3)), (1, lambda: int32(src))]),
        )


def heartbeat(src: Source, world: World) -> coordinator_pb2.ConnectGroupHeartbeatRequest:
    group, member = world.group(src), text(src, world.members)
    known = world.member_epoch(group, member)
    epoch = lazy(
        src,
        [
            (4, lambda: known),
            (3, lambda: 0),
            (1, lambda: -1),
            (1, lambda: -2),
            (2, lambda: int32(src, (known, world.group_epoch(group)))),
        ],
    )
    req = coordinator_pb2.ConnectGroupHeartbeatRequest(
        group_id=group, member_id=member, member_epoch=epoch
    )
    join = epoch == 0
    if weighted(src, [(6, False), (2, True)]):
        req.instance_id = text(src, world.instances)
    timeout = weighted(src, [(6, "sane" if join else "absent"), (1, "absent"), (1, "hostile")])
    if timeout != "absent":
        req.rebalance_timeout_ms = 5_000 if timeout == "sane" else int32(src, (5_000,))
    if weighted(src, [(12, False), (1, True)]):
        req.server_assignor = text(src, ASSIGNOR_NAMES)
    assignors = weighted(src, [(6, "sane" if join else "absent"), (1, "absent"), (2, "hostile")])
    if assignors == "sane":
        name, lo, hi, reason, version = IC
        req.client_assignors.assignors.add(
            name=name, minimum_version=lo, maximum_version=hi, reason=reason, version=version
        )
    elif assignors == "hostile":
        _assignors(src, req.client_assignors)
    owned = weighted(src, [(3, "told"), (3, "absent"), (1, "none"), (2, "hostile")])
    if owned == "told":
        with world.lock:
            told = world.assigned.get((group, member))
        if told is not None:
            req.connectors_and_tasks.CopyFrom(told)
        else:
            req.connectors_and_tasks.SetInParent()
    elif owned == "none":
        req.connectors_and_tasks.SetInParent()
    elif owned == "hostile":
        _resources(src, world, req.connectors_and_tasks)
    if weighted(src, [(8, False), (2, True)]):
        req.url = lazy(src, [(1, lambda: "http://w:8083"), (1, lambda: text(src, limit=URL_LIMIT))])
    return req


def prepare(src: Source, world: World) -> coordinator_pb2.ConnectGroupPrepareAssignmentRequest:
    group = world.group(src)
    with world.lock:
        chosen = world.computing.get(group)
    member = lazy(
        src, [(3, lambda: chosen or world.members[0]), (2, lambda: text(src, world.members))]
    )
    known = world.member_epoch(group, member)
    return coordinator_pb2.ConnectGroupPrepareAssignmentRequest(
        group_id=group,
        member_id=member,
        member_epoch=lazy(src, [(4, lambda: known), (1, lambda: int32(src))]),
    )


def _member_call_target(src: Source, world: World) -> tuple[str, str, int]:
    """A group, member and epoch for ConnectGroupConfigs / ConnectGroupReportStatus: mostly a
    member's known epoch (or a classic member's generation), else hostile ones."""
    if weighted(src, [(4, False), (1, True)]):
        group = world.classic_group(src)
        member = world.classic_member(src, group)
        known = world.generation(group)
    else:
        group, member = world.group(src), text(src, world.members)
        known = world.member_epoch(group, member)
    epoch = lazy(src, [(5, lambda: known), (1, lambda: 0), (2, lambda: int32(src, (known,)))])
    return group, member, epoch


def connect_group_configs(src: Source, world: World) -> coordinator_pb2.ConnectGroupConfigsRequest:
    group, member, epoch = _member_call_target(src, world)
    req = coordinator_pb2.ConnectGroupConfigsRequest(
        group_id=group, member_id=member, member_epoch=epoch
    )
    for _ in range(weighted(src, [(4, 0), (2, 1), (1, 3), (1, 12_000)])):
        req.known_digests[text(src, world.connectors)[:200]] = text(src, ("sha256:0",))
    return req


REPORTED_STATES = (0, 1, 2, 3, 4, 5, 6, -1)


def connect_group_report_status(
    src: Source, world: World
) -> coordinator_pb2.ConnectGroupReportStatusRequest:
    group, member, epoch = _member_call_target(src, world)
    req = coordinator_pb2.ConnectGroupReportStatusRequest(
        group_id=group, member_id=member, member_epoch=epoch
    )
    count = weighted(src, [(5, 1), (1, 0), (2, 3), (1, 11_000)])
    if count > 3:  # many, made without a choice each
        stem = text(src, world.connectors)[:64]
        for i in range(count):
            req.entries.add(connector=stem, task=i, fencing_token=1, state=1)
        return req
    for _ in range(count):
        entry = req.entries.add(
            connector=text(src, world.connectors),
            fencing_token=lazy(src, [(3, lambda: src.integer(1, 40)), (1, lambda: int64(src))]),
            state=src.pick(REPORTED_STATES),  # type: ignore[arg-type]
            trace=lazy(
                src,
                [(4, lambda: ""), (2, lambda: text(src)), (1, lambda: "x" * 200_000)],
            ),
        )
        if weighted(src, [(1, False), (2, True)]):
            entry.task = lazy(src, [(3, lambda: src.integer(0, 3)), (1, lambda: int32(src))])
    return req


def install(src: Source, world: World) -> coordinator_pb2.ConnectGroupInstallAssignmentRequest:
    group = world.group(src)
    with world.lock:
        chosen = world.computing.get(group)
        snapshot = world.prepared.get(group)
    member = lazy(
        src, [(3, lambda: chosen or world.members[0]), (2, lambda: text(src, world.members))]
    )
    known = world.member_epoch(group, member)
    group_epoch = snapshot.group_epoch if snapshot else world.group_epoch(group)
    req = coordinator_pb2.ConnectGroupInstallAssignmentRequest(
        group_id=group,
        member_id=member,
        member_epoch=lazy(src, [(4, lambda: known), (1, lambda: int32(src, (known,)))]),
        group_epoch=lazy(src, [(4, lambda: group_epoch), (1, lambda: int32(src, (group_epoch,)))]),
        error=lazy(src, [(8, lambda: 0), (1, lambda: int32(src, (0, 127, -128)))]),
        error_message=lazy(
            src, [(8, lambda: ""), (1, lambda: text(src, limit=ERROR_MESSAGE_LIMIT))]
        ),
        assignor_state=blob(src),
        scheduled_rebalance_delay_ms=lazy(
            src, [(5, lambda: 0), (2, lambda: src.integer(1, 5_000)), (1, lambda: int64(src))]
        ),
    )
    # The members of the snapshot share its catalogue (round robin), then things go wrong.
    member_ids = list(snapshot.member_ids) if snapshot else [member]
    shares = {m: req.members.add(member_id=m) for m in member_ids}
    if snapshot:
        for i, c in enumerate(snapshot.connectors):
            shares[member_ids[i % len(member_ids)]].connectors_and_tasks.connectors.append(c)
        for i, (c, t) in enumerate(snapshot.tasks):
            shares[member_ids[i % len(member_ids)]].connectors_and_tasks.tasks.add(
                connector=c, task=t
            )
    for _ in range(weighted(src, [(4, 0), (2, 1), (1, 3)])):
        damage = src.integer(0, 5)
        if damage == 0:  # a share for someone else (unknown, hostile, or listed twice)
            extra = req.members.add(member_id=text(src, world.members))
            _resources(src, world, extra.connectors_and_tasks)
        elif damage == 1 and req.members:  # hostile resources in a share
            _resources(src, world, src.pick(list(req.members)).connectors_and_tasks)
        elif damage == 2 and len(req.members) > 0:  # one resource given twice
            first = req.members[0].connectors_and_tasks
            if first.connectors:
                req.members[-1].connectors_and_tasks.connectors.append(first.connectors[0])
        elif damage == 3 and req.members:  # a share dropped
            del req.members[src.integer(0, len(req.members) - 1)]
        elif damage == 4 and req.members:  # hostile version and metadata
            share = src.pick(list(req.members))
            share.version, share.metadata = int32(src), blob(src)
        else:  # a member id made hostile
            if req.members:
                src.pick(list(req.members)).member_id = text(src, world.members)
    return req


def _config(src: Source, world: World, msg: Any) -> None:
    """A hostile string map: keys and values with NUL, odd unicode, empty, long; or many."""
    count = weighted(src, [(4, 0), (2, 1), (1, 3), (1, 1_000)])
    if count > 3:
        msg.update({f"k{i}": f"v{i}" * (i % 7) for i in range(count)})
        return
    for _ in range(count):
        msg[text(src, ("topic", "tasks.max", "password"))] = text(
            src, ("orders", "10", ""), limit=10_000
        )


def put_connector(src: Source, world: World) -> admin_pb2.PutConnectorRequest:
    req = admin_pb2.PutConnectorRequest(
        group_id=world.group(src),
        connector=text(src, world.connectors),
        task_count=lazy(src, [(6, lambda: src.integer(0, 4)), (2, lambda: int32(src, (100_000,)))]),
    )
    _config(src, world, req.config)
    return req


def delete_connector(src: Source, world: World) -> admin_pb2.DeleteConnectorRequest:
    return admin_pb2.DeleteConnectorRequest(
        group_id=world.group(src), connector=text(src, world.connectors)
    )


def _target_state(request_type: Any) -> Callable[[Source, World], Message]:
    """Pause-, Resume- or StopConnector (DESIGN 3.20): groups and connectors of the world, or
    hostile names."""

    def generate(src: Source, world: World) -> Message:
        return request_type(  # type: ignore[no-any-return]
            group_id=world.group(src), connector=text(src, world.connectors)
        )

    return generate


pause_connector = _target_state(admin_pb2.PauseConnectorRequest)
resume_connector = _target_state(admin_pb2.ResumeConnectorRequest)
stop_connector = _target_state(admin_pb2.StopConnectorRequest)


def restart_connector(src: Source, world: World) -> admin_pb2.RestartConnectorRequest:
    """RestartConnector (DESIGN 3.20): the task absent, in range, out of it, negative or huge."""
    req = admin_pb2.RestartConnectorRequest(
        group_id=world.group(src),
        connector=text(src, world.connectors),
        include_tasks=src.pick((False, True)),
        only_failed=src.pick((False, True)),
    )
    task = lazy(
        src,
        [
            (3, lambda: None),
            (3, lambda: src.integer(0, 4)),
            (1, lambda: int32(src, (-1, 100_000))),
        ],
    )
    if task is not None:
        req.task = task
    return req


def delete_group(src: Source, world: World) -> admin_pb2.DeleteGroupRequest:
    """DeleteGroup (DESIGN 3.20): the world's groups (never the healthy one), with or without
    the catalogue; most are refused NON_EMPTY_GROUP, some are deleted and re-created later."""
    return admin_pb2.DeleteGroupRequest(
        group_id=world.group(src), with_catalogue=src.pick((False, True))
    )


def remove_member(src: Source, world: World) -> admin_pb2.RemoveMemberRequest:
    """RemoveMember (DESIGN 3.20): a member named by id, by instance id, by both or by
    neither, with a reason that may be long or odd."""
    req = admin_pb2.RemoveMemberRequest(group_id=world.group(src))
    naming = weighted(src, [(4, "member"), (2, "instance"), (1, "both"), (1, "neither")])
    if naming in ("member", "both"):
        req.member_id = text(src, world.members)
    if naming in ("instance", "both"):
        req.instance_id = text(src, world.instances)
    req.reason = lazy(src, [(3, lambda: ""), (2, lambda: text(src, ("decommissioned",), 256))])
    return req


def config_key(src: Source) -> str:
    return lazy(src, [(4, lambda: src.pick(CONFIG_KEYS)), (1, lambda: text(src, CONFIG_KEYS))])


def alter_group_configs(src: Source, world: World) -> admin_pb2.AlterGroupConfigsRequest:
    req = admin_pb2.AlterGroupConfigsRequest(group_id=world.group(src))
    for _ in range(weighted(src, [(3, 1), (1, 0), (2, 2), (1, 4)])):
        req.set[config_key(src)] = lazy(
            src,
            [
                (3, lambda: src.pick(NUMBERS_AS_TEXT)),
                (1, lambda: str(int32(src, CONFIG_BOUNDS))),
                (1, lambda: str(int64(src))),
                (1, lambda: text(src)),
            ],
        )
    for _ in range(weighted(src, [(4, 0), (1, 1), (1, 2)])):
        req.unset.append(config_key(src))
    return req


def list_groups(src: Source, world: World) -> admin_pb2.ListGroupsRequest:
    return admin_pb2.ListGroupsRequest(
        page_size=lazy(
            src, [(3, lambda: 0), (2, lambda: src.integer(1, 3)), (2, lambda: int32(src))]
        ),
        page_token=lazy(
            src, [(3, lambda: ""), (2, lambda: world.any_group(src)), (2, lambda: text(src))]
        ),
    )


def describe_groups(src: Source, world: World) -> admin_pb2.DescribeGroupsRequest:
    count = weighted(src, [(4, 1), (1, 0), (2, 3), (1, 25)])
    if count > 3:
        return admin_pb2.DescribeGroupsRequest(
            group_ids=[world.groups[i % len(world.groups)] for i in range(count)]
        )
    return admin_pb2.DescribeGroupsRequest(group_ids=[world.any_group(src) for _ in range(count)])


def find_coordinator(src: Source, world: World) -> admin_pb2.FindCoordinatorRequest:
    return admin_pb2.FindCoordinatorRequest(group_id=world.any_group(src))


ACL_WORDS = (
    "MEMBER",
    "DESCRIBE",
    "ALTER",
    "DESCRIBE_CONFIGS",
    "ALL",
    "GROUP",
    "CLUSTER",
    "LITERAL",
    "PREFIXED",
    "ALLOW",
    "DENY",
    "User:*",
    "User:alice",
    "cluster",
)


def acl_entry(src: Source, world: World) -> admin_pb2.AclEntry:
    return admin_pb2.AclEntry(
        principal=text(src, ACL_WORDS, limit=1_100),
        operation=text(src, ACL_WORDS),
        resource_type=text(src, ACL_WORDS),
        pattern_type=text(src, ACL_WORDS),
        pattern=lazy(src, [(2, lambda: world.any_group(src)), (1, lambda: text(src))]),
        permission=text(src, ACL_WORDS),
    )


def add_acl(src: Source, world: World) -> admin_pb2.AddAclRequest:
    return admin_pb2.AddAclRequest(entry=acl_entry(src, world))


def remove_acl(src: Source, world: World) -> admin_pb2.RemoveAclRequest:
    return admin_pb2.RemoveAclRequest(entry=acl_entry(src, world))


def list_acls(src: Source, world: World) -> admin_pb2.ListAclsRequest:
    return admin_pb2.ListAclsRequest(principal=text(src, ACL_WORDS, limit=1_100))


def describe_features(src: Source, world: World) -> admin_pb2.DescribeFeaturesRequest:
    return admin_pb2.DescribeFeaturesRequest()


FEATURE_WORDS = ("group.version", "GROUP.VERSION", "group.version ", "transaction.version")


def update_features(src: Source, world: World) -> admin_pb2.UpdateFeaturesRequest:
    """Mostly group.version at levels in and out of its range; a lowering to 0 is sent as
    validate_only (the fuzz target keeps serving the connect protocol; a raw body that lowers
    it anyway is undone by `RESTORE_GROUP_VERSION`)."""
    feature = text(src, FEATURE_WORDS)
    level = int32(src, near=(0, 1))
    validate_only = src.pick((False, True))
    if feature == "group.version" and level == 0:
        validate_only = True
    return admin_pb2.UpdateFeaturesRequest(
        feature=feature, level=level, validate_only=validate_only
    )


#: What a fuzz client sends after an UpdateFeatures that may have lowered group.version: the
#: level back at 1, so the rest of the run is served as before.
RESTORE_GROUP_VERSION = admin_pb2.UpdateFeaturesRequest(
    feature="group.version", level=1
).SerializeToString()


def may_have_lowered_group_version(rpc: str, response: Message | None) -> bool:
    """Whether an answer says a level other than 1 was set (or, validate_only, would have
    been: restoring is harmless then)."""
    return (
        rpc == "UpdateFeatures"
        and isinstance(response, admin_pb2.UpdateFeaturesResponse)
        and response.changed
        and response.finalized_level != 1
    )


# --- the classic protocol (ConnectGroupClassic) ---------------------------------------------------

#: Member ids a classic group's MEMBER_ID_REQUIRED answers handed out that the world keeps.
CLASSIC_IDS_KEPT = 8
CLASSIC_FLAGS = (
    "--classic-min-session-timeout-ms",
    "100",
    "--classic-initial-rebalance-delay-ms",
    "0",
    "--classic-new-member-join-timeout-ms",
    "2000",
)
"""The coordinator's classic flags for fuzzing (the tests and bench/run-fuzz): sessions as
short as the generators draw, and classic phases that end as quickly, so that hostile calls
reach members, generations and syncs instead of stopping at INVALID_SESSION_TIMEOUT."""
CLASSIC_PROTOCOLS = (("default", 0), ("compatible", 1), ("sessioned", 2))


def _classic_metadata(src: Source, world: World, version: int, msg: Any) -> None:
    msg.version = lazy(src, [(8, lambda: version), (1, lambda: int32(src, (version,)))])
    msg.url = lazy(src, [(8, lambda: "http://w:8083"), (1, lambda: text(src, limit=URL_LIMIT))])
    if weighted(src, [(6, False), (1, True)]):
        msg.config_offset = int64(src)
    allocation = weighted(src, [(4, "absent"), (3, "sane" if version else "absent"), (2, "any")])
    if allocation == "sane":
        msg.allocation.SetInParent()
    elif allocation == "any":
        _resources(src, world, msg.allocation)


def join_group(src: Source, world: World) -> classic_pb2.JoinGroupRequest:
    group = world.classic_group(src)
    req = classic_pb2.JoinGroupRequest(
        group_id=group,
        member_id=world.classic_member(src, group, empty=3),
        # Short timeouts, mostly: a join waits for its phase, which they bound.
        session_timeout_ms=lazy(src, [(6, lambda: 300), (2, lambda: int32(src, (100,)))]),
        rebalance_timeout_ms=lazy(src, [(8, lambda: 150), (1, lambda: int32(src, (0,)))]),
        protocol_type=lazy(
            src, [(10, lambda: "connect"), (1, lambda: "consumer"), (1, lambda: text(src))]
        ),
    )
    for _ in range(weighted(src, [(6, 1), (2, 2), (1, 3), (1, 0), (1, 4)])):
        name, version = lazy(
            src,
            [
                (8, lambda: src.pick(CLASSIC_PROTOCOLS)),
                (1, lambda: (text(src, ("default", "range", "cooperative-sticky")), 0)),
            ],
        )
        _classic_metadata(src, world, version, req.protocols.add(name=name).metadata)
    if weighted(src, [(10, False), (1, True)]):
        req.group_instance_id = text(src, world.instances)
    if weighted(src, [(6, False), (1, True)]):
        req.reason = text(src, ("rejoin", "metadata changed"), limit=1_024)
    return req


def _classic_assignment(src: Source, world: World, msg: Any) -> None:
    msg.version = lazy(src, [(6, lambda: src.pick((0, 1, 2))), (1, lambda: int32(src))])
    if weighted(src, [(8, False), (1, True)]):
        msg.error = int32(src)
    if weighted(src, [(8, False), (1, True)]):
        msg.leader = text(src, world.members)
    lazy(
        src,
        [
            (2, lambda: msg.assignment.SetInParent()),
            (3, lambda: _resources(src, world, msg.assignment)),
        ],
    )
    if weighted(src, [(3, False), (1, True)]):
        _resources(src, world, msg.revoked)
    if weighted(src, [(6, False), (1, True)]):
        msg.delay = int32(src, (0,))


def sync_group(src: Source, world: World) -> classic_pb2.SyncGroupRequest:
    group = world.classic_group(src)
    member = world.classic_member(src, group)
    known = world.generation(group)
    req = classic_pb2.SyncGroupRequest(
        group_id=group,
        member_id=member,
        generation_id=lazy(src, [(6, lambda: known), (2, lambda: int32(src, (known,)))]),
    )
    with world.lock:
        shown = world.shown_members.get((group, member), ())
    # The leader's sane assignment (everyone its JoinGroup answer named, nothing given: the
    # values come from the world, the draws do not depend on it), none, or hostile entries.
    version = lazy(src, [(6, lambda: src.pick((0, 1, 2))), (1, lambda: int32(src))])
    kind = weighted(src, [(4, "shown"), (2, "none"), (2, "hostile")])
    if kind == "shown":
        for target in shown:
            entry = req.assignments.add(member_id=target).assignment
            entry.version = version
            entry.assignment.SetInParent()
    elif kind == "hostile":
        for _ in range(src.integer(1, 3)):
            target = world.classic_member(src, group, empty=0)
            _classic_assignment(src, world, req.assignments.add(member_id=target).assignment)
    if weighted(src, [(6, False), (1, True)]):
        req.protocol_type = text(src, ("connect", "consumer"))
    if weighted(src, [(6, False), (1, True)]):
        req.protocol_name = text(src, tuple(name for name, _v in CLASSIC_PROTOCOLS))
    if weighted(src, [(10, False), (1, True)]):
        req.group_instance_id = text(src, world.instances)
    return req


def classic_heartbeat(src: Source, world: World) -> classic_pb2.HeartbeatRequest:
    group = world.classic_group(src)
    known = world.generation(group)
    req = classic_pb2.HeartbeatRequest(
        group_id=group,
        member_id=world.classic_member(src, group),
        generation_id=lazy(src, [(6, lambda: known), (2, lambda: int32(src, (known,)))]),
    )
    if weighted(src, [(10, False), (1, True)]):
        req.group_instance_id = text(src, world.instances)
    return req


def leave_group(src: Source, world: World) -> classic_pb2.LeaveGroupRequest:
    group = world.classic_group(src)
    req = classic_pb2.LeaveGroupRequest(group_id=group)
    for _ in range(weighted(src, [(8, 1), (2, 2), (1, 0), (1, 70)])):
        leaving = req.members.add(member_id=world.classic_member(src, group))
        if weighted(src, [(10, False), (1, True)]):
            leaving.group_instance_id = text(src, world.instances)
        if weighted(src, [(6, False), (1, True)]):
            leaving.reason = text(src, ("stopping",), limit=1_024)
    return req


# --- the RPCs -------------------------------------------------------------------------------------

COORDINATOR_SERVICE = "connect.group.v1.ConnectGroupCoordinator"
ADMIN_SERVICE = "connect.group.v1.ConnectGroupAdmin"
CLASSIC_SERVICE = "connect.group.v1.ConnectGroupClassic"
#: RPCs whose call may be held by the coordinator until its phase ends (a parked JoinGroup or
#: SyncGroup): sent with a short deadline, which may pass (DEADLINE_EXCEEDED is then allowed).
PARKABLE = frozenset({"JoinGroup", "SyncGroup"})
PARKED_DEADLINE_S = 0.5

#: The in-band codes only one RPC may answer (common.proto says so of each).
ONLY_FROM: dict[int, str] = {
    ErrorCode.COMPUTE_ASSIGNMENT: "ConnectGroupHeartbeat",
    ErrorCode.INVALID_ASSIGNMENT: "ConnectGroupInstallAssignment",
    ErrorCode.MEMBER_ID_REQUIRED: "JoinGroup",
    ErrorCode.UNSUPPORTED_VERSION: "ConnectGroupHeartbeat",
    ErrorCode.INVALID_UPDATE_VERSION: "UpdateFeatures",
    ErrorCode.NOT_RESOURCE_OWNER: "ConnectGroupReportStatus",  # per entry, never the whole
}


@dataclass(frozen=True)
class Rpc:
    """One RPC: its method path, its message types and its generator."""

    name: str
    service: str
    request_type: Any
    response_type: Any
    generate: Callable[[Source, World], Message]

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"


RPCS: dict[str, Rpc] = {
    rpc.name: rpc
    for rpc in (
        Rpc(
            "ConnectGroupHeartbeat",
            COORDINATOR_SERVICE,
            coordinator_pb2.ConnectGroupHeartbeatRequest,
            coordinator_pb2.ConnectGroupHeartbeatResponse,
            heartbeat,
        ),
        Rpc(
            "ConnectGroupPrepareAssignment",
            COORDINATOR_SERVICE,
            coordinator_pb2.ConnectGroupPrepareAssignmentRequest,
            coordinator_pb2.ConnectGroupPrepareAssignmentResponse,
            prepare,
        ),
        Rpc(
            "ConnectGroupInstallAssignment",
            COORDINATOR_SERVICE,
            coordinator_pb2.ConnectGroupInstallAssignmentRequest,
            coordinator_pb2.ConnectGroupInstallAssignmentResponse,
            install,
        ),
        Rpc(
            "ConnectGroupConfigs",
            COORDINATOR_SERVICE,
            coordinator_pb2.ConnectGroupConfigsRequest,
            coordinator_pb2.ConnectGroupConfigsResponse,
            connect_group_configs,
        ),
        Rpc(
            "ConnectGroupReportStatus",
            COORDINATOR_SERVICE,
            coordinator_pb2.ConnectGroupReportStatusRequest,
            coordinator_pb2.ConnectGroupReportStatusResponse,
            connect_group_report_status,
        ),
        Rpc(
            "PutConnector",
            ADMIN_SERVICE,
            admin_pb2.PutConnectorRequest,
            admin_pb2.PutConnectorResponse,
            put_connector,
        ),
        Rpc(
            "DeleteConnector",
            ADMIN_SERVICE,
            admin_pb2.DeleteConnectorRequest,
            admin_pb2.DeleteConnectorResponse,
            delete_connector,
        ),
        Rpc(
            "AlterGroupConfigs",
            ADMIN_SERVICE,
            admin_pb2.AlterGroupConfigsRequest,
            admin_pb2.AlterGroupConfigsResponse,
            alter_group_configs,
        ),
        Rpc(
            "ListGroups",
            ADMIN_SERVICE,
            admin_pb2.ListGroupsRequest,
            admin_pb2.ListGroupsResponse,
            list_groups,
        ),
        Rpc(
            "DescribeGroups",
            ADMIN_SERVICE,
            admin_pb2.DescribeGroupsRequest,
            admin_pb2.DescribeGroupsResponse,
            describe_groups,
        ),
        Rpc(
            "FindCoordinator",
            ADMIN_SERVICE,
            admin_pb2.FindCoordinatorRequest,
            admin_pb2.FindCoordinatorResponse,
            find_coordinator,
        ),
        Rpc(
            "ListAcls",
            ADMIN_SERVICE,
            admin_pb2.ListAclsRequest,
            admin_pb2.ListAclsResponse,
            list_acls,
        ),
        Rpc("AddAcl", ADMIN_SERVICE, admin_pb2.AddAclRequest, admin_pb2.AddAclResponse, add_acl),
        Rpc(
            "RemoveAcl",
            ADMIN_SERVICE,
            admin_pb2.RemoveAclRequest,
            admin_pb2.RemoveAclResponse,
            remove_acl,
        ),
        Rpc(
            "DescribeFeatures",
            ADMIN_SERVICE,
            admin_pb2.DescribeFeaturesRequest,
            admin_pb2.DescribeFeaturesResponse,
            describe_features,
        ),
        Rpc(
            "UpdateFeatures",
            ADMIN_SERVICE,
            admin_pb2.UpdateFeaturesRequest,
            admin_pb2.UpdateFeaturesResponse,
            update_features,
        ),
        Rpc(
            "PauseConnector",
            ADMIN_SERVICE,
            admin_pb2.PauseConnectorRequest,
            admin_pb2.PauseConnectorResponse,
            pause_connector,
        ),
        Rpc(
            "ResumeConnector",
            ADMIN_SERVICE,
            admin_pb2.ResumeConnectorRequest,
            admin_pb2.ResumeConnectorResponse,
            resume_connector,
        ),
        Rpc(
            "StopConnector",
            ADMIN_SERVICE,
            admin_pb2.StopConnectorRequest,
            admin_pb2.StopConnectorResponse,
            stop_connector,
        ),
        Rpc(
            "RestartConnector",
            ADMIN_SERVICE,
            admin_pb2.RestartConnectorRequest,
            admin_pb2.RestartConnectorResponse,
            restart_connector,
        ),
        Rpc(
            "DeleteGroup",
            ADMIN_SERVICE,
            admin_pb2.DeleteGroupRequest,
            admin_pb2.DeleteGroupResponse,
            delete_group,
        ),
        Rpc(
            "RemoveMember",
            ADMIN_SERVICE,
            admin_pb2.RemoveMemberRequest,
            admin_pb2.RemoveMemberResponse,
            remove_member,
        ),
        Rpc(
            "JoinGroup",
            CLASSIC_SERVICE,
            classic_pb2.JoinGroupRequest,
            classic_pb2.JoinGroupResponse,
            join_group,
        ),
        Rpc(
            "SyncGroup",
            CLASSIC_SERVICE,
            classic_pb2.SyncGroupRequest,
            classic_pb2.SyncGroupResponse,
            sync_group,
        ),
        Rpc(
            "Heartbeat",
            CLASSIC_SERVICE,
            classic_pb2.HeartbeatRequest,
            classic_pb2.HeartbeatResponse,
            classic_heartbeat,
        ),
        Rpc(
            "LeaveGroup",
            CLASSIC_SERVICE,
            classic_pb2.LeaveGroupRequest,
            classic_pb2.LeaveGroupResponse,
            leave_group,
        ),
    )
}


def well_formed(src: Source, world: World, rpc: str) -> Message:
    return RPCS[rpc].generate(src, world)


# --- raw bodies -----------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _mutate(src: Source, body: bytes) -> bytes:
    data = bytearray(body)
    for _ in range(src.integer(1, 4)):
        op = src.integer(0, 4)
        pos = src.integer(0, len(data)) if data else 0
        if op == 0 and pos < len(data):  # flip a byte
            data[pos] = src.integer(0, 255)
        elif op == 1:  # cut a range out
            del data[pos : pos + src.integer(1, 16)]
        elif op == 2:  # insert bytes
            data[pos:pos] = src.blob(8)
        elif op == 3:  # duplicate a slice
            data[pos:pos] = data[pos : pos + src.integer(1, 32)]
        else:  # a length or tag byte made large
            data[pos:pos] = src.pick((b"\xff", b"\x80", b"\x7f", b"\x0a\xff\xff\xff\xff\x0f"))
    return bytes(data)


def raw_body(src: Source, world: World, rpc: str, limit: int) -> bytes:
    """Bytes to send as the body of `rpc`: undecodable, barely decodable, or (rarely) larger than
    the server's limit of `limit` bytes."""
    # Oversized bodies are rare: gRPC takes over 100 ms to refuse each one.
    kind = weighted(
        src,
        [
            (80, "mutated"),
            (60, "random"),
            (20, "merged"),
            (20, "unknown field"),
            (20, "bad utf-8"),
            (20, "truncated"),
            (1 if limit <= 4 * 1024 * 1024 else 0, "oversized"),
            (20, "varint"),
            (20, "nested"),
        ],
    )

    def valid() -> bytes:
        return well_formed(src, world, rpc).SerializeToString()

    if kind == "random":
        return src.blob(weighted(src, [(3, 16), (2, 256), (1, 4_096)]))
    if kind == "mutated":
        return _mutate(src, valid())
    if kind == "merged":  # a valid concatenation: the fields of both, repeated ones appended
        return valid() + valid()
    if kind == "unknown field":
        number = src.pick((15, 16, 99, 2**29 - 1, 19_000, 0))
        wire = src.integer(0, 7)
        payload = {0: _varint(src.integer(0, 2**64 - 1)), 1: b"\x01" * 8, 5: b"\x01" * 4}.get(
            wire, _varint(3) + b"abc"
        )
        return valid() + _varint(number << 3 | wire) + payload
    if kind == "bad utf-8":  # field 1 (a string in most requests) with invalid UTF-8
        bad = src.pick((b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\x80", b"a\x80", b"\xf4\x90\x80\x80"))
        field_number = src.pick((1, 2))
        return _varint(field_number << 3 | 2) + _varint(len(bad)) + bad + valid()
    if kind == "truncated":
        body = valid()
        return body[: src.integer(0, max(len(body) - 1, 0))]
    if kind == "varint":  # overlong varints and lengths past the end
        return src.pick((b"\x08" + b"\xff" * 10 + b"\x01", b"\x0a" + b"\xff" * 9, b"\x0a\x7f"))
    if kind == "nested":  # deeply nested start-group tags, or sub-messages
        depth = src.pick((64, 101, 10_000))
        if src.integer(0, 1):
            return b"\x0b" * depth
        return b"\x3a\x00" * depth
    # oversized: one string field just over the limit
    size = limit + src.integer(1, 1024)
    return b"\x0a" + _varint(size) + b"a" * size


# --- judging answers ------------------------------------------------------------------------------

#: What may never appear in an error message (issue 12: answers never carry SQL or tracebacks).
LEAKS = re.compile(r"Traceback|sqlalchemy|psycopg|SELECT |INSERT |UPDATE |\[SQL:", re.IGNORECASE)


@dataclass
class Verdict:
    """How one answer is counted (`label`, e.g. "OK/INVALID_REQUEST", "INVALID_ARGUMENT"), and
    what was wrong with it (`problems`: empty for an allowed answer). `fatal`: an INTERNAL or
    UNKNOWN status, or an in-band UNKNOWN_SERVER_ERROR."""

    label: str
    problems: list[str] = field(default_factory=list)
    fatal: bool = False
    response: Message | None = None


#: Every in-band code of the contract (the generated enum: codes added later included).
KNOWN_CODES = frozenset(common_pb2.ErrorCode.values())


def _code_name(code: int) -> str:
    if code in KNOWN_CODES:
        return common_pb2.ErrorCode.Name(code)
    return f"code {code}"


def judge(
    rpc: str, body: bytes, status: grpc.StatusCode, details: str, answer: bytes | None, limit: int
) -> Verdict:
    """Whether an answer to `body` is one the contract allows (see the module's doc)."""
    spec = RPCS[rpc]
    try:
        spec.request_type.FromString(body)
        decodes = True
    except DecodeError:
        decodes = False
    if status is grpc.StatusCode.OK:
        assert answer is not None
        response = spec.response_type.FromString(answer)
        entries = list(response.groups) if rpc == "DescribeGroups" else [response]
        codes = sorted({_code_name(e.error_code) for e in entries})
        verdict = Verdict("OK/" + (",".join(codes) if codes else "-"), response=response)
        if not decodes:
            verdict.problems.append("answered OK to a body that does not decode")
        if rpc == "DescribeGroups":
            asked = list(spec.request_type.FromString(body).group_ids) if decodes else []
            if [e.group_id for e in entries] != asked:
                verdict.problems.append("DescribeGroups did not answer one entry per group id")
        for e in entries:
            if e.error_code == ErrorCode.UNKNOWN_SERVER_ERROR:
                verdict.fatal = True
                verdict.problems.append(f"UNKNOWN_SERVER_ERROR: {e.error_message}")
            elif e.error_code not in KNOWN_CODES:
                verdict.problems.append(f"error code {e.error_code} is not in the contract")
            elif ONLY_FROM.get(e.error_code, rpc) != rpc:
                verdict.problems.append(
                    f"{_code_name(e.error_code)} is not an answer of {rpc}: {e.error_message}"
                )
            if LEAKS.search(e.error_message):
                verdict.problems.append(f"error message leaks internals: {e.error_message}")
        return verdict
    verdict = Verdict(status.name)
    if status in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        verdict.fatal = True
        verdict.problems.append(f"gRPC status {status.name}: {details}")
    elif status is grpc.StatusCode.INVALID_ARGUMENT:
        if decodes:
            verdict.problems.append(f"INVALID_ARGUMENT for a body that decodes: {details}")
        elif not details.startswith("the request body is not a valid connect.group.v1."):
            verdict.problems.append(f"INVALID_ARGUMENT without the usual message: {details}")
    elif status is grpc.StatusCode.DEADLINE_EXCEEDED and rpc in PARKABLE and decodes:
        verdict.label = "DEADLINE_EXCEEDED/parked"  # held for its phase past the short deadline
    elif status is grpc.StatusCode.RESOURCE_EXHAUSTED:
        # The request was over the limit, or the answer (the contract: "message too large").
        if "Sent message larger than max" in details:
            verdict.label = "RESOURCE_EXHAUSTED/answer"
        elif len(body) > limit:
            verdict.label = "RESOURCE_EXHAUSTED/request"
        else:
            verdict.problems.append(
                f"RESOURCE_EXHAUSTED for a body of {len(body)} bytes (limit {limit}): {details}"
            )
    else:
        verdict.problems.append(f"unexpected gRPC status {status.name}: {details}")
    return verdict


class RawClient:
    """Sends bodies as they are (identity serializers) on one channel that itself refuses
    nothing (send and receive limits far above the server's)."""

    def __init__(self, address: str, timeout_s: float = 30.0) -> None:
        big = 512 * 1024 * 1024
        self.channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_send_message_length", big),
                ("grpc.max_receive_message_length", big),
            ],
        )
        self.timeout_s = timeout_s
        self._calls = {rpc.name: self.channel.unary_unary(rpc.path) for rpc in RPCS.values()}

    def _timeout(self, rpc: str) -> float:
        return min(self.timeout_s, PARKED_DEADLINE_S) if rpc in PARKABLE else self.timeout_s

    def send(self, rpc: str, body: bytes) -> tuple[grpc.StatusCode, str, bytes | None]:
        try:
            answer = self._calls[rpc](body, timeout=self._timeout(rpc))
        except grpc.RpcError as error:
            return error.code(), error.details() or "", None
        return grpc.StatusCode.OK, "", answer

    def send_many(
        self, calls: Sequence[tuple[str, bytes]]
    ) -> list[tuple[grpc.StatusCode, str, bytes | None]]:
        """Several calls in flight at once; answers in the order of `calls`."""
        futures = [self._calls[rpc].future(body, timeout=self._timeout(rpc)) for rpc, body in calls]
        out: list[tuple[grpc.StatusCode, str, bytes | None]] = []
        for f in futures:
            try:
                out.append((grpc.StatusCode.OK, "", f.result()))
            except grpc.RpcError as error:
                out.append((error.code(), error.details() or "", None))
        return out

    def close(self) -> None:
        self.channel.close()


def show(message: Message | bytes, limit: int = 1_500) -> str:
    """A request for a failure report, cut to `limit` characters."""
    text_ = repr(message) if isinstance(message, bytes) else f"{type(message).__name__}({message})"
    return text_ if len(text_) <= limit else f"{text_[:limit]}... ({len(text_)} characters)"


# --- the server's log -----------------------------------------------------------------------------

TRACEBACK = "Traceback (most recent call last)"


class LogWatch:
    """Reads what a log file gained since the last look."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def new_text(self) -> str:
        if not self.path.exists():
            return ""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        return data.decode("utf-8", errors="replace")


def log_findings(text_: str) -> tuple[int, list[str]]:
    """(tracebacks, error lines) of a log: how many of its lines hold a traceback (a JSON line is
    one log record, chained exceptions included; a plain-text traceback has one such line), and
    its lines logged at ERROR or above or holding a traceback (cut to 400 characters each)."""
    lines = text_.splitlines()
    errors = [
        line[:400]
        for line in lines
        if '"level":"error"' in line or '"level":"critical"' in line or TRACEBACK in line
    ]
    return sum(TRACEBACK in line for line in lines), errors


# --- the database afterwards ----------------------------------------------------------------------

_HELD = """
    SELECT m.group_id, m.member_id, 'connector' AS kind, c #>> '{}' AS name, -1 AS task
      FROM members m, jsonb_array_elements(m.assigned -> 'connectors') c
    UNION ALL
    SELECT m.group_id, m.member_id, 'connector', c #>> '{}', -1
      FROM members m, jsonb_array_elements(m.pending_revocation -> 'connectors') c
    UNION ALL
    SELECT m.group_id, m.member_id, 'task', t ->> 'connector', (t ->> 'task')::int
      FROM members m, jsonb_array_elements(m.assigned -> 'tasks') t
    UNION ALL
    SELECT m.group_id, m.member_id, 'task', t ->> 'connector', (t ->> 'task')::int
      FROM members m, jsonb_array_elements(m.pending_revocation -> 'tasks') t
"""
_HOLDS = """
    SELECT g.group_id, 'hold:' || (h ->> 'member_id') AS member_id, 'connector' AS kind,
           c #>> '{}' AS name, -1 AS task
      FROM groups g, jsonb_array_elements(g.holds) h,
           jsonb_array_elements(h -> 'resources' -> 'connectors') c
    UNION ALL
    SELECT g.group_id, 'hold:' || (h ->> 'member_id'), 'task', t ->> 'connector',
           (t ->> 'task')::int
      FROM groups g, jsonb_array_elements(g.holds) h,
           jsonb_array_elements(h -> 'resources' -> 'tasks') t
"""
_TARGET = """
    SELECT a.group_id, a.member_id, 'connector' AS kind, c #>> '{}' AS name, -1 AS task
      FROM target_assignment_members a, jsonb_array_elements(a.resources -> 'connectors') c
    UNION ALL
    SELECT a.group_id, a.member_id, 'task', t ->> 'connector', (t ->> 'task')::int
      FROM target_assignment_members a, jsonb_array_elements(a.resources -> 'tasks') t
"""

#: name -> SQL that returns one row per violation (empty when the invariant holds).
INVARIANTS: dict[str, str] = {
    "no resource held by two members (assigned or pending revocation)": f"""
        SELECT group_id, kind, name, task, array_agg(DISTINCT member_id ORDER BY member_id)
          FROM ({_HELD}) held
         GROUP BY group_id, kind, name, task HAVING count(DISTINCT member_id) > 1""",
    "no resource held by a member and another member's hold": f"""
        SELECT h.group_id, h.kind, h.name, h.task, m.member_id, h.member_id
          FROM ({_HOLDS}) h JOIN ({_HELD}) m USING (group_id, kind, name, task)
         WHERE h.member_id <> 'hold:' || m.member_id""",
    "no resource given to two members by the target": f"""
        SELECT group_id, kind, name, task, array_agg(member_id ORDER BY member_id)
          FROM ({_TARGET}) target
         GROUP BY group_id, kind, name, task HAVING count(*) > 1""",
    "member epochs <= their group's epoch": """
        SELECT m.group_id, m.member_id, m.member_epoch, g.group_epoch
          FROM members m JOIN groups g USING (group_id)
         WHERE m.member_epoch > g.group_epoch""",
    "assignment epoch <= group epoch": """
        SELECT t.group_id, t.assignment_epoch, g.group_epoch
          FROM target_assignments t JOIN groups g USING (group_id)
         WHERE t.assignment_epoch > g.group_epoch""",
    "no members without their group": """
        SELECT group_id, member_id FROM members
         WHERE group_id NOT IN (SELECT group_id FROM groups)""",
    "no connectors without their group": """
        SELECT group_id, name FROM connectors
         WHERE group_id NOT IN (SELECT group_id FROM groups)""",
    "no group configs without their group": """
        SELECT group_id, name FROM group_configs
         WHERE group_id NOT IN (SELECT group_id FROM groups)""",
    "no target assignments without their group": """
        SELECT group_id FROM target_assignments
         WHERE group_id NOT IN (SELECT group_id FROM groups)""",
    "no target shares without their target": """
        SELECT group_id, member_id FROM target_assignment_members
         WHERE group_id NOT IN (SELECT group_id FROM target_assignments)""",
    "no leases of groups that do not exist": """
        SELECT group_id, owner_id FROM group_leases
         WHERE group_id NOT IN (SELECT group_id FROM groups)
           AND group_id NOT IN (SELECT unnest(CAST(:allowed AS text[])))""",
}


@dataclass
class InvariantReport:
    violations: dict[str, list[str]]
    counts: dict[str, int]

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def describe(self) -> str:
        lines = []
        for name, rows in self.violations.items():
            mark = "OK" if not rows else f"VIOLATED ({len(rows)})"
            lines.append(f"{name}: {mark}")
            lines.extend(f"    {row}" for row in rows[:5])
        return "\n".join(lines)


def check_invariants(database_url: str, allowed_leases: Sequence[str] = ()) -> InvariantReport:
    """Every invariant of `INVARIANTS` with plain SQL, in one snapshot (REPEATABLE READ), and
    how many rows each state table has."""
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                violations = {
                    name: [
                        str(tuple(row)[:6])[:300]
                        for row in conn.execute(sa.text(sql), {"allowed": list(allowed_leases)})
                    ]
                    for name, sql in INVARIANTS.items()
                }
                counts = {
                    table: int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())
                    for table in (
                        "groups",
                        "members",
                        "connectors",
                        "target_assignment_members",
                        "group_configs",
                        "group_leases",
                        "events",
                    )
                }
    finally:
        engine.dispose()
    return InvariantReport(violations, counts)


# --- the healthy group ----------------------------------------------------------------------------


class HealthyGroup:
    """A group of `members` scripted workers that heartbeat every `interval_s` on a thread of
    their own (own channel), play the assignor when asked (round robin), and report whatever
    is not a clean answer: an in-band error, or a call that failed (unavailable)."""

    def __init__(
        self,
        address: str,
        group_id: str = "healthy",
        members: int = 3,
        interval_s: float = 0.2,
        session_timeout_ms: int = 30_000,
    ) -> None:
        self.group_id = group_id
        self.interval_s = interval_s
        self.stubs = Stubs(address)
        self.workers = [ScriptedWorker(self.stubs, group_id, f"ok-{i}") for i in range(members)]
        self.errors: list[str] = []
        self.unavailable: list[str] = []
        self.latencies_s: list[float] = []
        self.installs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="healthy-group", daemon=True)
        # The group is configured before anyone joins; its session outlasts a busy server.
        answer = self.stubs.admin.AlterGroupConfigs(
            admin_pb2.AlterGroupConfigsRequest(
                group_id=group_id, set={"session.timeout.ms": str(session_timeout_ms)}
            ),
            timeout=30,
        )
        assert answer.error_code == ErrorCode.NONE, answer
        for name, tasks in (("orders", 3), ("payments", 2)):
            answer = self.stubs.admin.PutConnector(
                admin_pb2.PutConnectorRequest(group_id=group_id, connector=name, task_count=tasks),
                timeout=30,
            )
            assert answer.error_code == ErrorCode.NONE, answer

    def start(self, settle_s: float = 30.0) -> HealthyGroup:
        """Join every member, start heartbeating, and wait until the group is stable."""
        for w in self.workers:
            self._handle(w, self._call(w, w.join))
        self._thread.start()
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            if self.stable():
                return self
            time.sleep(0.1)
        raise RuntimeError(f"the healthy group did not settle in {settle_s} s: {self.errors}")

    def stable(self) -> bool:
        group = self.stubs.admin.DescribeGroups(
            admin_pb2.DescribeGroupsRequest(group_ids=[self.group_id]), timeout=30
        ).groups[0]
        held = sum(
            len(m.current_assignment.connectors) + len(m.current_assignment.tasks)
            for m in group.members
        )
        return group.state == "STABLE" and held == 2 + 3 + 2

    def _call(self, worker: Any, call: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return call()
        except grpc.RpcError as error:
            self.unavailable.append(f"{worker.member_id}: {error.code().name} {error.details()}")
            return None
        finally:
            self.latencies_s.append(time.perf_counter() - started)

    def _handle(self, worker: Any, answer: Any) -> None:
        if answer is None:
            return
        if answer.error_code == ErrorCode.COMPUTE_ASSIGNMENT:
            self._assign(worker)
        elif answer.error_code != ErrorCode.NONE:
            self.errors.append(
                f"{worker.member_id} heartbeat: {_code_name(answer.error_code)} "
                f"{answer.error_message}"
            )

    def _assign(self, worker: Any) -> None:
        prepared = worker.prepare()
        if prepared.error_code != ErrorCode.NONE:
            self.errors.append(
                f"{worker.member_id} prepare: {_code_name(prepared.error_code)} "
                f"{prepared.error_message}"
            )
            return
        members = sorted(m.member_id for m in prepared.members)
        targets: dict[str, tuple[set[str], set[tuple[str, int]]]] = {
            m: (set(), set()) for m in members
        }
        resources: list[str | tuple[str, int]] = []
        for c in sorted(prepared.catalogue, key=lambda c: c.name):
            resources.append(c.name)
            resources.extend((c.name, t) for t in range(c.task_count))
        for i, r in enumerate(resources):
            connectors, tasks = targets[members[i % len(members)]]
            if isinstance(r, str):
                connectors.add(r)
            else:
                tasks.add(r)
        answer = worker.install(
            prepared.group_epoch,
            {m: (frozenset(c), frozenset(t)) for m, (c, t) in targets.items()},
        )
        if answer.error_code != ErrorCode.NONE:
            self.errors.append(
                f"{worker.member_id} install: {_code_name(answer.error_code)} "
                f"{answer.error_message}"
            )
        else:
            self.installs += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for w in self.workers:
                self._handle(w, self._call(w, w.heartbeat))

    def stop(self) -> None:
        """Stop heartbeating (the members stay in the group); may be called again."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        self.stubs.close()

    def latency_ms(self, quantile: float) -> float:
        if len(self.latencies_s) < 2:
            return float("nan")
        cuts = statistics.quantiles(self.latencies_s, n=1000, method="inclusive")
        return 1000 * cuts[min(int(quantile * 1000) - 1, len(cuts) - 1)]
