#!/usr/bin/env python3
"""Rebalance benchmark: Kafka Connect today (the classic protocol, eager and sessioned) against
this coordinator's connect protocol, on the same scenarios, in the same run (issue 26).

Run it through ./bench/run-rebalance (see bench/README.md, "Rebalance benchmark"). It starts
`coordinator-svc serve` as a subprocess (a throwaway PostgreSQL with durable commits, or an SQLite
file in a temporary directory with --store sqlite), then, for each scenario and each protocol, a
fresh group whose workers are in-process agents on threads, each with its own `CallbackListener`
that sleeps for every start and stop and records when each call began and ended. Protocols
(--protocols):

  classic-eager      Kafka Connect today with connect.protocol=eager: `ClassicAgent`s (Kafka's
                     JoinGroup/SyncGroup, Connect's WorkerCoordinator as ported here), JoinGroup
                     protocol `default` only, Connect's EagerAssignor on the leader, every worker
                     stopping everything before every JoinGroup.
  classic-sessioned  Kafka Connect today with its default connect.protocol=sessioned:
                     `ClassicAgent`s, Connect's IncrementalCooperativeAssignor on the leader
                     (revocations, then reassignment; a departed worker's work held back for
                     scheduled.rebalance.max.delay.ms). The baseline of the ratio columns.
  connect            this coordinator's connect protocol (`Agent`, ConnectGroupHeartbeat,
                     incremental_cooperative computed by a member, DESIGN 3.8); a worker keeps
                     its member id across restarts (no instance id).
  connect-eager      the connect protocol's eager path (not in the default run).

Timeouts: Connect's and Kafka's defaults (CONNECT_DEFAULTS: session 10000, heartbeat 3000,
rebalance 60000, scheduled.rebalance.max.delay.ms 300000, group.initial.rebalance.delay.ms 3000
ms) divided by one factor, --timeout-factor (the coordinator's group defaults, the classic
agents' own settings and the coordinator's classic bounds alike); a single timeout given
explicitly overrides it, and the header then says the run is not on a single factor.

Scenarios (WORKERS workers; the catalogue CONNECTORS x TASKS):

  restart  rolling restart: each worker in turn is stopped gracefully (stop(): revoke everything,
           then leave, as on SIGTERM), started again at once, and the group is waited for until
           quiet before the next one. A classic worker comes back as a new member (the
           coordinator makes member ids); a connect worker under the same member id.
  scale    the group grows to SCALE_TO workers, the new ones started at once.
  bounce   one worker that is not the leader is stopped gracefully and started again a third of
           scheduled.rebalance.max.delay.ms after it has left (within the delay).
  leader   the leader (classic: DescribeGroups' classic.leader_id; connect: the assignor member)
           is killed as by SIGKILL (`KillableTransport.kill()`: its calls fail at once, nothing
           is revoked or left; its listener records end at the kill), and a replacement starts
           half a session timeout later (a pod restart: classic, a new member; connect, the
           same member id).
  heavy    seed 002's Design III case (connect only, its own timeouts, not in the default run):
           a HEAVY_WORKERS-worker group grows to HEAVY_SCALE_TO workers (3 -> 6), with one heavy
           connector (`slow`, HEAVY_TASKS tasks that take HEAVY_STOP_MS to stop) among
           LIGHT_CONNECTORS light ones (LIGHT_TASKS tasks each, LIGHT_STOP_MS to stop); each
           listener call starts or stops its resources concurrently, each in its own time. Run in
           variants instead of protocols (all `connect`): `baseline` (today: batch release, no
           waves), `per-resource` (the listener calls `event.release` as each resource stops,
           DESIGN 3.11), `waves` (per-resource release and paced waves,
           rebalance.wave.max.resources / rebalance.wave.pause.ms, DESIGN 3.18) and `reference`
           (no heavy connector: its tasks stop in LIGHT_STOP_MS too; batch release).
           `--scenarios heavy` runs it alone.

Each scenario and protocol (or variant) runs REPEAT times, interleaved, each in a fresh group; the
table shows medians with their range.

The group is "quiet" when every expected worker is a member at the current epoch or generation
with nothing pending revocation, the members' current assignments cover the whole catalogue,
every worker's listener has started exactly its current assignment, and every agent itself has
settled on it. Connect groups: DescribeGroups says STABLE with the group epoch equal to the
assignment epoch and no delayed rebalance pending, and each member's current assignment is its
target. Classic groups: the classic state is STABLE, no SyncGroup is awaited and no member id is
pending, every member has synced, and no agent has a rejoin due (Connect's delay lives in the
workers' memory, not in DescribeGroups).

Figures per protocol and scenario, over the window from the first disturbance to the last quiet:

  task stops              tasks the listeners were told to stop (on_revoked) in the window.
  task-seconds not running  the integral over the window of the number of catalogue tasks that no
                          worker runs; a task runs on a worker from the return of the on_assigned
                          that started it to the call of the on_revoked that stops it.
  longest not running     the longest single span in the window during which one task ran on no
                          worker (the maximum over the tasks).
  time to converge        from the disturbance (the stop() call, the kill, or the first new
                          worker's start) to the first poll that sees the group quiet (the rolling
                          restart: the mean per restart).

Each of the four against classic sessioned's median in the same scenario (1.00x for itself), and a
closing note: whether the connect protocol's task-seconds not running are at most 10 % of classic
sessioned's, per scenario and summed (reported; the exit status does not depend on it).

And one check over the whole run, set-up and tear-down included: no connector or task was ever
held by two workers (or two incarnations of one worker) at once, where a worker holds a resource
from the call of the on_assigned that starts it to the return of the on_revoked that stops it (in
the heavy scenario, whose listener stops each resource on its own, to that resource's stop; for a
killed worker, to the kill). If that fails, or a group never converges, the run says so loudly
and exits 1.

The heavy scenario has its own table, one row per variant: per moved task, its time not running,
from the call of the on_revoked that stops it on its old worker to the return of the on_assigned
that starts it on its new one, as a distribution (median, p95 by nearest rank, max) over the
moved tasks of all repeats, light and heavy tasks apart, with the light p95 against the baseline's
and the reference's; the time to converge; the most resources in motion at once (by the
listener calls, from on_revoked's call to on_assigned's call, and by the DescribeGroups polls,
in some member's target and not yet in its current assignment); and how many light tasks,
revoked in the same call as heavy ones, were not started until one of those had stopped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "generated"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import grpc  # noqa: E402
from connect.group.v1 import admin_pb2, admin_pb2_grpc  # noqa: E402

from connect_protocol.configs import (  # noqa: E402
    ASSIGNMENT_INTERVAL,
    HEARTBEAT_INTERVAL,
    SCHEDULED_REBALANCE_MAX_DELAY,
    SESSION_TIMEOUT,
)
from connect_protocol.resources import EMPTY, ResourceSet, TaskId  # noqa: E402
from tests.support.classic_agents import KillableTransport  # noqa: E402
from tests.support.coordinator import CoordinatorProcess  # noqa: E402
from worker_agent.assignors import assignors_for_protocol  # noqa: E402
from worker_agent.classic.membership import ClassicPhase  # noqa: E402
from worker_agent.classic.runtime import ClassicAgent  # noqa: E402
from worker_agent.listener import (  # noqa: E402
    CallbackListener,
    RebalanceEvent,
    WorkerRebalanceListener,
)
from worker_agent.membership import Membership, Phase  # noqa: E402
from worker_agent.metrics import SELF_FENCE_REASONS  # noqa: E402
from worker_agent.runtime import Agent, AgentSettings  # noqa: E402

RESULTS = REPO / "bench" / "results"


@dataclass(frozen=True)
class Protocol:
    """How one protocol's workers run."""

    group_protocol: str  # AgentSettings.group_protocol: "classic" or "connect"
    connect_protocol: str  # AgentSettings.protocol (Connect's connect.protocol)
    title: str

    @property
    def classic(self) -> bool:
        return self.group_protocol == "classic"


PROTOCOLS = {
    "classic-eager": Protocol(
        "classic",
        "eager",
        "Kafka Connect today, connect.protocol=eager (JoinGroup [default], EagerAssignor, "
        "everything stopped before every JoinGroup)",
    ),
    "classic-sessioned": Protocol(
        "classic",
        "sessioned",
        "Kafka Connect today, connect.protocol=sessioned, its default "
        "(IncrementalCooperativeAssignor with scheduled.rebalance.max.delay.ms)",
    ),
    "connect": Protocol(
        "connect",
        "sessioned",
        "this coordinator's connect protocol (incremental_cooperative, DESIGN 3.8)",
    ),
    "connect-eager": Protocol(
        "connect", "eager", "the connect protocol's eager path (DESIGN 3.15)"
    ),
}
DEFAULT_PROTOCOLS = ("classic-eager", "classic-sessioned", "connect")
#: The ratio columns divide by this protocol's median in the same scenario.
BASELINE = "classic-sessioned"
#: The closing note: the connect protocol's task-seconds not running at most this share of the
#: baseline's (reported, not gated).
NOTE_PROTOCOL = "connect"
NOTE_SHARE = 0.10
#: The table's figures, each with its ratio against BASELINE: (key in Run.figures, title, unit).
MAIN_FIGURES = (
    ("task_stops", "task stops", "n"),
    ("task_seconds_not_running", "task-seconds not running", "s"),
    ("longest_not_running_s", "longest not running (s)", "s"),
    ("converge_s", "time to converge (s)", "s"),
)
#: The details table's (medians).
DETAIL_FIGURES = (
    ("task_starts", "task starts", "n"),
    ("tasks_interrupted", "tasks interrupted", "n"),
    ("peak_tasks_not_running", "most down at once", "n"),
    ("connector_stops", "connector stops", "n"),
    ("connector_seconds_not_running", "connector-seconds not running", "s"),
    ("converge_max_s", "converge, max per disturbance (s)", "s"),
    ("group_epoch_bumps", "epoch bumps", "n"),
)
SCENARIOS = ("restart", "scale", "bounce", "leader", "heavy")
DEFAULT_SCENARIOS = ("restart", "scale", "bounce", "leader")
SCENARIO_TITLES = {
    "restart": "rolling restart",
    "scale": "scale-out",
    "bounce": "bounce within the delay",
    "leader": "leader lost",
    "heavy": "heavy connector scale-out",
}
DELAY_KEY = SCHEDULED_REBALANCE_MAX_DELAY.name
WAVE_MAX_KEY = "rebalance.wave.max.resources"
WAVE_PAUSE_KEY = "rebalance.wave.pause.ms"

#: Connect's and Kafka's defaults (Connect's DistributedConfig: session.timeout.ms,
#: heartbeat.interval.ms, rebalance.timeout.ms, scheduled.rebalance.max.delay.ms; the broker's
#: group.initial.rebalance.delay.ms), each divided by --timeout-factor. Keys are the flags that
#: override one of them.
CONNECT_DEFAULTS = {
    "session_timeout_ms": ("session.timeout.ms", 10_000),
    "heartbeat_interval_ms": ("heartbeat.interval.ms", 3_000),
    "rebalance_timeout_ms": ("rebalance.timeout.ms", 60_000),
    "scheduled_rebalance_max_delay_ms": (DELAY_KEY, 300_000),
    "initial_rebalance_delay_ms": ("group.initial.rebalance.delay.ms", 3_000),
}
#: The coordinator's --classic-min-session-timeout-ms is Kafka's group.min.session.timeout.ms
#: (6000) or the scaled session timeout, whichever is lower (else the classic agents' JoinGroups
#: would be refused).
CLASSIC_MIN_SESSION_TIMEOUT_MS = 6_000

