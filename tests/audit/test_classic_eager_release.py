"""An eager classic worker releases everything at its JoinGroup (DESIGN 3.19); the events the
core writes for it must let the audit see that it stopped: folding a real classic history (the
core's own events, from the classic harness) finds no double ownership when its work goes to
another member of the next generation (issue 25's P4 found one, when the release was written as
an acknowledgement alone)."""

from __future__ import annotations

from typing import Any

from audit_export import events as ev
from audit_export.fold import Event, GroupState, fold_group
from coordinator_svc.core.records import EventRecord, EventType
from tests.core.classic_harness import ClassicHarness, rs


def _names(resource_set: Any) -> list[str]:
    if not isinstance(resource_set, dict):
        return []
    tasks = [f"{t['connector']}-{t['task']}" for t in resource_set.get("tasks") or ()]
    return [*(resource_set.get("connectors") or ()), *tasks]


def _as_parsed(i: int, record: EventRecord) -> Event:
    """The event as `events.parsed` gives it to the fold (resource sets as names)."""
    row: dict[str, Any] = {
        "id": i,
        "at_ms": record.at_ms,
        "group_id": record.group_id,
        "group_epoch": record.group_epoch,
        "event_type": record.event_type.value,
        "member_id": record.member_id,
    }
    for field in ev.PAYLOAD.fields:
        value = record.payload.get(field.name)
        row[f"p_{field.name}"] = _names(value) if field.dataType == ev.RESOURCE_SET else value
    return Event.from_parsed(row)


def test_an_eager_release_at_join_ends_the_members_ownership_for_the_audit() -> None:
    h = ClassicHarness()
    h.put_connector("A", 1)
    h.form(["w1", "w2"], {"w2": rs("A", "A-0")}, kind="default")
    leader = h.leader
    assert leader is not None
    h.now_ms += 10
    for member_id in ("w1", "w2"):  # eager: both stop everything before they join
        h.join(member_id, kind="default")
    assert h.held("w2") == rs()
    h.now_ms += 10
    h.sync_all({"w1": rs("A", "A-0")}, version=0)
    assert h.held("w1") == rs("A", "A-0")

    events = [_as_parsed(i + 1, e) for i, e in enumerate(h.log) if isinstance(e, EventRecord)]
    rows, _ = fold_group(GroupState(h.group_id), events, as_of_ms=h.now_ms + 1, grace_ms=60_000)
    assert not [v for v in rows.violations if v["kind"] == "DOUBLE_OWNERSHIP"], rows.violations

    released = [
        e
        for e in h.log
        if isinstance(e, EventRecord)
        and e.event_type is EventType.ASSIGNMENT_DELIVERED
        and e.member_id == "w2"
        and e.payload.get("released_by") == "join"
    ]
    assert released and _names(released[-1].payload["assigned"]) == []
