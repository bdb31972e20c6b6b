"""Real worker agents for end-to-end tests: `python -m worker_agent.cli run` subprocesses, each
with the recording exec hook (`record_hook.py`), and what the tests conclude from the records.

- `AgentProcess`: one worker (one member id) that can be started, stopped (SIGTERM), killed
  (SIGKILL), paused (SIGSTOP), resumed and started again. Every start is a new *incarnation* with
  its own hook file and log file under the test's directory.
- `intervals()`: from the hook records, per resource, when each incarnation may have run it:
  from the start of the `assigned` call that started it to the end of the `revoked` call that
  stopped it, or to the moment the test killed the process, or still open. This is the
  conservative reading (a resource may run while its hook runs); the exact one ("assigned at the
  assigned call's end, revoked at the revoked call's start") lies inside it, so checking that
  these intervals never overlap checks both.
- `Fleet`: a coordinator address, a group, its agents, the admin calls the tests need and the
  three checks every test makes: (a) no resource ever ran on two workers at once, (b) once the
  group is quiet every catalogue resource runs on exactly one live worker, as DescribeGroups
  says, (c) connectors and, separately, tasks are balanced within one when no delay is pending.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from connect.group.v1 import admin_pb2, common_pb2

from tests.support.client import describe, from_cat, names
from tests.support.coordinator import REPO, Stubs

__all__ = [
    "AgentProcess",
    "Fleet",
    "HookRecord",
    "Incarnation",
    "Interval",
    "Quiet",
    "check_balanced",
    "check_no_overlap",
    "intervals",
    "intervals_of",
    "member_sets",
    "running_now",
    "wait_for",
]

HOOK_SCRIPT = Path(__file__).with_name("record_hook.py")
T = TypeVar("T")


# --- waiting ------------------------------------------------------------------------------------


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout_s: float = 15.0,
    interval_s: float = 0.05,
    diagnostics: Callable[[], str] | None = None,
) -> T:
    """Poll `probe` until it returns something other than None (or False); return it."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            extra = diagnostics() if diagnostics is not None else ""
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}\n{extra}")
        time.sleep(interval_s)


# --- hook records -------------------------------------------------------------------------------


@dataclass(frozen=True)
class HookRecord:
    """One line of a recording hook's file: one completed listener call."""

    worker: str
    event: str  # "assigned" | "revoked" | "reconfigured" | "paused" | ... | "start_failed"
    member_epoch: int
    resources: frozenset[str]  # "A" for a connector, "A-0" for a task
    t_start: float
    t_end: float
    incarnation: str = ""
    #: The event's configs ({connector: {"digest", "config"?}}; None: it carried none).
    configs: dict[str, Any] | None = field(default=None, compare=False)
    #: The event's reason ("restart" on a restart's revoked and assigned; "" otherwise).
    reason: str = ""

    @staticmethod
    def parse(line: str, incarnation: str) -> HookRecord:
        raw = json.loads(line)
        resources = frozenset(raw["connectors"]) | {f"{c}-{t}" for c, t in raw["tasks"]}
        return HookRecord(
            worker=raw["worker"],
            event=raw["event"],
            member_epoch=int(raw["member_epoch"]),
            resources=frozenset(resources),
            t_start=float(raw["t_start"]),
            t_end=float(raw["t_end"]),
            incarnation=incarnation,
            configs=raw.get("configs"),
            reason=raw.get("reason", ""),
        )


@dataclass
class Incarnation:
    """One run of an agent process (a restart under the same member id is a new one)."""

    label: str  # "W2#1"
    member_id: str
    proc: subprocess.Popen[bytes]
    hook_file: Path
    log_file: Path
    started_at: float
    killed_at: float | None = None  # SIGKILLed: everything it ran stopped by then
    exited_at: float | None = None  # exited by itself (after SIGTERM, or on its own)
    paused: list[tuple[float, float | None]] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_lines(self, containing: str = "") -> list[str]:
        """The lines of this run's log (text format) that contain `containing`."""
        if not self.log_file.exists():
            return []
        lines = self.log_file.read_text(errors="replace").splitlines()
        return [line for line in lines if containing in line]

    def logged_at(self, containing: str) -> float:
        """The time (time.time() scale) of the first log line that contains `containing`."""
        lines = self.log_lines(containing)
        assert lines, f"{self.label} never logged {containing!r}"
        stamp = datetime.datetime.strptime(lines[0][:23], "%Y-%m-%d %H:%M:%S,%f")
        return stamp.timestamp()  # the agent logs local time, as this process reads it

    def records(self) -> list[HookRecord]:
        if not self.hook_file.exists():
            return []
        lines = self.hook_file.read_text().splitlines()
        out = [HookRecord.parse(line, self.label) for line in lines if line.strip()]
        return sorted(out, key=lambda r: (r.t_start, r.t_end))


