"""The JSON summary and the static HTML report of a run (pure Python: the job collects the rows).

The report is one self-contained HTML file (no external resources; the only script is the
"fit it to the page" button of a picture too wide for the page): the run and its watermark, the
violations (or a clear "none"), then per group a timeline picture and a table of its
rebalances, and the per-connector task moves.

The timeline picture (inline SVG, 100 % wide) has one lane per connector or task. A lane shows
four states: *running* (a bar coloured by the worker that ran it), *held* (left unassigned by a
target while a delayed rebalance was pending), *unassigned* (ran on no member: lost when its
member left, was fenced or expired, or between two owners) and *removed* (deleted from the
catalogue), each drawn in its own style and named in the legend. The time scale is piecewise
linear (`TimeScale`): every stretch between two changes is at least a few pixels wide, so busy
seconds are widened, and long quiet stretches are shortened and drawn with a break mark. Ticks
give the time of day and the time since the start. Each group epoch bump is a dashed line with
an "eN" label (labels stagger over as many rows as needed, none is left out) that links to the
bump's row in the rebalance table, which links back. The picture starts at the group's first
epoch bump: intervals carried over from before are clipped there (and marked), those over
before are left out. A picture that needs more room than the page scrolls sideways.
"""

from __future__ import annotations

import html
import json
import re
import statistics
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

MAX_LANES = 80
"""Lanes drawn per group timeline; beyond this the most moved resources are shown."""

QUIET_SHARE = 0.1
"""A stretch without any change is drawn shortened (a break) when it is longer than this share
of the history and than `QUIET_FACTOR` times the median stretch."""

QUIET_FACTOR = 2.0

DESIGN_WIDTH = 1340
"""The picture's width in SVG units: about its width in pixels in a 1,400 px wide window (it
scales with the page, never below `MIN_SCALE` of this, scrolling sideways instead)."""

MIN_SCALE = 0.8
MIN_SEGMENT_PX = 4.0
"""The least width of a stretch between two changes (a run is at least this wide, unless it
starts and ends at the same millisecond: then `MIN_BAR_PX`)."""

MIN_BAR_PX = 3.0
BREAK_PX = 36.0
"""The width of a shortened quiet stretch."""

FIXED_SHARE = 0.6
"""At most this share of the plot goes to minimum widths and breaks; the picture grows wider
(and scrolls) beyond that, up to `MAX_WIDTH`."""

MAX_WIDTH = 24_000
FONT_PX = 10
SANS_EM = 0.62
"""Estimated width of a sans-serif character, in em (for placing labels without overlaps)."""

MONO_EM = 0.6
LANE_H = 18
BAR_H = 14
REMOVED_H = 6
LABEL_ROW_H = 13

RUNNING, HELD, UNASSIGNED, REMOVED = "running", "held", "unassigned", "removed"
STATES = (RUNNING, HELD, UNASSIGNED, REMOVED)
"""The states a lane shows (the CSS class of their bars and legend swatches)."""

LOST = "lost"
"""A `Fact` kind: the resource's member left, was fenced or expired (drawn as UNASSIGNED)."""

STATE_TEXT = {
    RUNNING: "running (colour: the worker)",
    HELD: "held: left unassigned while a delayed rebalance was pending",
    UNASSIGNED: "unassigned: ran on no member (lost, or between owners)",
    REMOVED: "removed: deleted from the catalogue",
}

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
class Names:
    """Resource names (some of them, sorted) and how many there are in all."""

    names: tuple[str, ...] = ()
    total: int = 0

    @classmethod
    def of(cls, names: Iterable[str] | None, total: int | None = None) -> Names:
        shown = tuple(names or ())
        return cls(shown, max(len(shown), total or 0))


@dataclass(frozen=True)
class Marker:
    """A group epoch bump and what its rebalance did (the table row; all but the first three
    are optional).

    Attributes:
        trigger: the member or connector behind it.
        moved, newly_assigned: what its target moved (member to member; from nobody).
        held: what its target left unassigned (not deleted), with `delay_ms` its delay.
        removed: what it took away because it was deleted from the catalogue.
        lost, max_lost_wait_ms, lost_still_waiting: the resources lost in it.
        duration_ms: bump to converged (None: not converged); `status` says why.
    """

    epoch: int
    at_ms: int
    reason: str
    trigger: str = ""
    moved: Names = Names()
    newly_assigned: Names = Names()
    held: Names = Names()
    removed: Names = Names()
    delay_ms: int = 0
    lost: int = 0
    max_lost_wait_ms: int | None = None
    lost_still_waiting: int = 0
    duration_ms: int | None = None
    status: str = ""


