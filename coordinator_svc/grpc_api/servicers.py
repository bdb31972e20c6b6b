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

from connect.group.v1 import admin_pb2, admin_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc

from connect_protocol import wire as protocol_wire
from connect_protocol.errors import (
    ClusterAuthorizationFailed,
    CoordinatorError,
    ErrorCode,
    GroupAuthorizationFailed,
    InvalidRequest,
)
from connect_protocol.logs import fields
from connect_protocol.messages import (
    JOIN_EPOCH,
    HeartbeatRequest,
    HeartbeatResponse,
    PrepareResponse,
)

from ..core.acls import CLUSTER_NAME, Operation, ResourceType
from ..core.admin import alter_configs, delete_connector, put_connector
from ..core.assignment import (
    PrepareView,
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
    MAX_PRINCIPAL_LENGTH,
    Request,
    validate_group_id,
    validate_lengths,
    validate_page_token,
    validate_request,
    validate_text,
)
from ..runtime.authorizer import Authorizer
from ..runtime.groups import GroupManager, NotOwner
from ..runtime.quotas import PrincipalQuotas
from . import convert
from .context import CallIdentity, Context

log = logging.getLogger("coordinator.grpc")

T = TypeVar("T")
Q = TypeVar("Q", bound=Request)
M = TypeVar("M")  # a request message
R = TypeVar("R")  # a response message


def _error_pair(error: BaseException) -> tuple[ErrorCode, str]:
    if isinstance(error, CoordinatorError):
        return error.code, error.message
    log.error("unexpected error", exc_info=error)
    return ErrorCode.UNKNOWN_SERVER_ERROR, (
        f"internal error ({type(error).__name__}); the coordinator's log has the details."
    )


class _Base:
    """`identity` works out a call's principal (default: everyone is ANONYMOUS); `authorizer`
    decides what it may do (default: everything, as with authorization off)."""

    def __init__(
        self,
        manager: GroupManager,
        identity: CallIdentity | None = None,
        authorizer: Authorizer | None = None,
        quotas: PrincipalQuotas | None = None,
        describe_config_values: bool = False,
    ) -> None:
        self.manager = manager
        self.defaults = manager.defaults
        self.identity = identity or CallIdentity()
        self.authorizer = authorizer
        self.quotas = quotas or PrincipalQuotas()
        #: With authorization off: whether DescribeGroups shows config values when asked.
        self.describe_config_values = describe_config_values

    def _principal(self, context: Context) -> str:
        principal = self.identity.principal(context)
        if principal is None:
            raise GroupAuthorizationFailed(
                "the client certificate names no principal that the server's mapping rules accept."
            )
        return principal

    def _allowed(
        self,
        principal: str,
        operation: Operation,
        name: str,
        resource_type: ResourceType = ResourceType.GROUP,
    ) -> bool:
        return self.authorizer is None or self.authorizer.allowed(
            principal, operation, resource_type, name
        )

    def _authorize(
        self,
        rpc: str,
        principal: str,
        operation: Operation,
        group_id: str,
    ) -> None:
        """GROUP_AUTHORIZATION_FAILED (counted, and kept for the aggregated audit event) unless
        `principal` may do `operation` on the group."""
        if not self._allowed(principal, operation, group_id):
            self._denied(rpc, principal, operation, group_id)
            raise GroupAuthorizationFailed(
                f"{principal} is not allowed {operation.value} on group {group_id!r}."
            )

    def _authorize_cluster(
        self, rpc: str, principal: str, operation: Operation, needed: str
    ) -> None:
        """CLUSTER_AUTHORIZATION_FAILED (counted) unless `principal` may do `operation` on the
        cluster; `needed` says what for."""
        if not self._allowed(principal, operation, CLUSTER_NAME, ResourceType.CLUSTER):
            self._denied(rpc, principal, operation, CLUSTER_NAME)
            raise ClusterAuthorizationFailed(
                f"{principal} is not allowed {operation.value} on the cluster (needed {needed})."
            )

    def _denied(self, rpc: str, principal: str, operation: Operation, resource: str) -> None:
        if self.authorizer is not None:
            self.authorizer.denied(rpc, principal, operation, resource)
        else:
            self.manager.metrics.authorization_denials.labels(rpc, operation.value).inc()

    def _run(self, rpc: str, call: Callable[[], T], on_error: Callable[[ErrorCode, str], T]) -> T:
        """`call()`, or the answer `on_error` makes of what it raised (counted per RPC and
        code): the one place an exception becomes an error answer."""
        try:
            return call()
        except Exception as error:
            code, message = _error_pair(error)
            self.manager.metrics.errors.labels(rpc, code.name).inc()
            return on_error(code, message)

    def _serve(
        self,
        rpc: str,
        context: Context,
        request: M,
        decode: Callable[[M], Q],
        handle: Callable[..., Result[Any]],
        encode: Callable[[Any], R],
        failure: Callable[[ErrorCode, str], R],
        operation: Operation,
        plan: Callable[[GroupState | None, Q, bool], Any] | None = None,
    ) -> R:
        """Decode, validate (the core's `validate_request`, once, before any ownership step, so
        bad input touches nothing; the handler is told it ran), authorize `operation` on the
        group, plan what can be worked out before the group's lock (`plan`, given to the
        handler as its `plan` argument), run the core handler on the group's owner (MEMBER
        handlers are given the principal, which member ids are bound to), count errors, encode
        (after the lock is released)."""

        def call() -> R:
            req = decode(request)
            validate_request(req)
            validate_lengths(req, self.defaults.max_id_length, self.defaults.max_url_length)
            group_id = req.group_id
            principal = self._principal(context)
            self._authorize(rpc, principal, operation, group_id)
            run = functools.partial(handle, req=req, defaults=self.defaults, validated=True)
            if operation is Operation.MEMBER:
                run = functools.partial(run, principal=principal)
                if isinstance(req, HeartbeatRequest) and req.member_epoch == JOIN_EPOCH:
                    self.quotas.joins.take(principal)
            if plan is not None:
                run = functools.partial(run, plan=plan(self.manager.peek(group_id), req, True))
            resp = self.manager.execute(
                group_id,
                lambda state, now: run(state, now_ms=now),
                cancelled=lambda: not context.is_active(),
                on_create=functools.partial(self.quotas.creations.take, principal),
            )
            if resp.error_code not in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT):
                self.manager.metrics.errors.labels(rpc, ErrorCode(resp.error_code).name).inc()
                if resp.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED:
                    self._denied(rpc, principal, operation, group_id)  # an id of another
            return encode(resp)

        return self._run(rpc, call, failure)


