"""A sample worker for the deployment example (`deploy/k8s/`): it runs what the worker agent
beside it tells it to and logs what it runs.

    python -m examples.sample_worker --listen 127.0.0.1:8085 --status-url http://127.0.0.1:8084
    worker-agent run --webhook http://127.0.0.1:8085/events --status-port 8084 ...

``--mode webhook`` (the default) is the agent's webhook (``worker-agent run --webhook``): the
agent POSTs every revocation and assignment to ``--listen`` and this worker answers 200 once it
has stopped (or started) what the event names, so the agent acknowledges a revocation to the
coordinator only after the work has stopped here: a task never runs here and on another worker
at the same time. It also polls the agent's ``GET /assignment`` (every ``--poll-interval-s``),
not to learn what to run but to notice an agent that is gone (unreachable for
``--unreachable-stop-s``: stop everything, for the agent may have been fenced or replaced and
could not say so) or was replaced by a new process (another member id: stop everything, and run
what the new one assigns).

``--mode watch`` and ``--mode poll`` only *follow* the agent's status endpoint (``GET /watch``,
server-sent events, polling ``GET /assignment`` while the stream cannot be had; or polling
alone): simple, but the agent does not wait for a follower, so a revoked task may still run here
for a moment after another worker started it.

Either way it "runs" exactly what it was given and writes one JSON log line per change: what it
stopped, what it started (with their fencing tokens, DESIGN 3.18: what a real worker passes with
every write to a system that checks them), and what it runs now. SIGTERM or SIGINT: stop
everything, exit 0. In Kubernetes the worker container's preStop hook (``worker-agent leave``)
has the agent revoke everything through the webhook, and leave, before SIGTERM comes. Every
option has an environment variable ``SAMPLE_WORKER_<OPTION>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from connect_protocol import logs
from connect_protocol.env import env_default

__all__ = [
    "Assignment",
    "EventServer",
    "Runner",
    "Settings",
    "follow",
    "main",
    "parse_sse",
]

log = logging.getLogger("sample_worker")

DEFAULT_STATUS_URL = "http://127.0.0.1:8084"
DEFAULT_LISTEN = "127.0.0.1:8085"
MODES = ("webhook", "watch", "poll")
TaskName = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Assignment:
    """What the agent says this worker may run (the status endpoint's JSON object).

    Attributes:
        member_epoch: the member epoch the agent holds (0 before its first assignment).
        connectors: the connectors to run.
        tasks: the tasks to run, as (connector, task number).
        ready: whether the agent is a member with an assignment (False while joining, leaving or
            fenced).
        fencing_tokens: (resource name, token) per resource, sorted, connectors as ``A`` and
            tasks as ``A-0``; empty when the agent reports none.
        member_id: the agent's member id (one per agent process); "" when not reported.
    """

    member_epoch: int
    connectors: frozenset[str]
    tasks: frozenset[TaskName]
    ready: bool
    fencing_tokens: tuple[tuple[str, int], ...] = ()
    member_id: str = ""

    @staticmethod
    def from_json(obj: Any) -> Assignment:
        """Parse the endpoint's object; raises ValueError when it is not one."""
        if not isinstance(obj, dict):
            raise ValueError(f"an assignment must be a JSON object, not {type(obj).__name__}")
        try:
            connectors = frozenset(str(c) for c in obj.get("connectors", []))
            tasks = frozenset((str(t["connector"]), int(t["task"])) for t in obj.get("tasks", []))
            tokens = obj.get("fencing_tokens") or {}
            named = [(str(c), int(v)) for c, v in (tokens.get("connectors") or {}).items()]
            named += [
                (f"{t['connector']}-{int(t['task'])}", int(t["token"]))
                for t in tokens.get("tasks") or []
            ]
            return Assignment(
                member_epoch=int(obj.get("member_epoch", 0)),
                connectors=connectors,
                tasks=tasks,
                ready=bool(obj.get("ready", False)),
                fencing_tokens=tuple(sorted(named)),
                member_id=str(obj.get("member_id") or ""),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not an assignment: {obj!r} ({error})") from error


def _names(connectors: Iterable[str], tasks: Iterable[TaskName]) -> dict[str, list[str]]:
    return {
        "connectors": sorted(connectors),
        "tasks": [f"{c}-{t}" for c, t in sorted(tasks)],
    }


def _tokens_of(names: dict[str, list[str]], tokens: dict[str, int]) -> dict[str, int]:
    """The tokens of the named resources (those the agent reported), by name."""
    return {n: tokens[n] for n in names["connectors"] + names["tasks"] if n in tokens}


class Runner:
    """The "work": the set of connectors and tasks running, changed only through `apply` and
    `stop_all`, each change logged. Thread safe.

    Attributes:
        connectors: the connectors running now.
        tasks: the tasks running now.
        member_epoch: the epoch of the assignment applied last.
        fencing_tokens: the token of each resource running, by name (``A``, ``A-0``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.connectors: frozenset[str] = frozenset()
        self.tasks: frozenset[TaskName] = frozenset()
        self.member_epoch = 0
        self.fencing_tokens: dict[str, int] = {}
        self.agent_member = ""
        self._closed = False

    def apply(self, assignment: Assignment) -> bool:
        """Run exactly what `assignment` lists: stop the rest first, then start what is new.
        Returns whether anything changed. Ignored once `stop_all(final=True)` has run."""
        with self._lock:
            if self._closed:
                return False
            stop_c = self.connectors - assignment.connectors
            stop_t = self.tasks - assignment.tasks
            start_c = assignment.connectors - self.connectors
            start_t = assignment.tasks - self.tasks
            epoch_changed = assignment.member_epoch != self.member_epoch
            self.member_epoch = assignment.member_epoch
            tokens = dict(assignment.fencing_tokens)
            tokens_changed = tokens != self.fencing_tokens
            self.fencing_tokens = tokens
            if stop_c or stop_t:
                log.info(
                    "stopping",
                    extra=logs.fields(
                        event="worker_stopped",
                        member_epoch=assignment.member_epoch,
                        **_names(stop_c, stop_t),
                    ),
                )
                self.connectors -= stop_c
                self.tasks -= stop_t
            if start_c or start_t:
                started = _names(start_c, start_t)
                log.info(
                    "starting",
                    extra=logs.fields(
                        event="worker_started",
                        member_epoch=assignment.member_epoch,
                        **started,
                        fencing_tokens=_tokens_of(started, tokens),
                    ),
                )
                self.connectors |= start_c
                self.tasks |= start_t
            changed = bool(stop_c or stop_t or start_c or start_t)
            if changed or epoch_changed or tokens_changed:
                self._log_running_locked(f"member epoch {assignment.member_epoch}")
            return changed

    def revoke(self, event: Assignment) -> None:
        """A webhook's ``revoked`` event: stop what it names (what is not running is fine: a
        retry). Returns once stopped."""
        with self._lock:
            stop_c = self.connectors & event.connectors
            stop_t = self.tasks & event.tasks
            if not (stop_c or stop_t):
                return
            log.info(
                "stopping",
                extra=logs.fields(
                    event="worker_stopped",
                    member_epoch=event.member_epoch,
                    reason="revoked",
                    **_names(stop_c, stop_t),
                ),
            )
            self.connectors -= stop_c
            self.tasks -= stop_t
            stopped = _names(stop_c, stop_t)
            for name in stopped["connectors"] + stopped["tasks"]:
                self.fencing_tokens.pop(name, None)
            self.member_epoch = event.member_epoch
            self._log_running_locked("revoked")

    def assign(self, event: Assignment) -> bool:
        """A webhook's ``assigned`` event: start what it names (what runs already is fine: a
        retry). False once `stop_all(final=True)` has run: nothing starts any more."""
        with self._lock:
            if self._closed:
                return False
            start_c = event.connectors - self.connectors
            start_t = event.tasks - self.tasks
            tokens = dict(event.fencing_tokens)
            self.member_epoch = event.member_epoch
            self.fencing_tokens.update(tokens)
            if start_c or start_t:
                started = _names(start_c, start_t)
                log.info(
                    "starting",
                    extra=logs.fields(
                        event="worker_started",
                        member_epoch=event.member_epoch,
                        **started,
                        fencing_tokens=_tokens_of(started, tokens),
                    ),
                )
                self.connectors |= start_c
                self.tasks |= start_t
                self._log_running_locked("assigned")
            return True

    def note_agent(self, member_id: str) -> None:
        """The agent's member id, as an event or the status endpoint shows it. A new one is a
        new agent process, which knows nothing of what its predecessor started here (and whose
        predecessor can no longer revoke it): stop everything; the new one assigns afresh."""
        if not member_id:
            return
        with self._lock:
            previous, self.agent_member = self.agent_member, member_id
        if previous and previous != member_id:
            self.stop_all(f"the agent was replaced (member {previous} -> {member_id})")

    def stop_all(self, why: str, *, final: bool = False) -> None:
        """Stop everything (and, with `final`, ignore every later assignment)."""
        with self._lock:
            if final:
                self._closed = True
            if self.connectors or self.tasks:
                log.info(
                    "stopping everything: %s",
                    why,
                    extra=logs.fields(
                        event="worker_stopped", reason=why, **_names(self.connectors, self.tasks)
                    ),
                )
                self.connectors, self.tasks = frozenset(), frozenset()
                self.fencing_tokens = {}
                self._log_running_locked(why)

    def running(self) -> tuple[frozenset[str], frozenset[TaskName]]:
        with self._lock:
            return self.connectors, self.tasks

    def _log_running_locked(self, why: str) -> None:
        running = _names(self.connectors, self.tasks)
        log.info(
            "running %d connector(s), %d task(s)",
            len(self.connectors),
            len(self.tasks),
            extra=logs.fields(
                event="worker_running",
                member_epoch=self.member_epoch,
                reason=why,
                **running,
                fencing_tokens=_tokens_of(running, self.fencing_tokens),
            ),
        )


def parse_sse(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    """Server-sent events from text lines: yields (event name, data) per dispatched event.

    Comments (``: keepalive``) and ids are skipped; several ``data:`` lines join with newlines;
    an event without a name is ``message``."""
    event = ""
    data: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield event or "message", "\n".join(data)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)


@dataclass(frozen=True, slots=True)
class Settings:
    """How the worker reaches its agent.

    Attributes:
        status_url: the agent's status endpoint, e.g. http://127.0.0.1:8084.
        mode: "webhook" (the agent's webhook tells what to run; /assignment is polled to notice
            an agent that is gone or replaced), "watch" (the /watch stream, polling while it is
            unavailable) or "poll".
        listen: host:port of the webhook (mode "webhook").
        poll_interval_s: seconds between two polls of /assignment.
        unreachable_stop_s: stop everything after the agent has been unreachable this long.
        read_timeout_s: give up on a silent /watch stream after this long (the agent sends a
            keepalive every 15 s).
    """

    status_url: str = DEFAULT_STATUS_URL
    mode: str = "webhook"
    listen: str = DEFAULT_LISTEN
    poll_interval_s: float = 2.0
    unreachable_stop_s: float = 10.0
    read_timeout_s: float = 45.0


class _Reachability:
    """When the agent was last found unreachable (None while it is reachable)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None

    def reached(self) -> None:
        with self._lock:
            self._since = None

    def failed(self) -> None:
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()

    def unreachable_for(self) -> float:
        with self._lock:
            return 0.0 if self._since is None else time.monotonic() - self._since


