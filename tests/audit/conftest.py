"""Fixtures of the audit export tests: one local Spark session for the whole test run (it takes
10-20 s to start), shared by every test that needs Spark."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from audit_export.session import local_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] session with the PostgreSQL and SQLite JDBC drivers (Debian's jars).

    py4j's connections log "Closing down clientserver connection" at INFO from `__del__`,
    whenever the garbage collector gets to them, often after pytest closed the stream the
    record would go to: logging then prints a traceback, and CPython 3.11 builds a traceback's
    caret anchors with `ast.parse`. Twice in full runs a test parsing source at about that time
    (hypothesis digests every state machine's source) failed with "SystemError: AST constructor
    recursion depth mismatch", a CPython 3.11 bug seen in threaded programs
    (python/cpython#106905). py4j's INFO lines are not needed; without them there is no
    traceback to print."""
    logging.getLogger("py4j").setLevel(logging.WARNING)
    session = local_session(master="local[2]", driver_memory="1g", shuffle_partitions=2)
    try:
        yield session
    finally:
        session.stop()
