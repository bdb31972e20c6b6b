"""Event retention's command-line side (DESIGN 3.20 "Event retention bounded by the export"):
`serve`'s retention flags and their checks, and `coordinator-svc audit-exports list|remove`,
which reads and edits the audit exports' registrations in the database directly (like
`settings`): no coordinator needs to run.

An audit export registers itself by its first committed run (it appends a progress row to
`audit_export_progress` after each run); from then on the pruner keeps every event that export
may still read. `remove` forgets one that will not run again (a decommissioned output, a renamed
`--export-name`), so that it no longer holds the events back; if it does run again, a run whose
range starts below what was pruned meanwhile refuses.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from connect_protocol.env import env_default

from .runtime.retention_rules import MAX_ROWS_PER_S, NO_ID_BOUND, prune_ceiling

#: --event-prune-interval-ms: the shortest and longest look interval.
MIN_PRUNE_INTERVAL_MS = 100
MAX_PRUNE_INTERVAL_MS = 3_600_000


def add_retention_flags(p: argparse.ArgumentParser) -> None:
    """`serve`'s event retention flags."""
    group = p.add_argument_group(
        "event retention",
        "Events older than the retention are deleted, but only those every registered audit "
        "export has read and will not read again (an export registers by its first run); one "
        "coordinator at a time prunes, in batches.",
    )
    group.add_argument(
        "--event-retention-ms",
        type=int,
        default=env_default("EVENT_RETENTION_MS", 0),
        help="delete events older than this, once the audit exports no longer need them; "
        "server-wide (events outlive their groups). 0 = keep every event (EVENT_RETENTION_MS)",
    )
    group.add_argument(
        "--prune-events-without-export",
        action="store_true",
        default=env_default("PRUNE_EVENTS_WITHOUT_EXPORT", "") not in ("", "0", "false"),
        help="with no audit export registered, prune by age alone (default: prune nothing "
        "until an export has run) (PRUNE_EVENTS_WITHOUT_EXPORT=1)",
    )
    group.add_argument(
        "--event-prune-rows-per-s",
        type=int,
        default=env_default("EVENT_PRUNE_ROWS_PER_S", MAX_ROWS_PER_S),
        help=f"delete at most this many events per second, 1 .. {MAX_ROWS_PER_S} "
        "(EVENT_PRUNE_ROWS_PER_S)",
    )
    group.add_argument(
        "--event-prune-interval-ms",
        type=int,
        default=env_default("EVENT_PRUNE_INTERVAL_MS", 30_000),
        help="how often to look for prunable events and refresh the retention metrics "
        "(EVENT_PRUNE_INTERVAL_MS)",
    )


def retention_problem(args: argparse.Namespace) -> str | None:
    """Why the retention flags cannot work, or None."""
    if args.event_retention_ms < 0:
        return "--event-retention-ms must be 0 (keep every event) or positive"
    if not 1 <= args.event_prune_rows_per_s <= MAX_ROWS_PER_S:
        return f"--event-prune-rows-per-s must be between 1 and {MAX_ROWS_PER_S}"
    if not MIN_PRUNE_INTERVAL_MS <= args.event_prune_interval_ms <= MAX_PRUNE_INTERVAL_MS:
        return (
            f"--event-prune-interval-ms must be between {MIN_PRUNE_INTERVAL_MS} and "
            f"{MAX_PRUNE_INTERVAL_MS}"
        )
    if args.prune_events_without_export and args.event_retention_ms == 0:
        return "--prune-events-without-export needs --event-retention-ms"
    return None


def add_audit_exports_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], database_url: str
) -> None:
    exports = sub.add_parser(
        "audit-exports",
        help="list or remove the audit exports that hold events back from pruning",
        description="The audit exports registered in the database: each committed export run "
        "records its progress, and the event pruner (serve --event-retention-ms) keeps every "
        "event a registered export may still read. `remove` forgets an export that will not "
        "run again, so that it no longer holds events back.",
    )
    exports_sub = exports.add_subparsers(dest="audit_exports_command", required=True)
    for name, text in (
        ("list", "each registered export's latest run, and what the pruner may delete"),
        ("remove", "forget a registered export (its progress rows)"),
    ):
        p = exports_sub.add_parser(name, help=text, description=text)
        p.add_argument("--database-url", default=database_url, help="SQLAlchemy URL (DATABASE_URL)")
        if name == "remove":
            p.add_argument("name", help="the export's name, as `list` shows it")


def audit_exports_cmd(args: argparse.Namespace) -> int:
    from .store.engine import Database
    from .store.migrate import normalize_url, pending_revision
    from .store.retention import RetentionStore

    problem = pending_revision(args.database_url)
    if problem is not None:
        print(f"coordinator-svc audit-exports: {problem}", file=sys.stderr)
        return 2
    db = Database(normalize_url(args.database_url), 5_000)
    store = RetentionStore(db, owner_id="coordinator-svc audit-exports")
    try:
        if args.audit_exports_command == "remove":
            removed = store.remove(args.name)
            if not removed:
                print(
                    f"coordinator-svc audit-exports: no export is registered as {args.name!r} "
                    "(`coordinator-svc audit-exports list`)",
                    file=sys.stderr,
                )
                return 1
            print(
                f"removed {args.name!r} ({removed} recorded run(s)): the pruner no longer keeps "
                "events for it; if it runs again, a run starting below what was pruned refuses"
            )
            return 0
        registrations = store.registrations()
        state = store.pruning()
    finally:
        db.dispose()
    now = datetime.now(UTC)
    if not registrations:
        print(
            "no audit export registered: the pruner deletes nothing (unless a coordinator runs "
            "with --prune-events-without-export)"
        )
    for r in registrations:
        age = (now - r.at).total_seconds()
        unfilled = (
            "none" if r.lowest_unfilled_id > r.until_event_id else f"from {r.lowest_unfilled_id}"
        )
        print(
            f"{r.export_name}: latest run exported events {r.since_event_id + 1}.."
            f"{r.until_event_id} (unfilled ids: {unfilled}), recorded {r.at.isoformat()} "
            f"({_age(age)} ago), {r.runs} run(s)"
        )
    ceiling = prune_ceiling(registrations, without_export=False)
    if ceiling == 0:
        print("prunable: nothing yet (an export's first run starts at event 0)")
    elif ceiling is not None and ceiling != NO_ID_BOUND:
        print(f"prunable: events with an id up to {ceiling} that are older than the retention")
    pruned_at = state.pruned_at.isoformat() if state.pruned_at else "never"
    print(f"pruned through event id {state.pruned_through_event_id} (last pruned: {pruned_at})")
    return 0


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} d"
