"""`ResourceSet` kept by connector against the plain set algebra (issue 24): every operation on
sets in either form, or one in each, gives what the same operation on (connectors, tasks)
frozenset pairs gives, and a result kept by connector has no empty connector, no task of
another connector, and each connector's order right. Also: an operation on two sets kept by
connector keeps every connector it does not change as the very object its operand held."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connect_protocol import resources
from connect_protocol.resources import (
    EMPTY,
    ConnectorTasks,
    ResourceSet,
    TaskId,
    catalogue_resources,
    catalogue_with,
    connector_resources,
    union,
    within_catalogue,
)

NAMES = ("a", "b", "c", "d")


@pytest.fixture(autouse=True, scope="module", params=["by connector", "small sets plain"])
def algebra(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test twice: with every operation by connector (these sets are small), and with the
    product's threshold (small sets run on their frozensets)."""
    kept = resources.BY_CONNECTOR_FROM
    resources.BY_CONNECTOR_FROM = 0 if request.param == "by connector" else kept
    yield
    resources.BY_CONNECTOR_FROM = kept


Plain = tuple[frozenset[str], frozenset[TaskId]]

plain_sets = st.tuples(
    st.frozensets(st.sampled_from(NAMES), max_size=4),
    st.frozensets(st.builds(TaskId, st.sampled_from(NAMES), st.integers(0, 9)), max_size=25),
)


def _flat(plain: Plain) -> ResourceSet:
    return ResourceSet(*plain)


def _by_connector(plain: Plain) -> ResourceSet:
    return ResourceSet.by_connector_of(plain[0], sorted(plain[1]))


def _both_forms(plain: Plain) -> ResourceSet:
    s = ResourceSet(*plain)
    s.by_connector()
    return s


def _derived(plain: Plain) -> ResourceSet:
    """Kept by connector as an operation's result: split, then joined with a part of itself."""
    whole = _by_connector(plain)
    part = ResourceSet.by_connector_of(frozenset(), sorted(plain[1])[::2])
    return (whole - part) | part


FORMS = (_flat, _by_connector, _both_forms, _derived)


def _check(s: ResourceSet, plain: Plain) -> None:
    connectors, tasks = plain
    assert s.connectors == connectors
    assert s.tasks == tasks
    assert len(s) == len(connectors) + len(tasks)
    assert s.task_count() == len(tasks)
    assert bool(s) == bool(connectors or tasks)
    assert s.ordered_tasks() == tuple(sorted(tasks))
    assert s.to_json() == {
        "connectors": sorted(connectors),
        "tasks": [{"connector": c, "task": n} for c, n in sorted(tasks)],
    }
    shards = s.by_connector()
    assert set(shards) == {t.connector for t in tasks}
    for connector, held in shards.items():
        assert isinstance(held, ConnectorTasks)
        assert held and all(t.connector == connector for t in held)
        assert held.ordered() == tuple(sorted(held))
    assert frozenset().union(*shards.values()) == tasks
    assert s == _flat(plain) and _flat(plain) == s
    assert hash(s) == hash(_flat(plain))


@settings(max_examples=400)
@given(
    plain_sets,
    plain_sets,
    st.sampled_from(range(len(FORMS))),
    st.sampled_from(range(len(FORMS))),
)
def test_every_operation_in_any_form_equals_the_plain_algebra(
    x: Plain, y: Plain, fx: int, fy: int
) -> None:
    a, b = FORMS[fx](x), FORMS[fy](y)
    _check(a, x)
    _check(b, y)
    _check(a | b, (x[0] | y[0], x[1] | y[1]))
    _check(a & b, (x[0] & y[0], x[1] & y[1]))
    _check(a - b, (x[0] - y[0], x[1] - y[1]))
    assert (a <= b) == (x[0] <= y[0] and x[1] <= y[1])
    assert (a == b) == (x == y)
    assert a.isdisjoint(b) == (x[0].isdisjoint(y[0]) and x[1].isdisjoint(y[1]))
    _check(union([a, b, a]), (x[0] | y[0], x[1] | y[1]))


@given(plain_sets, st.sampled_from(range(len(FORMS))))
def test_operations_with_nothing_and_with_itself(x: Plain, fx: int) -> None:
    a = FORMS[fx](x)
    for other in (EMPTY, ResourceSet(), a):
        _check(a | other, (x[0] | other.connectors, x[1] | other.tasks))
        _check(a & other, (x[0] & other.connectors, x[1] & other.tasks))
        _check(a - other, (x[0] - other.connectors, x[1] - other.tasks))
        _check(other - a, (other.connectors - x[0], other.tasks - x[1]))