class CoordinatorServicer(_Base, coordinator_pb2_grpc.ConnectGroupCoordinatorServicer):  # type: ignore[misc]
    def ConnectGroupHeartbeat(
        self, request: coordinator_pb2.ConnectGroupHeartbeatRequest, context: Context
    ) -> coordinator_pb2.ConnectGroupHeartbeatResponse:
        started = time.perf_counter()
        out = self._serve(
            "ConnectGroupHeartbeat",
            context,
            request,
            protocol_wire.heartbeat_request_from_wire,
            heartbeat,
            protocol_wire.heartbeat_response_to_wire,
            functools.partial(
                convert.error_answer,
                coordinator_pb2.ConnectGroupHeartbeatResponse,
                member_epoch=request.member_epoch,
            ),
            Operation.MEMBER,
        )
        self.manager.metrics.heartbeat_latency.observe(time.perf_counter() - started)
        return out

    def steady_heartbeat(
        self, request: coordinator_pb2.ConnectGroupHeartbeatRequest, principal: str
    ) -> coordinator_pb2.ConnectGroupHeartbeatResponse | None:
        """The answer to a heartbeat that changes nothing, worked out at once on the calling
        thread, without waiting for the group's lock or touching the database
        (`GroupManager.execute_if_steady`); None when it needs `ConnectGroupHeartbeat`, which
        then does all of it again (bad input included, so that errors are reported in one
        place)."""
        started = time.perf_counter()
        try:
            req = protocol_wire.heartbeat_request_from_wire(request)
            validate_request(req)
            validate_lengths(req, self.defaults.max_id_length, self.defaults.max_url_length)
            if not self._allowed(principal, Operation.MEMBER, req.group_id):
                return None  # denied: answered (and counted) on the full path

            def handle(state: GroupState | None, now: int) -> Result[HeartbeatResponse]:
                return heartbeat(
                    state,
                    req=req,
                    defaults=self.defaults,
                    now_ms=now,
                    validated=True,
                    principal=principal,
                )

            outcome = self.manager.execute_if_steady(req.group_id, handle)
        except Exception:
            return None
        done, resp = outcome
        if not done or resp is None or resp.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED:
            return None  # a refused impersonation is answered (and counted) on the full path
        if resp.error_code not in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT):
            self.manager.metrics.errors.labels(
                "ConnectGroupHeartbeat", ErrorCode(resp.error_code).name
            ).inc()
        out = protocol_wire.heartbeat_response_to_wire(resp)
        self.manager.metrics.heartbeat_latency.observe(time.perf_counter() - started)
        return out

    def ConnectGroupPrepareAssignment(
        self, request: coordinator_pb2.ConnectGroupPrepareAssignmentRequest, context: Context
    ) -> coordinator_pb2.ConnectGroupPrepareAssignmentResponse:
        def encode(
            answer: PrepareView | PrepareResponse,
        ) -> coordinator_pb2.ConnectGroupPrepareAssignmentResponse:
            return convert.prepare_response(finish_prepare(answer))

        return self._serve(
            "ConnectGroupPrepareAssignment",
            context,
            request,
            convert.prepare_request,
            start_prepare,
            encode,
            functools.partial(
                convert.error_answer, coordinator_pb2.ConnectGroupPrepareAssignmentResponse
            ),
            Operation.MEMBER,
        )

    def ConnectGroupInstallAssignment(
        self, request: coordinator_pb2.ConnectGroupInstallAssignmentRequest, context: Context
    ) -> coordinator_pb2.ConnectGroupInstallAssignmentResponse:
        return self._serve(
            "ConnectGroupInstallAssignment",
            context,
            request,
            convert.install_request,
            install_assignment,
            convert.install_response,
            functools.partial(
                convert.error_answer, coordinator_pb2.ConnectGroupInstallAssignmentResponse
            ),
            Operation.MEMBER,
            plan=plan_install,
        )


