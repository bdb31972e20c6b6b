"""Takeover of a classic group (issue 25 P2, DESIGN 3.19 "Takeover"): `coordinator-svc serve`
processes on one PostgreSQL database; the owner is SIGKILLed in the middle of a join phase
(PREPARING_REBALANCE) or between the join phase and the leader's SyncGroup
(COMPLETING_REBALANCE). The next owner loads the group as PREPARING_REBALANCE with the persisted
generation, its members rejoin there, and the next generation follows the persisted one: the
generations the members are told strictly increase, and no generation is ever answered with two
different leaders (none is handed out twice)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from connect_protocol.errors import ErrorCode
from tests.support.classic_client import ClassicMember, stub
from tests.support.coordinator import CoordinatorProcess

pytestmark = pytest.mark.slow

LEASE_MS = 1_500
#: Codes that send a classic member to another coordinator (or to wait for one).
MOVE_ON = {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE}

StartNode = Callable[[int], list[CoordinatorProcess]]


@pytest.fixture
def start_node(database_url: str, tmp_path: Path) -> Iterator[StartNode]:
    procs: list[CoordinatorProcess] = []

    def start(count: int) -> list[CoordinatorProcess]:
        """`count` processes, started side by side (the first migrates, the others wait)."""
        started = []
        for _ in range(count):
            proc = CoordinatorProcess(
                database_url,
                "--lease-ms",
                str(LEASE_MS),
                "--classic-min-session-timeout-ms",
                "100",
                "--classic-initial-rebalance-delay-ms",
                "300",
                log_path=tmp_path / f"coordinator-{len(procs)}.log",
            )
            procs.append(proc)
            started.append(proc.start(wait=False))
        for proc in started:
            proc.wait_serving()
        return started

    yield start
    for proc in procs:
        proc.close()


class Generations:
    """Every generation a member was told, with its leader: each must have one leader."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.leaders: dict[int, set[str]] = {}

    def saw(self, join: Any) -> None:
        with self.lock:
            self.leaders.setdefault(join.generation_id, set()).add(join.leader)

    def check(self) -> None:
        twice = {g: leaders for g, leaders in self.leaders.items() if len(leaders) != 1}
        assert not twice, f"generations answered with several leaders: {twice}"


def join_at(member: ClassicMember, seen: Generations, timeout_s: float = 20.0) -> Any:
    """JoinGroup until a generation, moving on (retrying) while the coordinator changes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            resp = member.join_once()
        except grpc.RpcError as error:
            if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise
            time.sleep(0.1)
            continue
        code = ErrorCode(resp.error_code)
        if code is ErrorCode.NONE:
            seen.saw(resp)
            return resp
        if code in MOVE_ON or code in (
            ErrorCode.MEMBER_ID_REQUIRED,
            ErrorCode.REBALANCE_IN_PROGRESS,
        ):
            time.sleep(0.05 if code not in MOVE_ON else 0.1)
            continue
        raise AssertionError(f"{member.member_id}: {code.name} {resp.error_message}")
    raise AssertionError(f"{member.member_id}: no generation within {timeout_s} s")


def sync_all(members: list[ClassicMember]) -> list[Any]:
    with ThreadPoolExecutor(len(members)) as pool:
        return list(pool.map(lambda m: m.sync(), members))


def move(members: list[ClassicMember], channel: grpc.Channel) -> None:
    for member in members:
        member.stub = stub(channel)


def test_takeover_in_completing_rebalance_starts_the_next_generation(
    start_node: StartNode,
) -> None:
    owner, standby = start_node(2)
    to_owner = grpc.insecure_channel(owner.address)
    to_standby = grpc.insecure_channel(standby.address)
    seen = Generations()
    try:
        members = [ClassicMember(to_owner, "completing", url=f"http://w{i}") for i in range(3)]
        with ThreadPoolExecutor(3) as pool:
            joins = list(pool.map(lambda m: join_at(m, seen), members))
        first = joins[0].generation_id
        leader = joins[0].leader
        followers = [m for m in members if m.member_id != leader]
        # The followers' SyncGroups park: the leader never sends its assignments.
        parked = ThreadPoolExecutor(2)
        syncs = [parked.submit(m.sync) for m in followers]
        time.sleep(0.3)
        assert not any(s.done() for s in syncs)
        owner.kill()
        for s in syncs:  # the owner is gone: their calls fail, none is answered
            with pytest.raises(grpc.RpcError):
                s.result(5)
        parked.shutdown()
        move(members, to_standby)
        with ThreadPoolExecutor(3) as pool:
            rejoined = list(pool.map(lambda m: join_at(m, seen), members))
        second = {j.generation_id for j in rejoined}
        assert len(second) == 1 and second.pop() > first
        assert [ErrorCode(s.error_code).name for s in sync_all(members)] == ["NONE"] * 3
        seen.check()
    finally:
        to_owner.close()
        to_standby.close()


def test_takeover_in_preparing_rebalance_starts_the_next_generation(
    start_node: StartNode,
) -> None:
    owner, standby = start_node(2)
    to_owner = grpc.insecure_channel(owner.address)
    to_standby = grpc.insecure_channel(standby.address)
    seen = Generations()
    try:
        members = [
            ClassicMember(to_owner, "preparing", url=f"http://w{i}", rebalance_timeout_ms=3_000)
            for i in range(3)
        ]
        with ThreadPoolExecutor(3) as pool:
            joins = list(pool.map(lambda m: join_at(m, seen), members))
        first = joins[0].generation_id
        assert [ErrorCode(s.error_code).name for s in sync_all(members)] == ["NONE"] * 3
        # A fourth member starts a rebalance; its JoinGroup parks until the others rejoin,
        # which they never do here: the owner dies in PREPARING_REBALANCE.
        newcomer = ClassicMember(to_owner, "preparing", url="http://w3", rebalance_timeout_ms=3_000)
        assert ErrorCode(newcomer.join_once().error_code) is ErrorCode.MEMBER_ID_REQUIRED
        parked = ThreadPoolExecutor(1)
        waiting = parked.submit(newcomer.join_once)
        time.sleep(0.3)
        assert not waiting.done()
        assert ErrorCode(members[0].heartbeat().error_code) is ErrorCode.REBALANCE_IN_PROGRESS
        owner.kill()
        with pytest.raises(grpc.RpcError):
            waiting.result(5)
        parked.shutdown()
        everyone = [*members, newcomer]
        move(everyone, to_standby)
        with ThreadPoolExecutor(4) as pool:
            rejoined = list(pool.map(lambda m: join_at(m, seen), everyone))
        second = {j.generation_id for j in rejoined}
        assert len(second) == 1 and second.pop() > first
        leader_join = next(j for j in rejoined if j.member_id == j.leader)
        assert sorted(m.member_id for m in leader_join.members) == sorted(
            m.member_id for m in everyone
        )
        assert [ErrorCode(s.error_code).name for s in sync_all(everyone)] == ["NONE"] * 4
        seen.check()
    finally:
        to_owner.close()
        to_standby.close()
