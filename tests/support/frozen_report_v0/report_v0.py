"""FROZEN: the pre-issue-15 report renderer (a verbatim copy of audit_export/report.py as it
was before issue 15, item 3), kept only for the before/after screenshot of the test and the
benchmark. Do not change it; the live renderer is `audit_export.report`.

The JSON summary and the static HTML report of a run (pure Python: the job collects the rows).

The report is one self-contained HTML file (no scripts, no external resources): the run and its
watermark, the violations (or a clear "none"), then per group a timeline picture (inline SVG: one
lane per connector or task, a bar per worker that ran it, coloured by worker, a dashed line at
every group epoch bump) and its rebalances, and the per-connector task moves.
"""

from __future__ import annotations

import html
import json
import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

MAX_LANES = 80
"""Lanes drawn per group timeline; beyond this the most moved resources are shown."""

MIN_LABEL_GAP_PX = 16
"""Epoch labels closer than this to the previous one are left out (the line stays)."""

QUIET_SHARE = 0.1
"""A stretch without any change longer than this share of the history is drawn shortened."""

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
    "#1f77b4",
    "#2ca02c",
)


@dataclass(frozen=True)
class Interval:
    """A member running a resource from `start_ms` to `end_ms` (None: still running)."""

    resource: str
    member_id: str
    start_ms: int
    end_ms: int | None


@dataclass(frozen=True)
class Marker:
    """A group epoch bump."""

    epoch: int
    at_ms: int
    reason: str


@dataclass
class GroupTimeline:
    """What one group's timeline picture shows.

    Attributes:
        group_id: the group.
        intervals: running intervals of the lanes shown.
        markers: the group's epoch bumps.
        resources_total: how many resources the group's history has (lanes shown may be fewer).
        as_of_ms: the right edge for intervals still running.
    """

    group_id: str
    intervals: list[Interval] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    resources_total: int = 0
    as_of_ms: int = 0


def to_json(summary: Mapping[str, Any]) -> str:
    return json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n"


