"""Render a DescribedGroup as a readable table for `coordinator-svc describe`. Every string the
server sent is shown through `printable` (its control characters escaped). A connect group shows
its epochs, assignor and members' targets; a classic group (DESIGN 3.19) its classic block
(state, generation, protocol, leader, join round) and its members' protocols, session timeouts,
last joined generations and held sets. `render_statuses` is `coordinator-svc status`: each
connector and task with its state, worker and trace (DESIGN 3.20), as Connect's status API
shows them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from connect_protocol.configs import GROUP_TYPE_CLASSIC, configs_of
from connect_protocol.safe_text import printable as _p


def _names(cat: Any) -> str:
    items = [_p(c) for c in cat.connectors] + [f"{_p(t.connector)}-{t.task}" for t in cat.tasks]
    return ", ".join(items) if items else "-"


def _tokens(tokens: Any) -> str:
    """Resources that share a token (one grant) together: "A, A-0: 7; B-1: 9"."""
    by_token: dict[int, list[str]] = {}
    for t in tokens:
        name = f"{_p(t.connector)}-{t.task}" if t.HasField("task") else _p(t.connector)
        by_token.setdefault(t.token, []).append(name)
    return (
        "; ".join(f"{', '.join(names)}: {token}" for token, names in sorted(by_token.items()))
        or "-"
    )


def _assignment_request(group: Any, now_ms: int) -> str:
    """Assignment batching (DESIGN 3.21): the outstanding computation, or when the next may be
    requested."""
    if group.HasField("assignment_requested_epoch"):
        return (
            f"  computation requested at group epoch {group.assignment_requested_epoch}, "
            "outstanding (asked on every heartbeat of the assignor member)"
        )
    due = (
        group.next_assignment_request_at_ms
        if group.HasField("next_assignment_request_at_ms")
        else None
    )
    when = (
        "now"
        if due is None or due <= now_ms
        else f"in {(due - now_ms) / 1000:.1f}s (coordinator time {due})"
    )
    if group.group_epoch > group.assignment_epoch:
        return f"  next computation may be requested {when}"
    return f"  target is current; a new computation may be requested {when}"


def _ids(ids: Any) -> str:
    return ", ".join(_p(i) for i in ids) or "-"


def _classic_block(group: Any) -> list[str]:
    """State, generation, protocol, leader and the join round of a classic group."""
    c = group.classic
    protocol = f"{_p(c.protocol_type)}/{_p(c.protocol_name)}" if c.protocol_name else "none"
    lines = [
        f"  classic state {_p(c.state)}   generation {c.generation_id}   protocol {protocol}",
        f"  leader {_p(c.leader_id)}" if c.leader_id else "  no leader",
    ]
    if c.leader_unavailable_reason:
        lines.append(f"  leader unavailable: {_p(c.leader_unavailable_reason)}")
    if c.rebalance_reason:
        lines.append(f"  last rebalance reason: {_p(c.rebalance_reason)}")
    lines.append(
        f"  pending member ids: {_ids(c.pending_member_ids)}   joined this phase: "
        f"{_ids(c.members_joined)}   awaiting sync: {_ids(c.members_awaiting_sync)}"
    )
    return lines


def _classic_members(group: Any) -> list[tuple[str, ...]]:
    header = (
        "MEMBER",
        "PROTOCOL",
        "PROTOCOLS",
        "SESSION MS",
        "LAST GEN",
        "SYNCED",
        "STATE",
        "HELD",
        "PENDING REVOCATION",
        "FENCING TOKENS",
    )
    rows: list[tuple[str, ...]] = [header]
    for m in group.members:
        classic = m.classic if m.HasField("classic") else None
        rows.append(
            (
                _p(m.member_id),
                _p(m.group_protocol) or "connect",
                _ids(classic.protocols) if classic else "-",
                str(classic.session_timeout_ms) if classic else "-",
                str(classic.last_joined_generation) if classic else str(m.member_epoch),
                ("yes" if classic.synced else "no") if classic else "-",
                _p(m.state),
                _names(m.current_assignment),
                _names(m.pending_revocation),
                _tokens(m.fencing_tokens),
            )
        )
    return rows


def _common_tail(group: Any, lines: list[str], group_type: str | None = None) -> None:
    """The catalogue and the configurations; with `group_type`, only the configurations that
    apply to groups of that type (a classic group's members choose their own timeouts)."""
    catalogue = ", ".join(
        f"{_p(c.name)} ({c.task_count} tasks"
        + ("" if c.target_state == 0 else f", {_target_name(c.target_state)}")
        + ")"
        for c in group.catalogue
    )
    lines.append(f"  catalogue: {catalogue or 'empty'}")
    for c in group.catalogue:
        if c.config:
            config = ", ".join(f"{_p(k)}={_p(v)}" for k, v in sorted(c.config.items()))
            lines.append(f"    {_p(c.name)} config ({_p(c.config_digest[:24])}): {config}")
    shown = sorted(group.group_configs.items())
    if group_type is not None:
        applicable = {row.name for row in configs_of(group_type)}
        shown = [(k, v) for k, v in shown if k in applicable]
    configs = ", ".join(f"{_p(k)}={_p(v)}" for k, v in shown)
    lines.append(f"  configs: {configs}")


def _table(rows: Sequence[tuple[str, ...]], lines: list[str]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines.append("")
    for r in rows:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))


