"""Incremental runs: which events a run exports, and the watermark each run records.

Every run has an export date (its logical date, by default today in UTC) and exports the events
with `since_event_id < id <= until_event_id`. Once everything else is written, the run records
its range in `<output>/_watermarks/export_date=<date>.json`; that file is the commit point.

- A new export date starts where the previous export date's run ended (its `until_event_id`),
  and goes up to the highest event id in the database.
- Re-running the latest export date starts from the same place again, and replaces what that date
  wrote, picking up events that arrived since: nothing is exported twice, nothing is lost.
- Re-running an older export date (one with later runs after it) repeats exactly its recorded
  range, so the output is the same as before.
- `--since-event-id` overrides the start (and is recorded like any other run).

Ids that commit out of order. Event ids come from a sequence, so a transaction can take an id,
stay open, and commit after a later id has already been exported: a watermark alone would skip
that event for ever. So a run on PostgreSQL also records which ids of its range were missing from
its snapshot (`unfilled`, with when each was first seen: an open transaction's, or a rolled-back
one's that never comes), and the next export date looks for them again (`recheck`) besides the
events after the watermark. An id missing for longer than the wait (default an hour: no
coordinator transaction stays open that long) is given up after its next look.

Event retention (DESIGN 3.20). A coordinator with `--event-retention-ms` deletes old events, but
only those every registered export no longer needs: after committing a run, the export appends
its progress (`ProgressRow`: the range, and the lowest id it must be able to read again) to the
database under its name (`export_name`), and the pruner keeps everything above the latest row's
start and from its lowest such id. The database records the highest id it pruned; a run whose
range starts below it, or that must look again for an id at or below it, refuses
(`check_not_pruned`) rather than write a date with events missing. So re-running the latest
date works after pruning, and re-running an older one whose events were pruned refuses.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from .fs import OutputFS, join

WATERMARK_DIR = "_watermarks"


class WatermarkError(RuntimeError):
    """The recorded watermarks and the database disagree."""


class PrunedRangeError(WatermarkError):
    """Events the run needs may have been pruned by the coordinator's event retention."""


EXPORT_NAME_LENGTH = 128
"""The longest export name (`audit_export_progress.export_name`)."""


@dataclass(frozen=True)
class RunRecord:
    """What one committed run exported.

    Attributes:
        export_date: the run's export date (YYYY-MM-DD).
        since_event_id: events after this id were exported...
        until_event_id: ...up to and including this one (the watermark).
        snapshot_after_event_id: the highest event id before the snapshot was read: the snapshot
            reflects at least every event up to it.
        exported_at: when the run finished (UTC, ISO 8601).
        event_rows: events exported.
        table_rows: rows written per output table.
        source: the database (password hidden).
        rechecked: ids below `since_event_id` this run looked for (earlier runs' unfilled ids).
        unfilled: (id, first seen, ms since the epoch) for every id of the range, or of
            `rechecked`, that the run's snapshot did not have.
        as_of_ms: the run's "now" for what had not ended (a re-run of an older date uses it
            again); None in records written before it was kept.
    """

    export_date: str
    since_event_id: int
    until_event_id: int
    snapshot_after_event_id: int
    exported_at: str
    event_rows: int
    table_rows: dict[str, int] = field(default_factory=dict)
    source: str = ""
    rechecked: tuple[int, ...] = ()
    unfilled: tuple[tuple[int, int], ...] = ()
    as_of_ms: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @staticmethod
    def from_json(text: str) -> RunRecord:
        data: dict[str, Any] = json.loads(text)
        return RunRecord(
            export_date=str(data["export_date"]),
            since_event_id=int(data["since_event_id"]),
            until_event_id=int(data["until_event_id"]),
            snapshot_after_event_id=int(data.get("snapshot_after_event_id", 0)),
            exported_at=str(data.get("exported_at", "")),
            event_rows=int(data.get("event_rows", 0)),
            table_rows={str(k): int(v) for k, v in dict(data.get("table_rows", {})).items()},
            source=str(data.get("source", "")),
            rechecked=tuple(int(i) for i in data.get("rechecked", [])),
            unfilled=tuple((int(i), int(at)) for i, at in data.get("unfilled", [])),
            as_of_ms=None if data.get("as_of_ms") is None else int(data["as_of_ms"]),
        )


@dataclass(frozen=True)
class EventRange:
    """The events a run exports: `since_event_id < id <= until_event_id`.

    Attributes:
        since_event_id: exclusive lower bound.
        until_event_id: inclusive upper bound.
        why: how the range was chosen (for logs and the summary).
        recheck: ids at or below `since_event_id` to export too if they exist now (see the
            module's docstring).
        unfilled_before: when each of those was first seen missing (ms since the epoch).
        exclude: ids of the range not to export (a re-run of an older date skips what its
            first run missed: a later date has exported it since).
        recorded_unfilled: a re-run of an older date records what its first run recorded.
    """

    since_event_id: int
    until_event_id: int
    why: str
    recheck: tuple[int, ...] = ()
    unfilled_before: dict[int, int] = field(default_factory=dict)
    exclude: tuple[int, ...] = ()
    recorded_unfilled: tuple[tuple[int, int], ...] | None = None


def _path(output: str, export_date: str) -> str:
    return join(output, WATERMARK_DIR, f"export_date={export_date}.json")


def load_runs(fs: OutputFS, output: str) -> list[RunRecord]:
    """Every committed run under `output`, by export date."""
    runs = []
    for name in fs.list_names(join(output, WATERMARK_DIR)):
        if name.startswith("export_date=") and name.endswith(".json"):
            runs.append(RunRecord.from_json(fs.read_text(join(output, WATERMARK_DIR, name))))
    return sorted(runs, key=lambda r: r.export_date)


