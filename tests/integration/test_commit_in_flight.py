"""Steady heartbeats during another batch's commit (issue 24, DESIGN 3.11, 3.13, 3.16), on
PostgreSQL: a group's lock covers its handlers and the apply, not the commit, so a heartbeat
that changes nothing is answered from memory while a commit is in flight, unless its member is
written by that commit or its answer carries an assignment; the next batch waits for the commit
(order kept); a failed commit is taken back before anything waiting runs, and nothing answered
meanwhile carried what it took back. The store's commit is held at a gate the test opens. And the
event loop, which serves every group, never tries a heartbeat with a big owned list itself."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from connect.group.v1 import common_pb2, coordinator_pb2

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import (
    AssignmentMessage,
    HeartbeatRequest,
    HeartbeatResponse,
    InstallRequest,
    MemberTarget,
    PrepareRequest,
    PutConnectorRequest,
)
from connect_protocol.resources import EMPTY, ResourceSet
from coordinator_svc.core.admin import put_connector
from coordinator_svc.core.assignment import (
    finish_prepare,
    install_assignment,
    plan_install,
    start_prepare,
)
from coordinator_svc.core.heartbeat import heartbeat
from coordinator_svc.core.model import GroupState
from coordinator_svc.core.records import Record
from coordinator_svc.core.results import Result
from coordinator_svc.grpc_api.aio import STEADY_ON_LOOP_MAX_OWNED, AsyncCoordinatorServicer
from coordinator_svc.runtime.groups import GroupManager, Steady
from coordinator_svc.store import Lease, SqlStore, StoreUnavailable
from tests.core.harness import DEFAULTS, GROUP, SESSIONED, stable_group
from tests.integration.test_ownership_grpc import stable_group as stable_group_grpc
from tests.support.client import ScriptedWorker, describe
from tests.support.client import put_connector as put_connector_grpc
from tests.support.coordinator import InProcessCoordinator

WAIT_S = 5.0


class Gate:
    """The store's next commit waits at the gate until `open_()`; then it commits, or raises
    `failure` if one was set."""

    def __init__(self, store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = store.commit
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.failure: BaseException | None = None
        self.armed = False
        monkeypatch.setattr(store, "commit", self.commit)

    def commit(self, lease: Lease, records: list[Record]) -> None:
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.opened.wait(WAIT_S)
            if self.failure is not None:
                raise self.failure
        self.real(lease, records)

    def arm(self, failure: BaseException | None = None) -> None:
        self.failure, self.armed = failure, True
        self.entered.clear()
        self.opened.clear()

    def open_(self) -> None:
        self.opened.set()


class Call:
    """`call()` on a thread of its own; `outcome` once it returned (or what it raised)."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.outcome: Any = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.outcome = call()
            except Exception as error:
                self.outcome = error
            self.done.set()

        threading.Thread(target=run, daemon=True).start()


@pytest.fixture
def manager(database_url: str) -> Iterator[GroupManager]:
    """A manager holding harness.stable_group(): w1 (the assignor) and w2, STABLE at epoch 5."""
    store = SqlStore(database_url, "coord-a", "10.0.0.1:7000", lease_ms=30_000)
    store.migrate()
    manager = GroupManager(store, DEFAULTS)  # not started: no timer fires, the lease is long
    seeded = stable_group().log
    manager.execute(GROUP, lambda _state, _now: Result(list(seeded), None))
    yield manager
    store.close()


Beat = Callable[[GroupState | None, int], Result[HeartbeatResponse]]


def beat(member_id: str, epoch: int, owned: ResourceSet | None = None) -> Beat:
    req = HeartbeatRequest(GROUP, member_id, epoch, owned=owned)
    return lambda state, now: heartbeat(state, req, now, DEFAULTS)


def join(member_id: str) -> Beat:
    req = HeartbeatRequest(
        GROUP, member_id, 0, rebalance_timeout_ms=500, client_assignors=SESSIONED, owned=EMPTY
    )
    return lambda state, now: heartbeat(state, req, now, DEFAULTS)


def carries(resp: HeartbeatResponse) -> bool:
    return resp.assignment is not None


STEADY = Steady(carries)
CARRY: dict[str, Any] = {"steady": STEADY}


def state_of(manager: GroupManager) -> GroupState:
    state = manager.peek(GROUP)
    assert state is not None
    return state


