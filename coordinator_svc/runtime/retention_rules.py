"""The rules of event retention (DESIGN 3.20 "Event retention bounded by the export"), pure: no
I/O, no clock. Which event ids the pruner may delete, given what the registered audit exports
still need, and how long it waits between batches so that it deletes at most its rate.

An audit export registers by appending a row per committed run (`audit_export_progress`): the
range it exported (`since_event_id` < id <= `until_event_id`) and the lowest id it must still be
able to read (`lowest_unfilled_id`: an id its snapshot lacked, or re-checked, that a later run
or a re-run of this date looks for again; `until_event_id` + 1 when none). From an export's
latest row:

- a re-run of its latest date reads the ids above that row's `since_event_id`, so those stay;
- the ids it recorded as unfilled are looked for again, so everything from the lowest of them
  stays.

So the pruner may delete ids up to the smallest, over every registered export, of
`since_event_id` and `lowest_unfilled_id - 1` (and only events older than the retention: the
store applies the age). With no export registered nothing is deleted, unless the operator said
so (`--prune-events-without-export`): then no id bound applies.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

NO_ID_BOUND = 2**63 - 1
"""The ceiling when pruning is forced with no export registered: every id (BIGINT's maximum)."""

MAX_ROWS_PER_S = 10_000
"""The most events the pruner deletes per second (DESIGN 3.20)."""

BATCHES_PER_S = 10
"""Deletes per second at full rate: each batch is a tenth of the rate, so that no transaction
of the pruner's is long (a smaller share of the database's time at once)."""


class ExportPosition(Protocol):
    """What the ceiling reads of an export's latest progress row."""

    @property
    def since_event_id(self) -> int: ...

    @property
    def lowest_unfilled_id(self) -> int: ...


def export_keeps_above(position: ExportPosition) -> int:
    """The highest event id this export no longer needs: everything above it may still be
    read by a re-run of its latest date or by its next date."""
    return max(0, min(position.since_event_id, position.lowest_unfilled_id - 1))


def prune_ceiling(latest: Iterable[ExportPosition], without_export: bool) -> int | None:
    """The highest event id the pruner may delete now (events at or below it, and older than the
    retention), or None when it may delete nothing: no export is registered and pruning
    without one was not asked for (`without_export`). 0 means nothing either (ids start at 1).

    Args:
        latest: each registered export's latest progress row.
        without_export: `--prune-events-without-export`: with no export registered, every id
            may go (only the retention limits it).
    """
    bounds = [export_keeps_above(position) for position in latest]
    if bounds:
        return min(bounds)
    return NO_ID_BOUND if without_export else None


def batch_rows(rows_per_s: int) -> int:
    """Rows per delete at `rows_per_s` (at most MAX_ROWS_PER_S; at least one)."""
    return max(1, min(rows_per_s, MAX_ROWS_PER_S) // BATCHES_PER_S)


def pause_after_batch(deleted: int, took_s: float, rows_per_s: int) -> float:
    """Seconds to wait after a batch that deleted `deleted` rows in `took_s`, so that the pruner
    deletes at most `rows_per_s` rows per second (capped at MAX_ROWS_PER_S) on average."""
    rate = max(1, min(rows_per_s, MAX_ROWS_PER_S))
    return max(0.0, deleted / rate - took_s)
