"""Helpers for the classic membership machine's tests: a scaled-down configuration, answers as
the coordinator gives them, and steps that take one machine through a join."""

from __future__ import annotations

from typing import TypeVar

from connect_protocol.classic_messages import (
    ConnectWorkerAssignment,
    JoinGroupResponse,
    SyncGroupResponse,
)
from connect_protocol.errors import ErrorCode
from connect_protocol.resources import EMPTY, ResourceSet
from worker_agent.classic.membership import (
    ClassicAction,
    ClassicConfig,
    ClassicMembership,
    SendJoinGroup,
    SendSyncGroup,
)
from worker_agent.membership import StartWork

__all__ = ["A", "config", "join_ok", "joined", "one", "only", "stable", "sync_ok"]

A = TypeVar("A")

SESSION_MS = 1_000
REBALANCE_MS = 500
INTERVAL_MS = 100
BACKOFF_MS = 20


def config(protocol: str = "sessioned", **kw: int | str) -> ClassicConfig:
    values: dict[str, int | str] = {
        "url": "http://w1",
        "session_timeout_ms": SESSION_MS,
        "rebalance_timeout_ms": REBALANCE_MS,
        "heartbeat_interval_ms": INTERVAL_MS,
        "retry_backoff_ms": BACKOFF_MS,
        "retry_backoff_max_ms": 160,
        "request_timeout_ms": 400,
        "scheduled_rebalance_max_delay_ms": 3_000,
    }
    values.update(kw)
    return ClassicConfig("g", protocol, **values)  # type: ignore[arg-type]


def only(actions: list[ClassicAction], kind: type[A]) -> list[A]:
    return [a for a in actions if isinstance(a, kind)]


def one(actions: list[ClassicAction], kind: type[A]) -> A:
    found = only(actions, kind)
    assert len(found) == 1, actions
    return found[0]


def join_ok(
    member: str = "w1", generation: int = 1, leader: str = "w0", protocol: str = "sessioned"
) -> JoinGroupResponse:
    return JoinGroupResponse(
        generation_id=generation,
        protocol_type="connect",
        protocol_name=protocol,
        leader=leader,
        member_id=member,
    )


def sync_ok(
    assignment: ResourceSet = EMPTY,
    revoked: ResourceSet | None = EMPTY,
    delay: int = 0,
    version: int = 2,
) -> SyncGroupResponse:
    return SyncGroupResponse(
        ErrorCode.NONE,
        protocol_type="connect",
        assignment=ConnectWorkerAssignment(
            version=version,
            leader="w0",
            leader_url="http://w0",
            assignment=assignment,
            revoked=revoked if version > 0 else None,
            delay=delay,
        ),
    )


def joined(
    m: ClassicMembership,
    now: int,
    *,
    member: str = "w1",
    generation: int = 1,
    protocol: str = "sessioned",
) -> SendSyncGroup:
    """The machine sends its JoinGroup, which is answered (follower): returns its SyncGroup."""
    one(m.poll(now), SendJoinGroup)
    m.on_join_response(join_ok(member, generation, protocol=protocol), now)
    return one(m.poll(now), SendSyncGroup)


def stable(
    protocol: str = "sessioned",
    assignment: ResourceSet = EMPTY,
    now: int = 0,
    generation: int = 1,
    **kw: int | str,
) -> ClassicMembership:
    """A machine that joined as follower `w1`, got `assignment` and started it."""
    m = ClassicMembership(config(protocol, **kw))
    version = {"default": 0, "compatible": 1, "sessioned": 2}[protocol]
    joined(m, now, generation=generation, protocol=protocol)
    m.on_sync_response(sync_ok(assignment, version=version), now)
    for action in only(m.poll(now), StartWork):
        m.work_started(action.resources, now)
    assert m.running == assignment
    return m
