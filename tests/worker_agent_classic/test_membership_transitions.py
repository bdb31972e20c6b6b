"""The classic membership machine, one test per transition and per error (pure: no gRPC, no
coordinator). Each names the Connect or Kafka code it follows (apache/kafka commit
1eb7644349cb07139d6a3c1ad1986979647cac99): `WorkerCoordinator` (onJoinPrepare, onJoinComplete,
metadata, poll), `AbstractCoordinator` (joinGroupIfNeeded and the response handlers, the
heartbeat thread, maybeLeaveGroup), `DistributedHerder` (RebalanceListener,
handleRebalanceCompleted, halt); DESIGN 3.13 and 3.19 for the self-fence."""

from __future__ import annotations

import pytest

from connect_protocol.classic_messages import (
    ClassicHeartbeatResponse,
    ConnectWorkerAssignment,
    ConnectWorkerMetadata,
    JoinGroupMember,
    JoinGroupResponse,
    LeaveGroupResponse,
    SyncGroupResponse,
)
from connect_protocol.errors import ErrorCode
from connect_protocol.messages import ConnectorInfo
from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from worker_agent.classic.membership import (
    JOIN_GROUP_TIMEOUT_LAPSE_MS,
    NO_GENERATION,
    ClassicConfig,
    ClassicMembership,
    ClassicPhase,
    SendClassicHeartbeat,
    SendJoinGroup,
    SendLeaveGroup,
    SendSyncGroup,
)
from worker_agent.membership import FindCoordinator, StartWork, StopWork

from .membership_support import (
    BACKOFF_MS,
    INTERVAL_MS,
    REBALANCE_MS,
    SESSION_MS,
    config,
    join_ok,
    joined,
    one,
    only,
    stable,
    sync_ok,
)

C1 = ResourceSet.of(["c1"], [TaskId("c1", 0), TaskId("c1", 1)])
C2 = ResourceSet.of(["c2"], [TaskId("c2", 0)])


def hb(code: ErrorCode = ErrorCode.NONE) -> ClassicHeartbeatResponse:
    return ClassicHeartbeatResponse(code, code.name if code else "")


def answer_heartbeat(m: ClassicMembership, now: int, code: ErrorCode = ErrorCode.NONE) -> None:
    one(m.poll(now), SendClassicHeartbeat)
    m.on_heartbeat_response(hb(code), now)


# --- joining -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("protocol", "names"),
    [
        ("default", ["default"]),
        ("compatible", ["compatible", "default"]),
        ("sessioned", ["sessioned", "compatible", "default"]),
    ],
)
def test_first_join_offers_connects_protocol_list_without_allocation(
    protocol: str, names: list[str]
) -> None:
    """ConnectProtocolCompatibility and WorkerCoordinator.metadata: the first JoinGroup has no
    member id, no instance id, no allocation (no assignment snapshot yet)."""
    m = ClassicMembership(config(protocol))
    join = one(m.poll(0), SendJoinGroup)
    req = join.request
    assert [p.name for p in req.protocols] == names
    assert [p.metadata.version for p in req.protocols] == [
        {"default": 0, "compatible": 1, "sessioned": 2}[n] for n in names
    ]
    assert all(p.metadata.allocation is None for p in req.protocols)
    assert all(p.metadata.url == "http://w1" for p in req.protocols)
    assert req.member_id == "" and req.group_instance_id is None
    assert (req.session_timeout_ms, req.rebalance_timeout_ms) == (SESSION_MS, REBALANCE_MS)
    assert join.deadline_ms == REBALANCE_MS + JOIN_GROUP_TIMEOUT_LAPSE_MS
    assert m.phase is ClassicPhase.JOINING
    assert m.poll(0) == []  # one JoinGroup in flight, no heartbeat before a generation


def test_member_id_required_rejoins_at_once_with_the_id_given() -> None:
    """JoinGroupResponseHandler: MEMBER_ID_REQUIRED -> requestRejoin with the given id."""
    m = ClassicMembership(config())
    one(m.poll(0), SendJoinGroup)
    m.on_join_response(JoinGroupResponse(ErrorCode.MEMBER_ID_REQUIRED, "", member_id="w1-abc"), 5)
    assert one(m.poll(5), SendJoinGroup).request.member_id == "w1-abc"


