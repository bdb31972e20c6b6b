"""Build the gRPC server: both services, the standard health service and server reflection."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures

import grpc
from connect.group.v1 import admin_pb2, admin_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..core.model import DEFAULT_MAX_MESSAGE_BYTES
from ..runtime.groups import GroupManager
from .servicers import AdminServicer, CoordinatorServicer

COORDINATOR_SERVICE = coordinator_pb2.DESCRIPTOR.services_by_name[
    "ConnectGroupCoordinator"
].full_name
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["ConnectGroupAdmin"].full_name

#: gRPC keeps message lengths in a signed 32-bit int.
MAX_GRPC_MESSAGE_BYTES = 2**31 - 1


def channel_options(
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> list[tuple[str, int]]:
    """gRPC options that set both the send and the receive limit to `max_message_bytes`, for a
    server or a channel (gRPC's own defaults are 4 MiB received, unlimited sent)."""
    if not 0 < max_message_bytes <= MAX_GRPC_MESSAGE_BYTES:
        raise ValueError(
            f"max_message_bytes must be between 1 and {MAX_GRPC_MESSAGE_BYTES}, "
            f"not {max_message_bytes}"
        )
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def create_server(
    manager: GroupManager,
    address: str,
    max_workers: int = 32,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    interceptors: Sequence[grpc.ServerInterceptor] = (),
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """A server bound to `address` ("host:port"; port 0 picks one) that sends and accepts
    messages of up to `max_message_bytes`. Returns (server, port, health servicer); the caller
    starts it and sets health to SERVING."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        interceptors=interceptors,
        options=[("grpc.so_reuseport", 0), *channel_options(max_message_bytes)],
    )
    coordinator_pb2_grpc.add_ConnectGroupCoordinatorServicer_to_server(
        CoordinatorServicer(manager), server
    )
    admin_pb2_grpc.add_ConnectGroupAdminServicer_to_server(AdminServicer(manager), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (COORDINATOR_SERVICE, ADMIN_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = server.add_insecure_port(address)
    if port == 0:
        raise RuntimeError(f"could not bind {address}")
    return server, port, health_servicer


def set_serving(health_servicer: health.HealthServicer, serving: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for service in ("", COORDINATOR_SERVICE, ADMIN_SERVICE):
        health_servicer.set(service, status)
