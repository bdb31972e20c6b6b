"""What the report draws, collected from the findings in Spark: per busiest group, the running
intervals of its most moved resources, its epoch bumps with what each rebalance did, and the
facts that explain the lanes' gaps (held, removed, lost); `report` renders them.

`collect_timelines` selects and trims in Spark (groups, lanes, the names each rebalance lists);
`build_timeline` turns one group's plain rows into a `report.GroupTimeline` and works on rows
as the findings have them (the JSON summary's rows too), so the renderer's tests need no Spark.
A rebalance's `removed` column (resources taken away because they were deleted) is used where
the findings have it; without it, what a "connector deleted" bump left unassigned of the deleted
connector counts as removed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from . import report

MAX_TIMELINE_GROUPS = 20
MAX_INTERVALS_PER_GROUP = 20_000
MAX_LOST_PER_GROUP = 20_000
SHOWN_NAMES = 12
"""Names listed per rebalance and kind (besides those of the lanes drawn); the counts are
complete."""

CONNECTOR_DELETED = "connector deleted"
"""The reason of the epoch bump a connector's deletion makes (coordinator_svc.core.admin)."""

LOSS_VERBS = {
    "MEMBER_LEFT": "left",
    "MEMBER_FENCED": "was fenced",
    "MEMBER_SESSION_EXPIRED": "expired",
    "REVOCATION_TIMED_OUT": "timed out revoking",
    "MEMBER_REMOVED": "was removed",
}

NAME_KINDS = ("moved", "newly_assigned", "held", "removed")


def collect_timelines(found: dict[str, DataFrame], as_of_ms: int) -> list[report.GroupTimeline]:
    """The intervals, epoch bumps and gap facts the report draws, for the most active groups."""
    ownership, rebalances = found["ownership"], found["rebalances"]
    busiest = [
        r["group_id"]
        for r in rebalances.groupBy("group_id")
        .count()
        .orderBy(F.col("count").desc(), "group_id")
        .limit(MAX_TIMELINE_GROUPS)
        .collect()
    ]
    if not busiest:
        busiest = [
            r["group_id"]
            for r in ownership.select("group_id").distinct().limit(MAX_TIMELINE_GROUPS).collect()
        ]
    own = ownership.filter(F.col("group_id").isin(busiest))
    # The lanes (the most moved resources) and the resource counts, in one pass to the driver;
    # then a small local frame for the joins below.
    per_resource = own.groupBy("group_id", "resource").agg(F.count("*").alias("n"))
    w = Window.partitionBy("group_id").orderBy(F.col("n").desc(), "resource")
    picked = (
        per_resource.withColumn("rank", F.row_number().over(w))
        .groupBy("group_id")
        .agg(
            F.max("rank").alias("total"),
            F.collect_list(F.when(F.col("rank") <= report.MAX_LANES, F.col("resource"))).alias(
                "lanes"
            ),
        )
        .collect()
    )
    totals = {r["group_id"]: int(r["total"]) for r in picked}
    spark = ownership.sparkSession
    lanes = F.broadcast(
        spark.createDataFrame(
            [(r["group_id"], name) for r in picked for name in r["lanes"]],
            "group_id string, resource string",
        )
    )
    lane_lists = F.broadcast(
        spark.createDataFrame(
            [(r["group_id"], list(r["lanes"])) for r in picked],
            "group_id string, _lanes array<string>",
        )
    )
    intervals = (
        own.join(lanes, ["group_id", "resource"], "left_semi")
        .select("group_id", "resource", "member_id", "start_ms", "end_ms")
        .limit(MAX_INTERVALS_PER_GROUP * max(1, len(busiest)))
        .collect()
    )
    bumps = rebalance_rows(
        rebalances.filter(F.col("group_id").isin(busiest)).join(lane_lists, "group_id", "left")
    ).collect()
    losses = (
        found["lost_resources"]
        .filter(F.col("group_id").isin(busiest))
        .join(lanes, ["group_id", "resource"], "left_semi")
        .select(*LOSS_COLUMNS)
        .limit(MAX_LOST_PER_GROUP * max(1, len(busiest)))
        .collect()
    )
    by_group: dict[str, dict[str, list[dict[str, Any]]]] = {
        g: {"intervals": [], "rebalances": [], "losses": []} for g in busiest
    }
    for kind, rows in (("intervals", intervals), ("rebalances", bumps), ("losses", losses)):
        for r in rows:
            by_group[r["group_id"]][kind].append(r.asDict(recursive=True))
    return [
        build_timeline(
            g,
            by_group[g]["intervals"],
            by_group[g]["rebalances"],
            by_group[g]["losses"],
            as_of_ms,
            totals.get(g, 0),
        )
        for g in sorted(by_group)
    ]


