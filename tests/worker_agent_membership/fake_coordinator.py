"""A scripted stand-in for the coordinator: a real gRPC server on 127.0.0.1 that serves only
ConnectGroupHeartbeat, answering with whatever the test's `script` returns, and recording every
request with the time it arrived. For worker-level tests (the real `Agent`, or the Node client)
of behaviour that must not depend on the real coordinator's version: partial releases, fencing
tokens.

    with FakeCoordinator(script) as fake:
        ...  # point a worker at fake.address
        fake.owned_lists()  # the owned list of every heartbeat that carried one
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from connect.group.v1 import coordinator_pb2, coordinator_pb2_grpc

from connect_protocol.messages import AssignmentMessage, HeartbeatRequest, HeartbeatResponse
from connect_protocol.resources import ResourceSet, TaskId
from connect_protocol.tokens import NO_TOKENS, FencingTokens
from connect_protocol.wire import heartbeat_request_from_wire, heartbeat_response_to_wire

__all__ = ["FakeCoordinator", "Script", "Seen", "answer", "rs"]


def rs(*names: str) -> ResourceSet:
    """`rs("A", "A-0")`: connector A and its task 0."""
    connectors: list[str] = []
    tasks: list[TaskId] = []
    for name in names:
        if "-" in name:
            connector, task = name.rsplit("-", 1)
            tasks.append(TaskId(connector, int(task)))
        else:
            connectors.append(name)
    return ResourceSet.of(connectors, tasks)


def answer(
    epoch: int,
    assigned: ResourceSet | None = None,
    tokens: FencingTokens = NO_TOKENS,
    *,
    interval_ms: int = 200,
    session_ms: int = 10_000,
) -> HeartbeatResponse:
    """A successful answer; `assigned=None` leaves the assignment ABSENT."""
    assignment = AssignmentMessage(assigned, tokens=tokens) if assigned is not None else None
    return HeartbeatResponse(
        member_epoch=epoch,
        heartbeat_interval_ms=interval_ms,
        session_timeout_ms=session_ms,
        assignment=assignment,
    )


@dataclass(frozen=True)
class Seen:
    """One heartbeat the fake received: when (time.monotonic()) and what."""

    at: float
    request: HeartbeatRequest


#: The answer to a heartbeat, given every heartbeat seen before it.
Script = Callable[[HeartbeatRequest, list[Seen]], HeartbeatResponse]


class FakeCoordinator(coordinator_pb2_grpc.ConnectGroupCoordinatorServicer):  # type: ignore[misc]
    """Answers each heartbeat with `script(request, seen_before)`."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self._lock = threading.Lock()
        self._seen: list[Seen] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(4))
        coordinator_pb2_grpc.add_ConnectGroupCoordinatorServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"

    def __enter__(self) -> FakeCoordinator:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)

    def ConnectGroupHeartbeat(
        self, request: coordinator_pb2.ConnectGroupHeartbeatRequest, context: Any
    ) -> coordinator_pb2.ConnectGroupHeartbeatResponse:
        req = heartbeat_request_from_wire(request)
        with self._lock:
            before = list(self._seen)
            self._seen.append(Seen(time.monotonic(), req))
            return heartbeat_response_to_wire(self.script(req, before))

    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)

    def owned_lists(self) -> list[ResourceSet]:
        """The owned list of every heartbeat that carried one, in order."""
        return [s.request.owned for s in self.seen() if s.request.owned is not None]
