"""Prometheus metrics of the coordinator, served on --metrics-port."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .core.model import GroupStatus

GroupCounts = Callable[[], tuple[dict[GroupStatus, int], int]]


class _GroupCollector(Collector):
    def __init__(self, counts: GroupCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        by_state, members = self._counts()
        groups = GaugeMetricFamily(
            "coordinator_groups", "Groups this process owns, by state.", labels=["state"]
        )
        for status in GroupStatus:
            groups.add_metric([status.value], by_state.get(status, 0))
        yield groups
        yield GaugeMetricFamily(
            "coordinator_members", "Members of the groups this process owns.", value=members
        )


class Metrics:
    """Every metric the coordinator exports, on its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.rebalances = Counter(
            "coordinator_rebalances",
            "Group epoch bumps, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.assignment_computations = Counter(
            "coordinator_assignment_computations",
            "Target assignments installed or failed, by result.",
            ["result"],
            registry=self.registry,
        )
        self.heartbeat_latency = Histogram(
            "coordinator_heartbeat_latency_seconds",
            "Time to handle a ConnectGroupHeartbeat.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.commit_batch = Histogram(
            "coordinator_commit_batch_requests",
            "State-changing requests committed together in one transaction (group commit).",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=self.registry,
        )
        self.undecodable = Counter(
            "coordinator_undecodable_requests",
            "Requests whose body is not a valid protobuf message of their RPC (refused with "
            "INVALID_ARGUMENT), by RPC.",
            ["rpc"],
            registry=self.registry,
        )
        self.authorization_denials = Counter(
            "coordinator_authorization_denials",
            "Calls refused by authorization (no ACL allows, one denies, or an id bound to "
            "another principal), by RPC and operation.",
            ["rpc", "operation"],
            registry=self.registry,
        )
        self.unauthenticated = Counter(
            "coordinator_unauthenticated_requests",
            "Calls refused with UNAUTHENTICATED: a client certificate that the principal "
            "mapping rules cannot turn into a principal.",
            registry=self.registry,
        )
        self.tls_reloads = Counter(
            "coordinator_tls_reloads",
            "Times the server's certificate files changed and were loaded again.",
            registry=self.registry,
        )
        self.errors = Counter(
            "coordinator_errors",
            "Responses with a non-zero error code, by RPC and code.",
            ["rpc", "code"],
            registry=self.registry,
        )

        self.ready = Gauge(
            "coordinator_ready",
            "1 while readiness is SERVING (the database answered within a lease and the schema "
            "is this code's), else 0.",
            registry=self.registry,
        )
        self.database_unanswered = Gauge(
            "coordinator_database_unanswered_seconds",
            "Seconds since the database last answered this process's readiness probe.",
            registry=self.registry,
        )

    def observe_readiness(self, serving: bool, unanswered_s: float) -> None:
        self.ready.set(1 if serving else 0)
        self.database_unanswered.set(max(0.0, unanswered_s))

    def watch_groups(self, counts: GroupCounts) -> None:
        self.registry.register(_GroupCollector(counts))

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        start_http_server(port, addr=host, registry=self.registry)