def test_follower_join_sends_an_empty_sync_for_its_generation() -> None:
    """AbstractCoordinator.onJoinFollower."""
    m = ClassicMembership(config())
    sync = joined(m, 0, generation=7)
    assert sync.request.generation_id == 7 and sync.request.member_id == "w1"
    assert sync.request.assignments == () and sync.request.protocol_name == "sessioned"
    assert sync.deadline_ms == REBALANCE_MS + JOIN_GROUP_TIMEOUT_LAPSE_MS
    assert m.phase is ClassicPhase.SYNCING


def test_heartbeats_while_waiting_for_the_sync() -> None:
    """The heartbeat thread is enabled on the JoinGroup answer (COMPLETING_REBALANCE)."""
    m = ClassicMembership(config())
    joined(m, 0)
    assert m.poll(INTERVAL_MS - 1) == []
    beat = one(m.poll(INTERVAL_MS), SendClassicHeartbeat)
    assert (beat.request.generation_id, beat.request.member_id) == (1, "w1")


def test_a_worker_with_work_heartbeats_at_once_after_its_join_answer() -> None:
    """The heartbeat in flight when the join phase ended is answered ILLEGAL_GENERATION (no
    proof of membership); a worker that runs work sends the next one at once with the new
    generation, so its fence clock is renewed before the session could run out."""
    m = stable("sessioned", C1)
    answer_heartbeat(m, INTERVAL_MS, ErrorCode.REBALANCE_IN_PROGRESS)
    one(m.poll(INTERVAL_MS), SendJoinGroup)
    one(m.poll(2 * INTERVAL_MS), SendClassicHeartbeat)  # during the parked join
    m.on_join_response(join_ok(generation=2), 2 * INTERVAL_MS + 50)
    m.on_heartbeat_response(hb(ErrorCode.ILLEGAL_GENERATION), 2 * INTERVAL_MS + 60)
    beat = one(m.poll(2 * INTERVAL_MS + 60), SendClassicHeartbeat)
    assert beat.request.generation_id == 2


