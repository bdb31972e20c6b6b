"""The agent's Prometheus metrics (`worker-agent run --metrics-port`): what it did (heartbeats,
self-fencing, listener calls, revocations, its leave) and where it is (member epoch, phase, the
resources its worker runs).

The agent's image carries grpcio and protobuf only (the import contracts keep
`prometheus_client`, a coordinator dependency, out of it), so this is a small stdlib
implementation of the text exposition format (version 0.0.4) for the three kinds used: counters
and histograms, counted as things happen (a lock and an addition each: the agent heartbeats
every few seconds), and gauges read from the agent when Prometheus scrapes. `MetricsServer`
serves `GET /metrics` on a port of its own, apart from the status endpoint, so that a network
policy can let Prometheus reach the metrics and nothing else.
"""

from __future__ import annotations

import logging
import math
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from connect_protocol.errors import ErrorCode

__all__ = [
    "CONTENT_TYPE",
    "AgentMetrics",
    "AgentView",
    "Counter",
    "Histogram",
    "MetricsServer",
]

_log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: worker_agent_self_fenced_total{reason}: why the agent lost its membership and stopped its work.
SELF_FENCE_REASONS = (
    "session_timeout",  # no successful heartbeat for nearly a session timeout: fenced itself
    ErrorCode.FENCED_MEMBER_EPOCH.name,
    ErrorCode.UNKNOWN_MEMBER_ID.name,
    ErrorCode.FENCED_INSTANCE_ID.name,  # another process took its instance id: it exits
    "coordinator_unreachable",  # classic: no coordinator for a heartbeat interval (KAFKA-9184)
)
#: worker_agent_leaves_total{outcome}.
LEAVE_OUTCOMES = (
    "left",  # the coordinator answered the leave heartbeat
    "timed_out",  # the leave could not be delivered in time: the session will expire
    "not_member",  # nothing to leave: never joined, or its membership was lost
    "fatal",  # stopped by a fatal error (FENCED_INSTANCE_ID, UNSUPPORTED_ASSIGNOR, ...)
)
EVENTS = ("revoked", "assigned", "reconfigured", "paused", "resumed", "stopped")
#: Why a StopWork stops what it stops (the machine's reasons).
STOP_REASONS = ("revoked", "membership lost", "leaving", "eager rebalance", "fatal error")
#: The connect machine's phases, then the classic machine's own (`classic.membership`).
PHASES = (
    "JOINING",
    "MEMBER",
    "REJOINING",
    "LEAVING",
    "STOPPING",
    "LEFT",
    "UNJOINED",
    "SYNCING",
    "STABLE",
)
REVOCATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    pairs = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        pairs.append(extra)
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _header(name: str, help_text: str, kind: str) -> list[str]:
    escaped = help_text.replace("\\", "\\\\").replace("\n", "\\n")
    return [f"# HELP {name} {escaped}", f"# TYPE {name} {kind}"]


