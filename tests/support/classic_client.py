"""A scripted classic member for tests (DESIGN 3.19): speaks `ConnectGroupClassic` over gRPC as a
Connect worker on Kafka's classic protocol does: JoinGroup with an empty id, MEMBER_ID_REQUIRED,
JoinGroup again with the id it was given (a call that may be held until the join phase ends),
SyncGroup (the leader sends an eager round-robin assignment of the catalogue it was shown), then
heartbeats. Every call's deadline is its rebalance timeout + 5 s (Kafka's rule)."""

from __future__ import annotations

from typing import Any

import grpc
from connect.group.v1 import classic_pb2, classic_pb2_grpc, common_pb2

from connect_protocol.errors import ErrorCode

EAGER = "default"  # Connect's version 0 protocol: every join releases everything
EAGER_VERSION = 0
#: Kafka's JOIN_GROUP_TIMEOUT_LAPSE.
CALL_LAPSE_S = 5.0


def stub(channel: grpc.Channel) -> classic_pb2_grpc.ConnectGroupClassicStub:
    return classic_pb2_grpc.ConnectGroupClassicStub(channel)


def round_robin(join: Any) -> dict[str, common_pb2.ConnectorsAndTasks]:
    """The eager leader's assignment: every connector and task of the catalogue it was shown,
    except those withheld, dealt round-robin over the members sorted by id."""
    withheld = {c for c in join.withheld.connectors} | {
        f"{t.connector}-{t.task}" for t in join.withheld.tasks
    }
    members = sorted(m.member_id for m in join.members)
    out = {member: common_pb2.ConnectorsAndTasks() for member in members}
    resources: list[tuple[str, int | None]] = []
    for spec in sorted(join.catalogue, key=lambda s: s.name):
        resources.append((spec.name, None))
        resources.extend((spec.name, task) for task in range(spec.task_count))
    i = 0
    for connector, task in resources:
        name = connector if task is None else f"{connector}-{task}"
        if name in withheld or not members:
            continue
        target = out[members[i % len(members)]]
        if task is None:
            target.connectors.append(connector)
        else:
            target.tasks.add(connector=connector, task=task)
        i += 1
    return out


class ClassicMember:
    """One worker on the classic protocol (eager, "default"), scripted step by step."""

    def __init__(
        self,
        channel: grpc.Channel,
        group_id: str,
        url: str = "http://worker:8083",
        session_timeout_ms: int = 6_000,
        rebalance_timeout_ms: int = 2_000,
    ) -> None:
        self.stub = stub(channel)
        self.group_id = group_id
        self.url = url
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.member_id = ""
        self.generation = -1
        self.leader = ""
        self.last_join: Any = None
        self.assignment: Any = None

    @property
    def deadline_s(self) -> float:
        return self.rebalance_timeout_ms / 1000 + CALL_LAPSE_S

    def join_request(self) -> classic_pb2.JoinGroupRequest:
        return classic_pb2.JoinGroupRequest(
            group_id=self.group_id,
            session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            member_id=self.member_id,
            protocol_type="connect",
            protocols=[
                classic_pb2.JoinGroupRequestProtocol(
                    name=EAGER,
                    metadata=classic_pb2.ConnectWorkerMetadata(version=EAGER_VERSION, url=self.url),
                )
            ],
        )

    def join_once(self, timeout_s: float | None = None) -> Any:
        """One JoinGroup call as it stands (an empty id asks for one)."""
        resp = self.stub.JoinGroup(self.join_request(), timeout=timeout_s or self.deadline_s)
        if resp.error_code == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = resp.member_id
        elif resp.error_code == ErrorCode.NONE:
            self.generation, self.leader = resp.generation_id, resp.leader
            self.last_join = resp
        return resp

    def join(self, timeout_s: float | None = None) -> Any:
        """JoinGroup until it is answered with a generation (MEMBER_ID_REQUIRED: rejoin with the
        id given; REBALANCE_IN_PROGRESS from the park limit: ask again). Raises on any other
        error."""
        for _ in range(10):
            resp = self.join_once(timeout_s)
            if resp.error_code == ErrorCode.NONE:
                return resp
            if resp.error_code not in (
                ErrorCode.MEMBER_ID_REQUIRED,
                ErrorCode.REBALANCE_IN_PROGRESS,
            ):
                raise AssertionError(
                    f"{self.member_id or '(new)'}: JoinGroup answered "
                    f"{ErrorCode(resp.error_code).name}: {resp.error_message}"
                )
        raise AssertionError(f"{self.member_id}: no generation after 10 JoinGroups")

    def sync(self, timeout_s: float | None = None) -> Any:
        """SyncGroup for the generation joined: the leader sends the round-robin assignment."""
        req = classic_pb2.SyncGroupRequest(
            group_id=self.group_id, generation_id=self.generation, member_id=self.member_id
        )
        join = self.last_join
        if join is not None and join.leader == self.member_id:
            for member_id, resources in round_robin(join).items():
                req.assignments.add(
                    member_id=member_id,
                    assignment=classic_pb2.ConnectWorkerAssignment(
                        version=EAGER_VERSION, assignment=resources
                    ),
                )
        resp = self.stub.SyncGroup(req, timeout=timeout_s or self.deadline_s)
        if resp.error_code == ErrorCode.NONE:
            self.assignment = resp.assignment
        return resp

    def heartbeat(self, timeout_s: float = 5.0) -> Any:
        return self.stub.Heartbeat(
            classic_pb2.HeartbeatRequest(
                group_id=self.group_id, generation_id=self.generation, member_id=self.member_id
            ),
            timeout=timeout_s,
        )

    def leave(self, timeout_s: float = 5.0) -> Any:
        return self.stub.LeaveGroup(
            classic_pb2.LeaveGroupRequest(
                group_id=self.group_id,
                members=[classic_pb2.MemberIdentity(member_id=self.member_id)],
            ),
            timeout=timeout_s,
        )
