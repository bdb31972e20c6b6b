"""Rows <-> core values: the one conversion module between the database and the pure core.

Every function here is pure. `*_row` functions turn a core value into the column dict of one row
(keys are column names); `*_from_row(s)` functions turn rows (any `Mapping[str, Any]`, such as a
SQLAlchemy `RowMapping`) back into core values, so that `load` rebuilds exactly what was committed.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from connect_protocol.classic_messages import ClassicProtocol, ConnectWorkerMetadata
from connect_protocol.lifecycle_messages import TargetState
from connect_protocol.messages import Assignor
from connect_protocol.resources import ResourceSet
from coordinator_svc.core.classic_model import (
    KNOWN_GROUP_TYPES,
    AcceptedAssignment,
    ClassicGroupMeta,
    ClassicMemberInfo,
    ClassicState,
    GroupType,
)
from coordinator_svc.core.model import (
    Connector,
    GroupMeta,
    Hold,
    Member,
    MemberState,
    PreparedSnapshot,
    ResourceStatus,
    StatusState,
    TargetAssignment,
    TargetEntry,
    Tombstone,
)
from coordinator_svc.core.records import (
    ConfigRecord,
    ConnectorRecord,
    EventRecord,
    GroupDeletedRecord,
    GroupMetaRecord,
    MemberRecord,
    Record,
    StatusRecord,
    TargetRecord,
)
from coordinator_svc.store.stored_sets import (
    event_payload_column,
    resources_column,
    resources_from_column,
    task_runs,
    tokens_column,
    tokens_from_column,
)

Row = Mapping[str, Any]


class UnknownGroupType(ValueError):
    """A stored group of a type (or classic state) this code does not know: written by a newer
    release. It is never loaded (an older process would rewrite it as what it knows, DESIGN
    3.19 "Takeover"); its owner leaves it, and its lease, alone.

    Attributes:
        group_id: the group.
        group_type: its stored type.
    """

    def __init__(self, group_id: str, group_type: str, detail: str = "") -> None:
        what = detail or f"of type {group_type!r}"
        super().__init__(
            f"group {group_id!r} is {what}, which this coordinator does not know: it was "
            "written by a newer release; upgrade this coordinator to serve it."
        )
        self.group_id = group_id
        self.group_type = group_type


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ms_to_datetime(at_ms: int) -> datetime:
    """Milliseconds since the Unix epoch -> an exact timezone-aware UTC datetime."""
    return _EPOCH + timedelta(milliseconds=at_ms)


def _resources(data: Any) -> ResourceSet:
    """A stored set in either of its forms (`stored_sets`)."""
    return resources_from_column(data)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes:
    return base64.b64decode(str(text)) if text else b""


_last_compacted: tuple[ResourceSet, dict[str, Any]] | None = None


def compact_resources(resources: ResourceSet) -> dict[str, Any]:
    """A resource set as connectors plus, per connector, its task numbers as [first, last]
    ranges: a whole catalogue (100,000 tasks) in a few kilobytes instead of megabytes. The
    last result is kept: every Prepare of a group stores the same (cached) catalogue object."""
    global _last_compacted
    last = _last_compacted
    if last is not None and last[0] is resources:
        return last[1]
    compact = _compact(resources)
    _last_compacted = (resources, compact)
    return compact


def _compact(resources: ResourceSet) -> dict[str, Any]:
    """The Prepare snapshot's form of `stored_sets.task_runs` (found by bisection, so a
    100,000-task catalogue is O(connectors x log(tasks)), not a Python step per task):
    {connector: [[first, last], ...]}."""
    ranges: dict[str, list[list[int]]] = {}
    for run in task_runs(resources):
        ranges.setdefault(run["connector"], []).append([run["first"], run["last"]])
    return {"connectors": sorted(resources.connectors), "task_ranges": ranges}


def expand_resources(data: Any) -> ResourceSet:
    """The inverse of `compact_resources`; also reads the plain form (`ResourceSet.to_json`)
    that earlier versions stored."""
    return resources_from_column(data)


# --- groups -------------------------------------------------------------------------------


def group_row(meta: GroupMeta, with_prepared: bool = True) -> dict[str, Any]:
    """The groups row; without the `prepared` column unless `with_prepared` (see
    `GroupMetaRecord.prepared_changed`)."""
    return _group_row(meta, with_prepared)


def _group_row(meta: GroupMeta, with_prepared: bool) -> dict[str, Any]:
    """Without `with_prepared`, the Prepare snapshot (O(members + resources)) is not even
    built: most metadata changes (every join's epoch bump) leave it as it was (issue 24)."""
    prepared = meta.prepared
    row = {
        "group_id": meta.group_id,
        "group_type": meta.group_type.value,
        "group_epoch": meta.group_epoch,
        "created_at_ms": meta.created_at_ms,
        "assignor_member_id": meta.assignor_member_id,
        "compute_requested_epoch": meta.compute_requested_epoch,
        "excluded_assignors": sorted(meta.excluded_assignors),
        "compute_not_before_ms": meta.compute_not_before_ms,
        "last_assignment_error": meta.last_assignment_error,
        "last_assignment_error_message": meta.last_assignment_error_message,
        "prepared": None
        if prepared is None or not with_prepared
        else {
            "group_epoch": prepared.group_epoch,
            "member_ids": sorted(prepared.member_ids),
            "catalogue": compact_resources(prepared.catalogue),
        },
        "holds": [
            {
                "member_id": h.member_id,
                "resources": resources_column(h.resources),
                "until_ms": h.until_ms,
                "principal": h.principal,
                "instance_id": h.instance_id,
            }
            for h in meta.holds
        ],
        "session_floor_ms": meta.session_floor_ms,
        "session_floor_until_ms": meta.session_floor_until_ms,
        "last_fencing_token": meta.last_fencing_token,
        "created_by": meta.created_by,
        "compute_requested_at_ms": meta.compute_requested_at_ms,
        **_classic_group_columns(meta.classic),
    }
    if not with_prepared:
        del row["prepared"]
    return row


def _classic_group_columns(classic: ClassicGroupMeta | None) -> dict[str, Any]:
    if classic is None:
        return {"classic_state": None, "protocol_name": None, "leader_id": None}
    return {
        "classic_state": classic.state.value,
        "protocol_name": classic.protocol_name,
        "leader_id": classic.leader_id,
    }


def group_type_from_row(row: Row) -> tuple[GroupType, ClassicGroupMeta | None]:
    """The group's type and classic metadata; UnknownGroupType for a type or classic state this
    code does not know."""
    group_id, raw_type = str(row["group_id"]), str(row["group_type"])
    if raw_type not in KNOWN_GROUP_TYPES:
        raise UnknownGroupType(group_id, raw_type)
    group_type = GroupType(raw_type)
    if group_type is not GroupType.CLASSIC:
        return group_type, None
    raw_state = row.get("classic_state") or ClassicState.EMPTY.value
    try:
        state = ClassicState(raw_state)
    except ValueError:
        raise UnknownGroupType(
            group_id, raw_type, f"a classic group in state {raw_state!r}"
        ) from None
    return group_type, ClassicGroupMeta(state, row.get("protocol_name"), row.get("leader_id"))


def meta_from_row(row: Row) -> GroupMeta:
    """Raises UnknownGroupType for a group this code must not load."""
    group_type, classic = group_type_from_row(row)
    prepared = row["prepared"]
    return GroupMeta(
        group_id=row["group_id"],
        group_epoch=row["group_epoch"],
        created_at_ms=row["created_at_ms"],
        assignor_member_id=row["assignor_member_id"],
        compute_requested_epoch=row["compute_requested_epoch"],
        excluded_assignors=frozenset(str(m) for m in row["excluded_assignors"] or ()),
        compute_not_before_ms=row["compute_not_before_ms"],
        last_assignment_error=row["last_assignment_error"],
        last_assignment_error_message=row["last_assignment_error_message"],
        prepared=None
        if prepared is None
        else PreparedSnapshot(
            group_epoch=int(prepared["group_epoch"]),
            member_ids=frozenset(str(m) for m in prepared["member_ids"]),
            catalogue=expand_resources(prepared["catalogue"]),
        ),
        holds=tuple(
            Hold(
                str(h["member_id"]),
                _resources(h["resources"]),
                int(h["until_ms"]),
                str(h.get("principal", "")),
                None if h.get("instance_id") is None else str(h["instance_id"]),
            )
            for h in row["holds"] or ()
        ),
        session_floor_ms=int(row["session_floor_ms"]),
        session_floor_until_ms=int(row["session_floor_until_ms"]),
        last_fencing_token=int(row["last_fencing_token"]),
        created_by=row["created_by"],
        compute_requested_at_ms=row["compute_requested_at_ms"],
        group_type=group_type,
        classic=classic,
    )


# --- members ------------------------------------------------------------------------------


def _assignor_json(a: Assignor) -> dict[str, Any]:
    return {
        "name": a.name,
        "minimum_version": a.minimum_version,
        "maximum_version": a.maximum_version,
        "reason": a.reason,
        "version": a.version,
        "metadata": _b64(a.metadata),
    }


def _assignor_from_json(data: Mapping[str, Any]) -> Assignor:
    return Assignor(
        name=str(data["name"]),
        minimum_version=int(data["minimum_version"]),
        maximum_version=int(data["maximum_version"]),
        reason=int(data.get("reason", 0)),
        version=int(data.get("version", 0)),
        metadata=_unb64(data.get("metadata")),
    )


def _metadata_json(name: str, m: ConnectWorkerMetadata) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "version": m.version,
        "url": m.url,
        "config_offset": m.config_offset,
    }
    if m.allocation is not None:
        out["allocation"] = resources_column(m.allocation)
    return out