def leader_join(protocol: str = "sessioned", **kw: object) -> JoinGroupResponse:
    version = {"default": 0, "compatible": 1, "sessioned": 2}[protocol]
    members = tuple(
        JoinGroupMember(
            m, ConnectWorkerMetadata(version, f"http://{m}", 0, EMPTY if version else None)
        )
        for m in ("w1", "w2")
    )
    fields: dict[str, object] = {
        "generation_id": 3,
        "protocol_type": "connect",
        "protocol_name": protocol,
        "leader": "w1",
        "member_id": "w1",
        "members": members,
        "catalogue": (ConnectorInfo("c1", 2, {}), ConnectorInfo("c2", 1, {})),
        "group_configs": {"scheduled.rebalance.max.delay.ms": "1234"},
        "coordinator_time_ms": 10_000,
    }
    fields.update(kw)
    return JoinGroupResponse(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("protocol", ["default", "compatible", "sessioned"])
def test_the_leader_assigns_with_the_port_of_its_protocol(protocol: str) -> None:
    """WorkerCoordinator.onLeaderElected: EagerAssignor for `default`, the incremental
    cooperative assignor otherwise; every resource of the catalogue given once."""
    m = ClassicMembership(config(protocol))
    one(m.poll(0), SendJoinGroup)
    m.on_join_response(leader_join(protocol), 0)
    sync = one(m.poll(0), SendSyncGroup)
    given = {a.member_id: a.assignment for a in sync.request.assignments}
    assert sorted(given) == ["w1", "w2"]
    version = {"default": 0, "compatible": 1, "sessioned": 2}[protocol]
    assert {a.version for a in given.values()} == {version}
    everything = given["w1"].assignment | given["w2"].assignment
    assert everything == C1 | C2
    assert given["w1"].assignment.isdisjoint(given["w2"].assignment)


def test_the_leader_takes_the_groups_max_delay() -> None:
    """The coordinator's group_configs beat the worker's own scheduled.rebalance.max.delay.ms."""
    m = ClassicMembership(config())
    one(m.poll(0), SendJoinGroup)
    m.on_join_response(leader_join(), 0)
    assert m.leader.incremental.max_delay_ms == 1234
    m2 = ClassicMembership(config())
    one(m2.poll(0), SendJoinGroup)
    m2.on_join_response(leader_join(group_configs={}), 0)
    assert m2.leader.incremental.max_delay_ms == 3_000


def test_the_leader_never_assigns_withheld_resources() -> None:
    """DESIGN 3.19: resources under a hold are absent from the catalogue for the leader."""
    withheld = C2 | ResourceSet.of([], [TaskId("c1", 1)])
    m = ClassicMembership(config())
    one(m.poll(0), SendJoinGroup)
    m.on_join_response(leader_join(withheld=withheld), 0)
    sync = one(m.poll(0), SendSyncGroup)
    given = [a.assignment.assignment for a in sync.request.assignments]
    assert all(g.isdisjoint(withheld) for g in given)
    assert m.leader.incremental.memory.previous_assignment.isdisjoint(withheld)


# --- the SyncGroup answer ------------------------------------------------------------------------


def test_sync_starts_exactly_the_assignment() -> None:
    """WorkerCoordinator.onJoinComplete + the herder's startWork: only what was given."""
    m = ClassicMembership(config())
    joined(m, 0)
    m.on_sync_response(sync_ok(C1), 0)
    start = one(m.poll(0), StartWork)
    assert start.resources == C1 and start.member_epoch == 1
    assert m.phase is ClassicPhase.STABLE and m.last_completed_generation == 1
    m.work_started(C1, 1)
    assert m.poll(1) == []


def test_cooperative_revocation_stops_first_then_starts_then_rejoins_reporting_what_runs() -> None:
    """onJoinComplete: listener.onRevoked(revoked), snapshot minus revoked plus assignment;
    handleRebalanceCompleted: startWork, then requestRejoin after a revocation."""
    m = stable("sessioned", C1)
    answer_heartbeat(m, 110, ErrorCode.REBALANCE_IN_PROGRESS)
    join = one(m.poll(110), SendJoinGroup)  # cooperative: nothing stopped before joining
    assert join.request.protocols[0].metadata.allocation == C1
    m.on_join_response(join_ok(generation=2), 110)
    one(m.poll(110), SendSyncGroup)
    lost = ResourceSet.of([], [TaskId("c1", 1)])
    m.on_sync_response(sync_ok(C2, revoked=lost), 110)
    actions = m.poll(110)
    stop = one(actions, StopWork)
    assert stop.resources == lost and stop.reason == "revoked"
    assert not only(actions, StartWork) and not only(actions, SendJoinGroup)
    m.work_stopped(lost, 111)
    start = one(m.poll(111), StartWork)
    assert start.resources == C2
    assert not only(m.poll(111), SendJoinGroup)  # not while starting
    m.work_started(C2, 112)
    rejoin = one(m.poll(112), SendJoinGroup)
    assert rejoin.request.protocols[0].metadata.allocation == (C1 - lost) | C2


def test_no_revocation_no_rejoin() -> None:
    m = stable("sessioned", C1)
    assert not only(m.poll(50), SendJoinGroup)


def test_delay_schedules_a_rejoin_after_it() -> None:
    """RebalanceListener.onAssigned: scheduledRebalance = now + delay; the tick rejoins then."""
    m = ClassicMembership(config())
    joined(m, 0)
    m.on_sync_response(sync_ok(C1, delay=250), 0)
    m.work_started(one(m.poll(0), StartWork).resources, 0)
    assert m.scheduled_rebalance_ms == 250
    assert not only(m.poll(249), SendJoinGroup)
    assert m.next_wakeup_ms() <= 250
    join = one(m.poll(250), SendJoinGroup)
    assert join.request.protocols[0].metadata.allocation == C1


def test_eager_stops_everything_before_every_join_and_reports_no_allocation() -> None:
    """WorkerCoordinator.onJoinPrepare under EAGER: onRevoked(everything) before JoinGroup."""
    m = stable("default", C1)
    answer_heartbeat(m, 110, ErrorCode.REBALANCE_IN_PROGRESS)
    actions = m.poll(110)
    stop = one(actions, StopWork)
    assert stop.resources == C1 and stop.reason == "eager rebalance"
    assert not only(actions, SendJoinGroup)
    m.work_stopped(C1, 120)
    join = one(m.poll(120), SendJoinGroup)
    assert join.request.protocols[0].metadata.allocation is None
    m.on_join_response(join_ok(generation=2, protocol="default"), 120)
    one(m.poll(120), SendSyncGroup)
    m.on_sync_response(sync_ok(C2, version=0), 120)  # version 0: the whole set
    assert one(m.poll(120), StartWork).resources == C2
    assert m.snapshot == C2


def test_eager_rebalance_before_the_assignment_started_never_joins_with_it_running() -> None:
    """A REBALANCE_IN_PROGRESS heartbeat answered between the SyncGroup answer and the start of
    its assignment: the eager prepare (onJoinPrepare revokes the whole snapshot) still covers
    that assignment, so the JoinGroup (which releases everything under the `default`
    protocol) goes only once nothing runs. Found end to end: the prepare used to look at what
    ran at the time (nothing) and let the assignment start and run on through the join."""
    m = ClassicMembership(config("default"))
    joined(m, 0, protocol="default")
    one(m.poll(INTERVAL_MS), SendClassicHeartbeat)  # sent while the SyncGroup is held
    m.on_sync_response(sync_ok(C1, version=0), 105)
    m.on_heartbeat_response(hb(ErrorCode.REBALANCE_IN_PROGRESS), 106)
    for now in range(106, 300, 10):
        actions = m.poll(now)
        if only(actions, SendJoinGroup):
            assert not m.owned, f"JoinGroup sent at {now} while {m.owned} may run"
            return
        for start in only(actions, StartWork):
            m.work_started(start.resources, now)
        for stop in only(actions, StopWork):
            m.work_stopped(stop.resources, now)
    raise AssertionError("no JoinGroup was sent")


def test_an_assignment_not_started_before_a_rejoin_is_given_up_with_the_join() -> None:
    """A cooperative worker whose generation is reset (a heartbeat's ILLEGAL_GENERATION) after
    its SyncGroup answer but before its assignment started: the JoinGroup reports what runs,
    so the coordinator takes the unstarted work as released. The worker must give it up too,
    never start it later, or it would run work the coordinator gives to another worker. Found
    end to end (a worker ran a task no member held at the coordinator)."""
    m = ClassicMembership(config("sessioned"))
    joined(m, 0)
    one(m.poll(INTERVAL_MS), SendClassicHeartbeat)  # sent while the SyncGroup is held
    m.on_sync_response(sync_ok(C1), 105)
    m.on_heartbeat_response(hb(ErrorCode.ILLEGAL_GENERATION), 106)
    join = one(m.poll(106), SendJoinGroup)
    assert join.request.protocols[0].metadata.allocation == EMPTY
    m.on_join_response(join_ok(generation=2), 110)
    one(m.poll(110), SendSyncGroup)
    m.on_sync_response(sync_ok(C2), 120)
    started = only(m.poll(120), StartWork)
    assert [s.resources for s in started] == [C2]
    assert m.snapshot == C2


def test_a_sessioned_worker_in_an_eager_generation_behaves_eagerly() -> None:
    """currentConnectProtocol follows the generation's protocol."""
    m = ClassicMembership(config("sessioned"))
    joined(m, 0, protocol="default")
    m.on_sync_response(sync_ok(C1, version=0), 0)
    m.work_started(one(m.poll(0), StartWork).resources, 0)
    assert m.eager
    answer_heartbeat(m, 100, ErrorCode.REBALANCE_IN_PROGRESS)
    assert one(m.poll(100), StopWork).resources == C1


# --- errors --------------------------------------------------------------------------------------


def test_sync_illegal_generation_resets_the_generation_keeps_the_id_and_the_work() -> None:
    """SyncGroupResponseHandler: ILLEGAL_GENERATION -> resetStateOnResponseError without the
    member id; cooperative onJoinPrepare keeps the assignment."""
    m = stable("sessioned", C1)
    answer_heartbeat(m, 110, ErrorCode.REBALANCE_IN_PROGRESS)
    one(m.poll(110), SendJoinGroup)
    m.on_join_response(join_ok(generation=2), 110)
    one(m.poll(110), SendSyncGroup)
    m.on_sync_response(SyncGroupResponse(ErrorCode.ILLEGAL_GENERATION, "old"), 111)
    assert m.generation == NO_GENERATION and m.member_id == "w1"
    actions = m.poll(111)
    assert not only(actions, StopWork)
    join = one(actions, SendJoinGroup)
    assert join.request.member_id == "w1"
    assert join.request.protocols[0].metadata.allocation == C1


def test_heartbeat_unknown_member_resets_the_id_and_rejoins_at_once() -> None:
    """HeartbeatResponseHandler: UNKNOWN_MEMBER_ID -> reset member id and generation."""
    m = stable("sessioned", C1)
    answer_heartbeat(m, 100, ErrorCode.UNKNOWN_MEMBER_ID)
    assert (m.member_id, m.generation) == ("", NO_GENERATION)
    join = one(m.poll(100), SendJoinGroup)
    assert join.request.member_id == ""


def test_eager_unknown_member_stops_everything_before_rejoining() -> None:
    """resetStateAndRejoin sets needsJoinPrepare: an eager worker revokes all again."""
    m = stable("default", C1)
    answer_heartbeat(m, 100, ErrorCode.UNKNOWN_MEMBER_ID)
    assert one(m.poll(100), StopWork).resources == C1


def test_heartbeat_illegal_generation_for_an_old_generation_is_ignored() -> None:
    """HeartbeatResponseHandler: 'if the generation has changed, then ignore this error'."""
    m = stable("sessioned", C1)
    one(m.poll(100), SendClassicHeartbeat)
    m.generation = 5  # a new generation completed while the heartbeat was on its way
    m.on_heartbeat_response(hb(ErrorCode.ILLEGAL_GENERATION), 101)
    assert m.generation == 5 and m.phase is ClassicPhase.STABLE


def test_heartbeat_rebalance_in_progress_while_syncing_is_ignored() -> None:
    m = ClassicMembership(config())
    joined(m, 0)
    answer_heartbeat(m, INTERVAL_MS, ErrorCode.REBALANCE_IN_PROGRESS)
    assert m.phase is ClassicPhase.SYNCING and not only(m.poll(INTERVAL_MS), SendJoinGroup)


def test_join_rebalance_in_progress_rejoins_at_once() -> None:
    m = ClassicMembership(config())
    one(m.poll(0), SendJoinGroup)
    m.on_join_response(JoinGroupResponse(ErrorCode.REBALANCE_IN_PROGRESS, "x"), 3)
    one(m.poll(3), SendJoinGroup)


def test_sync_rebalance_in_progress_rejoins_at_once() -> None:
    m = ClassicMembership(config())
    joined(m, 0)
    m.on_sync_response(SyncGroupResponse(ErrorCode.REBALANCE_IN_PROGRESS, "x"), 3)
    assert one(m.poll(3), SendJoinGroup).request.member_id == "w1"


def test_retriable_join_error_retries_after_the_backoff() -> None:
    """joinGroupIfNeeded: a retriable failure sleeps retry.backoff.ms."""
    m = ClassicMembership(config())
    one(m.poll(0), SendJoinGroup)
    m.on_join_response(JoinGroupResponse(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "x"), 0)
    assert m.poll(BACKOFF_MS - 1) == []
    one(m.poll(BACKOFF_MS), SendJoinGroup)


def test_not_coordinator_looks_the_coordinator_up_before_retrying() -> None:
    """NOT_COORDINATOR -> markCoordinatorUnknown; ensureCoordinatorReady before rejoining."""
    m = ClassicMembership(config())
    one(m.poll(0), SendJoinGroup)
    m.on_join_response(JoinGroupResponse(ErrorCode.NOT_COORDINATOR, "x"), 0)
    actions = m.poll(50)
    one(actions, FindCoordinator)
    assert not only(actions, SendJoinGroup)
    m.coordinator_found(60)
    one(m.poll(60), SendJoinGroup)


def test_a_sync_without_answer_marks_the_coordinator_unknown_then_rejoins() -> None:
    m = ClassicMembership(config())
    joined(m, 0)
    m.on_call_failed("sync", "deadline exceeded", 10)
    one(m.poll(30), FindCoordinator)
    m.coordinator_found(30)
    one(m.poll(30), SendJoinGroup)


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
        ErrorCode.GROUP_MAX_SIZE_REACHED,
        ErrorCode.INVALID_SESSION_TIMEOUT,
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ],
)
def test_fatal_errors_stop_everything_then_leave_the_agent_to_exit(code: ErrorCode) -> None:
    """DistributedHerder.run: an exception out of the tick ends the herder."""
    m = stable("sessioned", C1)
    answer_heartbeat(m, 110, ErrorCode.REBALANCE_IN_PROGRESS)
    one(m.poll(110), SendJoinGroup)
    m.on_join_response(JoinGroupResponse(code, "no"), 111)
    stop = one(m.poll(111), StopWork)
    assert stop.reason == "fatal error" and stop.resources == C1
    m.work_stopped(C1, 112)
    assert m.poll(112) == [] and m.phase is ClassicPhase.LEFT and m.fatal


