"""Log lines keep long lists short (connect_protocol/logs.py): the event in the database keeps
the whole of it."""

from __future__ import annotations

import json
import logging

from connect_protocol.logs import LOG_LIST_ITEMS, JsonFormatter, brief, fields


def _line(**values: object) -> dict[str, object]:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "target installed", None, None)
    record.fields = fields(**values)["fields"]
    return json.loads(JsonFormatter().format(record))  # type: ignore[no-any-return]


def test_a_long_list_is_written_as_its_count_and_first_items() -> None:
    tasks = [{"connector": "c", "task": n} for n in range(100_000)]
    line = _line(group="g", assigned={"connectors": ["c"], "tasks": tasks}, moves=list(range(7)))
    assert line["assigned"] == {
        "connectors": ["c"],
        "tasks": {"count": 100_000, "first": tasks[:LOG_LIST_ITEMS]},
    }
    assert line["moves"] == list(range(7))
    assert line["group"] == "g"


def test_short_values_are_unchanged() -> None:
    value = {"a": [1, 2, {"b": (3, 4)}], "c": "text", "d": None}
    assert brief(value) == {"a": [1, 2, {"b": [3, 4]}], "c": "text", "d": None}
    many = set(range(LOG_LIST_ITEMS + 5))
    out = brief({"s": many})["s"]
    assert out["count"] == LOG_LIST_ITEMS + 5 and len(out["first"]) == LOG_LIST_ITEMS


def test_an_events_set_is_logged_briefly_as_its_json_would_be() -> None:
    """A `SetJson` (an event's set) is written like the dict it stands for, without building
    its task objects past the first LOG_LIST_ITEMS."""
    from connect_protocol.resources import ResourceSet, TaskId

    for size in (3, LOG_LIST_ITEMS, 5_000):
        resources = ResourceSet.of(["a", "b"], [TaskId("t", n) for n in range(size)])
        logged = brief({"assigned": resources.payload()})
        assert resources._tasks_json is None  # no task object built for the whole set
        assert logged == brief({"assigned": resources.to_json()})
