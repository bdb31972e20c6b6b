"""Real coordinators for tests: in-process (GroupManager + gRPC server on 127.0.0.1) and as a
subprocess (`coordinator-svc serve`) that tests can SIGKILL, SIGSTOP or SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from connect.group.v1 import admin_pb2_grpc, coordinator_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from connect_protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, channel_options
from coordinator_svc.core.model import GroupConfigDefaults
from coordinator_svc.core.principals import PrincipalMapper
from coordinator_svc.grpc_api.server import CoordinatorServer
from coordinator_svc.grpc_api.tls import ServerTls
from coordinator_svc.runtime.authorizer import Authorizer
from coordinator_svc.runtime.features import FeatureLevels
from coordinator_svc.runtime.groups import GroupManager
from coordinator_svc.runtime.quotas import PrincipalQuotas
from coordinator_svc.store import SqlStore

REPO = Path(__file__).resolve().parents[2]

FAST_DEFAULTS = GroupConfigDefaults(
    session_timeout_ms=3_000,
    heartbeat_interval_ms=200,
    rebalance_timeout_ms=5_000,
    scheduled_rebalance_max_delay_ms=2_000,
    assignment_error_backoff_ms=100,
    # A computation at every epoch bump, as before assignment batching (DESIGN 3.21); tests of
    # batching set the interval themselves.
    assignment_interval_ms=0,
)


#: The environment of a child process that imports this checkout (and its generated code).
CHILD_ENV = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}"}


def run_cli(*args: str, cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`coordinator-svc ARGS...` as a child process of this checkout, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "coordinator_svc.cli", *args],
        cwd=cwd,
        env=CHILD_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Stubs:
    def __init__(self, address: str, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(address, options=channel_options(max_message_bytes))
        self.coordinator = coordinator_pb2_grpc.ConnectGroupCoordinatorStub(self.channel)
        self.admin = admin_pb2_grpc.ConnectGroupAdminStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def close(self) -> None:
        self.channel.close()


class InProcessCoordinator:
    """A coordinator in this process, on a real gRPC server bound to 127.0.0.1."""

    def __init__(
        self,
        database_url: str,
        defaults: GroupConfigDefaults = FAST_DEFAULTS,
        lease_ms: int = 5_000,
        node_id: str | None = None,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        tls: ServerTls | None = None,
        principal_mapper: PrincipalMapper | None = None,
        authorization: bool = False,
        super_users: Sequence[str] = (),
        acl_refresh_s: float = 0.2,
        denial_interval_s: float = 60.0,
        max_connection_age_ms: int = 0,
        max_connection_age_grace_ms: int = 30_000,
        quotas: PrincipalQuotas | None = None,
    ) -> None:
        """`tls`: serve TLS (mTLS with a client CA), else plaintext; `authorization`: ACLs
        deny by default (`self.authorizer`, refreshed every `acl_refresh_s`)."""
        self.database_url = database_url
        self.node_id = node_id or f"test-{uuid.uuid4().hex[:6]}"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.store = SqlStore(
            database_url, owner_id=self.node_id, advertised_address=self.address, lease_ms=lease_ms
        )
        self.store.migrate()
        self.manager = GroupManager(self.store, defaults)
        self.features = FeatureLevels(self.store.features)
        self.authorizer = Authorizer(
            self.store.acls,
            self.manager.metrics,
            enabled=authorization,
            super_users=super_users,
            refresh_s=acl_refresh_s,
            denial_interval_s=denial_interval_s,
            refreshers={"the feature levels": self.features.refresh},
        )
        self.server = CoordinatorServer(
            self.manager,
            self.address,
            max_workers=16,
            max_message_bytes=defaults.max_message_bytes,
            interceptors=interceptors,
            tls=tls,
            principal_mapper=principal_mapper,
            authorizer=self.authorizer,
            features=self.features,
            max_connection_age_ms=max_connection_age_ms,
            max_connection_age_grace_ms=max_connection_age_grace_ms,
            quotas=quotas,
        )
        self.tls = tls
        self.stubs: Stubs | None = None

    def __enter__(self) -> InProcessCoordinator:
        self.authorizer.start()
        self.manager.start()
        self.server.start()
        self.server.set_serving(True)
        if self.tls is None:
            self.stubs = Stubs(self.address)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.stubs is not None:
            self.stubs.close()
        self.server.stop(None)
        self.authorizer.stop()
        self.manager.stop()
        self.store.close()


class CoordinatorProcess:
    """`coordinator-svc serve` as a child process on 127.0.0.1."""

    def __init__(
        self,
        database_url: str,
        *extra: str,
        node_id: str | None = None,
        log_path: Path | None = None,
        port: int | None = None,
    ) -> None:
        self.database_url = database_url
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.node_id = node_id or f"proc-{uuid.uuid4().hex[:6]}"
        self.args = [
            sys.executable,
            "-m",
            "coordinator_svc.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--database-url",
            database_url,
            "--node-id",
            self.node_id,
            "--session-timeout-ms",
            str(FAST_DEFAULTS.session_timeout_ms),
            "--heartbeat-interval-ms",
            str(FAST_DEFAULTS.heartbeat_interval_ms),
            "--rebalance-timeout-ms",
            str(FAST_DEFAULTS.rebalance_timeout_ms),
            "--scheduled-rebalance-max-delay-ms",
            str(FAST_DEFAULTS.scheduled_rebalance_max_delay_ms),
            "--assignment-interval-ms",
            str(FAST_DEFAULTS.assignment_interval_ms),
            *extra,
        ]
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def start(self, timeout_s: float = 30.0, wait: bool = True) -> CoordinatorProcess:
        """Start it and (`wait`) wait until its plaintext health check says SERVING; a TLS
        server is waited for by the caller, with its own credentials."""
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}"}
        self._log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.args, cwd=REPO, env=env, stdout=self._log, stderr=self._log
        )
        if wait:
            self.wait_serving(timeout_s)
        return self

    def wait_serving(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        stubs = Stubs(self.address)
        try:
            while time.monotonic() < deadline:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"coordinator exited with {self.proc.returncode}; log: {self.log_path}"
                    )
                try:
                    resp = stubs.health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if resp.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        finally:
            stubs.close()
        raise RuntimeError(f"coordinator on {self.address} not serving after {timeout_s}s")

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout_s: float = 20.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.kill()
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
