"""Issue 25: a classic group's rebalances explained from the events alone, one `rebalances` row
per generation (plan-issue25 3.11), in both folds: the pure fold (`audit_export.fold`, the
incremental export) and the Spark computation (`audit_export.timeline` + `findings.rebalances`),
which agree row for row; and the fold stays split-invariant with classic events in any history.

The events are fabricated as the coordinator writes them (the payload contract of
docs/plan-issue25-classic-groups.md 3.4): CLASSIC_REBALANCE_STARTED at generation g (`reason`,
`generation` g, `from_state`), CLASSIC_JOIN_COMPLETED at g + 1 (`generation`, `leader`, `protocol`,
`members`, `removed`, `withheld`), the SyncGroup answers as ASSIGNMENT_DELIVERED (`member_epoch`
the generation, `assigned` the whole held set, `added`, `removed`) with REVOCATION_REQUESTED,
releases as REVOCATION_ACKNOWLEDGED, ASSIGNMENT_REFUSED, and removals with their usual payloads."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from audit_export import events as ev
from audit_export import timeline as tl
from audit_export.findings import lost_resources, rebalances
from audit_export.fold import Event, GroupState, fold_group
from tests.audit.fold_runs import assert_any_cuts_fold_alike, check_every_split
from tests.audit.test_fold_properties import GRACE_MS, MEMBERS, RESOURCES, _event_fields

RAW = (
    "id long, at_ms long, group_id string, group_epoch int, event_type string, "
    "member_id string, payload string"
)
AS_OF = 200_000


def _set(*names: str) -> dict[str, Any]:
    """A resource set as the coordinator writes it (`A` a connector, `A-0` its task 0)."""
    tasks = [n for n in names if "-" in n]
    return {
        "connectors": [n for n in names if "-" not in n],
        "tasks": [{"connector": t.split("-")[0], "task": int(t.split("-")[1])} for t in tasks],
    }


class _History:
    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def add(
        self, group: str, at_ms: int, epoch: int, event_type: str, member: str | None, **p: Any
    ) -> None:
        self.rows.append(
            (len(self.rows) + 1, at_ms, group, epoch, event_type, member, json.dumps(p))
        )

    def started(self, group: str, at_ms: int, g: int, reason: str, member: str | None) -> None:
        self.add(group, at_ms, g, ev.CLASSIC_REBALANCE_STARTED, member, reason=reason,
                 generation=g, from_state="STABLE")  # fmt: skip

    def completed(
        self,
        group: str,
        at_ms: int,
        g: int,
        leader: str | None,
        members: list[str],
        withheld: tuple[str, ...] = (),
        removed: tuple[str, ...] = (),
    ) -> None:
        self.add(group, at_ms, g, ev.CLASSIC_JOIN_COMPLETED, leader, generation=g, leader=leader,
                 protocol="compatible" if leader else None, members=members,
                 removed=list(removed), withheld=_set(*withheld))  # fmt: skip

    def synced(
        self,
        group: str,
        at_ms: int,
        g: int,
        member: str,
        held: tuple[str, ...],
        added: tuple[str, ...] = (),
        revoked: tuple[str, ...] = (),
    ) -> None:
        state = "UNREVOKED" if revoked else "STABLE"
        self.add(group, at_ms, g, ev.ASSIGNMENT_DELIVERED, member, member_epoch=g, state=state,
                 assigned=_set(*held), added=_set(*added), removed=_set(*revoked),
                 fencing_token=7)  # fmt: skip
        if revoked:
            self.add(group, at_ms, g, ev.REVOCATION_REQUESTED, member, revoke=_set(*revoked),
                     target_epoch=g)  # fmt: skip


def _history() -> list[tuple[Any, ...]]:
    """Group `c`: a classic group of cooperative workers over connector A (A, A-0, A-1).

    - generation 1: w1 joins an EMPTY group (w2 during the initial delay); w1 leads; A and A-0
      to w1, A-1 to w2, all newly assigned; converged at w2's answer.
    - generation 2: w3 joins; the leader revokes A-0 from w1, gives nothing yet (Connect's
      cooperative two-step); converged at w3's answer.
    - generation 3: w1 rejoins having released A-0; A-0 moves from w1 to w3; w2 never syncs
      and is removed at the sync deadline (fenced, its A-1 held): done when it left.
    - generation 4: started by that removal; A-1 withheld from the leader by the hold; the
      leader's assignment (naming A-1 all the same) is refused.
    - generation 5: started by the refusal; converged; w2's hold ends.
    - generation 6: started by the hold's end; A-1 to w1 (from w2, its last owner).
    - generation 7: w3 leaves; completed, w1 has not synced yet: in progress.

    Group `d`: all members gone before the join completes (no_members); a completion with no
    start (a takeover in between: opened by the completion, no reason); a start awaiting its
    join."""
    h = _History()
    c = "c"
    h.add(c, 1_000, 0, ev.GROUP_CREATED, None)
    h.add(c, 1_000, 0, ev.CONNECTOR_PUT, None, connector="A", task_count=2)
    h.add(c, 1_000, 0, ev.MEMBER_JOINED, "w1", group_protocol="classic", protocols=["compatible"])
    h.started(c, 1_000, 0, "member joined", "w1")
    h.add(c, 1_500, 0, ev.MEMBER_JOINED, "w2", group_protocol="classic", protocols=["compatible"])
    h.completed(c, 4_000, 1, "w1", ["w1", "w2"])
    h.synced(c, 4_100, 1, "w1", ("A", "A-0"), added=("A", "A-0"))
    h.synced(c, 4_150, 1, "w2", ("A-1",), added=("A-1",))

    h.add(c, 5_000, 1, ev.MEMBER_JOINED, "w3", group_protocol="classic", protocols=["compatible"])
    h.started(c, 5_000, 1, "member joined", "w3")
    h.completed(c, 5_200, 2, "w1", ["w1", "w2", "w3"])
    h.synced(c, 5_300, 2, "w1", ("A",), revoked=("A-0",))
    h.synced(c, 5_310, 2, "w2", ("A-1",))
    h.synced(c, 5_320, 2, "w3", ())

    h.add(c, 5_400, 2, ev.REVOCATION_ACKNOWLEDGED, "w1", revoked=_set("A-0"), member_epoch=2)
    h.started(c, 5_400, 2, "member metadata changed", "w1")
    h.completed(c, 5_500, 3, "w1", ["w1", "w2", "w3"])
    h.synced(c, 5_600, 3, "w1", ("A",))
    h.synced(c, 5_610, 3, "w3", ("A-0",), added=("A-0",))
    h.add(c, 65_500, 3, ev.MEMBER_FENCED, "w2", reason="sync_timeout", held=_set("A-1"),
          held_until_ms=75_500)  # fmt: skip
    h.started(c, 65_500, 3, "member missed the sync deadline", None)

    h.completed(c, 65_600, 4, "w1", ["w1", "w3"], withheld=("A-1",), removed=())
    h.add(c, 65_700, 4, ev.ASSIGNMENT_REFUSED, "w1", generation=4,
          reason="A-1 is not in the catalogue shown", resources=["A-1"])  # fmt: skip
    h.started(c, 65_700, 4, "assignment refused", "w1")
    h.completed(c, 65_800, 5, "w1", ["w1", "w3"], withheld=("A-1",))
    h.synced(c, 65_900, 5, "w1", ("A",))
    h.synced(c, 65_910, 5, "w3", ("A-0",))

    h.add(c, 75_500, 5, ev.HOLD_RELEASED, "w2", released=_set("A-1"))
    h.started(c, 75_500, 5, "hold ended", None)
    h.completed(c, 75_600, 6, "w1", ["w1", "w3"])
    h.synced(c, 75_700, 6, "w3", ("A-0",))
    h.synced(c, 75_800, 6, "w1", ("A", "A-1"), added=("A-1",))

    h.add(c, 80_000, 6, ev.MEMBER_LEFT, "w3", static=False, released=_set("A-0"))
    h.started(c, 80_000, 6, "member left", "w3")
    h.completed(c, 80_100, 7, "w1", ["w1"])

    d = "d"
    h.add(d, 1_000, 0, ev.GROUP_CREATED, None)
    h.add(d, 1_000, 0, ev.MEMBER_JOINED, "x1", group_protocol="classic", protocols=["default"])
    h.started(d, 1_000, 0, "member joined", "x1")
    h.add(d, 2_000, 0, ev.MEMBER_LEFT, "x1", static=False, released=_set())
    h.completed(d, 2_000, 1, None, [])
    h.add(d, 3_000, 1, ev.MEMBER_JOINED, "x2", group_protocol="classic", protocols=["default"])
    h.completed(d, 9_000, 2, "x2", ["x2"])
    h.synced(d, 9_100, 2, "x2", ())
    h.started(d, 9_500, 2, "member joined", "x3")
    return h.rows


# (group, generation) -> reason, trigger, leader, moved, newly assigned, revoked, withheld,
# members to converge, converged at, status, refused reason, lost resources
EXPECTED: dict[tuple[str, int], tuple[Any, ...]] = {
    ("c", 1): ("member joined", "w1", "w1", [], ["A", "A-0", "A-1"], [], [], 2, 4_150,
               "converged", None, 0),
    ("c", 2): ("member joined", "w3", "w1", [], [], ["A-0"], [], 3, 5_320, "converged", None, 0),
    ("c", 3): ("member metadata changed", "w1", "w1", ["A-0"], [], [], [], 3, 65_500,
               "converged", None, 0),
    ("c", 4): ("member missed the sync deadline", None, "w1", [], [], [], ["A-1"], 2, None,
               "refused", "A-1 is not in the catalogue shown", 1),
    ("c", 5): ("assignment refused", "w1", "w1", [], [], [], ["A-1"], 2, 65_910, "converged",
               None, 0),
    ("c", 6): ("hold ended", None, "w1", ["A-1"], [], [], [], 2, 75_800, "converged", None, 0),
    ("c", 7): ("member left", "w3", "w1", [], [], [], [], 1, None, "in_progress", None, 1),
    ("d", 1): ("member joined", "x1", None, [], [], [], [], 0, 2_000, "no_members", None, 0),
    ("d", 2): (None, None, "x2", [], [], [], [], 1, 9_100, "converged", None, 0),
    ("d", 3): ("member joined", "x3", None, [], [], [], [], 0, None, "awaiting_join", None, 0),
}  # fmt: skip

COLUMNS = (
    "reason",
    "trigger_member_id",
    "leader_id",
    "moved",
    "newly_assigned",
    "revoked",
    "withheld",
    "members_to_converge",
    "converged_at_ms",
    "status",
    "refused_reason",
    "lost_resources",
)


def _explained(rows: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[Any, ...]]:
    return {(r["group_id"], r["group_epoch"]): tuple(r[c] for c in COLUMNS) for r in rows}


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _events(spark: SparkSession) -> tuple[Any, list[Event]]:
    raw = spark.createDataFrame(_history(), RAW)
    # As the job does (audit_export.findings `keep`): the parsed events and the timeline are
    # materialised once, so the findings' plans do not re-plan their lineage.
    e = _keep(ev.parsed(raw.filter(raw.event_type.isin(*ev.USED_EVENT_TYPES))))
    return e, [Event.from_parsed(r.asDict()) for r in e.orderBy("id").collect()]


def _keep(df: Any) -> Any:
    return df.localCheckpoint(eager=True)


def _fold(events: list[Event]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for group in sorted({x.group_id for x in events}):
        mine = [x for x in events if x.group_id == group]
        out, _ = fold_group(GroupState(group), mine, as_of_ms=AS_OF, grace_ms=GRACE_MS)
        rows += out.rebalances
    return rows


def test_both_folds_explain_each_classic_generation_alike(spark: SparkSession) -> None:
    e, events = _events(spark)
    t = tl.build(e, _keep)
    spark_rows = [
        _plain(r.asDict(recursive=True))
        for r in rebalances(e, t, lost_resources(e, t, AS_OF)).collect()
    ]
    fold_rows = _fold(events)

    assert _explained(spark_rows) == EXPECTED
    assert _explained(fold_rows) == EXPECTED
    # Row for row the same (but for the columns only the fold has: `open`, and `removed`, a
    # deleted connector's resources, empty here).
    by_key = {(r["group_id"], r["group_epoch"]): r for r in spark_rows}
    for row in fold_rows:
        mine = {k: v for k, v in row.items() if k not in ("open", "removed")}
        theirs = {k: v for k, v in by_key[(row["group_id"], row["group_epoch"])].items()}
        theirs.pop("bumped_at")
        assert mine == theirs, (row["group_id"], row["group_epoch"])
    classic = [r for r in fold_rows if r["group_type"] == "classic"]
    assert len(classic) == len(fold_rows)
    assert {r["protocol"] for r in classic if r["leader_id"]} == {"compatible"}
    moved = {r["group_epoch"]: r["moves"] for r in classic if r["group_id"] == "c"}
    assert moved[3] == [{"resource": "A-0", "from": "w1", "to": "w3"}]
    assert moved[6] == [{"resource": "A-1", "from": "w2", "to": "w1"}]
    assert [r["open"] for r in fold_rows if r["group_id"] == "c"] == [
        False, False, False, False, False, False, True
    ]  # fmt: skip


def _plain_events() -> list[Event]:
    """`_history` as the fold reads it, without Spark."""
    events = []
    for row in _history():
        p = json.loads(row[6])

        def names(key: str, p: dict[str, Any] = p) -> tuple[str, ...]:
            s = p.get(key) or {}
            return (*s.get("connectors", ()), *(f"{t['connector']}-{t['task']}" for t in
                                                s.get("tasks", ())))  # fmt: skip

        events.append(
            Event(
                id=row[0],
                at_ms=row[1],
                group_epoch=row[3],
                event_type=row[4],
                member_id=row[5],
                group_id=row[2],
                reason=p.get("reason"),
                connector=p.get("connector"),
                member_epoch=p.get("member_epoch"),
                state=p.get("state"),
                assigned=names("assigned"),
                revoke=names("revoke"),
                target_epoch=p.get("target_epoch"),
                static=p.get("static"),
                released=names("released"),
                held=names("held"),
                held_until_ms=p.get("held_until_ms"),
                task_count=p.get("task_count"),
                generation=p.get("generation"),
                leader=p.get("leader"),
                protocol=p.get("protocol"),
                members=tuple(p.get("members") or ()),
                withheld=names("withheld"),
                added=names("added"),
            )
        )
    return events


def test_the_classic_history_folds_alike_wherever_it_is_cut() -> None:
    events = _plain_events()
    assert _explained(_fold(events)) == EXPECTED
    check_every_split(events, AS_OF, GRACE_MS, samples=20)


def _classic_fields() -> st.SearchStrategy[dict[str, Any]]:
    member = st.sampled_from(MEMBERS)
    resources = st.lists(st.sampled_from(RESOURCES), max_size=3, unique=True).map(tuple)
    return st.one_of(
        st.builds(
            lambda m, reason: {
                "event_type": ev.CLASSIC_REBALANCE_STARTED,
                "member_id": m,
                "reason": reason,
                "generation": "current",
            },
            st.none() | member,
            st.sampled_from(("member joined", "member left", "hold ended")),
        ),
        st.builds(
            lambda leader, members, withheld: {
                "event_type": ev.CLASSIC_JOIN_COMPLETED,
                "member_id": leader,
                "leader": leader,
                "protocol": None if leader is None else "compatible",
                "members": members,
                "withheld": withheld,
                "generation": "next",
                "bump": True,
            },
            st.none() | member,
            st.lists(member, max_size=3, unique=True).map(tuple),
            resources,
        ),
        st.builds(
            lambda m, back: {
                "event_type": ev.ASSIGNMENT_REFUSED,
                "member_id": m,
                "reason": "given twice",
                "generation": "current",
                "epoch_back": back,
            },
            member,
            st.integers(0, 1),
        ),
        st.builds(
            lambda m, held, added, back, stable: {
                "event_type": ev.ASSIGNMENT_DELIVERED,
                "member_id": m,
                "assigned": held,
                "added": added,
                "member_epoch": "current",
                "epoch_back": back,
                "state": "STABLE" if stable else "UNREVOKED",
            },
            member,
            resources,
            resources,
            st.integers(0, 2),
            st.booleans(),
        ),
    )


@st.composite
def classic_histories(draw: st.DrawFn) -> list[Event]:
    """As `test_fold_properties.histories`, with classic events among the others: a completion
    bumps the group epoch (its generation), a start names the current one, a refusal or a
    delivery the current one or one before."""
    fields = draw(st.lists(st.one_of(_event_fields(), _classic_fields()), min_size=1, max_size=40))
    steps = draw(st.lists(st.integers(0, 60), min_size=len(fields), max_size=len(fields)))
    events, epoch, at_ms = [], 1, 1_000
    for i, (f, step) in enumerate(zip(fields, steps, strict=True)):
        f = dict(f)
        at_ms += step
        if f.pop("bump", False):
            epoch += 1
        back = f.pop("epoch_back", 0)
        if f["event_type"] == ev.TARGET_INSTALLED:
            f["assignment_epoch"] = max(1, epoch - back)
        if f.get("generation") in ("current", "next"):
            f["generation"] = max(0, epoch - back)
        if f.get("member_epoch") == "current":
            f["member_epoch"] = max(0, epoch - back)
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


@settings(max_examples=200, deadline=None)
@given(classic_histories(), st.data())
def test_folding_in_runs_equals_one_fold_with_classic_events(
    events: list[Event], data: st.DataObject
) -> None:
    assert_any_cuts_fold_alike(events, data, GRACE_MS)
