"""The report's timeline as an operator reads it (issue 15, item 3), on a realistic history: a
busy period (seven epoch bumps in under 10 s), 47 quiet minutes, three more bumps; a member
fenced while a delayed rebalance holds its work, a member that leaves, a connector deleted, and
intervals carried over from an earlier export date.

Checked on the SVG (parsed with xml.etree): every run at least 3 px wide, every epoch label
there and none overlapping, an axis with labelled ticks, 100 % width, the four states drawn
differently and named in the legend, each rebalance row linked to its marker and back. Checked
in headless Chromium: the real layout (widths, label boxes), and screenshots of the page before
(the frozen pre-issue renderer) and after, written with the HTML into the test's output
directory (`REPORT_SCREENSHOT_DIR`, else .tmp/test-output/report/, ignored by git) and printed.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from itertools import combinations, pairwise
from pathlib import Path
from typing import Any

import pytest

from audit_export import report, report_data
from tests.support.browser import dump_dom, png_size, screenshot
from tests.support.frozen_report_v0 import render_before

T = int(datetime(2026, 3, 14, 9, 0, tzinfo=UTC).timestamp() * 1000)
"""The first epoch bump of the exported history."""

Q = 2_820_000
"""The second busy period starts 47 minutes later."""

DAYS_BEFORE = T - 2 * 86_400_000
AS_OF = T + Q + 9_600 + 20 * 60_000
NS = "{http://www.w3.org/2000/svg}"
REPO = Path(__file__).resolve().parents[2]
WINDOW = (1400, 2400)


@dataclass
class Scenario:
    """Finding rows (as the findings have them) of two groups, and the summary."""

    ownership: list[dict[str, Any]]
    rebalances: list[dict[str, Any]]
    lost: list[dict[str, Any]]
    summary: dict[str, Any]


def _bump(
    group: str,
    epoch: int,
    at: int,
    reason: str,
    *,
    member: str | None = None,
    connector: str | None = None,
    install: int | None = 60,
    delay: int = 0,
    moved: tuple[str, ...] = (),
    newly: tuple[str, ...] = (),
    left: tuple[str, ...] = (),
    duration: int | None = 300,
    lost: int = 0,
    max_wait: int | None = None,
) -> dict[str, Any]:
    """A `rebalances` row (times relative to T)."""
    installed = None if install is None else T + at + install
    return {
        "group_id": group,
        "group_epoch": epoch,
        "reason": reason,
        "trigger_member_id": member,
        "trigger_connector": connector,
        "bump_event_id": 1000 + epoch,
        "bumped_at_ms": T + at,
        "bumped_at": datetime.fromtimestamp((T + at) / 1000, tz=UTC),
        "install_event_id": None if install is None else 2000 + epoch,
        "installed_at_ms": installed,
        "assignor_member_id": "W1" if install is not None else None,
        "scheduled_rebalance_delay_ms": delay,
        "moves": None,
        "moved": sorted(moved),
        "newly_assigned": sorted(newly),
        "left_unassigned": sorted(left),
        "revoked": sorted(moved + left),
        "moved_count": len(moved),
        "newly_assigned_count": len(newly),
        "revoked_count": len(moved + left),
        "members_to_converge": 2,
        "converged_at_ms": None if duration is None else T + at + duration,
        "duration_ms": duration,
        "status": "converged" if duration is not None else "in_progress",
        "lost_resources": lost,
        "max_lost_wait_ms": max_wait,
        "lost_still_waiting": 0,
    }


def _runs(group: str, resource: str, *runs: tuple[str, int, int | None]) -> list[dict[str, Any]]:
    """`ownership` rows of one resource: (member, start, end) relative to T (absolute when
    before the history)."""
    out = []
    for member, start, end in runs:
        s = start if start > 10**12 else T + start  # absolute: before the history
        out.append(
            {
                "group_id": group,
                "resource": resource,
                "member_id": member,
                "start_ms": s,
                "end_ms": None if end is None else T + end,
            }
        )
    return out


def _lost(
    group: str, epoch: int, resource: str, member: str, kind: str, at: int, by: str, ran: int
) -> dict[str, Any]:
    return {
        "group_id": group,
        "group_epoch": epoch,
        "resource": resource,
        "lost_from_member_id": member,
        "loss_event_type": kind,
        "loss_event_id": 1000 + epoch,
        "lost_at_ms": T + at,
        "restarted_on_member_id": by,
        "restart_event_id": 3000 + epoch,
        "restarted_at_ms": T + ran,
        "waited_ms": ran - at,
        "waiting_so_far_ms": None,
    }


def scenario() -> Scenario:
    """Group `payments`: W1 has run A, A-0 and A-1 for two days (carried over); e12-e18 in
    9.35 s (B and C added, W2 and W3 join, W2 fenced: its work held for a delayed rebalance
    while W4 joins, then handed out); 47 quiet minutes; C deleted (e19), W3 leaves (e20: its
    work lost until the next target), W5 joins (e21); 20 quiet minutes until the export.
    Group `billing`: two bumps, two lanes."""
    p = "payments"
    fenced = ("A-1", "B-0", "C-0")
    rebalances = [
        _bump(p, 12, 0, "connector added", connector="B", newly=("B", "B-0", "B-1")),
        _bump(p, 13, 900, "connector added", connector="C", newly=("C", "C-0", "C-1")),
        _bump(p, 14, 1_500, "member joined", member="W2", moved=fenced, duration=700),
        _bump(p, 15, 2_600, "member joined", member="W3", moved=("A-0", "B-1", "C-1")),
        _bump(
            p,
            16,
            4_200,
            "member fenced",
            member="W2",
            install=150,
            delay=5_000,
            left=fenced,
            lost=3,
            max_wait=5_500,
        ),
        _bump(p, 17, 6_800, "member joined", member="W4", install=100, delay=2_450),
        _bump(p, 18, 9_350, "scheduled rebalance fired", newly=fenced, duration=400),
        _bump(p, 19, Q, "connector deleted", connector="C", left=("C", "C-0", "C-1")),
        _bump(
            p,
            20,
            Q + 4_000,
            "member left",
            member="W3",
            install=900,
            moved=("A-0", "B-1"),
            duration=2_100,
            lost=2,
            max_wait=2_100,
        ),
        _bump(p, 21, Q + 9_000, "member joined", member="W5", moved=("A-1", "B"), duration=700),
        _bump("billing", 3, 500, "member joined", member="V1", newly=("X", "X-0")),
        _bump("billing", 4, 2_000, "member joined", member="V2", moved=("X-0",)),
    ]
    ownership = [
        *_runs(p, "A", ("W1", DAYS_BEFORE, None)),
        *_runs(
            p, "A-0", ("W1", DAYS_BEFORE, 2_760), ("W3", 3_100, Q + 4_000), ("W1", Q + 6_100, None)
        ),
        *_runs(
            p,
            "A-1",
            ("W1", DAYS_BEFORE, 1_700),
            ("W2", 2_050, 4_200),
            ("W4", 9_700, Q + 9_200),
            ("W5", Q + 9_600, None),
        ),
        *_runs(p, "B", ("W1", 180, Q + 9_200), ("W5", Q + 9_600, None)),
        *_runs(p, "B-0", ("W1", 180, 1_700), ("W2", 2_050, 4_200), ("W4", 9_700, None)),
        *_runs(p, "B-1", ("W1", 180, 2_760), ("W3", 3_100, Q + 4_000), ("W4", Q + 6_100, None)),
        *_runs(p, "C", ("W1", 1_050, Q + 250)),
        *_runs(p, "C-0", ("W1", 1_050, 1_700), ("W2", 2_050, 4_200), ("W1", 9_700, Q + 250)),
        *_runs(p, "C-1", ("W1", 1_050, 2_760), ("W3", 3_100, Q + 310)),
        *_runs("billing", "X", ("V1", 700, None)),
        *_runs("billing", "X-0", ("V1", 700, 2_300), ("V2", 2_600, None)),
    ]
    lost = [
        *(
            _lost(p, 16, r, "W2", "MEMBER_FENCED", 4_200, by, 9_700)
            for r, by in (("A-1", "W4"), ("B-0", "W4"), ("C-0", "W1"))
        ),
        *(
            _lost(p, 20, r, "W3", "MEMBER_LEFT", Q + 4_000, by, Q + 6_100)
            for r, by in (("A-0", "W1"), ("B-1", "W4"))
        ),
    ]
    summary = {
        "export_date": "2026-03-14",
        "exported_at": "2026-03-14T10:00:00+00:00",
        "source": "postgresql://audit:***@db:5432/coordinator",
        "watermark": {"since_event_id": 900, "until_event_id": 1400, "why": "after 2026-03-13"},
        "rows": {"events": 500, "groups": 2, "members": 6, "catalogue": 8},
        "grace_ms": 30_000,
        "connector_configs": "digests",
        "groups": [
            {
                "group_id": "billing",
                "group_epoch": 4,
                "members": 2,
                "catalogue_resources": 2,
                "rebalances": 2,
                "violations": 0,
            },
            {
                "group_id": "payments",
                "group_epoch": 21,
                "members": 4,
                "catalogue_resources": 6,
                "rebalances": 10,
                "violations": 0,
            },
        ],
        "violation_count": 0,
        "violations": [],
        "rebalances": [
            {k: v for k, v in r.items() if k not in ("moves", "bumped_at")} for r in rebalances
        ],
        "connector_moves": [
            {
                "group_id": p,
                "connector": "A",
                "tasks_run": 2,
                "task_moves": 5,
                "tasks_moved": 2,
                "connector_moves": 0,
                "target_task_moves": 3,
            },
        ],
        "truncated": {},
    }
    return Scenario(ownership, rebalances, lost, summary)


def timelines(s: Scenario, *, removed_column: bool = False) -> list[report.GroupTimeline]:
    """The report's timelines of the scenario, as `report_data` builds them from the rows;
    with `removed_column`, the rebalances have the findings' newer `removed` column."""
    rebalances = s.rebalances
    if removed_column:
        rebalances = [_with_removed(r) for r in rebalances]
    out = []
    for group in sorted({r["group_id"] for r in s.rebalances}):
        out.append(
            report_data.build_timeline(
                group,
                [r for r in s.ownership if r["group_id"] == group],
                [r for r in rebalances if r["group_id"] == group],
                [r for r in s.lost if r["group_id"] == group],
                AS_OF,
                None,
            )
        )
    return out


