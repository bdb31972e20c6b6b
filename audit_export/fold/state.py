"""What a group's fold carries from one export run to the next (`GroupState`), and its JSON form.

Everything here is bounded by the group as it is now, not by its history: open running intervals,
open gaps and the excuse windows that may still cover them, rebalances that can still change,
lost resources still waiting, double ownership still going on; plus per member a few fields, per
resource its last owner and catalogue entry, and per connector its move counters (these grow
with the members and resources the group has ever had, not with its events).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, is_dataclass
from typing import Any

Span = tuple[int, int, int]
"""(event id, at_ms, group epoch) of the event where something started or ended."""


@dataclass
class MemberState:
    assigned: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    active: bool = False
    live: bool = False
    # The member's last membership row: listed (still in the members table) after it, and
    # where it was (id, at_ms, group epoch, event type); None before any.
    listed: bool = True
    last_row: tuple[int, int, int, str] | None = None
    # Highest target level the member had reached or joined at (see `member_levels`).
    floor: int | None = None
    # A departed static member's held resources are excused until its next membership row:
    # the ids of those open windows.
    static_windows: list[int] = field(default_factory=list)


@dataclass
class Window:
    """A span in which resources may run nowhere: `resource` None covers the whole group
    (a delayed rebalance pending, no live member); else one resource (a hold). `end_ms` None
    while it is still open."""

    wid: int
    start_ms: int
    end_ms: int | None
    resource: str | None = None


@dataclass
class Gap:
    """A catalogue resource running nowhere since `start`."""

    start: Span


@dataclass
class Rebalance:
    epoch: int
    reason: str | None
    trigger_member_id: str | None
    trigger_connector: str | None
    bump_event_id: int
    bumped_at_ms: int
    live_members: int
    next_bump_event_id: int | None = None
    install: dict[str, Any] | None = None
    revoked: list[str] = field(default_factory=list)
    # Convergence: members live at install still to reach the target, how many had to, and
    # when the last one that did was done.
    waiting_members: set[str] = field(default_factory=set)
    members_to_converge: int = 0
    last_done_ms: int | None = None
    # A classic generation's row (opened by CLASSIC_REBALANCE_STARTED; `install` is its
    # CLASSIC_JOIN_COMPLETED, its moves the deliveries of the generation): the leader, the
    # protocol voted, what a hold kept from the leader, and the refusal of the leader's
    # assignments, if any. Defaults for a connect row (and for states carried before).
    group_type: str = "connect"
    leader_id: str | None = None
    protocol: str | None = None
    withheld: list[str] = field(default_factory=list)
    refused_reason: str | None = None


@dataclass
class LostStats:
    count: int = 0
    max_waited_ms: int | None = None
    waiting: int = 0


@dataclass
class Lost:
    resource: str
    epoch: int
    lost_from_member_id: str | None
    loss_event_type: str
    loss_event_id: int
    lost_at_ms: int


@dataclass
class Overlap:
    """A resource running on two members at once: a < b by member id."""

    resource: str
    a_member: str
    a_start: Span
    b_member: str
    b_start: Span


@dataclass
class ConnectorMoves:
    tasks_run: set[str] = field(default_factory=set)
    task_moves: int = 0
    tasks_moved: set[str] = field(default_factory=set)
    connector_moves: int = 0
    target_task_moves: int = 0


@dataclass
class GroupState:
    group_id: str
    last_event_id: int | None = None
    last_at_ms: int | None = None
    members: dict[str, MemberState] = field(default_factory=dict)
    # resource -> member -> start of its open running interval
    runs: dict[str, dict[str, Span]] = field(default_factory=dict)
    # connector -> the resources it has in the catalogue
    catalogue: dict[str, list[str]] = field(default_factory=dict)
    # resource -> (connector, task or None) as first seen in the catalogue
    resources: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    exists: dict[str, int] = field(default_factory=dict)
    gaps: dict[str, Gap] = field(default_factory=dict)
    windows: list[Window] = field(default_factory=list)
    next_window_id: int = 0
    live_count: int = 0
    empty: bool | None = None
    empty_window: int | None = None
    rebalances: dict[int, Rebalance] = field(default_factory=dict)
    lost_open: list[Lost] = field(default_factory=list)
    lost_stats: dict[int, LostStats] = field(default_factory=dict)
    overlaps: list[Overlap] = field(default_factory=list)
    last_owner: dict[str, str] = field(default_factory=dict)
    connectors: dict[str, ConnectorMoves] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self, separators=(",", ":"), sort_keys=True, default=_plain)

    @staticmethod
    def from_json(text: str) -> GroupState:
        d = json.loads(text)
        span = _span
        return GroupState(
            group_id=d["group_id"],
            last_event_id=d["last_event_id"],
            last_at_ms=d["last_at_ms"],
            members={
                k: MemberState(
                    assigned=v["assigned"],
                    pending=v["pending"],
                    active=v["active"],
                    live=v["live"],
                    listed=v["listed"],
                    last_row=None if v["last_row"] is None else tuple(v["last_row"]),
                    floor=v["floor"],
                    static_windows=v["static_windows"],
                )
                for k, v in d["members"].items()
            },
            runs={r: {m: span(s) for m, s in ms.items()} for r, ms in d["runs"].items()},
            catalogue=d["catalogue"],
            resources={k: (v[0], v[1]) for k, v in d["resources"].items()},
            exists=d["exists"],
            gaps={k: Gap(span(v["start"])) for k, v in d["gaps"].items()},
            windows=[Window(**w) for w in d["windows"]],
            next_window_id=d["next_window_id"],
            live_count=d["live_count"],
            empty=d["empty"],
            empty_window=d["empty_window"],
            rebalances={
                int(k): Rebalance(**{**v, "waiting_members": set(v["waiting_members"])})
                for k, v in d["rebalances"].items()
            },
            lost_open=[Lost(**x) for x in d["lost_open"]],
            lost_stats={int(k): LostStats(**v) for k, v in d["lost_stats"].items()},
            overlaps=[
                Overlap(
                    o["resource"],
                    o["a_member"],
                    span(o["a_start"]),
                    o["b_member"],
                    span(o["b_start"]),
                )
                for o in d["overlaps"]
            ],
            last_owner=d["last_owner"],
            connectors={
                k: ConnectorMoves(
                    tasks_run=set(v["tasks_run"]),
                    task_moves=v["task_moves"],
                    tasks_moved=set(v["tasks_moved"]),
                    connector_moves=v["connector_moves"],
                    target_task_moves=v["target_task_moves"],
                )
                for k, v in d["connectors"].items()
            },
        )


def _plain(value: Any) -> Any:
    """JSON for what `json` does not know: a state object as its fields (no deep copy, unlike
    `dataclasses.asdict`), a set as a sorted list."""
    if isinstance(value, set):
        return sorted(value)
    if is_dataclass(value):
        return vars(value)
    raise TypeError(f"cannot write {type(value).__name__} into the state")


def _span(value: list[int]) -> Span:
    return (int(value[0]), int(value[1]), int(value[2]))
