"""The owner index (`GroupState.connector_owner`, `task_owner`, `instance_owner`): always what
the members say, a refused put leaves it as it was, and a put costs O(what changed in the
member's share), not O(the share) in Python steps (issue 24)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connect_protocol.resources import ResourceSet, TaskId
from coordinator_svc.core.errors import IllegalStateError
from coordinator_svc.core.model import GroupMeta, GroupState, Member, TargetAssignment
from tests.core.call_counts import calls

CONNECTORS = ("a", "b", "c")
TASKS = tuple(TaskId(c, n) for c in CONNECTORS for n in range(4))


def _state() -> GroupState:
    return GroupState(GroupMeta("g", group_epoch=1), TargetAssignment(1))


def _expected(state: GroupState) -> tuple[dict[str, str], dict[TaskId, str], dict[str, str]]:
    connectors: dict[str, str] = {}
    tasks: dict[TaskId, str] = {}
    instances: dict[str, str] = {}
    for member in state.members.values():
        connectors.update(dict.fromkeys(member.owned.connectors, member.member_id))
        tasks.update(dict.fromkeys(member.owned.tasks, member.member_id))
        if member.instance_id is not None:
            instances[member.instance_id] = member.member_id
    return connectors, tasks, instances


def _index(state: GroupState) -> tuple[dict[str, str], dict[TaskId, str], dict[str, str]]:
    return dict(state.connector_owner), dict(state.task_owner), dict(state.instance_owner)


shares = st.builds(
    lambda cs, ts, ps: (
        ResourceSet.of(cs, [t for t in ts if t not in ps]),
        ResourceSet.of((), ps),
    ),
    st.frozensets(st.sampled_from(CONNECTORS), max_size=2),
    st.frozensets(st.sampled_from(TASKS), max_size=5),
    st.frozensets(st.sampled_from(TASKS), max_size=2),
)
steps = st.lists(
    st.tuples(
        st.sampled_from(("w1", "w2", "w3")),
        st.one_of(st.none(), shares),  # None: the member is removed
        st.sampled_from((None, "i1", "i2")),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_the_index_is_always_what_the_members_say(
    ops: list[tuple[str, object, str | None]],
) -> None:
    state = _state()
    for member_id, share, instance in ops:
        if share is None:
            state.remove_member(member_id)
        else:
            assigned, pending = share  # type: ignore[misc]
            member = Member(member_id, 1, instance_id=instance)
            member = replace(member, assigned=assigned, pending_revocation=pending - assigned)
            before = _index(state)
            try:
                state.put_member(member)
            except IllegalStateError:
                assert _index(state) == before, "a refused put changed the index"
                continue
        connectors, tasks, _ = _expected(state)
        assert (state.connector_owner, state.task_owner) == (connectors, tasks)
        for instance_id, owner in state.instance_owner.items():
            assert state.members[owner].instance_id == instance_id


def test_a_put_that_would_own_anothers_task_is_refused_and_changes_nothing() -> None:
    state = _state()
    state.put_member(Member("w1", 1, assigned=ResourceSet.of(["a"], [("a", 0), ("a", 1)])))
    state.put_member(Member("w2", 1, assigned=ResourceSet.of(["b"], [("b", 0)])))
    before = _index(state)

    with pytest.raises(IllegalStateError, match="task a-1 would be owned by w2 and w1"):
        state.put_member(Member("w2", 1, assigned=ResourceSet.of([], [("b", 1), ("a", 1)])))

    assert _index(state) == before
    assert state.members["w2"].assigned == ResourceSet.of(["b"], [("b", 0)])


def _share(tasks: int, shift: int) -> ResourceSet:
    return ResourceSet.of(
        (), (TaskId(f"c{n // 100:04d}", n % 100) for n in range(shift, shift + tasks))
    )


@pytest.mark.parametrize("size", [1_000, 10_000])
def test_a_put_costs_what_changed_not_the_share(size: int) -> None:
    """Ten tasks leave and ten arrive in a share of 1,000 or 10,000: the same number of calls
    (each changed task a lookup; the rest is set arithmetic in C)."""
    counts: dict[int, int] = {}
    for share_size in (size, size * 4):
        state = _state()
        state.put_member(Member("w1", 1, assigned=_share(share_size, 0)))
        moved = Member("w1", 2, assigned=_share(share_size, 10))
        counts[share_size] = calls(lambda m=moved, s=state: s.put_member(m))
    assert counts[size * 4] <= counts[size] * 1.1
    assert counts[size] < 400