def _protocol_from_json(data: Mapping[str, Any]) -> ClassicProtocol:
    allocation = data.get("allocation")
    return ClassicProtocol(
        str(data["name"]),
        ConnectWorkerMetadata(
            version=int(data["version"]),
            url=str(data.get("url", "")),
            config_offset=int(data.get("config_offset", 0)),
            allocation=None if allocation is None else _resources(allocation),
        ),
    )


def _accepted_json(a: AcceptedAssignment) -> dict[str, Any]:
    out: dict[str, Any] = {
        "generation": a.generation,
        "version": a.version,
        "assignment": resources_column(a.assignment),
        "delay": a.delay,
        "answered": a.answered,
    }
    if a.revoked is not None:
        out["revoked"] = resources_column(a.revoked)
    return out


def _accepted_from_json(data: Mapping[str, Any]) -> AcceptedAssignment:
    revoked = data.get("revoked")
    return AcceptedAssignment(
        generation=int(data["generation"]),
        version=int(data["version"]),
        assignment=_resources(data["assignment"]),
        revoked=None if revoked is None else _resources(revoked),
        delay=int(data.get("delay", 0)),
        answered=bool(data.get("answered", False)),
    )


def _classic_member_columns(classic: ClassicMemberInfo | None) -> dict[str, Any]:
    if classic is None:
        return {
            "group_protocol": GroupType.CONNECT.value,
            "classic_protocols": None,
            "session_timeout_ms": None,
            "last_joined_generation": None,
            "classic_assignment": None,
        }
    return {
        "group_protocol": GroupType.CLASSIC.value,
        "classic_protocols": [_metadata_json(p.name, p.metadata) for p in classic.protocols],
        "session_timeout_ms": classic.session_timeout_ms,
        "last_joined_generation": classic.last_joined_generation,
        "classic_assignment": None
        if classic.accepted is None
        else _accepted_json(classic.accepted),
    }


