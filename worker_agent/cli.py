"""`worker-agent`: run the sidecar beside a worker (`worker-agent run --help`).

Every flag has an environment variable (WORKER_AGENT_...), so the agent is configured the same way
from a shell, a systemd unit or a Kubernetes pod spec.

`--group-protocol` chooses what the agent speaks (Kafka's `group.protocol`, DESIGN 2.2): `connect`
(the coordinator's ConnectGroupHeartbeat, `runtime.Agent`) or `classic` (Kafka's JoinGroup,
SyncGroup, Heartbeat and LeaveGroup, as a Kafka Connect worker does today, DESIGN 3.19:
`classic.runtime.ClassicAgent`, imported only when asked for). Both take the same listener, status
endpoint and metrics. What one protocol cannot honour is refused at start, before any connection
(exit 2): static membership and a chosen member id on classic, the session timeout and the
heartbeat interval on connect (where the coordinator sends both).
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import signal
import socket
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

from connect_protocol import logs
from connect_protocol.env import env_default
from connect_protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, MAX_GRPC_MESSAGE_BYTES
from connect_protocol.resources import ResourceSet
from connect_protocol.safe_text import printable
from connect_protocol.tls import (
    TlsConfigError,
    add_client_tls_arguments,
    client_tls,
    host_of,
    is_loopback,
    plaintext_problem,
)

from .assignors import PROTOCOLS, assignors_for_protocol
from .hooks import DEFAULT_WEBHOOK_CONCURRENCY, ExecHookListener, WebhookListener
from .listener import (
    RELEASE_MODES,
    CallbackListener,
    CompositeListener,
    RebalanceEvent,
    WorkerRebalanceListener,
)
from .membership import RELEASE_HEARTBEAT_GAP_MS
from .metrics import AgentMetrics, MetricsServer
from .runtime import Agent, AgentBase, AgentSettings
from .status import (
    DEFAULT_LEAVE_TIMEOUT_S,
    MAX_LEAVE_TIMEOUT_S,
    STATE_CHANGE_HEADER,
    StatusServer,
)

log = logging.getLogger("worker_agent")


T = TypeVar("T")

#: `--group-protocol` (Kafka's `group.protocol`): the coordinator's own, or Kafka's classic one.
GROUP_PROTOCOLS = ("classic", "connect")
#: Kafka Connect's `session.timeout.ms` and `heartbeat.interval.ms` defaults (classic only).
DEFAULT_SESSION_TIMEOUT_MS = 10_000
DEFAULT_HEARTBEAT_INTERVAL_MS = 3_000


def _env(name: str, default: T) -> str | T:
    return env_default(f"WORKER_AGENT_{name}", default)


def _positive_ms(env_name: str) -> Callable[[str], int]:
    """An argparse `type`: a positive whole number of milliseconds, else a message naming the
    flag's environment variable too (the value may have come from there)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(
                f"must be a positive whole number of milliseconds, not {text!r} "
                f"(from the flag or WORKER_AGENT_{env_name})"
            )
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="worker-agent",
        description="The sidecar beside a Connect worker: keeps it in its group, runs the "
        "client-side assignor when asked, and tells the worker what to stop and start.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="join a group and follow its assignments until SIGTERM",
        description="Join a group and follow its assignments. SIGTERM or SIGINT: stop all work "
        "(through the listener), then leave the group; a second signal gives up at once. Every "
        "flag can also be set by the environment variable in parentheses. Two group protocols "
        "(--group-protocol): connect, the coordinator's own (the default: one heartbeat call "
        "carries membership and assignments, the coordinator sends the session timeout and the "
        "heartbeat interval; static membership with --instance-id), and classic, Kafka's "
        "JoinGroup/SyncGroup protocol as a Kafka Connect worker speaks it today (the leader "
        "worker runs Connect's assignors; the coordinator makes the member id; no static "
        "membership; --session-timeout-ms and --heartbeat-interval-ms are this worker's own). "
        "The listener, the status endpoint and the metrics are the same in both.",
    )
    run.add_argument(
        "--coordinator",
        default=_env("COORDINATOR", "127.0.0.1:9093"),
        help="coordinator host:port; several, comma-separated, are tried in turn when looking "
        "for the group's coordinator (WORKER_AGENT_COORDINATOR; default 127.0.0.1:9093)",
    )
    add_client_tls_arguments(run, "WORKER_AGENT_", "the agent")
    run.add_argument(
        "--group", default=_env("GROUP", "connect-cluster"), help="group id (WORKER_AGENT_GROUP)"
    )
    run.add_argument(
        "--group-protocol",
        choices=GROUP_PROTOCOLS,
        default=_env("GROUP_PROTOCOL", "connect"),
        help="the group protocol, Kafka's group.protocol (WORKER_AGENT_GROUP_PROTOCOL; default "
        "connect). connect: the coordinator's protocol (ConnectGroupHeartbeat, DESIGN 2.1). "
        "classic: Kafka's JoinGroup, SyncGroup, Heartbeat and LeaveGroup, as a Kafka Connect "
        "worker speaks them today (DESIGN 3.19); refused with --instance-id or --member-id; "
        "takes --session-timeout-ms and --heartbeat-interval-ms",
    )
    run.add_argument(
        "--member-id",
        default=_env("MEMBER_ID", None),
        help="this process's member id, connect protocol only (WORKER_AGENT_MEMBER_ID). "
        "Default: a fresh random id per process start (host name + random suffix), as DESIGN "
        "3.2 asks: an explicit id must belong to one running process only, for two processes "
        "under one id both run the same work. The identity that survives restarts is "
        "--instance-id. Refused with --group-protocol classic, whose member ids the "
        "coordinator makes (KIP-394)",
    )
    run.add_argument(
        "--instance-id",
        default=_env("INSTANCE_ID", None),
        help="static instance id, e.g. a StatefulSet pod name: a restart under it moves "
        "nothing (WORKER_AGENT_INSTANCE_ID). Connect protocol only: refused with "
        "--group-protocol classic, which has no static membership (DESIGN 3.19)",
    )
    run.add_argument(
        "--url", default=_env("URL", None), help="the worker's REST URL (WORKER_AGENT_URL)"
    )
    run.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default=_env("PROTOCOL", "sessioned"),
        help="Kafka Connect's connect.protocol, on either group protocol: eager "
        "(stop-the-world), compatible or sessioned (incremental cooperative) "
        "(WORKER_AGENT_PROTOCOL; default sessioned). connect: the assignors advertised (eager: "
        "eager; compatible, sessioned: incremental_cooperative then eager). classic: the "
        "JoinGroup protocols offered (eager: default; compatible: compatible, default; "
        "sessioned: sessioned, compatible, default)",
    )
    run.add_argument(
        "--rebalance-timeout-ms",
        type=int,
        default=_env("REBALANCE_TIMEOUT_MS", 60_000),
        help="how long the coordinator waits for this worker to give work up or to compute an "
        "assignment, on either group protocol (WORKER_AGENT_REBALANCE_TIMEOUT_MS; default 60000)",
    )
    # Default None (not the number), so that giving either with the connect protocol is refused.
    run.add_argument(
        "--session-timeout-ms",
        type=_positive_ms("SESSION_TIMEOUT_MS"),
        default=_env("SESSION_TIMEOUT_MS", None),
        help="classic only: Kafka's session.timeout.ms, sent in every JoinGroup; the coordinator "
        "removes the worker after this long without a heartbeat, and the agent stops its work "
        "itself just before. Must lie within the coordinator's --classic-min-session-timeout-ms "
        "and --classic-max-session-timeout-ms, or the JoinGroup is refused and the agent exits "
        f"(WORKER_AGENT_SESSION_TIMEOUT_MS; default {DEFAULT_SESSION_TIMEOUT_MS}, Connect's). On "
        "the connect protocol the coordinator sends it, and the flag is refused",
    )
    run.add_argument(
        "--heartbeat-interval-ms",
        type=_positive_ms("HEARTBEAT_INTERVAL_MS"),
        default=_env("HEARTBEAT_INTERVAL_MS", None),
        help="classic only: Kafka's heartbeat.interval.ms, below the session timeout "
        f"(WORKER_AGENT_HEARTBEAT_INTERVAL_MS; default {DEFAULT_HEARTBEAT_INTERVAL_MS}, "
        "Connect's). On the connect protocol the coordinator sends it, and the flag is refused",
    )
    run.add_argument(
        "--exec-hook",
        default=_env("EXEC_HOOK", None),
        help="command run on every revocation, assignment, config change and target-state "
        'change, the event as JSON on stdin (DESIGN 2.3\'s object plus "fencing_tokens" and '
        '"release"; assigned, reconfigured, paused, resumed and stopped events carry '
        '"configs", {connector: {"digest", "config"}}, with the values, and "target_states"; '
        'a restart\'s revoked and assigned carry "reason": "restart"); exit 0 = done. A failing '
        "assigned call is made once: its resources are reported FAILED with its output (the "
        "coordinator's status) and started again only on a restart (coordinator-svc restart, "
        "or the group's automatic restarts); other calls are retried (WORKER_AGENT_EXEC_HOOK)",
    )
    run.add_argument(
        "--hook-timeout-s",
        type=float,
        default=_env("HOOK_TIMEOUT_S", 30.0),
        help="kill the exec hook or give up on the webhook after this long, then retry "
        "(WORKER_AGENT_HOOK_TIMEOUT_S; default 30)",
    )
    run.add_argument(
        "--webhook",
        default=_env("WEBHOOK", None),
        help="URL POSTed the event as JSON on every revocation, assignment and config change; "
        "2xx = done. Config values only to an https or loopback URL, else digests only (a "
        "warning at start says so) (WORKER_AGENT_WEBHOOK)",
    )
    run.add_argument(
        "--release",
        choices=RELEASE_MODES,
        default=_env("RELEASE", "batch"),
        help="how the exec hook and the webhook report a revocation done (WORKER_AGENT_RELEASE; "
        "default batch). batch: the whole revoked event when the call succeeds. per-resource: "
        "each resource as soon as it has stopped, so its next owner can start it while the rest "
        'still stop; the exec hook writes one line {"released": {"connectors": [...], "tasks": '
        '[{"connector", "task"}]}} to stdout per stopped resource (exit 0 releases the rest, a '
        "failure only what it reported), the webhook gets one revoked POST per resource "
        "(released on its 2xx). The agent reports releases to the coordinator promptly, at "
        f"most one extra heartbeat per {RELEASE_HEARTBEAT_GAP_MS} ms. The event JSON's "
        '"release" key says the mode.',
    )
    run.add_argument(
        "--webhook-concurrency",
        type=int,
        default=_env("WEBHOOK_CONCURRENCY", DEFAULT_WEBHOOK_CONCURRENCY),
        help="with --release per-resource: at most this many revoked POSTs at a time "
        f"(WORKER_AGENT_WEBHOOK_CONCURRENCY; default {DEFAULT_WEBHOOK_CONCURRENCY})",
    )
    run.add_argument(
        "--status-port",
        type=int,
        default=_env("STATUS_PORT", None),
        help="serve the worker's status (GET /assignment, /ready, /healthz, /watch; POST "
        "/leave, and POST /status for the worker to report a resource's state, e.g. "
        '{"connector": "c", "task": 0, "state": "FAILED", "trace": "..."}) on this port; 0 '
        "picks a free one. Config values in /assignment and /watch, and the POSTs, only for "
        "callers in the same pod that send 'X-Worker-Agent: <endpoint>'; others see digests "
        "(WORKER_AGENT_STATUS_PORT; default: not served)",
    )
    run.add_argument(
        "--status-host",
        default=_env("STATUS_HOST", "127.0.0.1"),
        help="address of the status endpoint (WORKER_AGENT_STATUS_HOST; default 127.0.0.1)",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=_env("METRICS_PORT", None),
        help="serve Prometheus metrics (GET /metrics: heartbeats, self-fencing, listener calls, "
        "revocation times, member epoch and phase, resources run) on this port, apart from "
        "the status endpoint; 0 picks a free one (WORKER_AGENT_METRICS_PORT; default: not "
        "served)",
    )
    run.add_argument(
        "--metrics-host",
        default=_env("METRICS_HOST", "127.0.0.1"),
        help="address of the metrics endpoint (WORKER_AGENT_METRICS_HOST; default 127.0.0.1)",
    )
    run.add_argument(
        "--rpc-timeout-s",
        type=float,
        default=_env("RPC_TIMEOUT_S", 5.0),
        help="deadline of every call to the coordinator (WORKER_AGENT_RPC_TIMEOUT_S)",
    )
    run.add_argument(
        "--max-message-bytes",
        type=int,
        default=_env("MAX_MESSAGE_BYTES", DEFAULT_MAX_MESSAGE_BYTES),
        help="largest gRPC message the agent sends to or accepts from the coordinator, in "
        "bytes; a PrepareAssignment answer holds every member and the whole catalogue "
        f"(WORKER_AGENT_MAX_MESSAGE_BYTES; default {DEFAULT_MAX_MESSAGE_BYTES}, 64 MiB)",
    )
    run.add_argument(
        "--log-level", default=_env("LOG_LEVEL", "INFO"), help="(WORKER_AGENT_LOG_LEVEL)"
    )
    run.add_argument(
        "--log-format",
        choices=("json", "text"),
        default=_env("LOG_FORMAT", "json"),
        help="json lines (default) or text (WORKER_AGENT_LOG_FORMAT)",
    )
    leave = sub.add_parser(
        "leave",
        help="ask the agent beside this process to revoke all work and leave, and wait",
        description="POST /leave to the agent's status endpoint: the agent stops all work "
        "through its listener, then leaves the group, and this command returns once it has "
        "(exit 0), or after --timeout-s (exit 1; the agent goes on). For a worker container's "
        "preStop hook: the revocations reach the worker while it still runs, before the "
        "kubelet sends SIGTERM. The endpoint answers calls from the same pod only. After "
        "leaving, the agent stays out of the group until its process ends (SIGTERM).",
    )
    leave.add_argument(
        "--status-url",
        default="http://127.0.0.1:8084",
        help="the agent's status endpoint (default %(default)s)",
    )
    leave.add_argument(
        "--timeout-s",
        type=float,
        default=DEFAULT_LEAVE_TIMEOUT_S,
        help="how long to wait for the agent to have left (default %(default)s)",
    )
    return parser


