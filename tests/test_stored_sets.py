"""The stored form of resource sets and tokens (`coordinator_svc.store.stored_sets`): read back
exactly, plain below the threshold, ranges above it, small for whole connectors."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from connect_protocol.resources import ResourceSet, TaskId
from connect_protocol.tokens import FencingTokens
from coordinator_svc.store import stored_sets

tasks = st.builds(TaskId, st.sampled_from(["a", "b", "c-1", "é"]), st.integers(0, 700))
sets = st.builds(
    lambda cs, ts: ResourceSet.of(cs, ts),
    st.frozensets(st.sampled_from(["a", "b", "c-1"]), max_size=3),
    st.frozensets(tasks, max_size=900),
)


@settings(max_examples=60, deadline=None)
@given(sets)
def test_a_set_is_read_back_exactly_in_either_form(resources: ResourceSet) -> None:
    column = json.loads(json.dumps(stored_sets.resources_column(resources)))
    assert stored_sets.resources_from_column(column) == resources
    ranged = len(resources.tasks) > stored_sets.RANGES_ABOVE
    assert ("task_ranges" in column) is ranged
    assert ("tasks" in column) is not ranged
    # Equal sets, equal text (the listing compares columns as text).
    again = ResourceSet.of(resources.connectors, list(resources.tasks))
    assert json.dumps(stored_sets.resources_column(again)) == json.dumps(column)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(tasks, st.integers(1, 4), max_size=900), st.integers(1, 9))
def test_tokens_are_read_back_exactly_in_either_form(by_task: dict[TaskId, int], c: int) -> None:
    tokens = FencingTokens({**by_task, "a": c})
    column = json.loads(json.dumps(stored_sets.tokens_column(tokens)))
    assert stored_sets.tokens_from_column(column) == tokens
    assert ("task_ranges" in column) is (len(by_task) > stored_sets.RANGES_ABOVE)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.builds(TaskId, st.sampled_from(["a", "b", "c"]), st.integers(0, 40)),
        st.integers(1, 3),
        max_size=120,
    )
)
def test_token_runs_are_the_maximal_runs_of_one_connector_and_token(
    by_task: dict[TaskId, int],
) -> None:
    """The runs stored (each connector's found once, whole connectors under one token without
    a look at each task) are exactly the ones a walk over every task in order finds."""
    tokens = FencingTokens(dict(by_task))
    walked: list[dict[str, object]] = []
    for (connector, number), token in sorted(by_task.items()):
        last = walked[-1] if walked else None
        if last and (last["connector"], last["last"], last["token"]) == (
            connector,
            number - 1,
            token,
        ):
            last["last"] = number
        else:
            walked.append({"connector": connector, "first": number, "last": number, "token": token})
    shards = tokens.by_connector()
    runs = [
        {"connector": c, "first": first, "last": last, "token": token}
        for c in sorted(shards)
        for first, last, token in shards[c].runs()
    ]
    assert runs == walked
    for earlier, later in itertools.pairwise(walked):
        assert not (
            earlier["connector"] == later["connector"]
            and earlier["token"] == later["token"]
            and earlier["last"] + 1 == later["first"]  # type: ignore[operator]
        )


def test_a_share_of_whole_connectors_is_a_run_per_connector() -> None:
    share = ResourceSet.of(
        [f"conn-{c}" for c in range(100)],
        [TaskId(f"conn-{c}", n) for c in range(100) for n in range(100)],
    )
    tokens = FencingTokens.granted(share, 7).with_grant(ResourceSet.of([], [("conn-5", 3)]), 8)

    column = stored_sets.resources_column(share)
    token_column = stored_sets.tokens_column(tokens)

    assert len(column["task_ranges"]) == 100
    assert len(token_column["task_ranges"]) == 102  # conn-5 split around the task regranted
    assert len(json.dumps(column)) < 10_000  # the plain form: about 400 kB
    assert len(json.dumps(token_column)) < 12_000


def test_the_plain_form_and_absent_columns_are_read() -> None:
    plain = ResourceSet.of(["a"], [("a", 0), ("a", 1)])
    assert stored_sets.resources_from_column(plain.to_json()) == plain
    assert stored_sets.resources_from_column(None) == ResourceSet()
    tokens = FencingTokens({"a": 1, TaskId("a", 0): 2})
    assert stored_sets.tokens_from_column(tokens.to_json()) == tokens
    assert not stored_sets.tokens_from_column(None)


def test_an_events_large_sets_are_stored_as_ranges_and_the_rest_as_it_is() -> None:
    big = ResourceSet.of(["a"], [TaskId("a", n) for n in range(300)] + [TaskId("b", 9)])
    small = ResourceSet.of([], [("a", 1)])
    payload = {
        "assigned": big.to_json(),
        "added": small.to_json(),
        "moves": [{"resource": "a-1", "from": None, "to": "m"}],
        "config": {"tasks": "not a set", "connectors": 1},
        "state": "STABLE",
    }

    stored = stored_sets.event_payload_column(payload)

    assert stored["assigned"]["task_ranges"] == [
        {"connector": "a", "first": 0, "last": 299},
        {"connector": "b", "first": 9, "last": 9},
    ]
    assert stored_sets.resources_from_column(stored["assigned"]) == big
    assert {k: v for k, v in stored.items() if k != "assigned"} == {
        k: v for k, v in payload.items() if k != "assigned"
    }
    assert payload["assigned"] == big.to_json()  # the record's own payload is not changed


def test_with_ranges_off_every_set_is_stored_plain() -> None:
    big = ResourceSet.of([], [TaskId("a", n) for n in range(1_000)])
    tokens = FencingTokens.granted(big, 3)
    stored_sets.use_ranges(False)
    try:
        assert stored_sets.resources_column(big) == big.to_json()
        assert stored_sets.tokens_column(tokens) == tokens.to_json()
        payload = {"assigned": big.to_json()}
        assert stored_sets.event_payload_column(payload) == payload
    finally:
        stored_sets.use_ranges(True)
    assert "task_ranges" in stored_sets.resources_column(big)


@settings(max_examples=60, deadline=None)
@given(sets, st.booleans())
def test_an_events_set_payload_is_stored_as_its_json_would_be(
    resources: ResourceSet, ranges: bool
) -> None:
    """An event carries a set as `SetJson` (its task objects never built): it equals the set's
    JSON, and it is stored exactly as that JSON would be, in either form (issue 24)."""
    lazy, eager = resources.payload(), resources.to_json()
    assert lazy == eager and eager == lazy
    stored_sets.use_ranges(ranges)
    try:
        assert json.dumps(stored_sets.event_payload_column({"assigned": lazy})) == json.dumps(
            stored_sets.event_payload_column({"assigned": eager})
        )
    finally:
        stored_sets.use_ranges(True)
