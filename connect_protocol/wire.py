"""The wire: protobuf <-> protocol values for what both sides send and read (resource sets,
assignors, heartbeats in both directions, error codes). The coordinator's `grpc_api.convert` and
the agent's `wire` build on it for the messages only one side reads."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from functools import partial
from itertools import islice
from operator import attrgetter, lt
from typing import Any, cast

from connect.group.v1 import common_pb2, coordinator_pb2

from .errors import ErrorCode
from .messages import AssignmentMessage, Assignor, HeartbeatRequest, HeartbeatResponse
from .resources import BY_CONNECTOR_FROM, ResourceSet, TaskId
from .tokens import ConnectorTokens, FencingTokens, Resource
from .wire_by_connector import SeenConnectorTasks
from .wire_entries import (
    connector_entries,
    length_delimited,
    one_token_entries,
    split_resources,
    task_entries,
    token_entries,
)


def wire_code(code: int) -> common_pb2.ErrorCode:
    """An error code as the wire's enum field takes it."""
    return cast(common_pb2.ErrorCode, int(code))


_connector_and_task = attrgetter("connector", "task")
_task_id = partial(tuple.__new__, TaskId)
"""`TaskId` from a (connector, task) pair without NamedTuple's Python-level `__new__`."""


class _WireSets:
    """Resource sets (of `WIRE_ECHO_MIN_TASKS` tasks or more) lately decoded or encoded, by
    their encoded bytes and (encoded ones, and large decoded ones) by identity, so that neither
    is done twice: a member reports the same owned list on
    heartbeat after heartbeat while it reconciles, and that list is the assignment it was sent;
    a heartbeat that is not steady is decoded twice (the steady attempt, then the full path);
    an assignor installs unchanged shares as Prepare sent them; the catalogue is sent on every
    Prepare. Encoding a 10,000-task list again (or parsing its bytes) costs a twentieth of
    decoding (or building) it. Always exact: a hit is a message with the same bytes, or the
    same (immutable) set. Bounded by the tasks it holds, the oldest entry dropped first."""

    def __init__(self, max_tasks: int) -> None:
        self.max_tasks = max_tasks
        self._by_bytes: dict[bytes, ResourceSet] = {}
        self._by_set: dict[int, tuple[ResourceSet, bytes]] = {}
        self._tasks = 0
        self._lock = threading.Lock()
        self.decoded = 0
        self.encoded = 0

    def decode(self, msg: common_pb2.ConnectorsAndTasks, large: bool = True) -> ResourceSet:
        """The set `msg` names, looked up by its bytes first. A set that is not `large` is
        decoded by protobuf on a miss and kept for decoding only: its bytes are in the
        sender's order, and an answer that sends it is built in sorted order as before."""
        key = msg.SerializeToString(deterministic=True)
        found = self._by_bytes.get(key)
        if found is not None:
            return found
        decoded = _read_large(msg, key) if large else _decode(msg)
        with self._lock:
            self.decoded += 1
            self._keep(key, decoded, encodes=large)
        return decoded

    def serialized(self, resources: ResourceSet) -> bytes:
        """`resources` as a serialized ConnectorsAndTasks (`_serialized`), kept."""
        found = self._by_set.get(id(resources))
        if found is not None and found[0] is resources:
            return found[1]
        key = _serialized(resources)
        with self._lock:
            self.encoded += 1
            self._keep(key, resources)
        return key

    def _keep(self, key: bytes, resources: ResourceSet, encodes: bool = True) -> None:
        """Under the lock. `encodes`: `key` is also what `serialized` answers for the set."""
        kept = self._by_bytes.setdefault(key, resources)
        if encodes:
            self._by_set[id(kept)] = (kept, key)
        if kept is resources:
            self._tasks += resources.task_count()
        while self._tasks > self.max_tasks and self._by_bytes:
            oldest = next(iter(self._by_bytes))
            dropped = self._by_bytes.pop(oldest)
            self._tasks -= dropped.task_count()
            entry = self._by_set.get(id(dropped))
            if entry is not None and entry[0] is dropped:
                del self._by_set[id(dropped)]