def _log_only(event: RebalanceEvent) -> None:
    # Config values never reach a log line (DESIGN 3.20): digests only.
    log.info("%s: %s", event.event, event.to_json(config_values=False))


def build_listener(args: argparse.Namespace) -> WorkerRebalanceListener:
    listeners: list[WorkerRebalanceListener] = []
    if args.exec_hook:
        listeners.append(
            ExecHookListener(
                shlex.split(args.exec_hook), timeout_s=args.hook_timeout_s, release=args.release
            )
        )
    if args.webhook:
        listeners.append(
            WebhookListener(
                args.webhook,
                timeout_s=args.hook_timeout_s,
                release=args.release,
                concurrency=args.webhook_concurrency,
            )
        )
    if not listeners:
        return CallbackListener(
            on_revoked=_log_only, on_assigned=_log_only, on_reconfigured=_log_only
        )
    return listeners[0] if len(listeners) == 1 else CompositeListener(listeners)


def group_protocol_problem(args: argparse.Namespace) -> str | None:
    """Why these settings cannot run on the group protocol asked for (None: they can). Checked
    before anything connects; the flags' values may come from their environment variables."""
    if args.group_protocol == "classic":
        if args.instance_id:
            return (
                "--instance-id (WORKER_AGENT_INSTANCE_ID) cannot be used with --group-protocol "
                "classic: static membership is offered on the connect protocol only (DESIGN "
                "3.19, 3.14); Kafka Connect's classic protocol has none and the coordinator "
                "refuses group_instance_id on classic calls. Remove --instance-id, or use "
                "--group-protocol connect."
            )
        if args.member_id is not None:
            return (
                "--member-id (WORKER_AGENT_MEMBER_ID) cannot be used with --group-protocol "
                "classic: classic member ids are made by the coordinator (a JoinGroup without "
                "one is answered MEMBER_ID_REQUIRED with one, KIP-394); remove --member-id."
            )
        session = args.session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS
        heartbeat = args.heartbeat_interval_ms or DEFAULT_HEARTBEAT_INTERVAL_MS
        if heartbeat >= session:
            given = "" if args.session_timeout_ms is not None else ", the default"
            return (
                f"--heartbeat-interval-ms (WORKER_AGENT_HEARTBEAT_INTERVAL_MS) must be below "
                f"--session-timeout-ms (WORKER_AGENT_SESSION_TIMEOUT_MS): {heartbeat} is not "
                f"below {session}{given}"
            )
        return None
    for flag, value in (
        ("--session-timeout-ms (WORKER_AGENT_SESSION_TIMEOUT_MS)", args.session_timeout_ms),
        (
            "--heartbeat-interval-ms (WORKER_AGENT_HEARTBEAT_INTERVAL_MS)",
            args.heartbeat_interval_ms,
        ),
    ):
        if value is not None:
            return (
                f"{flag} applies to --group-protocol classic only: on the connect protocol the "
                "coordinator sends both the session timeout and the heartbeat interval (DESIGN "
                "2.1). Remove it, or use --group-protocol classic."
            )
    return None


