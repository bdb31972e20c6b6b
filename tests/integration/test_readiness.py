"""Readiness and liveness of a real `coordinator-svc serve` on real PostgreSQL, one test per
transition: a database outage shorter than the lease keeps readiness SERVING; a longer one turns
it NOT_SERVING and it comes back by itself; a schema ahead of or behind the code is NOT_SERVING
and back; liveness stays SERVING throughout, also while every pool thread is stuck on the
database; `--wait-for-schema` waits for a migration, and gives up after its timeout.

The database is cut off by a TCP proxy in front of PostgreSQL (`tests/support/tcp_proxy.py`).
Leases are scaled down (a few seconds) so that each test takes seconds."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2
from sqlalchemy.engine import make_url

from coordinator_svc.store.migrate import code_revisions
from tests.support.client import put_connector
from tests.support.coordinator import REPO, CoordinatorProcess, Stubs
from tests.support.pgcluster import libpq_url
from tests.support.tcp_proxy import CutMode, TcpProxy

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEAD = code_revisions()[0]  # this code's head: what "at head" means
LEASE_MS = 4_000  # probe every 1.33 s (every 0.4 s while failing), evaluated every 0.4 s
ENV = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}"}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coordinator_svc.cli", *args],
        cwd=REPO,
        env=env or ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )


def migrate(url: str) -> None:
    result = cli("migrate", "--database-url", url)
    assert result.returncode == 0, result.stderr


def stamp(url: str, revision: str) -> None:
    """Rewrite alembic_version as a migration (newer, or a downgrade) would leave it."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("UPDATE alembic_version SET version_num = %s", (revision,))


def via(proxy: TcpProxy, url: str) -> str:
    return make_url(url).set(host="127.0.0.1", port=proxy.port).render_as_string(False)


def upstream(url: str) -> str:
    parsed = make_url(url)
    return f"{parsed.host or '127.0.0.1'}:{parsed.port or 5432}"


def check(stubs: Stubs, service: str) -> tuple[int | str, float]:
    """The status of `service` (or the gRPC error code's name) and how long the answer took."""
    started = time.monotonic()
    try:
        status: int | str = stubs.health.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=1.0
        ).status
    except grpc.RpcError as error:
        status = error.code().name
    return status, time.monotonic() - started


@dataclass
class Sample:
    at: float
    status: int | str
    latency: float


class Sampler:
    """Checks one health name every `every_s` on a thread of its own, keeping every answer."""

    def __init__(self, address: str, service: str, every_s: float = 0.1) -> None:
        self.stubs = Stubs(address)
        self.service = service
        self.every_s = every_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.stubs.close()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            status, latency = check(self.stubs, self.service)
            self.samples.append(Sample(time.monotonic(), status, latency))

    def between(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.at <= end]


def wait_for(
    stubs: Stubs, service: str, status: int, timeout_s: float, interval_s: float = 0.1
) -> float:
    """Poll until `service` reports `status`; the time it did."""
    deadline = time.monotonic() + timeout_s
    last: int | str | None = None
    while time.monotonic() < deadline:
        last, _ = check(stubs, service)
        if last == status:
            return time.monotonic()
        time.sleep(interval_s)
    raise AssertionError(f"{service!r} still {last} after {timeout_s} s, not {status}")


def log_lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()


def grep(path: Path, *words: str) -> list[str]:
    return [line for line in log_lines(path) if all(w in line for w in words)]


