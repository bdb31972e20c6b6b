"""Prometheus metrics of the coordinator, served on --metrics-port."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .core.model import GroupStatus

#: The states of a group whose rebalance has not finished.
UNSETTLED = (GroupStatus.ASSIGNING, GroupStatus.RECONCILING)
#: The `change` label of coordinator_group_lease_changes_total.
LEASE_CHANGES = ("acquired", "lost", "released")
#: The `rpc` label of coordinator_rpc_latency_seconds whose series is also exported under its
#: older name, coordinator_heartbeat_latency_seconds.
HEARTBEAT_RPC = "ConnectGroupHeartbeat"
#: Buckets of coordinator_rpc_latency_seconds (seconds): steady heartbeats take a few hundred
#: microseconds, a Prepare or Install of a group of 10,000 members about a second.
RPC_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


@dataclass(frozen=True, slots=True)
class GroupStats:
    """What one scrape reports of the groups this process owns (`GroupManager.group_stats`).

    Attributes:
        by_state: how many groups are in each state.
        members: the members of all of them.
        oldest_rebalance_s: for ASSIGNING and RECONCILING, the longest time in seconds a group
            has been in that state (absent: no group is).
        oldest_rebalance_timeouts: the same in multiples of each group's rebalance timeout,
            the largest among the groups in that state.
    """

    by_state: Mapping[GroupStatus, int] = field(default_factory=dict)
    members: int = 0
    oldest_rebalance_s: Mapping[GroupStatus, float] = field(default_factory=dict)
    oldest_rebalance_timeouts: Mapping[GroupStatus, float] = field(default_factory=dict)
    #: Stored resource statuses by state (DESIGN 3.20), every group together.
    statuses: Mapping[str, int] = field(default_factory=dict)
    #: Resources whose automatic restarts gave up (FAILED, attempts at the maximum).
    restarts_exhausted: int = 0


GroupStatsSource = Callable[[], GroupStats]

#: The states `coordinator_resource_statuses` reports (every one, 0 when none).
STATUS_STATES = ("RUNNING", "PAUSED", "FAILED", "STOPPED", "RESTARTING")


class _GroupCollector(Collector):
    """The groups this process owns, computed at each scrape (O(groups), plus O(members) of
    each group that is not STABLE); nothing on the request path."""

    def __init__(self, stats: GroupStatsSource) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        stats = self._stats()
        groups = GaugeMetricFamily(
            "coordinator_groups", "Groups this process owns, by state.", labels=["state"]
        )
        for status in GroupStatus:
            groups.add_metric([status.value], stats.by_state.get(status, 0))
        yield groups
        yield GaugeMetricFamily(
            "coordinator_members", "Members of the groups this process owns.", value=stats.members
        )
        oldest = GaugeMetricFamily(
            "coordinator_rebalance_oldest_seconds",
            "Of the groups this process owns in the state, the longest time one has been in it "
            "(ASSIGNING: since the group epoch bump; RECONCILING: since its target was "
            "installed; or since this process took the group over, or first saw it unsettled "
            "with no epoch moved); 0 when no group is in the state.",
            labels=["state"],
        )
        overdue = GaugeMetricFamily(
            "coordinator_rebalance_oldest_timeout_ratio",
            "Of the groups this process owns in the state, the longest time one has been in it "
            "divided by that group's rebalance timeout (the longest of its members'). Each "
            "state normally ends within one: an assignor that has not installed by then is "
            "passed over, a member that has not revoked by then is removed; 0 when no group is "
            "in the state.",
            labels=["state"],
        )
        for status in UNSETTLED:
            oldest.add_metric([status.value], stats.oldest_rebalance_s.get(status, 0.0))
            overdue.add_metric([status.value], stats.oldest_rebalance_timeouts.get(status, 0.0))
        yield oldest
        yield overdue
        statuses = GaugeMetricFamily(
            "coordinator_resource_statuses",
            "Connectors and tasks of the groups this process owns, by the state their holder "
            "last reported (RUNNING, PAUSED, FAILED, STOPPED; RESTARTING after a restart "
            "request). A report stays counted until the resource's next holder reports or its "
            "connector is deleted; resources never reported are not counted.",
            labels=["state"],
        )
        for state in STATUS_STATES:
            statuses.add_metric([state], stats.statuses.get(state, 0))
        yield statuses
        yield GaugeMetricFamily(
            "coordinator_auto_restarts_exhausted",
            "Connectors and tasks of the groups this process owns that reported FAILED with "
            "their automatic restarts spent (restart.failed.max.attempts in a row, DESIGN "
            "3.20): nothing restarts them until an operator does (coordinator-svc restart).",
            value=stats.restarts_exhausted,
        )


ParkedSource = Callable[[], Mapping[str, int]]


class _ParkedCollector(Collector):
    """coordinator_parked_calls{kind}: classic calls waiting, read from the parking lot at each
    scrape (O(kinds))."""

    def __init__(self, counts: ParkedSource) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        parked = GaugeMetricFamily(
            "coordinator_parked_calls",
            "Classic calls held by this process without a thread, by kind: JoinGroups waiting "
            "for their join phase to end (join), follower SyncGroups waiting for the leader's "
            "assignments (sync).",
            labels=["kind"],
        )
        for kind, count in sorted(self._counts().items()):
            parked.add_metric([kind], count)
        yield parked


@dataclass(frozen=True, slots=True)
class RetentionStats:
    """What the event pruner last read (`runtime/event_pruner.py`, DESIGN 3.20).

    Attributes:
        pruned_total: events this process deleted.
        pruned_through_event_id: the highest event id pruned (by any coordinator).
        oldest_event_at_s: when the lowest-id event happened (seconds since the epoch; None:
            no event).
        registered_at_s: per registered audit export, when its latest run was recorded.
        holds_lease: whether this process holds the pruning lease.
    """

    pruned_total: int = 0
    pruned_through_event_id: int = 0
    oldest_event_at_s: float | None = None
    registered_at_s: Mapping[str, float] = field(default_factory=dict)
    holds_lease: bool = False


RetentionSource = Callable[[], RetentionStats | None]


class _RetentionCollector(Collector):
    """Event retention's metrics, ages computed at each scrape from the pruner's last look
    (every --event-prune-interval-ms). Without retention the families are served empty."""

    def __init__(self, stats: RetentionSource, clock: Callable[[], float] = time.time) -> None:
        self._stats = stats
        self._clock = clock

    def collect(self) -> Iterable[Metric]:
        stats = self._stats()
        now = self._clock()
        pruned = CounterMetricFamily(
            "coordinator_events_pruned",
            "Events this process deleted for --event-retention-ms (DESIGN 3.20).",
        )
        floor = GaugeMetricFamily(
            "coordinator_events_pruned_through_id",
            "The highest event id pruned (by any coordinator): an audit export run whose range "
            "starts below it refuses.",
        )
        oldest = GaugeMetricFamily(
            "coordinator_events_oldest_age_seconds",
            "Age of the oldest event kept (the lowest id), as of the pruner's last look.",
        )
        registrations = GaugeMetricFamily(
            "coordinator_audit_export_registration_age_seconds",
            "Per registered audit export (--export-name), seconds since its latest run recorded "
            "its progress: the pruner keeps every event that run may read again, so one that "
            "stopped advancing holds the events back.",
            labels=["export"],
        )
        lease = GaugeMetricFamily(
            "coordinator_event_pruner_lease",
            "1 while this process holds the pruning lease (one coordinator prunes at a time).",
        )
        if stats is not None:
            pruned.add_metric([], stats.pruned_total)
            floor.add_metric([], stats.pruned_through_event_id)
            if stats.oldest_event_at_s is not None:
                oldest.add_metric([], max(0.0, now - stats.oldest_event_at_s))
            for name, at_s in sorted(stats.registered_at_s.items()):
                registrations.add_metric([name], max(0.0, now - at_s))
            lease.add_metric([], 1 if stats.holds_lease else 0)
        yield from (pruned, floor, oldest, registrations, lease)


class _HeartbeatLatency(Collector):
    """coordinator_heartbeat_latency_seconds: the ConnectGroupHeartbeat series of
    coordinator_rpc_latency_seconds under the name dashboards and alerts have used since before
    the histogram had an `rpc` label. Copied at each scrape, so a heartbeat is observed once."""

    NAME = "coordinator_heartbeat_latency_seconds"

    def __init__(self, series: Histogram) -> None:
        self._series = series

    def collect(self) -> Iterable[Metric]:
        metric = Metric(
            self.NAME,
            "Time to handle a ConnectGroupHeartbeat: the same observations as "
            'coordinator_rpc_latency_seconds{rpc="ConnectGroupHeartbeat"}.',
            "histogram",
        )
        # A child's own samples (prometheus_client's, as its registry reads them).
        for sample in self._series._child_samples():
            metric.add_sample(self.NAME + sample.name, sample.labels, sample.value)
        yield metric


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
        self.automatic_restarts = Counter(
            "coordinator_automatic_restarts",
            "Restarts the coordinator requested by itself of connectors and tasks reported "
            "FAILED (DESIGN 3.20, restart.failed.max.attempts).",
            registry=self.registry,
        )
        self.assignment_computations = Counter(
            "coordinator_assignment_computations",
            "Target assignments installed or failed, by result.",
            ["result"],
            registry=self.registry,
        )
        self.gc_pauses = Histogram(
            "coordinator_gc_pause_seconds",
            "How long each garbage collection of the interpreter held it, by generation (0, 1, "
            "2: a full collection). Every call of every group waits for a collection.",
            ["generation"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=self.registry,
        )
        self.rpc_latency = Histogram(
            "coordinator_rpc_latency_seconds",
            "Time the coordinator took to handle a call, by RPC (the method's name): from the "
            "request's bytes to the answer (decoding, authentication, waiting for a pool thread, "
            "the group's lock and the database, encoding); refused calls included. Not in it: "
            "gRPC's transport, and the wait for the event loop before the call starts.",
            ["rpc"],
            buckets=RPC_LATENCY_BUCKETS,
            registry=self.registry,
        )
        #: The ConnectGroupHeartbeat series, also exported as coordinator_heartbeat_latency_seconds.
        self.heartbeat_latency = self.rpc_latency.labels(HEARTBEAT_RPC)
        self.registry.register(_HeartbeatLatency(self.heartbeat_latency))
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
            "mapping rules cannot turn into a principal, or that a CRL (--tls-crl) revokes.",
            registry=self.registry,
        )
        self.tls_reloads = Counter(
            "coordinator_tls_reloads",
            "Times the server's certificate files changed and were loaded again.",
            registry=self.registry,
        )
        self.tls_reload_failures = Counter(
            "coordinator_tls_reload_failures",
            "Times the server's certificate files changed but could not be used (unreadable, "
            "not PEM, or a key that is not the certificate's); the previous pair stays.",
            registry=self.registry,
        )
        self.errors = Counter(
            "coordinator_errors",
            "Responses with a non-zero error code, by RPC and code.",
            ["rpc", "code"],
            registry=self.registry,
        )
        self.lease_changes = Counter(
            "coordinator_group_lease_changes",
            "Group leases this process took (acquired: a new tenure, its token incremented), "
            "lost (a tenure that ended without this process giving it up: not renewed in time, "
            "or taken by another process once lapsed) or gave up (released: an idle or unknown "
            "group, or a graceful stop).",
            ["change"],
            registry=self.registry,
        )
        for change in LEASE_CHANGES:
            self.lease_changes.labels(change)  # present (at 0) before the first change

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

    def watch_groups(self, stats: GroupStatsSource) -> None:
        self.registry.register(_GroupCollector(stats))

    def watch_parked(self, counts: ParkedSource) -> None:
        """Export `counts()` (parked calls by kind) as coordinator_parked_calls."""
        self.registry.register(_ParkedCollector(counts))

    def watch_retention(self, stats: RetentionSource) -> None:
        """Export event retention's figures from `stats()` (None: retention is off)."""
        self.registry.register(_RetentionCollector(stats))

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        start_http_server(port, addr=host, registry=self.registry)