def _classic_member_from_row(row: Row) -> ClassicMemberInfo | None:
    protocol = row.get("group_protocol") or GroupType.CONNECT.value
    if protocol == GroupType.CONNECT.value:
        return None
    if protocol != GroupType.CLASSIC.value:
        raise UnknownGroupType(
            str(row["group_id"]), str(protocol), f"with a member of protocol {protocol!r}"
        )
    accepted = row.get("classic_assignment")
    return ClassicMemberInfo(
        protocols=tuple(_protocol_from_json(p) for p in row.get("classic_protocols") or ()),
        session_timeout_ms=int(row.get("session_timeout_ms") or 0),
        last_joined_generation=int(row.get("last_joined_generation") or 0),
        accepted=None if accepted is None else _accepted_from_json(accepted),
    )


def member_row(group_id: str, member: Member) -> dict[str, Any]:
    return {
        "group_id": group_id,
        "member_id": member.member_id,
        "instance_id": member.instance_id,
        "url": member.url,
        "member_epoch": member.member_epoch,
        "previous_epoch": member.previous_epoch,
        "state": member.state.value,
        "rebalance_timeout_ms": member.rebalance_timeout_ms,
        "assignors": [_assignor_json(a) for a in member.assignors],
        "assigned": resources_column(member.assigned),
        "pending_revocation": resources_column(member.pending_revocation),
        "principal": member.principal,
        "fencing_tokens": tokens_column(member.tokens),
        "last_grant_at_ms": member.last_grant_at_ms,
        "stable_since_epoch": member.stable_since_epoch,
        "lifecycle_revision": member.lifecycle_revision,
        **_classic_member_columns(member.classic),
    }


