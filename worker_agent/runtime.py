"""The agent's runtime: drives the pure `Membership` machine with real gRPC, real listener calls
and a real clock. It owns `Agent`, its `AgentSettings` and the loop; the calls to the coordinator
are `transport`'s, the assignment computation is `assigning`'s.

One loop thread owns the machine's schedule: it polls the machine, sends heartbeats (each with a
deadline), asks FindCoordinator and reconnects. Listener calls run on a work thread, in order, with
retries (a failing hook leaves its revocation unacknowledged, DESIGN 2.3); an assignment
computation (Prepare, assign, Install) runs on a thread of its own, so heartbeats go on while
either is busy. Every access to the machine holds one lock.

A revoked event carries a releaser: the listener's `event.release(...)` (from any thread) reports
resources stopped while the rest of the batch is still stopping; the machine acknowledges them at
once (DESIGN 3.11, partial release), and a retry after a failure is called with the unreleased
remainder only.

The connector lifecycle (DESIGN 3.20) runs on a thread of its own (`control.ControlPlane`): it
fetches configs after every join and whenever an answer's lifecycle revision moved, and reports
statuses. The machines start a resource only once its connector's config has come
(`ready_connectors`), and a newly granted one only with the answer to a fetch sent after its
grant (so the restart count its start records is the grant's: a move repeats no restart);
`assigned` events carry the configs, a changed config of a running resource is a
`reconfigured` call (on the listener thread, in order with the others), a failed `assigned`
call reports its resources FAILED with the hook's output and a successful one RUNNING (PAUSED,
STOPPED as targeted). A worker reports later changes with `report_status` (the status
endpoint's POST /status calls it).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from connect_protocol import logs
from connect_protocol import wire as protocol_wire
from connect_protocol.errors import ErrorCode
from connect_protocol.lifecycle_messages import ReportedState, TargetState
from connect_protocol.limits import DEFAULT_MAX_MESSAGE_BYTES
from connect_protocol.messages import (
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    Assignor,
    HeartbeatRequest,
)
from connect_protocol.resources import ResourceSet
from connect_protocol.tls import ClientTls
from connect_protocol.tokens import FencingTokens, Resource

from .assigning import AssignmentComputation
from .assignor import ConnectAssignor
from .control import CallIdentity, ControlPlane
from .lifecycle import (
    ConfigChanges,
    ResourceNotHeld,
    connectors_of,
    mask_values,
    parse_status_report,
    resource_name,
)
from .listener import (
    RESTART,
    EventKind,
    ListenerFailed,
    RebalanceEvent,
    Releaser,
    WorkerRebalanceListener,
    call_with_retry,
    dispatch,
)
from .membership import (
    REJOIN_ERRORS,
    Action,
    ComputeAssignment,
    FindCoordinator,
    Membership,
    MembershipConfig,
    Notice,
    Phase,
    SendHeartbeat,
    StartWork,
    StopWork,
)
from .metrics import AgentMetrics, AgentView
from .status import StatusServer
from .transport import Backoff, Transport, TransportError

log = logging.getLogger("worker_agent")

RPC_TIMEOUT_S = 5.0
LEAVE_TIMEOUT_S = 10.0


#: Phases (both machines') in which a restart does not start again what it stopped: the
#: membership is lost, being left, or ended by a fatal error.
_NOT_STARTING_FROM = frozenset({"REJOINING", "UNJOINED", "LEAVING", "STOPPING", "LEFT"})

#: The listener event that applies each target state (DESIGN 3.20).
_TARGET_EVENTS: dict[TargetState, EventKind] = {
    TargetState.PAUSED: "paused",
    TargetState.STARTED: "resumed",
    TargetState.STOPPED: "stopped",
}


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
    #: TLS for the channels (None: plaintext, to loopback unless `allow_plaintext`).
    tls: ClientTls | None = None
    allow_plaintext: bool = False
    #: Which group protocol the agent speaks (Kafka's `group.protocol`, DESIGN 2.2): "connect"
    #: (the coordinator's ConnectGroupHeartbeat) or "classic" (Kafka's JoinGroup, SyncGroup,
    #: Heartbeat and LeaveGroup, as a Kafka Connect worker today: `classic.runtime.ClassicAgent`).
    group_protocol: str = "connect"
    #: Connect's `connect.protocol`: "eager", "compatible" or "sessioned". The connect protocol
    #: reads `eager` and the assignors; the classic protocol offers the JoinGroup protocols this
    #: names (eager: `default` only).
    protocol: str = "sessioned"
    #: Classic only (on the connect protocol the coordinator sends both): Kafka's
    #: `session.timeout.ms` and `heartbeat.interval.ms` (Connect's defaults).
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000


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


class WorkMachine(Protocol):
    """What `AgentBase` uses of a membership machine (`membership.Membership`,
    `classic.membership.ClassicMembership`)."""

    @property
    def phase(self) -> Any: ...

    @property
    def running(self) -> ResourceSet: ...

    @property
    def tokens(self) -> FencingTokens: ...

    @property
    def epoch(self) -> int: ...

    @property
    def fatal(self) -> str | None: ...

    @property
    def ready(self) -> bool: ...

    @property
    def owned(self) -> ResourceSet: ...

    #: The connectors whose configs the worker has: only their resources are started.
    ready_connectors: frozenset[str] | None

    @property
    def awaiting_configs(self) -> frozenset[str]: ...

    def configs_dropped(self, connectors: frozenset[str]) -> None: ...

    def poll(self, now_ms: int) -> Sequence[Any]: ...

    def next_wakeup_ms(self) -> int: ...

    def fence_deadline_ms(self) -> int | None: ...

    def drain_notices(self) -> list[Notice]: ...

    def leave(self, now_ms: int) -> None: ...

    def give_up_leaving(self) -> None: ...

    def work_stopped(self, resources: ResourceSet, now_ms: int) -> None: ...

    def work_started(self, resources: ResourceSet, now_ms: int) -> None: ...

    def work_released(self, resources: ResourceSet, now_ms: int) -> ResourceSet: ...


class AgentBase:
    """What the agent's two modes share (the connect protocol's `Agent`, the classic protocol's
    `classic.runtime.ClassicAgent`): the loop that polls the membership machine, the listener
    calls with their retries and partial releases, the leave on `stop()`, status and metrics.
    A mode supplies its machine (`_make_machine`) and what its actions do (`_dispatch`).

    `run()` blocks until the agent has left; `stop()` (e.g. from a SIGTERM handler) makes it
    revoke everything, then leave."""

    machine: WorkMachine
    #: Phases (by value; both machines name them alike) in which `stop()` starts no leave:
    #: already leaving or left.
    _NOT_LEAVING_FROM: frozenset[str] = frozenset({"LEAVING", "LEFT"})

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
        """`transport`: the connection to the coordinator (tests and benchmarks pass one they
        can break); by default one to `settings.coordinators`."""
        if not settings.coordinators:
            raise ValueError("at least one coordinator address is needed")
        self.settings = settings
        self.listener = listener
        self.status = status
        #: What the agent counts (served by `metrics.MetricsServer` when asked to).
        self.metrics = metrics or AgentMetrics()
        self.metrics.watch(self._metrics_view)
        self._clock_ms = clock_ms
        self.machine = self._make_machine()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop_requested = threading.Event()
        self._abandon = threading.Event()  # stop retrying listener calls: the process exits
        self._transport = transport or Transport(
            settings.coordinators,
            settings.max_message_bytes,
            tls=settings.tls,
            allow_plaintext=settings.allow_plaintext,
        )
        self._work = ThreadPoolExecutor(1, thread_name_prefix="listener")
        self._leave_deadline: float | None = None
        self._gave_up_leaving = False
        self._left = threading.Event()  # run() has returned
        #: The connector lifecycle's calls (DESIGN 3.20); nothing starts before its configs.
        self.control = ControlPlane(
            self, self._transport, settings.group_id, self._call_timeout_s, clock=time.monotonic
        )
        self.machine.ready_connectors = frozenset()
        if status is not None:
            status.set_report_handler(self._status_post)

    def _make_machine(self) -> WorkMachine:
        raise NotImplementedError

    # --- control -------------------------------------------------------------------------

    def stop(self) -> None:
        """Revoke everything and leave the group (idempotent; safe from a signal handler)."""
        self._stop_requested.set()
        self._wake.set()

    def leave(self, timeout_s: float) -> bool:
        """`stop()`, then wait up to `timeout_s` for the agent to have left (its work revoked
        through the listener, the leave sent or given up). True once it has: the status
        endpoint's POST /leave, a worker's preStop hook."""
        self.stop()
        return self._left.wait(timeout_s)

    @property
    def left(self) -> bool:
        """Whether `run()` has returned."""
        return self._left.is_set()

    def abandon(self) -> None:
        """Give up at once: stop retrying listener calls (second SIGTERM)."""
        self._abandon.set()
        self.stop()

    @property
    def phase(self) -> Any:
        """The machine's phase (an enum: `membership.Phase`, or `classic.membership.ClassicPhase`
        in classic mode)."""
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
            return int(self.machine.epoch)

    @property
    def member_id(self) -> str:
        """The member id the agent is known by now (classic: the coordinator-made one, empty
        before it is given and after the membership is lost)."""
        with self._lock:
            return self._member_id()

    def _member_id(self) -> str:
        """`member_id`, with the lock held."""
        return self.settings.member_id

    def run(self) -> None:
        log.info("agent starting: %s", self._start_line())
        self.control.start()
        try:
            self._loop()
            self.metrics.leaves.inc(self._leave_outcome())
        finally:
            self._work.shutdown(wait=True, cancel_futures=False)
            self.control.close()
            self._shutdown()
            self._transport.close()
            if self.status is not None:
                self.status.set_not_ready("the agent has left the group")
            log.info(
                "agent stopped: member %s left group %s",
                self.settings.member_id,
                self.settings.group_id,
            )
            self._left.set()

    def _start_line(self) -> str:
        """What the start-up log line says after "agent starting: "."""
        raise NotImplementedError

    def _shutdown(self) -> None:
        """Stop the mode's own threads (after the loop has returned)."""

    # --- the loop ------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            now = self._clock_ms()
            with self._lock:
                m = self.machine
                phase = m.phase.value
                if self._stop_requested.is_set() and phase not in self._NOT_LEAVING_FROM:
                    log.info("leaving the group: stopping all work first")
                    m.leave(now)
                    self._leave_deadline = None
                if self._leave_deadline is None and m.phase.value == "LEAVING" and not m.running:
                    # The time to deliver the leave runs from when the work has stopped (a slow
                    # revocation must not use it up).
                    self._leave_deadline = time.monotonic() + self.settings.leave_timeout_s
                if (
                    self._leave_deadline is not None
                    and time.monotonic() > self._leave_deadline
                    and m.phase.value == "LEAVING"
                    and not m.running
                ):
                    log.warning("could not deliver the leave in time; the session will expire")
                    m.give_up_leaving()
                    self._gave_up_leaving = True
                before = self._fence_marker()
                actions = m.poll(now)
                self._count_fences(before)
                for notice in m.drain_notices():
                    getattr(log, notice.level)(notice.message)
                if m.phase.value == "LEFT" and not actions:
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

    def _fence_marker(self) -> Any:
        """What `_count_fences` compares after a poll (with the lock held)."""
        raise NotImplementedError

    def _count_fences(self, before: Any) -> None:
        """Count the self-fences the last poll made (with the lock held)."""
        raise NotImplementedError

    def _dispatch(self, action: Any) -> None:
        """Carry out one of the machine's actions (without the lock)."""
        raise NotImplementedError

    def _call_timeout_s(self) -> float:
        """The call deadline: the configured one, but never past the self-fencing deadline (a
        hanging connection must not keep the loop from fencing in time)."""
        with self._lock:
            fence_at = self.machine.fence_deadline_ms()
        timeout = self.settings.rpc_timeout_s
        if fence_at is not None:
            timeout = min(timeout, max(0.05, (fence_at - self._clock_ms()) / 1000))
        return timeout

    def _find_coordinator(self, reason: str) -> None:
        found = self._transport.find_coordinator(
            self.settings.group_id, reason, self._call_timeout_s
        )
        with self._lock:
            self._coordinator_lookup_done(found)

    def _coordinator_lookup_done(self, found: str | None) -> None:
        """Tell the machine how FindCoordinator went (`found`: the address, None: no answer);
        with the lock held."""
        raise NotImplementedError

    # --- listener calls --------------------------------------------------------------------

    def _listen(self, action: StopWork | StartWork, decided_at: float) -> None:
        """Call the listener for `action` (decided at `decided_at`, time.monotonic()) until it
        succeeds, then report the stop or start to the machine."""
        kind: EventKind = "revoked" if isinstance(action, StopWork) else "assigned"
        # A resource whose start failed runs nothing: it is given up without a listener call.
        listened = action.resources
        if isinstance(action, StopWork):
            listened = action.resources - self.control.not_started(action.resources)
        batch = _Batch(listened)
        releaser: Releaser | None = None
        if isinstance(action, StopWork):
            releaser = functools.partial(self._release, action, batch)
        with self._lock:
            member_id = self._event_member_id()
        calls = 0

        def attempt() -> None:
            nonlocal calls
            with self._lock:
                remaining = batch.remaining
            if not remaining:
                return  # everything was released by an earlier, failed, attempt
            if calls:
                self.metrics.listener_retries.inc(kind)
            calls += 1
            # Read at each attempt: a config that changed meanwhile goes with the retry.
            configs = self.control.configs_for(remaining) if kind == "assigned" else {}
            counts = self.control.restart_counts_for(remaining) if kind == "assigned" else {}
            try:
                dispatch(
                    self.listener,
                    RebalanceEvent.from_resources(
                        kind,
                        remaining,
                        group_id=self.settings.group_id,
                        member_id=member_id,
                        member_epoch=action.member_epoch,
                        fencing_tokens=action.tokens,
                        releaser=releaser,
                        configs=configs,
                    ),
                )
            except Exception as exc:
                self.metrics.listener_calls.inc(kind, "failed")
                if kind == "assigned":
                    trace = mask_values(failure_trace(exc), configs)
                    self.control.start_failed(remaining, action.tokens, trace, counts, configs)
                raise
            self.metrics.listener_calls.inc(kind, "ok")
            if kind == "assigned":
                self.control.started(remaining, configs, action.tokens, counts)

        if isinstance(action, StopWork):
            log.info("stopping (%s): %s", action.reason, describe_resources(action.resources))
        else:
            log.info("starting: %s", describe_resources(action.resources))
        if isinstance(action, StartWork):
            # Called once (DESIGN 3.20): a failed start is reported FAILED and runs again only
            # on a restart (by an operator, or the coordinator's automatic restarts). The
            # resources are held all the same: the coordinator must not give them to another.
            done = self._start_once(attempt, action)
        else:
            done = call_with_retry(
                attempt,
                what=f"listener on_{kind} at epoch {action.member_epoch}",
                stop=self._abandon,
                initial_backoff_s=self.settings.listener_initial_backoff_s,
                max_backoff_s=self.settings.listener_max_backoff_s,
                log=log,
            )
        if not done:
            return
        if isinstance(action, StopWork):
            self.metrics.revocations.observe(time.monotonic() - decided_at, action.reason)
            self.control.stopped(action.resources)
        with self._lock:
            batch.finished = True
            now = self._clock_ms()
            if isinstance(action, StopWork):
                self.machine.work_stopped(action.resources, now)
                self._forget_configs(action.resources)
            else:
                self.machine.work_started(action.resources, now)
            epoch, running, tokens = self.machine.epoch, self.machine.running, self.machine.tokens
        self._show(epoch, running, tokens)
        self._wake.set()
        if isinstance(action, StartWork) and self.control.stale(action.resources):
            # A config changed while they started with an older one.
            self._work.submit(self._reconfigure)
        if isinstance(action, StartWork):
            # A restart or a target state that came while they started.
            self._work.submit(self._apply_lifecycle)

    def _start_once(self, attempt: Callable[[], None], action: StartWork) -> bool:
        """Make the `assigned` call once; a failure is logged (its FAILED status is reported by
        `attempt`). Returns True: the start is over either way."""
        try:
            attempt()
        except Exception as exc:
            log.warning(
                "starting %s failed: %s; reported FAILED, started again only on a restart "
                "(coordinator-svc restart, or the group's automatic restarts)",
                describe_resources(action.resources),
                exc,
                extra=logs.fields(event="start_failed", member_epoch=action.member_epoch),
            )
        return True

    # --- target states and restarts (DESIGN 3.20) ------------------------------------------

    def _apply_lifecycle(self) -> None:
        """On the listener thread (so never alongside a stop or start of the same work): call
        `paused` / `resumed` / `stopped` for the running resources whose connector's target
        state changed, then restart those whose restart count rose."""
        with self._lock:
            running = self.machine.running
        restarts, targets = self.control.due(running)
        for target, resources in sorted(targets.items()):
            self._target_event(target, resources)
        if restarts:
            self._restart(restarts)

    def _event_identity(self) -> tuple[str, int, FencingTokens]:
        """The member id, epoch and tokens a listener event names now."""
        with self._lock:
            return self._event_member_id(), int(self.machine.epoch), self.machine.tokens

    def _target_event(self, target: TargetState, resources: ResourceSet) -> None:
        kind: EventKind = _TARGET_EVENTS[target]
        member_id, epoch, tokens = self._event_identity()
        configs = self.control.configs_for(resources)
        event = RebalanceEvent.from_resources(
            kind,
            resources,
            group_id=self.settings.group_id,
            member_id=member_id,
            member_epoch=epoch,
            fencing_tokens=tokens,
            configs=configs,
        )

        def attempt() -> None:
            try:
                dispatch(self.listener, event)
            except Exception:
                self.metrics.listener_calls.inc(kind, "failed")
                raise
            self.metrics.listener_calls.inc(kind, "ok")

        log.info("%s (target state %s): %s", kind, target.value, describe_resources(resources))
        if call_with_retry(
            attempt,
            what=f"listener on_{kind}",
            stop=self._abandon,
            initial_backoff_s=self.settings.listener_initial_backoff_s,
            max_backoff_s=self.settings.listener_max_backoff_s,
            log=log,
        ):
            self.control.target_applied(resources, target, tokens)

    def _restart(self, resources: ResourceSet) -> None:
        """A restart (DESIGN 3.20, KIP-745) of resources the worker keeps: `revoked` then
        `assigned`, both with reason "restart", in place (the membership sees nothing: the
        worker holds them throughout). The revocation is retried as any; the start is made
        once."""
        member_id, epoch, tokens = self._event_identity()
        self.metrics.restarts.inc(amount=len(resources))
        log.info(
            "restarting (restart requested): %s",
            describe_resources(resources),
            extra=logs.fields(event="restart", resources=list(resources.names())),
        )

        def call(kind: EventKind, these: ResourceSet) -> None:
            configs = self.control.configs_for(these) if kind == "assigned" else {}
            dispatch(
                self.listener,
                RebalanceEvent.from_resources(
                    kind,
                    these,
                    group_id=self.settings.group_id,
                    member_id=member_id,
                    member_epoch=epoch,
                    fencing_tokens=tokens,
                    configs=configs,
                    reason=RESTART,
                ),
            )

        self.control.restarting(resources)
        running = resources - self.control.not_started(resources)  # a failed start: no stop
        if running and not call_with_retry(
            lambda: call("revoked", running),
            what="listener on_revoked (restart)",
            stop=self._abandon,
            initial_backoff_s=self.settings.listener_initial_backoff_s,
            max_backoff_s=self.settings.listener_max_backoff_s,
            log=log,
        ):
            return
        with self._lock:
            phase = self.machine.phase.value
        if phase in _NOT_STARTING_FROM:
            # The membership was lost (or is being left) while they stopped: they are not
            # started again; the stop in progress gives them up.
            log.info(
                "restart of %s not completed: %s", describe_resources(resources), phase.lower()
            )
            self.control.stopped_in_place(resources)  # their final stop calls no listener
            return
        configs = self.control.configs_for(resources)
        counts = self.control.restart_counts_for(resources)
        try:
            call("assigned", resources)
        except Exception as exc:
            trace = mask_values(failure_trace(exc), configs)
            self.control.start_failed(resources, tokens, trace, counts, configs)
            log.warning(
                "restarting %s failed: %s; reported FAILED",
                describe_resources(resources),
                exc,
            )
            return
        self.control.started(resources, configs, tokens, counts)

    def _show(self, epoch: int, running: ResourceSet, tokens: FencingTokens) -> None:
        """What the worker runs now, on the status endpoint with its configs; and the tokens
        its statuses are reported under."""
        self.control.retoken(tokens)
        if self.status is not None:
            self.status.update(epoch, running, tokens, configs=self.control.configs_for(running))

    def _event_member_id(self) -> str:
        """The member id listener events name (with the lock held): the one the work is held
        under."""
        return self._member_id()

    def _release(self, action: StopWork, batch: _Batch, resources: ResourceSet) -> None:
        """The listener's `event.release(resources)`: part of `action` has stopped."""
        with self._lock:
            if batch.finished:
                return  # on_revoked has returned: the whole batch is released already
            fresh = resources & batch.remaining
            if not fresh:
                return
            batch.remaining = batch.remaining - fresh
            left = len(batch.remaining)
            acknowledged = self.machine.work_released(fresh, self._clock_ms())
            self._forget_configs(fresh)
            epoch, running, tokens = self.machine.epoch, self.machine.running, self.machine.tokens
        self.control.stopped(fresh)
        extra = logs.fields(
            event="partial_release",
            released=list(fresh.names()),
            left=left,
            acknowledged=bool(acknowledged),
            member_epoch=action.member_epoch,
        )
        if acknowledged:
            log.info(
                "released %s (%s at epoch %d): stopped and acknowledged; %d of %d left to stop",
                describe_resources(fresh),
                action.reason,
                action.member_epoch,
                left,
                len(action.resources),
                extra=extra,
            )
        else:
            log.info(
                "stopped %s (%s): acknowledged with the rest of the batch; %d of %d left to stop",
                describe_resources(fresh),
                action.reason,
                left,
                len(action.resources),
                extra=extra,
            )
        if acknowledged:
            self._show(epoch, running, tokens)
            self._wake.set()

    # --- the connector lifecycle (DESIGN 3.20) --------------------------------------------

    def _lifecycle_identity(self) -> CallIdentity:
        with self._lock:
            m = self.machine
            return CallIdentity(self._member_id(), int(m.epoch), m.ready, self._interval_ms())

    def _interval_ms(self) -> int:
        """The heartbeat interval in force (with the lock held)."""
        raise NotImplementedError

    def _held(self) -> ResourceSet:
        """What the worker holds or is to start (with the lock held)."""
        raise NotImplementedError

    def _forget_configs(self, stopped: ResourceSet) -> None:
        """With the lock held, after `stopped` stopped: the connectors the worker no longer
        holds anything of start again only after a new fetch (their config may change while
        they are away, and nobody tells this member)."""
        gone = connectors_of(stopped) - connectors_of(self._held())
        if gone:
            self.machine.configs_dropped(gone)

    def _granted(self, granted: ResourceSet) -> None:
        """With the lock held, after an answer granted `granted` (resources newly assigned):
        they start only with the answer to a fetch sent from now on (DESIGN 3.20 "a grant
        records the count"). The last answer does not name them, so their restart counts would
        read 0, and a count persisted by an earlier restart (on their previous holder) would
        restart them again right after their fresh start."""
        if granted:
            self.machine.ready_connectors = self.control.granted(
                connectors_of(granted), self.machine.ready_connectors
            )

    def _check_awaiting_configs(self) -> None:
        """After an answer: if resources wait for configs the last fetch did not bring (the
        start gate lost a connector in a race, or the fetch predates the grant), fetch again
        (at most once per answer, so at most once per heartbeat interval)."""
        with self._lock:
            waiting = self.machine.awaiting_configs
        if waiting:
            self.control.fetch_again()

    def _lifecycle_keep(self) -> frozenset[str]:
        with self._lock:
            return connectors_of(self.machine.owned)

    def _configs_changed(self, changes: ConfigChanges | None, current: bool) -> None:
        """A ConnectGroupConfigs answer arrived (None: the coordinator serves none): open the
        start gate to the connectors it confirmed, tell the worker of changed configs, show
        them."""
        with self._lock:
            if changes is None:
                self.machine.ready_connectors = None
            elif current:
                # Less what was granted after this answer's fetch was sent (`_granted`).
                self.machine.ready_connectors = self.control.gated(changes.confirmed)
            m = self.machine
            ready, running = m.ready, m.running
        self._wake.set()
        if changes is not None and changes.reconfigured and self.control.stale(running):
            self._work.submit(self._reconfigure)
        if changes is not None and any(self.control.due(running)):
            self._work.submit(self._apply_lifecycle)
        if self.status is not None and ready:
            self.status.set_configs(self.control.configs_for(running))

    def _reconfigure(self) -> None:
        """On the listener thread: call `reconfigured` for the running resources whose config
        changed since they were started (or last reconfigured), until it succeeds."""
        with self._lock:
            running = self.machine.running
            member_id = self._event_member_id()
        stale = self.control.stale(running)
        if not stale:
            return
        calls = 0

        def attempt() -> None:
            nonlocal calls
            with self._lock:
                now_running, epoch, tokens = (
                    self.machine.running,
                    self.machine.epoch,
                    self.machine.tokens,
                )
            resources = stale & now_running
            if not resources:
                return
            if calls:
                self.metrics.listener_retries.inc("reconfigured")
            calls += 1
            configs = self.control.configs_for(resources)
            try:
                dispatch(
                    self.listener,
                    RebalanceEvent.from_resources(
                        "reconfigured",
                        resources,
                        group_id=self.settings.group_id,
                        member_id=member_id,
                        member_epoch=epoch,
                        fencing_tokens=tokens,
                        configs=configs,
                    ),
                )
            except Exception:
                self.metrics.listener_calls.inc("reconfigured", "failed")
                raise
            self.metrics.listener_calls.inc("reconfigured", "ok")
            self.control.reconfigured(resources, configs)

        log.info(
            "reconfiguring %s: %s",
            describe_resources(stale),
            self.control.cache_description(connectors_of(stale)),
        )
        call_with_retry(
            attempt,
            what="listener on_reconfigured",
            stop=self._abandon,
            initial_backoff_s=self.settings.listener_initial_backoff_s,
            max_backoff_s=self.settings.listener_max_backoff_s,
            log=log,
        )

    def report_status(
        self, resource: Resource, state: ReportedState | str, trace: str = ""
    ) -> None:
        """The worker reports a status of a resource it runs (DESIGN 3.20), e.g. a task that
        failed after it started: sent to the coordinator with the next report (changes only,
        at most one report per heartbeat interval), under the resource's fencing token.

        Raises:
            ValueError: not a state a worker reports (RUNNING, PAUSED, FAILED, STOPPED; STOPPED
                for connectors only).
            ResourceNotHeld: the worker does not run it (`status` 404), or it is assigned but
                not started yet, or has no fencing token (409).
        """
        connector = resource if isinstance(resource, str) else resource.connector
        body: dict[str, object] = {
            "connector": connector,
            "state": state.value if isinstance(state, ReportedState) else state,
            "trace": trace,
        }
        if not isinstance(resource, str):
            body["task"] = resource.task
        self._report(body)

    def _report(self, body: object) -> tuple[Resource, ReportedState]:
        resource, state, trace = parse_status_report(body)
        with self._lock:
            running, held, tokens = self.machine.running, self._held(), self.machine.tokens
        name = resource_name(resource)
        if not _holds(held, resource) and not _holds(running, resource):
            raise ResourceNotHeld(f"{name} is not held by this worker", 404)
        if not _holds(running, resource):
            raise ResourceNotHeld(
                f"{name} is assigned to this worker but not started yet: report its status "
                "once it has been started (the agent reports the outcome of its start itself)",
                409,
            )
        token = tokens.get(resource)
        if token is None:
            raise ResourceNotHeld(f"{name} has no fencing token: no status can be reported", 409)
        self.control.report(resource, state, trace, token)
        return resource, state

    def _status_post(self, body: object) -> tuple[int, dict[str, object]]:
        """The status endpoint's POST /status."""
        try:
            resource, state = self._report(body)
        except ValueError as error:
            return 400, {"error": str(error)}
        except ResourceNotHeld as error:
            return error.status, {"error": str(error)}
        return 202, {"accepted": True, "resource": resource_name(resource), "state": state.value}

    # --- metrics ---------------------------------------------------------------------------

    def _metrics_view(self) -> AgentView:
        """Where the agent is, for a metrics scrape."""
        with self._lock:
            m = self.machine
            running = m.running
            return AgentView(m.phase.value, m.epoch, len(running.connectors), len(running.tasks))

    def _leave_outcome(self) -> str:
        """How the membership ended, once the loop has returned."""
        with self._lock:
            if self.machine.fatal is not None:
                return "fatal"
            if self._gave_up_leaving:
                return "timed_out"
            if self._left_group():
                return "left"
            return "not_member"

    def _left_group(self) -> bool:
        """Whether the coordinator answered the leave (with the lock held)."""
        raise NotImplementedError


