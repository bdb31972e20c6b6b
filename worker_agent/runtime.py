"""The agent's runtime: drives the pure `Membership` machine with real gRPC, real listener calls
and a real clock.

One loop thread owns the machine's schedule: it polls the machine, sends heartbeats (each with a
deadline), asks FindCoordinator and reconnects. Listener calls run on a work thread, in order, with
retries (a failing hook leaves its revocation unacknowledged, DESIGN 2.3); an assignment
computation (Prepare, assign, Install) runs on a thread of its own, so heartbeats go on while
either is busy. Every access to the machine holds one lock.

Every channel sends and accepts messages of up to `AgentSettings.max_message_bytes`. A call that
fails with RESOURCE_EXHAUSTED (a message over a limit, here or at the coordinator) will fail the
same way until someone raises a limit, so it is not retried at once: an assignment computation
waits an exponentially growing, jittered time before it reports done (which would otherwise send
a heartbeat at once, be asked to compute again and loop), and the condition is logged once when it
starts and once when it ends, naming the flags that raise the limits.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
from connect.group.v1 import admin_pb2_grpc, coordinator_pb2_grpc

from connect_protocol import wire as protocol_wire
from connect_protocol.errors import ErrorCode
from connect_protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, channel_options
from connect_protocol.messages import Assignor
from connect_protocol.resources import EMPTY, ResourceSet

from . import wire
from .assignor import AssignmentResult, ConnectAssignor
from .listener import EventKind, RebalanceEvent, WorkerRebalanceListener, call_with_retry, dispatch
from .membership import (
    Action,
    ComputeAssignment,
    FindCoordinator,
    Membership,
    MembershipConfig,
    Phase,
    SendHeartbeat,
    StartWork,
    StopWork,
)
from .status import StatusServer

log = logging.getLogger("worker_agent")

RPC_TIMEOUT_S = 5.0
LEAVE_TIMEOUT_S = 10.0


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class AgentSettings:
    group_id: str
    member_id: str
    coordinators: tuple[str, ...]  # host:port, tried in order when looking for the coordinator
    assignors: tuple[ConnectAssignor, ...]
    rebalance_timeout_ms: int = 60_000
    instance_id: str | None = None
    url: str | None = None
    eager: bool = False
    rpc_timeout_s: float = RPC_TIMEOUT_S
    leave_timeout_s: float = LEAVE_TIMEOUT_S
    listener_initial_backoff_s: float = 0.1
    listener_max_backoff_s: float = 5.0
    #: The largest message the agent's channels send or accept.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: After an assignment computation failed with RESOURCE_EXHAUSTED: the first wait before
    #: it may be tried again, doubled (with jitter) after each further such failure, up to the cap.
    too_large_initial_backoff_s: float = 0.2
    too_large_max_backoff_s: float = 5.0


def advertised(assignors: Sequence[ConnectAssignor]) -> tuple[Assignor, ...]:
    """The heartbeat's client_assignors entries for these assignors, in priority order."""
    out = []
    for a in assignors:
        meta = a.metadata()
        out.append(
            Assignor(
                a.name,
                a.minimum_version,
                a.maximum_version,
                reason=meta.reason,
                version=meta.version,
                metadata=meta.metadata,
            )
        )
    return tuple(out)


class _Backoff:
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