def render_classic_group(group: Any, now_ms: int) -> str:
    """A classic group: its classic block, the catalogue and configurations, its members."""
    lines = [f"Group {_p(group.group_id)} ({_p(group.group_type)})  state {_p(group.state)}"]
    lines.extend(_classic_block(group))
    if group.last_assignment_error:
        lines.append(
            f"  last assignment error {_p(group.last_assignment_error)}: "
            f"{_p(group.last_assignment_error_message)}"
        )
    _common_tail(group, lines, GROUP_TYPE_CLASSIC)
    _table(_classic_members(group), lines)
    if not group.members:
        lines.append("  (no members)")
    if group.statuses:
        lines.append("")
        lines.extend(_status_lines(group))
    return "\n".join(lines)


def render_group(group: Any, now_ms: int) -> str:
    if group.group_type == GROUP_TYPE_CLASSIC or group.HasField("classic"):
        return render_classic_group(group, now_ms)
    lines = [
        f"Group {_p(group.group_id)} ({_p(group.group_type)})  state {_p(group.state)}",
        f"  group epoch {group.group_epoch}   assignment (target) epoch {group.assignment_epoch}",
    ]
    if group.assignor_member_id:
        lines.append(
            f"  assignor {_p(group.assignor_name) or '?'} computed by member "
            f"{_p(group.assignor_member_id)}"
        )
    elif group.assignor_unavailable_reason:
        lines.append(f"  no assignor: {_p(group.assignor_unavailable_reason)}")
    if group.HasField("scheduled_rebalance_at_ms"):
        left = (group.scheduled_rebalance_at_ms - now_ms) / 1000
        lines.append(
            f"  delayed rebalance due in {left:.1f}s "
            f"(coordinator time {group.scheduled_rebalance_at_ms})"
        )
        for field, what in (
            ("lost_work_rebalance_at_ms", "lost work placed"),
            ("next_wave_at_ms", "next balancing wave"),
        ):
            if group.HasField(field):
                at = getattr(group, field)
                lines.append(f"    {what} in {(at - now_ms) / 1000:.1f}s (coordinator time {at})")
    else:
        lines.append("  no delayed rebalance pending")
    lines.append(_assignment_request(group, now_ms))
    if group.last_assignment_error:
        lines.append(
            f"  last assignment error {_p(group.last_assignment_error)}: "
            f"{_p(group.last_assignment_error_message)}"
        )
    _common_tail(group, lines)
    header = (
        "MEMBER",
        "INSTANCE",
        "EPOCH",
        "STATE",
        "CURRENT",
        "PENDING REVOCATION",
        "TARGET",
        "FENCING TOKENS",
    )
    rows = [header] + [
        (
            _p(m.member_id),
            _p(m.instance_id) if m.HasField("instance_id") else "-",
            str(m.member_epoch),
            _p(m.state),
            _names(m.current_assignment),
            _names(m.pending_revocation),
            _names(m.target_assignment),
            _tokens(m.fencing_tokens),
        )
        for m in group.members
    ]
    _table(rows, lines)
    if not group.members:
        lines.append("  (no members)")
    if group.statuses:
        lines.append("")
        lines.extend(_status_lines(group))
    return "\n".join(lines)


def _state_name(number: int) -> str:
    from connect.group.v1 import common_pb2

    return str(common_pb2.ResourceState.Name(number))


def _target_name(number: int) -> str:
    from connect.group.v1 import common_pb2

    return str(common_pb2.TargetState.Name(number)).removeprefix("TARGET_")


def _auto_restart(s: Any, now_ms: int) -> str:
    """What automatic restarts (DESIGN 3.20) are doing about a resource, if anything."""
    if s.HasField("next_restart_at_ms"):
        wait_s = max(0, s.next_restart_at_ms - now_ms) / 1000
        return f"  automatic restart {s.auto_restart_attempts + 1} in {wait_s:.1f} s"
    if s.auto_restarts_exhausted:
        return f"  automatic restarts exhausted ({s.auto_restart_attempts}): restart it by hand"
    return ""


def _status_lines(group: Any) -> list[str]:
    """One line per connector and task (its tasks indented under it), traces indented below."""
    lines = ["  statuses:"]
    targets = {c.name: _target_name(c.target_state) for c in group.catalogue}
    for s in group.statuses:
        task = s.HasField("task")
        name = f"{_p(s.connector)}-{s.task}" if task else _p(s.connector)
        what = "task" if task else "connector"
        target = targets.get(s.connector, "STARTED")
        targeted = f"  (target {target})" if not task and target != "STARTED" else ""
        worker = f"  worker {_p(s.worker_id)}" if s.worker_id else ""
        if s.worker_url:
            worker += f" ({_p(s.worker_url)})"
        restarts = f"  restarts {s.restart_count}" if s.restart_count else ""
        indent = "      " if task else "    "
        lines.append(
            f"{indent}{what} {name}  {_state_name(s.state)}{targeted}{worker}{restarts}"
            f"{_auto_restart(s, group.coordinator_time_ms)}"
        )
        for trace_line in s.trace.splitlines():
            lines.append(f"{indent}  | {_p(trace_line)}")
    return lines


def render_statuses(group: Any) -> str:
    """`coordinator-svc status`: the group's connectors and tasks with their states."""
    lines = [f"Group {_p(group.group_id)} ({_p(group.group_type)})  state {_p(group.state)}"]
    if not group.statuses:
        lines.append("  no connectors")
        return "\n".join(lines)
    lines.extend(_status_lines(group))
    return "\n".join(lines)
