"""Build the gRPC server: both services, the standard health service and server reflection."""

from __future__ import annotations

from concurrent import futures

import grpc
from connect.group.v1 import admin_pb2, admin_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..runtime.groups import GroupManager
from .servicers import AdminServicer, CoordinatorServicer

COORDINATOR_SERVICE = coordinator_pb2.DESCRIPTOR.services_by_name[
    "ConnectGroupCoordinator"
].full_name
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["ConnectGroupAdmin"].full_name


def create_server(
    manager: GroupManager, address: str, max_workers: int = 32
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """A server bound to `address` ("host:port"; port 0 picks one). Returns (server, port,
    health servicer); the caller starts it and sets health to SERVING."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        options=[("grpc.so_reuseport", 0)],
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
