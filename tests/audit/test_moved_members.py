"""Members an install moves to its epoch at once (DESIGN 3.21: their share unchanged, named in
TARGET_INSTALLED's `moved_members`) count as converged at the install, in both folds: the pure
fold (`audit_export.fold`, the incremental export) and the Spark computation
(`audit_export.timeline` + `findings.rebalances`); the two agree, and the fold stays
split-invariant with such installs in any history."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from audit_export import events as ev
from audit_export import timeline as tl
from audit_export.findings import lost_resources, rebalances
from audit_export.fold import Event, GroupState, Move, fold_group
from tests.audit.fold_runs import fold_in_runs
from tests.audit.test_fold_properties import GRACE_MS, MEMBERS, histories

RAW = (
    "id long, at_ms long, group_id string, group_epoch int, event_type string, "
    "member_id string, payload string"
)


def _assigned(*connectors: str) -> dict[str, Any]:
    return {"connectors": list(connectors), "tasks": []}


def _history() -> list[tuple[Any, ...]]:
    """As the coordinator writes it: m1 and m2 join and get A and B (epoch 4); C is put
    (epoch 5) and installed to m2, m1 moved; a scheduled rebalance fires (epoch 6) and its
    install changes nothing: both moved. m2 reaches epoch 5 by a delivery at 1_500."""
    rows: list[tuple[Any, ...]] = []

    def add(at_ms: int, epoch: int, event_type: str, member: str | None, **payload: Any) -> None:
        rows.append((len(rows) + 1, at_ms, "g", epoch, event_type, member, json.dumps(payload)))

    add(1_000, 1, ev.GROUP_CREATED, None)
    add(1_000, 1, ev.CONNECTOR_PUT, None, connector="A", task_count=0)
    add(1_000, 2, ev.GROUP_EPOCH_BUMPED, None, reason="connector put", connector="A")
    add(1_000, 2, ev.CONNECTOR_PUT, None, connector="B", task_count=0)
    add(1_000, 3, ev.GROUP_EPOCH_BUMPED, None, reason="connector put", connector="B")
    for member in ("m1", "m2"):
        add(1_010, rows[-1][3], ev.MEMBER_JOINED, member)
        add(1_010, rows[-1][3] + 1, ev.GROUP_EPOCH_BUMPED, member, reason="member joined")
    moves = [
        {"resource": "A", "from": None, "to": "m1"},
        {"resource": "B", "from": None, "to": "m2"},
    ]
    add(1_100, 5, ev.TARGET_INSTALLED, "m1", assignment_epoch=5, moves=moves, moved_members=[])
    for member, share in (("m1", "A"), ("m2", "B")):
        add(1_120, 5, ev.ASSIGNMENT_DELIVERED, member, member_epoch=5, state="STABLE",
            assigned=_assigned(share))  # fmt: skip
    add(1_200, 5, ev.CONNECTOR_PUT, None, connector="C", task_count=0)
    add(1_200, 6, ev.GROUP_EPOCH_BUMPED, None, reason="connector put", connector="C")
    moves = [{"resource": "C", "from": None, "to": "m2"}]
    add(1_300, 6, ev.TARGET_INSTALLED, "m1", assignment_epoch=6, moves=moves,
        moved_members=["m1"])  # fmt: skip
    add(1_500, 6, ev.ASSIGNMENT_DELIVERED, "m2", member_epoch=6, state="STABLE",
        assigned=_assigned("B", "C"))  # fmt: skip
    add(2_000, 7, ev.GROUP_EPOCH_BUMPED, None, reason="scheduled rebalance")
    add(2_100, 7, ev.TARGET_INSTALLED, "m1", assignment_epoch=7, moves=[],
        moved_members=["m1", "m2"])  # fmt: skip
    return rows


EXPECTED = {  # group epoch -> (status, converged_at_ms, members_to_converge)
    5: ("converged", 1_120, 2),
    6: ("converged", 1_500, 2),  # m1 at the install (1_300), m2 by its delivery
    7: ("converged", 2_100, 2),  # both at the install
}


def _outcomes(rows: list[dict[str, Any]]) -> dict[int, tuple[Any, ...]]:
    return {
        r["group_epoch"]: (r["status"], r["converged_at_ms"], r["members_to_converge"])
        for r in rows
        if r["group_epoch"] in EXPECTED
    }


def test_both_folds_count_moved_members_converged_at_the_install(spark: SparkSession) -> None:
    raw = spark.createDataFrame(_history(), RAW)
    e = ev.parsed(raw.filter(raw.event_type.isin(*ev.USED_EVENT_TYPES)))
    t = tl.build(e)
    as_of = 3_000
    spark_rows = [r.asDict() for r in rebalances(e, t, lost_resources(e, t, as_of)).collect()]
    events = [Event.from_parsed(r.asDict()) for r in e.orderBy("id").collect()]
    assert events[-1].moved_members == ("m1", "m2")
    fold_rows, _ = fold_group(GroupState("g"), events, as_of_ms=as_of, grace_ms=GRACE_MS)

    assert _outcomes(spark_rows) == EXPECTED
    assert _outcomes(fold_rows.rebalances) == EXPECTED


def _event(row: tuple[Any, ...], with_moved: bool) -> Event:
    """A row of `_history` as the fold reads it, without Spark."""
    p = json.loads(row[6])
    assigned = p.get("assigned")
    return Event(
        id=row[0],
        at_ms=row[1],
        group_epoch=row[3],
        event_type=row[4],
        member_id=row[5],
        group_id=row[2],
        reason=p.get("reason"),
        connector=p.get("connector"),
        assignment_epoch=p.get("assignment_epoch"),
        moves=tuple(Move(m["resource"], m["from"], m["to"]) for m in p.get("moves", [])),
        member_epoch=p.get("member_epoch"),
        state=p.get("state"),
        assigned=() if assigned is None else tuple(assigned["connectors"]),
        task_count=p.get("task_count"),
        moved_members=tuple(p.get("moved_members", [])) if with_moved else (),
    )


def test_the_pure_fold_counts_moved_members_converged_at_the_install() -> None:
    events = [_event(row, with_moved=True) for row in _history()]
    rows, _ = fold_group(GroupState("g"), events, as_of_ms=3_000, grace_ms=GRACE_MS)
    assert _outcomes(rows.rebalances) == EXPECTED


def test_without_the_move_members_that_do_not_heartbeat_again_are_still_waited_for() -> None:
    """The counterpart: the same installs not naming who they moved."""
    events = [_event(row, with_moved=False) for row in _history()]
    rows, _ = fold_group(GroupState("g"), events, as_of_ms=3_000, grace_ms=GRACE_MS)
    outcomes = _outcomes(rows.rebalances)
    assert outcomes[6][0] == outcomes[7][0] == "in_progress"


@settings(max_examples=300, deadline=None)
@given(histories(), st.data())
def test_folding_in_runs_equals_one_fold_with_moved_members(
    events: list[Event], data: st.DataObject
) -> None:
    moved = st.lists(st.sampled_from(MEMBERS), unique=True).map(lambda m: tuple(sorted(m)))
    events = [
        e._replace(moved_members=data.draw(moved)) if e.event_type == ev.TARGET_INSTALLED else e
        for e in events
    ]
    as_of = events[-1].at_ms + 1_000
    whole = fold_in_runs(events, [], as_of, GRACE_MS)
    if len(events) > 1:
        cuts = data.draw(
            st.lists(st.integers(1, len(events) - 1), max_size=4, unique=True).map(sorted)
        )
        assert fold_in_runs(events, cuts, as_of, GRACE_MS) == whole
