"""Workers of two languages in one group, as real processes, and what the tests read from them.

- `NodeWorker`: `node clients/node/worker.js`; its stdout (JSON lines) goes to a file. A resource
  may run from the `ts` of the `start` line naming it to the `ts` of the `stop` line naming it.
- `PythonAgent`: `python -m worker_agent.cli run` with this package's `exec_hook.py`, whose records
  give the same: from an `assigned` record's `t_start` to a `revoked` record's `t_end`.
- `intervals` / `overlaps`: per resource, who may have run it when, and any two of those intervals
  that intersect (which the protocol forbids).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from tests.support.coordinator import REPO

HOOK = Path(__file__).with_name("exec_hook.py")
NODE_WORKER = REPO / "clients" / "node" / "worker.js"
T = TypeVar("T")

#: A resource: ("A",) is connector A, ("A", 0) its task 0.
Resource = tuple[str] | tuple[str, int]


def resources_of(entry: dict[str, Any]) -> set[Resource]:
    """The resources an event names: `connectors` and `tasks` ({"connector", "task"})."""
    out: set[Resource] = {(c,) for c in entry["connectors"]}
    out |= {(t["connector"], int(t["task"])) for t in entry["tasks"]}
    return out


def catalogue_resources(catalogue: dict[str, int]) -> set[Resource]:
    out: set[Resource] = {(c,) for c in catalogue}
    out |= {(c, t) for c, n in catalogue.items() for t in range(n)}
    return out


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout_s: float = 20.0,
    diagnostics: Callable[[], str] = lambda: "",
) -> T:
    """Poll `probe` until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s:g} s waiting for {what}\n{diagnostics()}"
            )
        time.sleep(0.05)


@dataclass(frozen=True)
class Interval:
    worker: str
    resource: Resource
    start: float
    end: float  # math.inf: still running (or killed while running)


class _Process:
    member_id: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def _spawn(self, args: list[str], env: dict[str, str] | None = None) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout_s: float = 20.0) -> int:
        """SIGTERM (stop all work, then leave the group), and wait for the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


class NodeWorker(_Process):
    """The Node.js client (clients/node/worker.js) as a child process."""

    def __init__(
        self, node: str, coordinator: str, group: str, member_id: str, directory: Path
    ) -> None:
        self.node = node
        self.coordinator = coordinator
        self.group = group
        self.member_id = member_id
        self.log_path = directory / f"{member_id}.jsonl"

    def start(self, *extra: str) -> NodeWorker:
        self._spawn(
            [
                self.node,
                str(NODE_WORKER),
                "--coordinator",
                self.coordinator,
                "--group",
                self.group,
                "--member-id",
                self.member_id,
                "--rebalance-timeout-ms",
                "5000",
                *extra,
            ]
        )
        return self

    def lines(self) -> list[dict[str, Any]]:
        """Every JSON line it printed (anything else, e.g. a crash trace, is skipped)."""
        out = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line["event"] == kind]

    def running(self) -> set[Resource]:
        """What it runs now, by its start and stop lines."""
        out: set[Resource] = set()
        for line in self.lines():
            if line["event"] == "start":
                out |= resources_of(line)
            elif line["event"] == "stop":
                out -= resources_of(line)
        return out

    def intervals(self) -> list[Interval]:
        return _intervals(
            self.member_id,
            (
                (line["event"] == "start", line["ts"], resources_of(line))
                for line in self.lines()
                if line["event"] in ("start", "stop")
            ),
        )


class PythonAgent(_Process):
    """`python -m worker_agent.cli run` with the recording exec hook, as a child process."""

    def __init__(self, coordinator: str, group: str, member_id: str, directory: Path) -> None:
        self.coordinator = coordinator
        self.group = group
        self.member_id = member_id
        self.log_path = directory / f"{member_id}.log"
        self.hook_path = directory / f"{member_id}.hook.jsonl"

    def start(self, *extra: str) -> PythonAgent:
        hook = f"{shlex.quote(sys.executable)} -S {shlex.quote(str(HOOK))} "
        hook += shlex.quote(str(self.hook_path))
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}"}
        self._spawn(
            [
                sys.executable,
                "-m",
                "worker_agent.cli",
                "run",
                "--coordinator",
                self.coordinator,
                "--group",
                self.group,
                "--member-id",
                self.member_id,
                "--rebalance-timeout-ms",
                "5000",
                "--exec-hook",
                hook,
                "--log-format",
                "text",
                *extra,
            ],
            env=env,
        )
        return self

    def records(self) -> list[dict[str, Any]]:
        if not self.hook_path.exists():
            return []
        return [json.loads(line) for line in self.hook_path.read_text().splitlines() if line]

    def running(self) -> set[Resource]:
        out: set[Resource] = set()
        for record in self.records():
            if record["event"] == "assigned":
                out |= resources_of(record)
            else:
                out -= resources_of(record)
        return out

    def intervals(self) -> list[Interval]:
        return _intervals(
            self.member_id,
            (
                (
                    r["event"] == "assigned",
                    r["t_start"] if r["event"] == "assigned" else r["t_end"],
                    resources_of(r),
                )
                for r in self.records()
            ),
        )


Worker = NodeWorker | PythonAgent


class HasIntervals(Protocol):
    def intervals(self) -> list[Interval]: ...


def _intervals(worker: str, changes: Iterable[tuple[bool, float, set[Resource]]]) -> list[Interval]:
    """Intervals from (started?, time, resources) in log order; still open ones end at inf."""
    opened: dict[Resource, float] = {}
    out: list[Interval] = []
    for started, at, resources in changes:
        for resource in resources:
            if started:
                assert resource not in opened, f"{worker} started {resource} twice"
                opened[resource] = at
            elif resource in opened:
                out.append(Interval(worker, resource, opened.pop(resource), at))
    out.extend(Interval(worker, r, t, math.inf) for r, t in opened.items())
    return out


def overlaps(workers: Iterable[HasIntervals]) -> list[tuple[Interval, Interval]]:
    """Every pair of intervals in which the same resource ran twice at once."""
    by_resource: dict[Resource, list[Interval]] = {}
    for worker in workers:
        for interval in worker.intervals():
            by_resource.setdefault(interval.resource, []).append(interval)
    out: list[tuple[Interval, Interval]] = []
    for intervals in by_resource.values():
        intervals.sort(key=lambda i: i.start)
        for i, a in enumerate(intervals):
            out.extend((a, b) for b in intervals[i + 1 :] if b.start < a.end)
    return out