WIRE_CACHE_MIN_TASKS = 256
"""Sets with fewer tasks are not read connector by connector, and a set decoded with fewer is
not sent back in its sender's bytes."""

WIRE_ECHO_MIN_TASKS = 32
"""Sets with fewer tasks are decoded and encoded every time (cheaper than looking them up). From
this size on, a set is looked up by its bytes before it is decoded: a member reports as its
owned list the assignment it was sent, and an assignor installs the shares that do not change as
Prepare sent them; while a group of 1,000 members forms over 100,000 tasks, every owned list
and every Install share is about 100 tasks, a protobuf decode of 60 us against 5 us for the
serialization and the lookup (issue 24)."""

_wire_sets = _WireSets(max_tasks=400_000)


def resources_from(msg: common_pb2.ConnectorsAndTasks) -> ResourceSet:
    """The set a ConnectorsAndTasks message names. An owned list of 10,000 tasks arrives on
    every heartbeat that reports it (issue 24): its tasks are decoded with C callables only (no
    Python frame per task), and a large list decoded or encoded lately is not decoded again."""
    count = len(msg.tasks)
    if count < WIRE_ECHO_MIN_TASKS:
        return _decode(msg)
    return _wire_sets.decode(msg, large=count >= WIRE_CACHE_MIN_TASKS)


def _decode(msg: common_pb2.ConnectorsAndTasks) -> ResourceSet:
    return ResourceSet(
        frozenset(msg.connectors),
        frozenset(map(_task_id, map(_connector_and_task, msg.tasks))),
    )


def _read_large(msg: common_pb2.ConnectorsAndTasks, data: bytes) -> ResourceSet:
    """A large set from its message and bytes: by connector (seen connectors not read again),
    else from its entries, else by protobuf."""
    found = _seen_connector_tasks.read(data)
    if found is not None:
        return found
    split = split_resources(data)
    return _decode_large(msg) if split is None else _listed(*split)


def _decode_large(msg: common_pb2.ConnectorsAndTasks) -> ResourceSet:
    """`_decode`, keeping the list's order when it is sorted (`_listed`)."""
    return _listed(msg.connectors, list(map(_task_id, map(_connector_and_task, msg.tasks))))


def _listed(connectors: Iterable[str], listed: list[TaskId]) -> ResourceSet:
    """The set of `listed`, kept by connector when it is sorted without a task twice (as every
    encoder here sends it): checking costs one comparison per task, a sort later about
    fourteen."""
    if all(map(lt, listed, islice(listed, 1, None))):
        return ResourceSet.by_connector_of(frozenset(connectors), listed)
    return ResourceSet(frozenset(connectors), frozenset(listed))


_seen_connector_tasks = SeenConnectorTasks(max_tasks=400_000)


def resources_to(
    resources: ResourceSet, msg: common_pb2.ConnectorsAndTasks | None = None
) -> common_pb2.ConnectorsAndTasks:
    """`resources` appended to `msg` (or a new message), each kind sorted; a large set encoded
    or decoded lately is copied from its bytes."""
    out = msg if msg is not None else common_pb2.ConnectorsAndTasks()
    out.MergeFromString(resources_bytes(resources))  # appended after what `out` holds
    return out


def resources_bytes(resources: ResourceSet) -> bytes:
    """`resources` as a serialized ConnectorsAndTasks, each kind sorted (the bytes protobuf's
    deterministic serialization writes for it); a set of `WIRE_ECHO_MIN_TASKS` or more encoded
    lately is not built again, nor a large one decoded lately (which comes back as its
    sender's bytes, in its order)."""
    if resources.task_count() < WIRE_ECHO_MIN_TASKS:
        return _serialized(resources)
    return _wire_sets.serialized(resources)


def _serialized(resources: ResourceSet) -> bytes:
    data = connector_entries(resources.sorted_connectors())
    if resources.task_count():
        data += _task_bytes(resources)
    return data