def member_epoch_row(group_id: str, member: Member) -> dict[str, Any]:
    """The parameters of an epoch-only member update (see `MemberRecord.epoch_only`)."""
    return {
        "p_group": group_id,
        "p_member": member.member_id,
        "p_epoch": member.member_epoch,
        "p_previous": member.previous_epoch,
        "p_state": member.state.value,
        "p_stable_since": member.stable_since_epoch,
        "p_revision": member.lifecycle_revision,
    }


def members_moved_params(group_id: str, member_ids: Sequence[str], epoch: int) -> dict[str, Any]:
    """The parameters of the one-statement move of unchanged members to `epoch` (DESIGN 3.21;
    see `MembersMovedRecord`)."""
    return {"p_group": group_id, "p_ids": list(member_ids), "p_epoch": epoch}


def member_from_row(row: Row) -> Member:
    return Member(
        member_id=row["member_id"],
        member_epoch=row["member_epoch"],
        previous_epoch=row["previous_epoch"],
        instance_id=row["instance_id"],
        url=row["url"],
        rebalance_timeout_ms=row["rebalance_timeout_ms"],
        assignors=tuple(_assignor_from_json(a) for a in row["assignors"] or ()),
        state=MemberState(row["state"]),
        assigned=_resources(row["assigned"]),
        pending_revocation=_resources(row["pending_revocation"]),
        principal=row["principal"],
        tokens=tokens_from_column(row["fencing_tokens"]),
        last_grant_at_ms=int(row["last_grant_at_ms"]),
        stable_since_epoch=int(row["stable_since_epoch"]),
        lifecycle_revision=int(row["lifecycle_revision"]),
        classic=_classic_member_from_row(row),
    )


# --- catalogue, configs -------------------------------------------------------------------


def connector_row(group_id: str, connector: Connector) -> dict[str, Any]:
    return {
        "group_id": group_id,
        "name": connector.name,
        "task_count": connector.task_count,
        "config": dict(connector.config),
        "config_digest": connector.config_digest,
        "target_state": connector.target_state.value,
    }


def connector_from_row(row: Row) -> Connector:
    config = row["config"] or {}
    return Connector(
        name=row["name"],
        task_count=row["task_count"],
        config=MappingProxyType({str(k): str(v) for k, v in config.items()}),
        config_digest=row["config_digest"] or "",
        target_state=TargetState(row["target_state"] or TargetState.STARTED.value),
    )


def config_rows(group_id: str, configs: Mapping[str, str]) -> list[dict[str, Any]]:
    return [
        {"group_id": group_id, "name": name, "value": value}
        for name, value in sorted(configs.items())
    ]


def configs_from_rows(rows: Iterable[Row]) -> dict[str, str]:
    return {row["name"]: row["value"] for row in rows}


# --- target assignment --------------------------------------------------------------------


def target_row(group_id: str, target: TargetAssignment) -> dict[str, Any]:
    return {
        "group_id": group_id,
        "assignment_epoch": target.assignment_epoch,
        "assignor_state": bytes(target.assignor_state),
        "scheduled_rebalance_at_ms": target.scheduled_rebalance_at_ms,
        "lost_work_rebalance_at_ms": target.lost_work_rebalance_at_ms,
        "next_wave_at_ms": target.next_wave_at_ms,
    }


