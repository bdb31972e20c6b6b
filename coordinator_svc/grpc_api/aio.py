"""The asyncio face of the servicers (grpc.aio): a steady heartbeat is answered on the event loop
itself; every other call, and any heartbeat that would wait for its group's lock or change
something, runs the synchronous servicer (`servicers.py`) on a thread of a pool.

Why: the measured gRPC plumbing of the thread-pool server (`bench/run-server-model`) costs more
per call than the aio server's, and the steady heartbeat is by far the most frequent call. Why not
everything on the loop: a group's lock and the database are blocking; a thread may wait for them,
the loop must not.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

import grpc
from connect.group.v1 import admin_pb2_grpc, coordinator_pb2_grpc

from .servicers import AdminServicer, CoordinatorServicer

SyncMethod = Callable[[Any, Any], Any]


class PoolContext:
    """What a synchronous servicer asks of its context, for a call it runs on a pool thread:
    the caller's address, and whether the caller is still waiting."""

    def __init__(self, peer: str) -> None:
        self._peer = peer
        self.gone = threading.Event()

    def peer(self) -> str:
        return self._peer

    def is_active(self) -> bool:
        return not self.gone.is_set()


async def run_in_pool(
    pool: Executor, method: SyncMethod, request: Any, context: grpc.aio.ServicerContext
) -> Any:
    """Run `method(request, context)` on a pool thread. If the caller gives up (gRPC cancels
    this coroutine), the thread's call sees its context go inactive and stops waiting for its
    group; the cancellation goes on to gRPC."""
    pool_context = PoolContext(context.peer())
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(pool, method, request, pool_context)
    except asyncio.CancelledError:
        pool_context.gone.set()
        raise


def _pooled(name: str) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def method(self: _Pooled, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await run_in_pool(self.pool, getattr(self.sync, name), request, context)

    method.__name__ = name
    return method


class _Pooled:
    def __init__(self, sync: Any, pool: Executor) -> None:
        self.sync = sync
        self.pool = pool


class AsyncCoordinatorServicer(_Pooled, coordinator_pb2_grpc.ConnectGroupCoordinatorServicer):  # type: ignore[misc]
    sync: CoordinatorServicer

    async def ConnectGroupHeartbeat(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        answer = self.sync.steady_heartbeat(request)
        if answer is not None:
            return answer
        return await run_in_pool(self.pool, self.sync.ConnectGroupHeartbeat, request, context)

    ConnectGroupPrepareAssignment = _pooled("ConnectGroupPrepareAssignment")
    ConnectGroupInstallAssignment = _pooled("ConnectGroupInstallAssignment")


class AsyncAdminServicer(_Pooled, admin_pb2_grpc.ConnectGroupAdminServicer):  # type: ignore[misc]
    sync: AdminServicer

    PutConnector = _pooled("PutConnector")
    DeleteConnector = _pooled("DeleteConnector")
    AlterGroupConfigs = _pooled("AlterGroupConfigs")
    ListGroups = _pooled("ListGroups")
    DescribeGroups = _pooled("DescribeGroups")
    FindCoordinator = _pooled("FindCoordinator")
