"""The agent backs off when a call fails with RESOURCE_EXHAUSTED (a message over the size limit).

A real `Agent` against a real coordinator (in-process, gRPC on 127.0.0.1, PostgreSQL) whose
`max_message_bytes` is too small for the group's PrepareAssignment answer (the catalogue), while
heartbeats still fit: the agent is selected to compute, and every PrepareAssignment fails. Without
a backoff, each failure reports the computation done, which heartbeats at once, is asked to compute
again and fails again: hundreds of calls a second. The test counts the calls the server saw.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import grpc
import pytest
from connect.group.v1 import admin_pb2

from tests.support.coordinator import FAST_DEFAULTS, InProcessCoordinator
from worker_agent.assignors import assignors_for_protocol
from worker_agent.listener import CallbackListener, RebalanceEvent
from worker_agent.runtime import Agent, AgentSettings

GROUP = "too-large"
PREPARE = "/connect.group.v1.ConnectGroupCoordinator/ConnectGroupPrepareAssignment"
HEARTBEAT = "/connect.group.v1.ConnectGroupCoordinator/ConnectGroupHeartbeat"
#: Heartbeats (about 60 bytes) and each PutConnector below (about 620) fit; the catalogue of six
#: connectors in a PrepareAssignment answer (about 3.7 KB) does not.
LIMIT = 2048
WINDOW_S = 3.0
#: Hundreds of attempts in the window without a backoff; a handful with one (0.2 s doubling).
MAX_ATTEMPTS_IN_WINDOW = 20


class CountingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Counts every call the server receives, by method."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        with self._lock:
            self._counts[handler_call_details.method] += 1
        return await continuation(handler_call_details)

    def count(self, method: str) -> int:
        with self._lock:
            return self._counts[method]


def _ignore(_event: RebalanceEvent) -> None:
    pass


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def coordinator(database_url: str) -> Iterator[tuple[InProcessCoordinator, CountingInterceptor]]:
    counter = CountingInterceptor()
    # The catalogue is put while the limit is the default (a coordinator with the small limit
    # refuses a connector its Prepare answer could not carry); then the limit is lowered, as an
    # operator restarting with a smaller --max-message-bytes would.
    with InProcessCoordinator(database_url) as setup:
        assert setup.stubs is not None
        # Many connectors with long names: a Prepare answer carries names and task counts
        # only (never configs), so that is what makes it large.
        for i in range(80):
            resp = setup.stubs.admin.PutConnector(
                admin_pb2.PutConnectorRequest(
                    group_id=GROUP,
                    connector=f"connector-with-a-rather-long-name-{i:02d}",
                    task_count=1,
                ),
                timeout=5,
            )
            assert resp.error_code == 0, resp.error_message
    defaults = dataclasses.replace(FAST_DEFAULTS, max_message_bytes=LIMIT)
    with InProcessCoordinator(database_url, defaults, interceptors=[counter]) as coord:
        yield coord, counter


def test_prepare_assignment_over_the_size_limit_is_retried_with_backoff_not_in_a_loop(
    coordinator: tuple[InProcessCoordinator, CountingInterceptor],
    caplog: pytest.LogCaptureFixture,
) -> None:
    coord, counter = coordinator
    settings = AgentSettings(
        group_id=GROUP,
        member_id="worker-1",
        coordinators=(coord.address,),
        assignors=tuple(assignors_for_protocol("sessioned")),
        rebalance_timeout_ms=FAST_DEFAULTS.rebalance_timeout_ms,
        rpc_timeout_s=2.0,
    )
    agent = Agent(settings, CallbackListener(on_revoked=_ignore, on_assigned=_ignore))
    thread = threading.Thread(target=agent.run, name="agent", daemon=True)
    caplog.set_level(logging.DEBUG, logger="worker_agent")
    thread.start()
    try:
        wait_until(lambda: counter.count(PREPARE) >= 1, 15.0, "the first PrepareAssignment")
        before = counter.count(PREPARE)
        time.sleep(WINDOW_S)
        attempts = counter.count(PREPARE) - before
        heartbeats = counter.count(HEARTBEAT)
    finally:
        agent.stop()
        thread.join(20)
    assert not thread.is_alive(), "the agent did not stop"
    assert heartbeats > 0  # heartbeats fit the limit and went on meanwhile
    assert 1 <= attempts < MAX_ATTEMPTS_IN_WINDOW, (
        f"{attempts} PrepareAssignment calls in {WINDOW_S} s: retried without backing off"
    )
    too_large = [r for r in caplog.records if "exceeded the gRPC message size limit" in r.message]
    assert len(too_large) == 1, [r.message for r in too_large]  # once, not once per retry
    assert "ConnectGroupPrepareAssignment" in too_large[0].message
    assert "--max-message-bytes" in too_large[0].message
    assert too_large[0].levelno == logging.ERROR