class AdminServicer(_Base, admin_pb2_grpc.ConnectGroupAdminServicer):  # type: ignore[misc]
    def PutConnector(
        self, request: admin_pb2.PutConnectorRequest, context: Context
    ) -> admin_pb2.PutConnectorResponse:
        return self._serve(
            "PutConnector",
            context,
            request,
            lambda msg: convert.put_connector_request(msg, context.peer()),
            put_connector,
            convert.put_connector_response,
            functools.partial(convert.error_answer, admin_pb2.PutConnectorResponse),
            Operation.ALTER,
        )

    def DeleteConnector(
        self, request: admin_pb2.DeleteConnectorRequest, context: Context
    ) -> admin_pb2.DeleteConnectorResponse:
        return self._serve(
            "DeleteConnector",
            context,
            request,
            lambda msg: convert.delete_connector_request(msg, context.peer()),
            delete_connector,
            convert.delete_connector_response,
            functools.partial(convert.error_answer, admin_pb2.DeleteConnectorResponse),
            Operation.ALTER,
        )

    def AlterGroupConfigs(
        self, request: admin_pb2.AlterGroupConfigsRequest, context: Context
    ) -> admin_pb2.AlterGroupConfigsResponse:
        return self._serve(
            "AlterGroupConfigs",
            context,
            request,
            lambda msg: convert.alter_configs_request(msg, context.peer()),
            alter_configs,
            convert.alter_configs_response,
            functools.partial(convert.error_answer, admin_pb2.AlterGroupConfigsResponse),
            Operation.ALTER,
        )

    def ListGroups(
        self, request: admin_pb2.ListGroupsRequest, context: Context
    ) -> admin_pb2.ListGroupsResponse:
        def call() -> admin_pb2.ListGroupsResponse:
            self._authorize_cluster(
                "ListGroups", self._principal(context), Operation.DESCRIBE, "to list groups"
            )
            if request.page_size < 0:
                raise InvalidRequest(f"page_size must be >= 0, not {request.page_size}.")
            validate_page_token(request.page_token)
            page, next_token = self.manager.list_groups(request.page_token, request.page_size)
            return convert.listed_groups(page, next_token)

        return self._run(
            "ListGroups",
            call,
            functools.partial(convert.error_answer, admin_pb2.ListGroupsResponse),
        )

    def DescribeGroups(
        self, request: admin_pb2.DescribeGroupsRequest, context: Context
    ) -> admin_pb2.DescribeGroupsResponse:
        out = admin_pb2.DescribeGroupsResponse()
        for group_id in request.group_ids:
            if not context.is_active():
                break  # the caller gave up: describe no more
            out.groups.append(self._describe(group_id, context, request.include_config_values))
        return out

    def _may_see_config_values(self, principal: str, group_id: str) -> None:
        """GROUP_AUTHORIZATION_FAILED unless the caller may see connector config values: the
        DESCRIBE_CONFIGS operation when authorization is on, the server's setting when off."""
        if self.authorizer is not None and self.authorizer.enabled:
            self._authorize("DescribeGroups", principal, Operation.DESCRIBE_CONFIGS, group_id)
        elif not self.describe_config_values:
            self._denied("DescribeGroups", principal, Operation.DESCRIBE_CONFIGS, group_id)
            raise GroupAuthorizationFailed(
                "this coordinator does not show connector config values "
                "(--describe-config-values refuse); ask without include_config_values."
            )

    def _describe(
        self, group_id: str, context: Context, config_values: bool = False
    ) -> admin_pb2.DescribedGroup:
        def describe(
            state: GroupState | None, now: int
        ) -> Result[Callable[[], admin_pb2.DescribedGroup]]:
            if state is None:
                missing = convert.error_answer(
                    admin_pb2.DescribedGroup,
                    ErrorCode.GROUP_ID_NOT_FOUND,
                    f"group {group_id!r} does not exist.",
                    group_id=group_id,
                )
                return Result([], lambda: missing)
            selection = current_selection(state, self.defaults)
            if isinstance(selection, NoSelection):
                reason, name = selection.reason, ""
            else:
                reason, name = "", selection.assignor_name
            # Only a copy of the maps under the group's lock; the answer is built after it.
            view = state.read_view()
            return Result(
                [],
                lambda: convert.described_group(
                    view, self.defaults, now, reason, name, config_values
                ),
            )

        def call() -> admin_pb2.DescribedGroup:
            validate_group_id(group_id)
            principal = self._principal(context)
            self._authorize("DescribeGroups", principal, Operation.DESCRIBE, group_id)
            if config_values:
                self._may_see_config_values(principal, group_id)
            answer = self.manager.execute(
                group_id, describe, cancelled=lambda: not context.is_active()
            )
            return answer()

        return self._run(
            "DescribeGroups",
            call,
            functools.partial(convert.error_answer, admin_pb2.DescribedGroup, group_id=group_id),
        )

    def FindCoordinator(
        self, request: admin_pb2.FindCoordinatorRequest, context: Context
    ) -> admin_pb2.FindCoordinatorResponse:
        def call() -> admin_pb2.FindCoordinatorResponse:
            validate_group_id(request.group_id)
            self._authorize(
                "FindCoordinator", self._principal(context), Operation.DESCRIBE, request.group_id
            )
            try:
                return convert.found_coordinator(self.manager.owner_address(request.group_id))
            except NotOwner as other:
                return convert.found_coordinator(other.owner_address)

        return self._run(
            "FindCoordinator",
            call,
            functools.partial(convert.error_answer, admin_pb2.FindCoordinatorResponse),
        )

    # --- ACL administration (cluster operations; authorization must be on) ---

    def _acl_admin(self, rpc: str, context: Context, operation: Operation) -> None:
        principal = self._principal(context)
        if self.authorizer is None or not self.authorizer.enabled:
            raise ClusterAuthorizationFailed(
                "ACLs are administered over gRPC only with --authorization acl; use "
                "`coordinator-svc acl --database-url ...` against the database."
            )
        self._authorize_cluster(rpc, principal, operation, f"for {rpc}")

    def ListAcls(
        self, request: admin_pb2.ListAclsRequest, context: Context
    ) -> admin_pb2.ListAclsResponse:
        def call() -> admin_pb2.ListAclsResponse:
            self._acl_admin("ListAcls", context, Operation.DESCRIBE)
            validate_text(request.principal, "Principal", MAX_PRINCIPAL_LENGTH)
            _, entries = self.manager.store.acls.load()
            return convert.listed_acls(
                e for e in entries if not request.principal or e.principal == request.principal
            )

        return self._run(
            "ListAcls", call, functools.partial(convert.error_answer, admin_pb2.ListAclsResponse)
        )

    def AddAcl(
        self, request: admin_pb2.AddAclRequest, context: Context
    ) -> admin_pb2.AddAclResponse:
        return self._change_acl(  # type: ignore[no-any-return]
            "AddAcl", request.entry, context, admin_pb2.AddAclResponse, add=True
        )

    def RemoveAcl(
        self, request: admin_pb2.RemoveAclRequest, context: Context
    ) -> admin_pb2.RemoveAclResponse:
        return self._change_acl(  # type: ignore[no-any-return]
            "RemoveAcl", request.entry, context, admin_pb2.RemoveAclResponse, add=False
        )

    def _change_acl(
        self, rpc: str, wire: admin_pb2.AclEntry, context: Context, answer: Any, *, add: bool
    ) -> Any:
        def call() -> Any:
            self._acl_admin(rpc, context, Operation.ALTER)
            entry = convert.acl_entry(wire)
            acls = self.manager.store.acls
            changed = acls.add(entry) if add else acls.remove(entry) > 0
            assert self.authorizer is not None
            self.authorizer.refresh()  # this coordinator at once; the others within a refresh
            log.info(
                "ACL %s: %s",
                "added" if add else "removed",
                entry.describe(),
                extra=fields(event="acl_changed", rpc=rpc, changed=changed),
            )
            return answer(changed=changed)

        return self._run(rpc, call, functools.partial(convert.error_answer, answer))
