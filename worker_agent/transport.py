"""The agent's transport to its group's coordinator: the gRPC channel (with its message limits),
calls with deadlines, FindCoordinator and failover to another address, and typed errors.

A call that gets no answer raises `TransportError`, which carries the gRPC status code, the method
and gRPC's message, and says which kind of failure it was (`Failure`): callers decide on the kind,
never on text. A call that fails with RESOURCE_EXHAUSTED (a message over a limit, here or at the
coordinator) will fail the same way until someone raises a limit: that condition is logged once
when it starts and once when it ends, naming the flags that raise the limits; `Backoff` times the
caller's retries.
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from connect.group.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    classic_pb2,
    classic_pb2_grpc,
    coordinator_pb2,
    coordinator_pb2_grpc,
)

from connect_protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, channel_options
from connect_protocol.tls import ClientTls, TlsConfigError, plaintext_problem

from . import wire

log = logging.getLogger("worker_agent")

HEARTBEAT = "ConnectGroupHeartbeat"
PREPARE_ASSIGNMENT = "ConnectGroupPrepareAssignment"
INSTALL_ASSIGNMENT = "ConnectGroupInstallAssignment"
CONFIGS = "ConnectGroupConfigs"
REPORT_STATUS = "ConnectGroupReportStatus"
FIND_COORDINATOR = "FindCoordinator"
JOIN_GROUP = "JoinGroup"
SYNC_GROUP = "SyncGroup"
CLASSIC_HEARTBEAT = "Heartbeat"
LEAVE_GROUP = "LeaveGroup"


class Failure(enum.Enum):
    """What kind of failure a `TransportError` is."""

    UNAVAILABLE = "unavailable"  # no connection (coordinator down, address wrong, network)
    DEADLINE = "deadline"  # no answer before the call's deadline
    RESOURCE_EXHAUSTED = "resource exhausted"  # a message over a size limit, here or there
    OTHER = "other"


_FAILURES = {
    grpc.StatusCode.UNAVAILABLE: Failure.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: Failure.DEADLINE,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Failure.RESOURCE_EXHAUSTED,
}


class TransportError(Exception):
    """A call to the coordinator got no answer.

    `code` is gRPC's status code (None if the error had none), `method` the RPC's name, `message`
    gRPC's details. `str()` is "CODE: message", as the log lines show it."""

    def __init__(self, method: str, code: grpc.StatusCode | None, message: str) -> None:
        super().__init__(method, code, message)
        self.method = method
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, method: str, error: grpc.RpcError) -> TransportError:
        code = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(
            method,
            code if isinstance(code, grpc.StatusCode) else None,
            details if isinstance(details, str) else str(details),
        )

    @property
    def kind(self) -> Failure:
        return _FAILURES.get(self.code, Failure.OTHER)

    @property
    def too_large(self) -> bool:
        """Whether a message exceeded a size limit (RESOURCE_EXHAUSTED)."""
        return self.kind is Failure.RESOURCE_EXHAUSTED

    def __str__(self) -> str:
        return f"{getattr(self.code, 'name', self.code)}: {self.message}"