#: What the classic agent tells the operator to do, per configuration error (DESIGN 3.19).
FIXES = {
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: (
        "change the policy (coordinator-svc alter-configs GROUP --set "
        "group.protocol.migration.policy=bidirectional) or run this worker with "
        "--group-protocol connect; if the protocols do not fit the group's, change --protocol"
    ),
    ErrorCode.UNSUPPORTED_VERSION: (
        "run this worker with --group-protocol connect, or point it at a coordinator that "
        "serves the classic protocol"
    ),
}


def assert_says_what_to_do(m: ClassicMembership, code: ErrorCode, message: str) -> None:
    """The fatal reason (the agent's exit line) and the one ERROR notice name the call, the
    code, the coordinator's message and the fix."""
    assert m.fatal is not None
    assert m.fatal.startswith(f"JoinGroup: {code.name}: {message} [configuration error: ")
    assert m.fatal.endswith(FIXES[code] + "]"), m.fatal
    errors = [n.message for n in m.drain_notices() if n.level == "error"]
    assert len(errors) == 1 and m.fatal in errors[0], errors


@pytest.mark.parametrize("code", list(FIXES))
def test_a_first_join_refused_as_a_configuration_error_exits_without_retrying(
    code: ErrorCode,
) -> None:
    """A classic worker joining a non-empty connect group whose migration policy is `disabled`
    (INCONSISTENT_GROUP_PROTOCOL), or a coordinator that does not serve the call
    (UNSUPPORTED_VERSION; not this product's, which always serves classic): nothing runs, so
    the machine is done at once, and never sends another JoinGroup."""
    m = ClassicMembership(config())
    one(m.poll(0), SendJoinGroup)
    m.on_join_response(JoinGroupResponse(code, "refused: policy disabled"), 5)
    assert m.poll(5) == [] and m.phase is ClassicPhase.LEFT
    assert_says_what_to_do(m, code, "refused: policy disabled")
    assert all(m.poll(t) == [] for t in range(5, 5 + 3 * SESSION_MS, 10))