class AgentProcess:
    """`python -m worker_agent.cli run` for one member id, with the recording exec hook."""

    def __init__(
        self,
        member_id: str,
        coordinator: str,
        group: str,
        workdir: Path,
        protocol: str = "sessioned",
        hook_sleep_s: float = 0.0,
        extra_args: Iterable[str] = (),
        instance_id: str | None = None,
        rebalance_timeout_ms: int = 10_000,
        rpc_timeout_s: float | None = None,
        explicit_member_id: bool = True,
        fail_file: Path | None = None,
        log_level: str = "INFO",
    ) -> None:
        """`fail_file`: the recording hook's FAIL_FILE (`record_hook.py`); `log_level`: the
        agent's --log-level."""
        self.member_id = member_id  # the label; also the member id if `explicit_member_id`
        self.explicit_member_id = explicit_member_id
        self.coordinator = coordinator
        self.group = group
        self.workdir = workdir
        self.protocol = protocol
        self.hook_sleep_s = hook_sleep_s
        self.extra_args = tuple(extra_args)
        self.instance_id = instance_id
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.rpc_timeout_s = rpc_timeout_s
        self.fail_file = fail_file
        self.log_level = log_level
        self.incarnations: list[Incarnation] = []
        workdir.mkdir(parents=True, exist_ok=True)

    # --- process control -----------------------------------------------------------------

    @property
    def current(self) -> Incarnation:
        assert self.incarnations, f"{self.member_id} was never started"
        return self.incarnations[-1]

    @property
    def alive(self) -> bool:
        return bool(self.incarnations) and self.current.alive

    def command(self, hook_file: Path) -> list[str]:
        hook = shlex.join(
            [sys.executable, "-S", str(HOOK_SCRIPT), str(hook_file), f"{self.hook_sleep_s:g}"]
            + ([str(self.fail_file)] if self.fail_file is not None else [])
        )
        args = [
            sys.executable,
            "-m",
            "worker_agent.cli",
            "run",
            "--coordinator",
            self.coordinator,
            "--group",
            self.group,
            *(("--member-id", self.member_id) if self.explicit_member_id else ()),
            "--protocol",
            self.protocol,
            "--exec-hook",
            hook,
            "--hook-timeout-s",
            "10",
            "--rebalance-timeout-ms",
            str(self.rebalance_timeout_ms),
            "--log-format",
            "text",
            "--log-level",
            self.log_level,
        ]
        if self.rpc_timeout_s is not None:
            args += ["--rpc-timeout-s", f"{self.rpc_timeout_s:g}"]
        if self.instance_id is not None:
            args += ["--instance-id", self.instance_id]
        return args + list(self.extra_args)

    def start(self) -> AgentProcess:
        assert not self.alive, f"{self.member_id} is already running"
        n = len(self.incarnations) + 1
        label = f"{self.member_id}#{n}"
        hook_file = self.workdir / f"{self.member_id}-{n}.hooks.jsonl"
        log_file = self.workdir / f"{self.member_id}-{n}.log"
        env = {
            **os.environ,
            "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}",
            "PYTHONUNBUFFERED": "1",
        }
        with open(log_file, "ab") as log:
            proc = subprocess.Popen(
                self.command(hook_file),
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.incarnations.append(
            Incarnation(label, self.member_id, proc, hook_file, log_file, time.time())
        )
        return self

    def joined_as(self, timeout_s: float = 10.0) -> str:
        """The member id the current incarnation runs under (its own default when the test
        gave none), from the agent's start-up log line."""
        pattern = re.compile(r"agent starting: group \S+, member (\S+),")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.current.log_lines("agent starting"):
                found = pattern.search(line)
                if found is not None:
                    return found.group(1)
            time.sleep(0.05)
        raise AssertionError(f"{self.current.label} logged no start-up line:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM: the agent revokes everything through the hook, leaves, and exits."""
        inc = self.current
        self._resume_if_paused()
        inc.proc.send_signal(signal.SIGTERM)
        try:
            code = inc.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{inc.label} did not exit within {timeout_s:g} s of SIGTERM; killed it\n"
                + self.log_tail()
            ) from None
        inc.exited_at = time.time()
        return code

    def kill(self) -> float:
        """SIGKILL; returns the time by which the process (and so its work) was gone."""
        inc = self.current
        if inc.proc.poll() is None:
            inc.proc.send_signal(signal.SIGKILL)
            inc.proc.wait(10)
            inc.killed_at = time.time()
            if inc.paused and inc.paused[-1][1] is None:
                inc.paused[-1] = (inc.paused[-1][0], inc.killed_at)
        elif inc.exited_at is None:
            inc.exited_at = time.time()
        return inc.killed_at if inc.killed_at is not None else (inc.exited_at or time.time())

    def pause(self) -> float:
        inc = self.current
        inc.proc.send_signal(signal.SIGSTOP)
        now = time.time()
        inc.paused.append((now, None))
        return now

    def resume(self) -> float:
        inc = self.current
        inc.proc.send_signal(signal.SIGCONT)
        now = time.time()
        if inc.paused and inc.paused[-1][1] is None:
            inc.paused[-1] = (inc.paused[-1][0], now)
        return now

    def _resume_if_paused(self) -> None:
        if self.incarnations and self.current.paused and self.current.paused[-1][1] is None:
            self.resume()

    def close(self) -> None:
        """Teardown: kill whatever still runs (recorded as a kill)."""
        if self.incarnations and self.current.alive:
            self._resume_if_paused()
            self.kill()

    # --- what it did -----------------------------------------------------------------------

    def records(self) -> list[HookRecord]:
        return [r for inc in self.incarnations for r in inc.records()]

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for inc in self.incarnations[-2:]:
            text = inc.log_file.read_text(errors="replace") if inc.log_file.exists() else ""
            tail = "\n".join(text.splitlines()[-lines:])
            out.append(f"--- log of {inc.label} ({inc.log_file}) ---\n{tail}")
        return "\n".join(out)


# --- intervals ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """`runner` (an incarnation) may have run `resource` from `start` to `end` (inf: still)."""

    resource: str
    worker: str
    runner: str
    start: float  # the assigned call's t_start
    end: float  # the revoked call's t_end, the kill time, or inf
    started: float  # the assigned call's t_end: surely running from here
    stopping: float  # the revoked call's t_start (or the kill time, or inf)

    @property
    def open(self) -> bool:
        return math.isinf(self.end)


def intervals_of(
    records: Iterable[HookRecord], runner: str, worker: str, killed_at: float | None = None
) -> tuple[list[Interval], list[str]]:
    """The intervals of one incarnation (`runner`) from its records, and anything inconsistent
    in them. `killed_at`: when it was SIGKILLed (everything it ran ends there)."""
    problems: list[str] = []
    out: list[Interval] = []
    running: dict[str, HookRecord] = {}
    killed = killed_at if killed_at is not None else math.inf
    for rec in sorted(records, key=lambda r: (r.t_start, r.t_end)):
        if rec.t_start > killed:
            problems.append(f"{runner}: a hook call began after the kill: {rec}")
            continue
        if rec.event == "assigned":
            for r in sorted(rec.resources):
                if r in running:
                    problems.append(f"{runner}: {r} assigned again while running: {rec}")
                    continue
                running[r] = rec
        elif rec.event in ("reconfigured", "paused", "resumed", "stopped", "start_failed"):
            continue  # runs nothing new, stops nothing (DESIGN 3.20)
        elif rec.event == "revoked":
            for r in sorted(rec.resources):
                began = running.pop(r, None)
                if began is None:
                    problems.append(f"{runner}: {r} revoked but not running: {rec}")
                    continue
                out.append(
                    Interval(
                        r,
                        worker,
                        runner,
                        began.t_start,
                        min(rec.t_end, killed),
                        began.t_end,
                        min(rec.t_start, killed),
                    )
                )
        else:
            problems.append(f"{runner}: unknown event {rec.event!r}")
    for r, began in sorted(running.items()):
        out.append(Interval(r, worker, runner, began.t_start, killed, began.t_end, killed))
    return out, problems


def intervals(agents: Iterable[AgentProcess]) -> tuple[list[Interval], list[str]]:
    """Every incarnation's intervals, and any inconsistencies in the records."""
    out: list[Interval] = []
    problems: list[str] = []
    for agent in agents:
        for inc in agent.incarnations:
            got, bad = intervals_of(inc.records(), inc.label, inc.member_id, inc.killed_at)
            out += got
            problems += bad
    return out, problems


def check_no_overlap(all_intervals: Iterable[Interval]) -> list[str]:
    """(a): pairs of intervals of different runners for one resource that overlap in time."""
    by_resource: dict[str, list[Interval]] = {}
    for iv in all_intervals:
        by_resource.setdefault(iv.resource, []).append(iv)
    problems = []
    for resource, ivs in sorted(by_resource.items()):
        ivs.sort(key=lambda iv: iv.start)
        for i, a in enumerate(ivs):
            for b in ivs[i + 1 :]:
                if a.runner != b.runner and b.start < a.end and a.start < b.end:
                    problems.append(
                        f"{resource} ran on {a.runner} [{_t(a.start)} .. {_t(a.end)}] and on "
                        f"{b.runner} [{_t(b.start)} .. {_t(b.end)}] at once"
                    )
    return problems


def running_now(all_intervals: Iterable[Interval]) -> dict[str, set[str]]:
    """Runner label -> resources it runs now (open intervals)."""
    out: dict[str, set[str]] = {}
    for iv in all_intervals:
        if iv.open:
            out.setdefault(iv.runner, set()).add(iv.resource)
    return out


def _t(x: float) -> str:
    return "open" if math.isinf(x) else f"{x:.3f}"


# --- DescribeGroups helpers --------------------------------------------------------------------


def member_sets(group: Any, which: str = "current_assignment") -> dict[str, set[str]]:
    """member id -> the resources of `which` (current_assignment, target_assignment, ...)."""
    return {m.member_id: set(names(from_cat(getattr(m, which)))) for m in group.members}


def catalogue_resources(group: Any) -> set[str]:
    """Every resource to assign: a STOPPED connector's tasks are not (DESIGN 3.20)."""
    out: set[str] = set()
    for spec in group.catalogue:
        out.add(spec.name)
        tasks = 0 if spec.target_state == common_pb2.TARGET_STOPPED else spec.task_count
        out |= {f"{spec.name}-{t}" for t in range(tasks)}
    return out


def _is_task(resource: str) -> bool:
    head, _, tail = resource.rpartition("-")
    return bool(head) and tail.isdigit()


def check_balanced(shares: Mapping[str, set[str]]) -> list[str]:
    """(c): connectors and, separately, tasks spread within one over the members."""
    if not shares:
        return []
    connectors = {m: sum(1 for r in s if not _is_task(r)) for m, s in shares.items()}
    tasks = {m: sum(1 for r in s if _is_task(r)) for m, s in shares.items()}
    problems = []
    for kind, counts in (("connectors", connectors), ("tasks", tasks)):
        if max(counts.values()) - min(counts.values()) > 1:
            problems.append(f"{kind} not balanced within one: {dict(sorted(counts.items()))}")
    return problems


def render(group: Any) -> str:
    lines = [
        f"group {group.group_id} state {group.state} group epoch {group.group_epoch} "
        f"assignment epoch {group.assignment_epoch} assignor member {group.assignor_member_id!r}"
        + (
            f" delayed rebalance at {group.scheduled_rebalance_at_ms}"
            f" (now {group.coordinator_time_ms})"
            if group.HasField("scheduled_rebalance_at_ms")
            else ""
        )
    ]
    for m in sorted(group.members, key=lambda m: m.member_id):
        lines.append(
            f"  {m.member_id} epoch {m.member_epoch} {m.state} "
            f"current {sorted(names(from_cat(m.current_assignment)))} "
            f"pending {sorted(names(from_cat(m.pending_revocation)))} "
            f"target {sorted(names(from_cat(m.target_assignment)))}"
        )
    return "\n".join(lines)


# --- the fleet ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quiet:
    """What `Fleet.wait_quiet` saw once the group was quiet."""

    group: Any  # DescribedGroup
    assigned: dict[str, set[str]]  # member id -> current assignment
    at: float  # time.time() when it was seen

    @property
    def delay_pending(self) -> bool:
        return bool(self.group.HasField("scheduled_rebalance_at_ms"))

    @property
    def unassigned(self) -> set[str]:
        held: set[str] = set()
        for s in self.assigned.values():
            held |= s
        return catalogue_resources(self.group) - held


class Fleet:
    """A group on one coordinator, its agents, and the checks the end-to-end tests make."""

    def __init__(
        self, coordinator: str, group: str, workdir: Path, coordinator_log: Path | None = None
    ) -> None:
        self.coordinator = coordinator
        self.group = group
        self.workdir = workdir
        self.coordinator_log = coordinator_log
        self.stubs = Stubs(coordinator)
        self.agents: dict[str, AgentProcess] = {}

    def close(self) -> None:
        for agent in self.agents.values():
            with contextlib.suppress(Exception):
                agent.close()
        self.stubs.close()

    # --- agents ----------------------------------------------------------------------------

    def agent(self, member_id: str, coordinator: str | None = None, **kw: Any) -> AgentProcess:
        """Create (not start) an agent; `coordinator` defaults to the fleet's."""
        assert member_id not in self.agents, member_id
        agent = AgentProcess(
            member_id, coordinator or self.coordinator, self.group, self.workdir / "agents", **kw
        )
        self.agents[member_id] = agent
        return agent

    def start(self, *member_ids: str, **kw: Any) -> list[AgentProcess]:
        """Create (if new) and start agents, all at once."""
        out = []
        for m in member_ids:
            agent = self.agents.get(m) or self.agent(m, **kw)
            out.append(agent.start())
        return out

    def live(self) -> set[str]:
        return {m for m, a in self.agents.items() if a.alive}

    # --- admin -----------------------------------------------------------------------------

    def put_connector(self, name: str, tasks: int, config: Mapping[str, str] | None = None) -> Any:
        resp = self.stubs.admin.PutConnector(
            admin_pb2.PutConnectorRequest(
                group_id=self.group, connector=name, task_count=tasks, config=config or {}
            ),
            timeout=10,
        )
        assert resp.error_code == 0, resp
        return resp

    def delete_connector(self, name: str) -> Any:
        resp = self.stubs.admin.DeleteConnector(
            admin_pb2.DeleteConnectorRequest(group_id=self.group, connector=name), timeout=10
        )
        assert resp.error_code == 0, resp
        return resp

    def alter_configs(self, configs: Mapping[str, int | str]) -> Any:
        resp = self.stubs.admin.AlterGroupConfigs(
            admin_pb2.AlterGroupConfigsRequest(
                group_id=self.group, set={k: str(v) for k, v in configs.items()}
            ),
            timeout=10,
        )
        assert resp.error_code == 0, resp
        return resp

    def coordinator_events(self, event: str, member: str | None = None) -> list[dict[str, Any]]:
        """The coordinator's JSON log lines of this group with this `event` (and `member`)."""
        assert self.coordinator_log is not None, "the fleet was not given the coordinator's log"
        out = []
        for line in self.coordinator_log.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") != event or entry.get("group") != self.group:
                continue
            if member is None or entry.get("member") == member:
                out.append(entry)
        return out

    def describe(self) -> Any:
        group = describe(self.stubs, self.group)
        assert group.error_code == 0, group
        return group

    def try_describe(self) -> Any | None:
        try:
            group = describe(self.stubs, self.group)
        except grpc.RpcError:
            return None
        return group if group.error_code == 0 else None

    # --- records -----------------------------------------------------------------------------

    def intervals(self) -> list[Interval]:
        ivs, problems = intervals(self.agents.values())
        assert not problems, "inconsistent hook records:\n" + "\n".join(problems)
        return ivs

    def running(self) -> dict[str, set[str]]:
        """member id -> what its live incarnation runs now, by the hook records."""
        ivs, _ = intervals(self.agents.values())
        by_runner = running_now(ivs)
        out: dict[str, set[str]] = {}
        for m, agent in self.agents.items():
            if agent.incarnations:
                out[m] = by_runner.get(agent.current.label, set())
        return out

    def records(self, member_id: str, after: float = 0.0) -> list[HookRecord]:
        return [r for r in self.agents[member_id].records() if r.t_start >= after]

    def diagnostics(self) -> str:
        group = self.try_describe()
        parts = [render(group) if group is not None else "(describe failed)"]
        parts.append(f"running by the hook records: {self._sorted(self.running())}")
        for agent in self.agents.values():
            parts.append(agent.log_tail(25))
        return "\n".join(parts)

    @staticmethod
    def _sorted(d: Mapping[str, set[str]]) -> dict[str, list[str]]:
        return {k: sorted(v) for k, v in sorted(d.items())}

    # --- waiting ---------------------------------------------------------------------------

    def wait_quiet(
        self,
        members: Iterable[str] | None = None,
        delay: bool | None = False,
        timeout_s: float = 20.0,
        check: bool = True,
    ) -> Quiet:
        """Wait until the group is STABLE with exactly `members` (default: the live agents),
        every member at the assignment epoch = the group epoch, nothing pending revocation,
        every member's current assignment its target, `delay` (False: no delayed rebalance
        pending, True: one pending, None: either), and every live agent's hook records showing
        it runs exactly its current assignment. Then check (a), (b) and, without a pending
        delay, (c)."""
        expected = set(members) if members is not None else self.live()

        def probe() -> Quiet | None:
            group = self.try_describe()
            if group is None or group.state != "STABLE":
                return None
            if group.group_epoch != group.assignment_epoch:
                return None
            if {m.member_id for m in group.members} != expected:
                return None
            if delay is not None and group.HasField("scheduled_rebalance_at_ms") != delay:
                return None
            for m in group.members:
                if m.member_epoch != group.assignment_epoch or m.state != "STABLE":
                    return None
                if m.pending_revocation.connectors or m.pending_revocation.tasks:
                    return None
            current = member_sets(group)
            if current != member_sets(group, "target_assignment"):
                return None
            running = self.running()
            if any(running.get(m, set()) != current[m] for m in expected):
                return None
            return Quiet(group, current, time.time())

        quiet = wait_for(
            f"group {self.group} quiet with members {sorted(expected)} (delay={delay})",
            probe,
            timeout_s=timeout_s,
            diagnostics=self.diagnostics,
        )
        if check:
            self.check(quiet)
        return quiet

    def check(self, quiet: Quiet) -> None:
        """(a) no overlap ever; (b) every catalogue resource on exactly one live worker, unless
        held back by a pending delay, matching DescribeGroups; (c) balance without a delay."""
        ivs = self.intervals()
        problems = check_no_overlap(ivs)
        live_labels = {a.current.label: m for m, a in self.agents.items() if a.alive}
        runs = running_now(ivs)
        owners: dict[str, list[str]] = {}
        for runner, resources in runs.items():
            if runner not in live_labels:
                problems.append(f"{runner} is not alive but still runs {sorted(resources)}")
            for r in resources:
                owners.setdefault(r, []).append(runner)
        catalogue = catalogue_resources(quiet.group)
        for r, who in sorted(owners.items()):
            if len(who) > 1:
                problems.append(f"{r} runs on {sorted(who)}")
            if r not in catalogue:
                problems.append(f"{r} runs on {who} but is not in the catalogue")
        missing = catalogue - set(owners)
        if quiet.delay_pending:
            if missing != quiet.unassigned:
                problems.append(
                    f"during the delay, not running {sorted(missing)} but unassigned "
                    f"{sorted(quiet.unassigned)}"
                )
        elif missing:
            problems.append(f"catalogue resources running nowhere: {sorted(missing)}")
        by_member = {live_labels[k]: v for k, v in runs.items() if k in live_labels}
        for m, assigned in quiet.assigned.items():
            if by_member.get(m, set()) != assigned:
                problems.append(
                    f"{m} runs {sorted(by_member.get(m, set()))} but DescribeGroups says "
                    f"{sorted(assigned)}"
                )
        if not quiet.delay_pending:
            problems += check_balanced(quiet.assigned)
        assert not problems, (
            "invariant violated:\n" + "\n".join(problems) + "\n" + render(quiet.group)
        )

    def check_no_overlap(self) -> None:
        problems = check_no_overlap(self.intervals())
        assert not problems, "\n".join(problems) + "\n" + self.diagnostics()