def _get_assignment(url: str, timeout_s: float) -> Assignment:
    with urllib.request.urlopen(f"{url}/assignment", timeout=timeout_s) as resp:
        return Assignment.from_json(json.loads(resp.read()))


def _watch(
    url: str,
    on_assignment: Callable[[Assignment], object],
    reach: _Reachability,
    stop: threading.Event,
    timeout_s: float,
) -> None:
    """Follow /watch until the stream ends or fails (raises OSError or ValueError then)."""
    with urllib.request.urlopen(f"{url}/watch", timeout=timeout_s) as resp:
        reach.reached()
        log.info("following %s/watch", url, extra=logs.fields(event="watching"))
        lines = (raw.decode("utf-8") for raw in resp)
        for event, data in parse_sse(lines):
            if stop.is_set():
                return
            if event == "assignment":
                on_assignment(Assignment.from_json(json.loads(data)))
    raise ConnectionError("the /watch stream ended")


def follow(
    settings: Settings,
    on_assignment: Callable[[Assignment], object],
    stop: threading.Event,
    reach: _Reachability | None = None,
) -> None:
    """Feed every assignment the agent reports to `on_assignment` until `stop` is set."""
    reach = reach or _Reachability()
    url = settings.status_url.rstrip("/")
    backoff_s = 0.2
    failures = 0  # in a row; the first and every tenth are logged as warnings
    while not stop.is_set():
        if settings.mode == "watch":
            try:
                _watch(url, on_assignment, reach, stop, settings.read_timeout_s)
                continue
            except (OSError, ValueError) as error:
                reach.failed()
                log.log(
                    logging.WARNING if failures % 10 == 0 else logging.DEBUG,
                    "cannot follow %s/watch: %s; polling /assignment meanwhile",
                    url,
                    error,
                    extra=logs.fields(event="watch_failed"),
                )
        try:
            on_assignment(_get_assignment(url, settings.poll_interval_s + 1.0))
            reach.reached()
            failures, backoff_s = 0, 0.2
            wait_s = settings.poll_interval_s
        except (OSError, ValueError) as error:
            reach.failed()
            log.log(
                logging.WARNING if failures % 10 == 0 else logging.DEBUG,
                "cannot read %s/assignment: %s",
                url,
                error,
                extra=logs.fields(event="agent_unreachable"),
            )
            failures += 1
            wait_s, backoff_s = backoff_s, min(backoff_s * 2, 1.0, settings.poll_interval_s)
        stop.wait(wait_s)


