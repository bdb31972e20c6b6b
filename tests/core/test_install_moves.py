"""The moves an install's TARGET_INSTALLED event names (`assignment._moves`), found from what
each changed member lost or gained (issue 24), equal those of the plain definition: every
resource a changed member held before or holds after whose owner differs, sorted by name."""

from __future__ import annotations

from types import MappingProxyType

from hypothesis import given
from hypothesis import strategies as st

from connect_protocol.resources import ResourceSet, TaskId
from coordinator_svc.core.assignment import _changed, _moves
from coordinator_svc.core.model import TargetAssignment, TargetEntry

CATALOGUE = ResourceSet.of(["a", "b", "c"], [(c, n) for c in ("a", "b", "c") for n in range(12)])
MEMBERS = ["m1", "m2", "m3", "m4"]


def _plain_moves(
    old: TargetAssignment, new: TargetAssignment, changed: list[str]
) -> list[dict[str, str | None]]:
    before: dict[str | TaskId, str] = {}
    after: dict[str | TaskId, str] = {}
    for member_id in changed:
        for owners, entry in ((before, old.of(member_id)), (after, new.of(member_id))):
            owners.update(dict.fromkeys(entry.resources.connectors, member_id))
            owners.update(dict.fromkeys(entry.resources.tasks, member_id))
    return sorted(
        (
            {"resource": str(r), "from": before.get(r), "to": after.get(r)}
            for r in before.keys() | after.keys()
            if before.get(r) != after.get(r)
        ),
        key=lambda move: str(move["resource"]),
    )


@st.composite
def targets(draw: st.DrawFn, epoch: int) -> TargetAssignment:
    """A target giving each catalogue resource to at most one member (some to nobody)."""
    owners = draw(
        st.lists(
            st.sampled_from([None, *MEMBERS]),
            min_size=len(CATALOGUE),
            max_size=len(CATALOGUE),
        )
    )
    resources = [*sorted(CATALOGUE.connectors), *sorted(CATALOGUE.tasks)]
    shares: dict[str, list[str | TaskId]] = {}
    for resource, owner in zip(resources, owners, strict=True):
        if owner is not None:
            shares.setdefault(owner, []).append(resource)
    present = draw(st.sets(st.sampled_from(MEMBERS)))
    entries = {
        m: TargetEntry(
            ResourceSet.of(
                [r for r in shares.get(m, []) if isinstance(r, str)],
                [r for r in shares.get(m, []) if isinstance(r, TaskId)],
            )
        )
        for m in sorted(present | shares.keys())
    }
    return TargetAssignment(epoch, MappingProxyType(entries))


@given(targets(1), targets(2))
def test_moves_equal_the_plain_definition(old: TargetAssignment, new: TargetAssignment) -> None:
    changed = _changed(old, new)
    moves, unassigned = _moves(old, new, changed, CATALOGUE)
    assert moves == _plain_moves(old, new, changed)
    given_out = {n for e in new.members.values() for n in e.resources.names()}
    assert unassigned == sorted(set(CATALOGUE.names()) - given_out)


def test_a_connector_named_like_another_connectors_task_moves_without_a_crash() -> None:
    """Found by bench/run-fuzz: connector "c-1" and task 1 of "c" share a display name; the
    moves were sorted by (name, from, to) and compared None with a member id."""
    catalogue = ResourceSet.of(["c", "c-1"], [("c", 1)])
    old = TargetAssignment(1, MappingProxyType({"m1": TargetEntry(ResourceSet.of(["c-1"], []))}))
    new = TargetAssignment(
        2,
        MappingProxyType(
            {
                "m1": TargetEntry(ResourceSet.of([], [("c", 1)])),
                "m2": TargetEntry(ResourceSet.of(["c", "c-1"], [])),
            }
        ),
    )
    moves, unassigned = _moves(old, new, _changed(old, new), catalogue)
    assert sorted((m["resource"], m["from"], m["to"]) for m in moves if m["from"]) == [
        ("c-1", "m1", "m2")
    ]
    assert len(moves) == 3 and unassigned == []
