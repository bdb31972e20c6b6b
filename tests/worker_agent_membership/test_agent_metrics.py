"""The agent's Prometheus metrics (worker_agent/metrics.py): the exposition format itself, and
what the real `Agent` counts against a scripted coordinator (`fake_coordinator`: real gRPC on
127.0.0.1) that answers, then fences the member, then stops answering, then answers again:
heartbeats, their errors and failures, the self-fencing by each cause, listener failures and
retries, revocation times, the leave, and the gauges, read through `GET /metrics` and parsed by
`prometheus_client`'s parser (what Prometheus reads).
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import HeartbeatRequest, HeartbeatResponse
from tests.support.agents import wait_for
from tests.worker_agent_membership.fake_coordinator import FakeCoordinator, Seen, answer, rs
from worker_agent.assignors import assignors_for_protocol
from worker_agent.listener import CallbackListener, ListenerFailed, RebalanceEvent
from worker_agent.metrics import AgentMetrics, AgentView, Counter, Histogram, MetricsServer
from worker_agent.runtime import Agent, AgentSettings

WORK = rs("A", "A-0", "A-1")
INTERVAL_MS = 100
SESSION_MS = 1_500  # the agent fences itself 1.2 s after its last successful heartbeat


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition, as Prometheus's text parser reads it."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


# --- the format -----------------------------------------------------------------------------------


def test_counters_and_histograms_render_the_text_format() -> None:
    counter = Counter("x_total", "Help with a \\ and\na newline.", ["code"], initial=[("a",)])
    counter.inc('quote " back \\ nl \n')
    counter.inc("a", amount=2)
    histogram = Histogram("y_seconds", "Times.", [0.1, 1.0], ["reason"])
    histogram.observe(0.05, "leaving")
    histogram.observe(0.5, "leaving")
    histogram.observe(7.0, "leaving")
    text = "\n".join(counter.render() + histogram.render()) + "\n"
    samples = parse(text)
    assert value(samples, "x_total", code="a") == 2
    assert value(samples, "x_total", code='quote " back \\ nl \n') == 1
    assert value(samples, "y_seconds_bucket", reason="leaving", le="0.1") == 1
    assert value(samples, "y_seconds_bucket", reason="leaving", le="1.0") == 2
    assert value(samples, "y_seconds_bucket", reason="leaving", le="+Inf") == 3
    assert value(samples, "y_seconds_count", reason="leaving") == 3
    assert value(samples, "y_seconds_sum", reason="leaving") == pytest.approx(7.55)
    with pytest.raises(ValueError):
        counter.inc()  # a label missing


def test_every_family_is_exported_before_anything_happened() -> None:
    """Counters of known causes are present at 0 from the start, so that the first increment is
    an increase Prometheus sees; the gauges say where the agent is."""
    metrics = AgentMetrics()
    metrics.watch(lambda: AgentView("MEMBER", 7, 2, 5))
    samples = parse(metrics.render())
    for reason in ("session_timeout", "FENCED_MEMBER_EPOCH", "UNKNOWN_MEMBER_ID"):
        assert ("worker_agent_self_fenced_total", (("reason", reason),)) in samples
    assert ("worker_agent_listener_calls_total", (("event", "revoked"), ("result", "failed"))) in (
        samples
    )
    assert value(samples, "worker_agent_member_epoch") == 7
    assert value(samples, "worker_agent_phase", phase="MEMBER") == 1
    assert value(samples, "worker_agent_phase", phase="JOINING") == 0
    assert value(samples, "worker_agent_resources", kind="connector") == 2
    assert value(samples, "worker_agent_resources", kind="task") == 5


def test_the_server_answers_get_metrics_only() -> None:
    with MetricsServer(AgentMetrics()) as server:
        url = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert "worker_agent_heartbeats_total" in resp.read().decode()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/assignment", timeout=5)
        assert refused.value.code == 404


# --- the real agent -------------------------------------------------------------------------------


@dataclass
class Script:
    """The coordinator: `mode` "ok" answers (a join gets the next epoch and WORK), "fence"
    answers FENCED_MEMBER_EPOCH to a member's heartbeat, "silent" fails every call."""

    mode: str = "ok"
    epoch: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, req: HeartbeatRequest, _seen: list[Seen]) -> HeartbeatResponse:
        timing: dict[str, Any] = {"interval_ms": INTERVAL_MS, "session_ms": SESSION_MS}
        with self.lock:
            if self.mode == "silent":
                raise RuntimeError("the coordinator does not answer")
            if req.member_epoch < 0:
                return HeartbeatResponse(member_epoch=req.member_epoch)  # the leave
            if req.member_epoch == 0:
                self.epoch += 1
                self.mode = "ok"
                return answer(self.epoch, WORK, **timing)
            if self.mode == "fence":
                return HeartbeatResponse(
                    error_code=ErrorCode.FENCED_MEMBER_EPOCH, error_message="stale epoch"
                )
            return answer(self.epoch, None, **timing)


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
def fake(script: Script) -> Iterator[FakeCoordinator]:
    with FakeCoordinator(script) as coordinator:
        yield coordinator