#: The heavy scenario keeps the timeouts it was measured with before issue 26 (the connect
#: protocol only; the factor does not apply): set on its groups, and its agents' rebalance timeout.
HEAVY_GROUP_CONFIGS = {
    SESSION_TIMEOUT.name: "3000",
    HEARTBEAT_INTERVAL.name: "250",
    DELAY_KEY: "10000",
}
HEAVY_REBALANCE_TIMEOUT_MS = 10_000
#: The heavy scenario's heavy connector. The assignor gives up the highest names first (DESIGN
#: 3.8), and "slow" sorts after "light-*": its tasks leave each old worker with light ones.
HEAVY_CONNECTOR = "slow"


@dataclass(frozen=True)
class Variant:
    """One way the heavy scenario runs."""

    title: str
    heavy: bool  # the heavy connector's tasks are slow to stop (else as light as the others)
    per_resource: bool  # the listener releases each resource as it stops
    waves: bool  # paced waves configured


HEAVY_VARIANTS = {
    "baseline": Variant("today: batch release, no waves", True, False, False),
    "per-resource": Variant("per-resource release", True, True, False),
    "waves": Variant("per-resource release + paced waves", True, True, True),
    "reference": Variant("no heavy connector, batch release", False, False, False),
}
PG_SETTINGS = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}

#: A resource: (connector, task number) for a task, (connector, -1) for the connector itself.
Key = tuple[str, int]
#: A resource of a group: (group, connector, task number or -1).
GroupKey = tuple[str, str, int]
#: One incarnation of one worker: (group, worker name, incarnation number from 1). The name is
#: the member id on the connect protocol, a label on the classic one (the coordinator makes ids).
Owner = tuple[str, str, int]