@pytest.mark.parametrize("code", list(FIXES))
def test_a_rejoin_refused_as_a_configuration_error_stops_the_work_kept_then_exits(
    code: ErrorCode,
) -> None:
    """A cooperative worker keeps its work across a rejoin (onJoinPrepare revokes nothing): a
    refused rejoin stops it all (no JoinGroup, no heartbeat meanwhile), then the agent exits."""
    m = stable("sessioned", C1)
    answer_heartbeat(m, INTERVAL_MS, ErrorCode.REBALANCE_IN_PROGRESS)
    one(m.poll(INTERVAL_MS), SendJoinGroup)
    m.on_join_response(JoinGroupResponse(code, "no"), INTERVAL_MS + 1)
    assert_says_what_to_do(m, code, "no")
    actions = m.poll(INTERVAL_MS + 1)
    assert actions == [StopWork(C1, 1, "fatal error")]  # under the generation it ran in
    assert all(m.poll(t) == [] for t in range(INTERVAL_MS + 1, 3 * SESSION_MS, 10))
    m.work_stopped(C1, 3 * SESSION_MS)
    assert m.poll(3 * SESSION_MS) == [] and m.phase is ClassicPhase.LEFT and not m.running


def test_failed_heartbeats_back_off_exponentially() -> None:
    """Heartbeat.failHeartbeat: ExponentialBackoff(retry.backoff.ms, 2, retry.backoff.max.ms)."""
    m = stable("sessioned", C1)
    now = 100
    gaps = []
    one(m.poll(now), SendClassicHeartbeat)
    for _ in range(5):
        m.on_heartbeat_response(hb(ErrorCode.UNKNOWN_SERVER_ERROR), now)
        nxt = now
        while not only(m.poll(nxt), SendClassicHeartbeat):
            nxt += 1
        gaps.append(nxt - now)
        now = nxt
    assert gaps == [20, 40, 80, 160, 160]