def _task_bytes(resources: ResourceSet) -> bytes:
    """The entries of `resources`' tasks in order. A set kept by connector joins its
    connectors' entries, each built once per `ConnectorTasks` and kept with it: a share changed
    in a few connectors is encoded in O(connectors + the changed connectors' tasks)."""
    shards = resources.kept_by_connector()
    if shards is None or resources.task_count() < BY_CONNECTOR_FROM:
        return task_entries(resources.ordered_tasks())
    return b"".join([_seen_connector_tasks.entries(shards[c]) for c in sorted(shards)])


def assignor_from(msg: common_pb2.Assignor) -> Assignor:
    return Assignor(
        name=msg.name,
        minimum_version=msg.minimum_version,
        maximum_version=msg.maximum_version,
        reason=msg.reason,
        version=msg.version,
        metadata=bytes(msg.metadata),
    )


def assignor_to(a: Assignor) -> common_pb2.Assignor:
    return common_pb2.Assignor(
        name=a.name,
        minimum_version=a.minimum_version,
        maximum_version=a.maximum_version,
        reason=a.reason,
        version=a.version,
        metadata=a.metadata,
    )


def heartbeat_request_from_wire(
    msg: coordinator_pb2.ConnectGroupHeartbeatRequest,
) -> HeartbeatRequest:
    return HeartbeatRequest(
        group_id=msg.group_id,
        member_id=msg.member_id,
        member_epoch=msg.member_epoch,
        instance_id=msg.instance_id if msg.HasField("instance_id") else None,
        rebalance_timeout_ms=(
            msg.rebalance_timeout_ms if msg.HasField("rebalance_timeout_ms") else None
        ),
        server_assignor=msg.server_assignor if msg.HasField("server_assignor") else None,
        client_assignors=(
            tuple(assignor_from(a) for a in msg.client_assignors.assignors)
            if msg.HasField("client_assignors")
            else None
        ),
        owned=(
            resources_from(msg.connectors_and_tasks)
            if msg.HasField("connectors_and_tasks")
            else None
        ),
        url=msg.url if msg.HasField("url") else None,
    )


def heartbeat_response_to_wire(
    resp: HeartbeatResponse,
) -> coordinator_pb2.ConnectGroupHeartbeatResponse:
    """The answer as a message (`heartbeat_response_bytes` parsed)."""
    return coordinator_pb2.ConnectGroupHeartbeatResponse.FromString(heartbeat_response_bytes(resp))


_ASSIGNMENT_FIELD = coordinator_pb2.ConnectGroupHeartbeatResponse.ASSIGNMENT_FIELD_NUMBER
_RESOURCES_FIELD = coordinator_pb2.Assignment.CONNECTORS_AND_TASKS_FIELD_NUMBER
_TOKENS_FIELD = coordinator_pb2.Assignment.FENCING_TOKENS_FIELD_NUMBER


def heartbeat_response_bytes(resp: HeartbeatResponse) -> bytes:
    """The answer's wire bytes, its assignment's sets joined from their kept entries without a
    protobuf object per task (issue 24: a 10,000-task assignment was built into the message,
    then serialized again to be sent). The fields are those protobuf writes, not all in field
    order (a parser takes them in any order): the assignment's connector tokens, its sets,
    then its task tokens, in the order a repeated field keeps."""
    head = coordinator_pb2.ConnectGroupHeartbeatResponse(
        error_code=wire_code(resp.error_code),
        error_message=resp.error_message,
        member_epoch=resp.member_epoch,
        heartbeat_interval_ms=resp.heartbeat_interval_ms,
        session_timeout_ms=resp.session_timeout_ms,
        lifecycle_revision=resp.lifecycle_revision,
    ).SerializeToString()
    a = resp.assignment
    if a is None:
        return head
    part = coordinator_pb2.Assignment(error=a.error, version=a.version, metadata=a.metadata)
    _connector_tokens_to(a.tokens, part.fencing_tokens)
    assignment = b"".join(
        (
            part.SerializeToString(),
            length_delimited(_RESOURCES_FIELD, resources_bytes(a.resources)),
            task_token_bytes(a.tokens, _TOKENS_FIELD),
        )
    )
    return head + length_delimited(_ASSIGNMENT_FIELD, assignment)


