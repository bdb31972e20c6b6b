"""Real worker agents whose exec hook records every resource on its own (`resource_hook.py`), and
what the tests of partial release and paced waves conclude from those records.

- `HookCosts` and `ResourceAgent`: an `AgentProcess` whose exec hook starts and stops the
  resources of each call concurrently, each with its own cost (e.g. one connector's tasks stop in
  3 s, everything else in 10 ms), and reports each as released as it stops when the agent runs with
  `--release per-resource`. Optionally behind a start gate (`gated_agent.py`), so that several
  agents join at the same moment.
- `ResourceFleet`: a `Fleet` whose checks read each resource's own stop time: with per-resource
  release a resource's next owner may start it while the rest of its revoked call still stops, so
  the call's end is too late an end for it (`Fleet`'s reading would see an overlap that is none).
- `resource_calls`: every hook call of a fleet, with per-resource begin and end times.
- `moves`: per resource revoked since a moment, the revoked call that stopped it and the first
  assigned call that started it again on another worker: when it stopped, when it was started,
  how long it was not running, and which other resources were revoked in the same call (batch).
- `peak_in_motion`: the most resources in motion at once, from the records; `InMotionPoller`:
  the same from DescribeGroups polls (DESIGN 3.18: in motion from the target that moves a
  resource until its new owner has been sent it, i.e. in some member's target but not yet in its
  current assignment).
- `distribution`: median, p95 and max of a list of durations.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.agents import (
    AgentProcess,
    Fleet,
    HookRecord,
    Interval,
    intervals_of,
    member_sets,
)

__all__ = [
    "Distribution",
    "HookCosts",
    "InMotionPoller",
    "Move",
    "ResourceAgent",
    "ResourceCall",
    "ResourceFleet",
    "add_agents",
    "connector_of",
    "distribution",
    "in_motion",
    "is_task",
    "moves",
    "open_gate",
    "peak_in_motion",
    "resource_calls",
]

HOOK_SCRIPT = Path(__file__).with_name("resource_hook.py")


def is_task(resource: str) -> bool:
    head, _, tail = resource.rpartition("-")
    return bool(head) and tail.isdigit()


def connector_of(resource: str) -> str:
    return resource.rpartition("-")[0] if is_task(resource) else resource


# --- the agents ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HookCosts:
    """What `resource_hook.py` takes per resource: `stop_s` and `start_s` for every resource,
    except the tasks of the connectors in `task_stop_s`, which stop in their own time."""

    stop_s: float = 0.01
    start_s: float = 0.01
    task_stop_s: Mapping[str, float] = field(default_factory=dict)

    def argv(self) -> list[str]:
        out = ["--stop-s", f"{self.stop_s:g}", "--start-s", f"{self.start_s:g}"]
        for connector, seconds in sorted(self.task_stop_s.items()):
            out += ["--task-stop-s", f"{connector}={seconds:g}"]
        return out


class ResourceAgent(AgentProcess):
    """An `AgentProcess` with `resource_hook.py` as its exec hook, `--release release`, and, with
    `gate`, started through `gated_agent.py` (it joins only once `gate` exists; `ready()` says
    whether its current incarnation has finished importing and waits at the gate)."""

    def __init__(
        self,
        member_id: str,
        coordinator: str,
        group: str,
        workdir: Path,
        *,
        costs: HookCosts,
        release: str = "batch",
        gate: Path | None = None,
        extra_args: Iterable[str] = (),
        **kw: Any,
    ) -> None:
        super().__init__(
            member_id,
            coordinator,
            group,
            workdir,
            extra_args=(*extra_args, "--release", release),
            **kw,
        )
        self.costs = costs
        self.release = release
        self.gate = gate

    def _ready_file(self, hook_file: Path) -> Path:
        return hook_file.with_name(hook_file.name.removesuffix(".hooks.jsonl") + ".ready")

    def ready(self) -> bool:
        return self._ready_file(self.current.hook_file).exists()

    def command(self, hook_file: Path) -> list[str]:
        args = super().command(hook_file)
        hook = shlex.join(
            [sys.executable, "-S", str(HOOK_SCRIPT), str(hook_file), *self.costs.argv()]
        )
        args[args.index("--exec-hook") + 1] = hook
        if self.gate is not None:
            assert args[1:3] == ["-m", "worker_agent.cli"], args[:3]
            gated = [
                "-m",
                "tests.support.gated_agent",
                str(self.gate),
                str(self._ready_file(hook_file)),
            ]
            args[1:3] = gated
        return args


def add_agents(
    fleet: Fleet,
    member_ids: Iterable[str],
    costs: HookCosts,
    release: str = "batch",
    gate: Path | None = None,
    **kw: Any,
) -> list[ResourceAgent]:
    """Create (not start) `ResourceAgent`s in `fleet`, which then starts, checks and kills them
    like its own."""
    out = []
    for m in member_ids:
        assert m not in fleet.agents, m
        agent = ResourceAgent(
            m,
            fleet.coordinator,
            fleet.group,
            fleet.workdir / "agents",
            costs=costs,
            release=release,
            gate=gate,
            **kw,
        )
        fleet.agents[m] = agent
        out.append(agent)
    return out


def open_gate(agents: Sequence[ResourceAgent], gate: Path, timeout_s: float = 30.0) -> float:
    """Wait until every (gated, started) agent waits at `gate`, then open it; the time it
    opened (time.time())."""
    deadline = time.monotonic() + timeout_s
    while not all(a.ready() for a in agents):
        if time.monotonic() > deadline:
            waiting = [a.member_id for a in agents if not a.ready()]
            raise AssertionError(f"agents {waiting} not at the gate after {timeout_s:g} s")
        time.sleep(0.02)
    opened = time.time()
    gate.touch()
    return opened


# --- the records --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourceCall:
    """One completed hook call: its resources and each one's own begin and end."""

    worker: str  # member id
    runner: str  # incarnation label, "W2#1"
    event: str  # "assigned" | "revoked"
    member_epoch: int
    release: str
    t_start: float
    t_end: float
    spans: Mapping[str, tuple[float, float]]

    @property
    def resources(self) -> frozenset[str]:
        return frozenset(self.spans)

    @staticmethod
    def parse(line: str, runner: str) -> ResourceCall:
        raw = json.loads(line)
        spans = {name: (float(b), float(e)) for name, (b, e) in raw["resources"].items()}
        return ResourceCall(
            worker=raw["worker"],
            runner=runner,
            event=raw["event"],
            member_epoch=int(raw["member_epoch"]),
            release=raw.get("release", "batch"),
            t_start=float(raw["t_start"]),
            t_end=float(raw["t_end"]),
            spans=spans,
        )


