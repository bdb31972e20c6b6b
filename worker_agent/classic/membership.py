"""The agent's classic membership machine (DESIGN 3.19, "Connect today"): a Kafka Connect worker
on Kafka's classic group protocol, as Connect's `WorkerCoordinator`, clients'
`AbstractCoordinator` (with its `Heartbeat` timers) and the rebalance handling of
`DistributedHerder` behave (apache/kafka commit 1eb7644349cb07139d6a3c1ad1986979647cac99).
Pure, in the style of `worker_agent.membership`: no I/O, no clock of its own; the runtime asks
`poll(now)` what to do and reports back what happened.

The rules, each with what it follows:

- Protocols offered (Connect's `ConnectProtocolCompatibility`, `metadataRequest` of
  `ConnectProtocol` / `IncrementalCooperativeConnectProtocol`): eager `default`; compatible
  `compatible`, `default`; sessioned `sessioned`, `compatible`, `default`. Versions 1-2 carry the
  allocation: what the worker runs, or absent when it has no assignment snapshot (its first join,
  after KAFKA-9184's revoke or a self-fence). No `group_instance_id`: static membership is
  connect-only (DESIGN 3.19). WorkerCoordinatorTest.testMetadata,
  WorkerCoordinatorIncrementalTest.testMetadata / testMetadataWithExistingAssignment. Departure:
  the allocation is what runs, which equals Connect's snapshot except after an eager revocation,
  where Connect still lists the stopped work
  (testMetadataWithExistingAssignmentButOlderProtocolSelection); reporting stopped work would
  tell a cooperative leader and the coordinator it still runs. For the same reason the snapshot
  shrinks to what runs when a JoinGroup goes: work assigned but not started yet (a rebalance
  noticed between the SyncGroup answer and the start) is given up, never started afterwards,
  since the coordinator takes what the allocation omits as released. Under the eager protocol
  such work is revoked with the rest of the snapshot (onJoinPrepare) and never started.
- Before a JoinGroup (`AbstractCoordinator.joinGroupIfNeeded` -> `WorkerCoordinator.onJoinPrepare`,
  once per rebalance, again after a reset): under the eager protocol every resource is stopped
  first; under compatible/sessioned the worker keeps running. Either way a JoinGroup is sent only
  when nothing is being stopped or started, so revoked work is always stopped (and the listener
  told) before the JoinGroup that reports the allocation (DistributedHerder's `onRevoked` stops
  synchronously, its tick starts work before it polls again).
- After the JoinGroup: the leader runs the ports (`leader.ClassicLeader`, Connect's
  `onLeaderElected`) and sends their assignments; a follower sends an empty SyncGroup
  (`onJoinFollower`).
- SyncGroup answered (`WorkerCoordinator.onJoinComplete`): versions 1-2 stop `revoked` and add
  `assignment` to the snapshot (the delta merge); version 0 takes `assignment` as the whole set.
  Then (`DistributedHerder.handleRebalanceCompleted`) the new work starts, and after a revocation
  the worker rejoins at once; a `delay` > 0 schedules a rejoin that long after the assignment
  (`RebalanceListener.onAssigned`'s `scheduledRebalance`). WorkerCoordinatorTest.testRejoinGroup;
  DistributedHerderTest.testIncrementalCooperativeRebalanceForExistingMember (a revocation, then
  a rejoin) and testIncrementalCooperativeRebalanceWithDelay (a rejoin when the delay ends).
- Errors (`JoinGroupResponseHandler`, `SyncGroupResponseHandler`, `HeartbeatResponseHandler`):
  MEMBER_ID_REQUIRED: rejoin at once with the id given. UNKNOWN_MEMBER_ID: member id and
  generation reset, rejoin at once. ILLEGAL_GENERATION: generation reset (member id kept), rejoin
  at once. REBALANCE_IN_PROGRESS: rejoin at once (a heartbeat's only when STABLE; during a
  rebalance it is ignored). Heartbeat errors for a generation that has since changed are ignored
  (`generationUnchanged`). NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE and a call that got no
  answer (`CoordinatorResponseHandler.onFailure`: a disconnect) mark the coordinator unknown:
  FindCoordinator, then retry after `retry_backoff_ms`. COORDINATOR_LOAD_IN_PROGRESS and other
  retriable errors: retry after `retry_backoff_ms` (`joinGroupIfNeeded`'s `timer.sleep`).
  INCONSISTENT_GROUP_PROTOCOL, INVALID_SESSION_TIMEOUT, INVALID_GROUP_ID,
  GROUP_AUTHORIZATION_FAILED, GROUP_MAX_SIZE_REACHED, INVALID_REQUEST, FENCED_INSTANCE_ID,
  POLICY_VIOLATION, UNSUPPORTED_VERSION are fatal (Connect's herder thread dies on them:
  `DistributedHerder.run`): stop everything, then exit; for INCONSISTENT_GROUP_PROTOCOL and
  UNSUPPORTED_VERSION, configuration errors, the log lines say what to do. Departure:
  UNKNOWN_SERVER_ERROR and unknown codes are retried with backoff, not fatal (Kafka throws a
  KafkaException); the coordinator's are transient.
- Heartbeats (`AbstractCoordinator.HeartbeatThread`, `Heartbeat`): every `heartbeat_interval_ms`
  from the previous send, while waiting for the SyncGroup and when STABLE; a failed one is retried
  after `retry_backoff_ms * 2^attempts` capped at `retry_backoff_max_ms` (Kafka's
  ExponentialBackoff, without its jitter: the machine is deterministic). Departure: a worker
  that has a generation also heartbeats while its JoinGroup is parked (Kafka does not). The
  coordinator answers REBALANCE_IN_PROGRESS, which keeps the fence clock below going through a
  long join phase, so a cooperative worker is not fenced while it waits for slow members.
- KAFKA-9184 (`WorkerCoordinator.poll`): when the coordinator stays unknown for a heartbeat
  interval (Connect's `coordinatorDiscoveryTimeoutMs`), everything is revoked and the snapshot
  dropped; member id and generation are kept, and the worker rejoins (with no allocation) once
  the coordinator is found. Connect checks this only in its poll loop; here in every phase.
  DistributedHerderTest's `coordinatorDiscoveryTimeoutMs` cases time the same interval.
- Self-fencing (DESIGN 3.13 on 3.19's classic hold rule): the coordinator holds a removed
  member's work for the member's own session timeout from the last answer sent to it with an
  error other than UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION. The machine stops everything, then
  rejoins (generation reset, member id kept), when its session timeout less a margin (one
  heartbeat interval, at least a fifth of the session) has passed since it sent the last request
  answered NONE or REBALANCE_IN_PROGRESS for the member id its work was granted under. Stricter
  than the hold's rule on purpose: other errors (NOT_COORDINATOR from a process that does not own
  the group, a throttle) do not show the member was still a member, and after UNKNOWN_MEMBER_ID
  answers to the new member id do not extend the old work's deadline (the old id's hold covers
  it, not the new id), so a cooperative worker that keeps its work across UNKNOWN_MEMBER_ID (as
  Connect does) stops it by then at the latest.
- Leaving (`DistributedHerder.halt`, then `AbstractCoordinator.maybeLeaveGroup`): stop
  everything (heartbeating meanwhile), then one LeaveGroup if the worker has a member id and the
  coordinator is known; its answer or failure ends it.

- Configs first (DESIGN 3.20): as in connect mode (`membership.with_configs`), a resource is
  started only once its connector is among `ready_connectors` (when the runtime sets it); the
  rejoin after a revocation still waits for the whole assignment to have started.

Times are milliseconds of a monotonic clock the runtime passes in.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from connect_protocol.classic_messages import (
    PROTOCOL_VERSIONS,
    ClassicHeartbeatRequest,
    ClassicHeartbeatResponse,
    ClassicProtocol,
    ConnectWorkerMetadata,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    LeavingMember,
    SyncGroupAssignment,
    SyncGroupRequest,
    SyncGroupResponse,
)
from connect_protocol.errors import ErrorCode
from connect_protocol.resources import EMPTY, ResourceSet
from connect_protocol.tokens import NO_TOKENS, FencingTokens

from ..membership import FindCoordinator, Notice, StartWork, StopWork, with_configs, with_fix
from .leader import ClassicLeader
from .values import DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS

__all__ = [
    "CONFIGURATION_ERRORS",
    "FATAL_ERRORS",
    "JOIN_GROUP_TIMEOUT_LAPSE_MS",
    "NO_GENERATION",
    "PROTOCOL_LISTS",
    "ClassicAction",
    "ClassicConfig",
    "ClassicMembership",
    "ClassicPhase",
    "SendClassicHeartbeat",
    "SendJoinGroup",
    "SendLeaveGroup",
    "SendSyncGroup",
]

#: Kafka's `Generation.NO_GENERATION.generationId`.
NO_GENERATION = -1
#: Kafka's `AbstractCoordinator.JOIN_GROUP_TIMEOUT_LAPSE`: JoinGroup and SyncGroup deadlines are
#: the rebalance timeout plus this (DESIGN 3.19, "Long polls hold no thread").
JOIN_GROUP_TIMEOUT_LAPSE_MS = 5_000
#: What each `connect.protocol` setting offers, most preferred first (ConnectProtocolCompatibility).
PROTOCOL_LISTS: dict[str, tuple[str, ...]] = {
    "default": ("default",),
    "compatible": ("compatible", "default"),
    "sessioned": ("sessioned", "compatible", "default"),
}
#: Refusals only an operator can resolve, with what to do, which the fatal error's log lines
#: carry (DESIGN 3.19, "Migration policy" and "Feature flag").
CONFIGURATION_ERRORS: dict[ErrorCode, str] = {
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: (
        "the group does not take this worker's classic protocol (the message says why): if its "
        "group.protocol.migration.policy admits no classic worker, change the policy "
        "(coordinator-svc alter-configs GROUP --set group.protocol.migration.policy="
        "bidirectional) or run this worker with --group-protocol connect; if the protocols do "
        "not fit the group's, change --protocol"
    ),
    ErrorCode.UNSUPPORTED_VERSION: (
        "the coordinator does not serve this call's version (a Kafka-compatible coordinator "
        "without Connect's classic group protocol): run this worker with --group-protocol "
        "connect, or point it at a coordinator that serves the classic protocol"
    ),
}
#: Errors after which the worker cannot stay: stop everything and exit.
FATAL_ERRORS = frozenset(
    {
        ErrorCode.INVALID_SESSION_TIMEOUT,
        ErrorCode.INVALID_GROUP_ID,
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.GROUP_MAX_SIZE_REACHED,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.FENCED_INSTANCE_ID,
        ErrorCode.POLICY_VIOLATION,
        *CONFIGURATION_ERRORS,
    }
)
_COORDINATOR_ERRORS = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
#: Answers that show the member was still a member when they were sent (the fence clock).
_PROOF_CODES = frozenset({ErrorCode.NONE, ErrorCode.REBALANCE_IN_PROGRESS})


class ClassicPhase(enum.Enum):
    UNJOINED = "UNJOINED"  # no JoinGroup in flight; joins when a rejoin is needed
    JOINING = "JOINING"  # JoinGroup in flight (Kafka's PREPARING_REBALANCE)
    SYNCING = "SYNCING"  # SyncGroup in flight (COMPLETING_REBALANCE)
    STABLE = "STABLE"  # the generation's assignment is applied
    LEAVING = "LEAVING"  # stopping everything, then LeaveGroup
    STOPPING = "STOPPING"  # a fatal error: stopping everything, then the agent exits
    LEFT = "LEFT"  # done: the agent may exit


@dataclass(frozen=True, slots=True)
class ClassicConfig:
    """A classic worker's group settings (Connect's DistributedConfig names in comments).

    Attributes:
        group_id: `group.id`.
        protocol: `connect.protocol`: "default" (eager), "compatible" or "sessioned".
        url: the worker's REST URL.
        session_timeout_ms: `session.timeout.ms`.
        rebalance_timeout_ms: `rebalance.timeout.ms`.
        heartbeat_interval_ms: `heartbeat.interval.ms`.
        retry_backoff_ms, retry_backoff_max_ms: `retry.backoff.ms`, `retry.backoff.max.ms`.
        request_timeout_ms: `request.timeout.ms`, the deadline of Heartbeat and LeaveGroup.
        scheduled_rebalance_max_delay_ms: `scheduled.rebalance.max.delay.ms`, used by the
            leader's assignor when the coordinator's JoinGroup answer does not carry the group's.
    """

    group_id: str
    protocol: str = "sessioned"
    url: str = ""
    session_timeout_ms: int = 10_000
    rebalance_timeout_ms: int = 60_000
    heartbeat_interval_ms: int = 3_000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1_000
    request_timeout_ms: int = 40_000
    scheduled_rebalance_max_delay_ms: int = DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOL_LISTS:
            raise ValueError(
                f"connect.protocol must be one of {sorted(PROTOCOL_LISTS)}, not {self.protocol!r}"
            )
        if not 0 < self.heartbeat_interval_ms < self.session_timeout_ms:
            raise ValueError("the heartbeat interval must be > 0 and below the session timeout")
        if self.rebalance_timeout_ms <= 0 or self.retry_backoff_ms <= 0:
            raise ValueError("the rebalance timeout and the retry backoff must be > 0")


# --- actions: what the runtime must do --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendJoinGroup:
    """Call JoinGroup (it may be held until the join phase ends); report `on_join_response` or
    `on_call_failed("join", ...)`."""

    request: JoinGroupRequest
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class SendSyncGroup:
    """Call SyncGroup; report `on_sync_response` or `on_call_failed("sync", ...)`."""

    request: SyncGroupRequest
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class SendClassicHeartbeat:
    """Call Heartbeat; report `on_heartbeat_response` or `on_call_failed("heartbeat", ...)`."""

    request: ClassicHeartbeatRequest
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class SendLeaveGroup:
    """Call LeaveGroup once; report `on_leave_response` or `on_call_failed("leave", ...)`."""

    request: LeaveGroupRequest
    deadline_ms: int


ClassicAction = (
    SendJoinGroup
    | SendSyncGroup
    | SendClassicHeartbeat
    | SendLeaveGroup
    | StopWork
    | StartWork
    | FindCoordinator
)


@dataclass
class _Call:
    """A call in flight: what it was sent with (Kafka's `sentGeneration`)."""

    kind: str
    sent_ms: int
    generation: int
    member_id: str
    #: A reset happened since it was sent: its answer only ends it.
    stale: bool = False


@dataclass
class ClassicMembership:
    """One classic worker's membership (see the module docstring for the rules).

    Attributes:
        member_id: the coordinator-made id (empty until MEMBER_ID_REQUIRED gives one).
        generation: the generation joined (NO_GENERATION when reset).
        protocol_name: the generation's protocol (None until a JoinGroup answered).
        current_protocol: the protocol the last completed generation ran (Connect's
            `currentConnectProtocol`; the configured one before): decides eager or cooperative.
        snapshot: what the worker was last assigned after the merge (Connect's
            `assignmentSnapshot`); None: none (first join, after KAFKA-9184 or a fence).
        running: what the worker runs (changed only by `work_stopped` / `work_started`).
        tokens: the fencing token of every resource assigned or running (DESIGN 3.18).
        last_completed_generation: Connect's `lastCompletedGenerationId` (KAFKA-9848).
        scheduled_rebalance_ms: when the leader's delay ends and the worker rejoins.
        fatal: why the agent must exit, after a fatal error.
    """

    config: ClassicConfig
    now_ms: int = 0
    phase: ClassicPhase = ClassicPhase.UNJOINED
    member_id: str = ""
    generation: int = NO_GENERATION
    protocol_name: str | None = None
    current_protocol: str = ""
    leader_id: str = ""
    leader_url: str = ""
    snapshot: ResourceSet | None = None
    running: ResourceSet = EMPTY
    tokens: FencingTokens = NO_TOKENS
    last_completed_generation: int = NO_GENERATION
    scheduled_rebalance_ms: int | None = None
    fatal: str | None = None
    #: The LeaveGroup was answered NONE (the runtime's "left" outcome).
    left_group: bool = False
    #: How often the worker fenced itself (session) and revoked for KAFKA-9184 (metrics).
    self_fences: int = 0
    unreachable_revokes: int = 0
    leader: ClassicLeader = field(init=False)
    notices: list[Notice] = field(default_factory=list)
    #: The connectors whose configs the worker has (DESIGN 3.20): only their resources are
    #: started. None: no such gate.
    ready_connectors: frozenset[str] | None = None

    _rejoin_needed: bool = True
    _rejoin_reason: str = "joining"
    _needs_join_prepare: bool = True
    _eager_revoked: bool = False
    _rejoin_after_work: bool = False
    _join_not_before_ms: int = 0
    _group_call: _Call | None = None
    _sync_to_send: SyncGroupRequest | None = None
    _join_answer: JoinGroupResponse | None = None
    _heartbeat: _Call | None = None
    _next_heartbeat_ms: int = 0
    _heartbeat_attempts: int = 0
    _leave_sent: bool = False
    _coordinator_unknown_since: int | None = None
    _find_requested: str | None = None
    _finding: bool = False
    _find_attempts: int = 0
    _find_not_before_ms: int = 0
    _proof_sent_ms: int | None = None
    _work_member_id: str = ""
    _stopping: StopWork | None = None
    _starting: StartWork | None = None

    def __post_init__(self) -> None:
        self.current_protocol = self.config.protocol
        self.leader = ClassicLeader(self.config.scheduled_rebalance_max_delay_ms)

    # --- what to do ---------------------------------------------------------------------

    @property
    def eager(self) -> bool:
        """Whether the protocol in force is version 0 (Connect's `currentConnectProtocol`)."""
        return PROTOCOL_VERSIONS[self.current_protocol] == 0

    @property
    def epoch(self) -> int:
        """The generation, under the name the runtime and the listener events use (one counter,
        DESIGN 3.19)."""
        return self.generation

    @property
    def work_member_id(self) -> str:
        """The member id the worker's work was granted under (it may differ from `member_id`
        for a while after UNKNOWN_MEMBER_ID)."""
        return self._work_member_id

    @property
    def ready(self) -> bool:
        """Whether the worker runs its generation's assignment (the status endpoint's
        readiness)."""
        return self.phase is ClassicPhase.STABLE

    @property
    def rebalancing(self) -> bool:
        """Whether a rebalance of this worker is under way or due: not STABLE, a rejoin pending,
        or work being stopped or started."""
        return (
            self.phase is not ClassicPhase.STABLE
            or self._rejoin_needed
            or self._rejoin_after_work
            or self._stopping is not None
            or self._starting is not None
        )

    @property
    def owned(self) -> ResourceSet:
        """What the worker may be running: what runs plus what it is starting now."""
        starting = self._starting.resources if self._starting is not None else EMPTY
        return self.running | starting

    def poll(self, now_ms: int) -> list[ClassicAction]:
        """Everything the runtime should start now (each at most once until reported)."""
        self.now_ms = now_ms
        self._check_self_fence()
        self._check_coordinator_unknown()
        self._check_scheduled_rebalance()
        self._check_rejoin_after_work()
        self._maybe_prepare_join()
        actions: list[ClassicAction] = []
        to_stop = self._to_stop()
        if to_stop and self._stopping is None:
            self._stopping = StopWork(
                to_stop, self.generation, self._stop_reason(), self._tokens_of(to_stop)
            )
            actions.append(self._stopping)
        finding = self._find_requested is not None and not self._finding
        if finding and now_ms >= self._find_not_before_ms:
            self._finding = True
            actions.append(FindCoordinator(self._find_requested or ""))
        to_start = self._to_start()
        if to_start and self._starting is None and self._stopping is None:
            self._starting = StartWork(to_start, self.generation, self._tokens_of(to_start))
            actions.append(self._starting)
        call = self._group_call_due()
        if call is not None:
            actions.append(call)
        heartbeat = self._heartbeat_due()
        if heartbeat is not None:
            actions.append(heartbeat)
        leave = self._leave_due()
        if leave is not None:
            actions.append(leave)
        return actions

    def next_wakeup_ms(self) -> int:
        """When `poll` may have something new to do, absent any report."""
        times = [self.now_ms + self.config.heartbeat_interval_ms]
        if self._heartbeat is None and self._heartbeats_wanted():
            times.append(self._next_heartbeat_ms)
        if self._rejoin_needed:
            times.append(self._join_not_before_ms)
        if self.scheduled_rebalance_ms is not None:
            times.append(self.scheduled_rebalance_ms)
        if self._coordinator_unknown_since is not None:
            times.append(self._coordinator_unknown_since + self.config.heartbeat_interval_ms)
            times.append(self._find_not_before_ms)
        fence = self.fence_deadline_ms()
        if fence is not None:
            times.append(fence)
        return max(self.now_ms, min(times))

    def fence_deadline_ms(self) -> int | None:
        """When the worker fences itself unless a proof of membership arrives first (None: it
        holds no work). The runtime caps every call's deadline at it."""
        if self._proof_sent_ms is None or not self._has_work():
            return None
        c = self.config
        margin = max(c.heartbeat_interval_ms, c.session_timeout_ms // 5)
        return self._proof_sent_ms + max(0, c.session_timeout_ms - margin)

    def drain_notices(self) -> list[Notice]:
        out, self.notices = self.notices, []
        return out

    # --- reports from the runtime --------------------------------------------------------

    def on_join_response(self, resp: JoinGroupResponse, now_ms: int) -> None:
        """JoinGroupResponseHandler.handle."""
        self.now_ms = now_ms
        call = self._end_group_call("join")
        if call is None:
            return
        code = resp.error_code
        if call.stale or self.phase is not ClassicPhase.JOINING:
            self._after_stale_call()
            return
        self._maybe_proof(call, resp.member_id or call.member_id, code)
        if code is ErrorCode.NONE:
            self.generation = resp.generation_id
            self.member_id = resp.member_id or call.member_id
            self.protocol_name = resp.protocol_name
            self.phase = ClassicPhase.SYNCING
            # Kafka's heartbeat thread goes on at its interval. A worker that runs work
            # heartbeats at once instead: the heartbeat in flight across the join phase's end
            # is answered ILLEGAL_GENERATION (no proof of membership), and waiting a whole
            # interval more could let its fence clock run out on a join phase of a few
            # hundred ms (seen at scaled-down timeouts).
            wait = 0 if self._has_work() else self.config.heartbeat_interval_ms
            self._next_heartbeat_ms = now_ms + wait
            assignments: tuple[SyncGroupAssignment, ...] = ()
            if resp.is_leader:
                try:
                    assignments = self.leader.assign(
                        resp,
                        last_completed_generation=self.last_completed_generation,
                        now_ms=now_ms,
                    )
                except ValueError as error:
                    self._fatal(f"cannot assign as the leader: {error}")
                    return
            self._sync_to_send = SyncGroupRequest(
                group_id=self.config.group_id,
                generation_id=self.generation,
                member_id=self.member_id,
                protocol_type=resp.protocol_type or "connect",
                protocol_name=resp.protocol_name,
                assignments=assignments,
            )
            return
        self.phase = ClassicPhase.UNJOINED
        why = f"JoinGroup: {code.name}: {resp.error_message}"
        if code is ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = resp.member_id
            self.generation = NO_GENERATION
            self._request_rejoin(f"rejoin with the member id given: {resp.member_id}")
        elif code is ErrorCode.UNKNOWN_MEMBER_ID:
            self._reset(why, reset_member_id=True)
        elif code is ErrorCode.REBALANCE_IN_PROGRESS:
            self._request_rejoin(why)
        else:
            self._failed_group_call(code, why)

    def on_sync_response(self, resp: SyncGroupResponse, now_ms: int) -> None:
        """SyncGroupResponseHandler.handle, then WorkerCoordinator.onJoinComplete."""
        self.now_ms = now_ms
        call = self._end_group_call("sync")
        if call is None:
            return
        code = resp.error_code
        if call.stale or self.phase is not ClassicPhase.SYNCING:
            self._after_stale_call()
            return
        self._maybe_proof(call, call.member_id, code)
        why = f"SyncGroup: {code.name}: {resp.error_message}"
        if code is ErrorCode.NONE:
            self._join_complete(resp)
            return
        self.phase = ClassicPhase.UNJOINED
        if code is ErrorCode.REBALANCE_IN_PROGRESS:
            self._request_rejoin(why)
        elif code is ErrorCode.UNKNOWN_MEMBER_ID:
            self._reset(why, reset_member_id=True)
        elif code is ErrorCode.ILLEGAL_GENERATION:
            self._reset(why, reset_member_id=False)
        else:
            self._failed_group_call(code, why)

    def on_heartbeat_response(self, resp: ClassicHeartbeatResponse, now_ms: int) -> None:
        """HeartbeatResponseHandler.handle and the heartbeat thread's listener."""
        self.now_ms = now_ms
        call, self._heartbeat = self._heartbeat, None
        if call is None:
            return
        code = resp.error_code
        self._maybe_proof(call, call.member_id, code)
        unchanged = (call.generation, call.member_id) == (self.generation, self.member_id)
        if code is ErrorCode.NONE:
            self._heartbeat_attempts = 0
        elif code is ErrorCode.REBALANCE_IN_PROGRESS:
            self._heartbeat_attempts = 0  # "it is valid to continue heartbeating"
            if self.phase is ClassicPhase.STABLE and unchanged:
                self._request_rejoin("the group is rebalancing (Heartbeat)")
        elif code in (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID):
            if unchanged and self.phase in (ClassicPhase.SYNCING, ClassicPhase.STABLE):
                self._reset(
                    f"Heartbeat: {code.name}: {resp.error_message}",
                    reset_member_id=code is ErrorCode.UNKNOWN_MEMBER_ID,
                )
            else:
                self._heartbeat_attempts = 0  # stale: "ignoring the error"
        elif code in FATAL_ERRORS:
            why = f"Heartbeat: {code.name}: {resp.error_message}"
            self._fatal(with_fix(why, code, CONFIGURATION_ERRORS))
        else:
            if code in _COORDINATOR_ERRORS:
                self._coordinator_unknown(f"Heartbeat: {code.name}")
            self._fail_heartbeat(f"Heartbeat: {code.name}: {resp.error_message}")

    def on_leave_response(self, resp: LeaveGroupResponse, now_ms: int) -> None:
        """The LeaveGroup is a single attempt (`maybeLeaveGroup`): any answer ends it."""
        self.now_ms = now_ms
        if resp.error_code is not ErrorCode.NONE:
            self.notices.append(Notice("info", f"LeaveGroup: {resp.error_code.name}"))
        else:
            self.left_group = True
        self._left()

    def on_call_failed(self, kind: str, error: str, now_ms: int) -> None:
        """A call got no answer (transport error, deadline): Kafka's DisconnectException marks
        the coordinator unknown; the call is retried once it is found again."""
        self.now_ms = now_ms
        why = f"{kind} failed: {error}"
        if kind == "leave":
            self._left()
            return
        if kind == "heartbeat":
            if self._heartbeat is None:
                return
            self._heartbeat = None
            self._coordinator_unknown(why)
            self._fail_heartbeat(why)
            return
        call = self._end_group_call(kind)
        if call is None:
            return
        if call.stale or self.phase not in (ClassicPhase.JOINING, ClassicPhase.SYNCING):
            self._after_stale_call()
            return
        self.phase = ClassicPhase.UNJOINED
        self._coordinator_unknown(why)
        self._failed_group_call(ErrorCode.COORDINATOR_NOT_AVAILABLE, why)

    def coordinator_found(self, now_ms: int) -> None:
        """FindCoordinator answered (`ensureCoordinatorReady`): the coordinator is known."""
        self.now_ms = now_ms
        self._finding = False
        self._find_requested = None
        self._find_attempts = 0
        self._coordinator_unknown_since = None

    def coordinator_lookup_failed(self, error: str, now_ms: int) -> None:
        """FindCoordinator failed: retry after the backoff."""
        self.now_ms = now_ms
        self._finding = False
        self._find_not_before_ms = now_ms + self._backoff(self._find_attempts)
        self._find_attempts += 1
        self.notices.append(Notice("info", f"FindCoordinator failed: {error}"))

    def work_stopped(self, resources: ResourceSet, now_ms: int) -> None:
        """The listener's on_revoked returned for the whole StopWork."""
        self.now_ms = now_ms
        self.running = self.running - resources
        self._stopping = None
        self._trim_tokens()

    def work_released(self, resources: ResourceSet, now_ms: int) -> ResourceSet:
        """Part of a StopWork has stopped (the listener's `event.release`). The classic
        protocol acknowledges a revocation only with the next JoinGroup's allocation, sent once
        the whole batch has stopped: nothing is acknowledged now (the empty set)."""
        self.now_ms = now_ms
        self.running = self.running - resources
        return EMPTY

    def work_started(self, resources: ResourceSet, now_ms: int) -> None:
        self.now_ms = now_ms
        self.running = self.running | resources
        self._starting = None

    def leave(self, now_ms: int) -> None:
        """Shutdown (`DistributedHerder.halt`, then `maybeLeaveGroup`): stop everything, then
        LeaveGroup."""
        self.now_ms = now_ms
        if self.phase in (ClassicPhase.LEFT, ClassicPhase.STOPPING, ClassicPhase.LEAVING):
            return
        self.phase = ClassicPhase.LEAVING
        self.scheduled_rebalance_ms = None
        self._sync_to_send = None
        if self._group_call is not None:
            self._group_call.stale = True

    def give_up_leaving(self) -> None:
        """The leave could not be delivered in time: the session timeout removes the member."""
        self.phase = ClassicPhase.LEFT

    # --- transitions ---------------------------------------------------------------------

    def _join_complete(self, resp: SyncGroupResponse) -> None:
        """WorkerCoordinator.onJoinComplete, then the herder's onAssigned."""
        assert self.protocol_name is not None
        a = resp.assignment
        self.current_protocol = self.protocol_name
        self._rejoin_needed = False
        self._needs_join_prepare = True
        self._eager_revoked = False
        self.phase = ClassicPhase.STABLE
        given = a.assignment if a is not None else EMPTY
        revoked = (a.revoked or EMPTY) if a is not None else EMPTY
        if self.eager:
            new = given
        else:
            new = given if self.snapshot is None else (self.snapshot - revoked) | given
            if revoked:
                # DistributedHerder.handleRebalanceCompleted: start the new work, then rejoin.
                self._rejoin_after_work = True
        self.snapshot = new
        self._take_tokens(new, a.tokens if a is not None else NO_TOKENS)
        self.last_completed_generation = self.generation
        if a is not None:
            self.leader_id, self.leader_url = a.leader, a.leader_url
        delay = a.delay if a is not None else 0
        self.scheduled_rebalance_ms = self.now_ms + delay if delay > 0 else None

    def _request_rejoin(self, why: str) -> None:
        """AbstractCoordinator.requestRejoin."""
        self._rejoin_needed = True
        self._rejoin_reason = why
        self.notices.append(Notice("info", f"rejoining: {why}"))

    def _reset(self, why: str, *, reset_member_id: bool) -> None:
        """AbstractCoordinator.resetStateAndRejoin: generation reset (and the member id on
        UNKNOWN_MEMBER_ID), onJoinPrepare again before the next JoinGroup."""
        if self.phase in (ClassicPhase.LEAVING, ClassicPhase.STOPPING, ClassicPhase.LEFT):
            return
        self.generation = NO_GENERATION
        self.protocol_name = None
        if reset_member_id:
            self.member_id = ""
        if self.phase in (ClassicPhase.SYNCING, ClassicPhase.STABLE):
            self.phase = ClassicPhase.UNJOINED
        self._sync_to_send = None
        if self._group_call is not None:
            self._group_call.stale = True
        self._needs_join_prepare = True
        self._request_rejoin(why)

    def _failed_group_call(self, code: ErrorCode, why: str) -> None:
        """A JoinGroup or SyncGroup that failed otherwise: fatal, or retried after the backoff
        (joinGroupIfNeeded's `timer.sleep(retryBackoffMs)`)."""
        if code in FATAL_ERRORS:
            self._fatal(with_fix(why, code, CONFIGURATION_ERRORS))
            return
        if code in _COORDINATOR_ERRORS:
            self._coordinator_unknown(why)
        self._join_not_before_ms = self.now_ms + self.config.retry_backoff_ms
        self._request_rejoin(why)

    def _fatal(self, why: str) -> None:
        self.notices.append(Notice("error", f"cannot stay in the group ({why}); stopping all work"))
        self.fatal = why
        self.phase = ClassicPhase.STOPPING
        self.snapshot = None
        self.scheduled_rebalance_ms = None
        self._sync_to_send = None

    def _left(self) -> None:
        self.phase = ClassicPhase.LEFT
        self.generation = NO_GENERATION
        self.member_id = ""

    def _end_group_call(self, kind: str) -> _Call | None:
        call = self._group_call
        if call is None or call.kind != kind:
            return None
        self._group_call = None
        return call

    def _after_stale_call(self) -> None:
        """The answer to a call sent before a reset, a fence or a leave: it only ends it."""
        if self.phase in (ClassicPhase.JOINING, ClassicPhase.SYNCING):
            self.phase = ClassicPhase.UNJOINED

    def _maybe_proof(self, call: _Call, member_id: str, code: ErrorCode) -> None:
        """The fence clock: the send time of the last request answered NONE or
        REBALANCE_IN_PROGRESS, for the member id the worker's work was granted under."""
        if code not in _PROOF_CODES or not member_id:
            return
        if not self._has_work():
            self._work_member_id = member_id
        if member_id != self._work_member_id:
            return  # work carried over from another member id keeps that id's deadline
        if self._proof_sent_ms is None or call.sent_ms > self._proof_sent_ms:
            self._proof_sent_ms = call.sent_ms

    def _has_work(self) -> bool:
        return bool(self.owned) or bool(self.snapshot)

    def _check_self_fence(self) -> None:
        if self.phase in (ClassicPhase.LEAVING, ClassicPhase.STOPPING, ClassicPhase.LEFT):
            return
        deadline = self.fence_deadline_ms()
        if deadline is None or self.now_ms < deadline:
            return
        assert self._proof_sent_ms is not None
        silent = self.now_ms - self._proof_sent_ms
        self.notices.append(
            Notice(
                "warning",
                f"no answer proving membership for {silent} ms (session timeout "
                f"{self.config.session_timeout_ms} ms): fencing itself, stopping all work",
            )
        )
        self.self_fences += 1
        self._proof_sent_ms = None
        self.snapshot = None
        self.scheduled_rebalance_ms = None
        self._rejoin_after_work = False
        self._heartbeat = None
        self._reset("fenced itself", reset_member_id=False)

    def _coordinator_unknown(self, why: str) -> None:
        """AbstractCoordinator.markCoordinatorUnknown: look it up again."""
        if self._coordinator_unknown_since is None:
            self._coordinator_unknown_since = self.now_ms
        if self._find_requested is None:
            self._find_requested = why

    def _check_coordinator_unknown(self) -> None:
        """KAFKA-9184 (WorkerCoordinator.poll): unknown for a heartbeat interval: revoke all."""
        since = self._coordinator_unknown_since
        if since is None or self.snapshot is None:
            return
        if self.phase in (ClassicPhase.LEAVING, ClassicPhase.STOPPING, ClassicPhase.LEFT):
            return
        if self.now_ms - since < self.config.heartbeat_interval_ms:
            return
        self.notices.append(
            Notice(
                "warning",
                f"coordinator unreachable for {self.now_ms - since} ms: revoking the assignment "
                "so as not to run work while not a member (KAFKA-9184)",
            )
        )
        self.unreachable_revokes += 1
        self.snapshot = None
        self.scheduled_rebalance_ms = None
        self._rejoin_after_work = False
        self._request_rejoin("coordinator unreachable (KAFKA-9184)")

    def _check_scheduled_rebalance(self) -> None:
        """DistributedHerder.handleRebalanceCompleted: `scheduledRebalance <= now` -> rejoin."""
        at = self.scheduled_rebalance_ms
        if at is not None and self.now_ms >= at and self.phase is ClassicPhase.STABLE:
            self.scheduled_rebalance_ms = None
            self._request_rejoin("the scheduled rebalance delay ended")

    def _check_rejoin_after_work(self) -> None:
        """After a revocation the worker rejoins once it has stopped it and started its new
        work (DistributedHerder.handleRebalanceCompleted)."""
        if not self._rejoin_after_work or self.phase is not ClassicPhase.STABLE:
            return
        settled = self._stopping is None and self._starting is None
        if settled and not self._to_stop() and not self._unstarted():
            self._rejoin_after_work = False
            self._request_rejoin("work was revoked")

    # --- what is due ---------------------------------------------------------------------

    def _to_stop(self) -> ResourceSet:
        if self.phase in (ClassicPhase.LEAVING, ClassicPhase.STOPPING, ClassicPhase.LEFT):
            return self.running
        if self.snapshot is None or self._eager_revoked:
            return self.running
        return self.running - self.snapshot

    def _stop_reason(self) -> str:
        if self.phase is ClassicPhase.LEAVING:
            return "leaving"
        if self.phase is ClassicPhase.STOPPING:
            return "fatal error"
        if self.snapshot is None:
            return "membership lost"
        if self._eager_revoked:
            return "eager rebalance"
        return "revoked"

    def _unstarted(self) -> ResourceSet:
        """What the worker is to start once it has the configs."""
        if self.phase is not ClassicPhase.STABLE or self.snapshot is None:
            return EMPTY
        if self._eager_revoked or self.running - self.snapshot:
            return EMPTY
        return self.snapshot - self.running

    def _to_start(self) -> ResourceSet:
        return with_configs(self._unstarted(), self.ready_connectors)

    @property
    def awaiting_configs(self) -> frozenset[str]:
        """Connectors of assigned resources not started because their configs have not come."""
        if self.ready_connectors is None:
            return frozenset()
        waiting = self._unstarted()
        names = waiting.connectors | {t.connector for t in waiting.tasks}
        return frozenset(names - self.ready_connectors)

    def configs_dropped(self, connectors: frozenset[str]) -> None:
        """The worker no longer runs anything of these connectors: their configs must be
        fetched again before anything of them starts."""
        if self.ready_connectors is not None and connectors & self.ready_connectors:
            self.ready_connectors = self.ready_connectors - connectors

    def _group_call_due(self) -> SendJoinGroup | SendSyncGroup | None:
        if self._group_call is not None or self._coordinator_unknown_since is not None:
            return None
        deadline = self.now_ms + self.config.rebalance_timeout_ms + JOIN_GROUP_TIMEOUT_LAPSE_MS
        if self._sync_to_send is not None and self.phase is ClassicPhase.SYNCING:
            request, self._sync_to_send = self._sync_to_send, None
            self._group_call = _Call("sync", self.now_ms, request.generation_id, request.member_id)
            return SendSyncGroup(request, deadline)
        if self.phase not in (ClassicPhase.UNJOINED, ClassicPhase.STABLE):
            return None
        if not (self._rejoin_needed or self.snapshot is None):
            return None
        if self.now_ms < self._join_not_before_ms:
            return None
        if self._stopping is not None or self._starting is not None or self._needs_join_prepare:
            return None  # what runs is settled first
        if self._to_stop():
            return None  # stop first: the JoinGroup reports what runs after the stop
        self.phase = ClassicPhase.JOINING
        self._rejoin_after_work = False  # this JoinGroup is that rejoin
        if self.snapshot is not None and self.snapshot != self.running:
            # The JoinGroup reports what runs, and the coordinator takes the rest as released
            # (DESIGN 3.19): an assignment not started yet is given up with it, never started
            # later (another worker may be given it meanwhile).
            self.snapshot = self.snapshot & self.running
            self._trim_tokens()
        self._group_call = _Call("join", self.now_ms, self.generation, self.member_id)
        return SendJoinGroup(self._join_request(), deadline)

    def _maybe_prepare_join(self) -> None:
        """WorkerCoordinator.onJoinPrepare, once per rebalance (AbstractCoordinator's
        `needsJoinPrepare`) when a JoinGroup is about to go: eager revokes everything, a
        cooperative worker keeps its assignment until it is explicitly revoked."""
        if not self._needs_join_prepare or self._group_call is not None:
            return
        if self.phase not in (ClassicPhase.UNJOINED, ClassicPhase.STABLE):
            return
        if not (self._rejoin_needed or self.snapshot is None):
            return
        if self._coordinator_unknown_since is not None or self.now_ms < self._join_not_before_ms:
            return
        if self._stopping is not None or self._starting is not None:
            return
        self._needs_join_prepare = False
        if self.eager and (self.running or self.snapshot):
            # onJoinPrepare revokes the whole snapshot: an assignment not started yet (its
            # answer arrived just before the rebalance was noticed) is revoked too, so it is
            # never started, and nothing runs when the JoinGroup releases everything.
            self._eager_revoked = True

    def join_protocols(self) -> tuple[ClassicProtocol, ...]:
        """WorkerCoordinator.metadata(): one metadata per protocol offered, most preferred
        first; versions 1-2 carry the allocation."""
        allocation = None if self.snapshot is None else self.running
        return tuple(
            ClassicProtocol(
                name,
                ConnectWorkerMetadata(
                    version=PROTOCOL_VERSIONS[name],
                    url=self.config.url,
                    allocation=allocation if PROTOCOL_VERSIONS[name] > 0 else None,
                ),
            )
            for name in PROTOCOL_LISTS[self.config.protocol]
        )

    def _join_request(self) -> JoinGroupRequest:
        """JoinGroup with the protocols offered (`join_protocols`)."""
        protocols = self.join_protocols()
        c = self.config
        return JoinGroupRequest(
            group_id=c.group_id,
            session_timeout_ms=c.session_timeout_ms,
            rebalance_timeout_ms=c.rebalance_timeout_ms,
            member_id=self.member_id,
            protocols=protocols,
            reason=self._rejoin_reason[:255] or None,
        )

    def _heartbeats_wanted(self) -> bool:
        if self.generation == NO_GENERATION or not self.member_id:
            return False
        if self.phase in (ClassicPhase.SYNCING, ClassicPhase.STABLE, ClassicPhase.JOINING):
            return True
        return self.phase is ClassicPhase.LEAVING and bool(self.owned)

    def _heartbeat_due(self) -> SendClassicHeartbeat | None:
        if self._heartbeat is not None or self._coordinator_unknown_since is not None:
            return None
        if not self._heartbeats_wanted() or self.now_ms < self._next_heartbeat_ms:
            return None
        self._next_heartbeat_ms = self.now_ms + self.config.heartbeat_interval_ms
        self._heartbeat = _Call("heartbeat", self.now_ms, self.generation, self.member_id)
        return SendClassicHeartbeat(
            ClassicHeartbeatRequest(self.config.group_id, self.generation, self.member_id),
            self.now_ms + self.config.request_timeout_ms,
        )

    def _leave_due(self) -> SendLeaveGroup | None:
        if self.phase is ClassicPhase.STOPPING:
            if not self.owned and self._stopping is None:
                self.phase = ClassicPhase.LEFT
            return None
        if self.phase is not ClassicPhase.LEAVING or self._leave_sent:
            return None
        if self.owned or self._stopping is not None:
            return None  # stop everything first
        if not self.member_id or self._coordinator_unknown_since is not None:
            self._left()  # maybeLeaveGroup sends nothing then
            return None
        self._leave_sent = True
        return SendLeaveGroup(
            LeaveGroupRequest(
                self.config.group_id, (LeavingMember(self.member_id, reason="the worker stops"),)
            ),
            self.now_ms + self.config.request_timeout_ms,
        )

    # --- small helpers -------------------------------------------------------------------

    def _backoff(self, attempts: int) -> int:
        """Kafka's ExponentialBackoff(retry.backoff.ms, 2, retry.backoff.max.ms), no jitter."""
        c = self.config
        return min(c.retry_backoff_max_ms, c.retry_backoff_ms << min(attempts, 30))

    def _fail_heartbeat(self, why: str) -> None:
        """Heartbeat.failHeartbeat: the next one after the backoff."""
        self._next_heartbeat_ms = self.now_ms + self._backoff(self._heartbeat_attempts)
        self._heartbeat_attempts += 1
        self.notices.append(Notice("warning", f"{why} (attempt {self._heartbeat_attempts})"))

    def _tokens_of(self, resources: ResourceSet) -> FencingTokens:
        return self.tokens.restricted(resources) if self.tokens else NO_TOKENS

    def _trim_tokens(self) -> None:
        if self.tokens:
            self.tokens = self.tokens.restricted((self.snapshot or EMPTY) | self.running)

    def _take_tokens(self, assignment: ResourceSet, sent: FencingTokens) -> None:
        """The tokens of the whole held set the answer carries; kept for what still runs."""
        kept = self.tokens.restricted(assignment | self.running) if self.tokens else NO_TOKENS
        if not sent:
            self.tokens = kept
            return
        merged = dict(kept)
        merged.update(sent.restricted(assignment))
        self.tokens = FencingTokens(merged)
