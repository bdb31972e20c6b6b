"""The gRPC server (grpc.aio, on a thread of its own): the coordinator, classic and admin services,
the standard health service and server reflection; and the message size options servers and
channels share. Stopping it first answers the parked classic calls NOT_COORDINATOR (they would
otherwise wait out the shutdown grace and be cut off)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from concurrent import futures
from typing import Any, TypeVar

import grpc
from connect.group.v1 import admin_pb2, classic_pb2, coordinator_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from connect_protocol.errors import ErrorCode
from connect_protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, channel_options

from ..core.principals import PrincipalMapper
from ..runtime.authorizer import Authorizer
from ..runtime.features import FeatureLevels
from ..runtime.groups import GroupManager
from ..runtime.quotas import PrincipalQuotas
from .aio import (
    AsyncAdminServicer,
    AsyncClassicServicer,
    AsyncCoordinatorServicer,
    UndecodableRequests,
    register,
)
from .classic_servicer import ClassicServicer
from .connection_age import DEFAULT_MAX_CONNECTION_AGE_GRACE_MS, connection_age_options
from .context import CallIdentity
from .revocation import RevocationList
from .servicers import AdminServicer, CoordinatorServicer
from .tls import ReloadingCredentials, ServerTls

T = TypeVar("T")

COORDINATOR_SERVICE = coordinator_pb2.DESCRIPTOR.services_by_name[
    "ConnectGroupCoordinator"
].full_name
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["ConnectGroupAdmin"].full_name
CLASSIC_SERVICE = classic_pb2.DESCRIPTOR.services_by_name["ConnectGroupClassic"].full_name
#: Health service names. Readiness (may this process get new traffic: the database answered
#: within a lease and the schema is this code's, `runtime.readiness`): the overall status "",
#: each service's name, and "readiness". Liveness ("liveness"): SERVING for as long as the gRPC
#: event loop answers; it never depends on the database, a group's lock or a pool thread.
READINESS_SERVICE = "readiness"
LIVENESS_SERVICE = "liveness"
READINESS_NAMES = ("", READINESS_SERVICE, COORDINATOR_SERVICE, CLASSIC_SERVICE, ADMIN_SERVICE)


class CoordinatorServer:
    """The coordinator's gRPC server: grpc.aio on an event loop of its own thread (so callers
    stay synchronous), with a pool of `max_workers` threads for calls that may block (`aio.py`);
    both services, health and reflection. Bound to `address` ("host:port"; port 0 picks one,
    see `port`) when built, with `tls` if given (client certificates required when it has a
    client CA; their principals from `principal_mapper`), plaintext otherwise; sends and
    accepts messages of up to `max_message_bytes`. `authorizer` None: everything allowed;
    `features`: the feature levels in force (None: read only when UpdateFeatures changes them).
    `max_connection_age_ms` (0: none) closes each connection that old, its calls in flight given
    `max_connection_age_grace_ms`; `tls.crl_file` revokes client certificates."""

    def __init__(
        self,
        manager: GroupManager,
        address: str,
        max_workers: int = 32,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        tls: ServerTls | None = None,
        principal_mapper: PrincipalMapper | None = None,
        authorizer: Authorizer | None = None,
        features: FeatureLevels | None = None,
        quotas: PrincipalQuotas | None = None,
        describe_config_values: bool = False,
        max_connection_age_ms: int = 0,
        max_connection_age_grace_ms: int = DEFAULT_MAX_CONNECTION_AGE_GRACE_MS,
    ) -> None:
        self.tls = ReloadingCredentials(tls, manager.metrics) if tls is not None else None
        mutual = tls is not None and tls.mutual
        self.revocations = (
            RevocationList(tls.crl_file, tls.client_ca_file)
            if tls is not None and tls.crl_file and mutual
            else None
        )
        # Without client certificates every caller is ANONYMOUS.
        self.identity = CallIdentity(
            principal_mapper or PrincipalMapper() if mutual else None, self.revocations
        )
        self.authorizer = authorizer
        # One copy of the feature levels for every service (UpdateFeatures refreshes it).
        self.features = features or FeatureLevels(manager.store.features)
        self.quotas = quotas
        self.describe_config_values = describe_config_values
        self.max_message_bytes = max_message_bytes
        self.max_connection_age_ms = max_connection_age_ms
        self.max_connection_age_grace_ms = max_connection_age_grace_ms
        self.parking = manager.parking
        options = [("grpc.so_reuseport", 0), *channel_options(max_message_bytes)]
        options += connection_age_options(max_connection_age_ms, max_connection_age_grace_ms)
        self._pool = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="grpc-loop", daemon=True
        )
        self._thread.start()
        try:
            self._server, self.port, self._health = self._on_loop(
                self._build(manager, address, options, interceptors)
            )
        except BaseException:
            self._close_loop()
            raise

    async def _build(
        self,
        manager: GroupManager,
        address: str,
        options: list[tuple[str, int]],
        interceptors: Sequence[grpc.aio.ServerInterceptor],
    ) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
        server = grpc.aio.server(interceptors=interceptors, options=options)
        undecodable = UndecodableRequests(manager.metrics)
        register(
            server,
            coordinator_pb2.DESCRIPTOR.services_by_name["ConnectGroupCoordinator"],
            coordinator_pb2,
            AsyncCoordinatorServicer(
                CoordinatorServicer(
                    manager, self.identity, self.authorizer, self.quotas, features=self.features
                ),
                self._pool,
            ),
            undecodable,
            self.identity,
            self.max_message_bytes,
        )
        register(
            server,
            classic_pb2.DESCRIPTOR.services_by_name["ConnectGroupClassic"],
            classic_pb2,
            AsyncClassicServicer(
                ClassicServicer(
                    manager,
                    self.identity,
                    self.authorizer,
                    self.quotas,
                    features=self.features,
                    max_connection_age_ms=self.max_connection_age_ms,
                    max_connection_age_grace_ms=self.max_connection_age_grace_ms,
                ),
                self._pool,
                manager.parking,
            ),
            undecodable,
            self.identity,
            self.max_message_bytes,
        )
        register(
            server,
            admin_pb2.DESCRIPTOR.services_by_name["ConnectGroupAdmin"],
            admin_pb2,
            AsyncAdminServicer(
                AdminServicer(
                    manager,
                    self.identity,
                    self.authorizer,
                    self.quotas,
                    describe_config_values=self.describe_config_values,
                    features=self.features,
                ),
                self._pool,
            ),
            undecodable,
            self.identity,
            self.max_message_bytes,
        )
        # Check is answered on the event loop from a dict: no lock, no thread, no database.
        health_servicer = health.aio.HealthServicer()
        for name in READINESS_NAMES:  # until the first readiness answer (`set_serving`)
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await health_servicer.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (
                COORDINATOR_SERVICE,
                CLASSIC_SERVICE,
                ADMIN_SERVICE,
                health.SERVICE_NAME,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        if self.tls is not None:
            port = server.add_secure_port(address, self.tls.credentials)
        else:
            port = server.add_insecure_port(address)
        if port == 0:
            raise RuntimeError(f"could not bind {address}")
        return server, port, health_servicer

    def _on_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def start(self) -> None:
        self._on_loop(self._server.start())

    def set_serving(self, serving: bool) -> None:
        """Readiness (every name of READINESS_NAMES): SERVING or NOT_SERVING. Liveness is not
        touched: it stays SERVING until the server stops."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )

        async def set_all() -> None:
            for service in READINESS_NAMES:
                await self._health.set(service, status)

        self._on_loop(set_all())

    def stop(self, grace_s: float | None) -> None:
        """Refuse new calls, let calls in flight finish for up to `grace_s` seconds (None: none),
        cancel the rest, and stop the loop and the pool (a pool thread still in a call finishes
        it; its answer goes nowhere). Parked classic calls are answered NOT_COORDINATOR first,
        and so is any call that would park from then on."""
        self.parking.close(
            ErrorCode.NOT_COORDINATOR,
            "this coordinator is shutting down; find the group's coordinator and retry.",
        )
        try:
            self._on_loop(self._server.stop(grace_s))
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