def hook_records(line: str, runner: str) -> list[HookRecord]:
    """One hook line as `HookRecord`s: a revoked call of `resource_hook.py` as one record per
    resource, from the call's start to that resource's own stop (each was released then); any
    other line as `HookRecord.parse` reads it."""
    record = HookRecord.parse(line, runner)
    if record.event != "revoked":
        return [record]
    call = ResourceCall.parse(line, runner) if '"resources"' in line else None
    if call is None:
        return [record]
    return [
        HookRecord(
            worker=record.worker,
            event=record.event,
            member_epoch=record.member_epoch,
            resources=frozenset([name]),
            t_start=begin,
            t_end=end,
            incarnation=runner,
        )
        for name, (begin, end) in sorted(call.spans.items())
    ]


class ResourceFleet(Fleet):
    """A `Fleet` whose intervals (and so its checks: no overlap, every resource on one live
    worker) end each revoked resource at its own stop, not at its revoked call's end."""

    def intervals(self) -> list[Interval]:
        out: list[Interval] = []
        problems: list[str] = []
        for agent in self.agents.values():
            for inc in agent.incarnations:
                records: list[HookRecord] = []
                if inc.hook_file.exists():
                    for line in inc.hook_file.read_text().splitlines():
                        if line.strip():
                            records += hook_records(line, inc.label)
                got, bad = intervals_of(records, inc.label, inc.member_id, inc.killed_at)
                out += got
                problems += bad
        assert not problems, "inconsistent hook records:\n" + "\n".join(problems)
        return out


def resource_calls(fleet: Fleet) -> list[ResourceCall]:
    """Every hook call of every incarnation of the fleet's agents, by start time."""
    out: list[ResourceCall] = []
    for agent in fleet.agents.values():
        for inc in agent.incarnations:
            if not inc.hook_file.exists():
                continue
            for line in inc.hook_file.read_text().splitlines():
                if line.strip():
                    out.append(ResourceCall.parse(line, inc.label))
    return sorted(out, key=lambda c: (c.t_start, c.t_end))