class Counter:
    """A counter family (`name` ends in `_total`), by label values."""

    def __init__(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str] = (),
        initial: Iterable[Sequence[str]] = (),
    ) -> None:
        self.name, self.help, self.labels = name, help_text, tuple(labels)
        self._lock = threading.Lock()
        self._values: dict[tuple[str, ...], float] = {}
        for values in initial:  # present at 0 from the start, so increase() sees the first one
            self._values[self._key(values)] = 0.0
        if not self.labels:
            self._values[()] = 0.0

    def _key(self, values: Sequence[str]) -> tuple[str, ...]:
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}, not {tuple(values)}")
        return tuple(values)

    def inc(self, *values: str, amount: float = 1.0) -> None:
        key = self._key(values)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, *values: str) -> float:
        with self._lock:
            return self._values.get(tuple(values), 0.0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        out = _header(self.name, self.help, "counter")
        out += [f"{self.name}{_labels(self.labels, k)} {_number(v)}" for k, v in items]
        return out


class Histogram:
    """A histogram family (cumulative buckets, `_sum`, `_count`), by label values."""

    def __init__(
        self,
        name: str,
        help_text: str,
        buckets: Sequence[float],
        labels: Sequence[str] = (),
    ) -> None:
        self.name, self.help, self.labels = name, help_text, tuple(labels)
        self.buckets = (*sorted(buckets), math.inf)
        self._lock = threading.Lock()
        # label values -> (count per bucket, not cumulative; sum)
        self._series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}

    def observe(self, value: float, *values: str) -> None:
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}, not {values}")
        index = next(i for i, bound in enumerate(self.buckets) if value <= bound)
        with self._lock:
            series = self._series.get(values)
            if series is None:
                series = self._series[values] = ([0] * len(self.buckets), [0.0])
            series[0][index] += 1
            series[1][0] += value

    def count(self, *values: str) -> int:
        with self._lock:
            series = self._series.get(tuple(values))
            return 0 if series is None else sum(series[0])

    def render(self) -> list[str]:
        with self._lock:
            items = sorted((k, (list(c), s[0])) for k, (c, s) in self._series.items())
        out = _header(self.name, self.help, "histogram")
        for key, (counts, total) in items:
            cumulative = 0
            for bound, n in zip(self.buckets, counts, strict=True):
                cumulative += n
                le = 'le="' + _number(bound) + '"'
                out.append(f"{self.name}_bucket{_labels(self.labels, key, le)} {cumulative}")
            out.append(f"{self.name}_sum{_labels(self.labels, key)} {_number(total)}")
            out.append(f"{self.name}_count{_labels(self.labels, key)} {cumulative}")
        return out


@dataclass(frozen=True, slots=True)
class AgentView:
    """Where the agent is, read at each scrape."""

    phase: str
    member_epoch: int
    connectors: int
    tasks: int


