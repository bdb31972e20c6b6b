"""One coordinator process for the fuzz tests of a module, on a database of its own, with a
healthy group heartbeating beside the fuzzed groups from start to end."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.fuzz.harness import LIMIT, FuzzTarget
from tests.support import hostile
from tests.support.coordinator import CoordinatorProcess
from tests.support.pgcluster import create_database, drop_database

CLASSIC_FLAGS = hostile.CLASSIC_FLAGS


@pytest.fixture(scope="module")
def fuzz_target(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FuzzTarget]:
    name = f"t_fuzz_{uuid.uuid4().hex}"
    database_url = create_database(postgres_admin_url, name)
    log_path = tmp_path_factory.mktemp("fuzz") / "coordinator.log"
    coordinator = CoordinatorProcess(
        database_url,
        "--max-message-bytes",
        str(LIMIT),
        # Classic phases as short as the generators' timeouts: parked calls end quickly.
        *CLASSIC_FLAGS,
        log_path=log_path,
    )
    try:
        coordinator.start()
        healthy = hostile.HealthyGroup(coordinator.address).start()
        target = FuzzTarget(coordinator, database_url, hostile.World(), healthy)
        try:
            yield target
        finally:
            healthy.stop()
            target.close()
    finally:
        coordinator.close()
        drop_database(postgres_admin_url, name)
