"""gRPC servicers: decode, run the core handler through the GroupManager, encode.

Errors are in-band (error_code + error_message); a gRPC status other than OK only ever comes from
the transport. Unexpected exceptions become UNKNOWN_SERVER_ERROR and are logged.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from connect.group.v1 import admin_pb2, admin_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc

from connect_protocol import lifecycle_wire
from connect_protocol import wire as protocol_wire
from connect_protocol.errors import (
    ClusterAuthorizationFailed,
    CoordinatorError,
    ErrorCode,
    GroupAuthorizationFailed,
    InvalidRequest,
    ThrottlingQuotaExceeded,
)
from connect_protocol.lifecycle_messages import ReportStatusRequest, TargetState
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
from ..core.control import restart_connector, set_target_state
from ..core.features import check_update
from ..core.group_removal import delete_group, remove_member
from ..core.heartbeat import heartbeat
from ..core.lifecycle import configs
from ..core.model import GroupState, MemberState
from ..core.results import Result
from ..core.selection import NoSelection
from ..core.status import Owners, report_status
from ..core.status import views as status_views
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
from ..runtime.features import FeatureLevels
from ..runtime.groups import (
    DATABASE_MODULES,
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    GroupManager,
    NotOwner,
    Steady,
    database_unavailable,
)
from ..runtime.quotas import PrincipalQuotas
from ..store import StoreUnavailable
from ..store.acl_store import AclCaller
from . import convert
from .context import CallIdentity, Context
from .serialized import SerializedAnswer, as_message

log = logging.getLogger("coordinator.grpc")

#: What a DescribeGroups answer keeps free of descriptions under --max-message-bytes (the
#: response's own framing), and what each entry adds beside its own size (tag and length).
DESCRIBE_ANSWER_RESERVE_BYTES = 1_024
ENTRY_OVERHEAD_BYTES = 6


def _describe_error(group_id: str, code: ErrorCode, message: str) -> admin_pb2.DescribedGroup:
    return convert.error_answer(admin_pb2.DescribedGroup, code, message, group_id=group_id)


T = TypeVar("T")
Q = TypeVar("Q", bound=Request)
M = TypeVar("M")  # a request message
R = TypeVar("R")  # a response message


def _error_pair(error: BaseException) -> tuple[ErrorCode, str]:
    if isinstance(error, CoordinatorError):
        return error.code, error.message
    if isinstance(error, StoreUnavailable):  # transient: the client retries
        unavailable = database_unavailable(error)
        return unavailable.code, unavailable.message
    log.error("unexpected error", exc_info=error)
    named = type(error).__name__
    if type(error).__module__.split(".")[0] in DATABASE_MODULES:
        named = "a database error"  # the driver's names and text stay in the log
    return ErrorCode.UNKNOWN_SERVER_ERROR, (
        f"internal error ({named}); the coordinator's log has the details."
    )


def _carries_assignment(resp: HeartbeatResponse) -> bool:
    """Whether a heartbeat's answer hands the member resources (and their fencing tokens): never
    sent from a state whose commit is still in flight (`runtime.group_commit`)."""
    return resp.assignment is not None


HeartbeatAnswer = (
    coordinator_pb2.ConnectGroupHeartbeatResponse
    | SerializedAnswer[coordinator_pb2.ConnectGroupHeartbeatResponse]
)
"""A heartbeat's answer: an error answer as a message, a handled one as its bytes."""

PrepareAnswer = (
    coordinator_pb2.ConnectGroupPrepareAssignmentResponse
    | SerializedAnswer[coordinator_pb2.ConnectGroupPrepareAssignmentResponse]
)
"""A Prepare's answer: an error answer as a message, a handled one as its bytes."""


def _heartbeat_answer(resp: HeartbeatResponse) -> HeartbeatAnswer:
    """The handler's answer as its wire bytes, the assignment's sets joined from their kept
    entries (`heartbeat_response_bytes`), never built as protobuf objects."""
    return SerializedAnswer(
        protocol_wire.heartbeat_response_bytes(resp),
        coordinator_pb2.ConnectGroupHeartbeatResponse,
    )