def log(msg: str) -> None:
    print(f"[rebalance {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def is_task(key: Key) -> bool:
    return key[1] >= 0


def show_key(key: GroupKey) -> str:
    return f"{key[0]}/{key[1]}" if key[2] < 0 else f"{key[0]}/{key[1]}-{key[2]}"


def show_owner(owner: Owner) -> str:
    return f"{owner[1]}#{owner[2]}"


# --- what the listeners did ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    """One listener call, as the worker saw it (time.monotonic() seconds)."""

    owner: Owner
    kind: str  # "assigned" | "revoked"
    begin: float
    end: float
    keys: tuple[Key, ...]
    #: When each of `keys` was done (the concurrent listener of the heavy scenario); empty: all
    #: at `end`.
    key_ends: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Interval:
    owner: Owner
    start: float
    end: float


@dataclass
class Intervals:
    """Per resource: when each worker incarnation held it and when it ran there."""

    #: [on_assigned called, on_revoked returned (or, for the heavy scenario's listener, the
    #: resource's own stop)]: the span in which it may be running there.
    held: dict[GroupKey, list[Interval]] = field(default_factory=dict)
    #: [on_assigned returned, on_revoked called]: the span in which it surely runs there.
    running: dict[GroupKey, list[Interval]] = field(default_factory=dict)
    anomalies: list[str] = field(default_factory=list)


class Recorder:
    """Every listener call of every worker, and what each worker incarnation runs now."""

    def __init__(self, start_s: float, stop_s: float) -> None:
        self.start_per_resource_s = start_s
        self.stop_per_resource_s = stop_s
        self._lock = threading.Lock()
        self.calls: list[Call] = []
        self._running: dict[Owner, set[Key]] = {}
        self._busy: set[Owner] = set()  # inside a listener call
        #: Killed incarnations: when (a SIGKILL ends everything a worker runs at once; what its
        #: agent does afterwards does not count).
        self.frozen: dict[Owner, float] = {}

    def freeze(self, owner: Owner, at: float) -> None:
        """The incarnation was killed at `at`: what it ran ends there, and its listener calls
        from then on are not recorded (they return at once)."""
        with self._lock:
            self.frozen[owner] = at
            self._running.pop(owner, None)
            self._busy.discard(owner)

    def _is_frozen(self, owner: Owner) -> bool:
        with self._lock:
            return owner in self.frozen

    def listener(self, owner: Owner) -> CallbackListener:
        with self._lock:
            self._running.setdefault(owner, set())
        return CallbackListener(
            on_revoked=lambda event: self._call(owner, event),
            on_assigned=lambda event: self._call(owner, event),
        )

    def _call(self, owner: Owner, event: RebalanceEvent) -> None:
        keys = tuple(
            [(c, -1) for c in event.connectors] + [(t.connector, t.task) for t in event.tasks]
        )
        per = self.start_per_resource_s if event.event == "assigned" else self.stop_per_resource_s
        if self._is_frozen(owner):
            return
        with self._lock:
            self._busy.add(owner)
        begin = time.monotonic()
        if keys and per > 0:
            time.sleep(len(keys) * per)
        end = time.monotonic()
        with self._lock:
            self.calls.append(Call(owner, event.event, begin, end, keys))
            self._busy.discard(owner)
            running = self._running.get(owner)
            if running is None:  # frozen meanwhile
                return
            if event.event == "assigned":
                running.update(keys)
            else:
                running.difference_update(keys)

    def concurrent_listener(
        self,
        owner: Owner,
        stop_s: Callable[[Key], float],
        start_s: float,
        per_resource: bool,
    ) -> CallbackListener:
        """The heavy scenario's listener: a call starts (`start_s`) or stops (`stop_s(key)`) its
        resources concurrently, each done at the call's start plus its own time (it sleeps to
        each end in turn, shortest first: the timeline of one thread per resource); with
        `per_resource`, on_revoked calls `event.release` for each resource as it is done."""
        with self._lock:
            self._running.setdefault(owner, set())

        def call(event: RebalanceEvent) -> None:
            self._concurrent_call(owner, event, stop_s, start_s, per_resource)

        return CallbackListener(on_revoked=call, on_assigned=call)

    def _concurrent_call(
        self,
        owner: Owner,
        event: RebalanceEvent,
        stop_s: Callable[[Key], float],
        start_s: float,
        per_resource: bool,
    ) -> None:
        keys = tuple(
            [(c, -1) for c in event.connectors] + [(t.connector, t.task) for t in event.tasks]
        )
        revoked = event.event == "revoked"
        if self._is_frozen(owner):
            return
        with self._lock:
            self._busy.add(owner)
        begin = time.monotonic()
        ends: dict[Key, float] = {}
        for cost, key in sorted((stop_s(k) if revoked else start_s, k) for k in keys):
            left = begin + cost - time.monotonic()
            if left > 0:
                time.sleep(left)
            ends[key] = time.monotonic()
            if revoked and per_resource:
                event.release(key[0] if key[1] < 0 else TaskId(key[0], key[1]))
        end = time.monotonic()
        with self._lock:
            self.calls.append(
                Call(owner, event.event, begin, end, keys, tuple(ends[k] for k in keys))
            )
            self._busy.discard(owner)
            running = self._running.get(owner)
            if running is None:  # frozen meanwhile
                return
            if revoked:
                running.difference_update(keys)
            else:
                running.update(keys)

    def running(self, owner: Owner) -> tuple[frozenset[Key], bool]:
        """What the incarnation's listener has started and not stopped, and whether a listener
        call of it is under way."""
        with self._lock:
            return frozenset(self._running.get(owner, ())), owner in self._busy

    def snapshot(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    def intervals(self, end_of_run: float) -> Intervals:
        """Replays the calls of each incarnation in order (its listener calls are sequential).
        A killed incarnation's calls end at the kill: what it held or ran then ends there."""
        out = Intervals()
        by_owner: dict[Owner, list[Call]] = {}
        for call in self.snapshot():
            by_owner.setdefault(call.owner, []).append(call)
        with self._lock:
            frozen = dict(self.frozen)
        for owner, calls in sorted(by_owner.items()):
            group = owner[0]
            killed = frozen.get(owner)
            cut = float("inf") if killed is None else killed
            open_: dict[Key, tuple[float, float]] = {}  # key -> (assign begin, assign end)
            for call in sorted(calls, key=lambda c: c.begin):
                if call.begin >= cut:
                    continue
                for i, key in enumerate(call.keys):
                    gkey = (group, *key)
                    if call.kind == "assigned":
                        if key in open_:
                            out.anomalies.append(
                                f"{show_owner(owner)} was told to start {show_key(gkey)} "
                                f"again while running it (t={call.begin:.3f})"
                            )
                            continue
                        open_[key] = (call.begin, min(call.end, cut))
                    else:
                        if key not in open_:
                            out.anomalies.append(
                                f"{show_owner(owner)} was told to stop {show_key(gkey)}, "
                                f"which it did not run (t={call.begin:.3f})"
                            )
                            continue
                        a_begin, a_end = open_.pop(key)
                        # A resource released on its own is held until it stopped, not until
                        # the call returned.
                        stopped = call.key_ends[i] if call.key_ends else call.end
                        stopped = min(stopped, cut)
                        out.held.setdefault(gkey, []).append(Interval(owner, a_begin, stopped))
                        out.running.setdefault(gkey, []).append(Interval(owner, a_end, call.begin))
            for key, (a_begin, a_end) in open_.items():
                gkey = (group, *key)
                if killed is not None:  # everything it ran ended at the kill
                    out.held.setdefault(gkey, []).append(Interval(owner, a_begin, killed))
                    out.running.setdefault(gkey, []).append(Interval(owner, a_end, killed))
                    continue
                out.anomalies.append(
                    f"{show_owner(owner)} still ran {show_key(gkey)} after its agent returned"
                )
                out.held.setdefault(gkey, []).append(Interval(owner, a_begin, float("inf")))
                out.running.setdefault(gkey, []).append(Interval(owner, a_end, end_of_run))
        return out


@dataclass(frozen=True, slots=True)
class Overlap:
    """A resource held by two worker incarnations at once."""

    key: GroupKey
    first: Interval
    second: Interval

    def describe(self, t_zero: float) -> str:
        a, b = self.first, self.second
        return (
            f"{show_key(self.key)}: held by {show_owner(a.owner)} over "
            f"[{a.start - t_zero:.3f}, {a.end - t_zero:.3f}] s and by {show_owner(b.owner)} "
            f"from {b.start - t_zero:.3f} s (overlap {min(a.end, b.end) - b.start:.3f} s)"
        )


def double_ownership(intervals: Intervals) -> list[Overlap]:
    """Every time a resource was held by two worker incarnations at once."""
    found: list[Overlap] = []
    for key, spans in sorted(intervals.held.items()):
        ordered = sorted(spans, key=lambda s: s.start)
        latest = ordered[0]
        for span in ordered[1:]:
            if span.start < latest.end:
                found.append(Overlap(key, latest, span))
            if span.end > latest.end:
                latest = span
    return found


@dataclass(frozen=True, slots=True)
class Downtime:
    """Resources not running over a window."""

    seconds: float  # resource-seconds not running
    interrupted: int  # resources that were down at some point
    peak: int  # the most resources down at once
    longest: float  # the longest single span one resource ran on no worker


def downtime(intervals: Intervals, keys: Sequence[GroupKey], t0: float, t1: float) -> Downtime:
    """Over [t0, t1], from the running intervals."""
    total = 0.0
    interrupted = 0
    longest = 0.0
    edges: list[tuple[float, int]] = []  # (time, +1: starts running, -1: stops)
    for key in keys:
        spans = sorted(
            (max(s.start, t0), min(s.end, t1))
            for s in intervals.running.get(key, [])
            if s.end > t0 and s.start < t1
        )
        covered = 0.0
        cursor = t0
        for start, end in spans:
            if end <= cursor:
                continue
            longest = max(longest, start - cursor)
            start = max(start, cursor)
            covered += end - start
            edges.append((start, +1))
            edges.append((end, -1))
            cursor = end
        longest = max(longest, t1 - cursor)
        down = (t1 - t0) - covered
        total += down
        if down > 1e-6:
            interrupted += 1
    # At a tie a stop counts before a start (-1 sorts first): the peak is not understated.
    running = sum(step for at, step in edges if at <= t0)
    peak = len(keys) - running
    for _, step in sorted(e for e in edges if t0 < e[0] < t1):
        running += step
        peak = max(peak, len(keys) - running)
    return Downtime(total, interrupted, peak, longest)


# --- workers --------------------------------------------------------------------------------


class Worker:
    """One worker: an agent on a thread, started again as a new agent (a new incarnation).

    `name` is the member id on the connect protocol (kept across restarts, no instance id); on
    the classic protocol a label only: the coordinator makes the member id (`live_id`), a new one
    for each incarnation, as for a restarted Connect worker."""

    def __init__(
        self,
        bench: Bench,
        group: str,
        name: str,
        protocol: str,
        make_listener: Callable[[Owner], WorkerRebalanceListener] | None = None,
        rebalance_timeout_ms: int | None = None,
    ) -> None:
        self.bench = bench
        self.group = group
        self.name = name
        self.protocol = protocol
        self.spec = PROTOCOLS[protocol]
        self.make_listener = make_listener or bench.recorder.listener
        self.rebalance_timeout_ms = rebalance_timeout_ms or bench.args.rebalance_timeout_ms
        self.incarnation = 0
        self.agent: Agent | ClassicAgent | None = None
        self.transport: KillableTransport | None = None
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        #: Killed incarnations' agents and threads (stopped at once, joined at the tear-down).
        self.killed: list[tuple[Agent | ClassicAgent, threading.Thread]] = []
        #: Self-fences of the incarnations that were not killed (a killed one fences itself).
        self.fences_before = 0

    @property
    def owner(self) -> Owner:
        return (self.group, self.name, self.incarnation)

    @property
    def live_id(self) -> str:
        """The member id the group knows this worker by now ("" before a classic agent has
        been given one)."""
        if not self.spec.classic:
            return self.name
        return "" if self.agent is None else self.agent.member_id

    def start(self) -> None:
        a = self.bench.args
        if not self.spec.classic and not hasattr(Membership, "_eager_restart"):
            # unsettled() reads it; without it the quiet check would miss eager restarts.
            raise RuntimeError("worker_agent.membership.Membership has no _eager_restart any more")
        self.fences_before = self.self_fences()
        self.incarnation += 1
        settings = AgentSettings(
            group_id=self.group,
            member_id=self.name,
            coordinators=(self.bench.address,),
            assignors=tuple(assignors_for_protocol(self.spec.connect_protocol)),
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            eager=not self.spec.classic and self.spec.connect_protocol == "eager",
            group_protocol=self.spec.group_protocol,
            protocol=self.spec.connect_protocol,
            session_timeout_ms=a.session_timeout_ms,
            heartbeat_interval_ms=a.heartbeat_interval_ms,
        )
        # The transport Agent.__init__ would make, one the leader scenario can kill.
        self.transport = KillableTransport(
            settings.coordinators,
            settings.max_message_bytes,
            tls=settings.tls,
            allow_plaintext=settings.allow_plaintext,
        )
        kind = ClassicAgent if self.spec.classic else Agent
        self.agent = kind(settings, self.make_listener(self.owner), transport=self.transport)
        self.thread = threading.Thread(
            target=self._run,
            args=(self.agent,),
            name=f"agent-{self.name}#{self.incarnation}",
            daemon=True,
        )
        self.thread.start()

    def _run(self, agent: Agent | ClassicAgent) -> None:
        try:
            agent.run()
        except BaseException as error:
            if agent is self.agent:
                self.error = error
            logging.getLogger("rebalance_bench").exception("agent %s failed", self.name)

    def kill(self) -> float:
        """As SIGKILL: every call of the agent fails from now on (nothing revoked, no leave),
        and what its listener ran ends now. The dead agent is then told to stop, so that its
        thread winds down; nothing it does reaches the coordinator or the records. Returns the
        time of the kill."""
        assert self.agent is not None and self.transport is not None and self.thread is not None
        at = self.transport.kill()
        self.bench.recorder.freeze(self.owner, at)
        self.agent.stop()
        self.killed.append((self.agent, self.thread))
        self.fences_before = self.self_fences()
        self.agent, self.thread, self.transport = None, None, None
        return at

    def self_fences(self) -> int:
        """Self-fences of this worker's incarnations so far, the killed ones only up to their
        kill (worker_agent_self_fenced_total, every reason)."""
        if self.agent is None:
            return self.fences_before
        counter = self.agent.metrics.self_fenced
        return self.fences_before + int(sum(counter.value(r) for r in SELF_FENCE_REASONS))

    def unsettled(self, epoch: int, assignment: frozenset[Key]) -> str:
        """Why the agent itself has not settled on `assignment` at `epoch` (the classic
        generation) ("" if it has).

        The coordinator records a member at the new epoch before the member has read the answer,
        and an eager agent that reads a new epoch restarts everything it runs, so the
        coordinator's view alone could call a group quiet just before an eager restart. A
        classic worker may have a rejoin due (after a revocation, or when the leader's delay
        ends) that the coordinator cannot know of."""
        agent = self.agent
        if agent is None:
            return f"{self.name} has no agent"
        if isinstance(agent, ClassicAgent):
            c = agent.machine
            if agent.phase is not ClassicPhase.STABLE or agent.member_epoch != epoch:
                return f"{self.name}'s agent is {agent.phase.value} at generation {c.generation}"
            if c.scheduled_rebalance_ms is not None:
                return f"{self.name}'s agent will rejoin when the leader's delay ends"
            if c.rebalancing:
                return f"{self.name}'s agent has a rejoin due"
            if _keys_of(c.snapshot or EMPTY) != assignment or _keys_of(agent.running) != assignment:
                return f"{self.name}'s agent has not caught up with its assignment"
            return ""
        m = agent.machine
        if agent.phase is not Phase.MEMBER or agent.member_epoch != epoch:
            return f"{self.name}'s agent is {agent.phase.value} at epoch {agent.member_epoch}"
        if _keys_of(m.assigned) != assignment or _keys_of(agent.running) != assignment:
            return f"{self.name}'s agent has not caught up with its assignment"
        # The machine's eager-restart flag has no public accessor; reading it is harmless.
        if m._eager_restart:
            return f"{self.name}'s agent is restarting its work (eager)"
        return ""

    def request_stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()

    def join(self, timeout_s: float) -> bool:
        """Wait until the agent (and every killed incarnation's) has left; False if one has not
        by then."""
        deadline = time.monotonic() + timeout_s
        threads = [t for _, t in self.killed]
        if self.thread is not None:
            threads.append(self.thread)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    def abandon(self) -> None:
        for agent in [a for a, _ in self.killed] + ([self.agent] if self.agent else []):
            agent.abandon()

    def stop(self, timeout_s: float) -> bool:
        self.request_stop()
        return self.join(timeout_s)

    @property
    def started(self) -> bool:
        return self.incarnation > 0


# --- results --------------------------------------------------------------------------------


@dataclass
class Disturbance:
    what: str
    at: float
    quiet_at: float | None = None

    @property
    def seconds(self) -> float | None:
        return None if self.quiet_at is None else self.quiet_at - self.at


@dataclass
class Run:
    protocol: str
    scenario: str
    repeat: int
    group: str
    delay_ms: int
    workers_before: int
    workers_after: int
    disturbances: list[Disturbance] = field(default_factory=list)
    converged: bool = False
    failure: str = ""
    window: tuple[float, float] | None = None
    epoch_before: int = 0
    epoch_after: int = 0
    figures: dict[str, Any] = field(default_factory=dict)
    variant: str = ""  # the heavy scenario's variant

    @property
    def label(self) -> str:
        how = self.variant or self.protocol
        return f"{SCENARIO_TITLES[self.scenario]}, {how}, repeat {self.repeat}"


# --- the benchmark ---------------------------------------------------------------------------


class NotConverged(Exception):
    pass


class Bench:
    def __init__(self, args: argparse.Namespace, stack: ExitStack) -> None:
        self.args = args
        self.stack = stack
        self.state_dir = Path(args.state_dir) if args.state_dir else None
        #: The coordinator's and the agents' logs go beside the JSON report.
        self.logs = Path(args.output).resolve().parent
        self.recorder = Recorder(args.task_start_ms / 1000, args.task_stop_ms / 1000)
        self.catalogue = {f"conn-{i:02d}": args.tasks_per_connector for i in range(args.connectors)}
        self.keys: frozenset[Key] = catalogue_keys(self.catalogue)
        self.task_keys = frozenset(k for k in self.keys if is_task(k))
        self.heavy_catalogue = {
            **{f"light-{i:02d}": args.light_tasks for i in range(args.light_connectors)},
            HEAVY_CONNECTOR: args.heavy_tasks,
        }
        self.heavy_keys = catalogue_keys(self.heavy_catalogue)
        #: The catalogue each group should run, where it is not `self.keys`.
        self.group_keys: dict[str, frozenset[Key]] = {}
        #: Per group being measured: the most resources in motion in one DescribeGroups poll.
        self.motion_peak: dict[str, int] = {}
        self.runs: list[Run] = []
        self.store_info = ""
        self.started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.t_zero = time.monotonic()  # listener call times in the calls file count from here

    def note_state(self, name: str, value: str) -> None:
        """Tell bench/run-rebalance's exit trap what to clean up if this process dies."""
        if self.state_dir is not None:
            (self.state_dir / name).write_text(value)

    # --- the coordinator ---

    def start_coordinator(self) -> None:
        a = self.args
        self.logs.mkdir(parents=True, exist_ok=True)
        if a.store == "postgres":
            from tests.support.pgcluster import ThrowawayCluster, create_database

            log("starting a throwaway PostgreSQL (fsync, synchronous_commit, full_page_writes on)")
            cluster = ThrowawayCluster(settings=PG_SETTINGS)
            cluster.start()
            self.stack.callback(cluster.stop)
            self.note_state("pg_base", str(cluster.base_dir))
            self.note_state("pg_bin", str(cluster.bin_dir))
            db_url = create_database(cluster.url, "rebalance")
            self.store_info = f"PostgreSQL (throwaway, port {cluster.port}, durable commits)"
        else:
            tmp = Path(tempfile.mkdtemp(prefix="bench-rebalance-"))
            self.stack.callback(lambda: _rmtree(tmp))
            db_url = f"sqlite:///{tmp / 'coordinator.db'}"
            self.store_info = f"SQLite ({tmp / 'coordinator.db'})"
        coordinator_log = self.logs / "rebalance-coordinator.log"
        coordinator_log.unlink(missing_ok=True)
        self.coordinator = CoordinatorProcess(
            db_url,
            "--node-id",
            "bench-rebalance",
            "--session-timeout-ms",
            str(a.session_timeout_ms),
            "--heartbeat-interval-ms",
            str(a.heartbeat_interval_ms),
            "--rebalance-timeout-ms",
            str(a.rebalance_timeout_ms),
            "--scheduled-rebalance-max-delay-ms",
            str(a.scheduled_rebalance_max_delay_ms),
            "--classic-min-session-timeout-ms",
            str(min(CLASSIC_MIN_SESSION_TIMEOUT_MS, a.session_timeout_ms)),
            "--classic-initial-rebalance-delay-ms",
            str(a.initial_rebalance_delay_ms),
            "--assignment-interval-ms",
            str(a.assignment_interval_ms),
            "--log-level",
            a.coordinator_log_level,
            log_path=coordinator_log,
        )
        log(f"starting coordinator-svc serve on {self.coordinator.address}, {self.store_info}")
        self.coordinator.start()
        assert self.coordinator.proc is not None
        self.note_state("coordinator_pid", str(self.coordinator.proc.pid))
        self.stack.callback(self._stop_coordinator)
        self.address = self.coordinator.address
        self.channel = grpc.insecure_channel(self.address)
        self.stack.callback(self.channel.close)
        self.admin = admin_pb2_grpc.ConnectGroupAdminStub(self.channel)

    def _stop_coordinator(self) -> None:
        proc = self.coordinator.proc
        if proc is not None and proc.poll() is None:
            try:
                self.coordinator.terminate(20)
            except subprocess.TimeoutExpired:
                log("the coordinator did not stop on SIGTERM within 20 s; killing it")
        self.coordinator.close()

    # --- group set-up and observation ---

    def create_group(
        self,
        group: str,
        delay_ms: int,
        catalogue: dict[str, int] | None = None,
        configs: dict[str, str] | None = None,
    ) -> None:
        """Put `catalogue` (default: the main scenarios') and set the delay and `configs`. The
        group is a connect group until its first classic JoinGroup converts it (an empty group
        takes its first joiner's protocol and keeps its catalogue and configurations, DESIGN
        3.19 "Empty conversions")."""
        self.put_catalogue(group, self.catalogue if catalogue is None else catalogue)
        resp = self.admin.AlterGroupConfigs(
            admin_pb2.AlterGroupConfigsRequest(
                group_id=group, set={DELAY_KEY: str(delay_ms), **(configs or {})}
            ),
            timeout=10,
        )
        if resp.error_code != 0:
            raise RuntimeError(f"AlterGroupConfigs: {resp.error_code} {resp.error_message}")

    def put_catalogue(self, group: str, catalogue: dict[str, int]) -> None:
        for name, tasks in sorted(catalogue.items()):
            resp = self.admin.PutConnector(
                admin_pb2.PutConnectorRequest(group_id=group, connector=name, task_count=tasks),
                timeout=10,
            )
            if resp.error_code != 0:
                raise RuntimeError(f"PutConnector {name}: {resp.error_code} {resp.error_message}")
        self.group_keys[group] = self.group_keys.get(group, frozenset()) | catalogue_keys(catalogue)

    def describe(self, group: str) -> Any:
        resp = self.admin.DescribeGroups(
            admin_pb2.DescribeGroupsRequest(group_ids=[group]), timeout=5
        )
        return resp.groups[0]

    def not_quiet(self, group: str, workers: Sequence[Worker]) -> tuple[str, Any]:
        """Why the group is not quiet ("" if it is), and the description it is based on."""
        try:
            g = self.describe(group)
        except grpc.RpcError as error:
            return f"DescribeGroups failed: {error.code()}", None
        if g.error_code != 0:
            return f"DescribeGroups: {g.error_code} {g.error_message}", g
        if group in self.motion_peak:
            self.motion_peak[group] = max(self.motion_peak[group], len(_in_motion(g)))
        if g.HasField("classic"):
            reason = self._classic_not_quiet(g)
            epoch = int(g.classic.generation_id)
        else:
            reason = self._connect_not_quiet(g)
            epoch = int(g.assignment_epoch)
        if reason:
            return reason, g
        members = {m.member_id: m for m in g.members}
        expected = {w.live_id: w for w in workers}
        if set(members) != set(expected):
            return f"members {sorted(members)} != expected {sorted(expected)}", g
        covered: set[Key] = set()
        for member_id, m in sorted(members.items()):
            worker = expected[member_id]
            if m.pending_revocation.connectors or m.pending_revocation.tasks:
                return f"{worker.name} has revocations pending", g
            current = _keys(m.current_assignment)
            running, busy = self.recorder.running(worker.owner)
            if busy:
                return f"{worker.name}'s listener is busy", g
            if running != current:
                return (
                    f"{worker.name} runs {len(running)} resources, its assignment has "
                    f"{len(current)}"
                ), g
            unsettled = worker.unsettled(epoch, current)
            if unsettled:
                return unsettled, g
            covered |= current
        keys = self.group_keys.get(group, self.keys)
        if covered != keys:
            return f"{len(keys - covered)} resources assigned to no one", g
        return "", g

    @staticmethod
    def _connect_not_quiet(g: Any) -> str:
        if g.state != "STABLE":
            return f"group {g.state}"
        if g.group_epoch != g.assignment_epoch:
            return f"group epoch {g.group_epoch} > assignment epoch {g.assignment_epoch}"
        if g.HasField("scheduled_rebalance_at_ms"):
            return "a delayed rebalance is pending"
        for m in g.members:
            if m.state != "STABLE" or m.member_epoch != g.assignment_epoch:
                return f"{m.member_id} {m.state} at epoch {m.member_epoch}"
            if _keys(m.current_assignment) != _keys(m.target_assignment):
                return f"{m.member_id}'s current assignment is not its target"
        return ""

    @staticmethod
    def _classic_not_quiet(g: Any) -> str:
        c = g.classic
        if c.state != "STABLE":
            return f"classic group {c.state}"
        if c.members_awaiting_sync:
            return f"{len(c.members_awaiting_sync)} SyncGroups awaited"
        if c.pending_member_ids:
            return f"{len(c.pending_member_ids)} member ids pending"
        for m in g.members:
            if m.group_protocol != "classic" or not m.HasField("classic"):
                return f"{m.member_id} is not a classic member"
            if not m.classic.synced or m.classic.last_joined_generation != c.generation_id:
                return f"{m.member_id} has not synced generation {c.generation_id}"
        return ""

    def leader_of(self, group: str, workers: Sequence[Worker]) -> Worker:
        """The worker that leads (classic) or computes the assignment (connect) now."""
        g = self.describe(group)
        leader = g.classic.leader_id if g.HasField("classic") else g.assignor_member_id
        found = next((w for w in workers if leader and w.live_id == leader), None)
        if found is None:
            raise NotConverged(f"no worker is the group's leader ({leader!r})")
        return found

    def wait_quiet(self, group: str, workers: Sequence[Worker], what: str) -> tuple[float, Any]:
        """Poll until the group is quiet; the time of the first quiet poll and the description."""
        deadline = time.monotonic() + self.args.converge_timeout_s
        poll_s = self.args.poll_ms / 1000
        reason = "never polled"
        while time.monotonic() < deadline:
            polled_at = time.monotonic()
            reason, g = self.not_quiet(group, workers)
            if not reason:
                return polled_at, g
            for w in workers:
                if w.error is not None:
                    raise NotConverged(f"{what}: agent {w.name} failed: {w.error!r}")
            time.sleep(max(0.0, poll_s - (time.monotonic() - polled_at)))
        raise NotConverged(
            f"{what}: not quiet after {self.args.converge_timeout_s:.0f} s: {reason}"
        )

    # --- scenarios ---

    def run_scenario(self, scenario: str, protocol: str, repeat: int) -> Run:
        a = self.args
        delay_ms = a.scheduled_rebalance_max_delay_ms
        group = f"rebalance-{scenario}-{protocol}-{uuid.uuid4().hex[:6]}"
        after = a.scale_to if scenario == "scale" else a.workers
        run = Run(protocol, scenario, repeat, group, delay_ms, a.workers, after)
        self.create_group(group, delay_ms)
        log(
            f"{SCENARIO_TITLES[scenario]}, {protocol}, repeat {repeat}/{a.repeat}: group {group}, "
            f"{DELAY_KEY}={delay_ms}; setting up {a.workers} workers"
        )
        workers = [Worker(self, group, f"worker-{i}", protocol) for i in range(after)]
        initial, extra = workers[: a.workers], workers[a.workers :]
        try:
            for w in initial:
                w.start()
            _, g = self.wait_quiet(group, initial, "set-up")
            time.sleep(a.settle_s)
            run.epoch_before = int(g.group_epoch)
            log(f"  set up: quiet at group epoch {g.group_epoch}")
            if scenario == "restart":
                self._rolling_restart(run, initial)
            elif scenario == "scale":
                self._scale_out(run, initial, extra)
            elif scenario == "bounce":
                self._bounce(run, initial)
            else:
                self._leader_lost(run, initial)
            run.converged = True
        except NotConverged as error:
            run.failure = str(error)
            log(f"  FAILED: {error}")
            with suppress(grpc.RpcError):
                run.figures["last_description"] = str(self.describe(group))
        finally:
            run.figures["self_fenced"] = sum(w.self_fences() for w in workers)
            self._stop_all([w for w in workers if w.started])
        return run

    def _rolling_restart(self, run: Run, workers: list[Worker]) -> None:
        a = self.args
        for w in workers:
            d = Disturbance(f"restart {w.name}", time.monotonic())
            run.disturbances.append(d)
            if not w.stop(a.leave_timeout_s):
                raise NotConverged(f"{w.name} did not leave within {a.leave_timeout_s} s")
            left_at = time.monotonic()
            if a.restart_gap_s > 0:
                time.sleep(a.restart_gap_s)
            w.start()
            d.quiet_at, g = self.wait_quiet(run.group, workers, d.what)
            run.epoch_after = int(g.group_epoch)
            log(
                f"  {d.what}: left after {left_at - d.at:.2f} s, quiet after "
                f"{d.seconds:.2f} s (group epoch {g.group_epoch})"
            )
            time.sleep(a.settle_s)
        run.window = (run.disturbances[0].at, run.disturbances[-1].quiet_at or 0.0)

    def _scale_out(self, run: Run, initial: list[Worker], extra: list[Worker]) -> None:
        d = Disturbance(f"add {len(extra)} workers at once", time.monotonic())
        run.disturbances.append(d)
        for w in extra:
            w.start()
        d.quiet_at, g = self.wait_quiet(run.group, initial + extra, d.what)
        run.epoch_after = int(g.group_epoch)
        log(f"  {d.what}: quiet after {d.seconds:.2f} s (group epoch {g.group_epoch})")
        run.window = (d.at, d.quiet_at)

    def _bounce(self, run: Run, workers: list[Worker]) -> None:
        """A worker that does not lead is stopped gracefully and started again a third of the
        delay after it has left: within the delay (seed 003's "Worker bounces")."""
        a = self.args
        leader = self.leader_of(run.group, workers)
        w = next(w for w in reversed(workers) if w is not leader)
        away_s = run.delay_ms / 3000
        d = Disturbance(f"bounce {w.name} ({away_s:.2f} s away)", time.monotonic())
        run.disturbances.append(d)
        if not w.stop(a.leave_timeout_s):
            raise NotConverged(f"{w.name} did not leave within {a.leave_timeout_s} s")
        left_at = time.monotonic()
        time.sleep(away_s)
        w.start()
        d.quiet_at, g = self.wait_quiet(run.group, workers, d.what)
        run.epoch_after = int(g.group_epoch)
        log(
            f"  {d.what}: left after {left_at - d.at:.2f} s, quiet after {d.seconds:.2f} s "
            f"(group epoch {g.group_epoch})"
        )
        run.window = (d.at, d.quiet_at)

    def _leader_lost(self, run: Run, workers: list[Worker]) -> None:
        """The leader is killed (no revocation, no leave) and a replacement starts half a
        session timeout later."""
        a = self.args
        w = self.leader_of(run.group, workers)
        old_id = w.live_id
        d = Disturbance(f"kill the leader {w.name}", w.kill())
        run.disturbances.append(d)
        time.sleep(a.session_timeout_ms / 2000)
        w.start()
        d.quiet_at, g = self.wait_quiet(run.group, workers, d.what)
        run.epoch_after = int(g.group_epoch)
        leader = g.classic.leader_id if g.HasField("classic") else g.assignor_member_id
        log(
            f"  {d.what} (member {old_id}), replaced after {a.session_timeout_ms / 2000:.2f} s: "
            f"quiet after {d.seconds:.2f} s (group epoch {g.group_epoch}, leader now {leader})"
        )
        run.window = (d.at, d.quiet_at)

    def run_heavy(self, variant: str, repeat: int) -> Run:
        """The heavy scenario, one variant: HEAVY_WORKERS workers join the empty group, the
        catalogue is put (so it is spread without moves), then HEAVY_SCALE_TO - HEAVY_WORKERS
        workers are started at once."""
        a = self.args
        v = HEAVY_VARIANTS[variant]
        group = f"rebalance-heavy-{variant}-{uuid.uuid4().hex[:6]}"
        delay_ms = int(HEAVY_GROUP_CONFIGS[DELAY_KEY])
        run = Run(
            "connect",
            "heavy",
            repeat,
            group,
            delay_ms,
            a.heavy_workers,
            a.heavy_scale_to,
            variant=variant,
        )
        configs = (
            {WAVE_MAX_KEY: str(a.wave_max_resources), WAVE_PAUSE_KEY: str(a.wave_pause_ms)}
            if v.waves
            else {}
        )
        self.create_group(group, delay_ms, catalogue={}, configs={**HEAVY_GROUP_CONFIGS, **configs})
        log(
            f"{SCENARIO_TITLES['heavy']}, {variant} ({v.title}), repeat {repeat}/{a.repeat}: "
            f"group {group}" + (f", {configs}" if configs else "")
        )
        measuring = [True]  # the tear-down stops everything at once (it is not measured)
        heavy_stop_s = float(a.heavy_stop_ms if v.heavy else a.light_stop_ms) / 1000
        light_stop_s = float(a.light_stop_ms) / 1000

        def stop_s(key: Key) -> float:
            if not measuring[0]:
                return 0.0
            return heavy_stop_s if key[0] == HEAVY_CONNECTOR and key[1] >= 0 else light_stop_s

        def make_listener(owner: Owner) -> WorkerRebalanceListener:
            return self.recorder.concurrent_listener(
                owner, stop_s, a.heavy_start_ms / 1000, v.per_resource
            )

        workers = [
            Worker(self, group, f"worker-{i}", "connect", make_listener, HEAVY_REBALANCE_TIMEOUT_MS)
            for i in range(a.heavy_scale_to)
        ]
        initial, extra = workers[: a.heavy_workers], workers[a.heavy_workers :]
        try:
            for w in initial:
                w.start()
            self.wait_quiet(group, initial, "set-up (empty catalogue)")
            self.put_catalogue(group, self.heavy_catalogue)
            _, g = self.wait_quiet(group, initial, "set-up")
            time.sleep(a.settle_s)
            run.epoch_before = int(g.group_epoch)
            self.motion_peak[group] = 0
            self._scale_out(run, initial, extra)
            run.converged = True
        except NotConverged as error:
            run.failure = str(error)
            log(f"  FAILED: {error}")
            with suppress(grpc.RpcError):
                run.figures["last_description"] = str(self.describe(group))
        finally:
            run.figures["peak_in_motion_polled"] = self.motion_peak.pop(group, None)
            run.figures["self_fenced"] = sum(w.self_fences() for w in workers)
            measuring[0] = False
            self._stop_all([w for w in workers if w.started])
        return run

    def _stop_all(self, workers: list[Worker]) -> None:
        for w in workers:
            w.request_stop()
        stuck = [w.name for w in workers if not w.join(self.args.leave_timeout_s)]
        if stuck:
            log(f"  agents that did not leave within {self.args.leave_timeout_s} s: {stuck}")
            for w in workers:
                w.abandon()

    # --- figures ---

    def compute(self, intervals: Intervals, overlaps: list[Overlap]) -> None:
        calls = self.recorder.snapshot()
        for run in self.runs:
            run.figures["double_held"] = sum(1 for o in overlaps if o.key[0] == run.group)
            if run.window is None:
                continue
            if run.scenario == "heavy":
                self._compute_heavy(run, calls, intervals)
                continue
            t0, t1 = run.window
            mine = [c for c in calls if c.owner[0] == run.group and t0 <= c.begin <= t1]

            def count(kind: str, tasks: bool, calls: list[Call] = mine) -> int:
                return sum(
                    1 for c in calls if c.kind == kind for k in c.keys if (k[1] >= 0) == tasks
                )

            task_keys = [(run.group, *k) for k in sorted(self.task_keys)]
            connector_keys = [(run.group, *k) for k in sorted(self.keys - self.task_keys)]
            tasks = downtime(intervals, task_keys, t0, t1)
            connectors = downtime(intervals, connector_keys, t0, t1)
            times = [d.seconds for d in run.disturbances if d.seconds is not None]
            run.figures.update(
                {
                    "task_stops": count("revoked", True),
                    "task_starts": count("assigned", True),
                    "connector_stops": count("revoked", False),
                    "listener_calls": len(mine),
                    "task_seconds_not_running": round(tasks.seconds, 3),
                    "longest_not_running_s": round(tasks.longest, 3),
                    "connector_seconds_not_running": round(connectors.seconds, 3),
                    "tasks_interrupted": tasks.interrupted,
                    "peak_tasks_not_running": tasks.peak,
                    # The table's time to converge: the mean per disturbance (the rolling
                    # restart has one per worker, the other scenarios one).
                    "converge_s": round(sum(times) / len(times), 3) if times else None,
                    "converge_total_s": round(sum(times), 3),
                    "converge_mean_s": round(sum(times) / len(times), 3) if times else None,
                    "converge_max_s": round(max(times), 3) if times else None,
                    "converge_each_s": [round(t, 3) for t in times],
                    "group_epoch_bumps": run.epoch_after - run.epoch_before,
                    "window_s": round(t1 - t0, 3),
                }
            )

    def _compute_heavy(self, run: Run, calls: list[Call], intervals: Intervals) -> None:
        """Per resource revoked in the window: the on_assigned that started it next on another
        worker; per moved task, its time not running (on_revoked's call there to on_assigned's
        return here)."""
        assert run.window is not None
        t0, t1 = run.window
        heavy_variant = HEAVY_VARIANTS[run.variant].heavy
        mine = sorted((c for c in calls if c.owner[0] == run.group), key=lambda c: c.begin)
        starts: dict[Key, list[Call]] = {}
        for c in mine:
            if c.kind == "assigned":
                for k in c.keys:
                    starts.setdefault(k, []).append(c)
        light: list[float] = []
        heavy: list[float] = []
        edges: list[tuple[float, int]] = []
        never = with_heavy = waited = 0
        for stop in mine:
            if stop.kind != "revoked" or not t0 <= stop.begin <= t1:
                continue
            ends = stop.key_ends or (stop.end,) * len(stop.keys)
            heavy_ends = [
                e
                for k, e in zip(stop.keys, ends, strict=True)
                if k[0] == HEAVY_CONNECTOR and is_task(k)
            ]
            for key in stop.keys:
                start = next(
                    (
                        c
                        for c in starts.get(key, [])
                        if c.begin >= stop.begin and c.owner != stop.owner
                    ),
                    None,
                )
                if start is None:
                    never += 1
                    continue
                edges += [(stop.begin, 1), (start.begin, -1)]
                if not is_task(key):
                    continue
                if key[0] == HEAVY_CONNECTOR:
                    heavy.append(start.end - stop.begin)
                    continue
                light.append(start.end - stop.begin)
                if heavy_ends:
                    with_heavy += 1
                    if start.begin >= min(heavy_ends):
                        waited += 1
        peak = now = 0
        for _, step in sorted(edges):  # at a tie the end (-1) counts first
            now += step
            peak = max(peak, now)
        task_keys = [(run.group, *k) for k in sorted(self.heavy_keys) if is_task(k)]
        down = downtime(intervals, task_keys, t0, t1)
        times = [d.seconds for d in run.disturbances if d.seconds is not None]
        run.figures.update(
            {
                "light_not_running_s": [round(x, 4) for x in sorted(light)],
                "heavy_not_running_s": [round(x, 4) for x in sorted(heavy)],
                "light": distribution(light),
                "heavy": distribution(heavy),
                "resources_moved": len(edges) // 2,
                "never_restarted": never,
                "light_revoked_with_heavy": with_heavy if heavy_variant else None,
                "light_waited_for_heavy": waited if heavy_variant else None,
                "peak_in_motion_calls": peak,
                "task_seconds_not_running": round(down.seconds, 3),
                "longest_not_running_s": round(down.longest, 3),
                "tasks_interrupted": down.interrupted,
                "peak_tasks_not_running": down.peak,
                "converge_total_s": round(sum(times), 3),
                "group_epoch_bumps": run.epoch_after - run.epoch_before,
                "window_s": round(t1 - t0, 3),
            }
        )

    def heavy_rows(self) -> list[dict[str, Any]]:
        """The heavy scenario's table: one row per variant, the moved tasks of every converged
        repeat pooled into one distribution each (light, heavy)."""
        out: list[dict[str, Any]] = []
        if "heavy" not in self.args.scenarios:
            return out
        for variant in self.args.heavy_variants:
            runs = [r for r in self.runs if r.scenario == "heavy" and r.variant == variant]
            ok = [r for r in runs if r.converged and "light" in r.figures]

            def pooled(key: str, runs: list[Run] = ok) -> list[float]:
                return [x for r in runs for x in r.figures[key]]

            def total(key: str, runs: list[Run] = ok) -> int | None:
                values = [r.figures[key] for r in runs if r.figures.get(key) is not None]
                return sum(values) if values else None

            def most(key: str, runs: list[Run] = ok) -> int | None:
                values = [r.figures[key] for r in runs if r.figures.get(key) is not None]
                return max(values) if values else None

            converge = [r.figures["converge_total_s"] for r in ok]
            down = [r.figures["task_seconds_not_running"] for r in ok]
            out.append(
                {
                    "scenario": "heavy",
                    "variant": variant,
                    "title": HEAVY_VARIANTS[variant].title,
                    "repeats": len(ok),
                    "failed": len(runs) - len(ok),
                    "light": distribution(pooled("light_not_running_s")),
                    "heavy": distribution(pooled("heavy_not_running_s")),
                    "converge_s": statistics.median(converge) if converge else None,
                    "converge_all": converge,
                    "task_seconds_not_running": statistics.median(down) if down else None,
                    "peak_in_motion_calls": most("peak_in_motion_calls"),
                    "peak_in_motion_polled": most("peak_in_motion_polled"),
                    "light_revoked_with_heavy": total("light_revoked_with_heavy"),
                    "light_waited_for_heavy": total("light_waited_for_heavy"),
                    "never_restarted": total("never_restarted"),
                    "double_held": sum(r.figures.get("double_held", 0) for r in runs),
                }
            )
        p95 = {r["variant"]: r["light"]["p95"] for r in out}
        for r in out:
            for against in ("baseline", "reference"):
                base, mine = p95.get(against), r["light"]["p95"]
                r[f"light_p95_vs_{against}"] = (
                    round(mine / base, 3) if base and mine is not None else None
                )
        return out

    def print_heavy_table(self, rows: list[dict[str, Any]]) -> None:
        a = self.args

        def sec(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}"

        def ratio(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}x"

        def num(v: int | None) -> str:
            return "-" if v is None else str(v)

        header = [
            "variant",
            "light n",
            "median",
            "p95",
            "max",
            "heavy n",
            "median",
            "p95",
            "max",
            "light p95 / baseline",
            "/ reference",
            "converge (s)",
            "in motion (calls/polls)",
            "light waited / with heavy",
            "double-held",
        ]
        lines = []
        for r in rows:
            light, heavy = r["light"], r["heavy"]
            converge = "-" if r["converge_s"] is None else f"{r['converge_s']:.2f}"
            if len(r["converge_all"]) > 1:
                converge += f" [{min(r['converge_all']):.2f}-{max(r['converge_all']):.2f}]"
            name = r["variant"]
            if r["failed"]:
                name += f" ({r['failed']} FAILED)"
            lines.append(
                [
                    name,
                    str(light["n"]),
                    sec(light["median"]),
                    sec(light["p95"]),
                    sec(light["max"]),
                    str(heavy["n"]),
                    sec(heavy["median"]),
                    sec(heavy["p95"]),
                    sec(heavy["max"]),
                    ratio(r["light_p95_vs_baseline"]),
                    ratio(r["light_p95_vs_reference"]),
                    converge,
                    f"{num(r['peak_in_motion_calls'])} / {num(r['peak_in_motion_polled'])}",
                    f"{num(r['light_waited_for_heavy'])} / {num(r['light_revoked_with_heavy'])}",
                    str(r["double_held"]) + (" FAILED" if r["double_held"] else ""),
                ]
            )
        widths = [max(len(x[i]) for x in [header, *lines]) for i in range(len(header))]

        def show(cells: list[str]) -> str:
            return " | ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )

        light_names = ", ".join(c for c in self.heavy_catalogue if c != HEAVY_CONNECTOR)
        print()
        print(
            f"Heavy connector scale-out ({self.started}; seed 002, Design III): "
            f"{a.heavy_workers} -> {a.heavy_scale_to} workers, the new ones started at once; "
            f"in-process agents against coordinator-svc serve on {self.store_info.split(' (')[0]}"
        )
        print(
            f"  catalogue: {HEAVY_CONNECTOR} ({a.heavy_tasks} tasks, each {a.heavy_stop_ms:g} ms "
            f"to stop) and {light_names} ({a.light_tasks} tasks each, {a.light_stop_ms:g} ms); "
            f"every resource starts in {a.heavy_start_ms:g} ms; a listener call starts or stops "
            "its resources concurrently"
        )
        print(
            "  variants: "
            + "; ".join(f"{k} = {HEAVY_VARIANTS[k].title}" for k in a.heavy_variants)
            + f"; waves: {WAVE_MAX_KEY}={a.wave_max_resources}, "
            f"{WAVE_PAUSE_KEY}={a.wave_pause_ms}; {ASSIGNMENT_INTERVAL.name}="
            f"{a.assignment_interval_ms}"
        )
        print(
            "  time not running per moved task (s), from on_revoked's call on the old worker to "
            "on_assigned's return on the new one; "
            + (
                f"all moved tasks of {a.repeat} repeats pooled; converge: median [min-max]"
                if a.repeat > 1
                else "one run per variant"
            )
            + "; p95 by nearest rank"
        )
        print(show(header))
        print("-+-".join("-" * w for w in widths))
        for cells in lines:
            print(show(cells))
        print()

    def phase_of(self, overlap: Overlap) -> tuple[Run | None, str]:
        """The run an overlap belongs to, and when in it it began."""
        run = next((r for r in self.runs if r.group == overlap.key[0]), None)
        if run is None:
            return None, "?"
        at = overlap.second.start
        if run.window is None:
            return run, "the run (it did not converge)"
        if at < run.window[0]:
            return run, "set-up"
        if at <= run.window[1]:
            return run, "the measured window"
        return run, "tear-down"

    def rows(self) -> list[dict[str, Any]]:
        """The table: one row per scenario and protocol; each figure the median over the repeats
        that converged, with their range and every value; each of MAIN_FIGURES also against
        BASELINE's median in the same scenario (`ratios`; None where that is 0 or missing).
        `double_held` and `self_fenced` are sums over every repeat, whole runs."""
        out: list[dict[str, Any]] = []
        for scenario in self.args.scenarios:
            if scenario == "heavy":
                continue  # heavy_rows()
            for protocol in self.args.protocols:
                runs = [r for r in self.runs if (r.scenario, r.protocol) == (scenario, protocol)]
                ok = [r for r in runs if r.converged]
                row: dict[str, Any] = {
                    "scenario": scenario,
                    "protocol": protocol,
                    "repeats": len(ok),
                    "failed": len(runs) - len(ok),
                    "figures": {},
                    "double_held": sum(r.figures.get("double_held", 0) for r in runs),
                    "self_fenced": sum(r.figures.get("self_fenced", 0) for r in runs),
                }
                for key, _, _ in MAIN_FIGURES + DETAIL_FIGURES:
                    values = [r.figures[key] for r in ok if r.figures.get(key) is not None]
                    row["figures"][key] = {
                        "median": statistics.median(values) if values else None,
                        "min": min(values) if values else None,
                        "max": max(values) if values else None,
                        "all": values,
                    }
                out.append(row)
        for row in out:
            base = next(
                (r for r in out if (r["scenario"], r["protocol"]) == (row["scenario"], BASELINE)),
                None,
            )
            row["ratios"] = {}
            for key, _, _ in MAIN_FIGURES:
                mine = row["figures"][key]["median"]
                against = None if base is None else base["figures"][key]["median"]
                row["ratios"][key] = (
                    round(mine / against, 3) if mine is not None and against else None
                )
        return out

    def closing_note(self, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Whether NOTE_PROTOCOL's task-seconds not running are at most NOTE_SHARE of
        BASELINE's, per scenario and summed over the scenarios (reported, not gated); None
        unless both ran."""
        if NOTE_PROTOCOL not in self.args.protocols or BASELINE not in self.args.protocols:
            return None
        key = "task_seconds_not_running"

        def median(scenario: str, protocol: str) -> float | None:
            row = next(
                (r for r in rows if (r["scenario"], r["protocol"]) == (scenario, protocol)), None
            )
            return None if row is None else row["figures"][key]["median"]

        def verdict(mine: float | None, base: float | None) -> dict[str, Any]:
            share = mine / base if mine is not None and base else None
            return {
                NOTE_PROTOCOL: mine,
                BASELINE: base,
                "share": None if share is None else round(share, 4),
                "at_most": NOTE_SHARE,
                "yes": None if share is None else share <= NOTE_SHARE,
            }

        scenarios = [s for s in self.args.scenarios if s != "heavy"]
        per = {s: verdict(median(s, NOTE_PROTOCOL), median(s, BASELINE)) for s in scenarios}
        complete = all(
            v[NOTE_PROTOCOL] is not None and v[BASELINE] is not None for v in per.values()
        )
        total = verdict(
            sum(v[NOTE_PROTOCOL] for v in per.values()) if complete else None,
            sum(v[BASELINE] for v in per.values()) if complete else None,
        )
        return {"figure": key, "scenarios": per, "summed": total}

    def print_table(self, rows: list[dict[str, Any]], note: dict[str, Any] | None) -> None:
        a = self.args
        baseline = BASELINE in a.protocols

        def fmt(v: float, unit: str) -> str:
            if unit == "s":
                return f"{v:,.2f}"
            return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"

        def cell(row: dict[str, Any], key: str, unit: str) -> str:
            f = row["figures"][key]
            if f["median"] is None:
                return "FAILED" if row["failed"] else "-"
            text = fmt(f["median"], unit)
            if len(f["all"]) > 1 and f["min"] != f["max"]:
                text += f" [{fmt(f['min'], unit)}-{fmt(f['max'], unit)}]"
            if row["failed"]:
                text += f" ({row['failed']} FAILED)"
            return text

        def ratio(row: dict[str, Any], key: str) -> str:
            r = row["ratios"][key]
            return "\u2014" if r is None else f"{r:.2f}x"

        header = ["scenario", "protocol"]
        for _, title, _ in MAIN_FIGURES:
            header.append(title)
            if baseline:
                header.append("/ cs")
        header.append("double-held")
        lines = []
        for r in rows:
            cells = [SCENARIO_TITLES[r["scenario"]], r["protocol"]]
            for key, _, unit in MAIN_FIGURES:
                cells.append(cell(r, key, unit))
                if baseline:
                    cells.append(ratio(r, key))
            cells.append(str(r["double_held"]) + (" FAILED" if r["double_held"] else ""))
            lines.append(cells)
        details = ["scenario", "protocol"] + [title for _, title, _ in DETAIL_FIGURES]
        details.append("self-fences (all repeats)")
        detail_lines = []
        for r in rows:
            cells = [SCENARIO_TITLES[r["scenario"]], r["protocol"]]
            for key, _, unit in DETAIL_FIGURES:
                v = r["figures"][key]["median"]
                cells.append("-" if v is None else fmt(v, unit))
            cells.append(str(r["self_fenced"]))
            detail_lines.append(cells)

        print()
        print(
            f"Rebalance benchmark ({self.started}): {a.connectors} connectors x "
            f"{a.tasks_per_connector} tasks = {len(self.task_keys)} tasks "
            f"(+{a.connectors} connectors); listener {a.task_start_ms:g} ms per resource started, "
            f"{a.task_stop_ms:g} ms per resource stopped; in-process agents against "
            f"coordinator-svc serve on {self.store_info.split(' (')[0]}"
        )
        for line in timeout_lines(a):
            print(f"  {line}")
        for p in a.protocols:
            print(f"  {p}: {PROTOCOLS[p].title}")
        if "restart" in a.scenarios:
            print(
                f"  restart: {a.workers} workers, each stopped (stop(): revoke, leave) and started "
                f"again (classic: a new member; connect: the same member id), restart gap "
                f"{a.restart_gap_s:g} s"
            )
        if "scale" in a.scenarios:
            print(f"  scale: {a.workers} -> {a.scale_to} workers, the new ones started at once")
        if "bounce" in a.scenarios:
            print(
                f"  bounce: a worker that does not lead stopped, started again "
                f"{a.scheduled_rebalance_max_delay_ms / 3000:.2f} s after it left (a third of "
                f"{DELAY_KEY})"
            )
        if "leader" in a.scenarios:
            print(
                "  leader: the leader killed (no revocation, no leave), a replacement started "
                f"{a.session_timeout_ms / 2000:.2f} s later (half the session timeout)"
            )
        print(
            f"  quiet polled every {a.poll_ms} ms; "
            + (
                f"median of {a.repeat} repeats [min-max]"
                if a.repeat > 1
                else "one run per protocol and scenario"
            )
            + "; time to converge: the rolling restart's is the mean per restart"
            + (
                f"; / cs: against {BASELINE}'s median in the same scenario "
                "(\u2014: it is 0 or missing)"
                if baseline
                else ""
            )
        )
        _print_grid(header, lines, [r["scenario"] for r in rows])
        print()
        print("Details (medians; self-fences: worker_agent_self_fenced_total, whole runs):")
        _print_grid(details, detail_lines, [r["scenario"] for r in rows])
        print()
        if note is not None:
            print(
                f"Closing note (reported, not gated): {NOTE_PROTOCOL}'s task-seconds not running "
                f"against {BASELINE}'s, at most {NOTE_SHARE:.0%}?"
            )
            scenarios = list(note["scenarios"].items())
            named = [(SCENARIO_TITLES[s], v) for s, v in scenarios]
            named.append((f"all {len(scenarios)} scenarios, summed", note["summed"]))
            width = max(len(n) for n, _ in named)
            for name, v in named:
                print(f"  {name.ljust(width)}  {_note_line(v)}")
            print()


def _note_line(v: dict[str, Any]) -> str:
    mine, base = v[NOTE_PROTOCOL], v[BASELINE]
    if mine is None or base is None:
        return "not measured (a run failed or did not run)"
    if v["share"] is None:
        return f"{mine:,.2f} s against {base:,.2f} s: \u2014 ({BASELINE}'s is 0)"
    return f"{mine:,.2f} s against {base:,.2f} s = {v['share']:.1%}: {'yes' if v['yes'] else 'no'}"


def _print_grid(header: list[str], lines: list[list[str]], groups: list[str]) -> None:
    """A table, left-aligned text in the first two columns, a rule between groups of rows."""
    widths = [max(len(x[i]) for x in [header, *lines]) for i in range(len(header))]

    def show(cells: list[str]) -> str:
        return " | ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(show(header))
    print("-+-".join("-" * w for w in widths))
    previous = ""
    for cells, group in zip(lines, groups, strict=True):
        if previous and group != previous:
            print("-+-".join("-" * w for w in widths))
        previous = group
        print(show(cells))


def timeout_lines(a: argparse.Namespace) -> list[str]:
    """What the header says of the timeouts: Connect's defaults, the factor, what it gives."""
    defaults = ", ".join(f"{name} {value}" for name, value in CONNECT_DEFAULTS.values())
    used = ", ".join(f"{name} {getattr(a, key)}" for key, (name, _) in CONNECT_DEFAULTS.items())
    lines = [
        f"timeouts: Connect's defaults ({defaults} ms) divided by F = {a.timeout_factor:g}: "
        f"{used} ms"
    ]
    if a.overridden:
        given = ", ".join(f"--{k.replace('_', '-')} {getattr(a, k)}" for k in a.overridden)
        lines.append(f"NOT A SINGLE FACTOR: {given} given explicitly")
    return lines


def catalogue_keys(catalogue: dict[str, int]) -> frozenset[Key]:
    return frozenset(
        [(c, -1) for c in catalogue] + [(c, t) for c, n in catalogue.items() for t in range(n)]
    )


def _in_motion(group: Any) -> frozenset[Key]:
    """DESIGN 3.18: a resource is in motion from the target that moves it until its new owner
    has been sent it, i.e. while it is in a member's target and not in its current assignment."""
    out: set[Key] = set()
    for m in group.members:
        out |= _keys(m.target_assignment) - _keys(m.current_assignment)
    return frozenset(out)


def distribution(values: Sequence[float]) -> dict[str, Any]:
    """n, median, p95 (nearest rank: the smallest value with at least 95 % at or below it) and
    max, in seconds rounded to the millisecond (None when there are no values)."""
    xs = sorted(values)
    if not xs:
        return {"n": 0, "median": None, "p95": None, "max": None}
    p95 = xs[max(0, math.ceil(0.95 * len(xs)) - 1)]
    return {
        "n": len(xs),
        "median": round(statistics.median(xs), 3),
        "p95": round(p95, 3),
        "max": round(xs[-1], 3),
    }


def _keys_of(resources: ResourceSet) -> frozenset[Key]:
    return frozenset(
        [(c, -1) for c in resources.connectors] + [(t.connector, t.task) for t in resources.tasks]
    )


def _keys(msg: Any) -> frozenset[Key]:
    return frozenset([(c, -1) for c in msg.connectors] + [(t.connector, t.task) for t in msg.tasks])


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def git_state() -> dict[str, Any]:
    def run(*cmd: str) -> str:
        try:
            return subprocess.run(
                cmd, cwd=REPO, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except OSError:
            return ""

    return {
        "commit": run("git", "rev-parse", "HEAD"),
        "dirty": bool(run("git", "status", "--porcelain", "--", "coordinator_svc", "worker_agent")),
    }


QUICK: dict[str, Any] = {
    "connectors": 8,
    "tasks_per_connector": 10,
    "workers": 2,
    "scale_to": 4,
    "settle_s": 0.3,
    "repeat": 1,
    "timeout_factor": 40,
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="run-rebalance",
        description="Compare Kafka Connect today (the classic protocol: classic-eager, "
        "classic-sessioned) with this coordinator's connect protocol (connect) on a rolling "
        "restart, a scale-out, a bounce within the delay and the leader lost, with in-process "
        "worker agents against a real coordinator-svc serve, Connect's default timeouts divided "
        "by one factor. Prints a table (with ratios against classic-sessioned) and a closing "
        "note, and writes JSON. With --scenarios heavy (not run by default): seed 002's Design III "
        "case, a 3 -> 6 scale-out with one connector whose tasks are slow to stop, run as "
        "today (batch release, no waves: the baseline), with per-resource release, with "
        "per-resource release and paced waves, and without the heavy connector (the "
        "reference); its own table. See bench/README.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run (2-3 min on a 2-core machine; a classic-sessioned rolling restart "
        "waits for the delay): "
        + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
        + " (explicit flags still win)",
    )
    parser.add_argument(
        "--store",
        choices=("postgres", "sqlite"),
        default="postgres",
        help="the coordinator's database: a throwaway PostgreSQL with durable commits (as "
        "bench/run-coordinator), or an SQLite file in a temporary directory",
    )
    parser.add_argument("--connectors", type=int, default=20, help="connectors in the catalogue")
    parser.add_argument(
        "--tasks-per-connector", type=int, default=20, help="tasks of each connector"
    )
    parser.add_argument("--workers", type=int, default=4, help="group size before each scenario")
    parser.add_argument("--scale-to", type=int, default=8, help="group size after the scale-out")
    parser.add_argument(
        "--task-start-ms",
        type=float,
        default=2.0,
        help="on_assigned sleeps this long per resource (task or connector) it starts",
    )
    parser.add_argument(
        "--task-stop-ms",
        type=float,
        default=2.0,
        help="on_revoked sleeps this long per resource (task or connector) it stops",
    )
    timeouts = parser.add_argument_group(
        "timeouts",
        "Connect's and Kafka's defaults ("
        + ", ".join(f"{name} {value} ms" for name, value in CONNECT_DEFAULTS.values())
        + ") divided by --timeout-factor: the coordinator's group defaults, the classic agents' "
        "session and heartbeat, every agent's rebalance timeout, every group's "
        f"{DELAY_KEY}, the coordinator's --classic-initial-rebalance-delay-ms (and "
        f"--classic-min-session-timeout-ms: the lower of {CLASSIC_MIN_SESSION_TIMEOUT_MS} and the "
        "session timeout). Each of the flags below overrides one (the run is then not on a "
        "single factor, and the header says so). The heavy scenario keeps its own: "
        + ", ".join(f"{k} {v}" for k, v in HEAVY_GROUP_CONFIGS.items())
        + f", rebalance timeout {HEAVY_REBALANCE_TIMEOUT_MS}.",
    )
    timeouts.add_argument(
        "--timeout-factor",
        type=float,
        default=20.0,
        help="lower is truer to Connect and slower (a classic rolling restart waits about "
        f"{DELAY_KEY} per worker); higher risks false self-fences on a busy machine",
    )
    for key, (name, value) in CONNECT_DEFAULTS.items():
        timeouts.add_argument(
            f"--{key.replace('_', '-')}",
            type=int,
            default=None,
            help=f"{name}; unless given, {value} / --timeout-factor",
        )
    parser.add_argument(
        "--restart-gap-s",
        type=float,
        default=0.0,
        help="how long a restarted worker stays down between leaving and starting again",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=0.5,
        help="pause after each quiet before the next disturbance",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of each scenario and protocol (interleaved); the table shows medians",
    )
    parser.add_argument("--poll-ms", type=int, default=20, help="quiet polling interval")
    parser.add_argument(
        "--converge-timeout-s",
        type=float,
        default=None,
        help="a disturbance not followed by a quiet group within this long fails the run "
        f"(unset: 60 s, or twice {DELAY_KEY} plus 30 s if that is longer)",
    )
    parser.add_argument(
        "--leave-timeout-s", type=float, default=30.0, help="how long stop() may take"
    )
    parser.add_argument(
        "--protocols",
        type=lambda s: [p for p in s.split(",") if p],
        default=",".join(DEFAULT_PROTOCOLS),
        help="comma-separated, from: "
        + "; ".join(f"{k} ({v.title})" for k, v in PROTOCOLS.items())
        + f". The ratio columns need {BASELINE}, the closing note {NOTE_PROTOCOL} too",
    )
    parser.add_argument(
        "--scenarios",
        "--scenario",
        type=lambda s: [p for p in s.split(",") if p],
        default=",".join(DEFAULT_SCENARIOS),
        help="comma-separated, from: " + ", ".join(SCENARIOS) + " (heavy runs only when named: "
        "--scenarios heavy, or restart,scale,bounce,leader,heavy for all)",
    )
    heavy = parser.add_argument_group(
        "the heavy scenario (--scenarios heavy)",
        f"A group of --heavy-workers workers grows to --heavy-scale-to; the catalogue is "
        f"{HEAVY_CONNECTOR!r} (the heavy connector) and light-00, light-01, ...; each variant "
        "runs --repeat times in fresh groups. --protocols does not apply (all connect); "
        "--workers, --scale-to, --connectors, --tasks-per-connector, --task-start-ms and "
        "--task-stop-ms are the other scenarios'.",
    )
    heavy.add_argument(
        "--heavy-variants",
        type=lambda s: [p for p in s.split(",") if p],
        default=",".join(HEAVY_VARIANTS),
        help="comma-separated, from: "
        + "; ".join(f"{k} ({v.title})" for k, v in HEAVY_VARIANTS.items()),
    )
    heavy.add_argument("--heavy-workers", type=int, default=3, help="group size before")
    heavy.add_argument("--heavy-scale-to", type=int, default=6, help="group size after")
    heavy.add_argument(
        "--heavy-tasks",
        type=int,
        default=6,
        help=f"tasks of the heavy connector {HEAVY_CONNECTOR!r}",
    )
    heavy.add_argument(
        "--heavy-stop-ms",
        type=float,
        default=3000.0,
        help="how long each heavy task takes to stop (in the reference variant: --light-stop-ms)",
    )
    heavy.add_argument("--light-connectors", type=int, default=3, help="light connectors")
    heavy.add_argument("--light-tasks", type=int, default=16, help="tasks of each light connector")
    heavy.add_argument(
        "--light-stop-ms",
        type=float,
        default=10.0,
        help="how long every other resource (light tasks, every connector) takes to stop",
    )
    heavy.add_argument(
        "--heavy-start-ms", type=float, default=10.0, help="how long every resource takes to start"
    )
    heavy.add_argument(
        "--wave-max-resources",
        type=int,
        default=4,
        help=f"{WAVE_MAX_KEY} of the waves variant",
    )
    heavy.add_argument(
        "--wave-pause-ms", type=int, default=200, help=f"{WAVE_PAUSE_KEY} of the waves variant"
    )
    parser.add_argument(
        "--assignment-interval-ms",
        type=int,
        default=ASSIGNMENT_INTERVAL.default,
        help=f"the coordinator's default {ASSIGNMENT_INTERVAL.name} (DESIGN 3.21; 0: a "
        "computation at every epoch bump, as before batching)",
    )
    parser.add_argument(
        "--agent-log-level",
        default="WARNING",
        help="worker_agent log level, to rebalance-agents.log beside --output",
    )
    parser.add_argument(
        "--coordinator-log-level",
        default="INFO",
        help="coordinator-svc serve --log-level, to rebalance-coordinator.log beside --output",
    )
    parser.add_argument(
        "--output",
        default=str(RESULTS / "rebalance-latest.json"),
        help="the JSON report; every listener call goes beside it, to <name>-calls.jsonl, and "
        "the coordinator's and the agents' logs",
    )
    parser.add_argument("--state-dir", default="", help="(for run-rebalance's exit trap)")
    args = parser.parse_args(argv)
    if args.quick:
        explicit = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:])}
        for name, value in QUICK.items():
            if f"--{name.replace('_', '-')}" not in explicit:
                setattr(args, name, value)
    for p in args.protocols:
        if p not in PROTOCOLS:
            parser.error(f"unknown protocol {p!r}")
    if args.timeout_factor <= 0:
        parser.error("--timeout-factor must be > 0")
    args.overridden = [k for k in CONNECT_DEFAULTS if getattr(args, k) is not None]
    for key, (_, value) in CONNECT_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, max(1, round(value / args.timeout_factor)))
        positive = key in ("session_timeout_ms", "heartbeat_interval_ms", "rebalance_timeout_ms")
        if getattr(args, key) < (1 if positive else 0):
            parser.error(f"--{key.replace('_', '-')} must be {'> 0' if positive else '>= 0'}")
    if args.heartbeat_interval_ms >= args.session_timeout_ms:
        parser.error("the heartbeat interval must be below the session timeout")
    if args.converge_timeout_s is None:
        args.converge_timeout_s = max(60.0, 2 * args.scheduled_rebalance_max_delay_ms / 1000 + 30)
    for s in args.scenarios:
        if s not in SCENARIOS:
            parser.error(f"unknown scenario {s!r}")
    for v in args.heavy_variants:
        if v not in HEAVY_VARIANTS:
            parser.error(f"unknown heavy variant {v!r}")
    if args.heavy_scale_to <= args.heavy_workers:
        parser.error("--heavy-scale-to must be larger than --heavy-workers")
    if min(args.heavy_stop_ms, args.light_stop_ms, args.heavy_start_ms) < 0:
        parser.error("listener times cannot be negative")
    if args.wave_max_resources < 0 or args.wave_pause_ms < 0:
        parser.error("wave settings cannot be negative")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.scale_to <= args.workers:
        parser.error("--scale-to must be larger than --workers")
    if args.task_start_ms < 0 or args.task_stop_ms < 0:
        parser.error("listener times cannot be negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    logs = Path(args.output).resolve().parent
    logs.mkdir(parents=True, exist_ok=True)
    agent_log = logging.FileHandler(logs / "rebalance-agents.log", mode="w")
    agent_log.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(message)s"))
    logging.getLogger().addHandler(agent_log)
    logging.getLogger().setLevel(args.agent_log_level.upper())
    started = time.time()
    with ExitStack() as stack:
        bench = Bench(args, stack)
        bench.start_coordinator()
        for repeat in range(1, args.repeat + 1):
            for scenario in args.scenarios:
                if scenario == "heavy":
                    for variant in args.heavy_variants:
                        bench.runs.append(bench.run_heavy(variant, repeat))
                    continue
                for protocol in args.protocols:
                    bench.runs.append(bench.run_scenario(scenario, protocol, repeat))
        log("stopping the coordinator")
    end_of_run = time.monotonic()
    intervals = bench.recorder.intervals(end_of_run)
    overlaps = double_ownership(intervals)
    bench.compute(intervals, overlaps)
    rows = bench.rows()
    note = bench.closing_note(rows) if rows else None
    if rows:
        bench.print_table(rows, note)
    heavy_rows = bench.heavy_rows()
    if heavy_rows:
        bench.print_heavy_table(heavy_rows)

    failed = [r for r in bench.runs if not r.converged]
    held = sum(len(v) for v in intervals.held.values())
    if overlaps:
        print(
            f"CHECK FAILED: {len(overlaps)} times a connector or task was held by two workers "
            "at once (from the call of on_assigned to the return of on_revoked):"
        )
        where: dict[tuple[str, str], list[Overlap]] = {}
        for o in overlaps:
            run, phase = bench.phase_of(o)
            name = f"{run.label} (group {run.group})" if run is not None else o.key[0]
            where.setdefault((name, phase), []).append(o)
        for (name, phase), found in where.items():
            print(f"  {len(found)} in {name}, during {phase}; e.g.")
            for o in found[:3]:
                print(f"    {o.describe(bench.t_zero)}")
        print(
            "  (times in seconds since the benchmark started, as in "
            f"{Path(args.output).stem}-calls.jsonl)"
        )
    else:
        print(
            f"check: no connector or task was ever held by two workers at once "
            f"({held:,} holding intervals over {len(intervals.held):,} resources, "
            f"{len(bench.recorder.calls):,} listener calls, set-up and tear-down included): OK"
        )
    for row in heavy_rows:
        if row["never_restarted"]:
            print(
                f"WARNING: heavy connector scale-out, {row['variant']}: {row['never_restarted']} "
                "revoked resources were never started on another worker"
            )
    if intervals.anomalies:
        print(f"WARNING: {len(intervals.anomalies)} listener anomalies:")
        for line in intervals.anomalies[:20]:
            print(f"  {line}")
    for r in failed:
        print(f"NOT CONVERGED: {r.label}: {r.failure}")
    for r in bench.runs:
        if r.scenario == "restart" and r.converged:
            each = ", ".join(f"{t:.2f}" for t in r.figures["converge_each_s"])
            print(
                f"{r.protocol} rolling restart, repeat {r.repeat}: time to converge per restart "
                f"(s): {each}"
            )
    fenced = [r for r in bench.runs if r.figures.get("self_fenced")]
    if fenced:
        print(
            "NOTE: agents fenced themselves in "
            + ", ".join(f"{r.label} ({r.figures['self_fenced']})" for r in fenced)
            + f" (a false fence on a busy machine, or --timeout-factor {args.timeout_factor:g} "
            "is too high for it; the figures of those runs include it)"
        )

    report = {
        "run": {
            "started": bench.started,
            "seconds": round(time.time() - started, 1),
            "host": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "grpcio": grpc.__version__,
                "platform": platform.platform(),
            },
            "git": git_state(),
            "store": bench.store_info,
            "config": {k: v for k, v in vars(args).items() if k not in ("state_dir", "output")},
        },
        "timeout_factor": args.timeout_factor,
        "timeouts": {
            "connect_defaults": {name: value for name, value in CONNECT_DEFAULTS.values()},
            "used": {name: getattr(args, key) for key, (name, _) in CONNECT_DEFAULTS.items()},
            "classic_min_session_timeout_ms": min(
                CLASSIC_MIN_SESSION_TIMEOUT_MS, args.session_timeout_ms
            ),
            "overridden": args.overridden,
            "single_factor": not args.overridden,
        },
        "protocols": {p: vars(PROTOCOLS[p]) for p in args.protocols},
        "baseline": BASELINE if BASELINE in args.protocols else None,
        "figures": rows,
        "closing_note": note,
        "heavy": heavy_rows,
        "runs": [
            {
                "protocol": r.protocol,
                "scenario": r.scenario,
                "variant": r.variant or None,
                "repeat": r.repeat,
                "group": r.group,
                "delay_ms": r.delay_ms,
                "workers_before": r.workers_before,
                "workers_after": r.workers_after,
                "converged": r.converged,
                "failure": r.failure,
                "disturbances": [
                    {
                        "what": d.what,
                        "at": round(d.at - bench.t_zero, 4),
                        "quiet_at": None
                        if d.quiet_at is None
                        else round(d.quiet_at - bench.t_zero, 4),
                        "seconds": d.seconds,
                    }
                    for d in r.disturbances
                ],
                "figures": r.figures,
            }
            for r in bench.runs
        ],
        "check": {
            "double_ownership": [
                {
                    "run": getattr(bench.phase_of(o)[0], "group", None),
                    "phase": bench.phase_of(o)[1],
                    "what": o.describe(bench.t_zero),
                }
                for o in overlaps
            ],
            "anomalies": intervals.anomalies,
            "holding_intervals": held,
        },
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    calls_path = out.with_name(out.stem + "-calls.jsonl")
    with calls_path.open("w") as f:
        for c in sorted(bench.recorder.snapshot(), key=lambda c: c.begin):
            f.write(
                json.dumps(
                    {
                        "group": c.owner[0],
                        "worker": show_owner(c.owner),
                        "event": c.kind,
                        "begin": round(c.begin - bench.t_zero, 4),
                        "end": round(c.end - bench.t_zero, 4),
                        "connectors": sum(1 for k in c.keys if k[1] < 0),
                        "tasks": sum(1 for k in c.keys if k[1] >= 0),
                    }
                )
                + "\n"
            )
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    shown = out.parent.relative_to(REPO) if out.resolve().is_relative_to(REPO) else out.parent
    log(
        f"wrote {out}; logs: {shown}/rebalance-coordinator.log, {shown}/rebalance-agents.log; "
        f"done in {time.time() - started:.0f} s"
    )
    if overlaps or failed:
        print("REBALANCE BENCHMARK FAILED (see above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