def target_member_rows(
    group_id: str, target: TargetAssignment, only: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    """The rows of the target's members: all of them, or just those of `only` in the target."""
    entries = target.members
    member_ids = sorted(entries if only is None else (m for m in only if m in entries))
    return [
        {
            "group_id": group_id,
            "member_id": member_id,
            "resources": resources_column(entries[member_id].resources),
            "version": entries[member_id].version,
            "metadata": bytes(entries[member_id].metadata),
        }
        for member_id in member_ids
    ]


def target_from_rows(row: Row, member_rows: Iterable[Row]) -> TargetAssignment:
    entries = {
        m["member_id"]: TargetEntry(
            resources=_resources(m["resources"]),
            version=m["version"],
            metadata=bytes(m["metadata"] or b""),
        )
        for m in member_rows
    }
    return TargetAssignment(
        assignment_epoch=row["assignment_epoch"],
        members=MappingProxyType(entries),
        assignor_state=bytes(row["assignor_state"] or b""),
        scheduled_rebalance_at_ms=row["scheduled_rebalance_at_ms"],
        lost_work_rebalance_at_ms=row["lost_work_rebalance_at_ms"],
        next_wave_at_ms=row["next_wave_at_ms"],
    )


# --- events -------------------------------------------------------------------------------


def tombstone_row(deleted: GroupDeletedRecord) -> dict[str, Any]:
    tombstone = deleted.tombstone
    return {
        "group_id": tombstone.group_id,
        "group_epoch": tombstone.group_epoch,
        "last_fencing_token": tombstone.last_fencing_token,
        "deleted_at": ms_to_datetime(deleted.at_ms),
        "deleted_by": deleted.deleted_by,
    }


def tombstone_from_row(row: Any) -> Tombstone:
    return Tombstone(row.group_id, row.group_epoch, row.last_fencing_token)


def event_row(event: EventRecord) -> dict[str, Any]:
    return {
        "occurred_at": ms_to_datetime(event.at_ms),
        "at_ms": event.at_ms,
        "group_id": event.group_id,
        "group_epoch": event.group_epoch,
        "event_type": event.event_type.value,
        "member_id": event.member_id,
        "payload": event_payload_column(event.payload),
    }


# --- statuses ------------------------------------------------------------------------------


def status_row(group_id: str, connector: str, task: int, status: ResourceStatus) -> dict[str, Any]:
    return {
        "group_id": group_id,
        "connector": connector,
        "task": task,
        "state": status.state.value,
        "member_id": status.member_id,
        "fencing_token": status.token,
        "restart_count": status.restart_count,
        "trace": status.trace,
        "trace_digest": status.trace_digest,
        "reported_at_ms": status.reported_at_ms,
        "auto_attempts": status.auto_attempts,
        "auto_restart_at_ms": status.auto_restart_at_ms,
        "auto_exhausted": status.auto_exhausted,
    }


def statuses_from_rows(group_id: str, status_rows: Iterable[Row]) -> StatusRecord:
    return StatusRecord(
        group_id,
        {
            (row["connector"], int(row["task"])): ResourceStatus(
                state=StatusState(row["state"]),
                member_id=row["member_id"],
                token=int(row["fencing_token"]),
                reported_at_ms=int(row["reported_at_ms"]),
                trace=row["trace"] or "",
                restart_count=int(row["restart_count"] or 0),
                trace_digest=row["trace_digest"] or "",
                auto_attempts=int(row["auto_attempts"] or 0),
                auto_restart_at_ms=(
                    None if row["auto_restart_at_ms"] is None else int(row["auto_restart_at_ms"])
                ),
                auto_exhausted=bool(row["auto_exhausted"]),
            )
            for row in status_rows
        },
    )


# --- a whole group ------------------------------------------------------------------------


def group_records(
    group_row_: Row,
    target: Row | None,
    target_members: Sequence[Row],
    configs: Sequence[Row],
    connectors: Sequence[Row],
    members: Sequence[Row],
    statuses: Sequence[Row] = (),
) -> list[Record]:
    """The records that rebuild a stored group through `replay.new_state`: metadata first, then
    the target, configurations, catalogue and members.

    A group whose target lags its group epoch (ASSIGNING) is first introduced at the target's
    epoch and then moved to its real metadata, so that the target is accepted whatever placeholder
    `replay.new_state` starts from (at the group epoch, a TargetRecord for a lower epoch would look
    like a step down); replay still checks every step.
    """
    meta = meta_from_row(group_row_)
    records: list[Record] = []
    if target is None:
        records.append(GroupMetaRecord(meta))
    else:
        assigned = target_from_rows(target, target_members)
        if assigned.assignment_epoch < meta.group_epoch:
            records.append(GroupMetaRecord(replace(meta, group_epoch=assigned.assignment_epoch)))
        records.append(GroupMetaRecord(meta))
        records.append(TargetRecord(meta.group_id, assigned))
    if configs:
        records.append(ConfigRecord(meta.group_id, configs_from_rows(configs)))
    records.extend(ConnectorRecord(meta.group_id, connector_from_row(c)) for c in connectors)
    records.extend(MemberRecord(meta.group_id, member_from_row(m)) for m in members)
    if statuses:
        records.append(statuses_from_rows(meta.group_id, statuses))
    return records
