"""The agent's runtime in classic mode (DESIGN 3.19, "Connect today"): drives the pure
`ClassicMembership` machine with Kafka's classic calls over gRPC (`ConnectGroupClassic`), the
worker's listener and a real clock, as a Kafka Connect worker's herder thread drives its
`WorkerCoordinator`.

Threads (all reports to the machine hold the agent's one lock, as in connect mode):

- the loop (`AgentBase._loop`) polls the machine, sends heartbeats and the LeaveGroup inline,
  each with a deadline no later than the self-fence, and looks the coordinator up;
- JoinGroup and SyncGroup run on a thread of their own (`classic-calls`): the coordinator may
  hold either until the group's join phase or the leader's assignment ends (up to the rebalance
  timeout plus Kafka's 5 s lapse), and the loop must go on heartbeating and fencing meanwhile;
- listener calls run on the work thread, as in connect mode (`AgentBase._listen`).

The leader's assignment (Connect's ports, `classic.leader`) is computed by the machine when the
JoinGroup answer is reported, on the `classic-calls` thread, with the lock held: its cost is that
of Connect's assignors over the group (milliseconds for hundreds of workers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from connect_protocol import classic_wire
from connect_protocol.errors import ErrorCode
from connect_protocol.resources import EMPTY, ResourceSet

from ..listener import WorkerRebalanceListener
from ..membership import FindCoordinator, StartWork, StopWork
from ..metrics import AgentMetrics
from ..runtime import AgentBase, AgentSettings, describe_resources, monotonic_ms
from ..status import StatusServer
from ..transport import Transport, TransportError
from .membership import (
    ClassicAction,
    ClassicConfig,
    ClassicMembership,
    SendClassicHeartbeat,
    SendJoinGroup,
    SendLeaveGroup,
    SendSyncGroup,
)

__all__ = ["ClassicAgent", "classic_config"]

log = logging.getLogger("worker_agent")

#: `--protocol` (Connect's connect.protocol values) -> the JoinGroup protocol names offered.
_PROTOCOL_NAMES = {"eager": "default", "compatible": "compatible", "sessioned": "sessioned"}
#: The shortest deadline given to a call (a deadline already past still gets one try).
_MIN_CALL_S = 0.05


def classic_config(settings: AgentSettings) -> ClassicConfig:
    """The classic machine's configuration from the agent's settings. Raises ValueError (with
    the reason) for settings the classic protocol cannot run with."""
    if settings.instance_id:
        raise ValueError(
            "static membership (an instance id) is offered on the connect protocol only "
            "(DESIGN 3.19); Kafka Connect's classic protocol has none"
        )
    if settings.protocol not in _PROTOCOL_NAMES:
        raise ValueError(
            f"connect.protocol must be one of {sorted(_PROTOCOL_NAMES)}, not {settings.protocol!r}"
        )
    return ClassicConfig(
        group_id=settings.group_id,
        protocol=_PROTOCOL_NAMES[settings.protocol],
        url=settings.url or "",
        session_timeout_ms=settings.session_timeout_ms,
        rebalance_timeout_ms=settings.rebalance_timeout_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        request_timeout_ms=int(settings.rpc_timeout_s * 1000),
    )


class ClassicAgent(AgentBase):
    """One Kafka Connect worker's membership in one classic group (see the module docstring).
    `settings.member_id` is only a label here: the coordinator makes the member id
    (`member_id`)."""

    machine: ClassicMembership
    #: A fatal error's STOPPING ends in LEFT by itself (the classic machine's `leave` keeps it).
    _NOT_LEAVING_FROM = frozenset({"LEAVING", "LEFT", "STOPPING"})

    def __init__(
        self,
        settings: AgentSettings,
        listener: WorkerRebalanceListener,
        status: StatusServer | None = None,
        clock_ms: Callable[[], int] = monotonic_ms,
        metrics: AgentMetrics | None = None,
        *,
        transport: Transport | None = None,
    ) -> None:
        super().__init__(settings, listener, status, clock_ms, metrics, transport=transport)
        self._calls = ThreadPoolExecutor(1, thread_name_prefix="classic-calls")
        self._shown_member_id = ""
        #: The member id of the last join (a new one is a new member: configs fetched again).
        self._joined_as = ""

    def _make_machine(self) -> ClassicMembership:
        return ClassicMembership(classic_config(self.settings))

    def _member_id(self) -> str:
        return self.machine.member_id

    def _event_member_id(self) -> str:
        return self.machine.work_member_id or self.machine.member_id

    def _start_line(self) -> str:
        c = self.machine.config
        return (
            f"classic protocol, group {c.group_id}, member id from the coordinator "
            f"(label {self.settings.member_id!r}), coordinator {self._transport.address}, "
            f"connect.protocol {self.settings.protocol} (JoinGroup offers "
            f"{', '.join(p.name for p in self.machine.join_protocols())}), session "
            f"{c.session_timeout_ms} ms, heartbeat {c.heartbeat_interval_ms} ms, rebalance "
            f"{c.rebalance_timeout_ms} ms"
        )

    def _shutdown(self) -> None:
        # Not waited for: a JoinGroup may be held at the coordinator for the rebalance timeout;
        # closing the transport next cancels it, and its report finds the machine LEFT.
        self._calls.shutdown(wait=False, cancel_futures=True)

    def _fence_marker(self) -> tuple[int, int]:
        return self.machine.self_fences, self.machine.unreachable_revokes

    def _count_fences(self, before: tuple[int, int]) -> None:
        fences, unreachable = self._fence_marker()
        if fences > before[0]:
            self.metrics.self_fenced.inc("session_timeout")
        if unreachable > before[1]:
            self.metrics.self_fenced.inc("coordinator_unreachable")

    def _coordinator_lookup_done(self, found: str | None) -> None:
        now = self._clock_ms()
        if found is None:
            self.machine.coordinator_lookup_failed("no coordinator address answered", now)
        else:
            self.machine.coordinator_found(now)

    def _left_group(self) -> bool:
        return self.machine.left_group

    def _dispatch(self, action: ClassicAction) -> None:
        match action:
            case SendClassicHeartbeat():
                self._heartbeat(action)
            case SendJoinGroup() | SendSyncGroup():
                self._calls.submit(self._group_call, action)
            case SendLeaveGroup():
                self._leave_group(action)
            case StopWork() | StartWork():
                self._work.submit(self._listen, action, time.monotonic())
            case FindCoordinator(reason=reason):
                self._find_coordinator(reason)

    # --- calls -----------------------------------------------------------------------------

    def _deadline_s(self, deadline_ms: int, fenced: bool) -> float:
        """Seconds until `deadline_ms`; with `fenced`, never past the self-fence either."""
        timeout = (deadline_ms - self._clock_ms()) / 1000
        if fenced:
            timeout = min(timeout, self._call_timeout_s())
        return max(_MIN_CALL_S, timeout)

    def _group_call(self, action: SendJoinGroup | SendSyncGroup) -> None:
        """JoinGroup or SyncGroup, on the `classic-calls` thread: not capped at the self-fence
        (the call may be held for the whole join phase, while heartbeats keep the fence clock
        going)."""
        kind = "join" if isinstance(action, SendJoinGroup) else "sync"
        timeout_s = self._deadline_s(action.deadline_ms, fenced=False)
        try:
            if isinstance(action, SendJoinGroup):
                join = self._transport.join_group(
                    classic_wire.join_request_to_wire(action.request), timeout_s
                )
                join_answer = classic_wire.join_response_from_wire(join)
                with self._lock:
                    self.machine.on_join_response(join_answer, self._clock_ms())
            else:
                sync = self._transport.sync_group(
                    classic_wire.sync_request_to_wire(action.request), timeout_s
                )
                sync_answer = classic_wire.sync_response_from_wire(sync)
                synced = sync_answer.error_code is ErrorCode.NONE
                with self._lock:
                    before = self.machine.snapshot
                    self.machine.on_sync_response(sync_answer, self._clock_ms())
                    after, generation = self.machine.snapshot, self.machine.generation
                    member_id = self.machine.member_id
                    if synced and (before is None or member_id != self._joined_as):
                        # Joined (first, after a fence or a reset, or as a new member id):
                        # nothing starts before the configs fetched after the join (DESIGN
                        # 3.20).
                        self._joined_as = member_id
                        self.machine.ready_connectors = self.control.joined()
                    if synced and after is not None:
                        self._granted(after - (before or EMPTY))
                if synced:
                    self.control.saw_revision(sync_answer.lifecycle_revision)
                    self._check_awaiting_configs()
                    self._on_synced(before, after, generation)
        except TransportError as error:
            with self._lock:
                self.machine.on_call_failed(kind, str(error), self._clock_ms())
        except Exception:
            # A bug (or an answer the conversion rejects) must not leave the machine waiting
            # for a call that will never be reported.
            log.exception("classic %s call failed unexpectedly", kind)
            with self._lock:
                self.machine.on_call_failed(kind, "unexpected error", self._clock_ms())
        finally:
            self._wake.set()

    def _on_synced(
        self, before: ResourceSet | None, after: ResourceSet | None, generation: int
    ) -> None:
        """A SyncGroup answered NONE: log the assignment, show it on the status endpoint."""
        if after != before and after is not None:
            log.info("assignment at generation %d: %s", generation, describe_resources(after))
        self._update_status()

    def _heartbeat(self, action: SendClassicHeartbeat) -> None:
        self.metrics.heartbeats.inc()
        try:
            answer = self._transport.classic_heartbeat(
                classic_wire.heartbeat_request_to_wire(action.request),
                self._deadline_s(action.deadline_ms, fenced=True),
            )
        except TransportError as error:
            self.metrics.heartbeat_failures.inc(
                "UNKNOWN" if error.code is None else str(error.code.name)
            )
            with self._lock:
                self.machine.on_call_failed("heartbeat", str(error), self._clock_ms())
            return
        response = classic_wire.heartbeat_response_from_wire(answer)
        code = response.error_code
        if code is not ErrorCode.NONE:
            self.metrics.heartbeat_errors.inc(code.name)
        with self._lock:
            self.machine.on_heartbeat_response(response, self._clock_ms())
        if code is ErrorCode.NONE:
            self.control.saw_revision(response.lifecycle_revision)
            self._check_awaiting_configs()
            self._update_status()

    def _leave_group(self, action: SendLeaveGroup) -> None:
        """The one LeaveGroup (Kafka's `maybeLeaveGroup`: best effort, no retry)."""
        try:
            answer = self._transport.leave_group(
                classic_wire.leave_request_to_wire(action.request),
                min(self.settings.leave_timeout_s, self._deadline_s(action.deadline_ms, False)),
            )
        except TransportError as error:
            log.warning("LeaveGroup got no answer (%s); the session timeout will end it", error)
            with self._lock:
                self.machine.on_call_failed("leave", str(error), self._clock_ms())
            return
        with self._lock:
            self.machine.on_leave_response(
                classic_wire.leave_response_from_wire(answer), self._clock_ms()
            )

    def _update_status(self) -> None:
        """Show the generation, what runs and the member id on the status endpoint, while the
        worker runs its generation's assignment (and the tokens statuses are reported under)."""
        with self._lock:
            m = self.machine
            if not m.ready:
                return
            generation, running, tokens, member_id = m.epoch, m.running, m.tokens, m.member_id
        if self.status is not None and member_id != self._shown_member_id:
            self._shown_member_id = member_id
            self.status.member_id = member_id
        self._show(generation, running, tokens)

    def _interval_ms(self) -> int:
        return self.machine.config.heartbeat_interval_ms

    def _held(self) -> ResourceSet:
        return (self.machine.snapshot or ResourceSet()) | self.machine.owned
