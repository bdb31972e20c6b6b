"""A metadata write that keeps the Prepare snapshot does not build it (issue 24: every join's
epoch bump wrote the group row, and built the O(members + resources) snapshot to drop it)."""

from __future__ import annotations

import pytest

from connect_protocol.resources import ResourceSet, TaskId
from coordinator_svc.core.model import GroupMeta, PreparedSnapshot
from coordinator_svc.store import rows


def _meta() -> GroupMeta:
    catalogue = ResourceSet.of(["A"], [TaskId("A", t) for t in range(1000)])
    prepared = PreparedSnapshot(7, frozenset(f"w{i}" for i in range(100)), catalogue)
    return GroupMeta(group_id="g", group_epoch=8, prepared=prepared)


def test_a_row_without_the_snapshot_does_not_build_it(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []
    original = rows.compact_resources

    def counting(resources: ResourceSet) -> object:
        built.append(len(resources))
        return original(resources)

    monkeypatch.setattr(rows, "compact_resources", counting)
    row = rows.group_row(_meta(), with_prepared=False)
    assert "prepared" not in row and built == []
    row = rows.group_row(_meta(), with_prepared=True)
    assert row["prepared"]["group_epoch"] == 7 and built == [1001]
