"""Events whose sets the coordinator stores as task ranges (`stored_sets.event_payload_column`,
sets of more than 256 tasks) are read by the export exactly as the same events in the plain
form: `events.parsed` gives the same columns, so both folds see the same events."""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import SparkSession

from audit_export import events as ev
from connect_protocol.resources import ResourceSet, TaskId
from coordinator_svc.store.stored_sets import RANGES_ABOVE, event_payload_column

RAW = (
    "id long, at_ms long, group_id string, group_epoch int, event_type string, "
    "member_id string, payload string"
)

BIG = ResourceSet.of(
    ["A", "B"],
    [TaskId("A", n) for n in range(400) if n != 7] + [TaskId("B", n) for n in (0, 1, 5)],
)
SMALL = ResourceSet.of([], [TaskId("C", 3)])


def _payloads() -> list[tuple[str, dict[str, Any]]]:
    return [
        (
            ev.ASSIGNMENT_DELIVERED,
            {"member_epoch": 4, "state": "STABLE", "assigned": BIG.to_json(), "added": {}},
        ),
        (ev.REVOCATION_REQUESTED, {"revoke": BIG.to_json(), "target_epoch": 5}),
        (ev.MEMBER_LEFT, {"static": False, "released": (BIG | SMALL).to_json()}),
        (ev.MEMBER_FENCED, {"held": SMALL.to_json(), "held_until_ms": 9}),
    ]


def _rows(stored: bool) -> list[tuple[Any, ...]]:
    return [
        (
            i + 1,
            1_000 + i,
            "g",
            4,
            event_type,
            "m1",
            json.dumps(event_payload_column(payload) if stored else payload),
        )
        for i, (event_type, payload) in enumerate(_payloads())
    ]


def test_ranged_sets_parse_as_the_plain_ones(spark: SparkSession) -> None:
    stored = _rows(stored=True)
    assert len(BIG.tasks) > RANGES_ABOVE
    assert "task_ranges" in json.loads(stored[0][6])["assigned"]  # the case is really there
    assert "tasks" in json.loads(stored[3][6])["held"]  # and small sets stay plain

    plain = ev.parsed(spark.createDataFrame(_rows(stored=False), RAW)).orderBy("id").collect()
    ranged = ev.parsed(spark.createDataFrame(stored, RAW)).orderBy("id").collect()

    assert [r.asDict() for r in ranged] == [r.asDict() for r in plain]
    names = plain[0]["p_assigned"]
    assert len(names) == len(BIG) and "A-6" in names and "A-7" not in names and "B-5" in names
