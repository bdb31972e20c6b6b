"""The run's JSON summary, collected in Spark from the snapshot and the findings tables: what
`report.to_json` writes and `report.render_html` shows (the report itself stays pure Python)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from . import findings as fnd
from .watermark import EventRange, RunRecord


def _rows(df: DataFrame, limit: int, *order: Any) -> tuple[list[dict[str, Any]], bool]:
    """The first `limit` rows of `df` in this order, and whether it has more."""
    rows = [r.asDict(recursive=True) for r in df.orderBy(*order).limit(limit + 1).collect()]
    return rows[:limit], len(rows) > limit


def build_summary(
    run: RunRecord,
    event_range: EventRange,
    config: fnd.FindingsConfig,
    tables: dict[str, DataFrame],
    found: dict[str, DataFrame],
    max_rows: int,
    *,
    include_config_values: bool = False,
) -> dict[str, Any]:
    """The run's JSON summary: the run and its watermark, counts per group and per kind, and
    the first `max_rows` rows of the violations, rebalances and connector moves; whether the
    catalogue holds config values (`connector_configs`: "digests" or "values"); the stored
    resource statuses by state (`resource_statuses`), whose traces are digests only
    (`status_traces`)."""
    limit = max_rows
    violations, v_cut = _rows(
        found["violations"], limit, "group_id", "kind", "resource", "event_id"
    )
    rebalances, r_cut = _rows(
        found["rebalances"].drop("moves", "bumped_at"),
        limit,
        F.col("bump_event_id").desc(),
    )
    rebalances.sort(key=lambda r: (r["group_id"], r["group_epoch"]))
    moves, m_cut = _rows(
        found["connector_moves"], limit, F.col("task_moves").desc(), "group_id", "connector"
    )
    by_kind = {r["kind"]: r["count"] for r in found["violations"].groupBy("kind").count().collect()}
    lost = (
        found["lost_resources"]
        .agg(
            F.count("*").alias("count"),
            F.max("waited_ms").alias("max_wait_ms"),
            F.sum(F.col("restarted_at_ms").isNull().cast("int")).alias("still_waiting"),
        )
        .collect()[0]
    )
    groups = (
        tables["groups"]
        .select("group_id", "group_epoch")
        .join(
            tables["members"].groupBy("group_id").agg(F.count("*").alias("members")),
            "group_id",
            "left",
        )
        .join(
            tables["catalogue"].groupBy("group_id").agg(F.count("*").alias("catalogue_resources")),
            "group_id",
            "left",
        )
        .join(
            found["rebalances"].groupBy("group_id").agg(F.count("*").alias("rebalances")),
            "group_id",
            "left",
        )
        .join(
            found["violations"].groupBy("group_id").agg(F.count("*").alias("violations")),
            "group_id",
            "left",
        )
        .fillna(0, ["members", "catalogue_resources", "rebalances", "violations"])
    )
    group_rows, g_cut = _rows(groups, limit, "group_id")
    statuses = {
        r["state"]: int(r["count"])
        for r in tables["resource_statuses"].groupBy("state").count().collect()
    }
    return {
        "export_date": run.export_date,
        "exported_at": run.exported_at,
        "source": run.source,
        "watermark": {
            "since_event_id": event_range.since_event_id,
            "until_event_id": event_range.until_event_id,
            "snapshot_after_event_id": run.snapshot_after_event_id,
            "why": event_range.why,
            "rechecked_event_ids": list(run.rechecked),
            "unfilled_event_ids": [event_id for event_id, _ in run.unfilled],
        },
        "connector_configs": "values" if include_config_values else "digests",
        "status_traces": "digests",
        "resource_statuses": dict(sorted(statuses.items())),
        "grace_ms": config.grace_ms,
        "as_of_ms": config.as_of_ms,
        "rows": {k: v for k, v in run.table_rows.items() if not k.startswith("findings/")},
        "finding_rows": {
            k.removeprefix("findings/"): v
            for k, v in run.table_rows.items()
            if k.startswith("findings/")
        },
        "groups": group_rows,
        "violation_count": int(sum(by_kind.values())),
        "violations_by_kind": by_kind,
        "violations": violations,
        "rebalances": rebalances,
        "connector_moves": moves,
        "lost_resources": {
            "count": int(lost["count"] or 0),
            "max_wait_ms": lost["max_wait_ms"],
            "still_waiting": int(lost["still_waiting"] or 0),
        },
        "truncated": {
            "violations": v_cut,
            "rebalances": r_cut,
            "connector_moves": m_cut,
            "groups": g_cut,
        },
    }
