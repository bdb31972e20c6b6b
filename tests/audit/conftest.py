"""Fixtures of the audit export tests: one local Spark session for the whole test run (it takes
10-20 s to start), shared by every test that needs Spark."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from audit_export.session import local_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] session with the PostgreSQL and SQLite JDBC drivers (Debian's jars)."""
    session = local_session(master="local[2]", driver_memory="1g", shuffle_partitions=2)
    try:
        yield session
    finally:
        session.stop()