# --- KAFKA-9184 and the self-fence ---------------------------------------------------------------


def test_kafka_9184_revokes_all_when_the_coordinator_stays_unknown_for_an_interval() -> None:
    """WorkerCoordinator.poll: discovery failing for heartbeat.interval.ms -> onRevoked(all),
    assignmentSnapshot = null; member id and generation kept; rejoin once found."""
    m = stable("sessioned", C1)
    one(m.poll(100), SendClassicHeartbeat)
    m.on_call_failed("heartbeat", "unavailable", 110)
    one(m.poll(110), FindCoordinator)
    m.coordinator_lookup_failed("unavailable", 120)
    assert not only(m.poll(209), StopWork)
    stop = one(m.poll(210), StopWork)
    assert stop.resources == C1 and stop.reason == "membership lost"
    m.work_stopped(C1, 215)
    assert not only(m.poll(215), SendJoinGroup)  # coordinator still unknown
    m.coordinator_found(240)
    join = one(m.poll(240), SendJoinGroup)
    assert join.request.member_id == "w1" and m.generation == 1
    assert join.request.protocols[0].metadata.allocation is None


def test_coordinator_found_within_the_interval_keeps_the_work() -> None:
    m = stable("sessioned", C1)
    one(m.poll(100), SendClassicHeartbeat)
    m.on_heartbeat_response(hb(ErrorCode.NOT_COORDINATOR), 100)
    one(m.poll(100), FindCoordinator)
    m.coordinator_found(150)
    assert not only(m.poll(300), StopWork)
    assert m.running == C1