def _with_removed(row: dict[str, Any]) -> dict[str, Any]:
    """A rebalance row as the findings will have it: deleted resources in `removed`, not in
    `left_unassigned`."""
    if row["reason"] != "connector deleted":
        return {**row, "removed": []}
    return {**row, "removed": row["left_unassigned"], "left_unassigned": []}


# --- reading the SVG ----------------------------------------------------------------------


def svgs(page: str) -> list[ET.Element]:
    found = re.findall(r'<svg xmlns="http://www.w3.org/2000/svg".*?</svg>', page, re.S)
    return [ET.fromstring(s) for s in found]


def classes(el: ET.Element) -> set[str]:
    return set((el.get("class") or "").split())


def elements(svg: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    return [el for el in svg.iter(NS + tag) if cls in classes(el)]


def text_of(el: ET.Element) -> str:
    return (el.text or "").strip()


def label_box(el: ET.Element) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of a text, its width estimated as 0.6 em a character."""
    size = float(el.get("font-size") or 10)
    x, y, w = float(el.get("x") or 0), float(el.get("y") or 0), len(text_of(el)) * size * 0.6
    left = {"start": x, "end": x - w}.get(el.get("text-anchor") or "start", x - w / 2)
    return left, y - size, left + w, y


def overlap(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def bars(svg: ET.Element, state: str, resource: str | None = None) -> list[ET.Element]:
    return [
        el
        for el in elements(svg, "rect", "bar")
        if state in classes(el) and resource in (None, el.get("data-resource"))
    ]


def title(el: ET.Element) -> str:
    t = el.find(NS + "title")
    return "" if t is None else (t.text or "")


def style(el: ET.Element) -> tuple[str, ...]:
    fill = el.get("fill") or ""
    return (
        fill if fill.startswith("url(") else "solid",
        el.get("stroke") or "",
        el.get("stroke-dasharray") or "",
    )


@pytest.fixture(scope="module")
def page() -> str:
    return report.render_html(scenario().summary, timelines(scenario()))


@pytest.fixture(scope="module")
def payments(page: str) -> ET.Element:
    return svgs(page)[1]


@pytest.fixture
def out_dir() -> Path:
    """Where the pages and screenshots go: `REPORT_SCREENSHOT_DIR`, else .tmp/test-output/
    report/ in the repository (ignored by git, and not cleaned away by the next pytest run)."""
    chosen = os.environ.get("REPORT_SCREENSHOT_DIR")
    path = Path(chosen) if chosen else REPO / ".tmp" / "test-output" / "report"
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- the checks ------------------------------------------------------------------------------


def test_every_run_is_drawn_at_least_3_px_wide_and_the_svg_is_full_width(page: str) -> None:
    s = scenario()
    pictures = svgs(page)
    assert len(pictures) == 2  # billing, payments
    for svg in pictures:
        assert svg.get("width") == "100%" and svg.get("viewBox")
        assert not (svg.get("height") or "").endswith("px")
        for bar in elements(svg, "rect", "bar"):
            assert float(bar.get("width") or 0) >= 3, title(bar)
    payments = pictures[1]
    # Every interval has its bar (the one carried over from two days ago too, clipped).
    assert len(bars(payments, "running")) == len(
        [r for r in s.ownership if r["group_id"] == "payments"]
    )
    carried = bars(payments, "running", "A")
    assert len(carried) == 1 and "started before the period shown" in title(carried[0])
    plot_left = min(float(b.get("x") or 0) for b in elements(payments, "rect", "bar"))
    assert float(carried[0].get("x") or 0) == plot_left


def test_the_busy_seconds_are_widened_and_the_quiet_stretches_cut(page: str) -> None:
    def share(svg: ET.Element) -> float:
        """The part of the plot between the first and the seventh bump (9.35 s of 67 min)."""
        marks = [g.find(NS + "line") for g in elements(svg, "g", "marker")]  # after
        marks += [el for el in svg.iter(NS + "line") if el.get("stroke") == "#c0392b"]  # before
        xs = sorted(float(el.get("x1") or 0) for el in marks if el is not None)
        band = next(el for el in svg.iter(NS + "rect") if el.get("fill") in ("#f4f4f4", "#f6f6f6"))
        return (xs[6] - xs[0]) / float(band.get("width") or 1)

    before = svgs(render_before(scenario().summary, timelines(scenario())))[1]
    after = svgs(page)[1]
    assert share(before) < 0.15  # what the issue saw: the busy seconds in a sliver
    assert share(after) > 0.3
    cuts = elements(after, "g", "break")
    assert len(cuts) == 2  # the 47 minutes, and the 20 before the export
    assert all("shortened in the picture" in title(c) for c in cuts)
    assert {text_of(t) for t in elements(after, "text", "break-label")} == {
        "≈ 46.8 min",
        "≈ 20.0 min",
    }


def test_every_epoch_label_is_there_and_none_overlaps(page: str, payments: ET.Element) -> None:
    for svg, epochs in zip(svgs(page), (range(3, 5), range(12, 22)), strict=True):
        labels = elements(svg, "text", "epoch")
        assert sorted(text_of(el) for el in labels) == sorted(f"e{n}" for n in epochs)
        for a, b in combinations(labels, 2):
            assert not overlap(label_box(a), label_box(b)), (text_of(a), text_of(b))
        for el in labels:
            assert title(el).startswith(f"group epoch {text_of(el)[1:]} at ")
    tip = title(next(el for el in elements(payments, "text", "epoch") if text_of(el) == "e16"))
    assert "member fenced W2" in tip and "held 3" in tip and "lost 3" in tip


def test_the_axis_has_labelled_ticks_with_time_of_day_and_time_since_start(
    payments: ET.Element,
) -> None:
    ticks = elements(payments, "line", "tick")
    labels = elements(payments, "text", "tick-label")
    assert len(ticks) >= 8 and len(labels) >= 5
    for el in labels:
        assert re.fullmatch(r"\d\d:\d\d(:\d\d(\.\d{1,3})?)?", text_of(el)), text_of(el)
        second = el.find(NS + "tspan")
        assert second is not None and re.fullmatch(r"start|\+.+", second.text or "")
    assert text_of(labels[0]) == "09:00:00.000"  # the start, to the millisecond
    rel = {tspan.text for el in labels if (tspan := el.find(NS + "tspan")) is not None}
    assert "start" in rel and any("min" in (r or "") for r in rel)
    boxes = [label_box(el) for el in labels]
    for a, b in combinations(boxes, 2):
        assert not overlap(a, b)


def test_the_four_states_are_drawn_differently_and_named_in_the_legend(
    payments: ET.Element,
) -> None:
    seen = {}
    for state in report.STATES:
        drawn = bars(payments, state)
        assert drawn, state
        styles = {style(b) for b in drawn}
        if state == report.RUNNING:
            assert styles == {("solid", "", "")}
        else:
            assert len(styles) == 1
        seen[state] = styles.pop()
        swatch = [el for el in elements(payments, "rect", "swatch") if state in classes(el)]
        assert len(swatch) == 1 and style(swatch[0]) == seen[state]
    assert len(set(seen.values())) == 4
    legend = " ".join(
        text_of(t) for t in next(iter(elements(payments, "g", "legend"))).iter(NS + "text")
    )
    for state in report.STATES:
        assert report.STATE_TEXT[state] in legend
    for worker in ("W1", "W2", "W3", "W4", "W5"):
        assert worker in legend


def test_gaps_are_held_unassigned_or_removed_as_the_findings_say(payments: ET.Element) -> None:
    def spans(resource: str, state: str) -> list[tuple[int, int, str]]:
        return [
            (int(b.get("data-start") or 0) - T, int(b.get("data-end") or 0) - T, title(b))
            for b in bars(payments, state, resource)
        ]

    # W2 fenced at +4.2 s: lost until the target of e16 holds its work (+4.35 s) for the
    # delayed rebalance, which hands it out (W4 runs it at +9.7 s).
    [(a, b, tip)] = [s for s in spans("A-1", report.UNASSIGNED) if s[0] == 4_200]
    assert b == 4_350 and "lost when W2 was fenced; W4 ran it 5.50 s later" in tip
    [(a, b, tip)] = spans("A-1", report.HELD)
    assert (a, b) == (4_350, 9_700) and "epoch 16" in tip and "delay 5.00 s" in tip
    # Between two owners (revoked from W1, not yet started on W3): unassigned; W3 leaving:
    # lost until the next target gave it to W1.
    assert [(a, b) for a, b, _ in spans("A-0", report.UNASSIGNED)] == [
        (2_760, 3_100),
        (Q + 4_000, Q + 6_100),
    ]
    assert "lost when W3 left; W1 ran it 2.10 s later" in spans("A-0", report.UNASSIGNED)[1][2]
    # The deleted connector's resources: removed to the end, nothing held; names struck through.
    for resource, end in (("C", Q + 250), ("C-0", Q + 250), ("C-1", Q + 310)):
        [(a, b, tip)] = spans(resource, report.REMOVED)
        assert (a, b) == (end, AS_OF - T) and "deleted from the catalogue (epoch 19)" in tip
        assert not [s for s in spans(resource, report.HELD) if s[0] >= Q]
        assert not [s for s in spans(resource, report.UNASSIGNED) if s[0] >= Q]
    struck = [el for el in elements(payments, "text", "lane") if el.get("text-decoration")]
    assert sorted(text_of(el) for el in struck) == ["C", "C-0", "C-1"]


def test_each_rebalance_row_links_to_its_marker_and_back(page: str) -> None:
    rows = dict(re.findall(r'<tr id="(g\d+-r\d+)"><td><a href="#(g\d+-e\d+)"', page))
    assert len(rows) == 12 and len(set(rows.values())) == 12
    markers = {}
    for svg in svgs(page):
        for g in elements(svg, "g", "marker"):
            markers[g.get("id")] = g
        for a in svg.iter(NS + "a"):
            label = a.find(NS + "text")
            assert label is not None and "epoch" in classes(label)
            href = a.get("href") or ""
            target = href.removeprefix("#")
            assert target in rows and rows[target] == target.replace("-r", "-e")
            assert text_of(label) == "e" + target.split("-r")[1]
    assert set(markers) == set(rows.values())
    row = re.search(r'<tr id="g2-r19">(.*?)</tr>', page)
    assert row is not None
    cells = re.findall(r"<td>(.*?)</td>", row.group(1))
    assert cells[2] == "connector deleted C" and cells[5] == "-" and cells[6] == "3: C, C-0, C-1"
    row16 = re.search(r'<tr id="g2-r16">(.*?)</tr>', page)
    assert row16 is not None and "3: A-1, B-0, C-0 (delay 5.00 s)" in row16.group(1)
    assert "3 (5.50 s)" in row16.group(1)


def test_the_findings_removed_column_draws_the_same() -> None:
    s = scenario()
    assert timelines(s, removed_column=True) == timelines(s)


def test_intervals_from_an_earlier_export_date_are_clipped_to_the_first_bump() -> None:
    t = report.GroupTimeline(
        "g",
        intervals=[
            report.Interval("A", "W1", T - 86_400_000, T - 3_600_000),  # over before: not drawn
            report.Interval("B", "W1", T - 86_400_000, T + 5_000),
            report.Interval("B", "W2", T + 6_000, None),
        ],
        markers=[report.Marker(7, T + 1_000, "member joined", "W2")],
        as_of_ms=T + 10_000,
    )
    svg = ET.fromstring(re.findall(r"<svg.*</svg>", report.timeline_svg(t), re.S)[0])
    assert [text_of(el) for el in elements(svg, "text", "lane")] == ["B"]
    first = bars(svg, "running", "B")[0]
    assert int(first.get("data-start") or 0) == T + 1_000
    assert "started before the period shown" in title(first)


def test_before_and_after_screenshots_and_the_layout_in_chromium(
    out_dir: Path, page: str, capsys: pytest.CaptureFixture[str]
) -> None:
    s = scenario()
    before = out_dir / "report-before.html"
    after = out_dir / "report-after.html"
    before.write_text(render_before(s.summary, timelines(s)))
    after.write_text(page)
    shots = {
        name: screenshot(path, out_dir / f"report-{name}.png", width=WINDOW[0], height=WINDOW[1])
        for name, path in (("before", before), ("after", after))
    }
    for png in shots.values():
        assert png_size(png) == WINDOW and png.stat().st_size > 20_000
    with capsys.disabled():
        print(f"\nreport before: {before}\n  screenshot: {shots['before']}")
        print(f"report after:  {after}\n  screenshot: {shots['after']}")

    # The real layout: the picture as wide as the page, labels apart as rendered.
    probe = out_dir / "report-after-measured.html"
    probe.write_text(page.replace("</body>", MEASURE + "</body>"))
    dom = dump_dom(probe, width=WINDOW[0], height=WINDOW[1])
    found = re.search(r'data-measured="([^"]*)"', dom)
    assert found is not None, dom[-2000:]
    measured = json.loads(found.group(1).replace("&quot;", '"'))
    for svg in measured["svgs"]:
        assert svg["width"] >= 0.98 * measured["page"], measured
        boxes = svg["epochs"]
        assert len(boxes) >= 2
        for a, b in combinations(boxes, 2):
            assert not overlap(a, b), (a, b)
        for a, b in pairwise(sorted(svg["ticks"])):
            assert a[2] <= b[0], (a, b)
        assert min(svg["bars"]) >= 3


MEASURE = """<script>
const box = (el) => {
  const r = el.getBoundingClientRect();
  return [r.left, r.top, r.right, r.bottom];
};
const svgs = [...document.querySelectorAll("svg.timeline")].map((svg) => ({
  width: svg.getBoundingClientRect().width,
  epochs: [...svg.querySelectorAll("text.epoch")].map(box),
  ticks: [...svg.querySelectorAll("text.tick-label")].map(box),
  bars: [...svg.querySelectorAll("rect.bar")].map((r) => r.getBoundingClientRect().width),
}));
document.body.setAttribute("data-measured", JSON.stringify({
  page: document.body.clientWidth, svgs }));
</script>"""


def test_a_timeline_without_bumps_or_runs_still_renders() -> None:
    empty = report.GroupTimeline("g", as_of_ms=T)
    assert "No connector or task ran" in report.timeline_svg(empty)
    assert "No epoch bump" in report.rebalance_table(empty)
    one = replace(empty, intervals=[report.Interval("A", "W1", T, None)])
    svg = ET.fromstring(report.timeline_svg(one).split('<div class="timeline-wrap">')[1][:-6])
    assert len(bars(svg, "running")) == 1
