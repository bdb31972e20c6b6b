"""The report renderer as it was before issue 15 (`report_v0`, frozen), for the before/after
screenshots of the report test and the benchmark.

`render_before(summary, timelines)` renders the page the old way from the live renderer's
timelines (`audit_export.report.GroupTimeline`, as `report_data.collect_timelines` returns them):
only the fields the old renderer knew are passed on (running intervals, epoch bumps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from audit_export import report

from . import report_v0

__all__ = ["render_before", "report_v0"]


def render_before(summary: Mapping[str, Any], timelines: Sequence[report.GroupTimeline]) -> str:
    """The whole report page as the pre-issue-15 renderer drew it."""
    old = [
        report_v0.GroupTimeline(
            t.group_id,
            intervals=[
                report_v0.Interval(i.resource, i.member_id, i.start_ms, i.end_ms)
                for i in t.intervals
            ],
            markers=[report_v0.Marker(m.epoch, m.at_ms, m.reason) for m in t.markers],
            resources_total=t.resources_total,
            as_of_ms=t.as_of_ms,
        )
        for t in timelines
    ]
    return report_v0.render_html(summary, old)