def test_a_steady_heartbeat_is_answered_while_a_commit_is_in_flight_and_a_written_member_waits(
    manager: GroupManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(manager.store, monkeypatch)  # type: ignore[arg-type]
    gate.arm()
    joining = Call(lambda: manager.execute(GROUP, join("w3"), member_id="w3"))
    assert gate.entered.wait(WAIT_S)
    w3_epoch = state_of(manager).members["w3"].member_epoch  # applied, not committed
    # w2 is written by nothing in flight: answered at once, on the caller's thread too.
    done, resp = manager.execute_if_steady(GROUP, beat("w2", 5), "w2", STEADY)
    assert done and resp is not None and resp.error_code == ErrorCode.NONE
    assert resp.assignment is None and resp.member_epoch == 5
    queued = Call(lambda: manager.execute(GROUP, beat("w2", 5), member_id="w2", **CARRY))
    assert queued.done.wait(WAIT_S), "a steady heartbeat waited for another batch's commit"
    # w3's own heartbeat (as if its join's answer had been lost) waits for the commit.
    assert manager.execute_if_steady(GROUP, beat("w3", w3_epoch), "w3", STEADY) == (False, None)
    w3_beat = Call(lambda: manager.execute(GROUP, beat("w3", w3_epoch), member_id="w3", **CARRY))
    # The next batch (a PutConnector) waits too, and then sees the committed join.
    seen: list[int] = []

    def put(state: GroupState | None, now: int) -> Result[Any]:
        assert state is not None
        seen.append(len(state.members))
        return put_connector(state, PutConnectorRequest(GROUP, "C", 1, {}, "t"), now, DEFAULTS)

    putting = Call(lambda: manager.execute(GROUP, put))
    time.sleep(0.3)
    assert not joining.done.is_set() and not w3_beat.done.is_set() and not putting.done.is_set()
    assert seen == []
    gate.open_()
    for call in (joining, w3_beat, putting):
        assert call.done.wait(WAIT_S)
        assert not isinstance(call.outcome, Exception), call.outcome
    assert joining.outcome.member_epoch == w3_epoch
    assert w3_beat.outcome.error_code == ErrorCode.NONE
    assert seen == [3]
    reloaded = manager.store.load_group(GROUP)
    assert reloaded is not None and "w3" in reloaded.members and "C" in reloaded.catalogue


def test_a_failed_commit_in_flight_leaves_no_answer_that_carried_what_it_took_back(
    manager: GroupManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(manager.store, monkeypatch)  # type: ignore[arg-type]
    gate.arm(StoreUnavailable("injected: the database went away"))
    joining = Call(lambda: manager.execute(GROUP, join("w3"), member_id="w3"))
    assert gate.entered.wait(WAIT_S)
    w3_epoch = state_of(manager).members["w3"].member_epoch
    answered: list[HeartbeatResponse] = []
    done, resp = manager.execute_if_steady(GROUP, beat("w2", 5), "w2", STEADY)
    assert done and resp is not None
    answered.append(resp)
    # An answer that hands out resources is never sent from the uncommitted state, even to a
    # member the batch does not write.
    share = AssignmentMessage(ResourceSet(frozenset({"Z"}), frozenset()))

    def hands_out(state: GroupState | None, now: int) -> Result[HeartbeatResponse]:
        return Result([], HeartbeatResponse(member_epoch=5, assignment=share))

    assert manager.execute_if_steady(GROUP, hands_out, "w2", STEADY) == (False, None)
    w3_beat = Call(lambda: manager.execute(GROUP, beat("w3", w3_epoch), member_id="w3", **CARRY))
    time.sleep(0.2)
    assert not w3_beat.done.is_set()
    gate.open_()
    assert joining.done.wait(WAIT_S) and w3_beat.done.wait(WAIT_S)
    refused = joining.outcome
    assert getattr(refused, "code", None) == ErrorCode.COORDINATOR_NOT_AVAILABLE, refused
    # Taken back before w3's heartbeat ran: it is told it is unknown, nothing else.
    assert w3_beat.outcome.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    answered.append(w3_beat.outcome)
    assert all(a.assignment is None for a in answered), answered
    assert sorted(state_of(manager).members) == ["w1", "w2"]
    # Steady heartbeats go on; the same answer outside a commit is given as before.
    assert manager.execute_if_steady(GROUP, beat("w2", 5), "w2", STEADY)[0]
    assert manager.execute_if_steady(GROUP, hands_out, "w2", STEADY)[0]


def test_an_epoch_only_move_in_flight_holds_back_the_moved_members_heartbeat(
    manager: GroupManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An install that moves w2 to the new epoch without changing its share writes w2: its
    heartbeat waits for the install's commit (group_commit's docstring says why)."""
    assert manager.execute(GROUP, join("w3"), member_id="w3").error_code == ErrorCode.NONE
    state = state_of(manager)
    epoch = state.group_epoch
    w1, w2 = state.members["w1"], state.members["w2"]
    assert manager.execute(GROUP, beat("w1", w1.member_epoch)).error_code in (
        ErrorCode.NONE,
        ErrorCode.COMPUTE_ASSIGNMENT,
    )
    prepared = finish_prepare(
        manager.execute(
            GROUP,
            lambda s, now: start_prepare(
                s, req=PrepareRequest(GROUP, "w1", w1.member_epoch), now_ms=now, defaults=DEFAULTS
            ),
        )
    )
    assert prepared.error_code == ErrorCode.NONE, prepared
    install = InstallRequest(
        group_id=GROUP,
        member_id="w1",
        member_epoch=w1.member_epoch,
        group_epoch=prepared.group_epoch,
        members=(
            MemberTarget("w1", w1.assigned),
            MemberTarget("w2", w2.assigned),
            MemberTarget("w3", EMPTY),
        ),
    )
    gate = Gate(manager.store, monkeypatch)  # type: ignore[arg-type]
    gate.arm()
    installing = Call(
        lambda: manager.execute(
            GROUP,
            lambda s, now: install_assignment(s, install, now, DEFAULTS, plan_install(s, install)),
        )
    )
    assert gate.entered.wait(WAIT_S)
    moved = state_of(manager).members["w2"]
    assert moved.member_epoch == epoch and moved.assigned == w2.assigned  # moved, uncommitted
    assert manager.execute_if_steady(GROUP, beat("w2", 5), "w2", STEADY) == (False, None)
    w2_beat = Call(lambda: manager.execute(GROUP, beat("w2", 5), member_id="w2", **CARRY))
    time.sleep(0.2)
    assert not w2_beat.done.is_set()
    gate.open_()
    assert installing.done.wait(WAIT_S) and w2_beat.done.wait(WAIT_S)
    assert installing.outcome.error_code == ErrorCode.NONE, installing.outcome
    assert w2_beat.outcome.member_epoch == epoch


def test_over_grpc_a_steady_member_is_answered_while_a_put_connector_commits(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with InProcessCoordinator(database_url) as c:
        assert c.stubs is not None
        workers = stable_group_grpc(c.stubs)
        assignor = describe(c.stubs, workers[0].group_id).assignor_member_id
        steady: ScriptedWorker = next(w for w in workers if w.member_id != assignor)
        gate = Gate(c.store, monkeypatch)
        gate.arm()
        putting = Call(lambda: put_connector_grpc(c.stubs, steady.group_id, "C", 1))
        assert gate.entered.wait(WAIT_S)
        started = time.monotonic()
        resp = steady.heartbeat(report_owned=False)
        assert resp.error_code == 0 and not resp.HasField("assignment")
        assert not putting.done.is_set(), "the commit was not in flight"
        assert time.monotonic() - started < 1.0
        gate.open_()
        assert putting.done.wait(WAIT_S) and putting.outcome.error_code == 0


def test_the_event_loop_does_not_try_a_heartbeat_with_a_big_owned_list() -> None:
    """Reading 100,000 owned tasks is ~180 ms of Python: the loop, which serves every group,
    hands such a heartbeat to the pool at once instead of trying it as steady first."""

    class Sync:
        tried: list[int] = []

        def steady_heartbeat(self, request: Any, principal: str) -> Any:
            self.tried.append(len(request.connectors_and_tasks.tasks))
            return None

        def heartbeat_serialized(self, request: Any, context: Any) -> str:
            return "pool"

    class Context:
        def peer(self) -> str:
            return "ipv4:127.0.0.1:1"

    def request(owned: int) -> coordinator_pb2.ConnectGroupHeartbeatRequest:
        req = coordinator_pb2.ConnectGroupHeartbeatRequest(group_id="g", member_id="m")
        req.connectors_and_tasks.tasks.extend(
            common_pb2.ConnectorTaskId(connector="A", task=i) for i in range(owned)
        )
        return req

    sync = Sync()
    with ThreadPoolExecutor(1) as pool:
        servicer = AsyncCoordinatorServicer(sync, pool)
        for owned in (0, STEADY_ON_LOOP_MAX_OWNED, STEADY_ON_LOOP_MAX_OWNED + 1, 100_000):
            call = servicer.ConnectGroupHeartbeat(request(owned), Context(), "User:x")  # type: ignore[arg-type]
            assert asyncio.run(call) == "pool"
    assert sync.tried == [0, STEADY_ON_LOOP_MAX_OWNED]