LOSS_COLUMNS = (
    "group_id",
    "group_epoch",
    "resource",
    "lost_from_member_id",
    "loss_event_type",
    "lost_at_ms",
    "restarted_on_member_id",
    "restarted_at_ms",
    "waited_ms",
)

REBALANCE_COLUMNS = (
    "group_id",
    "group_epoch",
    "bumped_at_ms",
    "installed_at_ms",
    "reason",
    "trigger_member_id",
    "trigger_connector",
    "scheduled_rebalance_delay_ms",
    "duration_ms",
    "status",
    "lost_resources",
    "max_lost_wait_ms",
    "lost_still_waiting",
)


def _of_deleted_connector(resource: Column) -> Column:
    """Whether `resource` is the bump's trigger connector or one of its tasks, in a bump made
    by the connector's deletion."""
    connector = F.col("trigger_connector")
    suffix = resource.substr(F.length(connector) + 2, F.lit(1_000_000))
    task = resource.startswith(F.concat(connector, F.lit("-"))) & suffix.rlike("^[0-9]+$")
    return (F.col("reason") == CONNECTOR_DELETED) & ((resource == connector) | task)


def rebalance_rows(rebalances: DataFrame) -> DataFrame:
    """The rebalances as `build_timeline` reads them: `held` (left unassigned, not deleted) and
    `removed` (deleted: the findings' column, or what a connector deletion left unassigned);
    each of `NAME_KINDS` cut to the first `SHOWN_NAMES` names and those in `_lanes` (the lanes
    drawn, when the frame has that column), with its full count in `<kind>_count`."""
    empty = F.array().cast("array<string>")
    left = F.coalesce(F.col("left_unassigned"), empty)
    if "removed" in rebalances.columns:
        removed = F.coalesce(F.col("removed"), empty)
    else:
        removed = F.filter(left, _of_deleted_connector)
    lanes = F.coalesce(F.col("_lanes"), empty) if "_lanes" in rebalances.columns else empty
    full = {
        "moved": F.coalesce(F.col("moved"), empty),
        "newly_assigned": F.coalesce(F.col("newly_assigned"), empty),
        "held": F.array_except(left, removed),
        "removed": removed,
    }
    names: list[Column] = []
    for kind in NAME_KINDS:
        shown = F.array_union(
            F.slice(full[kind], 1, SHOWN_NAMES),
            F.filter(full[kind], lambda r: F.array_contains(lanes, r)),
        )
        names.append(F.array_sort(shown).alias(kind))
        names.append(F.size(full[kind]).alias(f"{kind}_count"))
    return rebalances.select(*REBALANCE_COLUMNS, *names)


def _deleted_with(resource: str, reason: str | None, connector: str | None) -> bool:
    """`_of_deleted_connector` in plain Python."""
    if reason != CONNECTOR_DELETED or not connector:
        return False
    suffix = resource[len(connector) + 1 :]
    return resource == connector or (
        resource.startswith(connector + "-") and suffix.isascii() and suffix.isdigit()
    )