def _steady_rule(req: HeartbeatRequest) -> Steady:
    """A heartbeat is worth answering outside a batch (on the event loop, or during another
    batch's commit) when its member is STABLE at the group's target epoch and names its epoch:
    otherwise its handler reconciles, which costs O(the member's share) (100+ ms for 100,000
    tasks) and writes; run once, in its batch, not first on the loop that serves every group.
    O(1); read under the group's lock."""

    def worth_trying(state: GroupState | None) -> bool:
        if state is None:
            return False
        member = state.members.get(req.member_id)
        return (
            member is not None
            and member.state is MemberState.STABLE
            and member.member_epoch == req.member_epoch == state.target.assignment_epoch
        )

    return Steady(_carries_assignment, worth_trying)


class _Base:
    """`identity` works out a call's principal (default: everyone is ANONYMOUS); `authorizer`
    decides what it may do (default: everything, as with authorization off); `features`: the
    cluster's feature levels in force in this process (default: read from the store only when
    UpdateFeatures changes them)."""

    def __init__(
        self,
        manager: GroupManager,
        identity: CallIdentity | None = None,
        authorizer: Authorizer | None = None,
        quotas: PrincipalQuotas | None = None,
        describe_config_values: bool = False,
        features: FeatureLevels | None = None,
    ) -> None:
        self.manager = manager
        self.features = features or FeatureLevels(manager.store.features)
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
            self._denied(rpc, principal, operation, CLUSTER_NAME, ResourceType.CLUSTER)
            raise ClusterAuthorizationFailed(
                f"{principal} is not allowed {operation.value} on the cluster (needed {needed})."
            )

    def _denied(
        self,
        rpc: str,
        principal: str,
        operation: Operation,
        resource: str,
        resource_type: ResourceType = ResourceType.GROUP,
    ) -> None:
        if self.authorizer is not None:
            self.authorizer.denied(rpc, principal, operation, resource, resource_type)
        else:
            self.manager.metrics.authorization_denials.labels(rpc, operation.value).inc()

    def _may_create_group(self, principal: str) -> None:
        """Raise unless `principal` may create one more group: its creation rate, then the
        groups it created (--max-groups-per-principal; --max-groups is checked after)."""
        self.quotas.creations.take(principal)
        self.manager.check_groups_created_by(principal)

    def _run(self, rpc: str, call: Callable[[], T], on_error: Callable[[ErrorCode, str], T]) -> T:
        """`call()`, or the answer `on_error` makes of what it raised (counted per RPC and
        code): the one place an exception becomes an error answer."""
        try:
            return call()
        except Exception as error:
            code, message = _error_pair(error)
            self.manager.metrics.errors.labels(rpc, code.name).inc()
            answer = on_error(code, message)
            if isinstance(error, ThrottlingQuotaExceeded) and _has_field(
                answer, "throttle_time_ms"
            ):
                answer.throttle_time_ms = error.wait_ms  # type: ignore[attr-defined]
            return answer

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
        tells_assignor: bool = False,
        quota: Callable[[str], None] | None = None,
    ) -> R:
        """Decode, validate (the core's `validate_request`, once, before any ownership step, so
        bad input touches nothing; the handler is told it ran), authorize `operation` on the
        group, plan what can be worked out before the group's lock (`plan`, given to the
        handler as its `plan` argument), run the core handler on the group's owner (given the
        principal: member ids are bound to it, admin changes record it, and a group created by
        the request is counted against it), count errors, encode (after the lock is released).
        A handler that `tells_assignor` (Prepare, Install) is told whether the caller may
        DESCRIBE the group, which decides whether a refusal names the assignor member."""

        def call() -> R:
            req = decode(request)
            validate_request(req)
            validate_lengths(req, self.defaults.max_id_length, self.defaults.max_url_length)
            group_id = req.group_id
            principal = self._principal(context)
            self._authorize(rpc, principal, operation, group_id)
            if quota is not None:
                quota(principal)
            run = functools.partial(
                handle, req=req, defaults=self.defaults, validated=True, principal=principal
            )
            if tells_assignor:
                may_describe = self._allowed(principal, Operation.DESCRIBE, group_id)
                run = functools.partial(run, may_describe=may_describe)
            if (
                operation is Operation.MEMBER
                and isinstance(req, HeartbeatRequest)
                and req.member_epoch == JOIN_EPOCH
            ):
                self.quotas.joins.take(principal)
            if plan is not None:
                run = functools.partial(run, plan=plan(self.manager.peek(group_id), req, True))
            member_id = getattr(req, "member_id", None) or None
            resp = self.manager.execute(
                group_id,
                lambda state, now: run(state, now_ms=now),
                cancelled=lambda: not context.is_active(),
                on_create=functools.partial(self._may_create_group, principal),
                member_id=member_id,
                steady=_steady_rule(req) if isinstance(req, HeartbeatRequest) else None,
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
        return as_message(self.heartbeat_serialized(request, context))

    def heartbeat_serialized(
        self, request: coordinator_pb2.ConnectGroupHeartbeatRequest, context: Context
    ) -> HeartbeatAnswer:
        """`ConnectGroupHeartbeat`'s answer as the serving loop sends it (`aio`): a handled
        heartbeat's as its bytes, never built as a message."""
        return self._serve(
            "ConnectGroupHeartbeat",
            context,
            request,
            protocol_wire.heartbeat_request_from_wire,
            functools.partial(heartbeat, group_version=self.features.group_version),
            _heartbeat_answer,
            functools.partial(
                convert.error_answer,
                coordinator_pb2.ConnectGroupHeartbeatResponse,
                member_epoch=request.member_epoch,
            ),
            Operation.MEMBER,
        )

    def steady_heartbeat(
        self, request: coordinator_pb2.ConnectGroupHeartbeatRequest, principal: str
    ) -> HeartbeatAnswer | None:
        """The answer to a heartbeat that changes nothing, worked out at once on the calling
        thread, without waiting for the group's lock or touching the database
        (`GroupManager.execute_if_steady`); None when it needs `ConnectGroupHeartbeat`, which
        then does all of it again (bad input included, so that errors are reported in one
        place). Its time is observed by the caller (`aio.register`), with the call's."""
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
                    group_version=self.features.group_version,
                )

            outcome = self.manager.execute_if_steady(
                req.group_id, handle, req.member_id, _steady_rule(req)
            )
        except Exception:
            return None
        done, resp = outcome
        if not done or resp is None or resp.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED:
            return None  # a refused impersonation is answered (and counted) on the full path
        if resp.error_code not in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT):
            self.manager.metrics.errors.labels(
                "ConnectGroupHeartbeat", ErrorCode(resp.error_code).name
            ).inc()
        return _heartbeat_answer(resp)

    def ConnectGroupPrepareAssignment(
        self, request: coordinator_pb2.ConnectGroupPrepareAssignmentRequest, context: Context
    ) -> coordinator_pb2.ConnectGroupPrepareAssignmentResponse:
        return as_message(self.prepare_serialized(request, context))

    def prepare_serialized(
        self, request: coordinator_pb2.ConnectGroupPrepareAssignmentRequest, context: Context
    ) -> PrepareAnswer:
        """`ConnectGroupPrepareAssignment`'s answer as the serving loop sends it (`aio`): a
        prepared view as its bytes (`convert.prepare_response_bytes`), never built as a
        message."""

        def encode(answer: PrepareView | PrepareResponse) -> PrepareAnswer:
            return SerializedAnswer(
                convert.prepare_response_bytes(finish_prepare(answer)),
                coordinator_pb2.ConnectGroupPrepareAssignmentResponse,
            )

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
            tells_assignor=True,
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
            tells_assignor=True,
        )

    def ConnectGroupConfigs(
        self, request: coordinator_pb2.ConnectGroupConfigsRequest, context: Context
    ) -> coordinator_pb2.ConnectGroupConfigsResponse:
        """The configs of what the caller's member holds (DESIGN 3.20): MEMBER on the group,
        the member's own principal, --max-member-calls-per-s. Writes nothing."""
        return self._serve(
            "ConnectGroupConfigs",
            context,
            request,
            lifecycle_wire.configs_request_from,
            configs,
            lifecycle_wire.configs_response_to,
            functools.partial(convert.error_answer, coordinator_pb2.ConnectGroupConfigsResponse),
            Operation.MEMBER,
            quota=self.quotas.member_calls.take,
        )

    def ConnectGroupReportStatus(
        self, request: coordinator_pb2.ConnectGroupReportStatusRequest, context: Context
    ) -> coordinator_pb2.ConnectGroupReportStatusResponse:
        """Statuses from the holders (DESIGN 3.20): access and rate as ConnectGroupConfigs."""
        return self._serve(
            "ConnectGroupReportStatus",
            context,
            request,
            _report_request,
            report_status,
            lifecycle_wire.report_response_to,
            functools.partial(
                convert.error_answer, coordinator_pb2.ConnectGroupReportStatusResponse
            ),
            Operation.MEMBER,
            quota=self.quotas.member_calls.take,
        )