class AgentMetrics:
    """Every metric the agent exports. Counting methods are called by the runtime as things
    happen; `render` is the scrape."""

    def __init__(self) -> None:
        self.heartbeats = Counter(
            "worker_agent_heartbeats_total", "Heartbeats sent to the coordinator."
        )
        self.heartbeat_errors = Counter(
            "worker_agent_heartbeat_errors_total",
            "Heartbeats the coordinator answered with an error, by its error code "
            "(COMPUTE_ASSIGNMENT, a request to compute an assignment, is not one).",
            ["code"],
            initial=[(c,) for c in SELF_FENCE_REASONS if c.isupper()],
        )
        self.heartbeat_failures = Counter(
            "worker_agent_heartbeat_failures_total",
            "Heartbeats that got no answer (the coordinator unreachable, the deadline passed), "
            "by gRPC status code.",
            ["status"],
            initial=[("UNAVAILABLE",), ("DEADLINE_EXCEEDED",)],
        )
        self.self_fenced = Counter(
            "worker_agent_self_fenced_total",
            "Times the agent lost its membership and stopped all its work: session_timeout (no "
            "successful heartbeat for nearly a session timeout: it fenced itself), or the "
            "coordinator's answer (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID: it rejoins; "
            "FENCED_INSTANCE_ID: it exits); classic mode also coordinator_unreachable (no "
            "coordinator for a heartbeat interval, KAFKA-9184: it revokes and rejoins).",
            ["reason"],
            initial=[(r,) for r in SELF_FENCE_REASONS],
        )
        self.listener_calls = Counter(
            "worker_agent_listener_calls_total",
            "Calls of the worker's listener (webhook, exec hook), by event and result (failed: "
            "it raised, timed out or answered non-2xx; the call is retried, but for assigned, "
            "which is reported FAILED and made again only on a restart).",
            ["event", "result"],
            initial=[(e, r) for e in EVENTS for r in ("ok", "failed")],
        )
        self.listener_retries = Counter(
            "worker_agent_listener_retries_total",
            "Listener calls made again after a failed one, by event.",
            ["event"],
            initial=[(e,) for e in EVENTS],
        )
        self.restarts = Counter(
            "worker_agent_restarts_total",
            "Connectors and tasks the worker restarted in place because their restart count "
            "rose (RestartConnector, or the coordinator's automatic restarts; DESIGN 3.20).",
        )
        self.revocations = Histogram(
            "worker_agent_revocation_seconds",
            "Time the worker took to stop what it was told to stop, from the agent's decision "
            "to the listener's success (retries included), by reason (revoked: a cooperative "
            "revocation; leaving; membership lost; eager rebalance; fatal error).",
            REVOCATION_BUCKETS,
            ["reason"],
        )
        self.leaves = Counter(
            "worker_agent_leaves_total",
            "How the agent's membership ended when it stopped (left: the coordinator answered "
            "the leave; timed_out: not delivered in time, the session expires; not_member: "
            "there was nothing to leave; fatal: stopped by a fatal error).",
            ["outcome"],
            initial=[(o,) for o in LEAVE_OUTCOMES],
        )
        self._view: Callable[[], AgentView] | None = None

    def watch(self, view: Callable[[], AgentView]) -> None:
        """Where the gauges come from (the agent, read at each scrape)."""
        self._view = view

    def render(self) -> str:
        lines: list[str] = []
        for family in (
            self.heartbeats,
            self.heartbeat_errors,
            self.heartbeat_failures,
            self.self_fenced,
            self.listener_calls,
            self.listener_retries,
            self.restarts,
            self.revocations,
            self.leaves,
        ):
            lines += family.render()
        view = self._view() if self._view is not None else AgentView("JOINING", 0, 0, 0)
        lines += _header(
            "worker_agent_member_epoch",
            "The member epoch the agent holds (0: not a member, -1 or -2: left).",
            "gauge",
        )
        lines.append(f"worker_agent_member_epoch {view.member_epoch}")
        lines += _header(
            "worker_agent_phase",
            "1 for the phase the agent's membership is in (JOINING, MEMBER, REJOINING after a "
            "lost membership, LEAVING, STOPPING after a fatal error, LEFT), 0 for the others.",
            "gauge",
        )
        lines += [f'worker_agent_phase{{phase="{p}"}} {int(p == view.phase)}' for p in PHASES]
        lines += _header(
            "worker_agent_resources",
            "Connectors and tasks the worker runs now (started through the listener and not "
            "stopped), by kind.",
            "gauge",
        )
        lines.append(f'worker_agent_resources{{kind="connector"}} {view.connectors}')
        lines.append(f'worker_agent_resources{{kind="task"}} {view.tasks}')
        return "\n".join(lines) + "\n"


class MetricsServer:
    """Serves `GET /metrics` (and nothing else) on a daemon thread."""

    def __init__(self, metrics: AgentMetrics, host: str = "127.0.0.1", port: int = 0) -> None:
        self.metrics = metrics
        self.host = host
        self._httpd = ThreadingHTTPServer((host, port), _handler_for(metrics))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"metrics-server:{self.port}",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _handler_for(metrics: AgentMetrics) -> type[_MetricsHandler]:
    return type("MetricsHandler", (_MetricsHandler,), {"metrics": metrics})


class _MetricsHandler(BaseHTTPRequestHandler):
    metrics: AgentMetrics
    server_version = "worker-agent-metrics"
    timeout = 30.0

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        if path != "/metrics":
            self._send(404, "text/plain; charset=utf-8", b"not found: GET /metrics\n")
            return
        try:
            body = self.metrics.render().encode()
        except Exception:
            _log.exception("could not render the metrics")
            self._send(500, "text/plain; charset=utf-8", b"could not render the metrics\n")
            return
        self._send(200, CONTENT_TYPE, body)

    def _send(self, code: int, content_type: str, payload: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("%s %s", self.address_string(), format % args)
