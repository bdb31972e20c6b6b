"""`coordinator-svc settings show|set`: the database's coordinator settings (migration 0008),
edited in the database directly, like `migrate`. Coordinators read them at start, so a change
applies once they are restarted (a rollout).

One setting so far: `stored_set_form`, how large resource sets are written (`ranges` or
`plain`; `coordinator_svc/store/stored_sets.py`). Switch it to `ranges` only once every
coordinator of the database runs a release that reads ranges (the release of migration 0008 or
later): an older one reads a ranged set as one without tasks."""

from __future__ import annotations

import argparse
import sys

SETTINGS: dict[str, tuple[str, ...]] = {"stored_set_form": ("plain", "ranges")}
"""Each setting and the values it takes."""


def add_settings_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], database_url: str
) -> None:
    settings = sub.add_parser(
        "settings",
        help="show or change the database's coordinator settings",
        description="Show or change the settings every coordinator of the database reads at "
        "start (restart them to apply a change). stored_set_form: 'ranges' stores resource "
        "sets of more than 256 tasks as runs of task numbers (rows and events); 'plain' stores "
        "every task, as releases before migration 0008 read them. Switch to 'ranges' once "
        "every coordinator runs a release that reads them.",
    )
    settings_sub = settings.add_subparsers(dest="settings_command", required=True)
    for name, text in (("show", "print every setting"), ("set", "change a setting")):
        p = settings_sub.add_parser(name, help=text, description=text)
        p.add_argument("--database-url", default=database_url, help="SQLAlchemy URL (DATABASE_URL)")
        if name == "set":
            p.add_argument("name", choices=sorted(SETTINGS))
            p.add_argument("value")


def settings_cmd(args: argparse.Namespace) -> int:
    import sqlalchemy as sa

    from .store import schema
    from .store.engine import Database
    from .store.migrate import normalize_url, pending_revision

    problem = pending_revision(args.database_url)
    if problem is not None:
        print(f"coordinator-svc settings: {problem}", file=sys.stderr)
        return 2
    table = schema.coordinator_settings
    if args.settings_command == "set":
        allowed = SETTINGS[args.name]
        if args.value not in allowed:
            print(
                f"coordinator-svc settings: {args.name} takes one of {', '.join(allowed)} "
                f"(got {args.value!r})",
                file=sys.stderr,
            )
            return 2
    db = Database(normalize_url(args.database_url), 5_000)
    try:
        with db.engine.begin() as conn:
            if args.settings_command == "set":
                updated = conn.execute(
                    sa.update(table).where(table.c.name == args.name).values(value=args.value)
                ).rowcount
                if not updated:
                    conn.execute(sa.insert(table).values(name=args.name, value=args.value))
                print(
                    f"{args.name} = {args.value}; coordinators apply it when they next start "
                    "(restart them)"
                )
                return 0
            stored = dict(conn.execute(sa.select(table.c.name, table.c.value)).tuples().all())
        for name in sorted(SETTINGS):
            print(f"{name} = {stored.get(name, '(not set: plain)')}")
        return 0
    finally:
        db.dispose()