def record_run(fs: OutputFS, output: str, run: RunRecord) -> None:
    fs.write_text(_path(output, run.export_date), run.to_json())


def plan_range(
    runs: list[RunRecord], export_date: str, max_event_id: int, since_override: int | None
) -> EventRange:
    """Which events a run for `export_date` exports (see the module's docstring)."""
    if since_override is not None:
        if since_override < 0:
            raise WatermarkError(f"--since-event-id must be >= 0, not {since_override}")
        return EventRange(since_override, max(since_override, max_event_id), "--since-event-id")
    same = next((r for r in runs if r.export_date == export_date), None)
    later = [r for r in runs if r.export_date > export_date]
    earlier = [r for r in runs if r.export_date < export_date]
    # A re-run looks for what the original run looked for; a new date for what the previous
    # date missed.
    source = same if same is not None else (earlier[-1] if earlier else None)
    if same is not None:
        recheck, seen = same.rechecked, _first_seen(earlier[-1]) if earlier else {}
    elif source is not None:
        seen = _first_seen(source)
        recheck = tuple(sorted(seen))
    else:
        recheck, seen = (), {}
    if same is not None and later:
        # Exactly what it exported the first time: not what it missed (a later date has).
        missed = {event_id for event_id, _ in same.unfilled}
        return EventRange(
            same.since_event_id,
            same.until_event_id,
            f"re-run of {export_date}: its recorded range (later dates exist)",
            tuple(i for i in recheck if i not in missed),
            seen,
            tuple(sorted(i for i in missed if i > same.since_event_id)),
            same.unfilled,
        )
    if same is not None:
        since, why = same.since_event_id, f"re-run of {export_date}: from its recorded start"
    elif earlier:
        since = earlier[-1].until_event_id
        why = f"after the watermark of {earlier[-1].export_date}"
    else:
        since, why = 0, "first run: every event"
    if max_event_id < since:
        raise WatermarkError(
            f"the database's highest event id is {max_event_id}, below the recorded watermark "
            f"{since}: is this output from another database? Use --since-event-id to override."
        )
    return EventRange(since, max_event_id, why, recheck, seen)


def _first_seen(run: RunRecord) -> dict[int, int]:
    return dict(run.unfilled)


def still_unfilled(
    event_range: EventRange, missing: list[int], now_ms: int, wait_ms: int
) -> tuple[tuple[int, int], ...]:
    """What a run records as unfilled: the ids it did not find (`missing`: of its range, and of
    its recheck list), with when each was first seen missing; an id re-checked in vain once it
    has been missing for longer than `wait_ms` is given up."""
    if event_range.recorded_unfilled is not None:
        return event_range.recorded_unfilled
    out = []
    for event_id in sorted(set(missing)):
        first = event_range.unfilled_before.get(event_id, now_ms)
        if event_id in event_range.recheck and now_ms - first > wait_ms:
            continue
        out.append((event_id, first))
    return tuple(out)


@dataclass(frozen=True)
class ProgressRow:
    """What a committed run records in the database for the event pruner (DESIGN 3.20).

    Attributes:
        since_event_id: the run exported the events after this id...
        until_event_id: ...up to and including this one.
        lowest_unfilled_id: the lowest id the run must be able to read again: of the ids it
            recorded as unfilled (the next date looks for them) and those it re-checked (a
            re-run of its date looks for them again); `until_event_id` + 1 when none.
    """

    since_event_id: int
    until_event_id: int
    lowest_unfilled_id: int


def progress_row(run: RunRecord) -> ProgressRow:
    """The progress `run` records (see `ProgressRow`)."""
    needed_again = [event_id for event_id, _ in run.unfilled] + list(run.rechecked)
    lowest = min([*needed_again, run.until_event_id + 1])
    return ProgressRow(run.since_event_id, run.until_event_id, lowest)


def check_not_pruned(event_range: EventRange, pruned_through_event_id: int) -> None:
    """Refuse a run that may need pruned events: its range starts below the highest pruned id
    (`since_event_id` < it: ids after the start are gone), or it looks again for an id at or
    below it. Raises PrunedRangeError saying what to do."""
    floor = pruned_through_event_id
    if event_range.since_event_id < floor:
        raise PrunedRangeError(
            f"the coordinator pruned events through id {floor} (--event-retention-ms), but this "
            f"run would export the events after id {event_range.since_event_id} "
            f"({event_range.why}): it would write its date with events missing, so it refuses "
            "and writes nothing. Re-running the latest export date, or running a new one, "
            "works; to export what is left from here on, pass --since-event-id "
            f"{floor} (`coordinator-svc audit-exports list` shows what is registered)"
        )
    gone = sorted(i for i in event_range.recheck if i <= floor)
    if gone:
        shown = ", ".join(str(i) for i in gone[:10]) + (" ..." if len(gone) > 10 else "")
        raise PrunedRangeError(
            f"the coordinator pruned events through id {floor} (--event-retention-ms), but this "
            f"run must look again for ids at or below it ({shown}: missing from an earlier "
            "run's snapshot), which may be gone: it refuses and writes nothing. An older date "
            "cannot be re-run once its events are pruned; a new date can start with "
            f"--since-event-id {event_range.since_event_id}, which exports the events after it "
            "without looking for those"
        )


def default_export_name(output: str) -> str:
    """The export's name when `--export-name` is not given: its output location (qualified,
    without any user or password in it), shortened to EXPORT_NAME_LENGTH with a digest of the
    whole when longer. Two exports to the same output are one export."""
    name = re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@", r"\1", output.rstrip("/"))
    if len(name) <= EXPORT_NAME_LENGTH:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return name[: EXPORT_NAME_LENGTH - len(digest) - 1] + "#" + digest