class EventServer:
    """The webhook the agent POSTs its events to (``worker-agent run --webhook URL``, any path):
    a ``revoked`` event is answered 200 once what it names has stopped, an ``assigned`` event
    once it has started (503 while shutting down: nothing starts any more); anything else 400.

    Attributes:
        runner: what the events change.
        port: the bound port (after `start`).
    """

    def __init__(self, listen: str, runner: Runner) -> None:
        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--listen must be host:port, not {listen!r}")
        self.runner = runner
        handler = type("EventHandler", (_EventHandler,), {"runner": runner})
        self._httpd = ThreadingHTTPServer((host.strip("[]"), int(port)), handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        log.info(
            "webhook listening on port %d",
            self.port,
            extra=logs.fields(event="webhook_listening", port=self.port),
        )

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


class _EventHandler(BaseHTTPRequestHandler):
    runner: Runner
    timeout = 30.0

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
            obj = json.loads(self.rfile.read(length)) if 0 < length <= 64 << 20 else None
            kind = obj.get("event") if isinstance(obj, dict) else None
            event = Assignment.from_json(obj)
        except (ValueError, OSError) as error:
            self._answer(400, {"error": f"not an event: {error}"})
            return
        self.runner.note_agent(event.member_id)
        if kind == "revoked":
            self.runner.revoke(event)
            self._answer(200, {"stopped": True})
        elif kind == "assigned":
            if self.runner.assign(event):
                self._answer(200, {"started": True})
            else:
                self._answer(503, {"error": "shutting down: nothing starts any more"})
        else:
            self._answer(400, {"error": f"unknown event {kind!r}"})

    def _answer(self, code: int, body: dict[str, object]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def _check_agent(runner: Runner) -> Callable[[Assignment], None]:
    """Webhook mode: the status endpoint only tells which agent process is beside us."""

    def check(assignment: Assignment) -> None:
        runner.note_agent(assignment.member_id)

    return check


def run(settings: Settings, stop: threading.Event) -> int:
    """Run what the agent says until `stop` is set, then stop everything."""
    runner = Runner()
    reach = _Reachability()
    server: EventServer | None = None
    on_status: Callable[[Assignment], object]
    if settings.mode == "webhook":
        server = EventServer(settings.listen, runner)
        server.start()
        on_status = _check_agent(runner)
    else:
        on_status = runner.apply
    follower = threading.Thread(
        target=follow, args=(settings, on_status, stop, reach), name="follow", daemon=True
    )
    log.info(
        "sample worker starting: agent at %s (%s)",
        settings.status_url,
        settings.mode,
        extra=logs.fields(event="worker_starting"),
    )
    follower.start()
    while not stop.wait(0.5):
        if reach.unreachable_for() > settings.unreachable_stop_s:
            runner.stop_all(f"the agent has been unreachable for {settings.unreachable_stop_s} s")
    runner.stop_all("shutting down", final=True)
    if server is not None:
        server.close()
    log.info("sample worker stopped", extra=logs.fields(event="worker_exit"))
    return 0


T = TypeVar("T")


def _env(name: str, default: T) -> str | T:
    return env_default(f"SAMPLE_WORKER_{name}", default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m examples.sample_worker",
        description="A sample worker: runs what the worker agent beside it says (its webhook, "
        "or its status endpoint) and logs what it runs. SIGTERM stops everything. Every option "
        "can also be set by the environment variable in parentheses.",
    )
    parser.add_argument(
        "--status-url",
        default=_env("STATUS_URL", DEFAULT_STATUS_URL),
        help="the agent's status endpoint (SAMPLE_WORKER_STATUS_URL; default %(default)s)",
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        default=_env("MODE", "webhook"),
        help="webhook: the agent POSTs revocations and assignments to --listen (worker-agent "
        "run --webhook), answered once done, so nothing runs here and elsewhere at once; watch: "
        "follow GET /watch (server-sent events); poll: poll GET /assignment "
        "(SAMPLE_WORKER_MODE; default %(default)s)",
    )
    parser.add_argument(
        "--listen",
        default=_env("LISTEN", DEFAULT_LISTEN),
        help="host:port of the webhook, --mode webhook (SAMPLE_WORKER_LISTEN; default "
        "%(default)s: the pod's loopback)",
    )
    parser.add_argument(
        "--poll-interval-s",
        type=float,
        default=_env("POLL_INTERVAL_S", 2.0),
        help="seconds between polls (SAMPLE_WORKER_POLL_INTERVAL_S; default %(default)s)",
    )
    parser.add_argument(
        "--unreachable-stop-s",
        type=float,
        default=_env("UNREACHABLE_STOP_S", 10.0),
        help="stop everything when the agent has been unreachable this long "
        "(SAMPLE_WORKER_UNREACHABLE_STOP_S; default %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        default=_env("LOG_LEVEL", "INFO"),
        help="(SAMPLE_WORKER_LOG_LEVEL; default %(default)s)",
    )
    parser.add_argument(
        "--log-format",
        choices=("json", "text"),
        default=_env("LOG_FORMAT", "json"),
        help="json lines or text (SAMPLE_WORKER_LOG_FORMAT; default %(default)s)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.poll_interval_s <= 0 or args.unreachable_stop_s <= 0:
        print("sample_worker: intervals must be positive", file=sys.stderr)
        return 2
    logs.configure(args.log_level, json_lines=args.log_format == "json")
    if args.mode not in MODES:  # from the environment: argparse checks only flags
        print(f"sample_worker: --mode must be one of {MODES}, not {args.mode!r}", file=sys.stderr)
        return 2
    settings = Settings(
        status_url=args.status_url,
        mode=args.mode,
        listen=args.listen,
        poll_interval_s=args.poll_interval_s,
        unreachable_stop_s=args.unreachable_stop_s,
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum, extra=logs.fields(event="worker_signal"))
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return run(settings, stop)


if __name__ == "__main__":
    sys.exit(main())
