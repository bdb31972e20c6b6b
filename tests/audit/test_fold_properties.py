"""Properties of the findings fold (`audit_export.fold`) on arbitrary event histories: folding a
history in several runs, carrying the state between them through JSON, gives exactly what one
fold gives, wherever the cuts fall; and the fold's invariants hold (a member runs a resource in
at most one open interval, a rebalance's waiting members were live at its install, every open
row is sent again by every run).

The histories are drawn from the coordinator's event vocabulary with a few members, connectors
and epochs: not always what a coordinator would write (a delivery may name a resource nobody
put, a member may leave twice), which is the point: the fold must stay split-invariant on any
input, since the export reads whatever the table holds."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from audit_export import events as ev
from audit_export.fold import Event, GroupState, Move, fold_group
from tests.audit.fold_runs import assert_any_cuts_fold_alike

MEMBERS = ("m1", "m2", "m3")
CONNECTORS = ("A", "B")
RESOURCES = ("A", "A-0", "A-1", "B", "B-0")
GRACE_MS = 50


def _resources() -> st.SearchStrategy[tuple[str, ...]]:
    return st.lists(st.sampled_from(RESOURCES), max_size=4, unique=True).map(tuple)


def _event_fields() -> st.SearchStrategy[dict[str, Any]]:
    member = st.sampled_from(MEMBERS)
    return st.one_of(
        st.builds(lambda m: {"event_type": ev.MEMBER_JOINED, "member_id": m}, member),
        st.builds(lambda m: {"event_type": ev.MEMBER_REJOINED, "member_id": m}, member),
        st.builds(
            lambda m, static, held, released: {
                "event_type": ev.MEMBER_LEFT,
                "member_id": m,
                "static": static,
                "held": held,
                "released": released,
            },
            member,
            st.booleans(),
            _resources(),
            _resources(),
        ),
        st.builds(
            lambda t, m, held, until: {
                "event_type": t,
                "member_id": m,
                "held": held,
                "held_until_ms": until,
            },
            st.sampled_from((ev.MEMBER_FENCED, ev.REVOCATION_TIMED_OUT)),
            member,
            _resources(),
            st.integers(0, 400),
        ),
        st.builds(
            lambda m, held, until, static_left: {
                "event_type": ev.MEMBER_REMOVED,
                "member_id": m,
                "held": () if static_left else held,
                "held_until_ms": None if static_left else until,
                "static_left": static_left,
            },
            member,
            _resources(),
            st.integers(0, 400),
            st.booleans(),
        ),
        st.just({"event_type": ev.GROUP_DELETED}),
        st.builds(
            lambda m, released, static_left: {
                "event_type": ev.MEMBER_SESSION_EXPIRED,
                "member_id": m,
                "released": released,
                "static_left": static_left,
            },
            member,
            _resources(),
            st.booleans(),
        ),
        st.builds(
            lambda m, prev: {
                "event_type": ev.STATIC_MEMBER_REPLACED,
                "member_id": m,
                "previous_member_id": prev,
            },
            member,
            member,
        ),
        st.builds(
            lambda m, assigned, me, stable: {
                "event_type": ev.ASSIGNMENT_DELIVERED,
                "member_id": m,
                "assigned": assigned,
                "member_epoch": me,
                "state": "STABLE" if stable else "UNREVOKED",
            },
            member,
            _resources(),
            st.integers(1, 8),
            st.booleans(),
        ),
        st.builds(
            lambda m, revoke, target: {
                "event_type": ev.REVOCATION_REQUESTED,
                "member_id": m,
                "revoke": revoke,
                "target_epoch": target,
            },
            member,
            _resources(),
            st.integers(1, 8),
        ),
        st.builds(
            lambda m, pending: {
                "event_type": ev.REVOCATION_PARTIALLY_ACKNOWLEDGED,
                "member_id": m,
                "pending": pending,
            },
            member,
            _resources(),
        ),
        st.builds(lambda m: {"event_type": ev.REVOCATION_ACKNOWLEDGED, "member_id": m}, member),
        st.builds(
            lambda reason, m: {
                "event_type": ev.GROUP_EPOCH_BUMPED,
                "reason": reason,
                "member_id": m,
                "bump": True,
            },
            st.sampled_from(("member joined", "member left", "connector deleted")),
            st.none() | member,
        ),
        st.builds(
            lambda moves, delay, back: {
                "event_type": ev.TARGET_INSTALLED,
                "member_id": "m1",
                "moves": tuple(moves),
                "scheduled_rebalance_delay_ms": delay,
                "epoch_back": back,
            },
            st.lists(
                st.builds(
                    Move,
                    st.sampled_from(RESOURCES),
                    st.none() | member,
                    st.none() | member,
                ),
                max_size=3,
            ),
            st.sampled_from((0, 100)),
            st.integers(0, 1),
        ),
        st.builds(
            lambda until: {"event_type": ev.SCHEDULED_REBALANCE_SET, "until_ms": until},
            st.integers(0, 500),
        ),
        st.builds(
            lambda c, n: {"event_type": ev.CONNECTOR_PUT, "connector": c, "task_count": n},
            st.sampled_from(CONNECTORS),
            st.integers(0, 2),
        ),
        st.builds(
            lambda c: {"event_type": ev.CONNECTOR_DELETED, "connector": c},
            st.sampled_from(CONNECTORS),
        ),
    )


@st.composite
def histories(draw: st.DrawFn) -> list[Event]:
    """A group's events: ids 1.., times going forward, the group epoch bumped by the bumps and
    after a GROUP_DELETED (the coordinator continues a group created again from last + 1)."""
    fields = draw(st.lists(_event_fields(), min_size=1, max_size=40))
    steps = draw(st.lists(st.integers(0, 60), min_size=len(fields), max_size=len(fields)))
    events, epoch, at_ms = [], 1, 1_000
    for i, (f, step) in enumerate(zip(fields, steps, strict=True)):
        f = dict(f)
        at_ms += step
        if f.pop("bump", False):
            epoch += 1
        back = f.pop("epoch_back", None)
        if back is not None:
            f["assignment_epoch"] = max(1, epoch - back)
        until = f.pop("until_ms", None)
        if until is not None:
            f["until_ms"] = at_ms + until
        held_until = f.pop("held_until_ms", None)
        if held_until is not None:
            f["held_until_ms"] = at_ms + held_until
        events.append(Event(id=i + 1, at_ms=at_ms, group_epoch=epoch, group_id="g", **f))
        if f["event_type"] == ev.GROUP_DELETED:
            epoch += 1  # a group created again under the id continues from last + 1 (3.20)
    return events


@settings(max_examples=1000, deadline=None)
@given(histories(), st.data())
def test_folding_in_runs_equals_one_fold_wherever_the_cuts_fall(
    events: list[Event], data: st.DataObject
) -> None:
    assert_any_cuts_fold_alike(events, data, GRACE_MS)


@settings(max_examples=200, deadline=None)
@given(histories())
def test_the_state_holds_only_what_can_still_change(events: list[Event]) -> None:
    as_of = events[-1].at_ms + 1_000
    rows, state = fold_group(GroupState("g"), events, as_of_ms=as_of, grace_ms=GRACE_MS)
    again = GroupState.from_json(state.to_json())
    assert again.to_json() == state.to_json()
    # Every open interval is one the state carries, and every carried one is sent open.
    open_runs = {(r["resource"], r["member_id"]) for r in rows.ownership if r["open"]}
    carried = {(r, m) for r, owners in state.runs.items() for m in owners}
    assert open_runs == carried
    # A final rebalance left the state; what is left is re-sent open.
    assert {r["group_epoch"] for r in rows.rebalances if r["open"]} == set(state.rebalances)
    # Lost resources still waiting are carried, and only those.
    waiting = {(r["resource"], r["loss_event_id"]) for r in rows.lost_resources if r["open"]}
    assert waiting == {(x.resource, x.loss_event_id) for x in state.lost_open}
    # Folding nothing more changes no final row and sends the open ones again, the same.
    rows2, _ = fold_group(again, [], as_of_ms=as_of, grace_ms=GRACE_MS)
    assert sorted(map(repr, (r for r in rows2.ownership))) == sorted(
        map(repr, (r for r in rows.ownership if r["open"]))
    )
