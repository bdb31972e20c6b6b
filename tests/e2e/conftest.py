"""Fixtures of the end-to-end tests: a real coordinator process on the test's PostgreSQL database
and a `Fleet` of real worker agents around it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agents import Fleet
from tests.support.coordinator import CoordinatorProcess

GROUP = "e2e"


@pytest.fixture
def coordinator(database_url: str, tmp_path: Path) -> Iterator[CoordinatorProcess]:
    """`coordinator-svc serve` with FAST_DEFAULTS (session 3000 ms, heartbeat 200 ms,
    scheduled.rebalance.max.delay.ms 2000 ms)."""
    proc = CoordinatorProcess(database_url, log_path=tmp_path / "coordinator.log")
    try:
        proc.start()
        yield proc
    finally:
        proc.close()


@pytest.fixture
def fleet(coordinator: CoordinatorProcess, tmp_path: Path) -> Iterator[Fleet]:
    """The test's group on the coordinator; every agent still running is killed afterwards."""
    fleet = Fleet(coordinator.address, GROUP, tmp_path, coordinator.log_path)
    try:
        yield fleet
    finally:
        fleet.close()
