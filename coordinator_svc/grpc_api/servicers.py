"""gRPC servicers: decode, run the core handler through the GroupManager, encode.

Errors are in-band (error_code + error_message); a gRPC status other than OK only ever comes from
the transport. Unexpected exceptions become UNKNOWN_SERVER_ERROR and are logged.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from connect.group.v1 import admin_pb2, admin_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc

from connect_protocol import wire as protocol_wire
from connect_protocol.errors import CoordinatorError, ErrorCode, InvalidRequest
from connect_protocol.messages import HeartbeatResponse

from ..core.admin import alter_configs, delete_connector, put_connector
from ..core.assignment import (
    current_selection,
    finish_prepare,
    install_assignment,
    plan_install,
    start_prepare,
)
from ..core.heartbeat import heartbeat
from ..core.model import GroupState
from ..core.results import Result
from ..core.selection import NoSelection
from ..core.validation import (
    Request,
    validate_group_id,
    validate_request,
)
from ..runtime.groups import GroupManager, NotOwner
from . import convert

log = logging.getLogger("coordinator.grpc")

T = TypeVar("T")
Q = TypeVar("Q", bound=Request)


def _error_pair(error: BaseException) -> tuple[ErrorCode, str]:
    if isinstance(error, CoordinatorError):
        return error.code, error.message
    log.error("unexpected error", exc_info=error)
    return ErrorCode.UNKNOWN_SERVER_ERROR, (
        f"internal error ({type(error).__name__}); the coordinator's log has the details."
    )


class _Base:
    def __init__(self, manager: GroupManager) -> None:
        self.manager = manager
        self.defaults = manager.defaults

    def _run(self, rpc: str, call: Callable[[], T], on_error: Callable[[ErrorCode, str], T]) -> T:
        try:
            return call()
        except Exception as error:
            code, message = _error_pair(error)
            self.manager.metrics.errors.labels(rpc, code.name).inc()
            return on_error(code, message)

    def _serve(
        self,
        rpc: str,
        context: grpc.ServicerContext,
        request: Any,
        decode: Callable[[Any], Q],
        handle: Callable[..., Result[Any]],
        encode: Callable[[Any], Any],
        failure: Callable[[ErrorCode, str], Any],
        plan: Callable[[GroupState | None, Q, bool], Any] | None = None,
    ) -> Any:
        """Decode, validate (the core's `validate_request`, once, before any ownership step, so
        bad input touches nothing; the handler is told it ran), plan
        what can be worked out before the group's lock (`plan`, given to the handler as its
        `plan` argument), run the core handler on the group's owner, count errors, encode
        (after the lock is released)."""

        def call() -> Any:
            req = decode(request)
            validate_request(req)
            group_id = req.group_id
            run = functools.partial(handle, req=req, defaults=self.defaults, validated=True)
            if plan is not None:
                run = functools.partial(run, plan=plan(self.manager.peek(group_id), req, True))
            resp = self.manager.execute(
                group_id,
                lambda state, now: run(state, now_ms=now),
                cancelled=lambda: not context.is_active(),
            )
            if resp.error_code not in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT):
                self.manager.metrics.errors.labels(rpc, ErrorCode(resp.error_code).name).inc()
            return encode(resp)

        return self._run(rpc, call, failure)


class CoordinatorServicer(_Base, coordinator_pb2_grpc.ConnectGroupCoordinatorServicer):  # type: ignore[misc]
    def ConnectGroupHeartbeat(self, request: Any, context: grpc.ServicerContext) -> Any:
        started = time.perf_counter()
        out = self._serve(
            "ConnectGroupHeartbeat",
            context,
            request,
            protocol_wire.heartbeat_request_from_wire,
            heartbeat,
            protocol_wire.heartbeat_response_to_wire,
            lambda code, msg: coordinator_pb2.ConnectGroupHeartbeatResponse(
                error_code=protocol_wire.wire_code(code),
                error_message=msg,
                member_epoch=request.member_epoch,
            ),
        )
        self.manager.metrics.heartbeat_latency.observe(time.perf_counter() - started)
        return out

    def steady_heartbeat(self, request: Any) -> Any | None:
        """The answer to a heartbeat that changes nothing, worked out at once on the calling
        thread, without waiting for the group's lock or touching the database
        (`GroupManager.execute_if_steady`); None when it needs `ConnectGroupHeartbeat`, which
        then does all of it again (bad input included, so that errors are reported in one
        place)."""
        started = time.perf_counter()
        try:
            req = protocol_wire.heartbeat_request_from_wire(request)
            validate_request(req)

            def handle(state: GroupState | None, now: int) -> Result[HeartbeatResponse]:
                return heartbeat(state, req=req, defaults=self.defaults, now_ms=now, validated=True)

            outcome = self.manager.execute_if_steady(req.group_id, handle)
        except Exception:
            return None
        done, resp = outcome
        if not done or resp is None:
            return None
        if resp.error_code not in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT):
            self.manager.metrics.errors.labels(
                "ConnectGroupHeartbeat", ErrorCode(resp.error_code).name
            ).inc()
        out = protocol_wire.heartbeat_response_to_wire(resp)
        self.manager.metrics.heartbeat_latency.observe(time.perf_counter() - started)
        return out

    def ConnectGroupPrepareAssignment(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._serve(
            "ConnectGroupPrepareAssignment",
            context,
            request,
            convert.prepare_request,
            start_prepare,
            lambda view: convert.prepare_response(finish_prepare(view)),
            lambda code, msg: coordinator_pb2.ConnectGroupPrepareAssignmentResponse(
                error_code=protocol_wire.wire_code(code), error_message=msg
            ),
        )

    def ConnectGroupInstallAssignment(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._serve(
            "ConnectGroupInstallAssignment",
            context,
            request,
            convert.install_request,
            install_assignment,
            convert.install_response,
            lambda code, msg: coordinator_pb2.ConnectGroupInstallAssignmentResponse(
                error_code=protocol_wire.wire_code(code), error_message=msg
            ),
            plan=plan_install,
        )


class AdminServicer(_Base, admin_pb2_grpc.ConnectGroupAdminServicer):  # type: ignore[misc]
    def PutConnector(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._serve(
            "PutConnector",
            context,
            request,
            lambda msg: convert.put_connector_request(msg, context.peer()),
            put_connector,
            lambda resp: admin_pb2.PutConnectorResponse(
                error_code=protocol_wire.wire_code(resp.error_code),
                error_message=resp.error_message,
                group_epoch=resp.group_epoch,
                created=resp.created,
                rebalance_triggered=resp.rebalance_triggered,
            ),
            lambda code, msg: admin_pb2.PutConnectorResponse(
                error_code=protocol_wire.wire_code(code), error_message=msg
            ),
        )

    def DeleteConnector(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._serve(
            "DeleteConnector",
            context,
            request,
            lambda msg: convert.delete_connector_request(msg, context.peer()),
            delete_connector,
            lambda resp: admin_pb2.DeleteConnectorResponse(
                error_code=protocol_wire.wire_code(resp.error_code),
                error_message=resp.error_message,
                group_epoch=resp.group_epoch,
            ),
            lambda code, msg: admin_pb2.DeleteConnectorResponse(
                error_code=protocol_wire.wire_code(code), error_message=msg
            ),
        )

    def AlterGroupConfigs(self, request: Any, context: grpc.ServicerContext) -> Any:
        def encode(resp: Any) -> Any:
            out = admin_pb2.AlterGroupConfigsResponse(
                error_code=protocol_wire.wire_code(resp.error_code),
                error_message=resp.error_message,
            )
            out.effective_configs.update(resp.effective_configs)
            return out

        return self._serve(
            "AlterGroupConfigs",
            context,
            request,
            lambda msg: convert.alter_configs_request(msg, context.peer()),
            alter_configs,
            encode,
            lambda code, msg: admin_pb2.AlterGroupConfigsResponse(
                error_code=protocol_wire.wire_code(code), error_message=msg
            ),
        )

    def ListGroups(self, request: Any, context: grpc.ServicerContext) -> Any:
        def call() -> Any:
            if request.page_size < 0:
                raise InvalidRequest(f"page_size must be >= 0, not {request.page_size}.")
            page, next_token = self.manager.list_groups(request.page_token, request.page_size)
            out = admin_pb2.ListGroupsResponse(next_page_token=next_token)
            for g in page:
                out.groups.add(
                    group_id=g.group_id,
                    group_type="connect",
                    state=g.status.value,
                    group_epoch=g.group_epoch,
                    member_count=g.member_count,
                )
            return out

        return self._run(
            "ListGroups",
            call,
            lambda code, msg: admin_pb2.ListGroupsResponse(
                error_code=protocol_wire.wire_code(code), error_message=msg
            ),
        )

    def DescribeGroups(self, request: Any, context: grpc.ServicerContext) -> Any:
        out = admin_pb2.DescribeGroupsResponse()
        for group_id in request.group_ids:
            if not context.is_active():
                break  # the caller gave up: describe no more
            out.groups.append(self._describe(group_id, context))
        return out

    def _describe(self, group_id: str, context: grpc.ServicerContext) -> Any:
        def describe(state: GroupState | None, now: int) -> Result[Any]:
            if state is None:
                return Result(
                    [],
                    admin_pb2.DescribedGroup(
                        group_id=group_id,
                        error_code=protocol_wire.wire_code(ErrorCode.GROUP_ID_NOT_FOUND),
                        error_message=f"group {group_id!r} does not exist.",
                    ),
                )
            selection = current_selection(state)
            if isinstance(selection, NoSelection):
                reason, name = selection.reason, ""
            else:
                reason, name = "", selection.assignor_name
            # Only a copy of the maps under the group's lock; the answer is built after it.
            view = state.read_view()
            return Result(
                [], lambda: convert.described_group(view, self.defaults, now, reason, name)
            )

        def call() -> Any:
            validate_group_id(group_id)
            answer = self.manager.execute(
                group_id, describe, cancelled=lambda: not context.is_active()
            )
            return answer() if callable(answer) else answer

        def failed(code: ErrorCode, msg: str) -> Any:
            return admin_pb2.DescribedGroup(
                group_id=group_id, error_code=protocol_wire.wire_code(code), error_message=msg
            )

        return self._run("DescribeGroups", call, failed)

    def FindCoordinator(self, request: Any, context: grpc.ServicerContext) -> Any:
        def answer(address: str) -> Any:
            host, _, port = address.rpartition(":")
            return admin_pb2.FindCoordinatorResponse(
                host=host, port=int(port) if port.isdigit() else 0, node_id=address
            )

        def call() -> Any:
            validate_group_id(request.group_id)
            try:
                return answer(self.manager.owner_address(request.group_id))
            except NotOwner as other:
                return answer(other.owner_address)

        return self._run(
            "FindCoordinator",
            call,
            lambda code, msg: admin_pb2.FindCoordinatorResponse(
                error_code=protocol_wire.wire_code(code), error_message=msg
            ),
        )