class _Connection:
    """A channel to one coordinator address, with its stubs."""

    def __init__(self, address: str, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(address, options=channel_options(max_message_bytes))
        self.coordinator = coordinator_pb2_grpc.ConnectGroupCoordinatorStub(self.channel)
        self.admin = admin_pb2_grpc.ConnectGroupAdminStub(self.channel)

    def close(self) -> None:
        self.channel.close()


class Agent:
    """One worker's membership in one group. `run()` blocks until the agent has left.

    `stop()` (e.g. from a SIGTERM handler) makes it revoke everything, then leave."""

    def __init__(
        self,
        settings: AgentSettings,
        listener: WorkerRebalanceListener,
        status: StatusServer | None = None,
        clock_ms: Callable[[], int] = monotonic_ms,
    ) -> None:
        if not settings.coordinators:
            raise ValueError("at least one coordinator address is needed")
        self.settings = settings
        self.listener = listener
        self.status = status
        self._clock_ms = clock_ms
        self.machine = Membership(
            MembershipConfig(
                group_id=settings.group_id,
                member_id=settings.member_id,
                assignors=advertised(settings.assignors),
                rebalance_timeout_ms=settings.rebalance_timeout_ms,
                instance_id=settings.instance_id,
                url=settings.url,
                eager=settings.eager,
            )
        )
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop_requested = threading.Event()
        self._abandon = threading.Event()  # stop retrying listener calls: the process exits
        self._connection = self._connect(settings.coordinators[0])
        self._too_large_backoff = _Backoff(
            settings.too_large_initial_backoff_s, settings.too_large_max_backoff_s
        )
        self._too_large: set[str] = set()  # RPCs whose last call failed with RESOURCE_EXHAUSTED
        self._work = ThreadPoolExecutor(1, thread_name_prefix="listener")
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="assignor")
        self._last_installed_epoch = -1
        self._leave_deadline: float | None = None

    # --- control -------------------------------------------------------------------------

    def stop(self) -> None:
        """Revoke everything and leave the group (idempotent; safe from a signal handler)."""
        self._stop_requested.set()
        self._wake.set()

    def abandon(self) -> None:
        """Give up at once: stop retrying listener calls (second SIGTERM)."""
        self._abandon.set()
        self.stop()

    @property
    def phase(self) -> Phase:
        with self._lock:
            return self.machine.phase

    @property
    def fatal(self) -> str | None:
        """Why the agent stopped without being asked to (it must not rejoin as it was)."""
        with self._lock:
            return self.machine.fatal

    @property
    def running(self) -> ResourceSet:
        with self._lock:
            return self.machine.running

    @property
    def member_epoch(self) -> int:
        with self._lock:
            return self.machine.epoch

    def run(self) -> None:
        log.info(
            "agent starting: group %s, member %s, coordinator %s, assignors %s",
            self.settings.group_id,
            self.settings.member_id,
            self._connection.address,
            [f"{a.name}[{a.minimum_version}-{a.maximum_version}]" for a in self.settings.assignors],
        )
        try:
            self._loop()
        finally:
            self._work.shutdown(wait=True, cancel_futures=False)
            self._compute.shutdown(wait=True, cancel_futures=True)
            self._connection.close()
            if self.status is not None:
                self.status.set_not_ready("the agent has left the group")
            log.info(
                "agent stopped: member %s left group %s",
                self.settings.member_id,
                self.settings.group_id,
            )

    # --- the loop ------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            now = self._clock_ms()
            with self._lock:
                m = self.machine
                if self._stop_requested.is_set() and m.phase not in (Phase.LEAVING, Phase.LEFT):
                    log.info("leaving the group: stopping all work first")
                    m.leave(now)
                    self._leave_deadline = time.monotonic() + self.settings.leave_timeout_s
                if (
                    self._leave_deadline is not None
                    and time.monotonic() > self._leave_deadline
                    and m.phase is Phase.LEAVING
                    and not m.running
                ):
                    log.warning("could not deliver the leave in time; the session will expire")
                    m.give_up_leaving()
                actions = m.poll(now)
                for notice in m.drain_notices():
                    getattr(log, notice.level)(notice.message)
                if m.phase is Phase.LEFT and not actions:
                    return
                wake_at = m.next_wakeup_ms()
            if actions:
                # A heartbeat's answer is handled inside its dispatch: poll again at once, so
                # that what it asks for (stop, start, compute) is not left for the next wake-up.
                for action in actions:
                    self._dispatch(action)
                continue
            delay_ms = max(0, wake_at - self._clock_ms())
            if delay_ms > 0:
                self._wake.wait(timeout=delay_ms / 1000)
            self._wake.clear()

    def _dispatch(self, action: Action) -> None:
        match action:
            case SendHeartbeat(request=request):
                self._heartbeat(request)
            case StopWork() | StartWork():
                self._work.submit(self._listen, action)
            case ComputeAssignment():
                self._compute.submit(self._compute_assignment)
            case FindCoordinator(reason=reason):
                self._find_coordinator(reason)

    def _connect(self, address: str) -> _Connection:
        return _Connection(address, self.settings.max_message_bytes)

    # --- RESOURCE_EXHAUSTED ----------------------------------------------------------------

    def _note_call(self, rpc: str, error: grpc.RpcError | None) -> bool:
        """Record how a call of `rpc` ended (`error` None: it was answered). Logs when its
        calls start failing with RESOURCE_EXHAUSTED and when they stop; returns whether this
        one did."""
        too_large = error is not None and _status(error) is grpc.StatusCode.RESOURCE_EXHAUSTED
        if too_large and rpc not in self._too_large:
            self._too_large.add(rpc)
            assert error is not None
            log.error(
                "%s failed: a message exceeded the gRPC message size limit (%s). Retrying with "
                "backoff; logged again only once it works. %s",
                rpc,
                _rpc_error(error),
                self._raise_limit_hint(error),
            )
        elif not too_large and rpc in self._too_large and error is None:
            self._too_large.discard(rpc)
            log.warning("%s works again: its messages fit the size limit", rpc)
        return too_large

    def _raise_limit_hint(self, error: grpc.RpcError) -> str:
        """Which flag raises the limit that was hit (gRPC's details say whose it was)."""
        details = error.details() if hasattr(error, "details") else ""
        agent = (
            "`worker-agent run --max-message-bytes` (WORKER_AGENT_MAX_MESSAGE_BYTES, now "
            f"{self.settings.max_message_bytes})"
        )
        coordinator = "`coordinator-svc serve --max-message-bytes` (COORDINATOR_MAX_MESSAGE_BYTES)"
        if details and details.startswith("CLIENT:"):
            return f"It is this agent's limit: raise it with {agent}."
        if details and details.startswith("SERVER:"):
            return f"It is the coordinator's limit: raise it with {coordinator}."
        return f"Raise the limits with {agent} and {coordinator}; both sides must allow it."

    # --- heartbeats ------------------------------------------------------------------------

    def _call_timeout_s(self) -> float:
        """The call deadline: the configured one, but never past the self-fencing deadline (a
        hanging connection must not keep the loop from fencing in time)."""
        with self._lock:
            fence_at = self.machine.fence_deadline_ms()
        timeout = self.settings.rpc_timeout_s
        if fence_at is not None:
            timeout = min(timeout, max(0.05, (fence_at - self._clock_ms()) / 1000))
        return timeout

    def _heartbeat(self, request: Any) -> None:
        try:
            answer = self._connection.coordinator.ConnectGroupHeartbeat(
                protocol_wire.heartbeat_request_to_wire(request), timeout=self._call_timeout_s()
            )
        except grpc.RpcError as error:
            # The machine backs the next heartbeat off (at most a heartbeat interval apart), so
            # even a heartbeat that is too large is not retried in a tight loop.
            self._note_call("ConnectGroupHeartbeat", error)
            with self._lock:
                self.machine.on_heartbeat_failed(_rpc_error(error), self._clock_ms())
            return
        self._note_call("ConnectGroupHeartbeat", None)
        response = protocol_wire.heartbeat_response_from_wire(answer)
        with self._lock:
            before = self.machine.assigned
            self.machine.on_heartbeat_response(response, self._clock_ms())
            after, epoch, ready = self.machine.assigned, self.machine.epoch, self.machine.ready
        if response.assignment is not None and after != before:
            log.info("assignment at epoch %d: %s", epoch, _describe(after))
            self._on_assignment(after)
        if (
            self.status is not None
            and ready
            and response.error_code
            in (
                ErrorCode.NONE,
                ErrorCode.COMPUTE_ASSIGNMENT,
            )
        ):
            with self._lock:
                running = self.machine.running
            self.status.update(epoch, running)

    def _on_assignment(self, assignment: ResourceSet) -> None:
        for assignor in self.settings.assignors:
            try:
                assignor.on_assignment(self.settings.member_id, assignment)
            except Exception:
                log.exception("assignor %s failed in on_assignment", assignor.name)

    def _find_coordinator(self, reason: str) -> None:
        log.info("looking for the coordinator of %s (%s)", self.settings.group_id, reason)
        candidates = [self._connection.address] + [
            a for a in self.settings.coordinators if a != self._connection.address
        ]
        found: str | None = None
        for address in candidates:
            connection = (
                self._connection if address == self._connection.address else self._connect(address)
            )
            try:
                resp = connection.admin.FindCoordinator(
                    wire.find_coordinator_request(self.settings.group_id),
                    timeout=self._call_timeout_s(),
                )
            except grpc.RpcError as error:
                log.warning("FindCoordinator at %s failed: %s", address, _rpc_error(error))
                resp = None
            if connection is not self._connection:
                connection.close()
            if resp is not None and resp.error_code == 0 and resp.host:
                found = f"{resp.host}:{resp.port}"
                break
        if found is not None and found != self._connection.address:
            log.info("coordinator of %s is %s; reconnecting", self.settings.group_id, found)
            old, self._connection = self._connection, self._connect(found)
            old.close()
        with self._lock:
            self.machine.coordinator_found(self._clock_ms())

    # --- listener calls --------------------------------------------------------------------

    def _listen(self, action: StopWork | StartWork) -> None:
        kind: EventKind = "revoked" if isinstance(action, StopWork) else "assigned"
        event = RebalanceEvent.from_resources(
            kind,
            action.resources,
            group_id=self.settings.group_id,
            member_id=self.settings.member_id,
            member_epoch=action.member_epoch,
        )
        if isinstance(action, StopWork):
            log.info("stopping (%s): %s", action.reason, _describe(action.resources))
        else:
            log.info("starting: %s", _describe(action.resources))
        done = call_with_retry(
            lambda: dispatch(self.listener, event),
            what=f"listener on_{kind} at epoch {action.member_epoch}",
            stop=self._abandon,
            initial_backoff_s=self.settings.listener_initial_backoff_s,
            max_backoff_s=self.settings.listener_max_backoff_s,
            log=log,
        )
        if not done:
            return
        with self._lock:
            now = self._clock_ms()
            if isinstance(action, StopWork):
                self.machine.work_stopped(action.resources, now)
            else:
                self.machine.work_started(action.resources, now)
            epoch, running = self.machine.epoch, self.machine.running
        if self.status is not None:
            self.status.update(epoch, running)
        self._wake.set()

    # --- assignment ------------------------------------------------------------------------

    def _compute_assignment(self) -> None:
        try:
            self._prepare_assign_install()
            self._too_large_backoff.reset()
        except _TooLarge:
            # Reporting done at once would heartbeat, be asked to compute again and fail the
            # same way, in a tight loop: wait first (a stop ends the wait).
            wait_s = self._too_large_backoff.next_wait_s()
            log.debug("computing the assignment again in %.2f s at the earliest", wait_s)
            self._stop_requested.wait(wait_s)
        except Exception:
            log.exception("computing the assignment failed")
        finally:
            with self._lock:
                self.machine.compute_done(self._clock_ms())
            self._wake.set()

    def _prepare_assign_install(self) -> None:
        s = self.settings
        with self._lock:
            epoch = self.machine.epoch
        prepared = self._call(
            "ConnectGroupPrepareAssignment",
            self._connection.coordinator.ConnectGroupPrepareAssignment,
            wire.prepare_request(s.group_id, s.member_id, epoch),
        )
        if prepared.error_code != 0:
            log.warning(
                "PrepareAssignment refused: %s %s",
                protocol_wire.error_code(prepared.error_code).name,
                prepared.error_message,
            )
            return
        if prepared.group_epoch == self._last_installed_epoch:
            return  # computed already; the group will move on
        group = wire.group_view(prepared)
        assignor = next((a for a in s.assignors if a.name == group.assignor_name), None)
        started = time.perf_counter()
        if assignor is None:
            result = AssignmentResult(
                error=1, error_message=f"this agent has no assignor {group.assignor_name!r}"
            )
        else:
            try:
                result = assignor.assign(group)
            except Exception as error:
                log.exception("assignor %s failed", assignor.name)
                result = AssignmentResult(error=1, error_message=f"{type(error).__name__}: {error}")
        elapsed_ms = (time.perf_counter() - started) * 1000
        with self._lock:
            epoch = self.machine.epoch
        answer = self._call(
            "ConnectGroupInstallAssignment",
            self._connection.coordinator.ConnectGroupInstallAssignment,
            wire.install_request(
                s.group_id, s.member_id, epoch, group.group_epoch, result, group.assignor_version
            ),
        )
        if answer.error_code != 0:
            log.warning(
                "InstallAssignment for group epoch %d refused: %s %s",
                group.group_epoch,
                protocol_wire.error_code(answer.error_code).name,
                answer.error_message,
            )
            return
        self._last_installed_epoch = group.group_epoch
        log.info(
            "installed the target of group epoch %d (%s v%d, %.1f ms, %d members%s)",
            group.group_epoch,
            group.assignor_name,
            group.assignor_version,
            elapsed_ms,
            len(group.members),
            f", rebalance in {result.scheduled_rebalance_delay_ms} ms"
            if result.scheduled_rebalance_delay_ms
            else "",
        )

    def _call(self, rpc: str, method: Callable[..., Any], request: Any) -> Any:
        """One call of the assignment computation; RESOURCE_EXHAUSTED raises `_TooLarge`."""
        try:
            answer = method(request, timeout=self.settings.rpc_timeout_s)
        except grpc.RpcError as error:
            if self._note_call(rpc, error):
                raise _TooLarge(rpc) from error
            raise
        self._note_call(rpc, None)
        return answer


class _TooLarge(Exception):
    """A call failed with RESOURCE_EXHAUSTED: a message exceeded a size limit (logged)."""


def _status(error: grpc.RpcError) -> grpc.StatusCode | None:
    code = error.code() if hasattr(error, "code") else None
    return code if isinstance(code, grpc.StatusCode) else None


def _rpc_error(error: grpc.RpcError) -> str:
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    return f"{getattr(code, 'name', code)}: {details}"


def _describe(resources: ResourceSet) -> str:
    if not resources:
        return "nothing"
    return ", ".join(resources.sorted_connectors() + [str(t) for t in resources.sorted_tasks()])


__all__ = ["EMPTY", "Agent", "AgentSettings", "advertised", "monotonic_ms"]