def wait_for_log(path: Path, *words: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = grep(path, *words) if path.exists() else []
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no log line with {words} after {timeout_s} s in {path}")


@pytest.fixture
def proxied(database_url: str, tmp_path: Path) -> Iterator[tuple[CoordinatorProcess, TcpProxy]]:
    """A coordinator (lease LEASE_MS, two pool threads) whose every database connection goes
    through a proxy the test can cut, its log in tmp_path/coordinator.log."""
    migrate(database_url)
    with TcpProxy(upstream(database_url)) as proxy:
        coordinator = CoordinatorProcess(
            via(proxy, database_url),
            "--lease-ms",
            str(LEASE_MS),
            "--max-workers",
            "2",
            "--no-migrate",
            log_path=tmp_path / "coordinator.log",
        )
        try:
            coordinator.start()
            yield coordinator, proxy
        finally:
            coordinator.close()


def settle() -> None:
    time.sleep(2 * LEASE_MS / 3000 + 0.2)  # two probes answered since the start


def test_an_outage_shorter_than_the_lease_keeps_readiness_serving(
    proxied: tuple[CoordinatorProcess, TcpProxy], tmp_path: Path
) -> None:
    coordinator, proxy = proxied
    settle()
    with (
        Sampler(coordinator.address, "") as overall,
        Sampler(coordinator.address, "readiness") as readiness,
        Sampler(coordinator.address, "liveness") as liveness,
    ):
        time.sleep(0.3)
        cut_at = time.monotonic()
        proxy.cut("refuse")
        time.sleep(0.5)
        # A blip that a probe saw (one runs every 1.33 s): well inside the lease (4 s), even
        # counted from the last answer before it.
        wait_for_log(tmp_path / "coordinator.log", "database probe failed", timeout_s=2.0)
        proxy.restore()
        assert time.monotonic() - cut_at < 2.0
        time.sleep(LEASE_MS / 1000 + 1.0)  # past the point where a longer one would have shown
    log = tmp_path / "coordinator.log"
    for sampler in (overall, readiness, liveness):
        statuses = {s.status for s in sampler.samples}
        assert statuses == {SERVING}, (sampler.service, statuses)
        assert len(sampler.samples) > 30
    assert len(grep(log, "database probe failed")) == 1  # once per outage
    assert len(grep(log, "database answers again")) == 1
    assert not grep(log, "NOT_SERVING")


@pytest.mark.parametrize("mode", ["refuse", "freeze"])
def test_a_longer_outage_turns_readiness_not_serving_and_back_by_itself(
    proxied: tuple[CoordinatorProcess, TcpProxy], tmp_path: Path, mode: CutMode
) -> None:
    """`refuse`: every database call fails at once; `freeze`: they hang (a partition), so the
    probe itself is stuck and pool threads with it. Liveness answers at once throughout."""
    coordinator, proxy = proxied
    settle()
    stubs = Stubs(coordinator.address)
    stuck: list[threading.Thread] = []
    try:
        with Sampler(coordinator.address, "liveness") as liveness:
            cut_at = time.monotonic()
            proxy.cut(mode)
            if mode == "freeze":
                # Keep both pool threads busy on the database: a busy process, not a dead one.
                for i in range(4):
                    thread = threading.Thread(
                        target=lambda i=i: _put_connector(stubs, f"g{i}"), daemon=True
                    )
                    thread.start()
                    stuck.append(thread)
            # Not before the lease, counted from the last probe that answered (at most a probe
            # interval before the cut).
            time.sleep(LEASE_MS / 1000 - LEASE_MS / 3000 - 0.5)
            assert check(stubs, "")[0] == SERVING
            down_at = wait_for(stubs, "", NOT_SERVING, timeout_s=LEASE_MS / 1000 + 2.0)
            assert down_at - cut_at > LEASE_MS / 1000 - LEASE_MS / 3000 - 0.2
            for name in ("readiness", "connect.group.v1.ConnectGroupCoordinator"):
                assert check(stubs, name)[0] == NOT_SERVING
            time.sleep(1.0)  # it stays down while the database does
            assert check(stubs, "readiness")[0] == NOT_SERVING
            proxy.restore()
            back_at = wait_for(stubs, "", SERVING, timeout_s=LEASE_MS / 1000 + 2.0)
            assert check(stubs, "readiness")[0] == SERVING
        statuses = {s.status for s in liveness.samples}
        assert statuses == {SERVING}, statuses
        # Answered from the event loop: no sample waited for the database or a pool thread.
        assert max(s.latency for s in liveness.samples) < 0.9
        assert len(liveness.between(cut_at, back_at)) > 20
    finally:
        stubs.close()
    log = tmp_path / "coordinator.log"
    down = grep(log, "readiness NOT_SERVING")
    assert len(down) == 1, down  # logged once, however long it lasts
    assert '"level":"warning"' in down[0]
    assert "database unreachable for" in down[0] and f"> lease {LEASE_MS / 1000:g} s" in down[0]
    assert len(grep(log, "readiness SERVING again")) == 1


def _put_connector(stubs: Stubs, group: str) -> None:
    with contextlib.suppress(grpc.RpcError):  # it may time out: the database is frozen
        put_connector(stubs, group, "c", 1)


@pytest.fixture
def direct(database_url: str, tmp_path: Path) -> Iterator[tuple[CoordinatorProcess, str]]:
    """A coordinator (lease 1.5 s: the schema is read every 0.5 s) on a migrated database."""
    migrate(database_url)
    coordinator = CoordinatorProcess(
        database_url, "--lease-ms", "1500", "--no-migrate", log_path=tmp_path / "coordinator.log"
    )
    try:
        coordinator.start()
        yield coordinator, database_url
    finally:
        coordinator.close()


@pytest.mark.parametrize(
    ("revision", "words"),
    [
        ("9999_future", f"schema at 9999_future, code expects {HEAD} (a newer release"),
        ("0003", f"schema at 0003, code expects {HEAD} (run `coordinator-svc migrate`)"),
    ],
    ids=["ahead", "behind"],
)
def test_a_schema_ahead_or_behind_is_not_serving_and_back(
    direct: tuple[CoordinatorProcess, str], tmp_path: Path, revision: str, words: str
) -> None:
    coordinator, url = direct
    stubs = Stubs(coordinator.address)
    try:
        with Sampler(coordinator.address, "liveness") as liveness:
            stamp(url, revision)
            wait_for(stubs, "", NOT_SERVING, timeout_s=5)
            assert check(stubs, "readiness")[0] == NOT_SERVING
            stamp(url, HEAD)
            wait_for(stubs, "", SERVING, timeout_s=5)
        assert {s.status for s in liveness.samples} == {SERVING}
        assert coordinator.proc is not None and coordinator.proc.poll() is None
    finally:
        stubs.close()
    down = grep(tmp_path / "coordinator.log", "readiness NOT_SERVING")
    assert len(down) == 1 and words in down[0], down
    assert len(grep(tmp_path / "coordinator.log", "readiness SERVING again")) == 1


def test_serve_starts_on_a_newer_schema_not_serving_unless_allowed(
    database_url: str, tmp_path: Path
) -> None:
    """A newer release migrated the database (a rolling upgrade, or a rollback): `serve` does not
    try to migrate it nor crash; it starts with readiness NOT_SERVING and says why, unless
    --allow-newer-schema."""
    migrate(database_url)
    stamp(database_url, "9999_future")
    log = tmp_path / "coordinator.log"
    coordinator = CoordinatorProcess(database_url, "--lease-ms", "1500", log_path=log)
    allowed = CoordinatorProcess(
        database_url,
        "--lease-ms",
        "1500",
        "--allow-newer-schema",
        log_path=tmp_path / "allowed.log",
    )
    try:
        coordinator.start(wait=False)
        stubs = Stubs(coordinator.address)
        wait_for(stubs, "liveness", SERVING, timeout_s=30)
        time.sleep(1.0)
        assert check(stubs, "")[0] == NOT_SERVING
        assert check(stubs, "readiness")[0] == NOT_SERVING
        assert grep(log, "schema at 9999_future", "starting without migrating")
        assert grep(log, f"schema at 9999_future, code expects {HEAD}", "readiness NOT_SERVING")
        allowed.start()  # waits for "" SERVING
        assert grep(tmp_path / "allowed.log", f"newer than {HEAD} (accepted)", "readiness SERVING")
        # Once the code and the schema agree, it is SERVING by itself.
        stamp(database_url, HEAD)
        wait_for(stubs, "", SERVING, timeout_s=5)
        stubs.close()
        assert coordinator.terminate() == 0
        assert allowed.terminate() == 0
    finally:
        coordinator.close()
        allowed.close()


def test_wait_for_schema_waits_for_the_migration_then_starts(
    database_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "coordinator.log"
    coordinator = CoordinatorProcess(
        database_url, "--lease-ms", "1500", "--wait-for-schema", log_path=log
    )
    try:
        coordinator.start(wait=False)
        stubs = Stubs(coordinator.address)
        waiting = wait_for_log(log, "waiting for the schema", timeout_s=30)
        assert "never migrated" in waiting and "no time limit" in waiting
        time.sleep(1.5)
        assert coordinator.proc is not None and coordinator.proc.poll() is None
        assert check(stubs, "liveness")[0] == "UNAVAILABLE"  # not listening while it waits
        migrate(database_url)
        coordinator.wait_serving(timeout_s=15)
        assert check(stubs, "readiness")[0] == SERVING
        assert check(stubs, "liveness")[0] == SERVING
        assert grep(log, "starting after waiting")
        assert not grep(log, "Running upgrade")  # serve itself migrated nothing
        stubs.close()
        assert coordinator.terminate() == 0
    finally:
        coordinator.close()


def test_wait_for_schema_gives_up_after_its_timeout(database_url: str) -> None:
    """The timeout from the environment (WAIT_FOR_SCHEMA=seconds), as a manifest sets it."""
    started = time.monotonic()
    result = cli(
        "serve",
        "--database-url",
        database_url,
        "--port",
        "0",
        env={**ENV, "WAIT_FOR_SCHEMA": "2"},
    )
    took = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert "gave up waiting for the schema after 2 s" in result.stderr
    assert "never migrated" in result.stderr
    assert "Traceback" not in result.stderr
    assert 2.0 <= took < 15
    assert "waiting for the schema" in result.stderr  # the log lines while it waited


def test_wait_for_schema_is_documented_and_checked() -> None:
    help_text = " ".join(cli("serve", "--help").stdout.split())
    for words in ("--wait-for-schema [SECONDS]", "WAIT_FOR_SCHEMA", "--allow-newer-schema"):
        assert words in help_text
    bad = cli("serve", "--wait-for-schema=soon")
    assert bad.returncode == 2 and "--wait-for-schema" in bad.stderr
    assert "Traceback" not in bad.stderr