@dataclass(frozen=True)
class Fact:
    """Why a resource may run nowhere from `at_ms` on (until some member runs it again):
    `kind` HELD (a target left it unassigned), REMOVED (deleted) or LOST (its member left, was
    fenced or expired); `epoch` the group epoch concerned, `detail` a sentence for the tooltip."""

    resource: str
    kind: str
    at_ms: int
    epoch: int | None = None
    detail: str = ""


@dataclass
class GroupTimeline:
    """What one group's timeline picture shows.

    Attributes:
        group_id: the group.
        intervals: running intervals of the lanes shown.
        markers: the group's epoch bumps (and their rebalances: the table).
        facts: what explains the lanes' gaps (held, removed, lost).
        resources_total: how many resources the group's history has (lanes shown may be fewer).
        as_of_ms: the right edge for intervals still running.
    """

    group_id: str
    intervals: list[Interval] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    resources_total: int = 0
    as_of_ms: int = 0
    facts: list[Fact] = field(default_factory=list)


@dataclass(frozen=True)
class Span:
    """A stretch of a lane in one state (clipped to the picture)."""

    resource: str
    state: str
    start_ms: int
    end_ms: int
    member_id: str = ""
    title: str = ""
    clipped: bool = False


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
    if abs(ms) < 7_200_000:
        return f"{ms / 60_000:.1f} min"
    return f"{ms / 3_600_000:.1f} h"


def _fmt_rel(ms: float) -> str:
    """Time since the start of the picture, for the axis: +350 ms, +4.25 s, +3 min 05 s."""
    ms = round(ms)
    if ms <= 0:
        return "start"
    if ms < 1000:
        return f"+{ms} ms"
    if ms < 60_000:
        return f"+{ms / 1000:.3g} s"
    if ms < 3_600_000:
        m, s = divmod(round(ms / 1000), 60)
        return f"+{m} min {s:02d} s"
    h, m = divmod(round(ms / 60_000), 60)
    return f"+{h} h {m:02d} min"


