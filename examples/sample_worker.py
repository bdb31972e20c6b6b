"""A sample worker for the deployment example (`deploy/k8s/`): it follows the worker agent beside
it through the agent's status endpoint and logs what it runs.

    python -m examples.sample_worker --status-url http://127.0.0.1:8084

It reads ``GET /watch`` (server-sent events: the current assignment at once, then one event per
change) and, when the stream cannot be had, polls ``GET /assignment`` until it can; ``--mode
poll`` only polls. It "runs" exactly what the latest assignment lists, and writes one JSON log
line per change: what it stopped, what it started (with their fencing tokens, DESIGN 3.18: what a
real worker passes with every write to a system that checks them), and what it runs now. When
the agent cannot be reached for ``--unreachable-stop-s`` it stops everything (the agent may have
been fenced or replaced, and could not say so). SIGTERM or SIGINT: stop everything, exit 0.
Every option has an environment variable ``SAMPLE_WORKER_<OPTION>``.

This worker only *follows* the agent: the agent acknowledges a revocation once its own listener
has returned, which does not wait for this program. A real worker that must never run a task at
the same time as another worker takes the agent's webhook or exec hook instead (``worker-agent
run --webhook``), whose successful answer is what lets the agent acknowledge.
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
from typing import Any, TypeVar

from connect_protocol import logs
from connect_protocol.env import env_default

__all__ = [
    "Assignment",
    "Runner",
    "Settings",
    "follow",
    "main",
    "parse_sse",
]

log = logging.getLogger("sample_worker")

DEFAULT_STATUS_URL = "http://127.0.0.1:8084"
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
    """

    member_epoch: int
    connectors: frozenset[str]
    tasks: frozenset[TaskName]
    ready: bool
    fencing_tokens: tuple[tuple[str, int], ...] = ()

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
        mode: "watch" (the /watch stream, polling while it is unavailable) or "poll".
        poll_interval_s: seconds between two polls of /assignment.
        unreachable_stop_s: stop everything after the agent has been unreachable this long.
        read_timeout_s: give up on a silent /watch stream after this long (the agent sends a
            keepalive every 15 s).
    """

    status_url: str = DEFAULT_STATUS_URL
    mode: str = "watch"
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
    on_assignment: Callable[[Assignment], None],
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
    on_assignment: Callable[[Assignment], None],
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


def run(settings: Settings, stop: threading.Event) -> int:
    """Follow the agent until `stop` is set, then stop everything."""
    runner = Runner()
    reach = _Reachability()
    follower = threading.Thread(
        target=follow, args=(settings, runner.apply, stop, reach), name="follow", daemon=True
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
    log.info("sample worker stopped", extra=logs.fields(event="worker_exit"))
    return 0


T = TypeVar("T")


def _env(name: str, default: T) -> str | T:
    return env_default(f"SAMPLE_WORKER_{name}", default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m examples.sample_worker",
        description="A sample worker: follows the worker agent's status endpoint and logs what "
        "it runs. SIGTERM stops everything. Every option can also be set by the environment "
        "variable in parentheses.",
    )
    parser.add_argument(
        "--status-url",
        default=_env("STATUS_URL", DEFAULT_STATUS_URL),
        help="the agent's status endpoint (SAMPLE_WORKER_STATUS_URL; default %(default)s)",
    )
    parser.add_argument(
        "--mode",
        choices=("watch", "poll"),
        default=_env("MODE", "watch"),
        help="follow GET /watch (server-sent events) or poll GET /assignment "
        "(SAMPLE_WORKER_MODE; default %(default)s)",
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
    settings = Settings(
        status_url=args.status_url,
        mode=args.mode,
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
