#!/usr/bin/env python3
"""Issue 24's three 100,000-task scenarios, against this checkout and a baseline, side by side
(run it through ./bench/run-large; see bench/README.md, "Large catalogues").

One throwaway PostgreSQL (durable commits); for each scenario, each code under test gets a fresh
database and a fresh `coordinator-svc serve` (this checkout's, then `--serve-command`'s):

  reconcile  a group of MEMBERS members over CONNECTORS x TASKS tasks (default 10 members,
             1,000 x 100 = 100,000 tasks). Members heartbeat as the agent does (the owned list
             only when it changed; at once after a new assignment); the driver plays the
             assignor member (COMPUTE_ASSIGNMENT -> Prepare -> Install: sticky, balanced, and
             each round also hands ROTATE tasks of every member to the next, so members revoke).
             The computations run in a process of their own, as they would in the assignor
             member's worker: the other nine members' round trips do not wait behind its
             interpreter lock (decoding the view, encoding 100,000 tasks).
             Forming, then ROUNDS rounds, each started by one PutConnector of 100 tasks.
             Reported: heartbeat p50/p99/max while forming and during the rounds, the assignor
             member's next two heartbeats after each put. Aim: p99 < 50 ms during the rounds.
  put        one PutConnector of a BIG_TASKS-task connector (default 100,000) into a one-member
             group while another group (5 members, 100 tasks) heartbeats every 100 ms, driven
             from a process of its own (so the driver's own work on the 100,000-task share does
             not delay its round trips). Reported:
             the put's latency, the other group's heartbeat delay (p99/max in the window from
             the put to the big group STABLE, against before), the big member's next three
             heartbeats, time until the big group is STABLE. Aim: other group p99 < 50 ms.
  full-owned one member owning the whole catalogue reports its full owned list on every
             heartbeat (every 500 ms) for FULL_S seconds, with a PutConnector of 100 tasks every
             5 s (state transactions on the group). Reported: `group_dropped` lines in the
             coordinator's log, heartbeat errors, p50/p99/max. Aim: no drop.

Latencies are measured by the driver (gRPC round trip on 127.0.0.1), so they include the
driver's own share of the 2 cores; the coordinator's CPU seconds are printed beside them.
Results: bench/results/large-catalogue-latest.json; coordinator logs in bench/results/.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "generated"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import grpc  # noqa: E402
from connect.group.v1 import (  # noqa: E402
    admin_pb2,
    admin_pb2_grpc,
    coordinator_pb2,
    coordinator_pb2_grpc,
)

from bench.coordinator_bench import (  # noqa: E402
    IC,
    PG_SETTINGS,
    Child,
    _proc_cpu,
    free_port,
    log,
)
from bench.scale_bench import Scrape, scrape, served  # noqa: E402
from tests.support.pgcluster import ThrowawayCluster, create_database  # noqa: E402

RESULTS = REPO / "bench" / "results"
NONE, COMPUTE_ASSIGNMENT = 0, 10001
FENCED, UNKNOWN_MEMBER = 110, 25  # FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID
Task = tuple[str, int]
Share = tuple[frozenset[str], frozenset[Task]]
EMPTY_SHARE: Share = (frozenset(), frozenset())
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
]


def to_msg(share: Share, msg: Any) -> None:
    msg.SetInParent()
    msg.connectors.extend(sorted(share[0]))
    for c, t in sorted(share[1]):
        msg.tasks.add(connector=c, task=t)


def from_msg(msg: Any) -> Share:
    return frozenset(msg.connectors), frozenset((t.connector, t.task) for t in msg.tasks)


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of sorted `values`."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def summary(latencies: list[float]) -> dict[str, Any]:
    values = sorted(latencies)
    return {
        "count": len(values),
        "p50_ms": round(pct(values, 0.50), 2),
        "p99_ms": round(pct(values, 0.99), 2),
        "max_ms": round(values[-1], 2) if values else 0.0,
    }


# --- the assignor the driver plays -------------------------------------------------------------


def sticky_target(
    previous: dict[str, Share], members: list[str], catalogue: dict[str, int], rotate: int
) -> dict[str, Share]:
    """The previous target fitted to the catalogue and members, gaps filled to the emptiest
    member, balanced to floor/ceiling (connectors and tasks apart), then every member (sorted)
    hands its `rotate` lowest tasks to the next one (each member revokes `rotate` tasks)."""
    ids = sorted(members)
    live_tasks = {(c, t) for c, n in catalogue.items() for t in range(n)}
    conns = {m: set(previous.get(m, EMPTY_SHARE)[0]) & catalogue.keys() for m in ids}
    tasks = {m: set(previous.get(m, EMPTY_SHARE)[1]) & live_tasks for m in ids}
    for kind, universe in ((conns, set(catalogue)), (tasks, live_tasks)):
        placed: set[Any] = set().union(*kind.values()) if kind else set()
        free = sorted(universe - placed)
        floor, extra = divmod(len(universe), len(ids))
        for m in ids:  # over the ceiling: give its highest back, as Connect's assignor
            surplus = sorted(kind[m])[floor + 1 :]  # revokes from the end of a worker's list
            kind[m].difference_update(surplus)
            free.extend(surplus)
        for m in sorted(ids, key=lambda m: len(kind[m])):
            while len(kind[m]) < floor and free:
                kind[m].add(free.pop())
        for m in sorted(ids, key=lambda m: len(kind[m])):
            while free and len(kind[m]) < floor + 1:
                kind[m].add(free.pop())
        del extra
    if rotate and len(ids) > 1:
        moving = {m: sorted(tasks[m])[:rotate] for m in ids}
        for i, m in enumerate(ids):
            tasks[m] -= set(moving[m])
            tasks[ids[(i + 1) % len(ids)]] |= set(moving[m])
    return {m: (frozenset(conns[m]), frozenset(tasks[m])) for m in ids}


# --- a member as the agent behaves -------------------------------------------------------------


@dataclass
class Sample:
    at: float  # perf_counter when sent
    ms: float
    code: int
    member: str
    sent_owned: bool = False  # the request carried the owned list
    got_assignment: bool = False  # the answer carried an assignment


@dataclass
class Member:
    """A member's loop on its own thread: heartbeat every `period_s`, at once after a new
    assignment; the owned list only when it changed (`full_owned`: every time)."""

    run: Client
    group: str
    member_id: str
    period_s: float
    full_owned: bool = False
    epoch: int = 0
    told: Share = EMPTY_SHARE
    told_digest: int = hash(EMPTY_SHARE)  # compared with the assignor's (`share_digest`)
    reported: Share | None = None
    samples: list[Sample] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    asked: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def request(self) -> Any:
        req = coordinator_pb2.ConnectGroupHeartbeatRequest(
            group_id=self.group, member_id=self.member_id, member_epoch=self.epoch
        )
        if self.epoch == 0:
            req.rebalance_timeout_ms = 60_000
            req.url = f"http://{self.member_id}.bench.invalid:8083"
            req.client_assignors.assignors.append(IC)
            to_msg(self.told, req.connectors_and_tasks)
            self.reported = self.told
        elif self.full_owned or self.reported != self.told:
            to_msg(self.told, req.connectors_and_tasks)
            self.reported = self.told
        return req

    def beat(self) -> Any:
        req = self.request()
        sent_owned = req.HasField("connectors_and_tasks")
        started = time.perf_counter()
        try:
            resp = self.run.coordinator.ConnectGroupHeartbeat(req, timeout=60)
            code = resp.error_code
        except grpc.RpcError as error:
            resp, code = None, -int(error.code().value[0])  # type: ignore[union-attr]
        self.samples.append(
            Sample(
                started,
                (time.perf_counter() - started) * 1000,
                code,
                self.member_id,
                sent_owned,
                resp is not None and resp.HasField("assignment"),
            )
        )
        if resp is None:
            return None
        if code in (NONE, COMPUTE_ASSIGNMENT):
            self.epoch = resp.member_epoch
            if resp.HasField("assignment"):
                told = from_msg(resp.assignment.connectors_and_tasks)
                changed = told != self.told
                self.told = told
                if changed:
                    self.told_digest = share_digest(told)
                    return "again"
            if code == COMPUTE_ASSIGNMENT:
                self.asked.set()
        elif code in (FENCED, UNKNOWN_MEMBER):
            self.epoch, self.told, self.reported = 0, EMPTY_SHARE, None
            self.told_digest = share_digest(EMPTY_SHARE)
        return resp

    def loop(self) -> None:
        while not self.stop.is_set():
            again = self.beat() == "again"
            if not again:
                self.stop.wait(self.period_s)

    def reports_told(self) -> bool:
        """Its last heartbeat reported the share it was told."""
        return self.reported == self.told


def member_process(
    address: str, group: str, member_id: str, period_s: float, go: Any, stop: Any, out: Any
) -> None:
    """One member (`Member`) in a process of its own, as every worker is: its round trips
    wait for no other member's decoding. Sends ("ready",) once connected, then, from when `go`
    is set, each heartbeat's `Sample` and its state after it ("state", epoch, told digest,
    reports told, asked to compute) through `out`; ends when `stop` is set."""
    member = Member(Client(address, member_id), group, member_id, period_s)
    out.send(("ready",))
    go.wait()
    while not stop.is_set():
        again = member.beat() == "again"
        x = member.samples[-1]
        out.send(("sample", x.at, x.ms, x.code, x.sent_owned, x.got_assignment))
        out.send(
            (
                "state",
                member.epoch,
                member.told_digest,
                member.reports_told(),
                member.asked.is_set(),
            )
        )
        member.asked.clear()
        if not again:
            stop.wait(period_s)
    out.close()
    member.run.channel.close()


class RemoteMember:
    """The driver's view of a `member_process`: what `Client.wait_stable`, `assignor_loop` and
    the figures read of a `Member`, kept current by a thread reading the process's reports."""

    def __init__(self, address: str, group: str, member_id: str, period_s: float, go: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self.ready = threading.Event()
        self.group, self.member_id = group, member_id
        self.epoch = 0
        self.told_digest = share_digest(EMPTY_SHARE)
        self._reports_told = False
        self.samples: list[Sample] = []
        self.asked = threading.Event()
        self.stop = context.Event()
        reader, writer = context.Pipe(duplex=False)
        self.process = context.Process(
            target=member_process,
            args=(address, group, member_id, period_s, go, self.stop, writer),
            daemon=True,
        )
        self.process.start()
        writer.close()
        self.thread = threading.Thread(target=self._read, args=(reader,), daemon=True)
        self.thread.start()

    def _read(self, reader: Any) -> None:
        while True:
            try:
                report = reader.recv()
            except (EOFError, OSError):
                return
            if report[0] == "ready":
                self.ready.set()
            elif report[0] == "sample":
                self.samples.append(
                    Sample(report[1], report[2], report[3], self.member_id, *report[4:])
                )
            else:
                _, self.epoch, self.told_digest, self._reports_told, asked = report
                if asked:
                    self.asked.set()

    def reports_told(self) -> bool:
        return self._reports_told


# --- one scenario against one coordinator ------------------------------------------------------


class Client:
    """The driver's side of one coordinator: its stubs, the groups' members on threads and
    the assignor member's computations (also run alone in a process of its own, see
    `other_group_process`)."""

    def __init__(self, address: str, variant: str) -> None:
        self.variant = variant
        self.channel_address = address
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.coordinator = coordinator_pb2_grpc.ConnectGroupCoordinatorStub(self.channel)
        self.admin = admin_pb2_grpc.ConnectGroupAdminStub(self.channel)
        self.targets: dict[str, dict[str, Share]] = {}  # computed here
        self.target_digests: dict[str, dict[str, int]] = {}  # here or by a remote assignor
        self.remote: dict[str, RemoteAssignor] = {}  # groups whose assignor runs elsewhere
        self.installs: dict[str, int] = {}  # installs done, per group
        self.assignor: dict[str, str] = {}  # the member last asked to compute, per group
        self.members: list[Member | RemoteMember] = []
        self.compute_ms: list[float] = []
        grpc.channel_ready_future(self.channel).result(timeout=60)

    def stop_members(self) -> None:
        for m in self.members:
            m.stop.set()
        for m in self.members:
            if isinstance(m, RemoteMember):
                m.process.join(70)
            if m.thread is not None:
                m.thread.join(70)

    # --- helpers ---

    def put(self, group: str, name: str, tasks: int) -> float:
        started = time.perf_counter()
        r = self.admin.PutConnector(
            admin_pb2.PutConnectorRequest(group_id=group, connector=name, task_count=tasks),
            timeout=120,
        )
        if r.error_code != NONE:
            raise RuntimeError(f"PutConnector {name}: {r.error_code} {r.error_message}")
        return (time.perf_counter() - started) * 1000

    def describe(self, group: str) -> Any:
        resp = self.admin.DescribeGroups(
            admin_pb2.DescribeGroupsRequest(group_ids=[group]), timeout=120
        )
        return resp.groups[0]

    def wait_stable(self, group: str, timeout_s: float, after_install: int = 0) -> float:
        """Until DescribeGroups says STABLE. DescribeGroups is O(group) (a 100,000-task group's
        answer costs the coordinator about as much as an install), so it is asked only when the
        members' own view says the group may be settled (an install numbered above
        `after_install` done, every member told its share of it and reporting it), and at most
        every 5 s otherwise."""
        started = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        asked = time.monotonic()
        while time.monotonic() < deadline:
            members = [m for m in self.members if m.group == group]
            target = self.target_digests.get(group, {})
            settled = self.installs.get(group, 0) > after_install and all(
                m.told_digest == target.get(m.member_id) and m.reports_told() for m in members
            )
            gap = time.monotonic() - asked
            if (settled and gap > 0.5) or gap > 5.0:
                asked = time.monotonic()
                if self.describe(group).state == "STABLE":
                    return time.perf_counter() - started
            time.sleep(0.02)
        raise RuntimeError(f"{self.variant}: group {group} not STABLE within {timeout_s:.0f}s")

    def assignor_loop(self, group: str, rotate: Callable[[], int], stop: threading.Event) -> None:
        """Watch the group's members for COMPUTE_ASSIGNMENT and compute (the agent's assignor
        runs beside its heartbeat loop)."""
        members = [m for m in self.members if m.group == group]
        while not stop.is_set():
            asked = next((m for m in members if m.asked.is_set()), None)
            if asked is None:
                stop.wait(0.02)
                continue
            asked.asked.clear()
            try:
                self.compute(group, asked, rotate())
            except Exception as error:
                log(f"  {self.variant}: compute for {group} failed: {error}")

    def compute(self, group: str, member: Member | RemoteMember, rotate: int) -> None:
        self.assignor[group] = member.member_id
        remote = self.remote.get(group)
        if remote is None:
            self.compute_for(group, member.member_id, member.epoch, rotate)
            return
        installed, digests, ms = remote.compute(member.member_id, member.epoch, rotate)
        if installed:
            self.target_digests[group] = digests
            self.installs[group] = self.installs.get(group, 0) + 1
        self.compute_ms.append(ms)

    def compute_for(self, group: str, member_id: str, epoch: int, rotate: int) -> bool:
        """Prepare, the sticky target, Install, as `member_id` at `epoch`: whether installed."""
        started = time.perf_counter()
        prep = self.coordinator.ConnectGroupPrepareAssignment(
            coordinator_pb2.ConnectGroupPrepareAssignmentRequest(
                group_id=group, member_id=member_id, member_epoch=epoch
            ),
            timeout=120,
        )
        if prep.error_code != NONE:
            return False
        catalogue = {c.name: c.task_count for c in prep.catalogue}
        ids = [m.member_id for m in prep.members]
        target = sticky_target(self.targets.get(group, {}), ids, catalogue, rotate)
        install = coordinator_pb2.ConnectGroupInstallAssignmentRequest(
            group_id=group,
            member_id=member_id,
            member_epoch=epoch,
            group_epoch=prep.group_epoch,
        )
        for each, share in sorted(target.items()):
            to_msg(share, install.members.add(member_id=each).connectors_and_tasks)
        done = self.coordinator.ConnectGroupInstallAssignment(install, timeout=120)
        installed = done.error_code == NONE
        if installed:
            self.targets[group] = target
            self.target_digests[group] = {m: share_digest(s) for m, s in target.items()}
            self.installs[group] = self.installs.get(group, 0) + 1
        self.compute_ms.append((time.perf_counter() - started) * 1000)
        return installed

    def group_members(
        self, group: str, count: int, period_s: float, full: bool = False, remote: bool = False
    ) -> None:
        """`count` members of `group` on threads here, or each in a process of its own (all
        started, then let go at once, so that they join together as threads here do)."""
        go = multiprocessing.get_context("spawn").Event()
        for i in range(count):
            member_id = f"{group}-m{i:02d}"
            if remote:
                address = self.channel_address
                self.members.append(RemoteMember(address, group, member_id, period_s, go))
                continue
            m = Member(self, group, member_id, period_s, full_owned=full)
            self.members.append(m)
            m.start()
        for m in self.members:
            if isinstance(m, RemoteMember) and not m.ready.wait(120):
                raise RuntimeError(f"member process {m.member_id} did not start")
        go.set()

    def catalogue(self, group: str, connectors: int, tasks: int) -> float:
        started = time.perf_counter()
        for c in range(connectors):
            self.put(group, f"conn-{c:04d}", tasks)
        return time.perf_counter() - started


def share_digest(share: Share) -> int:
    """A share's hash, the same in the driver and in `assignor_process` (both run with the same
    PYTHONHASHSEED, see `main`): members compare the share they were told with the assignor's
    target without either process sending the other 100,000 tasks."""
    return hash(share)


def assignor_process(address: str, group: str, probe: int, pipe: Any) -> None:
    """The assignor member's computations for `group`, in a process of its own: receives
    (member id, epoch, rotate), answers (installed, {member: share digest}, ms); None ends it."""
    if hash("hash-probe") != probe:
        pipe.send(RuntimeError("the assignor process hashes strings differently (PYTHONHASHSEED)"))
        return
    client = Client(address, "assignor")
    pipe.send("ready")
    while (asked := pipe.recv()) is not None:
        member_id, epoch, rotate = asked
        installed = client.compute_for(group, member_id, epoch, rotate)
        pipe.send((installed, client.target_digests.get(group, {}), client.compute_ms[-1]))
    client.channel.close()


class RemoteAssignor:
    """A group's assignor computations run by `assignor_process`."""

    def __init__(self, address: str, group: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipe, theirs = context.Pipe()
        self.process = context.Process(
            target=assignor_process,
            args=(address, group, hash("hash-probe"), theirs),
            daemon=True,
        )
        self.process.start()
        if not self.pipe.poll(60):
            raise RuntimeError("the assignor process did not start")
        ready = self.pipe.recv()
        if ready != "ready":
            raise RuntimeError(f"the assignor process failed: {ready!r}")

    def compute(
        self, member_id: str, epoch: int, rotate: int
    ) -> tuple[bool, dict[str, int], float]:
        self.pipe.send((member_id, epoch, rotate))
        installed, digests, ms = self.pipe.recv()
        return bool(installed), dict(digests), float(ms)

    def close(self) -> None:
        self.pipe.send(None)
        self.process.join(30)


class Scenario(Client):
    """One scenario against one coordinator process of its own (on a fresh database)."""

    def __init__(self, name: str, variant: str, serve: list[str], cluster_url: str) -> None:
        self.name, self.variant = name, variant
        self.db_url = create_database(cluster_url, f"lc_{name.replace('-', '_')}_{variant}")
        port = free_port()
        self.metrics_port = free_port()
        self.address = f"127.0.0.1:{port}"
        self.log_path = RESULTS / f"large-{name}-{variant}-coordinator.log"
        args = [
            *serve,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--advertised-address",
            self.address,
            "--database-url",
            self.db_url,
            "--node-id",
            f"bench-{variant}",
            "--session-timeout-ms",
            "30000",
            "--rebalance-timeout-ms",
            "60000",
            "--heartbeat-interval-ms",
            "1000",
            "--log-level",
            "INFO",
            "--metrics-port",
            str(self.metrics_port),
            "--metrics-host",
            "127.0.0.1",
        ]
        self.child = Child(f"coordinator-{variant}", args, self.log_path)
        super().__init__(self.address, variant)
        self.wait_serving()
        self.cpu_start = _proc_cpu(self.child.proc.pid)

    def wait_serving(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.admin.DescribeGroups(admin_pb2.DescribeGroupsRequest(group_ids=["x"]))
                return
            except grpc.RpcError:
                time.sleep(0.2)
        raise RuntimeError("coordinator not serving")

    def close(self) -> dict[str, Any]:
        self.stop_members()
        cpu = _proc_cpu(self.child.proc.pid) - self.cpu_start
        self.channel.close()
        self.child.stop()
        text = self.log_path.read_text(errors="replace")
        return {
            "coordinator_cpu_s": round(cpu, 2),
            "group_dropped": text.count("group_dropped"),
            "lease_lost_lines": sum(
                1 for line in text.splitlines() if "lease" in line and "WARNING" in line
            ),
        }

    # --- helpers ---

    def scrape(self) -> Scrape | None:
        """The coordinator's own time-per-call histograms now (its /metrics)."""
        return scrape(self.metrics_port)


def samples_of(members: list[Member | RemoteMember], since: float, until: float) -> list[Sample]:
    return [s for m in members for s in m.samples if since <= s.at <= until]


def lat(samples: list[Sample]) -> dict[str, Any]:
    out = summary([s.ms for s in samples])
    out["errors"] = sorted({s.code for s in samples if s.code not in (NONE, COMPUTE_ASSIGNMENT)})
    start = min((s.at for s in samples), default=0.0)
    # The five slowest, to tell which heartbeats pay: ms, s into the phase, member, whether the
    # request carried the owned list (o) and the answer an assignment (a).
    out["slowest"] = [
        f"{s.ms:.0f}ms@{s.at - start:.2f}s {s.member}"
        + ("o" if s.sent_owned else "")
        + ("a" if s.got_assignment else "")
        for s in sorted(samples, key=lambda s: -s.ms)[:5]
    ]
    return out


OWN_RPCS = (
    "ConnectGroupHeartbeat",
    "ConnectGroupPrepareAssignment",
    "ConnectGroupInstallAssignment",
)


def own(before: Scrape | None, after: Scrape | None) -> dict[str, Any]:
    """The coordinator's own time per call between two scrapes (handler time as it serves the
    call, without the driver's share of the cores): rpc -> count, mean, p50, p99 in ms."""
    out: dict[str, Any] = {}
    for rpc in OWN_RPCS:
        figures = served(before, after, rpc)
        if figures is not None:
            out[rpc] = {k: round(v, 1) for k, v in figures.items()}
    return out


# --- the three scenarios -----------------------------------------------------------------------


def scenario_reconcile(run: Scenario, a: argparse.Namespace) -> dict[str, Any]:
    group = "big-group"
    load_s = run.catalogue(group, a.connectors, a.tasks)
    log(f"  {run.variant}: catalogue of {a.connectors * a.tasks:,} tasks put in {load_s:.1f}s")
    rotation = {"n": 0}
    run.remote[group] = RemoteAssignor(run.address, group)
    run.group_members(group, a.members, a.period_s, remote=True)
    stop = threading.Event()
    assignor = threading.Thread(
        target=run.assignor_loop, args=(group, lambda: rotation["n"], stop), daemon=True
    )
    assignor.start()
    t0, s0 = time.perf_counter(), run.scrape()
    form_s = run.wait_stable(group, a.timeout_s)
    t1, s1 = time.perf_counter(), run.scrape()
    log(f"  {run.variant}: {a.members} members formed in {form_s:.1f}s")
    rounds: list[dict[str, Any]] = []
    rotation["n"] = a.rotate
    r0 = time.perf_counter()
    for r in range(a.rounds):
        started = time.perf_counter()
        installs = run.installs.get(group, 0)
        put_ms = run.put(group, f"extra-{r}", 100)
        stable_s = run.wait_stable(group, a.timeout_s, installs)
        time.sleep(1.5)  # the members' next heartbeats after STABLE
        after = sorted(
            (s for m in run.members if m.member_id == run.assignor.get(group) for s in m.samples),
            key=lambda s: s.at,
        )
        nxt = [round(s.ms, 1) for s in after if s.at >= started][:2]
        rounds.append({"put_ms": round(put_ms, 1), "stable_s": round(stable_s, 2), "next": nxt})
        log(f"  {run.variant}: round {r}: STABLE after {stable_s:.1f}s; assignor next hb {nxt} ms")
    r1, s2 = time.perf_counter(), run.scrape()
    stop.set()
    assignor.join(130)
    run.remote.pop(group).close()
    run.stop_members()  # their last samples are in
    return {
        "catalogue_load_s": round(load_s, 1),
        "form_s": round(form_s, 1),
        "forming": lat(samples_of(run.members, t0, t1)),
        "rounds": lat(samples_of(run.members, r0, r1)),
        "forming_own": own(s0, s1),
        "rounds_own": own(s1, s2),
        "round_detail": rounds,
        "compute_ms": [round(x) for x in run.compute_ms],
    }


def other_group_process(address: str, group: str, members: int, pipe: Any) -> None:
    """The put scenario's other group, in a process of its own: its members' round trips are
    then not delayed by the driver's own work on the big group's 100,000-task shares (one
    interpreter lock for both measured the driver as much as the coordinator). Sends "stable",
    then, when told to stop, its samples as (sent at, ms, code, member) tuples
    (`time.perf_counter` is the machine's monotonic clock, the same in every process)."""
    client = Client(address, "other")
    client.catalogue(group, 10, 10)
    client.group_members(group, members, 0.1)
    stop = threading.Event()
    threading.Thread(
        target=client.assignor_loop, args=(group, lambda: 0, stop), daemon=True
    ).start()
    client.wait_stable(group, 120)
    pipe.send("stable")
    pipe.recv()
    stop.set()
    client.stop_members()
    pipe.send([(x.at, x.ms, x.code, x.member) for m in client.members for x in m.samples])
    client.channel.close()


def scenario_put(run: Scenario, a: argparse.Namespace) -> dict[str, Any]:
    other, big = "other-group", "one-member-group"
    mine, theirs = multiprocessing.get_context("spawn").Pipe()
    process = multiprocessing.get_context("spawn").Process(
        target=other_group_process, args=(run.address, other, 5, theirs), daemon=True
    )
    process.start()
    run.group_members(big, 1, a.period_s)
    stop = threading.Event()
    threading.Thread(target=run.assignor_loop, args=(big, lambda: 0, stop), daemon=True).start()
    if not mine.poll(a.timeout_s) or mine.recv() != "stable":
        raise RuntimeError("the other group's process did not report its group STABLE")
    run.wait_stable(big, a.timeout_s)
    time.sleep(3)
    big_member = next(m for m in run.members if m.group == big)
    s0 = run.scrape()
    before = time.perf_counter()
    installs = run.installs.get(big, 0)
    put_ms = run.put(big, "huge", a.big_tasks)
    stable_s = run.wait_stable(big, a.timeout_s, installs)
    time.sleep(2)
    after, s1 = time.perf_counter(), run.scrape()
    stop.set()
    mine.send("stop")
    others = [Sample(*x) for x in mine.recv()]
    process.join(30)
    nxt = [round(s.ms, 1) for s in big_member.samples if s.at >= before][:3]
    log(f"  {run.variant}: put {put_ms:.0f} ms; STABLE after {stable_s:.1f}s; next hb {nxt} ms")
    return {
        "put_ms": round(put_ms, 1),
        "stable_s": round(stable_s, 2),
        "big_member_next_ms": nxt,
        "other_before": lat([x for x in others if before - 3 <= x.at <= before]),
        "other_during": lat([x for x in others if before <= x.at <= after]),
        "during_own": own(s0, s1),
        "compute_ms": [round(x) for x in run.compute_ms],
    }


def scenario_full_owned(run: Scenario, a: argparse.Namespace) -> dict[str, Any]:
    group = "full-owned-group"
    run.catalogue(group, a.connectors, a.tasks)
    run.group_members(group, 1, 0.5, full=True)
    stop = threading.Event()
    threading.Thread(target=run.assignor_loop, args=(group, lambda: 0, stop), daemon=True).start()
    run.wait_stable(group, a.timeout_s)
    started, s0 = time.perf_counter(), run.scrape()
    puts = 0
    while time.perf_counter() - started < a.full_s:
        time.sleep(5)
        run.put(group, f"extra-{puts}", 100)
        puts += 1
    ended, s1 = time.perf_counter(), run.scrape()
    stop.set()
    return {
        "puts": puts,
        "heartbeats": lat(samples_of(run.members, started, ended)),
        "own": own(s0, s1),
    }


SCENARIOS: dict[str, Callable[[Scenario, argparse.Namespace], dict[str, Any]]] = {
    "reconcile": scenario_reconcile,
    "put": scenario_put,
    "full-owned": scenario_full_owned,
}


# --- the table ---------------------------------------------------------------------------------


def rows(name: str, r: dict[str, Any]) -> list[tuple[str, str]]:
    def fmt(d: dict[str, Any]) -> str:
        errors = f" err {d['errors']}" if d.get("errors") else ""
        return f"{d['p50_ms']:.1f} / {d['p99_ms']:.1f} / {d['max_ms']:.0f} ({d['count']}){errors}"

    def own_hb(d: dict[str, Any]) -> str:
        hb = d.get("ConnectGroupHeartbeat")
        return "-" if hb is None else f"{hb['p50_ms']:.1f} / {hb['p99_ms']:.1f} ({hb['count']:.0f})"

    if "failed" in r:
        return [(f"{name}: failed", r["failed"][:60])]
    out: list[tuple[str, str]] = []
    if name == "reconcile":
        out += [
            ("reconcile: forming, s", f"{r['form_s']}"),
            ("reconcile: hb while forming p50/p99/max ms", fmt(r["forming"])),
            ("reconcile: hb during rounds p50/p99/max ms", fmt(r["rounds"])),
            ("reconcile: coordinator's own hb p50/p99 forming", own_hb(r["forming_own"])),
            ("reconcile: coordinator's own hb p50/p99 rounds", own_hb(r["rounds_own"])),
            ("reconcile: rounds, s to STABLE", str([d["stable_s"] for d in r["round_detail"]])),
            (
                "reconcile: assignor's next 2 hb after put, ms",
                str([d["next"] for d in r["round_detail"]]),
            ),
        ]
    elif name == "put":
        out += [
            ("put: PutConnector 100k, ms", f"{r['put_ms']}"),
            ("put: big group STABLE after, s", f"{r['stable_s']}"),
            ("put: its member's next 3 hb, ms", str(r["big_member_next_ms"])),
            ("put: other group before p50/p99/max", fmt(r["other_before"])),
            ("put: other group during p50/p99/max", fmt(r["other_during"])),
            ("put: coordinator's own hb p50/p99 during", own_hb(r["during_own"])),
        ]
    else:
        out += [
            ("full-owned: hb p50/p99/max ms", fmt(r["heartbeats"])),
            ("full-owned: coordinator's own hb p50/p99", own_hb(r["own"])),
        ]
    out += [
        (f"{name}: group_dropped in log", str(r["group_dropped"])),
        (f"{name}: coordinator CPU s", str(r["coordinator_cpu_s"])),
    ]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--serve-command", default="", help="the baseline: CMD serve ... ('' skips)")
    p.add_argument("--scenarios", default="reconcile,put,full-owned")
    p.add_argument("--connectors", type=int, default=1_000)
    p.add_argument("--tasks", type=int, default=100)
    p.add_argument("--members", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rotate", type=int, default=500, help="tasks each member revokes per round")
    p.add_argument("--big-tasks", type=int, default=100_000)
    p.add_argument("--full-s", type=float, default=15.0)
    p.add_argument("--period-s", type=float, default=0.5, help="heartbeat period of the members")
    p.add_argument("--timeout-s", type=float, default=120.0)
    a = p.parse_args()
    if os.environ.get("PYTHONHASHSEED", "random") == "random":
        # One string hash in this process and the assignor's (`share_digest`): run again with
        # a fixed seed, which the spawned processes inherit.
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    RESULTS.mkdir(parents=True, exist_ok=True)
    variants = [("new", [sys.executable, "-m", "coordinator_svc.cli"])]
    if a.serve_command:
        variants.append(("base", shlex.split(a.serve_command)))
    results: dict[str, dict[str, Any]] = {v: {} for v, _ in variants}
    with ExitStack() as stack:
        cluster = ThrowawayCluster(settings=dict(PG_SETTINGS, autovacuum="on"))
        cluster.start()
        stack.callback(cluster.stop)
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        for name in a.scenarios.split(","):
            for variant, serve in variants:
                log(f"scenario {name}, {variant}")
                run = Scenario(name, variant, serve, cluster.url)
                try:
                    results[variant][name] = SCENARIOS[name](run, a)
                except Exception as error:
                    log(f"  {variant}: {name} failed: {error!r}")
                    results[variant][name] = {"failed": repr(error)}
                finally:
                    results[variant][name].update(run.close())
    table: dict[str, dict[str, str]] = {}
    for variant, _ in variants:
        for name in a.scenarios.split(","):
            for label, value in rows(name, results[variant][name]):
                table.setdefault(label, {})[variant] = value
    width = max(len(k) for k in table)
    heads = [v for v, _ in variants]
    print("\n" + "figure".ljust(width) + "".join(f" | {h:<34}" for h in heads))
    for label, values in table.items():
        print(label.ljust(width) + "".join(f" | {values.get(h, ''):<34}" for h in heads))
    (RESULTS / "large-catalogue-latest.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