def test_the_agent_counts_heartbeats_fencing_listener_calls_and_its_leave(
    fake: FakeCoordinator, script: Script
) -> None:
    assigned_calls = 0

    def on_assigned(_event: RebalanceEvent) -> None:
        nonlocal assigned_calls
        assigned_calls += 1
        if assigned_calls == 1:
            raise ListenerFailed("the worker is not ready yet")

    settings = AgentSettings(
        group_id="g",
        member_id="w1",
        coordinators=(fake.address,),
        assignors=tuple(assignors_for_protocol("sessioned")),
        rebalance_timeout_ms=30_000,
        rpc_timeout_s=1.0,
        listener_initial_backoff_s=0.05,
        listener_max_backoff_s=0.05,
    )
    agent = Agent(settings, CallbackListener(on_assigned=on_assigned))
    thread = threading.Thread(target=agent.run, name="agent", daemon=True)
    with MetricsServer(agent.metrics) as server:

        def scrape() -> Samples:
            url = f"http://127.0.0.1:{server.port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as resp:
                return parse(resp.read().decode())

        thread.start()
        try:
            # Joined; its start failed, is counted and not retried (DESIGN 3.20: a failed start
            # runs again only on a restart), and the work is held all the same.
            wait_for("the work held", lambda: agent.running == WORK)
            m = scrape()
            assert value(m, "worker_agent_listener_calls_total", event="assigned", result="failed")
            assert value(m, "worker_agent_listener_retries_total", event="assigned") == 0
            assert value(m, "worker_agent_listener_calls_total", event="assigned", result="ok") == 0
            assert value(m, "worker_agent_member_epoch") == 1
            assert value(m, "worker_agent_phase", phase="MEMBER") == 1
            assert value(m, "worker_agent_resources", kind="connector") == 1
            assert value(m, "worker_agent_resources", kind="task") == 2
            assert value(m, "worker_agent_heartbeats_total") >= 1

            # Fenced by the coordinator: everything stopped, then a rejoin at epoch 2.
            with script.lock:
                script.mode = "fence"
            wait_for("the rejoin", lambda: agent.member_epoch == 2 and agent.running == WORK)
            m = scrape()
            # ... and started afresh after the rejoin.
            assert value(m, "worker_agent_listener_calls_total", event="assigned", result="ok") == 1
            assert value(m, "worker_agent_self_fenced_total", reason="FENCED_MEMBER_EPOCH") == 1
            assert value(m, "worker_agent_heartbeat_errors_total", code="FENCED_MEMBER_EPOCH") == 1
            assert value(m, "worker_agent_revocation_seconds_count", reason="membership lost") == 1
            assert value(m, "worker_agent_self_fenced_total", reason="session_timeout") == 0

            # No answer for nearly a session timeout: it fences itself, then rejoins.
            with script.lock:
                script.mode = "silent"
            wait_for(
                "the self-fence",
                lambda: (
                    value(scrape(), "worker_agent_self_fenced_total", reason="session_timeout")
                    or None
                ),
            )
            m = scrape()
            assert value(m, "worker_agent_heartbeat_failures_total", status="UNKNOWN") >= 1
            assert value(m, "worker_agent_revocation_seconds_count", reason="membership lost") == 2
            with script.lock:
                script.mode = "ok"
            wait_for("the second rejoin", lambda: agent.member_epoch == 3)
        finally:
            agent.stop()
            thread.join(20)
        assert not thread.is_alive()
        m = scrape()  # the server outlives the agent: the leave is still there to be read
    assert value(m, "worker_agent_leaves_total", outcome="left") == 1
    assert value(m, "worker_agent_revocation_seconds_count", reason="leaving") == 1
    assert value(m, "worker_agent_phase", phase="LEFT") == 1
    assert value(m, "worker_agent_resources", kind="task") == 0
    assert value(m, "worker_agent_self_fenced_total", reason="FENCED_MEMBER_EPOCH") == 1
    assert value(m, "worker_agent_self_fenced_total", reason="session_timeout") == 1
    sent = value(m, "worker_agent_heartbeats_total")
    answered_or_not = len(fake.seen())
    assert sent >= answered_or_not  # counted when sent: every one the fake saw, at least
