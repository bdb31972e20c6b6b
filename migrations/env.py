"""Alembic environment for the coordinator's schema.

The database URL comes from `-x url=...`, else the `DATABASE_URL` environment variable, else the
config's `sqlalchemy.url`. The target metadata is `coordinator_svc.store.schema`, compared with
types, so `alembic check` reports any drift between the models and the migrations.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

import sqlalchemy as sa
from alembic import context
from sqlalchemy.engine import Connection

from coordinator_svc.store.migrate import normalize_url
from coordinator_svc.store.schema import Base

# Any constant: serialises concurrent `upgrade`s from coordinators starting together.
_MIGRATION_LOCK_ID = 0x6367_6D69_6772  # "cgmigr"

config = context.config
if config.config_file_name is not None and not config.attributes.get("skip_logging_config"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> sa.URL:
    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        url = os.environ.get("DATABASE_URL")
    if not url:
        url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: pass -x url=..., or set DATABASE_URL")
    return normalize_url(url)


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=True,  # SQLite alters tables by copying them
        **kwargs,  # type: ignore[arg-type]
    )


def run_migrations_offline() -> None:
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(
                sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": _MIGRATION_LOCK_ID}
            )
        context.run_migrations()


def run_migrations_online() -> None:
    engine = sa.create_engine(_url(), poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
