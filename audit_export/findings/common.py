"""What the finding modules share: the run's settings (`FindingsConfig`) and the result that
holds every finding table (`Findings`)."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame

FINDING_TABLES = ("rebalances", "lost_resources", "connector_moves", "violations", "ownership")


@dataclass(frozen=True)
class FindingsConfig:
    """Attributes:
    grace_ms: how long a catalogue resource may run nowhere before it is a violation.
    as_of_ms: "now" for what has not ended yet (open gaps, resources still waiting).
    snapshot_after_event_id: the snapshot reflects every event up to this id.
    """

    grace_ms: int
    as_of_ms: int
    snapshot_after_event_id: int


@dataclass(frozen=True)
class Findings:
    rebalances: DataFrame
    lost_resources: DataFrame
    connector_moves: DataFrame
    violations: DataFrame
    ownership: DataFrame

    def tables(self) -> dict[str, DataFrame]:
        return {name: getattr(self, name) for name in FINDING_TABLES}