class Backoff:
    """Exponential backoff with jitter: each wait is a random time between half and all of the
    current step, which starts at `initial_s` and doubles up to `max_s`."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        if initial_s <= 0 or max_s < initial_s:
            raise ValueError("need 0 < initial_s <= max_s")
        self._initial_s = initial_s
        self._max_s = max_s
        self._step_s = initial_s

    def next_wait_s(self) -> float:
        wait_s = self._step_s * (0.5 + 0.5 * random.random())
        self._step_s = min(self._step_s * 2, self._max_s)
        return wait_s

    def reset(self) -> None:
        self._step_s = self._initial_s


class PlaintextRefused(Exception):
    """A plaintext connection to a non-loopback address without --allow-plaintext."""


class Connection:
    """A channel to one coordinator address, with its stubs: TLS with `tls` (from its files as
    they are now, see `stamp`), else plaintext, which only goes to loopback addresses unless
    `allow_plaintext`."""

    def __init__(
        self,
        address: str,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tls: ClientTls | None = None,
        allow_plaintext: bool = False,
    ) -> None:
        self.address = address
        options = channel_options(max_message_bytes)
        if tls is None:
            problem = plaintext_problem(address, allow_plaintext, "--allow-plaintext")
            if problem is not None:
                raise PlaintextRefused(problem)
            self.stamp: tuple[tuple[int, int], ...] = ()
            self.channel = grpc.insecure_channel(address, options=options)
        else:
            self.stamp = tls.stamp()
            self.channel = grpc.secure_channel(
                address,
                grpc.ssl_channel_credentials(*tls.pem()),
                options=[*options, *tls.channel_options()],
            )
        self.coordinator = coordinator_pb2_grpc.ConnectGroupCoordinatorStub(self.channel)
        self.admin = admin_pb2_grpc.ConnectGroupAdminStub(self.channel)
        self.classic = classic_pb2_grpc.ConnectGroupClassicStub(self.channel)

    def close(self) -> None:
        self.channel.close()


class Transport:
    """The connection to the group's coordinator, which `find_coordinator` may move to another of
    `addresses` (tried in order). Every channel sends and accepts messages of up to
    `max_message_bytes`."""

    def __init__(
        self,
        addresses: Sequence[str],
        max_message_bytes: int,
        tls: ClientTls | None = None,
        allow_plaintext: bool = False,
    ) -> None:
        if not addresses:
            raise ValueError("at least one coordinator address is needed")
        self._addresses = tuple(addresses)
        self._max_message_bytes = max_message_bytes
        self._tls = tls
        self._allow_plaintext = allow_plaintext
        self._connection = self._connect(self._addresses[0])
        self._too_large: set[str] = set()  # RPCs whose last call failed with RESOURCE_EXHAUSTED

    @property
    def address(self) -> str:
        """The address of the coordinator the calls go to."""
        return self._connection.address

    def close(self) -> None:
        self._connection.close()

    def _connect(self, address: str) -> Connection:
        return Connection(address, self._max_message_bytes, self._tls, self._allow_plaintext)

    def _fresh(self) -> None:
        """Reopen the channel when the TLS files changed since it was opened (a rotated client
        certificate), so that the next connection presents the new one. A file caught half
        written keeps the old channel until the next call."""
        if self._tls is None or self._tls.stamp() == self._connection.stamp:
            return
        try:
            fresh = self._connect(self._connection.address)
        except TlsConfigError as error:
            log.warning("TLS files changed but cannot be used yet: %s", error)
            return
        log.info("TLS files changed: reconnecting to %s with them", fresh.address)
        old, self._connection = self._connection, fresh
        old.close()

    # --- calls -----------------------------------------------------------------------------

    def heartbeat(
        self, request: coordinator_pb2.ConnectGroupHeartbeatRequest, timeout_s: float
    ) -> coordinator_pb2.ConnectGroupHeartbeatResponse:
        answer: coordinator_pb2.ConnectGroupHeartbeatResponse = self._call(
            HEARTBEAT, lambda c: c.coordinator.ConnectGroupHeartbeat, request, timeout_s
        )
        return answer

    def prepare_assignment(
        self, request: coordinator_pb2.ConnectGroupPrepareAssignmentRequest, timeout_s: float
    ) -> coordinator_pb2.ConnectGroupPrepareAssignmentResponse:
        answer: coordinator_pb2.ConnectGroupPrepareAssignmentResponse = self._call(
            PREPARE_ASSIGNMENT,
            lambda c: c.coordinator.ConnectGroupPrepareAssignment,
            request,
            timeout_s,
        )
        return answer

    def install_assignment(
        self, request: coordinator_pb2.ConnectGroupInstallAssignmentRequest, timeout_s: float
    ) -> coordinator_pb2.ConnectGroupInstallAssignmentResponse:
        answer: coordinator_pb2.ConnectGroupInstallAssignmentResponse = self._call(
            INSTALL_ASSIGNMENT,
            lambda c: c.coordinator.ConnectGroupInstallAssignment,
            request,
            timeout_s,
        )
        return answer

    # --- the connector lifecycle (DESIGN 3.20) ----------------------------------------------

    def configs(
        self, request: coordinator_pb2.ConnectGroupConfigsRequest, timeout_s: float
    ) -> coordinator_pb2.ConnectGroupConfigsResponse:
        answer: coordinator_pb2.ConnectGroupConfigsResponse = self._call(
            CONFIGS, lambda c: c.coordinator.ConnectGroupConfigs, request, timeout_s
        )
        return answer

    def report_status(
        self, request: coordinator_pb2.ConnectGroupReportStatusRequest, timeout_s: float
    ) -> coordinator_pb2.ConnectGroupReportStatusResponse:
        answer: coordinator_pb2.ConnectGroupReportStatusResponse = self._call(
            REPORT_STATUS, lambda c: c.coordinator.ConnectGroupReportStatus, request, timeout_s
        )
        return answer

    # --- the classic protocol (DESIGN 3.19; the agent's classic mode) ------------------------

    def join_group(
        self, request: classic_pb2.JoinGroupRequest, timeout_s: float
    ) -> classic_pb2.JoinGroupResponse:
        """JoinGroup: may be held until the group's join phase ends (its deadline is the
        rebalance timeout plus Kafka's 5 s lapse)."""
        answer: classic_pb2.JoinGroupResponse = self._call(
            JOIN_GROUP, lambda c: c.classic.JoinGroup, request, timeout_s
        )
        return answer

    def sync_group(
        self, request: classic_pb2.SyncGroupRequest, timeout_s: float
    ) -> classic_pb2.SyncGroupResponse:
        """SyncGroup: a follower's may be held until the leader's assignments arrive."""
        answer: classic_pb2.SyncGroupResponse = self._call(
            SYNC_GROUP, lambda c: c.classic.SyncGroup, request, timeout_s
        )
        return answer

    def classic_heartbeat(
        self, request: classic_pb2.HeartbeatRequest, timeout_s: float
    ) -> classic_pb2.HeartbeatResponse:
        answer: classic_pb2.HeartbeatResponse = self._call(
            CLASSIC_HEARTBEAT, lambda c: c.classic.Heartbeat, request, timeout_s
        )
        return answer

    def leave_group(
        self, request: classic_pb2.LeaveGroupRequest, timeout_s: float
    ) -> classic_pb2.LeaveGroupResponse:
        answer: classic_pb2.LeaveGroupResponse = self._call(
            LEAVE_GROUP, lambda c: c.classic.LeaveGroup, request, timeout_s
        )
        return answer

    def _call(
        self,
        rpc: str,
        method: Callable[[Connection], Callable[..., Any]],
        request: Any,
        timeout_s: float,
    ) -> Any:
        """One call of `method(connection)` with a deadline; no answer raises `TransportError`
        (after noting it)."""
        self._fresh()
        try:
            answer = method(self._connection)(request, timeout=timeout_s)
        except grpc.RpcError as error:
            failure = TransportError.from_rpc_error(rpc, error)
            self._note_call(rpc, failure)
            raise failure from error
        self._note_call(rpc, None)
        return answer

    # --- RESOURCE_EXHAUSTED ----------------------------------------------------------------

    def _note_call(self, rpc: str, error: TransportError | None) -> None:
        """Record how a call of `rpc` ended (`error` None: it was answered). Logs when its
        calls start failing with RESOURCE_EXHAUSTED and when they stop."""
        if error is not None and error.too_large:
            if rpc not in self._too_large:
                self._too_large.add(rpc)
                log.error(
                    "%s failed: a message exceeded the gRPC message size limit (%s). Retrying "
                    "with backoff; logged again only once it works. %s",
                    rpc,
                    error,
                    self._raise_limit_hint(error),
                )
        elif error is None and rpc in self._too_large:
            self._too_large.discard(rpc)
            log.warning("%s works again: its messages fit the size limit", rpc)

    def _raise_limit_hint(self, error: TransportError) -> str:
        """Which flag raises the limit that was hit (gRPC's details say whose it was)."""
        agent = (
            "`worker-agent run --max-message-bytes` (WORKER_AGENT_MAX_MESSAGE_BYTES, now "
            f"{self._max_message_bytes})"
        )
        coordinator = "`coordinator-svc serve --max-message-bytes` (COORDINATOR_MAX_MESSAGE_BYTES)"
        if error.message.startswith("CLIENT:"):
            return f"It is this agent's limit: raise it with {agent}."
        if error.message.startswith("SERVER:"):
            return f"It is the coordinator's limit: raise it with {coordinator}."
        return f"Raise the limits with {agent} and {coordinator}; both sides must allow it."

    # --- discovery -------------------------------------------------------------------------

    def find_coordinator(
        self, group_id: str, reason: str, timeout_s: Callable[[], float]
    ) -> str | None:
        """Ask FindCoordinator at the current address, then at the others in order, and
        reconnect to the first answer if it is another address. Each call's deadline is
        `timeout_s()` at the time. Returns the coordinator found (None: none answered)."""
        log.info("looking for the coordinator of %s (%s)", group_id, reason)
        candidates = [self._connection.address] + [
            a for a in self._addresses if a != self._connection.address
        ]
        found: str | None = None
        for address in candidates:
            connection = (
                self._connection if address == self._connection.address else self._connect(address)
            )
            resp = self._ask_find_coordinator(connection, group_id, timeout_s())
            if connection is not self._connection:
                connection.close()
            if resp is not None and resp.error_code == 0 and resp.host:
                found = f"{resp.host}:{resp.port}"
                break
        if found is not None and found != self._connection.address:
            log.info("coordinator of %s is %s; reconnecting", group_id, found)
            try:
                fresh = self._connect(found)
            except (PlaintextRefused, TlsConfigError) as error:
                log.error("cannot connect to the coordinator found at %s: %s", found, error)
                return None
            old, self._connection = self._connection, fresh
            old.close()
        return found

    @staticmethod
    def _ask_find_coordinator(
        connection: Connection, group_id: str, timeout_s: float
    ) -> admin_pb2.FindCoordinatorResponse | None:
        """FindCoordinator at one address; None (logged) if it got no answer. Not counted in
        the RESOURCE_EXHAUSTED notices: a failing address is skipped, not retried."""
        try:
            answer: admin_pb2.FindCoordinatorResponse = connection.admin.FindCoordinator(
                wire.find_coordinator_request(group_id), timeout=timeout_s
            )
        except grpc.RpcError as rpc_error:
            error = TransportError.from_rpc_error(FIND_COORDINATOR, rpc_error)
            log.warning("FindCoordinator at %s failed: %s", connection.address, error)
            return None
        return answer
