"""`GroupChange.free_for` (what a member may be given now, by set operations) against the
per-resource lookups it replaces (`reconciliation.free_in` over `connector_owner` and
`task_owner`), on random groups, changes and holds; and its cost."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from connect_protocol.resources import ResourceSet, TaskId
from coordinator_svc.core.change import GroupChange
from coordinator_svc.core.model import GroupMeta, GroupState, Hold, Member, TargetAssignment
from coordinator_svc.core.reconciliation import free_in
from tests.core.call_counts import calls
from tests.core.harness import DEFAULTS

CONNECTORS = ("a", "b", "c")
TASKS = tuple(TaskId(c, n) for c in CONNECTORS for n in range(3))
IDS = ("w1", "w2", "w3", "w4")

resource_sets = st.builds(
    lambda cs, ts: ResourceSet.of(cs, ts),
    st.frozensets(st.sampled_from(CONNECTORS), max_size=2),
    st.frozensets(st.sampled_from(TASKS), max_size=4),
)


@st.composite
def changes(draw: st.DrawFn) -> tuple[GroupChange, str, ResourceSet]:
    holds = tuple(
        Hold(f"h{i}", draw(resource_sets), until_ms=10**12) for i in range(draw(st.integers(0, 2)))
    )
    state = GroupState(GroupMeta("g", group_epoch=3, holds=holds), TargetAssignment(3))
    for member_id in draw(st.lists(st.sampled_from(IDS), unique=True, max_size=3)):
        share = draw(resource_sets)
        taken = ResourceSet.of(state.connector_owner, state.task_owner)
        share = share - taken  # the committed state owns each resource once
        pending = draw(resource_sets) - taken - share
        state.put_member(Member(member_id, 3, assigned=share, pending_revocation=pending))
    change = GroupChange(state, "g", 1_000, DEFAULTS)
    for _ in range(draw(st.integers(0, 3))):
        member_id = draw(st.sampled_from(IDS))
        if draw(st.booleans()):
            change.put_member(Member(member_id, 4, assigned=draw(resource_sets)))
        else:
            change.remove_member(member_id)
    return change, draw(st.sampled_from(IDS)), draw(resource_sets)


@settings(max_examples=300, deadline=None)
@given(changes())
def test_free_for_is_what_the_lookups_say(case: tuple[GroupChange, str, ResourceSet]) -> None:
    change, member_id, wanted = case
    expected = free_in(member_id, change.connector_owner, change.task_owner)(wanted)
    got = change.free_for(member_id, wanted)
    assert (got.connectors, got.tasks) == (expected.connectors, expected.tasks)


def test_a_new_connectors_tasks_are_found_free_without_a_lookup_each() -> None:
    counts = []
    for size in (1_000, 4_000):
        state = GroupState(GroupMeta("g", group_epoch=3), TargetAssignment(3))
        state.put_member(Member("w1", 3, assigned=ResourceSet.of(["old"], [("old", 0)])))
        change = GroupChange(state, "g", 1_000, DEFAULTS)
        new = ResourceSet.of(["big"], [TaskId("big", n) for n in range(size)])
        counts.append(calls(lambda c=change, n=new: c.free_for("w1", n)))
    assert counts[1] <= counts[0] * 1.1