def _natural(name: str) -> tuple[str, int]:
    m = re.fullmatch(r"(.*)-(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, -1)


def _color(members: Sequence[str]) -> dict[str, str]:
    out = {}
    for i, member in enumerate(sorted(members)):
        if i < len(PALETTE):
            out[member] = PALETTE[i]
        else:
            out[member] = f"hsl({(i * 137.5) % 360:.0f}, 55%, 50%)"
    return out


def _fmt_ms(ms: int | float | None) -> str:
    if ms is None:
        return "-"
    if abs(ms) < 1000:
        return f"{ms:.0f} ms"
    if abs(ms) < 120_000:
        return f"{ms / 1000:.2f} s"
    return f"{ms / 60_000:.1f} min"


def _utc(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


class TimeAxis:
    """A time axis that shortens long quiet stretches (no bar starting or ending, no epoch
    bump), so that a history of bursts separated by hours still shows each burst.

    Attributes:
        breaks: the shortened stretches, (start ms, end ms).
    """

    def __init__(self, points: Iterable[float], t0: float, t1: float) -> None:
        pts = sorted({min(max(p, t0), t1) for p in [*points, t0, t1]})
        cap = max(1.0, (t1 - t0) * QUIET_SHARE)
        pairs = list(pairwise(pts))
        busy = sum(b - a for a, b in pairs if b - a <= cap)
        # A shortened stretch is drawn as wide as a twentieth of the busy time.
        shown_break = max(busy / 20, 1.0)
        self._starts: list[float] = []
        self._offsets: list[float] = []
        self._scales: list[float] = []
        self.breaks: list[tuple[float, float]] = []
        offset = 0.0
        for a, b in pairs:
            length = b - a
            shown = length
            if length > cap:
                self.breaks.append((a, b))
                shown = min(length, shown_break)
            self._starts.append(a)
            self._offsets.append(offset)
            self._scales.append(shown / length if length else 0.0)
            offset += shown
        self._total = max(offset, 1.0)
        self._t0, self._t1 = t0, t1

    def position(self, ms: float) -> float:
        """0 at the start, 1 at the end."""
        if not self._starts:
            return 0.0
        ms = min(max(ms, self._t0), self._t1)
        i = max(0, bisect_right(self._starts, ms) - 1)
        return (self._offsets[i] + (ms - self._starts[i]) * self._scales[i]) / self._total


def timeline_svg(timeline: GroupTimeline, width: int = 1100) -> str:
    """The picture: lanes of resources, bars coloured by worker, epoch bumps marked."""
    e = html.escape
    lanes = sorted({i.resource for i in timeline.intervals}, key=_natural)
    if not lanes:
        return '<p class="muted">No connector or task ran in the exported history.</p>'
    members = sorted({i.member_id for i in timeline.intervals})
    colors = _color(members)
    starts = [i.start_ms for i in timeline.intervals] + [m.at_ms for m in timeline.markers]
    t0 = min(starts)
    ends = [i.end_ms for i in timeline.intervals if i.end_ms is not None]
    t1 = max([timeline.as_of_ms, *ends, *starts])
    t1 = max(t1, t0 + 1)
    left, right, top, lane_h = 120, 20, 34, 14
    plot_w = width - left - right
    height = top + lane_h * len(lanes) + 40
    points = [*starts, *ends, t1]
    axis = TimeAxis(points, t0, t1)

    def x(ms: float) -> float:
        return left + axis.position(ms) * plot_w

    row = {name: n for n, name in enumerate(lanes)}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" class="timeline" role="img" '
        f'aria-label="which worker ran which resource over time in {e(timeline.group_id)}">'
    ]
    for n, name in enumerate(lanes):
        y = top + n * lane_h
        if n % 2 == 0:
            out.append(
                f'<rect x="{left}" y="{y}" width="{plot_w}" height="{lane_h}" fill="#f6f6f6"/>'
            )
        out.append(
            f'<text x="{left - 6}" y="{y + lane_h - 3}" text-anchor="end" '
            f'class="lane">{e(name)}</text>'
        )
    for i in timeline.intervals:
        y = top + row[i.resource] * lane_h + 2
        end = i.end_ms if i.end_ms is not None else t1
        x0, x1 = x(i.start_ms), x(end)
        tip = (
            f"{i.resource} on {i.member_id}: {_utc(i.start_ms)} to "
            f"{_utc(i.end_ms) if i.end_ms is not None else 'now (still running)'}"
        )
        out.append(
            f'<rect x="{x0:.1f}" y="{y}" width="{max(1.5, x1 - x0):.1f}" '
            f'height="{lane_h - 4}" fill="{colors[i.member_id]}"><title>{e(tip)}</title></rect>'
        )
    bottom = top + lane_h * len(lanes)
    for a, b in axis.breaks:
        xa, xb = x(a), x(b)
        out.append(
            f'<rect x="{xa:.1f}" y="{top}" width="{max(1.0, xb - xa):.1f}" '
            f'height="{bottom - top}" fill="#ffffff" fill-opacity="0.7">'
            f"<title>{e(_fmt_ms(b - a))} without changes, shortened in the picture</title></rect>"
            f'<text x="{(xa + xb) / 2:.1f}" y="{bottom + 28}" text-anchor="middle" '
            f'class="axis">⋯ {e(_fmt_ms(b - a))} ⋯</text>'
        )
    last_label = -1e9
    for m in sorted(timeline.markers, key=lambda m: m.at_ms):
        xm = x(m.at_ms)
        tip = f"group epoch {m.epoch} at {_utc(m.at_ms)}: {m.reason}"
        out.append(
            f'<line x1="{xm:.1f}" y1="{top - 4}" x2="{xm:.1f}" y2="{bottom}" stroke="#c0392b" '
            f'stroke-dasharray="3 3">'
            f"<title>{e(tip)}</title></line>"
        )
        if xm - last_label >= MIN_LABEL_GAP_PX:
            last_label = xm
            out.append(
                f'<text x="{xm:.1f}" y="{top - 8}" text-anchor="middle" class="epoch">'
                f"e{m.epoch}<title>{e(tip)}</title></text>"
            )
    for k, ms in enumerate((t0, t1)):
        xt = x(ms)
        out.append(
            f'<line x1="{xt:.1f}" y1="{bottom}" x2="{xt:.1f}" y2="{bottom + 4}" stroke="#555"/>'
            f'<text x="{xt:.1f}" y="{bottom + 16}" text-anchor="{("start", "end")[k]}" '
            f'class="axis">{e(_utc(int(ms)))}</text>'
        )
    out.append("</svg>")
    legend = " ".join(
        f'<span class="swatch" style="background:{colors[m]}"></span>{e(m)}' for m in members
    )
    shown = ""
    if timeline.resources_total > len(lanes):
        shown = (
            f'<p class="muted">Showing {len(lanes)} of {timeline.resources_total} resources '
            "(those that moved most).</p>"
        )
    return "".join(out) + f'<p class="legend">Workers: {legend}</p>' + shown


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], css: str = "") -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _names(values: Sequence[str] | None, limit: int = 12) -> str:
    values = list(values or [])
    if not values:
        return "-"
    text = ", ".join(values[:limit])
    return text + (f" (+{len(values) - limit} more)" if len(values) > limit else "")


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; } h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
.ok { color: #1a7f37; font-weight: 600; } .bad { color: #c0392b; font-weight: 600; }
.muted { color: #777; } .violations td { background: #fff4f4; }
.timeline .lane { font: 10px monospace; fill: #333; }
.timeline .epoch { font: 10px sans-serif; fill: #c0392b; }
.timeline .axis { font: 10px sans-serif; fill: #555; }
.swatch { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 10px;
  vertical-align: middle; }
"""


def render_html(summary: Mapping[str, Any], timelines: Sequence[GroupTimeline]) -> str:
    """The whole report page."""
    e = html.escape
    wm = summary["watermark"]
    rows = summary.get("rows", {})
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Coordinator audit {e(str(summary['export_date']))}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>Coordinator audit export, {e(str(summary['export_date']))}</h1>",
        _table(
            ["", ""],
            [
                ("database", summary.get("source", "")),
                ("exported at", summary.get("exported_at", "")),
                (
                    "events exported",
                    f"ids {wm['since_event_id'] + 1}..{wm['until_event_id']} "
                    f"({rows.get('events', 0)} events; {wm.get('why', '')})",
                ),
                ("watermark (next run starts after)", wm["until_event_id"]),
                ("grace window for unassigned resources", _fmt_ms(summary.get("grace_ms"))),
                (
                    "connector configs in the catalogue",
                    "digests and values (--include-config-values)"
                    if summary.get("connector_configs") == "values"
                    else "digests only (config_digest: sha256 of the config; no values)",
                ),
                (
                    "snapshot rows",
                    ", ".join(f"{k} {v}" for k, v in sorted(rows.items()) if k != "events"),
                ),
            ],
        ),
    ]
    count = int(summary.get("violation_count", 0))
    parts.append("<h2>Violations</h2>")
    if count == 0:
        parts.append(
            '<p class="ok">No violations: no resource was owned twice, none ran nowhere beyond '
            "the grace window, no removed member is still listed.</p>"
        )
    else:
        parts.append(f'<p class="bad">{count} violation(s).</p>')
        parts.append(
            _table(
                ["kind", "source", "group", "epoch", "resource", "members", "event", "detail"],
                (
                    (
                        v["kind"],
                        v["source"],
                        v["group_id"],
                        v.get("group_epoch", "-"),
                        v.get("resource") or "-",
                        ", ".join(v.get("members") or []) or "-",
                        v.get("event_id") if v.get("event_id") is not None else "-",
                        v.get("detail", ""),
                    )
                    for v in summary.get("violations", [])
                ),
                "violations",
            )
        )
    by_group: dict[str, list[Mapping[str, Any]]] = {}
    for r in summary.get("rebalances", []):
        by_group.setdefault(str(r["group_id"]), []).append(r)
    parts.append("<h2>Groups</h2>")
    parts.append(
        _table(
            ["group", "group epoch", "members", "catalogue resources", "rebalances", "violations"],
            (
                (
                    g["group_id"],
                    g.get("group_epoch"),
                    g.get("members"),
                    g.get("catalogue_resources"),
                    g.get("rebalances"),
                    g.get("violations"),
                )
                for g in summary.get("groups", [])
            ),
        )
    )
    for timeline in timelines:
        gid = timeline.group_id
        parts.append(f"<h2>Group {e(gid)}</h2><h3>Who ran what</h3>")
        parts.append(timeline_svg(timeline))
        parts.append("<h3>Rebalances</h3>")
        parts.append(
            _table(
                [
                    "epoch",
                    "bumped at",
                    "reason",
                    "moved",
                    "newly assigned",
                    "left unassigned",
                    "revoked",
                    "until converged",
                    "status",
                    "lost resources (max wait)",
                ],
                (
                    (
                        r["group_epoch"],
                        _utc(r.get("bumped_at_ms")),
                        " ".join(
                            str(x)
                            for x in (
                                r.get("reason"),
                                r.get("trigger_member_id") or "",
                                r.get("trigger_connector") or "",
                            )
                            if x
                        ),
                        _names(r.get("moved")),
                        _names(r.get("newly_assigned")),
                        _names(r.get("left_unassigned")),
                        _names(r.get("revoked")),
                        _fmt_ms(r.get("duration_ms")),
                        r.get("status"),
                        f"{r.get('lost_resources', 0)} ({_fmt_ms(r.get('max_lost_wait_ms'))})"
                        if r.get("lost_resources")
                        else "-",
                    )
                    for r in by_group.get(gid, [])
                ),
            )
        )
    parts.append("<h2>Task moves per connector</h2>")
    parts.append(
        _table(
            [
                "group",
                "connector",
                "tasks run",
                "task moves",
                "tasks moved",
                "connector moves",
                "target task moves",
            ],
            (
                (
                    c["group_id"],
                    c["connector"],
                    c["tasks_run"],
                    c["task_moves"],
                    c["tasks_moved"],
                    c["connector_moves"],
                    c["target_task_moves"],
                )
                for c in summary.get("connector_moves", [])
            ),
        )
    )
    if any(summary.get("truncated", {}).values()):
        parts.append(
            '<p class="muted">Some lists are truncated here; the Parquet findings have every '
            "row.</p>"
        )
    parts.append("</body></html>\n")
    return "".join(parts)
