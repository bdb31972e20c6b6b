"""Schema migrations through Alembic's command API, and database URL handling.

The migration scripts live in the repository's `migrations/` directory; an installed wheel carries
them as `coordinator_svc/_migrations` (pyproject's `force-include`). `upgrade_to_head(url)` is what
`coordinator-svc migrate` and `serve` run.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL, make_url

#: Alembic's table of applied revisions (its default name; env.py does not change it).
VERSION_TABLE = "alembic_version"
_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # coordinator_svc/


def normalize_url(url: str | URL) -> URL:
    """Parse a SQLAlchemy URL; plain `postgresql://` (whose default driver, psycopg2, is not a
    dependency) means psycopg 3."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def migrations_dir() -> Path:
    """The Alembic script directory: inside an installed wheel, else the checkout's."""
    candidates = (_PACKAGE_DIR / "_migrations", _PACKAGE_DIR.parent / "migrations")
    for candidate in candidates:
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError(
        "Alembic migrations not found; looked in " + ", ".join(str(c) for c in candidates)
    )


def alembic_config(url: str | URL) -> Config:
    """An Alembic config for `url` without an ini file. The URL is passed as `-x url=...`, which
    env.py prefers over `DATABASE_URL` and the config."""
    rendered = normalize_url(url).render_as_string(hide_password=False)
    config = Config(cmd_opts=Namespace(x=[f"url={rendered}"]))
    config.set_main_option("script_location", str(migrations_dir()))
    return config


def upgrade_to_head(url: str | URL) -> None:
    """`alembic upgrade head` against `url` (safe to run from several processes at once on
    PostgreSQL: env.py serialises them with an advisory lock)."""
    command.upgrade(alembic_config(url), "head")


def code_revisions() -> tuple[str, frozenset[str]]:
    """This code's schema head and every revision its migrations define (a revision in the
    database that is not among them was written by a newer release)."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    script = ScriptDirectory.from_config(config)
    head = script.get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations in {migrations_dir()}")
    return head, frozenset(rev.revision for rev in script.walk_revisions())


def read_revisions(conn: sa.Connection) -> tuple[str, ...]:
    """The database's schema revisions (the rows of alembic_version; empty: never migrated)."""
    if not sa.inspect(conn).has_table(VERSION_TABLE):
        return ()
    rows = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()
    return tuple(sorted(str(r) for r in rows))


def pending_revision(url: str | URL) -> str | None:
    """None if the database's schema is at head; else a sentence saying where it is."""
    config = alembic_config(url)
    head = ScriptDirectory.from_config(config).get_current_head()
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
    if current == head:
        return None
    where = "not migrated at all" if current is None else f"at revision {current}"
    return f"the database schema is {where}, not at {head}: run `coordinator-svc migrate` first"
