"""The asyncio face of the servicers (grpc.aio): a steady heartbeat is answered on the event loop
itself; every other call, any heartbeat that would wait for its group's lock or change
something, and any heartbeat that reports more than STEADY_ON_LOOP_MAX_OWNED resources, runs the
synchronous servicer (`servicers.py`) on a thread of a pool.

The loop serves every group of the process, so nothing on it may cost more than a steady
heartbeat's small, bounded work: a heartbeat that reports a big owned list (100,000 tasks:
~180 ms of Python to read into a resource set) goes straight to the pool, never tried on the
loop first. What stays on the loop for a big message is protobuf's own C (de)serialisation
(~5 ms for 100,000 tasks).

Classic groups (DESIGN 3.19 "Long polls hold no thread"): a JoinGroup or SyncGroup whose handler
answers `Parked` waits on the loop as a future of the parking lot (`runtime.parking`), holding
no thread, until a committed batch wakes it, its park limit passes (REBALANCE_IN_PROGRESS), its
caller gives up (it only unregisters: the member stays joined), or the group is let go
(NOT_COORDINATOR). Its waiter is registered before the handler is handed to the pool, so a
wakeup committed before the handler's answer reaches the loop is not lost. A steady classic
heartbeat is answered on the loop as the connect one is; LeaveGroup runs on the pool.

Why: the measured gRPC plumbing of the thread-pool server (`bench/run-server-model`) costs more
per call than the aio server's, and the steady heartbeat is by far the most frequent call. Why not
everything on the loop: a group's lock and the database are blocking; a thread may wait for them,
the loop must not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError
from prometheus_client import Histogram

from connect_protocol.logs import fields

from ..core.results import WAKE_JOIN, WAKE_SYNC, Parked
from ..metrics import Metrics
from ..runtime.parking import ParkingLot
from .classic_servicer import ClassicServicer
from .context import CallIdentity, PoolContext, Unauthenticated
from .servicers import AdminServicer, CoordinatorServicer

log = logging.getLogger("coordinator.grpc")

#: At most one log line per RPC in this many seconds about undecodable bodies (each is counted).
UNDECODABLE_LOG_EVERY_S = 60.0

#: A heartbeat whose owned list names more resources than this is not tried on the event loop:
#: it is seldom steady (an agent sends its owned list when it changed), and reading it is
#: O(list) Python (~2 ms per 1,000) that would hold up every other group's heartbeats.
STEADY_ON_LOOP_MAX_OWNED = 1_000

SyncMethod = Callable[[Any, Any], Any]


async def run_in_pool(
    pool: Executor,
    method: SyncMethod,
    request: Any,
    context: grpc.aio.ServicerContext,
    principal: str,
) -> Any:
    """Run `method(request, context)` on a pool thread, its context carrying `principal`. If the
    caller gives up (gRPC cancels this coroutine), the thread's call sees its context go
    inactive and stops waiting for its group; the cancellation goes on to gRPC."""
    pool_context = PoolContext(context.peer(), principal)
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(pool, method, request, pool_context)
    except asyncio.CancelledError:
        pool_context.gone.set()
        raise


AsyncMethod = Callable[[Any, grpc.aio.ServicerContext, str], Awaitable[Any]]


def _pooled(name: str, sync_name: str | None = None) -> AsyncMethod:
    """The RPC `name`, run on the pool by the sync servicer's `sync_name` (default: `name`;
    a method that answers a `SerializedAnswer` where the gRPC method answers a message)."""
    target = sync_name or name

    async def method(
        self: _Pooled, request: Any, context: grpc.aio.ServicerContext, principal: str
    ) -> Any:
        return await run_in_pool(self.pool, getattr(self.sync, target), request, context, principal)

    method.__name__ = name
    return method  # type: ignore[return-value]


class _Pooled:
    def __init__(self, sync: Any, pool: Executor) -> None:
        self.sync = sync
        self.pool = pool


class AsyncCoordinatorServicer(_Pooled):
    sync: CoordinatorServicer

    async def ConnectGroupHeartbeat(
        self, request: Any, context: grpc.aio.ServicerContext, principal: str
    ) -> Any:
        owned = request.connectors_and_tasks  # counting a repeated field is O(1)
        if len(owned.tasks) + len(owned.connectors) <= STEADY_ON_LOOP_MAX_OWNED:
            answer = self.sync.steady_heartbeat(request, principal)
            if answer is not None:
                return answer
        return await run_in_pool(
            self.pool, self.sync.heartbeat_serialized, request, context, principal
        )

    ConnectGroupPrepareAssignment = _pooled("ConnectGroupPrepareAssignment", "prepare_serialized")
    ConnectGroupInstallAssignment = _pooled("ConnectGroupInstallAssignment")
    ConnectGroupConfigs = _pooled("ConnectGroupConfigs")
    ConnectGroupReportStatus = _pooled("ConnectGroupReportStatus")


class AsyncAdminServicer(_Pooled):
    sync: AdminServicer

    PutConnector = _pooled("PutConnector")
    DeleteConnector = _pooled("DeleteConnector")
    AlterGroupConfigs = _pooled("AlterGroupConfigs")
    ListGroups = _pooled("ListGroups")
    DescribeGroups = _pooled("DescribeGroups")
    FindCoordinator = _pooled("FindCoordinator")
    ListAcls = _pooled("ListAcls")
    AddAcl = _pooled("AddAcl")
    RemoveAcl = _pooled("RemoveAcl")
    DescribeFeatures = _pooled("DescribeFeatures")
    UpdateFeatures = _pooled("UpdateFeatures")
    PauseConnector = _pooled("PauseConnector")
    ResumeConnector = _pooled("ResumeConnector")
    StopConnector = _pooled("StopConnector")
    RestartConnector = _pooled("RestartConnector")
    DeleteGroup = _pooled("DeleteGroup")
    RemoveMember = _pooled("RemoveMember")


#: A delivered JoinGroup answer naming more members than this (a leader's, with every member's
#: metadata) is encoded on a pool thread, not on the loop.
ENCODE_ON_LOOP_MAX_MEMBERS = 1_000


class AsyncClassicServicer(_Pooled):
    """`ConnectGroupClassic` on the loop: parked JoinGroup/SyncGroup, steady heartbeats."""

    sync: ClassicServicer

    def __init__(self, sync: ClassicServicer, pool: Executor, parking: ParkingLot) -> None:
        super().__init__(sync, pool)
        self.parking = parking

    async def JoinGroup(
        self, request: Any, context: grpc.aio.ServicerContext, principal: str
    ) -> Any:
        return await self._parkable(WAKE_JOIN, self.sync.JoinGroup, request, context, principal)

    async def SyncGroup(
        self, request: Any, context: grpc.aio.ServicerContext, principal: str
    ) -> Any:
        return await self._parkable(WAKE_SYNC, self.sync.SyncGroup, request, context, principal)

    async def Heartbeat(
        self, request: Any, context: grpc.aio.ServicerContext, principal: str
    ) -> Any:
        answer = self.sync.steady_heartbeat(request, principal)
        if answer is not None:
            return answer
        return await run_in_pool(self.pool, self.sync.Heartbeat, request, context, principal)

    LeaveGroup = _pooled("LeaveGroup")

    async def _parkable(
        self,
        kind: str,
        method: SyncMethod,
        request: Any,
        context: grpc.aio.ServicerContext,
        principal: str,
    ) -> Any:
        """Run `method` on the pool; if it parks, wait on the loop for the wakeup (module
        docstring). The waiter is registered first and always unregistered."""
        loop = asyncio.get_running_loop()
        # An empty member id never parks (it is answered MEMBER_ID_REQUIRED or refused).
        waiter = (
            self.parking.register(request.group_id, kind, request.member_id, loop)
            if request.member_id
            else None
        )
        try:
            answer = await run_in_pool(self.pool, method, request, context, principal)
            if not isinstance(answer, Parked):
                return answer
            limit_s = self.sync.park_limit_s(kind, request)
            if waiter is None:  # cannot happen (a parked call names its member): never hang
                return self.sync.park_expired(kind, request, 0.0)
            try:
                delivered = await asyncio.wait_for(waiter.future, limit_s)
            except TimeoutError:
                return self.sync.park_expired(kind, request, limit_s)
            members = getattr(delivered, "members", ())
            if len(members) > ENCODE_ON_LOOP_MAX_MEMBERS:
                return await loop.run_in_executor(
                    self.pool, self.sync.answer_parked, kind, request, delivered
                )
            return self.sync.answer_parked(kind, request, delivered)
        finally:
            if waiter is not None:
                self.parking.unregister(waiter)


class UndecodableRequests:
    """Request bodies that are not a valid message of their RPC: counted per RPC
    (`coordinator_undecodable_requests`), logged at most once a minute per RPC, and answered
    INVALID_ARGUMENT without a traceback (gRPC's own deserializer would log one per request and
    answer UNKNOWN with the parser's text)."""

    def __init__(self, metrics: Metrics, every_s: float = UNDECODABLE_LOG_EVERY_S) -> None:
        self.metrics = metrics
        self.every_s = every_s
        self._last_logged: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def seen(self, rpc: str, peer: str) -> None:
        self.metrics.undecodable.labels(rpc).inc()
        now = time.monotonic()
        last = self._last_logged.get(rpc)
        if last is not None and now - last < self.every_s:
            self._skipped[rpc] = self._skipped.get(rpc, 0) + 1
            return
        self._last_logged[rpc] = now
        log.warning(
            "undecodable request refused (%d more since the last line)",
            self._skipped.pop(rpc, 0),
            extra=fields(event="undecodable_request", rpc=rpc, peer=peer),
        )


def register(
    server: grpc.aio.Server,
    service: ServiceDescriptor,
    messages: Any,
    servicer: Any,
    undecodable: UndecodableRequests,
    identity: CallIdentity,
    max_message_bytes: int,
) -> None:
    """Serve `service` with `servicer`'s coroutines, decoding each body itself (instead of the
    generated `add_..._to_server`), so that an undecodable one is refused cleanly, working out
    the caller's principal (`identity`; UNAUTHENTICATED for a revoked or unmappable
    certificate) before the servicer sees the call, and refusing an answer over
    `max_message_bytes` with RESOURCE_EXHAUSTED itself (gRPC would log a traceback for each).
    Each call's time is observed once, in coordinator_rpc_latency_seconds under the method's
    name (the steady heartbeat answered on the loop and the calls run on the pool alike)."""
    handlers = {}
    for method in service.methods:
        request_type = getattr(messages, method.input_type.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _decoding(  # answers their serialized bytes (`_as_serialized`)
                getattr(servicer, method.name),
                request_type,
                method.name,
                undecodable,
                identity,
                max_message_bytes,
                # Bound once here: a call observes its series without looking it up.
                undecodable.metrics.rpc_latency.labels(method.name),
            ),
            response_serializer=_as_serialized,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )


def _as_serialized(data: bytes) -> bytes:
    """The response serializer of `register`'s handlers: their answers are serialized already."""
    return data


def _decoding(
    method: AsyncMethod,
    request_type: Any,
    rpc: str,
    undecodable: UndecodableRequests,
    identity: CallIdentity,
    max_message_bytes: int,
    latency: Histogram,
) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def handle(body: bytes, context: grpc.aio.ServicerContext) -> Any:
        started = time.perf_counter()
        try:
            try:
                principal = identity.authenticate(context)
            except Unauthenticated as refused:
                undecodable.metrics.unauthenticated.inc()
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(refused))
            try:
                request = request_type.FromString(body)
            except DecodeError:
                undecodable.seen(rpc, context.peer())
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the request body is not a valid {request_type.DESCRIPTOR.full_name}.",
                )
            answer = await method(request, context, principal)
            # Serialized here, once: its size is checked on the bytes gRPC then sends as they
            # are (`_as_serialized`); `ByteSize()` walked a 10,000-task answer a second time.
            data = answer.SerializeToString()
            size = len(data)
            if size > max_message_bytes:
                undecodable.metrics.errors.labels(rpc, "RESOURCE_EXHAUSTED").inc()
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    # gRPC's own wording, which clients recognise ("SERVER:": the server's limit).
                    f"SERVER: Sent message larger than max ({size} vs. {max_message_bytes}); ask "
                    "for less (fewer groups per DescribeGroups), or raise --max-message-bytes on "
                    "the coordinator and its clients.",
                )
            return data
        finally:  # answered, refused (an abort raises) or given up by the caller alike
            latency.observe(time.perf_counter() - started)

    return handle
