"""The classic group protocol's servicer (`ConnectGroupClassic`, DESIGN 3.19), synchronous, run on
a pool thread by `aio.AsyncClassicServicer`: decode, validate (the core's classic validation,
once, before any ownership step), check lengths against the server's limits, authorize MEMBER on
the group, take a join token for a JoinGroup that makes a member, run the core handler through
the GroupManager, encode.

A JoinGroup or SyncGroup whose handler answers `Parked` is returned as is: the event loop
waits for its wakeup (`runtime.parking`), holding no thread, and encodes what it gets
(`answer_parked`, `park_expired`). Errors are in-band, as in `servicers`.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from connect.group.v1 import classic_pb2, classic_pb2_grpc

from connect_protocol import classic_wire
from connect_protocol.classic_messages import (
    ClassicHeartbeatRequest,
    ClassicHeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    SyncGroupRequest,
    SyncGroupResponse,
)
from connect_protocol.errors import ErrorCode, InvalidRequest

from ..core import classic_heartbeat, classic_join, classic_sync
from ..core.acls import Operation
from ..core.classic_validation import (
    validate_classic_heartbeat,
    validate_join,
    validate_leave,
    validate_sync,
)
from ..core.model import GroupState
from ..core.results import WAKE_JOIN, Parked, Result
from ..runtime.groups import Steady
from ..runtime.parking import ParkFailure
from . import convert
from .connection_age import DEFAULT_MAX_CONNECTION_AGE_GRACE_MS, park_limit_ms
from .context import Context
from .servicers import _Base

M = TypeVar("M")  # a request message
R = TypeVar("R")  # a response message

#: Error codes that are the protocol's ordinary flow, not failures (not counted as errors).
FLOW_CODES = frozenset({ErrorCode.NONE, ErrorCode.MEMBER_ID_REQUIRED})

#: What a heartbeat answered on the loop may say (anything else goes to the full path).
STEADY_CODES = frozenset({ErrorCode.NONE, ErrorCode.REBALANCE_IN_PROGRESS})

ClassicRequest = JoinGroupRequest | SyncGroupRequest | ClassicHeartbeatRequest | LeaveGroupRequest


def _steady_classic_rule(req: ClassicHeartbeatRequest) -> Steady:
    """A classic heartbeat never writes and never hands out resources: worth trying outside a
    batch when its member is a classic member of the group and names the group's generation
    (in a connect group: its own member epoch); else it is an error answer, reported on the
    full path. O(1)."""

    def worth_trying(state: GroupState | None) -> bool:
        if state is None:
            return False
        member = state.members.get(req.member_id)
        if member is None or member.classic is None:
            return False
        if not state.meta.is_classic:  # a classic member of a connect group (3.19)
            return req.generation_id == member.member_epoch
        return req.generation_id == state.group_epoch

    return Steady(lambda _response: False, worth_trying)


class ClassicServicer(_Base, classic_pb2_grpc.ConnectGroupClassicServicer):  # type: ignore[misc]
    """`max_connection_age_ms` / `max_connection_age_grace_ms`: the server's connection age, which
    bounds how long a call may stay parked (`connection_age.park_limit_ms`)."""

    def __init__(
        self,
        *args: Any,
        max_connection_age_ms: int = 0,
        max_connection_age_grace_ms: int = DEFAULT_MAX_CONNECTION_AGE_GRACE_MS,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.max_connection_age_ms = max_connection_age_ms
        self.max_connection_age_grace_ms = max_connection_age_grace_ms

    # --- the four RPCs (on a pool thread) ---

    def JoinGroup(
        self, request: classic_pb2.JoinGroupRequest, context: Context
    ) -> classic_pb2.JoinGroupResponse | Parked:
        def handle(state: GroupState | None, **kwargs: Any) -> Result[Any]:
            # A fresh id per run: only a MEMBER_ID_REQUIRED answer uses it.
            return classic_join.join_group(state, new_member_id=str(uuid.uuid4()), **kwargs)

        return self._serve_classic(
            "JoinGroup",
            context,
            request,
            classic_wire.join_request_from_wire,
            lambda req: validate_join(req, self.defaults),
            handle,
            classic_wire.join_response_to_wire,
            self._join_failure(request),
            joins=True,
        )

    def SyncGroup(
        self, request: classic_pb2.SyncGroupRequest, context: Context
    ) -> classic_pb2.SyncGroupResponse | Parked:
        return self._serve_classic(
            "SyncGroup",
            context,
            request,
            classic_wire.sync_request_from_wire,
            validate_sync,
            classic_sync.sync_group,
            classic_wire.sync_response_to_wire,
            functools.partial(convert.error_answer, classic_pb2.SyncGroupResponse),
        )

    def Heartbeat(
        self, request: classic_pb2.HeartbeatRequest, context: Context
    ) -> classic_pb2.HeartbeatResponse:
        answer = self._serve_classic(
            "Heartbeat",
            context,
            request,
            classic_wire.heartbeat_request_from_wire,
            validate_classic_heartbeat,
            classic_heartbeat.heartbeat,
            classic_wire.heartbeat_response_to_wire,
            functools.partial(convert.error_answer, classic_pb2.HeartbeatResponse),
            steady=True,
        )
        assert not isinstance(answer, Parked)  # a heartbeat never parks
        return answer

    def LeaveGroup(
        self, request: classic_pb2.LeaveGroupRequest, context: Context
    ) -> classic_pb2.LeaveGroupResponse:
        answer = self._serve_classic(
            "LeaveGroup",
            context,
            request,
            classic_wire.leave_request_from_wire,
            validate_leave,
            classic_heartbeat.leave_group,
            classic_wire.leave_response_to_wire,
            functools.partial(convert.error_answer, classic_pb2.LeaveGroupResponse),
        )
        assert not isinstance(answer, Parked)  # a leave never parks
        return answer

    # --- the steady heartbeat (on the event loop) ---

    def steady_heartbeat(
        self, request: classic_pb2.HeartbeatRequest, principal: str
    ) -> classic_pb2.HeartbeatResponse | None:
        """The answer to a classic heartbeat worked out at once on the calling thread (the
        event loop), without waiting for the group's lock or touching the database
        (`GroupManager.execute_if_steady`); None when it needs `Heartbeat` on the pool, which
        does all of it again (errors are reported there)."""
        try:
            req = classic_wire.heartbeat_request_from_wire(request)
            validate_classic_heartbeat(req)
            self._check_lengths(req)
            if not self._allowed(principal, Operation.MEMBER, req.group_id):
                return None  # denied: answered (and counted) on the full path

            def handle(state: GroupState | None, now: int) -> Result[ClassicHeartbeatResponse]:
                return classic_heartbeat.heartbeat(
                    state,
                    req=req,
                    now_ms=now,
                    defaults=self.defaults,
                    validated=True,
                    principal=principal,
                )

            outcome = self.manager.execute_if_steady(
                req.group_id, handle, req.member_id, _steady_classic_rule(req)
            )
        except Exception:
            return None
        done, resp = outcome
        if not done or resp is None or resp.error_code not in STEADY_CODES:
            return None  # an error: answered (and counted) on the full path
        return classic_wire.heartbeat_response_to_wire(resp)

    # --- parked calls (their answer is encoded on the event loop) ---

    def park_limit_s(self, kind: str, request: Any) -> float:
        """How long the parked call may wait (`connection_age.park_limit_ms`): a JoinGroup by
        the rebalance timeout it sent, a SyncGroup by its member's (read lock-free; the
        default when the member is not in memory)."""
        if kind == WAKE_JOIN:
            rebalance_ms = int(request.rebalance_timeout_ms)
        else:
            state = self.manager.peek(request.group_id)
            member = None if state is None else state.members.get(request.member_id)
            rebalance_ms = (
                member.rebalance_timeout_ms
                if member is not None
                else self.defaults.rebalance_timeout_ms
            )
        limit = park_limit_ms(
            rebalance_ms, self.max_connection_age_ms, self.max_connection_age_grace_ms
        )
        return limit / 1000

    def answer_parked(self, kind: str, request: Any, delivered: Any) -> Any:
        """The wire answer to a parked call: its wakeup's core response, or a `ParkFailure`
        (the group was let go, the process is stopping)."""
        rpc = "JoinGroup" if kind == WAKE_JOIN else "SyncGroup"
        if isinstance(delivered, ParkFailure):
            return self._parked_error(rpc, kind, request, delivered.code, delivered.message)
        if isinstance(delivered, JoinGroupResponse):
            self._count(rpc, delivered.error_code)
            return classic_wire.join_response_to_wire(delivered)
        if isinstance(delivered, SyncGroupResponse):
            self._count(rpc, delivered.error_code)
            return classic_wire.sync_response_to_wire(delivered)
        return self._parked_error(  # a wakeup of the wrong type: a bug, never a crash
            rpc,
            kind,
            request,
            ErrorCode.UNKNOWN_SERVER_ERROR,
            f"internal error (a {type(delivered).__name__} woke a {rpc}); the coordinator's "
            "log has the details.",
        )

    def park_expired(self, kind: str, request: Any, waited_s: float) -> Any:
        """REBALANCE_IN_PROGRESS for a call parked past its park limit: its member asks again
        (a JoinGroup of a member that already joined waits again, or gets the generation)."""
        return self._parked_error(
            "JoinGroup" if kind == WAKE_JOIN else "SyncGroup",
            kind,
            request,
            ErrorCode.REBALANCE_IN_PROGRESS,
            f"the {'join' if kind == WAKE_JOIN else 'sync'} phase did not end within this "
            f"call's park limit ({waited_s:g} s: the rebalance timeout + 5 s, or the connection "
            "age grace - 1 s); send it again.",
        )

    def _parked_error(
        self, rpc: str, kind: str, request: Any, code: ErrorCode, message: str
    ) -> Any:
        self._count(rpc, code)
        if kind == WAKE_JOIN:
            return self._join_failure(request)(code, message)
        return convert.error_answer(classic_pb2.SyncGroupResponse, code, message)

    # --- the common path ---

    def _join_failure(
        self, request: classic_pb2.JoinGroupRequest
    ) -> Callable[[ErrorCode, str], classic_pb2.JoinGroupResponse]:
        return functools.partial(
            convert.error_answer, classic_pb2.JoinGroupResponse, member_id=request.member_id
        )

    def _count(self, rpc: str, code: ErrorCode) -> None:
        if code not in FLOW_CODES:
            self.manager.metrics.errors.labels(rpc, ErrorCode(code).name).inc()

    def _check_lengths(self, req: ClassicRequest) -> None:
        """The server's own limits on ids (--max-id-length) over the core's fixed maxima."""
        limit = self.defaults.max_id_length
        ids = [("GroupId", req.group_id)]
        if isinstance(req, LeaveGroupRequest):
            ids += [("Members.MemberId", m.member_id) for m in req.members]
        else:
            ids.append(("MemberId", req.member_id))
        for what, value in ids:
            if len(value) > limit:
                raise InvalidRequest(
                    f"{what} must be at most {limit} characters (--max-id-length)."
                )

    def _is_pending_id(self, group_id: str, member_id: str) -> bool:
        """Whether `member_id` is a MEMBER_ID_REQUIRED id of the group (read lock-free: the
        round's pending ids are only ever replaced key by key under the group's lock)."""
        state = self.manager.peek(group_id)
        return (
            state is not None and state.round is not None and member_id in state.round.pending_ids
        )

    def _serve_classic(
        self,
        rpc: str,
        context: Context,
        request: M,
        decode: Callable[[M], Any],
        validate: Callable[[Any], None],
        handle: Callable[..., Result[Any]],
        encode: Callable[[Any], R],
        failure: Callable[[ErrorCode, str], R],
        *,
        joins: bool = False,
        steady: bool = False,
    ) -> R | Parked:
        """As `servicers._Base._serve`, for a classic call. With `joins`, a JoinGroup naming a
        MEMBER_ID_REQUIRED id (the join that makes a member) takes a join token of its
        principal; an empty-id join and a member's rejoin never do. A `Parked` answer is
        returned as is (the caller waits for its wakeup)."""

        def call() -> R | Parked:
            req = decode(request)
            validate(req)
            self._check_lengths(req)
            group_id = req.group_id
            principal = self._principal(context)
            self._authorize(rpc, principal, Operation.MEMBER, group_id)
            if joins and req.member_id and self._is_pending_id(group_id, req.member_id):
                self.quotas.joins.take(principal)
            run = functools.partial(
                handle, req=req, defaults=self.defaults, validated=True, principal=principal
            )
            member_id = getattr(req, "member_id", None) or None
            resp = self.manager.execute(
                group_id,
                lambda state, now: run(state, now_ms=now),
                cancelled=lambda: not context.is_active(),
                on_create=functools.partial(self._may_create_group, principal),
                member_id=member_id,
                steady=_steady_classic_rule(req) if steady else None,
            )
            if isinstance(resp, Parked):
                return resp
            self._count(rpc, resp.error_code)
            if resp.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED:
                self._denied(rpc, principal, Operation.MEMBER, group_id)  # an id of another
            return encode(resp)

        return self._run(rpc, call, failure)