@dataclass(frozen=True)
class Move:
    """A resource stopped on one worker (`stop`, a revoked call) and started on another
    (`start`, the first assigned call of it elsewhere after the stop began)."""

    resource: str
    stop: ResourceCall
    start: ResourceCall

    @property
    def source(self) -> str:
        return self.stop.worker

    @property
    def target(self) -> str:
        return self.start.worker

    @property
    def stop_began(self) -> float:
        return self.stop.spans[self.resource][0]

    @property
    def stop_ended(self) -> float:
        return self.stop.spans[self.resource][1]

    @property
    def start_began(self) -> float:
        return self.start.spans[self.resource][0]

    @property
    def start_ended(self) -> float:
        return self.start.spans[self.resource][1]

    @property
    def not_running_s(self) -> float:
        """From the start of the revoked call that stops it on the old worker to the end of the
        assigned call that starts it on the new one."""
        return self.start.t_end - self.stop.t_start

    @property
    def batch(self) -> frozenset[str]:
        """Everything revoked in the same call."""
        return self.stop.resources


def moves(calls: Sequence[ResourceCall], since: float) -> tuple[list[Move], list[str]]:
    """Every resource revoked by a call that began at or after `since`, paired with the call
    that started it next on another worker; and the revoked resources that were never started
    elsewhere afterwards (problems)."""
    out: list[Move] = []
    problems: list[str] = []
    for stop in calls:
        if stop.event != "revoked" or stop.t_start < since:
            continue
        for r in sorted(stop.resources):
            start = next(
                (
                    c
                    for c in calls
                    if c.event == "assigned"
                    and r in c.spans
                    and c.worker != stop.worker
                    and c.t_start >= stop.t_start
                ),
                None,
            )
            if start is None:
                problems.append(
                    f"{r} stopped on {stop.runner} at {stop.t_start:.3f}, never restarted"
                )
            else:
                out.append(Move(r, stop, start))
    return out, problems


def peak_in_motion(found: Iterable[Move]) -> int:
    """The most resources in motion at once by the records: a resource is in motion from the
    start of the revoked call that stops it to the start of the assigned call that starts it on
    its new owner (which began after the coordinator had sent it there)."""
    edges = []
    for m in found:
        edges.append((m.stop.t_start, 1))
        edges.append((m.start.t_start, -1))
    peak = now = 0
    for _, step in sorted(edges):  # at a tie the end (-1) counts first
        now += step
        peak = max(peak, now)
    return peak


# --- DescribeGroups -----------------------------------------------------------------------------


def in_motion(group: Any) -> frozenset[str]:
    """The resources some member's target holds that its current assignment does not (yet)."""
    target = member_sets(group, "target_assignment")
    current = member_sets(group)
    out: set[str] = set()
    for member, share in target.items():
        out |= share - current.get(member, set())
    return frozenset(out)


class InMotionPoller:
    """A thread that polls DescribeGroups every `interval_s` and keeps, per poll, the time and
    the resources in motion (`in_motion`)."""

    def __init__(self, fleet: Fleet, interval_s: float = 0.03) -> None:
        self.fleet = fleet
        self.interval_s = interval_s
        self.samples: list[tuple[float, frozenset[str]]] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="in-motion-poller", daemon=True)

    def __enter__(self) -> InMotionPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            group = self.fleet.try_describe()
            if group is None:
                self.failures += 1
            else:
                self.samples.append((time.time(), in_motion(group)))
            self._stop.wait(self.interval_s)

    @property
    def peak(self) -> int:
        return max((len(s) for _, s in self.samples), default=0)


# --- distributions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Distribution:
    n: int
    median: float
    p95: float
    max: float

    def cells(self) -> list[str]:
        if not self.n:
            return ["0", "-", "-", "-"]
        return [str(self.n), f"{self.median:.3f}", f"{self.p95:.3f}", f"{self.max:.3f}"]


def distribution(values: Iterable[float]) -> Distribution:
    """Median (the middle value, or the mean of the two middle ones), p95 (nearest rank: the
    smallest value with at least 95 % of the values at or below it) and max."""
    xs = sorted(values)
    if not xs:
        return Distribution(0, math.nan, math.nan, math.nan)
    n = len(xs)
    mid = n // 2
    median = xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2
    p95 = xs[max(0, math.ceil(0.95 * n) - 1)]
    return Distribution(n, median, p95, xs[-1])