class Agent(AgentBase):
    """One worker's membership in one group on the connect protocol (ConnectGroupHeartbeat;
    `membership.Membership`). The assignment computation (Prepare, assign, Install) runs on a
    thread of its own."""

    machine: Membership

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
        self._assigning = AssignmentComputation(
            group_id=settings.group_id,
            member_id=settings.member_id,
            assignors=settings.assignors,
            transport=self._transport,
            member_epoch=lambda: self.member_epoch,
            rpc_timeout_s=settings.rpc_timeout_s,
            too_large_backoff=Backoff(
                settings.too_large_initial_backoff_s, settings.too_large_max_backoff_s
            ),
            stop=self._stop_requested,
        )
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="assignor")

    def _make_machine(self) -> Membership:
        settings = self.settings
        return Membership(
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

    def _start_line(self) -> str:
        s = self.settings
        assignors = [f"{a.name}[{a.minimum_version}-{a.maximum_version}]" for a in s.assignors]
        return (
            f"group {s.group_id}, member {s.member_id}, coordinator {self._transport.address}, "
            f"assignors {assignors}"
        )

    def _shutdown(self) -> None:
        self._compute.shutdown(wait=True, cancel_futures=True)

    def _fence_marker(self) -> bool:
        return self.machine.phase is Phase.MEMBER

    def _count_fences(self, before: bool) -> None:
        if before and self.machine.phase is not Phase.MEMBER:
            # Only the self-fence moves a member away in poll (no successful heartbeat for
            # nearly a session timeout); answers are counted in _heartbeat.
            self.metrics.self_fenced.inc("session_timeout")

    def _dispatch(self, action: Action) -> None:
        match action:
            case SendHeartbeat(request=request):
                self._heartbeat(request)
            case StopWork() | StartWork():
                self._work.submit(self._listen, action, time.monotonic())
            case ComputeAssignment():
                self._compute.submit(self._compute_assignment)
            case FindCoordinator(reason=reason):
                self._find_coordinator(reason)

    def _coordinator_lookup_done(self, found: str | None) -> None:
        # Whether or not one answered: the next heartbeat goes to the current address.
        self.machine.coordinator_found(self._clock_ms())

    def _left_group(self) -> bool:
        return self.machine.epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH)

    def _interval_ms(self) -> int:
        return self.machine.heartbeat_interval_ms

    def _held(self) -> ResourceSet:
        return self.machine.assigned | self.machine.owned

    # --- heartbeats ------------------------------------------------------------------------

    def _heartbeat(self, request: HeartbeatRequest) -> None:
        self.metrics.heartbeats.inc()
        try:
            answer = self._transport.heartbeat(
                protocol_wire.heartbeat_request_to_wire(request), self._call_timeout_s()
            )
        except TransportError as error:
            self.metrics.heartbeat_failures.inc(
                "UNKNOWN" if error.code is None else str(error.code.name)
            )
            # The machine backs the next heartbeat off (at most a heartbeat interval apart), so
            # even a heartbeat that is too large is not retried in a tight loop.
            with self._lock:
                self.machine.on_heartbeat_failed(str(error), self._clock_ms())
            return
        response = protocol_wire.heartbeat_response_from_wire(answer)
        code = response.error_code
        if code is not ErrorCode.NONE and code is not ErrorCode.COMPUTE_ASSIGNMENT:
            self.metrics.heartbeat_errors.inc(code.name)
            if code in REJOIN_ERRORS or code is ErrorCode.FENCED_INSTANCE_ID:
                self.metrics.self_fenced.inc(code.name)  # the machine stops everything
        answered = code in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT)
        with self._lock:
            before = self.machine.assigned
            was_member = self.machine.phase is Phase.MEMBER
            self.machine.on_heartbeat_response(response, self._clock_ms())
            after, epoch, ready = self.machine.assigned, self.machine.epoch, self.machine.ready
            if answered and not was_member and self.machine.phase is Phase.MEMBER:
                # Joined: nothing starts before the configs fetched after the join.
                self.machine.ready_connectors = self.control.joined()
            if answered:
                self._granted(after - before)
        if answered:
            self.control.saw_revision(response.lifecycle_revision)
            self._check_awaiting_configs()
        if response.assignment is not None and after != before:
            log.info("assignment at epoch %d: %s", epoch, describe_resources(after))
            self._on_assignment(after)
        if ready and answered:
            with self._lock:
                running, tokens = self.machine.running, self.machine.tokens
            self._show(epoch, running, tokens)

    def _on_assignment(self, assignment: ResourceSet) -> None:
        for assignor in self.settings.assignors:
            try:
                assignor.on_assignment(self.settings.member_id, assignment)
            except Exception:
                log.exception("assignor %s failed in on_assignment", assignor.name)

    # --- assignment ------------------------------------------------------------------------

    def _compute_assignment(self) -> None:
        try:
            self._assigning.run()
        finally:
            with self._lock:
                self.machine.compute_done(self._clock_ms())
            self._wake.set()


class _Batch:
    """What is left of one listener call's resources (guarded by the agent's lock)."""

    __slots__ = ("finished", "remaining")

    def __init__(self, resources: ResourceSet) -> None:
        self.remaining = resources
        self.finished = False


def _holds(resources: ResourceSet, resource: Resource) -> bool:
    if isinstance(resource, str):
        return resource in resources.connectors
    return resource in resources.tasks


def failure_trace(error: BaseException) -> str:
    """A failed listener call as a status trace: a hook's or webhook's own account of it (its
    exit status or HTTP status, and its output), else the exception's traceback."""
    if isinstance(error, ListenerFailed):
        return str(error)
    return "".join(traceback.format_exception(error)).strip()


def describe_resources(resources: ResourceSet) -> str:
    """Resources for a log line: connectors, then tasks, sorted."""
    if not resources:
        return "nothing"
    return ", ".join(resources.sorted_connectors() + [str(t) for t in resources.sorted_tasks()])


__all__ = [
    "Agent",
    "AgentBase",
    "AgentSettings",
    "advertised",
    "describe_resources",
    "monotonic_ms",
]