def test_self_fence_when_no_answer_proves_membership_for_the_session() -> None:
    """DESIGN 3.13 on 3.19's hold rule: answers other than NONE/REBALANCE_IN_PROGRESS do not
    count; at session timeout - max(interval, session/5) after the last proof was sent, stop
    everything, then rejoin (generation reset, member id kept)."""
    m = stable("sessioned", C1)  # last proof: the JoinGroup sent at 0
    now = 100
    while now < 800:
        beats = only(m.poll(now), SendClassicHeartbeat)
        if beats:
            m.on_heartbeat_response(hb(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS), now)
        assert m.running == C1
        now += 10
    assert m.fence_deadline_ms() == SESSION_MS - max(INTERVAL_MS, SESSION_MS // 5)
    stop = one(m.poll(800), StopWork)
    assert stop.resources == C1 and stop.reason == "membership lost"
    assert not only(m.poll(800), SendJoinGroup)
    m.work_stopped(C1, 805)
    join = one(m.poll(805), SendJoinGroup)
    assert join.request.member_id == "w1" and m.generation == NO_GENERATION
    assert join.request.protocols[0].metadata.allocation is None


def test_answers_proving_membership_keep_the_fence_away() -> None:
    m = stable("sessioned", C1)
    for now in range(100, 3_000, 100):
        answer_heartbeat(m, now)
    assert m.running == C1 and m.fence_deadline_ms() == 2_900 + 800


def test_work_kept_across_unknown_member_keeps_the_old_ids_deadline() -> None:
    """Connect keeps a cooperative worker's work across UNKNOWN_MEMBER_ID; answers to the new
    member id do not extend the old id's hold (DESIGN 3.19), so it stops by then."""
    m = stable("sessioned", C1)
    answer_heartbeat(m, 100)  # proof sent at 100: deadline 900
    answer_heartbeat(m, 200, ErrorCode.UNKNOWN_MEMBER_ID)
    one(m.poll(200), SendJoinGroup)
    m.on_join_response(JoinGroupResponse(ErrorCode.MEMBER_ID_REQUIRED, "", member_id="w1b"), 200)
    one(m.poll(200), SendJoinGroup)
    m.on_join_response(join_ok("w1b", generation=2), 210)
    actions = m.poll(210)
    one(actions, SendSyncGroup)
    one(actions, SendClassicHeartbeat)  # at once after the join answer: the worker runs work
    m.on_heartbeat_response(hb(), 215)  # for the new id: no proof for the old id's work
    m.on_sync_response(sync_ok(), 220)
    assert m.running == C1
    for now in range(310, 900, 100):
        answer_heartbeat(m, now)
    assert m.fence_deadline_ms() == 900
    assert one(m.poll(900), StopWork).resources == C1


# --- leaving -------------------------------------------------------------------------------------


def test_leave_stops_everything_then_sends_one_leave_group() -> None:
    """DistributedHerder.halt stops connectors and tasks, then member.stop -> maybeLeaveGroup;
    the heartbeat thread keeps the session meanwhile."""
    m = stable("sessioned", C1)
    m.leave(50)
    actions = m.poll(50)
    stop = one(actions, StopWork)
    assert stop.reason == "leaving" and not only(actions, SendLeaveGroup)
    one(m.poll(100), SendClassicHeartbeat)  # still heartbeating while stopping
    m.work_stopped(C1, 120)
    leave = one(m.poll(120), SendLeaveGroup)
    assert leave.request.members[0].member_id == "w1"
    assert leave.request.members[0].group_instance_id is None
    m.on_leave_response(LeaveGroupResponse(), 125)
    assert m.phase is ClassicPhase.LEFT and m.poll(200) == []


def test_leave_without_a_member_id_sends_nothing() -> None:
    m = ClassicMembership(config())
    m.leave(0)
    assert m.poll(0) == [] and m.phase is ClassicPhase.LEFT


def test_leave_during_a_parked_join_makes_its_answer_stale() -> None:
    m = stable("sessioned", C1)
    answer_heartbeat(m, 110, ErrorCode.REBALANCE_IN_PROGRESS)
    one(m.poll(110), SendJoinGroup)
    m.leave(20)
    m.work_stopped(one(m.poll(120), StopWork).resources, 121)
    one(m.poll(121), SendLeaveGroup)
    m.on_join_response(join_ok(generation=2), 122)  # arrives late: ignored
    assert not only(m.poll(122), SendSyncGroup)


# --- configuration -------------------------------------------------------------------------------


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match=r"connect\.protocol"):
        ClassicConfig("g", "eager")
    with pytest.raises(ValueError, match="heartbeat"):
        ClassicConfig("g", heartbeat_interval_ms=10_000, session_timeout_ms=10_000)


