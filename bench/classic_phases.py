"""The classic phases of the coordinator benchmark (bench/coordinator_bench.py, issue 25): the
calls that form and empty a classic group (DESIGN 3.19) from the driver, and the parked JoinGroups
whose cost to another group the "parked" phase measures.

A classic group is formed as Connect workers form one: every member's first JoinGroup (no id) is
answered MEMBER_ID_REQUIRED with an id that holds the join barrier, then every member rejoins with
its id; those calls are held until all have joined, the leader (shown the catalogue) sends an
eager round-robin assignment in its SyncGroup and the followers' SyncGroups are answered with it.
Calls are sent as gRPC futures over a few channels, so that hundreds may be held at once without a
thread each.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import grpc
from connect.group.v1 import classic_pb2, classic_pb2_grpc

from connect_protocol.errors import ErrorCode
from tests.support.classic_client import CALL_LAPSE_S, EAGER, EAGER_VERSION, round_robin

#: Calls held at once per channel (each channel is one HTTP/2 connection).
CALLS_PER_CHANNEL = 100


@dataclass
class ClassicMembers:
    """A classic group's members as the driver knows them after a join phase."""

    group_id: str
    ids: list[str]
    generation: int
    leader: str
    rebalance_timeout_ms: int

    def as_load(self) -> list[dict[str, Any]]:
        return [{"id": member_id, "generation": self.generation} for member_id in self.ids]


class ClassicCalls:
    """ConnectGroupClassic stubs over `channels` channels to the coordinator at `address`."""

    def __init__(self, address: str, channels: int) -> None:
        self.channels = [
            grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(max(channels, 1))
        ]
        self.stubs = [classic_pb2_grpc.ConnectGroupClassicStub(c) for c in self.channels]

    def close(self) -> None:
        for channel in self.channels:
            channel.close()

    def stub(self, k: int) -> classic_pb2_grpc.ConnectGroupClassicStub:
        return self.stubs[k % len(self.stubs)]

    # --- joining ---

    @staticmethod
    def join_request(
        group_id: str, member_id: str, url: str, session_ms: int, rebalance_ms: int
    ) -> classic_pb2.JoinGroupRequest:
        return classic_pb2.JoinGroupRequest(
            group_id=group_id,
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms,
            member_id=member_id,
            protocol_type="connect",
            protocols=[
                classic_pb2.JoinGroupRequestProtocol(
                    name=EAGER,
                    metadata=classic_pb2.ConnectWorkerMetadata(version=EAGER_VERSION, url=url),
                )
            ],
        )

    def member_ids(
        self, group_id: str, prefix: str, count: int, session_ms: int, rebalance_ms: int
    ) -> list[str]:
        """Each of `count` new workers asks to join without an id and is given one
        (MEMBER_ID_REQUIRED); the ids are pending members of the group from then on."""
        futures = [
            self.stub(k).JoinGroup.future(
                self.join_request(
                    group_id,
                    "",
                    f"http://{prefix}-{k}.bench.invalid:8083",
                    session_ms,
                    rebalance_ms,
                ),
                timeout=30,
            )
            for k in range(count)
        ]
        ids = []
        for future in futures:
            resp = future.result()
            if resp.error_code != ErrorCode.MEMBER_ID_REQUIRED:
                raise RuntimeError(
                    f"classic first JoinGroup: {ErrorCode(resp.error_code).name} "
                    f"{resp.error_message}"
                )
            ids.append(resp.member_id)
        return ids

    def rejoin(
        self, group_id: str, ids: list[str], session_ms: int, rebalance_ms: int
    ) -> list[grpc.Future]:
        """Every member JoinGroups with its id; the calls are held by the coordinator until the
        join phase ends. Returns the futures, unanswered."""
        timeout_s = rebalance_ms / 1000 + CALL_LAPSE_S + 5
        return [
            self.stub(k).JoinGroup.future(
                self.join_request(
                    group_id,
                    member_id,
                    f"http://{member_id}.bench.invalid:8083",
                    session_ms,
                    rebalance_ms,
                ),
                timeout=timeout_s,
            )
            for k, member_id in enumerate(ids)
        ]

    @staticmethod
    def joined(futures: list[grpc.Future]) -> list[Any]:
        """The answers of held JoinGroups; every one must name a generation."""
        answers = [f.result() for f in futures]
        for resp in answers:
            if resp.error_code != ErrorCode.NONE:
                raise RuntimeError(
                    f"classic JoinGroup: {ErrorCode(resp.error_code).name} {resp.error_message}"
                )
        return answers

    def sync_all(self, group_id: str, answers: list[Any], rebalance_ms: int) -> None:
        """Every member SyncGroups for its generation; the leader sends the round-robin
        assignment of the catalogue its JoinGroup answer showed."""
        timeout_s = rebalance_ms / 1000 + CALL_LAPSE_S + 5
        futures = []
        for k, join in enumerate(answers):
            req = classic_pb2.SyncGroupRequest(
                group_id=group_id, generation_id=join.generation_id, member_id=join.member_id
            )
            if join.leader == join.member_id:
                for member_id, resources in round_robin(join).items():
                    req.assignments.add(
                        member_id=member_id,
                        assignment=classic_pb2.ConnectWorkerAssignment(
                            version=EAGER_VERSION, assignment=resources
                        ),
                    )
            futures.append(self.stub(k).SyncGroup.future(req, timeout=timeout_s))
        for future in futures:
            resp = future.result()
            if resp.error_code != ErrorCode.NONE:
                raise RuntimeError(
                    f"classic SyncGroup: {ErrorCode(resp.error_code).name} {resp.error_message}"
                )

    def form(
        self, group_id: str, prefix: str, count: int, session_ms: int, rebalance_ms: int
    ) -> ClassicMembers:
        """`count` workers form the group: ids, one join phase, one sync; STABLE after it."""
        ids = self.member_ids(group_id, prefix, count, session_ms, rebalance_ms)
        answers = self.joined(self.rejoin(group_id, ids, session_ms, rebalance_ms))
        generations = {a.generation_id for a in answers}
        if len(generations) != 1:
            raise RuntimeError(f"classic members joined different generations: {generations}")
        self.sync_all(group_id, answers, rebalance_ms)
        return ClassicMembers(
            group_id, ids, answers[0].generation_id, answers[0].leader, rebalance_ms
        )

    def leave_all(self, group_id: str, ids: list[str]) -> None:
        """Every member leaves (one LeaveGroup each: a call removes only its caller)."""
        futures = [
            self.stub(k).LeaveGroup.future(
                classic_pb2.LeaveGroupRequest(
                    group_id=group_id, members=[classic_pb2.MemberIdentity(member_id=member_id)]
                ),
                timeout=30,
            )
            for k, member_id in enumerate(ids)
        ]
        for future in futures:
            resp = future.result()
            if resp.error_code != ErrorCode.NONE:
                raise RuntimeError(
                    f"classic LeaveGroup: {ErrorCode(resp.error_code).name} {resp.error_message}"
                )


def wait_for(predicate: Any, timeout_s: float, what: str) -> float:
    """Poll `predicate` every 10 ms until it holds; returns the seconds it took."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)
    return time.monotonic() - started
