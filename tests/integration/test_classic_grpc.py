"""Classic groups over gRPC (issue 25 P2, DESIGN 3.19 "Long polls hold no thread"): real
coordinators on 127.0.0.1 and PostgreSQL, scripted classic members (`tests/support/
classic_client.py`), scaled-down timeouts.

- 30 members complete a join barrier and a sync on one `coordinator-svc serve` process with
  `--max-workers 4`: their parked JoinGroups and SyncGroups hold no thread;
- a parked call is answered NOT_COORDINATOR when the process loses the group's lease, and when
  the server shuts down; a cancelled call leaves only its waiter (the member stays joined);
- with connections aged at 1 s and a grace of 10 s, parked calls outliving their connection's
  age are answered normally (never UNAVAILABLE);
- a steady classic heartbeat is answered on the event loop while every pool thread is busy;
- the join rate is taken only by a JoinGroup that makes a member (a MEMBER_ID_REQUIRED id
  joining), never by an empty-id join or a member's rejoin;
- a stored group of a type this release does not know is refused at load:
  COORDINATOR_NOT_AVAILABLE, its lease released, nothing written.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import pytest

from connect_protocol.errors import ErrorCode
from coordinator_svc.core.model import GroupConfigDefaults
from coordinator_svc.grpc_api.server import CoordinatorServer
from coordinator_svc.runtime.groups import GroupManager
from coordinator_svc.runtime.quotas import PrincipalQuotas
from coordinator_svc.store import SqlStore, rows
from tests.support import store_dump
from tests.support.classic_client import ClassicMember
from tests.support.coordinator import FAST_DEFAULTS, CoordinatorProcess, free_port

GROUP = "classic-workers"
SESSION_MS = 6_000
REBALANCE_MS = 2_000


def classic_defaults(initial_delay_ms: int) -> GroupConfigDefaults:
    return dataclasses.replace(
        FAST_DEFAULTS,
        classic_min_session_timeout_ms=100,
        classic_max_session_timeout_ms=60_000,
        classic_initial_rebalance_delay_ms=initial_delay_ms,
        classic_new_member_join_timeout_ms=30_000,
    )


class Coordinator:
    """A coordinator in this process (GroupManager + gRPC server on 127.0.0.1) with the knobs
    these tests turn: pool size, join rate, connection age."""

    def __init__(
        self,
        database_url: str,
        defaults: GroupConfigDefaults,
        max_workers: int = 4,
        quotas: PrincipalQuotas | None = None,
        max_connection_age_ms: int = 0,
        max_connection_age_grace_ms: int = 30_000,
    ) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.store = SqlStore(database_url, "classic-node", self.address, lease_ms=5_000)
        self.store.migrate()
        self.manager = GroupManager(self.store, defaults)
        self.server = CoordinatorServer(
            self.manager,
            self.address,
            max_workers=max_workers,
            quotas=quotas,
            max_connection_age_ms=max_connection_age_ms,
            max_connection_age_grace_ms=max_connection_age_grace_ms,
        )
        self.channel = grpc.insecure_channel(self.address)
        self.stopped = False

    def __enter__(self) -> Coordinator:
        self.manager.start()
        self.server.start()
        self.server.set_serving(True)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.channel.close()
        if not self.stopped:
            self.server.stop(None)
        self.manager.stop()
        self.store.close()

    def member(self, **kwargs: Any) -> ClassicMember:
        kwargs.setdefault("session_timeout_ms", SESSION_MS)
        kwargs.setdefault("rebalance_timeout_ms", REBALANCE_MS)
        return ClassicMember(self.channel, GROUP, **kwargs)

    def parked(self) -> int:
        return self.manager.parking.waiting(GROUP)


def wait_until(condition: Callable[[], bool], timeout_s: float = 3.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.01)


def code_name(resp: Any) -> str:
    return ErrorCode(resp.error_code).name


def park_a_join(coord: Coordinator, member: ClassicMember) -> Any:
    """`member` gets an id and sends the JoinGroup that parks (in the background); returns its
    future once the coordinator holds it."""
    assert code_name(member.join_once()) == "MEMBER_ID_REQUIRED"
    pool = ThreadPoolExecutor(1)
    call = pool.submit(member.join_once, 10.0)
    pool.shutdown(wait=False)
    wait_until(lambda: coord.parked() == 1, what="the JoinGroup is parked")
    return call


# --- 30 members, 4 workers, one real process -------------------------------------------------


def test_thirty_members_complete_the_barrier_and_sync_with_four_workers(
    database_url: str, tmp_path: Path
) -> None:
    proc = CoordinatorProcess(
        database_url,
        "--max-workers",
        "4",
        "--classic-min-session-timeout-ms",
        "100",
        "--classic-initial-rebalance-delay-ms",
        "300",
        log_path=tmp_path / "coordinator.log",
    ).start()
    channel = grpc.insecure_channel(proc.address)
    try:
        members = [
            ClassicMember(channel, GROUP, url=f"http://w{i}:8083", rebalance_timeout_ms=3_000)
            for i in range(30)
        ]
        started = time.monotonic()
        with ThreadPoolExecutor(30) as pool:
            joins = list(pool.map(lambda m: m.join(), members))
            joined_s = time.monotonic() - started
            syncs = list(pool.map(lambda m: m.sync(), members))
        assert {code_name(j) for j in joins} == {"NONE"}
        generations = {j.generation_id for j in joins}
        leaders = {j.leader for j in joins}
        assert len(generations) == 1 and len(leaders) == 1, (generations, leaders)
        leader_join = next(j for j in joins if j.member_id == j.leader)
        assert sorted(m.member_id for m in leader_join.members) == sorted(
            m.member_id for m in members
        )
        assert [code_name(s) for s in syncs] == ["NONE"] * 30, [s.error_message for s in syncs]
        assert {s.assignment.leader for s in syncs} == leaders
        beats = [m.heartbeat() for m in members]
        assert {code_name(b) for b in beats} == {"NONE"}
        # The barrier waited for everyone: about the initial delay, its extensions, never the
        # 3 s rebalance timeout + 5 s client deadline that 30 calls on 4 threads would need.
        assert joined_s < 3.0, joined_s
    finally:
        channel.close()
        proc.close()


# --- parked calls: lease loss, shutdown, cancel, connection age --------------------------------


def test_a_parked_join_is_answered_not_coordinator_when_the_lease_is_lost(
    database_url: str,
) -> None:
    with Coordinator(database_url, classic_defaults(initial_delay_ms=20_000)) as coord:
        call = park_a_join(coord, coord.member(rebalance_timeout_ms=20_000))
        owned = coord.manager.leases.groups[GROUP]
        coord.manager.leases.lose(GROUP, owned)  # what the renewer does when the lease is gone
        resp = call.result(timeout=2)
        assert code_name(resp) == "NOT_COORDINATOR", resp
        assert coord.parked() == 0


def test_parked_calls_are_answered_not_coordinator_at_shutdown(database_url: str) -> None:
    with Coordinator(database_url, classic_defaults(initial_delay_ms=20_000)) as coord:
        call = park_a_join(coord, coord.member(rebalance_timeout_ms=20_000))
        stopping = threading.Thread(target=coord.server.stop, args=(5.0,))
        started = time.monotonic()
        stopping.start()
        resp = call.result(timeout=3)
        stopping.join(10)
        coord.stopped = True
        assert code_name(resp) == "NOT_COORDINATOR", resp
        assert time.monotonic() - started < 2.0  # answered, not cut off at the grace's end


def test_a_cancelled_parked_call_leaves_its_waiter_and_the_member_stays_joined(
    database_url: str,
) -> None:
    with Coordinator(database_url, classic_defaults(initial_delay_ms=20_000)) as coord:
        member = coord.member(rebalance_timeout_ms=20_000)
        assert code_name(member.join_once()) == "MEMBER_ID_REQUIRED"
        with pytest.raises(grpc.RpcError) as gave_up:
            member.join_once(timeout_s=0.5)
        assert gave_up.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(lambda: coord.parked() == 0, what="the waiter is unregistered")
        state = coord.manager.peek(GROUP)
        assert state is not None and state.round is not None
        assert member.member_id in state.members
        assert member.member_id in state.round.joined  # still counted in the join phase
        # It asks again and waits again, as itself.
        with pytest.raises(grpc.RpcError):
            member.join_once(timeout_s=0.3)
        wait_until(lambda: coord.parked() == 0, what="the second waiter is unregistered")
        assert list(coord.manager.peek(GROUP).members) == [member.member_id]  # type: ignore[union-attr]


def test_parked_calls_outlive_their_connections_age_without_unavailable(
    database_url: str,
) -> None:
    with Coordinator(
        database_url,
        classic_defaults(initial_delay_ms=1_200),
        max_connection_age_ms=1_000,
        max_connection_age_grace_ms=10_000,
    ) as coord:
        members = [coord.member(rebalance_timeout_ms=1_500) for _ in range(3)]
        started = time.monotonic()
        with ThreadPoolExecutor(3) as pool:
            joins = list(pool.map(lambda m: m.join(), members))
            parked_s = time.monotonic() - started
            syncs = list(pool.map(lambda m: m.sync(), members))
        assert parked_s > 1.2, parked_s  # the joins waited past the connection's age
        assert {code_name(j) for j in joins} == {"NONE"}
        assert {code_name(s) for s in syncs} == {"NONE"}


def test_a_call_parked_to_its_limit_is_answered_rebalance_in_progress(database_url: str) -> None:
    # The park limit is the grace - 1 s when connections age: 0.5 s here (the command line
    # allows no grace under 10 s; the server takes what it is given).
    with Coordinator(
        database_url,
        classic_defaults(initial_delay_ms=20_000),
        max_connection_age_ms=600_000,
        max_connection_age_grace_ms=1_500,
    ) as coord:
        member = coord.member(rebalance_timeout_ms=20_000)
        started = time.monotonic()
        resp = park_a_join(coord, member).result(timeout=5)
        assert code_name(resp) == "REBALANCE_IN_PROGRESS", resp
        assert "park limit" in resp.error_message
        assert 0.4 < time.monotonic() - started < 2.0
        wait_until(lambda: coord.parked() == 0, what="the waiter is unregistered")


# --- steady heartbeat on the loop, join rate -------------------------------------------------


def test_a_steady_classic_heartbeat_is_answered_with_every_pool_thread_busy(
    database_url: str,
) -> None:
    with Coordinator(database_url, classic_defaults(initial_delay_ms=50), max_workers=2) as coord:
        member = coord.member()
        member.join()
        assert code_name(member.sync()) == "NONE"
        release = threading.Event()
        busy = [coord.server._pool.submit(release.wait, 10) for _ in range(2)]
        try:
            with pytest.raises(grpc.RpcError) as blocked:  # the pool is really blocked
                member.leave(timeout_s=0.3)
            assert blocked.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            started = time.monotonic()
            beats = [member.heartbeat(timeout_s=1.0) for _ in range(20)]
            assert {code_name(b) for b in beats} == {"NONE"}
            assert time.monotonic() - started < 1.0
        finally:
            release.set()
            for job in busy:
                job.result(5)


def test_only_joins_that_make_a_member_take_the_join_rate(database_url: str) -> None:
    quotas = PrincipalQuotas(join_rate=0.001, join_burst=1)  # one join, then none for long
    with Coordinator(
        database_url, classic_defaults(initial_delay_ms=20_000), quotas=quotas
    ) as coord:
        first = coord.member(rebalance_timeout_ms=20_000)
        park_a_join(coord, first)  # its pending id joining took the one token
        others = [coord.member(rebalance_timeout_ms=20_000) for _ in range(3)]
        for other in others:
            for _ in range(3):  # empty-id joins never take a token
                other.member_id = ""
                assert code_name(other.join_once()) == "MEMBER_ID_REQUIRED"
        for other in others:  # a pending id joining does: throttled
            resp = other.join_once()
            assert code_name(resp) == "THROTTLING_QUOTA_EXCEEDED", resp
            assert "--max-joins-per-s" in resp.error_message
        # The member's own rejoin is not throttled: it waits in the join phase again.
        with pytest.raises(grpc.RpcError) as waited:
            first.join_once(timeout_s=0.3)
        assert waited.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED


# --- load refusal of an unknown group type ---------------------------------------------------


def test_a_group_of_an_unknown_type_is_refused_at_load(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Coordinator(database_url, classic_defaults(initial_delay_ms=50)) as coord:
        member = coord.member()
        member.join()
        assert code_name(member.sync()) == "NONE"
        leases = coord.manager.leases
        leases.release_unused(GROUP, leases.groups[GROUP])  # out of memory, lease released
        before = store_dump.dump(coord.store)
        # This process now plays a release that knows connect groups only.
        monkeypatch.setattr(rows, "KNOWN_GROUP_TYPES", frozenset({"connect"}))
        for _ in range(2):
            resp = member.heartbeat()
            assert code_name(resp) == "COORDINATOR_NOT_AVAILABLE", resp
            assert "newer coordinator release" in resp.error_message
            assert GROUP not in leases.groups
            assert coord.store.holder(GROUP) is None  # the lease was given back
        assert store_dump.dump(coord.store) == before  # nothing written