def random_member_id() -> str:
    """A member id of this process alone (DESIGN 3.2): the host name, for operators reading
    logs, and 48 random bits, fresh at every start."""
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:12]}"


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level, json_lines=args.log_format == "json")
    coordinators = tuple(a.strip() for a in args.coordinator.split(",") if a.strip())
    if not coordinators:
        print("worker-agent: --coordinator is empty", file=sys.stderr)
        return 2
    # From the environment: argparse checks only the flags' values against `choices`.
    if args.group_protocol not in GROUP_PROTOCOLS:
        print(
            f"worker-agent: --group-protocol (WORKER_AGENT_GROUP_PROTOCOL) must be one of "
            f"{GROUP_PROTOCOLS}, not {args.group_protocol!r}",
            file=sys.stderr,
        )
        return 2
    if args.protocol not in PROTOCOLS:
        print(
            f"worker-agent: --protocol (WORKER_AGENT_PROTOCOL) must be one of {PROTOCOLS}, "
            f"not {args.protocol!r}",
            file=sys.stderr,
        )
        return 2
    problem = group_protocol_problem(args)
    if problem is not None:
        print(f"worker-agent: {problem}", file=sys.stderr)
        return 2
    classic = args.group_protocol == "classic"
    if args.member_id is None:
        # Classic: only a label for the logs until the coordinator has made the member's id.
        args.member_id = random_member_id()
    elif not args.member_id:
        print("worker-agent: --member-id must not be empty", file=sys.stderr)
        return 2
    if args.rebalance_timeout_ms <= 0:
        print("worker-agent: --rebalance-timeout-ms must be positive", file=sys.stderr)
        return 2
    if args.release not in RELEASE_MODES:  # from the environment: argparse checks only flags
        print(
            f"worker-agent: --release (WORKER_AGENT_RELEASE) must be one of {RELEASE_MODES}, "
            f"not {args.release!r}",
            file=sys.stderr,
        )
        return 2
    if args.webhook_concurrency < 1:
        print("worker-agent: --webhook-concurrency must be at least 1", file=sys.stderr)
        return 2
    if not 0 < args.max_message_bytes <= MAX_GRPC_MESSAGE_BYTES:
        print(
            f"worker-agent: --max-message-bytes (WORKER_AGENT_MAX_MESSAGE_BYTES) must be between "
            f"1 and {MAX_GRPC_MESSAGE_BYTES}, not {args.max_message_bytes}",
            file=sys.stderr,
        )
        return 2
    try:
        tls = client_tls(args)
    except TlsConfigError as error:
        print(f"worker-agent: {error}", file=sys.stderr)
        return 2
    if tls is None:
        for address in coordinators:
            problem = plaintext_problem(address, args.allow_plaintext, "--allow-plaintext")
            if problem is not None:
                print(f"worker-agent: {problem} (WORKER_AGENT_ALLOW_PLAINTEXT=1)", file=sys.stderr)
                return 2
        if args.allow_plaintext and not all(is_loopback(host_of(a)) for a in coordinators):
            log.warning("talking PLAINTEXT to the coordinator (--allow-plaintext)")
    metrics = AgentMetrics()
    metrics_server: MetricsServer | None = None
    status: StatusServer | None = None
    if args.metrics_port is not None:
        try:
            metrics_server = MetricsServer(metrics, args.metrics_host, int(args.metrics_port))
        except (OSError, ValueError, OverflowError) as error:
            print(f"worker-agent: cannot serve metrics: {error}", file=sys.stderr)
            return 2
        metrics_server.start()
        log.info("metrics on http://%s:%d/metrics", args.metrics_host, metrics_server.port)
    if args.status_port is not None:
        # Classic: no member id until the coordinator has made one (the classic runtime reports
        # it). Not the label: a worker beside the agent (examples/sample_worker.py) reads a
        # change of member id as a new agent process and stops everything it runs.
        status = StatusServer(
            args.group,
            "" if classic else args.member_id,
            host=args.status_host,
            port=int(args.status_port),
        )
        status.start()
        log.info("status endpoint on http://%s:%d/", args.status_host, status.port)
    settings = AgentSettings(
        group_id=args.group,
        member_id=args.member_id,
        coordinators=coordinators,
        assignors=tuple(assignors_for_protocol(args.protocol)),
        rebalance_timeout_ms=args.rebalance_timeout_ms,
        instance_id=args.instance_id or None,
        url=args.url,
        eager=args.protocol == "eager",
        rpc_timeout_s=args.rpc_timeout_s,
        max_message_bytes=args.max_message_bytes,
        tls=tls,
        allow_plaintext=args.allow_plaintext,
        group_protocol=args.group_protocol,
        protocol=args.protocol,
        session_timeout_ms=args.session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=args.heartbeat_interval_ms or DEFAULT_HEARTBEAT_INTERVAL_MS,
    )
    agent: AgentBase  # Agent (connect) or ClassicAgent (classic)
    if classic:
        # Imported only here: a connect agent never loads the classic machine. Its start-up line
        # names the protocol, connect.protocol's JoinGroup protocols and the timeouts.
        from .classic.runtime import ClassicAgent

        agent = ClassicAgent(settings, build_listener(args), status, metrics=metrics)
    else:
        log.info(
            "group protocol connect (the coordinator's ConnectGroupHeartbeat), "
            "connect.protocol %s, rebalance timeout %d ms",
            settings.protocol,
            settings.rebalance_timeout_ms,
        )
        agent = Agent(settings, build_listener(args), status, metrics=metrics)
    signals = 0
    signalled = threading.Event()
    asked_to_leave = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal signals
        signals += 1
        signalled.set()
        if signals == 1:
            log.info("signal %d: revoking all work, then leaving the group", signum)
            agent.stop()
        else:
            log.warning("signal %d again: giving up on the listener and leaving now", signum)
            agent.abandon()

    def on_leave(timeout_s: float) -> tuple[bool, str]:
        if not asked_to_leave.is_set():
            asked_to_leave.set()
            log.info("POST /leave: revoking all work, then leaving the group")
        if agent.leave(timeout_s):
            return True, "all work revoked; left the group"
        return False, (
            f"not done after {timeout_s:g} s ({agent.phase.value}); still running: "
            f"{_names(agent.running)}"
        )

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if status is not None:
        status.set_leave_handler(on_leave)
    try:
        agent.run()
        if asked_to_leave.is_set() and agent.fatal is None:
            # Left on request (a worker's preStop hook): stay up, out of the group, until the
            # kubelet's SIGTERM. Exiting now would make the kubelet restart a sidecar of a pod
            # that is not terminating yet, and the new process would join again.
            log.info("left the group on request; waiting for SIGTERM to exit")
            while not signalled.wait(0.5):
                pass
    finally:
        if status is not None:
            status.close()
        if metrics_server is not None:
            metrics_server.close()
    if agent.fatal is not None:
        log.error("the agent stopped all work and exits: %s", agent.fatal)
        return 3
    return 0