def test_assignment_tokens_ride_on_start_and_stop() -> None:
    """DESIGN 3.18: StartWork and StopWork carry the tokens the coordinator sent."""
    from connect_protocol.tokens import FencingTokens

    m = ClassicMembership(config())
    joined(m, 0)
    tokens = FencingTokens.granted(C1, 7)
    m.on_sync_response(
        SyncGroupResponse(
            assignment=ConnectWorkerAssignment(
                version=2, assignment=C1, revoked=EMPTY, tokens=tokens
            )
        ),
        0,
    )
    start = one(m.poll(0), StartWork)
    assert dict(start.tokens) == dict(tokens)


def test_heartbeats_during_a_parked_rejoin_keep_the_fence_clock() -> None:
    """Departure (see the module docstring): a worker with a generation heartbeats while its
    JoinGroup is parked; REBALANCE_IN_PROGRESS answers prove membership and change nothing."""
    m = stable("sessioned", C1)
    answer_heartbeat(m, 100, ErrorCode.REBALANCE_IN_PROGRESS)
    one(m.poll(100), SendJoinGroup)
    for now in range(200, 2_000, 100):
        answer_heartbeat(m, now, ErrorCode.REBALANCE_IN_PROGRESS)
        assert m.phase is ClassicPhase.JOINING and not only(m.poll(now), SendJoinGroup)
    assert m.running == C1 and m.fence_deadline_ms() == 1_900 + 800


def test_no_heartbeat_while_joining_without_a_generation() -> None:
    """Kafka's heartbeat thread is off until a JoinGroup is answered (hasNotJoinedGroup)."""
    m = ClassicMembership(config())
    one(m.poll(0), SendJoinGroup)
    assert m.poll(500) == []


def test_heartbeat_illegal_generation_when_stable_rejoins_with_the_same_id() -> None:
    """HeartbeatResponseHandler: ILLEGAL_GENERATION -> reset the generation, keep the id."""
    m = stable("sessioned", C1)
    answer_heartbeat(m, 100, ErrorCode.ILLEGAL_GENERATION)
    actions = m.poll(100)
    assert one(actions, SendJoinGroup).request.member_id == "w1"
    assert not only(actions, StopWork) and m.generation == NO_GENERATION


def test_sync_unknown_member_resets_the_id() -> None:
    """SyncGroupResponseHandler: UNKNOWN_MEMBER_ID -> reset member id and generation."""
    m = ClassicMembership(config())
    joined(m, 0)
    m.on_sync_response(SyncGroupResponse(ErrorCode.UNKNOWN_MEMBER_ID, "gone"), 5)
    assert one(m.poll(5), SendJoinGroup).request.member_id == ""


def test_join_unknown_member_resets_the_id() -> None:
    """JoinGroupResponseHandler: UNKNOWN_MEMBER_ID -> reset the member id, retry at once."""
    m = stable("sessioned", C1)
    answer_heartbeat(m, 100, ErrorCode.REBALANCE_IN_PROGRESS)
    one(m.poll(100), SendJoinGroup)
    m.on_join_response(JoinGroupResponse(ErrorCode.UNKNOWN_MEMBER_ID, "gone"), 105)
    join = one(m.poll(105), SendJoinGroup)
    assert join.request.member_id == "" and join.request.protocols[0].metadata.allocation == C1


def test_next_wakeup_covers_heartbeat_fence_and_delay() -> None:
    m = ClassicMembership(config())
    joined(m, 0)
    m.on_sync_response(sync_ok(C1, delay=50), 0)
    m.work_started(one(m.poll(0), StartWork).resources, 0)
    assert m.next_wakeup_ms() == 50
    m.poll(50)
    assert m.next_wakeup_ms() <= 100
