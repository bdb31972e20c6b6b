"""A database outage shorter than the lease (issue 24 item 3, DESIGN 3.16 and 3.21), made with a
TCP proxy between the coordinator and PostgreSQL that the test cuts (connections closed, new ones
refused: what a stopped server looks like) and restores: steady heartbeats go on being answered
from memory, a write during it is refused alone (its change taken back, the group served on), and
the lease survives with its token."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import make_url

from tests.integration.test_lease_starvation import event_of, lease_row
from tests.integration.test_ownership_grpc import GROUP, stable_group
from tests.support.client import ScriptedWorker, describe, put_connector
from tests.support.coordinator import InProcessCoordinator
from tests.support.tcp_proxy import TcpProxy

LEASE_MS = 5_000
OUTAGE_S = 3.0
COORDINATOR_NOT_AVAILABLE = 15


@pytest.fixture
def proxied(database_url: str) -> Iterator[tuple[TcpProxy, InProcessCoordinator]]:
    url = make_url(database_url)
    with TcpProxy(f"{url.host}:{url.port or 5432}") as proxy:
        through = url.set(host="127.0.0.1", port=proxy.port).render_as_string(False)
        with InProcessCoordinator(through, lease_ms=LEASE_MS) as c:
            yield proxy, c


class SteadyHeartbeats:
    """Every worker heartbeats every 100 ms on a thread of its own; every answer is kept."""

    def __init__(self, workers: list[ScriptedWorker]) -> None:
        self.codes: list[int] = []
        self.answered_at: list[float] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(w,)) for w in workers]

    def _run(self, worker: ScriptedWorker) -> None:
        while not self._stop.wait(0.1):
            self.codes.append(worker.heartbeat().error_code)
            self.answered_at.append(time.monotonic())

    def __enter__(self) -> SteadyHeartbeats:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)


@pytest.mark.parametrize("write", [True, False], ids=["a write during it", "no write"])
def test_an_outage_shorter_than_the_lease_refuses_only_the_write_and_keeps_the_lease(
    proxied: tuple[TcpProxy, InProcessCoordinator],
    caplog: pytest.LogCaptureFixture,
    write: bool,
) -> None:
    proxy, c = proxied
    assert c.stubs is not None
    database_url = c.database_url.replace(f":{proxy.port}/", f":{proxy.upstream[1]}/")
    workers = stable_group(c.stubs, ("W1", "W2", "W3"))
    owner, token, _until = lease_row(database_url, GROUP)
    refused: list[Any] = []
    with caplog.at_level(logging.INFO, logger="coordinator"), SteadyHeartbeats(workers) as beats:
        time.sleep(0.5)
        proxy.cut("refuse")
        cut_at = time.monotonic()
        time.sleep(1.0)
        if write:
            refused.append(put_connector(c.stubs, GROUP, "C", 1))
        time.sleep(OUTAGE_S - (time.monotonic() - cut_at))
        proxy.restore()
        restored_at = time.monotonic()
        time.sleep(1.5)  # renewal retried, steady heartbeats go on
    assert beats.codes and set(beats.codes) == {0}, "a steady heartbeat was refused"
    during = [t for t in beats.answered_at if cut_at + 0.2 < t < restored_at]
    assert len(during) >= 3 * 10 * (OUTAGE_S - 1), "steady heartbeats were held up"
    assert lease_row(database_url, GROUP)[:2] == (owner, token), "the lease ended"
    assert c.manager.owned_group_ids() == [GROUP]
    events = [event_of(r) for r in caplog.records]
    assert "group_dropped" not in events and "group_loaded" not in events, events
    if write:
        assert [r.error_code for r in refused] == [COORDINATOR_NOT_AVAILABLE]
        assert "could not persist the change" in refused[0].error_message
        assert events.count("commit_failed") == 1
        # Nothing of it stayed; the client's retry goes through.
        assert sorted(x.name for x in describe(c.stubs, GROUP).catalogue) == ["A", "B"]
        assert put_connector(c.stubs, GROUP, "C", 1).error_code == 0
        assert sorted(x.name for x in describe(c.stubs, GROUP).catalogue) == ["A", "B", "C"]
    else:
        assert "commit_failed" not in events