def _names(resources: ResourceSet) -> str:
    return ", ".join(resources.names()) or "nothing"


def leave(args: argparse.Namespace) -> int:
    """`worker-agent leave`: POST /leave and wait for the answer."""
    if not 0 < args.timeout_s <= MAX_LEAVE_TIMEOUT_S:
        print(
            f"worker-agent leave: --timeout-s must be in (0, {MAX_LEAVE_TIMEOUT_S:g}]",
            file=sys.stderr,
        )
        return 2
    query = urllib.parse.urlencode({"timeout_s": f"{args.timeout_s:g}"})
    url = f"{args.status_url.rstrip('/')}/leave?{query}"
    # The header the agent requires of every state-changing request (a web page cannot send it).
    request = urllib.request.Request(
        url, data=b"", method="POST", headers={STATE_CHANGE_HEADER: "leave"}
    )
    try:
        # The answer comes once the agent has left, or after timeout_s: a little longer here.
        with urllib.request.urlopen(request, timeout=args.timeout_s + 5) as resp:
            body = resp.read().decode(errors="replace")
            code = int(resp.status)
    except urllib.error.HTTPError as error:
        body = error.read().decode(errors="replace")
        code = error.code
    except (OSError, ValueError) as error:
        print(f"worker-agent leave: cannot reach {url}: {error}", file=sys.stderr)
        return 1
    try:
        detail = str(json.loads(body).get("detail") or json.loads(body).get("error") or body)
    except (ValueError, AttributeError):
        detail = body.strip()
    detail = printable(detail)  # the endpoint's text: no control character reaches the terminal
    if 200 <= code < 300:
        print(f"worker-agent leave: {detail}")
        return 0
    print(f"worker-agent leave: HTTP {code}: {detail}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.command == "run":
        return run(args)
    if args.command == "leave":
        return leave(args)
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