def tokens_to(tokens: FencingTokens, parent: Any, field: str = "fencing_tokens") -> None:
    """Append `tokens` to `parent`'s repeated FencingToken field `field`: the connectors'
    tokens, then the tasks' (their entries' bytes kept, see `wire_entries`)."""
    _connector_tokens_to(tokens, getattr(parent, field))
    if tokens.by_connector():
        number = parent.DESCRIPTOR.fields_by_name[field].number
        parent.MergeFromString(task_token_bytes(tokens, number))


def _connector_tokens_to(tokens: FencingTokens, repeated: Any) -> None:
    """Append the connectors' tokens of `tokens` to a repeated FencingToken field."""
    add = repeated.add
    for connector, token in tokens.connectors():
        add(connector=connector, token=token)


def task_token_bytes(tokens: FencingTokens, number: int) -> bytes:
    """The tasks' FencingToken entries of `tokens` for the repeated field `number`, in
    (connector, task) order."""
    shards = tokens.by_connector()
    return b"".join([_token_bytes(shards[c], number) for c in sorted(shards)])


def _token_bytes(held: ConnectorTokens, number: int) -> bytes:
    """One connector's token entries for the repeated field `number`, built once per
    `ConnectorTokens` and field and kept with it (a share's unchanged connectors are not
    encoded again)."""
    kept = held.wire
    if kept is None:
        kept = held.wire = {}
    entries = kept.get(number)
    if entries is None:
        if held.token is not None:  # one grant's token: no (task, token) pair built
            entries = one_token_entries(number, held.tasks.ordered(), held.token)
        else:
            entries = token_entries(number, held.ordered())
        kept[number] = entries
    return entries


def tokens_from(entries: Iterable[common_pb2.FencingToken]) -> FencingTokens:
    """A repeated FencingToken field as a value (a later entry for a resource wins)."""
    out: dict[Resource, int] = {}
    for e in entries:
        out[TaskId(e.connector, e.task) if e.HasField("task") else e.connector] = e.token
    return FencingTokens(out)


def heartbeat_request_to_wire(
    req: HeartbeatRequest,
) -> coordinator_pb2.ConnectGroupHeartbeatRequest:
    out = coordinator_pb2.ConnectGroupHeartbeatRequest(
        group_id=req.group_id, member_id=req.member_id, member_epoch=req.member_epoch
    )
    if req.instance_id is not None:
        out.instance_id = req.instance_id
    if req.rebalance_timeout_ms is not None:
        out.rebalance_timeout_ms = req.rebalance_timeout_ms
    if req.server_assignor is not None:
        out.server_assignor = req.server_assignor
    if req.client_assignors is not None:
        out.client_assignors.SetInParent()
        out.client_assignors.assignors.extend(assignor_to(a) for a in req.client_assignors)
    if req.owned is not None:
        out.connectors_and_tasks.SetInParent()
        resources_to(req.owned, out.connectors_and_tasks)
    if req.url is not None:
        out.url = req.url
    return out


def error_code(value: int) -> ErrorCode:
    """A wire error code as the enum; codes this client does not know are UNKNOWN_SERVER_ERROR."""
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


def heartbeat_response_from_wire(
    msg: coordinator_pb2.ConnectGroupHeartbeatResponse,
) -> HeartbeatResponse:
    assignment = None
    if msg.HasField("assignment"):
        a = msg.assignment
        assignment = AssignmentMessage(
            resources_from(a.connectors_and_tasks),
            a.version,
            bytes(a.metadata),
            a.error,
            tokens_from(a.fencing_tokens),
        )
    return HeartbeatResponse(
        error_code=error_code(msg.error_code),
        error_message=msg.error_message,
        member_epoch=msg.member_epoch,
        heartbeat_interval_ms=msg.heartbeat_interval_ms,
        session_timeout_ms=msg.session_timeout_ms,
        assignment=assignment,
        lifecycle_revision=msg.lifecycle_revision,
    )