def _utc(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _clock(ms: float, step_ms: int = 1) -> str:
    """Time of day (UTC) to the precision a tick step needs."""
    d = datetime.fromtimestamp(ms / 1000, tz=UTC)
    if step_ms >= 60_000:
        return d.strftime("%H:%M")
    text = d.strftime("%H:%M:%S")
    if step_ms % 1000 == 0:
        return text
    digits = 1 if step_ms % 100 == 0 else 2 if step_ms % 10 == 0 else 3
    return text + "." + f"{d.microsecond // 1000:03d}"[:digits]


def text_width(text: str, font_px: float = FONT_PX, *, mono: bool = False) -> float:
    """An estimate of a label's width in pixels (no font metrics here)."""
    return len(text) * font_px * (MONO_EM if mono else SANS_EM)


class TimeScale:
    """A piecewise-linear time scale: ms -> x.

    The history is cut at every change (`points`). Each stretch between two changes gets at
    least `MIN_SEGMENT_PX` plus a width proportional to its duration; a quiet stretch (longer
    than `QUIET_SHARE` of the history and `QUIET_FACTOR` times the median stretch, and worth
    shortening) gets `BREAK_PX` and is listed in `breaks`. The plot is `width` wide, or wider
    when the minimum widths need more (`width` then says how wide).

    Attributes:
        x0, width: where the plot starts and how wide it is.
        breaks: the shortened stretches (start ms, end ms).
        pieces: the stretches between breaks (start ms, end ms), each drawn to scale but for the
            minimum widths.
    """

    def __init__(self, points: Iterable[float], t0: float, t1: float, x0: float, width: float):
        self.t0, self.t1, self.x0 = float(t0), float(max(t1, t0 + 1)), float(x0)
        pts = sorted({min(max(float(p), self.t0), self.t1) for p in [*points, t0, self.t1]})
        segs = list(pairwise(pts))
        durations = [b - a for a, b in segs]
        cap = max(QUIET_SHARE * (self.t1 - self.t0), QUIET_FACTOR * statistics.median(durations))
        quiet = [d > cap for d in durations]
        widths: list[float] = []
        plot = float(width)
        for _ in range(5):
            n_lin = quiet.count(False)
            fixed = quiet.count(True) * BREAK_PX + n_lin * MIN_SEGMENT_PX
            plot = min(max(float(width), fixed / FIXED_SHARE), float(MAX_WIDTH))
            lin_time = sum(d for d, q in zip(durations, quiet, strict=True) if not q)
            spare = max(plot - fixed, 0.0)
            k = spare / lin_time if lin_time > 0 else 0.0
            even = spare / n_lin if lin_time <= 0 and n_lin else 0.0
            widths = [
                BREAK_PX if q else MIN_SEGMENT_PX + k * d + even
                for d, q in zip(durations, quiet, strict=True)
            ]
            # A stretch that would be about as narrow drawn to scale is not worth a break.
            unbreak = [
                i
                for i, (d, q) in enumerate(zip(durations, quiet, strict=True))
                if q and MIN_SEGMENT_PX + k * d <= 1.5 * BREAK_PX
            ]
            if not unbreak:
                break
            for i in unbreak:
                quiet[i] = False
        total = sum(widths) or 1.0
        squeeze = min(1.0, float(MAX_WIDTH) / total)
        self._starts = [a for a, _ in segs]
        self._durations = durations
        self._widths = [w * squeeze for w in widths]
        self._xs: list[float] = []
        x = self.x0
        for w in self._widths:
            self._xs.append(x)
            x += w
        self.width = x - self.x0
        self.breaks = [s for s, q in zip(segs, quiet, strict=True) if q]
        self.pieces: list[tuple[float, float]] = []
        start = self.t0
        for a, b in self.breaks:
            if a > start:
                self.pieces.append((start, a))
            start = b
        if start < self.t1 or not self.pieces:
            self.pieces.append((start, self.t1))

    def x(self, ms: float) -> float:
        ms = min(max(float(ms), self.t0), self.t1)
        if not self._starts:
            return self.x0
        i = max(0, bisect_right(self._starts, ms) - 1)
        d = self._durations[i]
        frac = (ms - self._starts[i]) / d if d else 0.0
        return self._xs[i] + frac * self._widths[i]


TICK_STEPS_MS = (
    *(1, 2, 5, 10, 20, 50, 100, 200, 500),
    *(1_000, 2_000, 5_000, 10_000, 15_000, 30_000),
    *(60_000, 120_000, 300_000, 600_000, 900_000, 1_800_000),
    *(3_600_000, 7_200_000, 10_800_000, 21_600_000, 43_200_000, 86_400_000),
)
TICK_SPACING_PX = 120


@dataclass(frozen=True)
class _Tick:
    at_ms: float
    x: float
    lines: tuple[str, ...]
    anchor: str
    title: str
    priority: int


def _ticks(scale: TimeScale) -> list[_Tick]:
    """Candidate ticks, best first: each piece's start (and the end) with exact times, then
    round times within each piece."""
    t0 = scale.t0
    out = []
    for a, b in scale.pieces:
        out.append(_Tick(a, scale.x(a), (_clock(a), _fmt_rel(a - t0)), "start", _utc(int(a)), 1))
        px = scale.x(b) - scale.x(a)
        want = max(1.0, px / TICK_SPACING_PX)
        step = next((s for s in TICK_STEPS_MS if (b - a) / s <= want), TICK_STEPS_MS[-1])
        first = (int(a) // step + 1) * step
        for t in range(first, int(b), step):
            lines = (_clock(t, step), _fmt_rel(t - t0))
            out.append(_Tick(t, scale.x(t), lines, "middle", _utc(t), 3))
    t1 = scale.t1
    out.append(_Tick(t1, scale.x(t1), (_clock(t1), _fmt_rel(t1 - t0)), "end", _utc(int(t1)), 2))
    return out


def _box(x: float, w: float, anchor: str) -> tuple[float, float]:
    if anchor == "start":
        return x, x + w
    if anchor == "end":
        return x - w, x
    return x - w / 2, x + w / 2


def _free(box: tuple[float, float], taken: Sequence[tuple[float, float]], gap: float) -> bool:
    return all(box[1] + gap <= a or b + gap <= box[0] for a, b in taken)


def _stagger(items: Sequence[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, int]]:
    """Label positions (centre x, row) for labels of these (centre x, width), sorted by x: each
    in the lowest row where it overlaps no other; centres moved inside [lo, hi]."""
    rows: list[float] = []
    out = []
    for x, w in items:
        cx = min(max(x, lo + w / 2), hi - w / 2)
        left = cx - w / 2
        row = next((r for r, right in enumerate(rows) if right + 3 <= left), len(rows))
        if row == len(rows):
            rows.append(0.0)
        rows[row] = cx + w / 2
        out.append((cx, row))
    return out


def _state_of(kind: str) -> str:
    return {HELD: HELD, REMOVED: REMOVED}.get(kind, UNASSIGNED)


def _gap_title(resource: str, state: str, fact: Fact | None, a: int, b: int, t1: int) -> str:
    until = "now" if b >= t1 else _utc(b)
    when = f"{_utc(a)} to {until} ({_fmt_ms(b - a)})"
    if state == HELD:
        epoch = f" of epoch {fact.epoch}" if fact and fact.epoch is not None else ""
        why = f"held: the target{epoch} left it unassigned while a delayed rebalance was pending"
    elif state == REMOVED:
        epoch = f" (epoch {fact.epoch})" if fact and fact.epoch is not None else ""
        why = f"removed: deleted from the catalogue{epoch}"
    else:
        why = "ran on no member" + (f": {fact.detail}" if fact and fact.detail else "")
    extra = f"; {fact.detail}" if fact and fact.detail and state != UNASSIGNED else ""
    return f"{resource} {why}{extra}. {when}"


def lane_spans(timeline: GroupTimeline, t0: int, t1: int) -> dict[str, list[Span]]:
    """Per lane, its stretches in each state within [t0, t1]: the running intervals, and the
    gaps between them classified by the facts (the latest fact since the run before the gap
    decides; a gap with none is UNASSIGNED; nothing is drawn before a lane's first run unless a
    fact explains it)."""
    runs: dict[str, list[Interval]] = {}
    for i in timeline.intervals:
        runs.setdefault(i.resource, []).append(i)
    facts: dict[str, list[Fact]] = {}
    for f in sorted(timeline.facts, key=lambda f: f.at_ms):
        facts.setdefault(f.resource, []).append(f)
    out: dict[str, list[Span]] = {}
    for resource, rs in runs.items():
        rs.sort(key=lambda i: (i.start_ms, i.end_ms if i.end_ms is not None else t1))
        spans: list[Span] = []
        covered_to: int | None = None
        run_start: int | None = None
        gaps: list[tuple[int | None, int, int, str | None]] = []
        for i in rs:
            end = i.end_ms if i.end_ms is not None else t1
            if end < t0 or (end == t0 and i.start_ms < t0):  # before the picture
                if covered_to is None or end >= covered_to:
                    covered_to, run_start = end, i.start_ms
                continue
            start = max(i.start_ms, t0)
            if covered_to is None:
                gaps.append((t0 - 1, t0, start, None))
            elif start > covered_to:
                gaps.append((run_start, max(covered_to, t0), start, UNASSIGNED))
            if covered_to is None or end >= covered_to:
                covered_to, run_start = end, i.start_ms
            still = i.end_ms is None
            tip = (
                f"{i.resource} on {i.member_id}: {_utc(i.start_ms)} to "
                f"{'now (still running)' if still else _utc(i.end_ms)}"
                + (" (started before the period shown)" if i.start_ms < t0 else "")
            )
            spans.append(
                Span(resource, RUNNING, start, min(end, t1), i.member_id, tip, i.start_ms < t0)
            )
        if covered_to is not None and covered_to < t1:
            gaps.append((run_start, max(covered_to, t0), t1, UNASSIGNED))
        for lower, a, b, default in gaps:
            spans.extend(_classify(resource, facts.get(resource, []), lower, a, b, default, t1))
        out[resource] = sorted(spans, key=lambda s: (s.start_ms, s.state != RUNNING))
    return out


def _classify(
    resource: str,
    facts: Sequence[Fact],
    lower: int | None,
    a: int,
    b: int,
    default: str | None,
    t1: int,
) -> list[Span]:
    """The gap [a, b) cut where facts change its state."""
    relevant = [f for f in facts if (lower is None or f.at_ms > lower) and f.at_ms < b]
    before = [f for f in relevant if f.at_ms <= a]
    fact = before[-1] if before else None
    state = _state_of(fact.kind) if fact else default
    cuts: list[tuple[int, str | None, Fact | None]] = [(a, state, fact)]
    for f in relevant:
        if f.at_ms > a:
            cuts.append((f.at_ms, _state_of(f.kind), f))
    out: list[Span] = []
    for (start, st, why), (end, _, _) in pairwise([*cuts, (b, None, None)]):
        if st is None or end <= start:
            continue
        if out and out[-1].state == st and out[-1].end_ms == start:
            prev = out.pop()
            start = prev.start_ms
        title = _gap_title(resource, st, why, start, end, t1)
        out.append(Span(resource, st, start, end, "", title))
    return out


def _patterns(pid: str) -> str:
    return (
        "<defs>"
        f'<pattern id="{pid}-held" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff1c2"/>'
        '<rect width="2.5" height="6" fill="#d99a00"/></pattern>'
        f'<pattern id="{pid}-unassigned" width="5" height="5" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(-45)"><rect width="5" height="5" fill="#fde3e1"/>'
        '<rect width="1.6" height="5" fill="#c0392b"/></pattern>'
        f'<pattern id="{pid}-removed" width="4" height="4" patternUnits="userSpaceOnUse">'
        '<rect width="4" height="4" fill="#ededed"/><circle cx="2" cy="2" r="0.9" fill="#8a8a8a"/>'
        "</pattern></defs>"
    )


def _state_style(state: str, pid: str, color: str = "") -> str:
    """The presentation attributes of a state's bars (and legend swatch)."""
    if state == RUNNING:
        return f'fill="{color}"'
    if state == HELD:
        return f'fill="url(#{pid}-held)" stroke="#a86f00" stroke-width="1"'
    if state == UNASSIGNED:
        return (
            f'fill="url(#{pid}-unassigned)" stroke="#c0392b" stroke-width="1" '
            'stroke-dasharray="3 2"'
        )
    return f'fill="url(#{pid}-removed)" stroke="#8a8a8a" stroke-width="0.75"'


def _bar_h(state: str) -> float:
    return float(REMOVED_H if state == REMOVED else BAR_H)


def _time_range(timeline: GroupTimeline) -> tuple[int, int]:
    """The picture's time range: from the first epoch bump (intervals carried over from before
    it are clipped; without bumps, from the first start) to "now" or the last change."""
    starts = [i.start_ms for i in timeline.intervals]
    marks = [m.at_ms for m in timeline.markers]
    t0 = min(marks) if marks else min(starts, default=timeline.as_of_ms)
    ends = [i.end_ms for i in timeline.intervals if i.end_ms is not None]
    t1 = max([timeline.as_of_ms, *ends, *starts, *marks, *(f.at_ms for f in timeline.facts)])
    return t0, max(t1, t0 + 1)


def timeline_svg(timeline: GroupTimeline, width: int = DESIGN_WIDTH, ids: str = "g1") -> str:
    """The picture: lanes of resources in their states, epoch bumps marked (linked to the rows
    `#{ids}-r{epoch}` of the rebalance table; each marker is `#{ids}-e{epoch}`), a time axis
    with ticks, and a legend. `ids` prefixes every id in it (unique per page)."""
    e = html.escape
    lanes = sorted({i.resource for i in timeline.intervals}, key=_natural)
    if not lanes:
        return '<p class="muted">No connector or task ran in the exported history.</p>'
    t0, t1 = _time_range(timeline)
    spans = lane_spans(timeline, t0, t1)
    lanes = [name for name in lanes if any(s.state == RUNNING for s in spans.get(name, []))]
    if not lanes:
        return '<p class="muted">No connector or task ran in the period shown.</p>'
    members = sorted({s.member_id for name in lanes for s in spans[name] if s.state == RUNNING})
    colors = _color(members)
    markers = sorted(timeline.markers, key=lambda m: (m.at_ms, m.epoch))

    longest = max(text_width(name, mono=True) for name in lanes)
    left = min(max(60.0, longest + 14), 240.0)
    right = 18.0
    points = [s.start_ms for n in lanes for s in spans[n]] + [
        s.end_ms for n in lanes for s in spans[n]
    ]
    scale = TimeScale([*points, *(m.at_ms for m in markers)], t0, t1, left, width - left - right)
    x = scale.x
    total_w = left + scale.width + right

    labels = _stagger(
        [(x(m.at_ms), text_width(f"e{m.epoch}") + 4) for m in markers], 2.0, total_w - 2.0
    )
    rows = 1 + max((r for _, r in labels), default=0)
    top = 10 + rows * LABEL_ROW_H + 6
    bottom = top + LANE_H * len(lanes)
    axis_y = bottom + 2

    pid = e(ids)
    out = [_patterns(pid)]
    # Lanes: a band every other lane, the name (struck through when it ends deleted).
    for n, name in enumerate(lanes):
        y = top + n * LANE_H
        if n % 2 == 0:
            out.append(
                f'<rect x="{left:.1f}" y="{y}" width="{scale.width:.1f}" height="{LANE_H}" '
                'fill="#f4f4f4"/>'
            )
        gone = spans[name][-1].state == REMOVED
        shown = name
        while text_width(shown, mono=True) > left - 10 and len(shown) > 4:
            shown = shown[:-2] + "…"
        deco = ' text-decoration="line-through" fill="#888"' if gone else ' fill="#333"'
        tip = f"<title>{e(name)}</title>" if shown != name else ""
        out.append(
            f'<text x="{left - 6:.1f}" y="{y + LANE_H - 4}" text-anchor="end" class="lane" '
            f'font-family="monospace" font-size="{FONT_PX}"{deco}>{e(shown)}{tip}</text>'
        )
    # The states.
    for n, name in enumerate(lanes):
        lane_y = top + n * LANE_H
        running = [s for s in spans[name] if s.state == RUNNING]
        sub = _sub_rows(running)
        n_sub = 1 + max(sub.values(), default=0)
        for s in spans[name]:
            x0, x1 = x(s.start_ms), x(s.end_ms)
            w = x1 - x0
            if w < MIN_BAR_PX:
                x0, w = (x0 + x1) / 2 - MIN_BAR_PX / 2, MIN_BAR_PX
            h: float
            if s.state == RUNNING:
                h = BAR_H / n_sub
                bar_y = lane_y + (LANE_H - BAR_H) / 2 + sub[s] * h
                style = _state_style(RUNNING, pid, colors[s.member_id])
                data = f' data-member="{e(s.member_id)}"'
            else:
                h = _bar_h(s.state)
                bar_y = lane_y + (LANE_H - h) / 2
                style = _state_style(s.state, pid)
                data = ""
            out.append(
                f'<rect class="bar {s.state}" x="{x0:.1f}" y="{bar_y:.1f}" width="{w:.1f}" '
                f'height="{h:.1f}" {style} data-resource="{e(name)}"{data} '
                f'data-start="{s.start_ms}" data-end="{s.end_ms}"><title>{e(s.title)}</title>'
                "</rect>"
            )
            if s.clipped:
                out.append(
                    f'<path d="M{x0 + 5:.1f},{bar_y:.1f} l-5,{h / 2:.1f} l5,{h / 2:.1f} z" '
                    'fill="#333"><title>started before the period shown</title></path>'
                )
    # Breaks: a slanted white cut across the lanes and the axis, with the time it stands for.
    for a, b in scale.breaks:
        xm = (x(a) + x(b)) / 2
        tip = f"{_fmt_ms(b - a)} without changes, shortened in the picture"
        y0, y1 = top - 3, axis_y + 5
        out.append(
            f'<g class="break"><title>{e(tip)}</title>'
            f'<path d="M{xm - 5:.1f},{y1} L{xm + 1:.1f},{y0} L{xm + 7:.1f},{y0} '
            f'L{xm + 1:.1f},{y1} Z" fill="#ffffff"/>'
            f'<path d="M{xm - 5:.1f},{y1} L{xm + 1:.1f},{y0} M{xm + 1:.1f},{y1} '
            f'L{xm + 7:.1f},{y0}" stroke="#777" stroke-width="1" fill="none"/></g>'
        )
    # Epoch bumps: a dashed line each, up to its label.
    for m, (lx, row) in zip(markers, labels, strict=True):
        xm = x(m.at_ms)
        ly = top - 6 - row * LABEL_ROW_H
        out.append(
            f'<g class="marker" id="{pid}-e{m.epoch}"><title>{e(_marker_tip(m))}</title>'
            f'<line x1="{xm:.1f}" y1="{ly + 2:.1f}" x2="{xm:.1f}" y2="{bottom}" stroke="#444" '
            'stroke-width="1" stroke-dasharray="3 2"/>'
            + (
                f'<line x1="{lx:.1f}" y1="{ly + 2:.1f}" x2="{xm:.1f}" y2="{ly + 2:.1f}" '
                'stroke="#444" stroke-width="1"/>'
                if abs(lx - xm) > 0.5
                else ""
            )
            + "</g>"
        )
    # The axis: line, ticks (time of day, time since the start), break lengths.
    out.append(
        f'<line x1="{left:.1f}" y1="{axis_y}" x2="{left + scale.width:.1f}" y2="{axis_y}" '
        'stroke="#555" stroke-width="1"/>'
    )
    out.extend(_axis_labels(scale, axis_y, total_w))
    # Epoch labels last, over the lines, with a white halo; each links to its table row.
    for m, (lx, row) in zip(markers, labels, strict=True):
        ly = top - 6 - row * LABEL_ROW_H
        out.append(
            f'<a href="#{pid}-r{m.epoch}"><text class="epoch" x="{lx:.1f}" y="{ly:.1f}" '
            f'text-anchor="middle" font-size="{FONT_PX}" font-family="sans-serif" '
            'fill="#1f4e99" stroke="#ffffff" stroke-width="3" paint-order="stroke">'
            f"e{m.epoch}<title>{e(_marker_tip(m))}</title></text></a>"
        )
    legend, legend_h = _legend(pid, members, colors, axis_y + 52, total_w, 8.0)
    out.append(legend)
    height = axis_y + 52 + legend_h + 6
    date = datetime.fromtimestamp(t0 / 1000, tz=UTC).strftime("%Y-%m-%d")
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="100%" '
        f'viewBox="0 0 {total_w:.0f} {height:.0f}" preserveAspectRatio="xMinYMin meet" '
        f'class="timeline" style="min-width: {total_w * MIN_SCALE:.0f}px" '
        f'font-family="sans-serif" data-t0="{t0}" data-t1="{t1}" '
        f'aria-label="which worker ran which resource over time in {e(timeline.group_id)}, '
        f'from {date}">'
    )
    caption = (
        f'<p class="muted">Times in UTC from {e(_utc(t0))} to {e(_utc(t1))} '
        f"({e(_fmt_ms(t1 - t0))}). Not drawn to one scale: every change gets a few pixels, "
        "busy seconds are widened and quiet stretches shortened (the slanted cuts); read the "
        "ticks. Hover for details; click an epoch label for its rebalance.</p>"
    )
    shown_note = ""
    if timeline.resources_total > len(lanes):
        shown_note = (
            f'<p class="muted">Showing {len(lanes)} of {timeline.resources_total} resources '
            "(those that moved most).</p>"
        )
    fit = ""
    if total_w > width:
        fit = (
            f'<p class="muted">The picture is {total_w:.0f} px wide to keep every change visible; '
            "scroll sideways, or "
            '<button type="button" onclick="this.parentNode.nextElementSibling.classList'
            ".toggle('fit')\">fit it to the page (and back)</button></p>"
        )
    return (
        caption
        + fit
        + '<div class="timeline-wrap">'
        + head
        + "".join(out)
        + "</svg></div>"
        + shown_note
    )


def _sub_rows(running: Sequence[Span]) -> dict[Span, int]:
    """Overlapping runs of one lane (a resource run twice at once) share it in sub-rows."""
    ends: list[int] = []
    out = {}
    for s in sorted(running, key=lambda s: s.start_ms):
        row = next((r for r, end in enumerate(ends) if end <= s.start_ms), len(ends))
        if row == len(ends):
            ends.append(0)
        ends[row] = s.end_ms
        out[s] = row
    return out


def _marker_tip(m: Marker) -> str:
    what = [f"moved {m.moved.total}"]
    for label, names in (
        ("newly assigned", m.newly_assigned),
        ("held", m.held),
        ("removed", m.removed),
    ):
        if names.total:
            what.append(f"{label} {names.total}")
    if m.lost:
        what.append(f"lost {m.lost}")
    done = (
        f"converged in {_fmt_ms(m.duration_ms)}"
        if m.duration_ms is not None
        else (m.status or "not converged")
    )
    reason = " ".join(x for x in (m.reason, m.trigger) if x)
    return f"group epoch {m.epoch} at {_utc(m.at_ms)}: {reason}; {', '.join(what)}; {done}"


def _axis_labels(scale: TimeScale, axis_y: float, total_w: float) -> list[str]:
    e = html.escape
    out = []
    breaks: list[tuple[float, float]] = []
    for a, b in scale.breaks:
        text = f"≈ {_fmt_ms(b - a)}"
        xm = (scale.x(a) + scale.x(b)) / 2
        box = _box(xm, text_width(text), "middle")
        if not _free(box, breaks, 4.0):
            continue  # the cut itself stays, and its tooltip
        breaks.append(box)
        out.append(
            f'<text class="break-label" x="{xm:.1f}" y="{axis_y + 39}" text-anchor="middle" '
            f'font-size="{FONT_PX}" fill="#555">{e(text)}<title>{e(_fmt_ms(b - a))} without '
            "changes, shortened in the picture</title></text>"
        )
    taken: list[tuple[float, float]] = []
    ticks = sorted(_ticks(scale), key=lambda t: (t.priority, t.x))
    for t in ticks:
        w = max(text_width(line) for line in t.lines)
        box = _box(t.x, w, t.anchor)
        box = (max(box[0], 0.0), min(box[1], total_w))
        labelled = _free(box, taken, 8.0)
        out.append(
            f'<line class="tick" x1="{t.x:.1f}" y1="{axis_y}" x2="{t.x:.1f}" '
            f'y2="{axis_y + (5 if labelled else 3)}" stroke="#555" stroke-width="1"/>'
        )
        if not labelled:
            continue
        taken.append(box)
        first, second = t.lines
        out.append(
            f'<text class="tick-label" x="{t.x:.1f}" y="{axis_y + 15}" '
            f'text-anchor="{t.anchor}" font-size="{FONT_PX}" fill="#333">{e(first)}'
            f'<tspan x="{t.x:.1f}" dy="12" fill="#777">{e(second)}</tspan>'
            f"<title>{e(t.title)}</title></text>"
        )
    return out


def _legend(
    pid: str, members: Sequence[str], colors: Mapping[str, str], y: float, width: float, x0: float
) -> tuple[str, float]:
    """The legend (states, symbols, then the workers' colours), wrapped to the width; and its
    height."""
    e = html.escape
    items: list[tuple[str, str]] = []  # (swatch svg at 0,0 size 22x12, text)
    for state in STATES:
        color = colors[members[0]] if members and state == RUNNING else PALETTE[0]
        h = _bar_h(state)
        items.append(
            (
                f'<rect class="swatch {state}" x="0" y="{(12 - h) / 2}" width="22" '
                f'height="{h}" {_state_style(state, pid, color)}/>',
                STATE_TEXT[state],
            )
        )
    items.append(
        (
            '<line x1="11" y1="-2" x2="11" y2="13" stroke="#444" stroke-dasharray="3 2"/>',
            "eN: group epoch bump (click: its rebalance)",
        )
    )
    items.append(
        (
            '<path d="M5,13 L11,-1 M11,13 L17,-1" stroke="#777" fill="none"/>',
            "≈: quiet stretch, shortened",
        )
    )
    for member in members:
        items.append(
            (
                f'<rect class="swatch worker" x="4" y="0" width="14" height="12" '
                f'fill="{colors[member]}"/>',
                member,
            )
        )
    out = ['<g class="legend">']
    cx, cy = x0, y
    for n, (swatch, text) in enumerate(items):
        w = 26 + text_width(text, FONT_PX * 0.9) + 18
        if n == len(STATES) + 2:  # the workers start a row of their own
            cx, cy = x0, cy + 18
            out.append(
                f'<text x="{cx:.1f}" y="{cy + 10:.1f}" font-size="{FONT_PX}" fill="#333">'
                "workers:</text>"
            )
            cx += text_width("workers:") + 8
        if cx + w > width and cx > x0:
            cx, cy = x0, cy + 18
        out.append(
            f'<g class="legend-item" transform="translate({cx:.1f},{cy:.1f})">{swatch}'
            f'<text x="26" y="10" font-size="{FONT_PX}" fill="#333">{e(text)}</text></g>'
        )
        cx += w
    out.append("</g>")
    return "".join(out), cy - y + 18


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], css: str = "") -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _name_list(names: Names, limit: int = 12) -> str:
    if not names.total:
        return "-"
    shown = ", ".join(names.names[:limit])
    more = names.total - min(len(names.names), limit)
    text = f"{names.total}: {shown}" if shown else str(names.total)
    return text + (f" (+{more} more)" if more > 0 else "")