def _split_unassigned(row: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(held, removed) of a rebalance row, as prepared by `rebalance_rows` or as the findings
    have it (`left_unassigned`, and `removed` or not)."""
    if "held" in row:
        return list(row["held"] or []), list(row.get("removed") or [])
    left = list(row.get("left_unassigned") or [])
    if "removed" in row:
        removed = list(row["removed"] or [])
    else:
        removed = [
            r for r in left if _deleted_with(r, row.get("reason"), row.get("trigger_connector"))
        ]
    gone = set(removed)
    return [r for r in left if r not in gone], removed


def _names(row: Mapping[str, Any], kind: str, values: Sequence[str]) -> report.Names:
    return report.Names.of(sorted(values), row.get(f"{kind}_count"))


def _loss_detail(row: Mapping[str, Any]) -> str:
    member = row.get("lost_from_member_id") or "its member"
    kind = row.get("loss_event_type") or ""
    how = LOSS_VERBS.get(kind, kind.lower().replace("_", " ") or "went away")
    text = f"lost when {member} {how}"
    if row.get("restarted_at_ms") is not None:
        waited = row.get("waited_ms")
        if waited is None:
            waited = row["restarted_at_ms"] - row["lost_at_ms"]
        by = row.get("restarted_on_member_id") or "a member"
        return f"{text}; {by} ran it {report._fmt_ms(waited)} later"
    return f"{text}; still waiting"


def build_timeline(
    group_id: str,
    intervals: Iterable[Mapping[str, Any]],
    rebalances: Iterable[Mapping[str, Any]],
    losses: Iterable[Mapping[str, Any]],
    as_of_ms: int,
    resources_total: int | None = None,
) -> report.GroupTimeline:
    """One group's timeline from plain rows: `ownership` rows (resource, member_id, start_ms,
    end_ms), `rebalances` rows and `lost_resources` rows (the findings' columns). Facts are
    kept for the resources that have intervals (the lanes)."""
    runs = [
        report.Interval(r["resource"], r["member_id"], r["start_ms"], r["end_ms"])
        for r in intervals
    ]
    lanes = {i.resource for i in runs}
    markers: list[report.Marker] = []
    facts: list[report.Fact] = []
    for r in rebalances:
        epoch, bumped = int(r["group_epoch"]), int(r["bumped_at_ms"])
        held, removed = _split_unassigned(r)
        delay = int(r.get("scheduled_rebalance_delay_ms") or 0)
        installed = r.get("installed_at_ms")
        at_install = int(installed) if installed is not None else bumped
        for name in held:
            if name in lanes:
                note = f"delay {report._fmt_ms(delay)}" if delay else "no delay declared"
                facts.append(report.Fact(name, report.HELD, at_install, epoch, note))
        for name in removed:
            if name in lanes:
                facts.append(
                    report.Fact(name, report.REMOVED, bumped, epoch, r.get("reason") or "")
                )
        markers.append(
            report.Marker(
                epoch,
                bumped,
                r.get("reason") or "",
                r.get("trigger_member_id") or r.get("trigger_connector") or "",
                moved=_names(r, "moved", r.get("moved") or []),
                newly_assigned=_names(r, "newly_assigned", r.get("newly_assigned") or []),
                held=_names(r, "held", held),
                removed=_names(r, "removed", removed),
                delay_ms=delay,
                lost=int(r.get("lost_resources") or 0),
                max_lost_wait_ms=r.get("max_lost_wait_ms"),
                lost_still_waiting=int(r.get("lost_still_waiting") or 0),
                duration_ms=r.get("duration_ms"),
                status=r.get("status") or "",
            )
        )
    for r in losses:
        if r["resource"] in lanes:
            lost_epoch = r.get("group_epoch")
            facts.append(
                report.Fact(
                    r["resource"],
                    report.LOST,
                    int(r["lost_at_ms"]),
                    int(lost_epoch) if lost_epoch is not None else None,
                    _loss_detail(r),
                )
            )
    return report.GroupTimeline(
        group_id,
        intervals=sorted(runs, key=lambda i: (i.resource, i.start_ms, i.member_id)),
        markers=sorted(markers, key=lambda m: (m.epoch, m.at_ms)),
        resources_total=len(lanes) if resources_total is None else resources_total,
        as_of_ms=as_of_ms,
        facts=sorted(facts, key=lambda f: (f.resource, f.at_ms, f.kind, f.epoch or 0)),
    )
