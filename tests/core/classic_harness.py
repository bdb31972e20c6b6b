"""ClassicHarness: drives the classic handlers (JoinGroup, SyncGroup, Heartbeat, LeaveGroup and
the classic timers) against one group on a fake clock, like `GroupHarness` does for the connect
protocol: every call checks that the handler left the state it was given alone, applies the
records with `replay`, the timer operations to a fake timer wheel, and keeps the answers to
parked calls (wakeups) by (kind, member).

Catalogue changes are made as issue 25's P3 makes them on a classic group (the connector put,
and a rebalance started when the group has members), without `core.admin`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from connect_protocol.classic_messages import (
    ClassicHeartbeatRequest,
    ClassicHeartbeatResponse,
    ClassicProtocol,
    ConnectWorkerAssignment,
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
from connect_protocol.resources import ResourceSet
from coordinator_svc.core import replay
from coordinator_svc.core.change import GroupChange
from coordinator_svc.core.classic_heartbeat import heartbeat as classic_heartbeat
from coordinator_svc.core.classic_heartbeat import leave_group
from coordinator_svc.core.classic_join import join_group
from coordinator_svc.core.classic_model import ClassicGroupMeta, ClassicState, GroupType
from coordinator_svc.core.classic_sync import sync_group
from coordinator_svc.core.model import Connector, GroupConfigDefaults
from coordinator_svc.core.records import EventType
from coordinator_svc.core.results import Parked, Result, Wakeup

from .harness import GroupHarness, rs

__all__ = ["rs"]

# Scaled-down timeouts (plan 5: sessions 100-1000 ms, delay 50 ms).
SESSION_MS = 1_000
REBALANCE_MS = 500
DELAY_MS = 50
NEW_MEMBER_MS = 3_000

CLASSIC_DEFAULTS = GroupConfigDefaults(
    classic_min_session_timeout_ms=100,
    classic_max_session_timeout_ms=10_000,
    classic_initial_rebalance_delay_ms=DELAY_MS,
    classic_new_member_join_timeout_ms=NEW_MEMBER_MS,
    scheduled_rebalance_max_delay_ms=3_000,
)

SESSIONED = "sessioned"
COMPATIBLE = "compatible"
EAGER = "default"
_LISTS = {
    SESSIONED: ("sessioned", "compatible", "default"),
    COMPATIBLE: ("compatible", "default"),
    EAGER: ("default",),
}
_VERSIONS = {"sessioned": 2, "compatible": 1, "default": 0}


def protocols(
    kind: str = SESSIONED, allocation: ResourceSet | None = None, url: str = ""
) -> tuple[ClassicProtocol, ...]:
    """What a Connect worker of `kind` lists (ICCP `metadataRequest`), its allocation on the
    cooperative versions."""
    return tuple(
        ClassicProtocol(
            name,
            ConnectWorkerMetadata(
                _VERSIONS[name], url, 0, allocation if _VERSIONS[name] > 0 else None
            ),
        )
        for name in _LISTS[kind]
    )


def given(
    assignment: ResourceSet | None = None,
    revoked: ResourceSet | None = None,
    version: int = 2,
    delay: int = 0,
    error: int = 0,
) -> ConnectWorkerAssignment:
    return ConnectWorkerAssignment(
        version=version,
        error=error,
        assignment=assignment if assignment is not None else rs(),
        revoked=revoked if revoked is not None else (rs() if version > 0 else None),
        delay=delay,
    )


class ClassicHarness(GroupHarness):
    """One classic group. `answers` keeps the last answer to each parked call by (kind,
    member); `wakeups` every answer delivered so far, in order."""

    def __init__(
        self, group_id: str = "cg", defaults: GroupConfigDefaults = CLASSIC_DEFAULTS
    ) -> None:
        super().__init__(group_id, defaults)
        self.answers: dict[tuple[str, str], Any] = {}
        self.wakeups: list[Wakeup] = []
        self.wakeups_of_last_call: list[Wakeup] = []
        self.fire_times: dict[tuple[str, str], int] = {}

    def _apply(self, result: Result[Any]) -> None:
        super()._apply(result)
        self.wakeups_of_last_call = list(result.wakeups)
        for wakeup in result.wakeups:
            self.answers[(wakeup.kind, wakeup.member_id)] = wakeup.response
            self.wakeups.append(wakeup)

    def dump(self) -> dict[str, Any]:
        out = super().dump()
        if self.state is not None:
            if self.state.round is not None:
                out["round"] = self.state.round.snapshot()
            out["protocol_counts"] = (
                dict(self.state.classic_protocol_counts),
                self.state.classic_members,
            )
        return out

    def rebuilt(self) -> dict[str, Any]:
        """The dump of the group rebuilt from every record so far, its round included."""
        if not self.log:
            return {}
        shadow = ClassicHarness(self.group_id, self.defaults)
        shadow.state = replay.new_state(self.log)
        return shadow.dump()

    # --- the four calls ---

    def join(  # type: ignore[override]
        self,
        member_id: str = "",
        *,
        new_id: str = "",
        kind: str = SESSIONED,
        allocation: ResourceSet | None = None,
        session_ms: int = SESSION_MS,
        rebalance_ms: int = REBALANCE_MS,
        principal: str | None = None,
        instance_id: str | None = None,
        protocol_list: tuple[ClassicProtocol, ...] | None = None,
        url: str = "",
    ) -> JoinGroupResponse | Parked:
        req = JoinGroupRequest(
            group_id=self.group_id,
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms,
            member_id=member_id,
            group_instance_id=instance_id,
            protocols=protocol_list or protocols(kind, allocation, url or f"http://{member_id}"),
        )
        return self._run(
            lambda s: join_group(
                s, req, self.now_ms, self.defaults, principal=principal, new_member_id=new_id
            )
        )

    def new_member(self, name: str, **kw: Any) -> JoinGroupResponse | Parked:
        """MEMBER_ID_REQUIRED handing out `name`, then the JoinGroup with it."""
        first = self.join("", new_id=name, **kw)
        assert isinstance(first, JoinGroupResponse), first
        assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED, first
        assert first.member_id == name
        return self.join(name, **kw)

    def sync(
        self,
        member_id: str,
        assignments: Mapping[str, ConnectWorkerAssignment] | None = None,
        *,
        generation: int | None = None,
        principal: str | None = None,
        instance_id: str | None = None,
        protocol_name: str | None = None,
    ) -> SyncGroupResponse | Parked:
        req = SyncGroupRequest(
            group_id=self.group_id,
            generation_id=self.generation if generation is None else generation,
            member_id=member_id,
            group_instance_id=instance_id,
            protocol_name=protocol_name,
            assignments=tuple(SyncGroupAssignment(m, a) for m, a in (assignments or {}).items()),
        )
        return self._run(
            lambda s: sync_group(s, req, self.now_ms, self.defaults, principal=principal)
        )

    def hb(
        self,
        member_id: str,
        *,
        generation: int | None = None,
        principal: str | None = None,
        instance_id: str | None = None,
    ) -> ClassicHeartbeatResponse:
        req = ClassicHeartbeatRequest(
            self.group_id,
            self.generation if generation is None else generation,
            member_id,
            instance_id,
        )
        return self._run(
            lambda s: classic_heartbeat(s, req, self.now_ms, self.defaults, principal=principal)
        )

    def leave_group(
        self,
        *member_ids: str,
        principal: str | None = None,
        instance_id: str | None = None,
    ) -> LeaveGroupResponse:
        req = LeaveGroupRequest(
            self.group_id, tuple(LeavingMember(m, instance_id) for m in member_ids)
        )
        return self._run(
            lambda s: leave_group(s, req, self.now_ms, self.defaults, principal=principal)
        )

    def keepalive(self, member_id: str) -> ClassicHeartbeatResponse:  # type: ignore[override]
        """A classic heartbeat at the member's generation (what `run_for` sends)."""
        return self.hb(member_id, generation=self.member(member_id).member_epoch)

    def heartbeat(self, *args: Any, **kw: Any) -> Any:
        raise AssertionError("a classic group's members send hb(), not connect heartbeats")

    def put_connector(  # type: ignore[override]
        self, name: str, task_count: int, config: Mapping[str, str] | None = None
    ) -> None:
        """A catalogue change as P3 makes it on a classic group (creating the group if it
        does not exist): the connector put, and a rebalance started when there are members."""

        def handler(state: Any) -> Result[None]:
            change = GroupChange(state, self.group_id, self.now_ms, self.defaults)
            if state is None:
                change.set_meta(group_type=GroupType.CLASSIC, classic=ClassicGroupMeta())
            change.put_connector(Connector(name, task_count))
            change.event(EventType.CONNECTOR_PUT, connector=name, task_count=task_count)
            if change.has_members():
                change.start_classic_rebalance("catalogue changed", connector=name)
            return change.result(None)

        self._run(handler)

    # --- reads ---

    @property
    def generation(self) -> int:
        return 0 if self.state is None else self.state.group_epoch

    @property
    def classic_state(self) -> ClassicState:
        assert self.state is not None and self.state.meta.classic is not None
        return self.state.meta.classic.state

    @property
    def leader(self) -> str | None:
        assert self.state is not None and self.state.meta.classic is not None
        return self.state.meta.classic.leader_id

    @property
    def protocol(self) -> str | None:
        assert self.state is not None and self.state.meta.classic is not None
        return self.state.meta.classic.protocol_name

    def fired_at(self, key: tuple[str, str]) -> int:
        """When timer `key` last fired."""
        return self.fire_times[key]

    def fire(self, key: tuple[str, str]) -> None:
        self.fire_times[key] = self.now_ms
        super().fire(key)

    def join_answer(self, member_id: str) -> JoinGroupResponse:
        answer = self.answers.get(("join", member_id))
        assert isinstance(answer, JoinGroupResponse), f"no join answer for {member_id}: {answer}"
        return answer

    def sync_answer(self, member_id: str) -> SyncGroupResponse:
        answer = self.answers.get(("sync", member_id))
        assert isinstance(answer, SyncGroupResponse), f"no sync answer for {member_id}: {answer}"
        return answer

    def held(self, member_id: str) -> ResourceSet:
        return self.member(member_id).assigned

    # --- scenarios ---

    def form(
        self,
        names: Iterable[str],
        assignments: Mapping[str, ResourceSet] | None = None,
        kind: str = SESSIONED,
    ) -> None:
        """Members `names` join an EMPTY group, the phase completes after the initial delay,
        followers sync first, then the leader with `assignments`: STABLE."""
        names = list(names)
        for name in names:
            answer = self.new_member(name, kind=kind)
            assert isinstance(answer, Parked), answer
        self.sleep(REBALANCE_MS)
        assert self.classic_state is ClassicState.COMPLETING_REBALANCE
        self.sync_all(assignments or {}, version=_VERSIONS[_LISTS[kind][0]])
        assert self.classic_state is ClassicState.STABLE

    def sync_all(self, assignments: Mapping[str, ResourceSet], version: int = 2) -> None:
        """Every member of the generation syncs; the leader last, with `assignments`."""
        leader = self.leader
        assert leader is not None
        assert self.state is not None
        for member_id in sorted(self.state.members):
            if member_id != leader:
                self.sync(member_id)
        answer = self.sync(leader, {m: given(a, version=version) for m, a in assignments.items()})
        assert isinstance(answer, SyncGroupResponse) and answer.error_code == 0, answer

    def rejoin_all(self, allocations: Mapping[str, ResourceSet] | None = None) -> None:
        """Every member rejoins reporting what it holds (or `allocations`)."""
        assert self.state is not None
        for member_id in sorted(self.state.members):
            if not self.has_member(member_id):
                continue
            allocation = (allocations or {}).get(member_id, self.held(member_id))
            self.join(member_id, allocation=allocation)