def rebalance_table(timeline: GroupTimeline, ids: str = "g1") -> str:
    """One row per epoch bump (`id="{ids}-r{epoch}"`), its epoch linking to its marker."""
    e = html.escape
    if not timeline.markers:
        return '<p class="muted">No epoch bump in the exported history.</p>'
    t0, _ = _time_range(timeline)
    headers = [
        "epoch",
        "bumped at (UTC)",
        "reason",
        "moved",
        "newly assigned",
        "held (delayed rebalance)",
        "removed (deleted)",
        "lost (max wait)",
        "time to converge",
        "status",
    ]
    rows = []
    pid = e(ids)
    for m in sorted(timeline.markers, key=lambda m: (m.epoch, m.at_ms)):
        held = _name_list(m.held)
        if m.held.total and m.delay_ms:
            held += f" (delay {_fmt_ms(m.delay_ms)})"
        lost = "-"
        if m.lost:
            lost = f"{m.lost} ({_fmt_ms(m.max_lost_wait_ms)})"
            if m.lost_still_waiting:
                lost += f", {m.lost_still_waiting} still waiting"
        cells = [
            f'<a href="#{pid}-e{m.epoch}" title="show it in the timeline">e{m.epoch}</a>',
            e(f"{_utc(m.at_ms)[11:]} ({_fmt_rel(m.at_ms - t0)})"),
            e(" ".join(x for x in (m.reason, m.trigger) if x) or "-"),
            e(_name_list(m.moved)),
            e(_name_list(m.newly_assigned)),
            e(held),
            e(_name_list(m.removed)),
            e(lost),
            e(_fmt_ms(m.duration_ms)),
            e(m.status or "-"),
        ]
        rows.append(
            f'<tr id="{pid}-r{m.epoch}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
        )
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    return (
        f'<table class="rebalances"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; } h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
.ok { color: #1a7f37; font-weight: 600; } .bad { color: #c0392b; font-weight: 600; }
.muted { color: #777; } .violations td { background: #fff4f4; }
.timeline-wrap { width: 100%; overflow-x: auto; }
svg.timeline { display: block; width: 100%; height: auto; }
.timeline-wrap.fit svg.timeline { min-width: 0 !important; }
svg.timeline a text:hover { text-decoration: underline; }
svg.timeline g.marker:target line { stroke: #000; stroke-width: 2.5; stroke-dasharray: none; }
table.rebalances tr:target td { background: #fff3c4; }
table.rebalances td:first-child a { font-weight: 600; }
tr, g.marker { scroll-margin-top: 80px; }
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
                    else "digests only (config_digest: an HMAC-SHA256 of the config under "
                    "the database's own key; rows and events from before migration 0005 "
                    "have an unkeyed sha256; no values)",
                ),
                (
                    "status traces",
                    "digests only (trace_digest: the HMAC-SHA256 the coordinator stored with "
                    "each trace, under the database's own key; no trace text)",
                ),
                (
                    "resources by last reported status",
                    ", ".join(
                        f"{state} {n}"
                        for state, n in sorted(summary.get("resource_statuses", {}).items())
                    )
                    or "none reported",
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
    for n, timeline in enumerate(timelines, start=1):
        ids = f"g{n}"
        parts.append(f"<h2>Group {e(timeline.group_id)}</h2><h3>Who ran what</h3>")
        parts.append(timeline_svg(timeline, ids=ids))
        parts.append("<h3>Rebalances</h3>")
        parts.append(rebalance_table(timeline, ids=ids))
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