def _report_request(
    msg: coordinator_pb2.ConnectGroupReportStatusRequest,
) -> ReportStatusRequest:
    """The request as a value; a state a holder may not report is INVALID_REQUEST."""
    try:
        return lifecycle_wire.report_request_from(msg)
    except lifecycle_wire.UnknownReportedState as error:
        raise InvalidRequest(str(error)) from None


def _has_field(message: object, name: str) -> bool:
    descriptor = getattr(message, "DESCRIPTOR", None)
    return descriptor is not None and name in getattr(descriptor, "fields_by_name", {})


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

    def PauseConnector(
        self, request: admin_pb2.PauseConnectorRequest, context: Context
    ) -> admin_pb2.PauseConnectorResponse:
        answer: admin_pb2.PauseConnectorResponse = self._target_state(
            "PauseConnector", request, context, TargetState.PAUSED, admin_pb2.PauseConnectorResponse
        )
        return answer

    def ResumeConnector(
        self, request: admin_pb2.ResumeConnectorRequest, context: Context
    ) -> admin_pb2.ResumeConnectorResponse:
        answer: admin_pb2.ResumeConnectorResponse = self._target_state(
            "ResumeConnector",
            request,
            context,
            TargetState.STARTED,
            admin_pb2.ResumeConnectorResponse,
        )
        return answer

    def StopConnector(
        self, request: admin_pb2.StopConnectorRequest, context: Context
    ) -> admin_pb2.StopConnectorResponse:
        answer: admin_pb2.StopConnectorResponse = self._target_state(
            "StopConnector", request, context, TargetState.STOPPED, admin_pb2.StopConnectorResponse
        )
        return answer

    def _target_state(
        self,
        rpc: str,
        request: convert.TargetStateMessage,
        context: Context,
        target: TargetState,
        answer: Callable[..., Any],
    ) -> Any:
        """Pause-, Resume- and StopConnector (DESIGN 3.20): ALTER on the group."""
        return self._serve(
            rpc,
            context,
            request,
            lambda msg: convert.target_state_request(msg, target, context.peer()),
            set_target_state,
            functools.partial(convert.target_state_response, answer),
            functools.partial(convert.error_answer, answer),
            Operation.ALTER,
        )

    def RestartConnector(
        self, request: admin_pb2.RestartConnectorRequest, context: Context
    ) -> admin_pb2.RestartConnectorResponse:
        """Restarts (DESIGN 3.20, KIP-745): ALTER on the group."""
        return self._serve(
            "RestartConnector",
            context,
            request,
            lambda msg: convert.restart_request(msg, context.peer()),
            restart_connector,
            convert.restart_response,
            functools.partial(convert.error_answer, admin_pb2.RestartConnectorResponse),
            Operation.ALTER,
        )

    def DeleteGroup(
        self, request: admin_pb2.DeleteGroupRequest, context: Context
    ) -> admin_pb2.DeleteGroupResponse:
        """DeleteGroup (DESIGN 3.20): DELETE on the group."""
        return self._serve(
            "DeleteGroup",
            context,
            request,
            lambda msg: convert.delete_group_request(msg, context.peer()),
            delete_group,
            convert.delete_group_response,
            functools.partial(convert.error_answer, admin_pb2.DeleteGroupResponse),
            Operation.DELETE,
        )

    def RemoveMember(
        self, request: admin_pb2.RemoveMemberRequest, context: Context
    ) -> admin_pb2.RemoveMemberResponse:
        """RemoveMember (DESIGN 3.20): ALTER on the group (an operator's act)."""
        return self._serve(
            "RemoveMember",
            context,
            request,
            lambda msg: convert.remove_member_request(msg, context.peer()),
            remove_member,
            convert.remove_member_response,
            functools.partial(convert.error_answer, admin_pb2.RemoveMemberResponse),
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
        """One entry per requested id, in order, at a cost bounded by the limits rather than by
        the request: an id named again, an id past --max-describe-groups, and every group after
        the answer's running size reached --max-message-bytes get an error entry without being
        read; groups that do not exist are found by one read (no lease taken for them); the
        rest are described one by one on this thread."""
        out = admin_pb2.DescribeGroupsResponse()
        add = out.groups.add
        config_values = request.include_config_values
        try:
            principal = self._principal(context)
        except CoordinatorError as error:
            for group_id in request.group_ids:
                add(group_id=group_id, error_code=int(error.code), error_message=error.message)
            return out
        entries = self._screen_describe(request.group_ids, principal, config_values)
        wanted = [group_id for group_id, error in entries if error is None]
        unavailable: tuple[int, str] | None = None
        existing: set[str] = set()
        try:
            existing = self.manager.existing_groups(wanted) if wanted else set()
        except CoordinatorError as error:
            unavailable = int(error.code), error.message
        budget = self.defaults.max_message_bytes - DESCRIBE_ANSWER_RESERVE_BYTES
        full = (
            int(ErrorCode.POLICY_VIOLATION),
            f"the answer reached --max-message-bytes ({self.defaults.max_message_bytes:,}) "
            "before this group; describe it in another call.",
        )
        size = 0
        filled = False
        for group_id, screened in entries:
            refusal = screened
            if refusal is None:
                if not context.is_active():
                    break  # the caller gave up: describe no more
                if filled:
                    refusal = full
                elif unavailable is not None:
                    refusal = unavailable
                elif group_id not in existing:
                    refusal = (
                        int(ErrorCode.GROUP_ID_NOT_FOUND),
                        f"group {group_id!r} does not exist.",
                    )
                else:
                    # Described in place: appending a described 100,000-task group copied it.
                    entry = out.groups.add()
                    described = self._describe(
                        group_id, context, config_values, request.include_status, entry
                    )
                    if described is not entry:  # refused: a small answer
                        entry.CopyFrom(described)
                    grows = entry.ByteSize() + ENTRY_OVERHEAD_BYTES
                    if size + grows <= budget:
                        size += grows
                        continue
                    del out.groups[-1]
                    filled, refusal = True, full
            code, message = refusal
            size += len(group_id.encode()) + len(message.encode()) + ENTRY_OVERHEAD_BYTES + 6
            add(group_id=group_id, error_code=code, error_message=message)
        return out

    def _screen_describe(
        self, group_ids: Sequence[str], principal: str, config_values: bool
    ) -> list[tuple[str, tuple[int, str] | None]]:
        """Each requested id with its error (code, message), or None for a group to describe:
        O(1) per id and nothing read (a repeat, an id past the limit, a bad id, a denied
        caller). Errors are counted in `coordinator_errors` as other answers are."""
        limit = self.defaults.max_describe_groups
        past = (
            int(ErrorCode.POLICY_VIOLATION),
            f"over --max-describe-groups ({limit:,} ids per call)",
        )
        repeat = int(ErrorCode.INVALID_REQUEST), "named before in this call"
        seen: set[str] = set()
        screened: list[tuple[str, tuple[int, str] | None]] = []
        refused: Counter[str] = Counter()
        for index, group_id in enumerate(group_ids):
            if index >= limit:
                screened.append((group_id, past))
                refused[ErrorCode.POLICY_VIOLATION.name] += 1
                continue
            if group_id in seen:
                screened.append((group_id, repeat))
                refused[ErrorCode.INVALID_REQUEST.name] += 1
                continue
            seen.add(group_id)
            try:
                validate_group_id(group_id)
                self._authorize("DescribeGroups", principal, Operation.DESCRIBE, group_id)
                if config_values:
                    self._may_see_config_values(principal, group_id)
            except CoordinatorError as error:
                screened.append((group_id, (int(error.code), error.message)))
                refused[error.code.name] += 1
                continue
            screened.append((group_id, None))
        for code_name, n in refused.items():
            self.manager.metrics.errors.labels("DescribeGroups", code_name).inc(n)
        return screened

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
        self,
        group_id: str,
        context: Context,
        config_values: bool = False,
        include_status: bool = False,
        into: admin_pb2.DescribedGroup | None = None,
    ) -> admin_pb2.DescribedGroup:
        """A group that exists, validated and authorized (`_screen_describe`), described by its
        owner (this process, taking its lease if it is free), into `into` if given (a refusal
        is a message of its own)."""

        def describe(
            state: GroupState | None, now: int
        ) -> Result[Callable[[], admin_pb2.DescribedGroup]]:
            if state is None:
                missing = _describe_error(
                    group_id, ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id!r} does not exist."
                )
                return Result([], lambda: missing)
            selection = current_selection(state, self.defaults)
            if isinstance(selection, NoSelection):
                reason, name = selection.reason, ""
            else:
                reason, name = "", selection.assignor_name
            # Only a copy of the maps under the group's lock; the answer is built after it.
            # Statuses read the owner indexes, which the view shares: copied here too.
            view = state.read_view()
            owners = Owners.of(state, copy=True) if include_status else None
            return Result(
                [],
                lambda: convert.described_group(
                    view,
                    self.defaults,
                    now,
                    reason,
                    name,
                    config_values,
                    None if owners is None else status_views(view, owners),
                    into,
                ),
            )

        def call() -> admin_pb2.DescribedGroup:
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
            if request.page_size < 0:
                raise InvalidRequest(f"page_size must be >= 0, not {request.page_size}.")
            after = convert.acl_page_token(request.page_token)
            size = DEFAULT_PAGE_SIZE if request.page_size <= 0 else request.page_size
            size = min(size, MAX_PAGE_SIZE)
            rows = self.manager.store.acls.page(request.principal or None, after, size + 1)
            more = len(rows) > size
            page = rows[:size]
            return convert.listed_acls(
                (entry for _, entry in page), str(page[-1][0]) if more else ""
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
            caller = AclCaller(self._principal(context), context.peer(), rpc)
            acls = self.manager.store.acls
            changed = acls.add(entry, caller) if add else acls.remove(entry, caller) > 0
            assert self.authorizer is not None
            self.authorizer.refresh()  # this coordinator at once; the others within a refresh
            log.info(
                "ACL %s by %s from %s: %s",
                ("added" if add else "removed") if changed else "unchanged",
                caller.principal,
                caller.address,
                entry.describe(),
                extra=fields(
                    event="acl_changed",
                    rpc=rpc,
                    changed=changed,
                    principal=caller.principal,
                    peer=caller.address,
                ),
            )
            return answer(changed=changed)

        return self._run(rpc, call, functools.partial(convert.error_answer, answer))

    # --- cluster features (DESIGN 3.19 "Feature flag") ---

    def DescribeFeatures(
        self, request: admin_pb2.DescribeFeaturesRequest, context: Context
    ) -> admin_pb2.DescribeFeaturesResponse:
        def call() -> admin_pb2.DescribeFeaturesResponse:
            self._authorize_cluster(
                "DescribeFeatures",
                self._principal(context),
                Operation.DESCRIBE,
                "to describe the features",
            )
            return convert.described_features(self.features.levels)

        return self._run(
            "DescribeFeatures",
            call,
            functools.partial(convert.error_answer, admin_pb2.DescribeFeaturesResponse),
        )

    def UpdateFeatures(
        self, request: admin_pb2.UpdateFeaturesRequest, context: Context
    ) -> admin_pb2.UpdateFeaturesResponse:
        """Authorized first (a refused caller learns nothing of the features), then validated,
        then set in the database with its event, and applied here at once."""

        def call() -> admin_pb2.UpdateFeaturesResponse:
            principal = self._principal(context)
            self._authorize_cluster(
                "UpdateFeatures", principal, Operation.ALTER, "to change a feature's level"
            )
            feature = check_update(request.feature, request.level)
            caller = AclCaller(principal, context.peer(), "UpdateFeatures")
            change = self.manager.store.features.set_level(
                feature.name,
                request.level,
                feature.default_level,
                caller,
                validate_only=request.validate_only,
            )
            if change.changed and not request.validate_only:
                self.features.refresh()  # this coordinator at once; the others within a refresh
                log.warning(
                    "feature %s set to level %d (was %d) by %s from %s",
                    feature.name,
                    change.level,
                    change.previous_level,
                    caller.principal,
                    caller.address,
                    extra=fields(
                        event="feature_updated",
                        feature=feature.name,
                        level=change.level,
                        previous=change.previous_level,
                        principal=caller.principal,
                        peer=caller.address,
                    ),
                )
            return convert.updated_feature(change)

        return self._run(
            "UpdateFeatures",
            call,
            functools.partial(convert.error_answer, admin_pb2.UpdateFeaturesResponse),
        )