class _Connector:
    """A catalogue entry as `catalogue_resources` reads it."""

    def __init__(self, name: str, task_count: int) -> None:
        self.name, self.task_count = name, task_count


counts = st.lists(st.integers(0, 6), min_size=1, max_size=4)


@given(counts, st.lists(st.tuples(st.integers(0, 5), st.none() | st.integers(0, 8)), max_size=6))
def test_a_catalogue_changed_equals_the_catalogue_built_again(
    before: list[int], changes: list[tuple[int, int | None]]
) -> None:
    catalogue = {f"k{i}": n for i, n in enumerate(before)}
    base = catalogue_resources(_Connector(n, c) for n, c in catalogue.items())
    applied: list[tuple[str, int | None, int | None]] = []
    for index, now in changes:
        name = f"k{index}"
        applied.append((name, catalogue.get(name), now))
        if now is None:
            catalogue.pop(name, None)
        else:
            catalogue[name] = now
    changed = catalogue_with(base, applied)
    expected = union(connector_resources(n, c) for n, c in catalogue.items())
    _check(changed, (expected.connectors, expected.tasks))


def test_an_operation_keeps_the_connectors_it_does_not_change_as_they_were() -> None:
    """A share of 50 connectors x 200 tasks changed in one connector: every result holds the
    49 other connectors' tasks as the very objects of its operands (nothing copied, walked or
    sorted for them), and its order is right."""
    names = [f"c{i:02d}" for i in range(50)]
    share = ResourceSet.by_connector_of(
        frozenset(), [TaskId(n, i) for n in names for i in range(200)]
    )
    moved = ResourceSet.by_connector_of(frozenset(), [TaskId("c07", i) for i in range(10)])
    before = share.by_connector()
    changed = share - moved
    after = changed.by_connector()
    assert [n for n in names if after[n] is not before[n]] == ["c07"]
    back = changed | moved
    assert [n for n in names if back.by_connector()[n] is not before[n]] == ["c07"]
    assert back == share and back.ordered_tasks() == share.ordered_tasks()
    both = share & changed
    assert all(both.by_connector()[n] is after[n] for n in names)
    assert (share - changed).by_connector().keys() == {"c07"}
    assert changed <= share and not share <= changed


@given(counts, plain_sets, st.sampled_from(range(len(FORMS))))
def test_within_a_catalogue_is_the_subset_test(
    task_counts: list[int], share: Plain, form: int
) -> None:
    """`within_catalogue` (the lowest and highest task numbers per connector) answers as
    `<=` does, for any share in any form, a catalogue built or changed."""

    names = NAMES[: len(task_counts)]
    built = catalogue_resources(_Connector(n, c) for n, c in zip(names, task_counts, strict=False))
    changed = catalogue_with(built, [(names[0], task_counts[0], task_counts[0] + 2)])
    s = FORMS[form](share)
    for catalogue in (built, changed):
        assert within_catalogue(s, catalogue) == (s <= catalogue)


def test_a_union_of_many_shares_keeps_each_connector_held_once() -> None:
    """800 shares of one connector each: their union holds each share's own `ConnectorTasks`
    (nothing copied per share; folding them one by one copied everything gathered so far)."""
    shares = [
        ResourceSet.by_connector_of(frozenset(), [TaskId(f"c{i:03d}", n) for n in range(100)])
        for i in range(800)
    ]
    joined = union(shares)
    assert joined.task_count() == 80_000
    assert all(
        joined.by_connector()[f"c{i:03d}"] is s.by_connector()[f"c{i:03d}"]
        for i, s in enumerate(shares)
    )
    extra = ResourceSet.by_connector_of(frozenset(), [TaskId("c000", 500)])
    overlapping = union([shares[0], extra])
    assert overlapping.by_connector()["c000"] == frozenset(
        [*shares[0].by_connector()["c000"], TaskId("c000", 500)]
    )


@given(plain_sets, st.sampled_from(range(len(FORMS))), st.integers(0, 30))
def test_the_first_tasks_are_the_start_of_the_order(x: Plain, fx: int, limit: int) -> None:
    """`first_tasks` (a log line's few tasks) is the start of `ordered_tasks`, in any form."""
    s = FORMS[fx](x)
    assert s.first_tasks(limit) == sorted(x[1])[:limit]
    assert s.first_tasks(limit) == list(s.ordered_tasks()[:limit])
