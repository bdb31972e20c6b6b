"""The agent's membership state machine: pure, no I/O, no clock of its own (seed 000's
"Response Handling", DESIGN 3.2, 3.11-3.15).

The runtime asks `poll(now)` what to do next and reports back what happened. The machine decides:
which heartbeat to send (full on a join and after any error or lost response, otherwise only the
fields that changed), what the worker must stop (always before the acknowledging heartbeat, which
is then sent at once) and start (only once nothing is left to revoke), when to compute an
assignment, when to ask FindCoordinator, when to fence itself (no successful heartbeat for nearly a
session timeout: stop everything, then rejoin at epoch 0) and how to leave.

In eager mode (`connect.protocol=eager`) the worker stops everything it runs whenever its epoch or
its assignment changes, reports that it runs nothing, and only then starts its new share: today's
stop-the-world, kept as the baseline.

Partial release (DESIGN 3.11): while a cooperative revocation is being stopped, the runtime may
report resources of it as stopped one by one (`work_released`). Each is dropped from what the
member reports as owned at once, and a heartbeat carrying the shrunk owned list is sent promptly
but coalesced: no sooner than `RELEASE_HEARTBEAT_GAP_MS` after the previous heartbeat was sent
(at once if that was longer ago), never while one is in flight, and not during a retry backoff.
So a burst of releases costs at most one extra heartbeat per gap. The end of the whole stop
(`work_stopped`) is acknowledged at once, as before. Stops for any other reason (eager, leaving,
lost membership, a fatal error) take no partial releases: they are acknowledged when done.

Fatal errors (`FATAL_ERRORS`): stop everything, then LEFT with `fatal` saying why; the agent
exits. Among them the configuration errors of a join (`CONFIGURATION_ERRORS`, DESIGN 3.19):
INCONSISTENT_GROUP_PROTOCOL (the group's migration policy refuses the connect protocol) and
UNSUPPORTED_VERSION (group.version 0), never retried, their log lines saying what to do.

Fencing tokens (DESIGN 3.18): the machine keeps the token of every resource it is assigned or
runs (`tokens`), replaced by the tokens each new assignment carries and kept for resources an
assignment without a token for them keeps; `StartWork` and `StopWork` carry their resources' tokens.

Configs first (DESIGN 3.20): when the runtime sets `ready_connectors` (the connectors whose
configs it has), a resource is started only once its connector is among them; the rest of the
assignment waits (it is not reported as owned meanwhile). None, the default, starts everything
at once.

Times are milliseconds of a monotonic clock the runtime passes in.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from connect_protocol.configs import DEFAULT_HEARTBEAT_INTERVAL_MS, DEFAULT_SESSION_TIMEOUT_MS
from connect_protocol.errors import ErrorCode
from connect_protocol.messages import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    Assignor,
    HeartbeatRequest,
    HeartbeatResponse,
)
from connect_protocol.resources import EMPTY, ResourceSet
from connect_protocol.tokens import NO_TOKENS, FencingTokens

MIN_RETRY_BACKOFF_MS = 50
#: After a partial release, the next heartbeat goes out this long after the previous one was
#: sent at the earliest (at once if that is past): a burst of releases coalesces into at most
#: one extra heartbeat per this many milliseconds.
RELEASE_HEARTBEAT_GAP_MS = 20
MAX_RETRY_BACKOFF_MS = 2_000
FIND_COORDINATOR_ERRORS = frozenset(
    {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE}
)
#: Refusals of a join that only an operator can resolve (DESIGN 3.19, "Feature flag" and
#: "Migration policy"), with what to do, which the fatal error's log lines carry. The coordinator
#: checks both on a join (epoch 0) only, so an admitted member's heartbeat never gets them; were
#: one to, it is fatal all the same (the group or the cluster no longer serves this protocol).
CONFIGURATION_ERRORS: dict[ErrorCode, str] = {
    ErrorCode.UNSUPPORTED_VERSION: (
        "the cluster feature group.version is at level 0, which admits no new connect-protocol "
        "member: run this worker with --group-protocol classic, or raise group.version to 1 "
        "(coordinator-svc features update --feature group.version --level 1)"
    ),
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: (
        "the group's group.protocol.migration.policy does not let a connect-protocol worker "
        "join it: change the policy (coordinator-svc alter-configs GROUP --set "
        "group.protocol.migration.policy=upgrade, or bidirectional), or run this worker with "
        "--group-protocol classic"
    ),
}
#: Errors after which this process must not carry on: stop everything and exit, loudly.
FATAL_ERRORS = frozenset(
    {
        ErrorCode.FENCED_INSTANCE_ID,
        ErrorCode.UNSUPPORTED_ASSIGNOR,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_GROUP_ID,
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.POLICY_VIOLATION,
        *CONFIGURATION_ERRORS,
    }
)
REJOIN_ERRORS = frozenset({ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID})


def with_fix(why: str, code: ErrorCode, fixes: Mapping[ErrorCode, str]) -> str:
    """Why a fatal refusal stops the agent (`why`: the code and the coordinator's message) and,
    for a configuration error, what the operator should do."""
    fix = fixes.get(code)
    return f"{why} [configuration error: {fix}]" if fix else why


def with_configs(resources: ResourceSet, ready: frozenset[str] | None) -> ResourceSet:
    """Those of `resources` whose connector's config is among `ready` (None: all of them)."""
    if ready is None or not resources:
        return resources
    connectors = resources.connectors & ready
    tasks = frozenset(t for t in resources.tasks if t.connector in ready)
    if len(connectors) == len(resources.connectors) and len(tasks) == len(resources.tasks):
        return resources
    return ResourceSet(connectors, tasks)


class Phase(enum.Enum):
    JOINING = "JOINING"  # not a member: the next heartbeat is a join at epoch 0
    MEMBER = "MEMBER"  # holds an epoch > 0
    REJOINING = "REJOINING"  # lost its membership: stopping everything, then joins again
    LEAVING = "LEAVING"  # stopping everything, then sends the leave heartbeat
    STOPPING = "STOPPING"  # a fatal error: stopping everything, then the agent exits
    LEFT = "LEFT"  # the leave was answered (or given up), or a fatal error: the agent may exit


@dataclass(frozen=True, slots=True)
class MembershipConfig:
    group_id: str
    member_id: str
    assignors: tuple[Assignor, ...]
    rebalance_timeout_ms: int
    instance_id: str | None = None
    url: str | None = None
    eager: bool = False
    #: Used until the first response says otherwise.
    initial_heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS
    initial_session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS


# --- actions: what the runtime must do --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendHeartbeat:
    request: HeartbeatRequest


@dataclass(frozen=True, slots=True)
class StopWork:
    """Stop these resources, calling the listener's on_revoked; report `work_released` for
    each part as it stops (optional) and `work_stopped` when all have."""

    resources: ResourceSet
    member_epoch: int
    reason: str
    #: The fencing tokens the resources ran under (those known).
    tokens: FencingTokens = NO_TOKENS


@dataclass(frozen=True, slots=True)
class StartWork:
    """Start these resources, calling the listener's on_assigned; report `work_started`."""

    resources: ResourceSet
    member_epoch: int
    #: The fencing token of each resource (those the coordinator sent).
    tokens: FencingTokens = NO_TOKENS


@dataclass(frozen=True, slots=True)
class ComputeAssignment:
    """Prepare, run the selected assignor, install; report `compute_done`."""

    member_epoch: int


@dataclass(frozen=True, slots=True)
class FindCoordinator:
    """Ask FindCoordinator and reconnect to the answer; report `coordinator_found`."""

    reason: str


Action = SendHeartbeat | StopWork | StartWork | ComputeAssignment | FindCoordinator


@dataclass(frozen=True, slots=True)
class Notice:
    """Something worth a log line (the runtime logs it; the machine has no logger)."""

    level: str  # "info" | "warning" | "error"
    message: str


# --- the machine -----------------------------------------------------------------------------


@dataclass
class Membership:
    config: MembershipConfig
    now_ms: int = 0
    phase: Phase = Phase.JOINING
    epoch: int = JOIN_EPOCH
    #: What the coordinator last said this member may run.
    assigned: ResourceSet = EMPTY
    #: What the worker runs now (changed only when the runtime reports a stop or start).
    running: ResourceSet = EMPTY
    #: The fencing token of each resource assigned or running (DESIGN 3.18).
    tokens: FencingTokens = NO_TOKENS
    heartbeat_interval_ms: int = 0
    session_timeout_ms: int = 0
    #: When the request of the last successful response was sent (the self-fencing clock).
    last_success_sent_ms: int | None = None
    #: Why the agent must exit without rejoining (FENCED_INSTANCE_ID, UNSUPPORTED_ASSIGNOR, a
    #: configuration error: see `with_fix`).
    fatal: str | None = None
    notices: list[Notice] = field(default_factory=list)
    #: The connectors whose configs the worker has (DESIGN 3.20): only their resources are
    #: started. None: no such gate.
    ready_connectors: frozenset[str] | None = None

    _next_heartbeat_ms: int = 0
    _in_flight: HeartbeatRequest | None = None
    _in_flight_sent_ms: int = 0
    _full_next: bool = True
    _last_sent: HeartbeatRequest | None = None
    _last_reported_owned: ResourceSet | None = None
    #: Whether what runs changed since the last owned list sent only by partial releases (their
    #: heartbeat is coalesced; anything else is reported at once).
    _release_unreported: bool = False
    _failures: int = 0
    _stopping: StopWork | None = None
    _starting: StartWork | None = None
    _computing: bool = False
    _compute_requested: bool = False
    _find_requested: str | None = None
    _finding: bool = False
    _eager_restart: bool = False

    def __post_init__(self) -> None:
        self.heartbeat_interval_ms = self.config.initial_heartbeat_interval_ms
        self.session_timeout_ms = self.config.initial_session_timeout_ms

    # --- what to do ---------------------------------------------------------------------

    def poll(self, now_ms: int) -> list[Action]:
        """Everything the runtime should start now (each at most once until reported done)."""
        self.now_ms = now_ms
        self._check_self_fence()
        actions: list[Action] = []
        to_stop = self._to_stop()
        if to_stop and self._stopping is None:  # first: stopping must never wait for a call
            reason = self._stop_reason()
            self._stopping = StopWork(to_stop, self.epoch, reason, self._tokens_of(to_stop))
            actions.append(self._stopping)
        if self._find_requested is not None and not self._finding:
            self._finding = True
            actions.append(FindCoordinator(self._find_requested))
            self._find_requested = None
        to_start = self._to_start()
        if to_start and self._starting is None and self._stopping is None:
            self._starting = StartWork(to_start, self.epoch, self._tokens_of(to_start))
            actions.append(self._starting)
        if self._compute_requested and not self._computing and self.phase is Phase.MEMBER:
            self._computing = True
            self._compute_requested = False
            actions.append(ComputeAssignment(self.epoch))
        request = self._heartbeat_due()
        if request is not None:
            self._in_flight = request
            self._in_flight_sent_ms = now_ms
            self._last_sent = request
            if request.owned is not None:
                self._last_reported_owned = request.owned
                self._release_unreported = False
            actions.append(SendHeartbeat(request))
        return actions

    def next_wakeup_ms(self) -> int:
        """When `poll` may have something new to do, absent any report (for the runtime's sleep)."""
        times = [self.now_ms + max(self.heartbeat_interval_ms, MIN_RETRY_BACKOFF_MS)]
        if not self._heartbeat_blocked():
            times.append(self._next_heartbeat_ms)
        if self.phase is Phase.MEMBER and self.owned and self.last_success_sent_ms is not None:
            times.append(self._fence_at())
        return max(self.now_ms, min(times))

    @property
    def owned(self) -> ResourceSet:
        """What the worker may be running: what it runs plus what it is starting now. Heartbeats
        report this, so a resource being started is never taken for given up."""
        starting = self._starting.resources if self._starting is not None else EMPTY
        return self.running | starting

    @property
    def ready(self) -> bool:
        return self.phase is Phase.MEMBER and self.last_success_sent_ms is not None

    @property
    def awaiting_configs(self) -> frozenset[str]:
        """Connectors of assigned resources not started because their configs have not come."""
        if self.ready_connectors is None or self.phase is not Phase.MEMBER:
            return frozenset()
        waiting = self.assigned - self.owned
        names = waiting.connectors | {t.connector for t in waiting.tasks}
        return frozenset(names - self.ready_connectors)

    def configs_dropped(self, connectors: frozenset[str]) -> None:
        """The worker no longer runs anything of these connectors: their configs must be
        fetched again before anything of them starts."""
        if self.ready_connectors is not None and connectors & self.ready_connectors:
            self.ready_connectors = self.ready_connectors - connectors

    def drain_notices(self) -> list[Notice]:
        out, self.notices = self.notices, []
        return out

    # --- reports from the runtime --------------------------------------------------------

    def on_heartbeat_response(self, resp: HeartbeatResponse, now_ms: int) -> None:
        self.now_ms = now_ms
        sent = self._in_flight
        sent_ms = self._in_flight_sent_ms
        self._in_flight = None
        if sent is None:
            return
        code = resp.error_code
        if code in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT):
            self._on_success(sent, sent_ms, resp)
        elif code in REJOIN_ERRORS:
            self._lose_membership(f"{code.name}: {resp.error_message}")
        elif code in FATAL_ERRORS:
            self._fatal(with_fix(f"{code.name}: {resp.error_message}", code, CONFIGURATION_ERRORS))
        elif code in FIND_COORDINATOR_ERRORS:
            self._find_requested = f"{code.name}: {resp.error_message}"
            self._retry_later(f"{code.name}: {resp.error_message}", level="info")
        else:
            self._retry_later(f"heartbeat refused, {code.name}: {resp.error_message}")

    def on_heartbeat_failed(self, error: str, now_ms: int) -> None:
        """The heartbeat got no answer (transport error, deadline): retry with backoff."""
        self.now_ms = now_ms
        self._in_flight = None
        self._retry_later(f"heartbeat failed: {error}")
        if self._failures >= 3 and self._failures % 3 == 0:
            self._find_requested = f"{self._failures} heartbeats failed"

    def work_stopped(self, resources: ResourceSet, now_ms: int) -> None:
        """The listener's on_revoked returned: acknowledge at once. `resources` is the whole
        StopWork's set (parts already released are simply dropped again)."""
        self.now_ms = now_ms
        self.running = self.running - resources
        self._trim_tokens()
        self._stopping = None
        self._release_unreported = False
        self._next_heartbeat_ms = now_ms

    def work_released(self, resources: ResourceSet, now_ms: int) -> ResourceSet:
        """Part of the stop in progress has stopped while the rest is still being stopped
        (DESIGN 3.11, partial release): drop it from what runs and report that soon
        (coalesced, see `RELEASE_HEARTBEAT_GAP_MS`).

        Taken only during a cooperative revocation (a StopWork with reason "revoked", as a
        member, not in eager mode); otherwise, and for resources outside the stop in progress or
        already released, nothing changes: the stop is acknowledged as a whole by
        `work_stopped`, as before.

        Returns:
            The resources released now (empty if none).
        """
        self.now_ms = now_ms
        stop = self._stopping
        if stop is None or not self._takes_partial_release(stop):
            return EMPTY
        released = resources & stop.resources & self.running
        if not released:
            return EMPTY
        self.running = self.running - released
        self._trim_tokens()
        self._release_unreported = True
        if self._failures == 0:  # else the retry backoff decides (it sends the full state)
            due = max(now_ms, self._in_flight_sent_ms + RELEASE_HEARTBEAT_GAP_MS)
            self._next_heartbeat_ms = min(self._next_heartbeat_ms, due)
        return released

    def work_started(self, resources: ResourceSet, now_ms: int) -> None:
        self.now_ms = now_ms
        self.running = self.running | resources
        self._starting = None
        self._release_unreported = False
        self._next_heartbeat_ms = now_ms  # report what it runs now

    def compute_done(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self._computing = False
        self._next_heartbeat_ms = now_ms

    def coordinator_found(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self._finding = False
        self._full_next = True

    def leave(self, now_ms: int) -> None:
        """SIGTERM: stop everything (revoking through the listener), then leave the group."""
        self.now_ms = now_ms
        if self.phase is Phase.LEFT:
            return
        if self.phase is not Phase.MEMBER:
            self.phase = Phase.LEAVING
            self.epoch = JOIN_EPOCH  # not a member: nothing to tell the coordinator
        else:
            self.phase = Phase.LEAVING
        self._compute_requested = False
        if not self._still_stopping():
            self._next_heartbeat_ms = now_ms  # else: once stopped (keepalives meanwhile)

    def give_up_leaving(self) -> None:
        """The leave could not be delivered in time: the session timeout will remove us."""
        self.phase = Phase.LEFT

    # --- internals -----------------------------------------------------------------------

    def _takes_partial_release(self, stop: StopWork) -> bool:
        return (
            stop.reason == "revoked"
            and self.phase is Phase.MEMBER
            and not self.config.eager
            and not self._eager_restart
        )

    def _tokens_of(self, resources: ResourceSet) -> FencingTokens:
        return self.tokens.restricted(resources) if self.tokens else NO_TOKENS

    def _held(self) -> ResourceSet:
        """What runs or is being started: a resource being started runs under its token as
        soon as its start returns, even if an answer revoked it meanwhile."""
        starting = self._starting.resources if self._starting is not None else EMPTY
        return self.running | starting

    def _trim_tokens(self) -> None:
        """Forget the tokens of resources neither assigned nor running (nor being started)."""
        if self.tokens:
            self.tokens = self.tokens.restricted(self.assigned | self._held())

    def _take_tokens(self, assignment: ResourceSet, sent: FencingTokens) -> None:
        """A new assignment: its tokens; for resources it keeps but carries no token for, the
        token known; for resources still running outside it (being revoked), the token they ran
        under (those being started included: they are stopped under it once started)."""
        kept = self.tokens.restricted(assignment | self._held()) if self.tokens else NO_TOKENS
        if not sent:
            self.tokens = kept
            return
        merged = dict(kept)
        merged.update(sent.restricted(assignment))
        self.tokens = FencingTokens(merged)

    def _to_stop(self) -> ResourceSet:
        if self.phase in (Phase.REJOINING, Phase.LEAVING, Phase.STOPPING, Phase.LEFT):
            return self.running
        if self._eager_restart:
            return self.running
        return self.running - self.assigned

    def _stop_reason(self) -> str:
        if self.phase is Phase.REJOINING:
            return "membership lost"
        if self.phase is Phase.STOPPING:
            return "fatal error"
        if self.phase in (Phase.LEAVING, Phase.LEFT):
            return "leaving"
        if self._eager_restart:
            return "eager rebalance"
        return "revoked"

    def _to_start(self) -> ResourceSet:
        if self.phase is not Phase.MEMBER or self.running - self.assigned:
            return EMPTY
        if self._eager_restart:
            return EMPTY
        return with_configs(self.assigned - self.running, self.ready_connectors)

    def fence_deadline_ms(self) -> int | None:
        """When the agent fences itself unless a heartbeat succeeds first (None: not a member
        running anything). The runtime caps every call's deadline at it, so that a hanging call
        cannot delay the fence."""
        if self.phase is not Phase.MEMBER or self.last_success_sent_ms is None:
            return None
        return self._fence_at()

    def _fence_at(self) -> int:
        assert self.last_success_sent_ms is not None
        margin = max(self.heartbeat_interval_ms, self.session_timeout_ms // 5)
        return self.last_success_sent_ms + max(0, self.session_timeout_ms - margin)

    def _check_self_fence(self) -> None:
        if self.phase is not Phase.MEMBER or self.last_success_sent_ms is None:
            return
        if self.now_ms >= self._fence_at():
            silent = self.now_ms - self.last_success_sent_ms
            self._lose_membership(
                f"no successful heartbeat for {silent} ms (session timeout "
                f"{self.session_timeout_ms} ms): fencing itself"
            )

    def _lose_membership(self, why: str) -> None:
        self.notices.append(Notice("warning", f"membership lost ({why}); stopping all work"))
        leaving = self.phase is Phase.LEAVING
        self.phase = Phase.LEAVING if leaving else Phase.REJOINING
        self.epoch = JOIN_EPOCH
        self.assigned = EMPTY
        self.last_success_sent_ms = None
        self._compute_requested = False
        self._eager_restart = False
        self._full_next = True
        self._failures = 0
        self._next_heartbeat_ms = self.now_ms

    def _fatal(self, why: str) -> None:
        self.notices.append(Notice("error", f"cannot stay in the group ({why}); stopping all work"))
        self.fatal = why
        self.phase = Phase.STOPPING
        self.epoch = JOIN_EPOCH
        self.assigned = EMPTY
        self.last_success_sent_ms = None
        self._compute_requested = False
        self._eager_restart = False

    def _retry_later(self, why: str, level: str = "warning") -> None:
        self._failures += 1
        self._full_next = True
        backoff = min(
            MAX_RETRY_BACKOFF_MS,
            self.heartbeat_interval_ms,
            MIN_RETRY_BACKOFF_MS * 2 ** min(self._failures - 1, 10),
        )
        self._next_heartbeat_ms = self.now_ms + max(MIN_RETRY_BACKOFF_MS, backoff)
        self.notices.append(Notice(level, f"{why} (attempt {self._failures})"))

    def _heartbeat_blocked(self) -> bool:
        """Whether only a report (an answer, a stop, a lookup) can make a heartbeat due."""
        if self._in_flight is not None or self._finding or self.phase is Phase.LEFT:
            return True
        if self.phase is Phase.STOPPING:
            return self._still_stopping()
        # Stop first, then rejoin or leave; a member that is leaving keeps heartbeating while
        # it stops (its session must not expire while it still runs work).
        if self.phase is Phase.LEAVING and self.epoch > JOIN_EPOCH:
            return False
        return self.phase in (Phase.REJOINING, Phase.LEAVING) and self._still_stopping()

    def _still_stopping(self) -> bool:
        """Whether anything runs, is starting, or is being stopped: a stop whose resources were
        all released early is still in progress until the listener returns (`work_stopped`),
        and nothing that waits for the stop (a leave, a rejoin) may go before it."""
        return bool(self.owned) or self._stopping is not None

    def _heartbeat_due(self) -> HeartbeatRequest | None:
        if self._heartbeat_blocked():
            return None
        if self.phase is Phase.STOPPING:
            self.phase = Phase.LEFT  # everything stopped: nothing more to say
            return None
        if self.now_ms < self._next_heartbeat_ms:
            return None
        if self.phase is Phase.REJOINING:
            self.phase = Phase.JOINING
        if self.phase is Phase.LEAVING:
            if self.epoch == JOIN_EPOCH:  # never joined, or lost it: nothing to leave
                self.phase = Phase.LEFT
                return None
            if self._still_stopping():
                return self._member_heartbeat()  # keep the session while stopping
            leave = STATIC_LEAVE_EPOCH if self.config.instance_id else LEAVE_EPOCH
            return HeartbeatRequest(
                self.config.group_id,
                self.config.member_id,
                leave,
                instance_id=self.config.instance_id,
            )
        return self._member_heartbeat()

    def _member_heartbeat(self) -> HeartbeatRequest:
        c = self.config
        owned = self.owned
        full = HeartbeatRequest(
            c.group_id,
            c.member_id,
            self.epoch,
            instance_id=c.instance_id,
            rebalance_timeout_ms=c.rebalance_timeout_ms,
            client_assignors=c.assignors,
            owned=owned,
            url=c.url,
        )
        if self._full_next or self.phase is Phase.JOINING or self._last_sent is None:
            return full
        return HeartbeatRequest(
            c.group_id,
            c.member_id,
            self.epoch,
            owned=owned if owned != self._last_reported_owned else None,
        )

    def _on_success(self, sent: HeartbeatRequest, sent_ms: int, resp: HeartbeatResponse) -> None:
        if sent.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            self.phase = Phase.LEFT
            self.epoch = sent.member_epoch
            return
        if self.phase is Phase.LEAVING and self.epoch == JOIN_EPOCH and sent.member_epoch == 0:
            self.epoch = resp.member_epoch  # joined just before leaving: leave properly
            return
        if self.phase is Phase.LEAVING and sent.member_epoch > JOIN_EPOCH:
            # A keepalive while stopping before the leave: keep the session, take nothing new.
            self._refresh_session(sent_ms, resp)
            self.epoch = resp.member_epoch
            return
        if self.phase is not Phase.JOINING and self.phase is not Phase.MEMBER:
            return  # an answer that arrived after we decided to leave or rejoin: ignore it
        self._refresh_session(sent_ms, resp)
        previous_epoch = self.epoch
        self.phase = Phase.MEMBER
        self.epoch = resp.member_epoch
        new_assignment = resp.assignment.resources if resp.assignment is not None else None
        if self.config.eager:
            self._eager_on_answer(sent, previous_epoch, new_assignment)
        if new_assignment is not None:
            assert resp.assignment is not None
            self._take_tokens(new_assignment, resp.assignment.tokens)
            self.assigned = new_assignment
        if resp.error_code is ErrorCode.COMPUTE_ASSIGNMENT and not self._computing:
            self._compute_requested = True  # (repeats while computing are not replayed)

    def _refresh_session(self, sent_ms: int, resp: HeartbeatResponse) -> None:
        self._failures = 0
        self._full_next = False
        self.last_success_sent_ms = sent_ms
        if resp.heartbeat_interval_ms > 0:
            self.heartbeat_interval_ms = resp.heartbeat_interval_ms
        if resp.session_timeout_ms > 0:
            self.session_timeout_ms = resp.session_timeout_ms
        self._next_heartbeat_ms = self.now_ms + self.heartbeat_interval_ms
        if self.owned != self._last_reported_owned:
            # What it runs changed while this heartbeat was on its way (a stop or start
            # finished): report it at once rather than an interval later (partial releases
            # alone: once the coalescing gap since this heartbeat was sent has passed).
            self._next_heartbeat_ms = self.now_ms
            if self._release_unreported:
                self._next_heartbeat_ms = max(self.now_ms, sent_ms + RELEASE_HEARTBEAT_GAP_MS)

    def _eager_on_answer(
        self, sent: HeartbeatRequest, previous_epoch: int, new_assignment: ResourceSet | None
    ) -> None:
        changed = (previous_epoch not in (JOIN_EPOCH, self.epoch)) or (
            new_assignment is not None and new_assignment != self.assigned
        )
        if self._eager_restart:
            # The restart ends with the first answer to a heartbeat that reported nothing run.
            if not self.owned and sent.owned is not None and not sent.owned:
                self._eager_restart = False
            return
        if changed and self.owned:
            self._eager_restart = True
