"""The findings fold at GROUP_DELETED (issue 30, DESIGN 3.20): a deleted group's open rows end
there (its lost resources closed unrestarted, its rebalances final, its gaps closed with the
catalogue), and a group created again under the same id, whose epochs continue (DESIGN 3.20),
has findings of its own: nothing of the first incarnation is restarted, converged or charged by
the second. Pure: no Spark."""

from __future__ import annotations

from typing import Any

from audit_export import events as ev
from audit_export.fold import Event, GroupState, Move, fold_group

GRACE_MS = 1_000


def history() -> list[Event]:
    """Incarnation 1 (epochs 1-4): A with one task runs on m1, m1 is removed (its work held),
    nobody takes it, the group is deleted at epoch 4. Incarnation 2 (epochs 5-7): A again, m2
    runs it."""
    rows: list[dict[str, Any]] = [
        {"event_type": ev.GROUP_CREATED, "group_epoch": 1},
        {"event_type": ev.CONNECTOR_PUT, "group_epoch": 1, "connector": "A", "task_count": 1},
        {"event_type": ev.GROUP_EPOCH_BUMPED, "group_epoch": 2, "reason": "connector added"},
        {"event_type": ev.MEMBER_JOINED, "group_epoch": 3, "member_id": "m1"},
        {"event_type": ev.GROUP_EPOCH_BUMPED, "group_epoch": 3, "reason": "member joined"},
        {
            "event_type": ev.TARGET_INSTALLED,
            "group_epoch": 3,
            "member_id": "m1",
            "assignment_epoch": 3,
            "moves": (Move("A", None, "m1"), Move("A-0", None, "m1")),
        },
        {
            "event_type": ev.ASSIGNMENT_DELIVERED,
            "group_epoch": 3,
            "member_id": "m1",
            "assigned": ("A", "A-0"),
            "member_epoch": 3,
            "state": "STABLE",
        },
        {
            "event_type": ev.MEMBER_REMOVED,
            "group_epoch": 3,
            "member_id": "m1",
            "held": ("A", "A-0"),
            "held_until_ms": 4_000,
            "static_left": False,
        },
        {"event_type": ev.GROUP_EPOCH_BUMPED, "group_epoch": 4, "reason": "member removed"},
        {"event_type": ev.HOLD_RELEASED, "group_epoch": 4, "member_id": "m1"},
        {"event_type": ev.GROUP_DELETED, "group_epoch": 4},
        {"event_type": ev.GROUP_CREATED, "group_epoch": 5},
        {"event_type": ev.CONNECTOR_PUT, "group_epoch": 5, "connector": "A", "task_count": 1},
        {"event_type": ev.GROUP_EPOCH_BUMPED, "group_epoch": 6, "reason": "connector added"},
        {"event_type": ev.MEMBER_JOINED, "group_epoch": 7, "member_id": "m2"},
        {"event_type": ev.GROUP_EPOCH_BUMPED, "group_epoch": 7, "reason": "member joined"},
        {
            "event_type": ev.TARGET_INSTALLED,
            "group_epoch": 7,
            "member_id": "m2",
            "assignment_epoch": 7,
            "moves": (Move("A", None, "m2"), Move("A-0", None, "m2")),
        },
        {
            "event_type": ev.ASSIGNMENT_DELIVERED,
            "group_epoch": 7,
            "member_id": "m2",
            "assigned": ("A", "A-0"),
            "member_epoch": 7,
            "state": "STABLE",
        },
    ]
    return [
        Event(id=i + 1, at_ms=1_000 * (i + 1), group_id="g", **row) for i, row in enumerate(rows)
    ]


def fold(events: list[Event], as_of_ms: int) -> Any:
    return fold_group(GroupState("g"), events, as_of_ms=as_of_ms, grace_ms=GRACE_MS)


def test_a_deleted_groups_open_rows_end_at_its_deletion() -> None:
    events = history()
    deleted = next(e for e in events if e.event_type == ev.GROUP_DELETED)
    upto = [e for e in events if e.id <= deleted.id]
    rows, state = fold(upto, as_of_ms=deleted.at_ms + 3_600_000)
    # m1's held work was never restarted: closed at the deletion, its whole wait known.
    lost = sorted(rows.lost_resources, key=lambda r: r["resource"])
    assert [(r["resource"], r["open"], r["restarted_on_member_id"]) for r in lost] == [
        ("A", False, None),
        ("A-0", False, None),
    ]
    assert all(r["waiting_so_far_ms"] == deleted.at_ms - r["lost_at_ms"] for r in lost)
    # Every rebalance is final (superseded by the deletion at the latest), none stays open.
    assert rows.rebalances and not [r for r in rows.rebalances if r["open"]]
    assert not state.rebalances and not state.lost_open and not state.gaps
    # No violation, and none open: the catalogue went with the group, its gaps closed.
    assert not [v for v in rows.violations if v["open"]]
    # An hour later nothing more is charged: the next run sends nothing open again.
    later, _ = fold_group(state, [], as_of_ms=deleted.at_ms + 7_200_000, grace_ms=GRACE_MS)
    assert not [
        r
        for table in (later.lost_resources, later.rebalances, later.violations)
        for r in table
        if r["open"]
    ]


def test_a_recreated_group_has_findings_of_its_own() -> None:
    events = history()
    as_of = events[-1].at_ms + 1_000
    rows, state = fold(events, as_of)
    deleted = next(e for e in events if e.event_type == ev.GROUP_DELETED)
    # m2 running A in the second incarnation restarts nothing of the first.
    assert all(r["restarted_on_member_id"] is None for r in rows.lost_resources)
    # The epochs of the two incarnations never meet: rows of 2-4 are final, 6-7 the new ones.
    epochs = {r["group_epoch"]: r for r in rows.rebalances}
    assert {2, 3, 4} <= set(epochs) and {6, 7} <= set(epochs)
    assert all(not epochs[x]["open"] for x in (2, 3, 4))
    assert epochs[7]["status"] == "converged"
    # A runs on m2 from its delivery, the one open interval; m1's closed before the deletion.
    open_runs = [(r["resource"], r["member_id"]) for r in rows.ownership if r["open"]]
    assert sorted(open_runs) == [("A", "m2"), ("A-0", "m2")]
    closed = [r for r in rows.ownership if not r["open"]]
    assert {r["member_id"] for r in closed} == {"m1"}
    assert all(r["end_id"] < deleted.id for r in closed)
    assert set(state.runs) == {"A", "A-0"}


def test_without_the_deletion_the_two_incarnations_would_merge() -> None:
    """The control: the same history with GROUP_DELETED dropped restarts the first
    incarnation's lost work on m2 (what the fold must not do across a deletion)."""
    events = [e for e in history() if e.event_type != ev.GROUP_DELETED]
    rows, _ = fold(events, events[-1].at_ms + 1_000)
    assert {r["restarted_on_member_id"] for r in rows.lost_resources} == {"m2"}
