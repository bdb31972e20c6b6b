"""Seed 003's five scenarios (KIP-415, `/work/shared/seeds/003_a57f00c211743318.txt`) end to end:
real classic agents (`ClassicAgent`, the agent's classic mode) with recording listeners, on a
real coordinator process, asserting Connect's behaviour (DESIGN 3.19, "Connect today" is
Connect's code). Line numbers are the seed file's.

The seed's resources AC0, AT1, AT2, BC0, BT1 are our connector A with tasks A-0, A-1 and
connector B with task B-0 (Connect numbers tasks from 0). The delay d is the group's
`scheduled.rebalance.max.delay.ms`, 1500 ms here. Timeouts are Connect's divided down: session
1000 ms, heartbeat 100 ms, rebalance 2000 ms.

None of these scenarios removes a member with a hold (DESIGN 3.19): workers leave with
LeaveGroup, which removes without one, or join; so all follow Connect's code and its delay.
Every test ends with the no-overlap check over every listener call of every worker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from connect_protocol.classic_messages import SyncGroupResponse
from tests.support.agents import wait_for
from tests.support.classic_agents import ClassicFleet, ClassicWorker
from tests.support.coordinator import CoordinatorProcess
from tests.support.pgcluster import create_database, drop_database

DELAY_MS = 1_500
CATALOGUE = {"A": 2, "B": 1}
ALL = {"A", "A-0", "A-1", "B", "B-0"}

#: The coordinator's classic flags for these tests: short sessions allowed, a short initial
#: join-phase delay, and Connect's delay as the group default.
CLASSIC_FLAGS = (
    "--classic-min-session-timeout-ms",
    "100",
    "--classic-initial-rebalance-delay-ms",
    "50",
    "--scheduled-rebalance-max-delay-ms",
    str(DELAY_MS),
)


@pytest.fixture(scope="module")
def classic_coordinator(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    """One coordinator process (and database) for the module; each test has its own group."""
    name = f"t_{uuid.uuid4().hex}"
    url = create_database(postgres_admin_url, name)
    log = Path(tmp_path_factory.mktemp("classic")) / "coordinator.log"
    proc = CoordinatorProcess(url, *CLASSIC_FLAGS, log_path=log)
    try:
        proc.start()
        yield proc
    finally:
        proc.close()
        drop_database(postgres_admin_url, name)


@pytest.fixture
def fleet(classic_coordinator: CoordinatorProcess) -> Iterator[ClassicFleet]:
    fleet = ClassicFleet(classic_coordinator.address, f"seed003-{uuid.uuid4().hex[:8]}")
    for name, tasks in CATALOGUE.items():
        fleet.put_connector(name, tasks)
    try:
        yield fleet
        fleet.assert_no_overlap()
    finally:
        fleet.close()


def syncs(worker: ClassicWorker, after: int = 0) -> list[SyncGroupResponse]:
    """The SyncGroup answers `worker` got that carried an assignment, from the `after`-th on."""
    return [s for s in worker.transport.sync_answers() if s.assignment is not None][after:]


def names(resources: object) -> set[str]:
    return set(resources.names()) if resources is not None else set()  # type: ignore[attr-defined]


def test_first_member_joins(fleet: ClassicFleet) -> None:
    """Lines 88-98: W1 joins an empty group with no assignment, becomes leader, and is sent
    everything with nothing revoked and no delay (line 97)."""
    w1 = fleet.start("W1")
    group = fleet.wait_stable()
    assert group.classic.leader_id == w1.member_id
    assert group.classic.protocol_name == "sessioned"
    [answer] = syncs(w1)
    assert answer.assignment is not None
    assert names(answer.assignment.assignment) == ALL
    assert names(answer.assignment.revoked) == set()
    assert answer.assignment.delay == 0
    assert w1.running() == ALL
