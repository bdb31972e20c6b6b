"""Shared pytest fixtures.

PostgreSQL: every test that asks for ``database_url`` gets a brand-new, empty
database on one server per session.  That server is ``TEST_DATABASE_URL`` when
set (any ``postgresql://`` or ``postgresql+psycopg://`` URL of a role that may
create databases), else a throwaway cluster started for the session
(see ``tests/support/pgcluster.py``), so plain ``pytest`` works too.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator

import pytest

from tests.support.pgcluster import (
    ThrowawayCluster,
    create_database,
    drop_database,
    sqlalchemy_url,
)


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    """SQLAlchemy URL of an administrative database on the session's server."""
    env_url = os.environ.get("TEST_DATABASE_URL")
    if env_url:
        yield sqlalchemy_url(env_url)
        return
    with ThrowawayCluster() as cluster:
        yield cluster.url


@pytest.fixture
def database_url(postgres_admin_url: str) -> Iterator[str]:
    """SQLAlchemy URL (``postgresql+psycopg://``) of a fresh database, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex}"
    url = create_database(postgres_admin_url, name)
    try:
        yield url
    finally:
        drop_database(postgres_admin_url, name)


@pytest.fixture(autouse=True)
def _no_stray_log_handler() -> Iterator[None]:
    """A test that runs the CLI in-process (`main(["serve", ...])`) lets it configure logging:
    the root logger's handlers become one StreamHandler on the sys.stderr of that moment, which
    is pytest's capture of that test. Left behind, every later record went to a closed stream
    and printed a "--- Logging error ---" traceback (alembic's migrations in later tests'
    setup, a lease test's commit): slow enough in a loaded run to outlast a 300 ms lease's
    idle-in-transaction timeout. Removed after each test, with the root level it had."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if type(handler) is logging.StreamHandler and handler not in before:
            root.removeHandler(handler)
    root.setLevel(level)
