"""The config digest key of a test database (migration 0005), read the way an operator would:
one SELECT, so that tests compare the coordinator's digests with ones computed here."""

from __future__ import annotations

import sqlalchemy as sa

from connect_protocol.configs import config_digest


def digest_key(database_url: str) -> bytes:
    """The database's `coordinator_secrets.config_digest_key` (the schema must be migrated)."""
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            value = conn.execute(
                sa.text("SELECT value FROM coordinator_secrets WHERE name = 'config_digest_key'")
            ).scalar_one()
    finally:
        engine.dispose()
    return bytes(value)


def keyed_digest(database_url: str, config: dict[str, str]) -> str:
    """What a coordinator on `database_url` must show as `config`'s digest."""
    return config_digest(config, digest_key(database_url))
