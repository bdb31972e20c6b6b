#!/usr/bin/env python3
"""Mixed-client rolling restart (issue 31): one group of Python agents, Node workers and Go
workers, every one of them a real process whose work is the same recording exec hook
(`tests/clients/exec_hook.py`, DESIGN 2.3), restarted one after the other; and, in the same run
and on the same coordinator, the same rolling restart of a group of Python agents only, the
figure the mixed group must equal. Run it through ./bench/run-mixed (bench/README.md, "Mixed
clients").

For each group: PutConnector of CONNECTORS x TASKS, the workers started, the group waited for
until quiet (DescribeGroups: STABLE, group epoch = assignment epoch, nothing pending revocation,
no delayed rebalance, the expected members, each member running by its hook records exactly its
current assignment, the catalogue covered). Then each worker in turn gets SIGTERM (it stops what
it runs, its hook says so, and it leaves the group), is started again at once under the same
member id, and the group is waited for until quiet before the next one.

Figures per group: task and connector stops per restart (the hook's `revoked` records in the
window from the first SIGTERM to the last quiet, divided by the restarts), of which stops by
workers that were not restarted, the time to quiet per restart (median, max), and the check over
the whole run: no resource was run by two workers at any instant, where a worker runs a resource
from the `t_start` of the `assigned` record that names it to the `t_end` of the `revoked` record
that names it. Exit 1 if a group never gets quiet or a resource was on two workers.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "generated"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import grpc  # noqa: E402
from connect.group.v1 import admin_pb2, admin_pb2_grpc  # noqa: E402

from tests.support.coordinator import CoordinatorProcess  # noqa: E402

HOOK = REPO / "tests" / "clients" / "exec_hook.py"
NODE_WORKER = REPO / "clients" / "node" / "worker.js"
GO_BUILD = REPO / "clients" / "go" / "build"
RESULTS = REPO / "bench" / "results"
KINDS = ("python", "node", "go")

Resource = tuple[str] | tuple[str, int]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Worker:
    """One worker process of `kind`, its work recorded by the exec hook into `records`."""

    kind: str
    member_id: str
    command: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}"}
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO
            )

    def terminate(self, timeout_s: float) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(
                f"{self.kind} worker {self.member_id} did not exit within {timeout_s:g} s of "
                f"SIGTERM (log: {self.log_path})"
            ) from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class GroupRun:
    label: str
    group: str
    workers: list[Worker]
    records: Path
    stops: int = 0
    stops_by_others: int = 0
    restart_s: list[float] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    error: str = ""


def resources_of(record: dict[str, Any]) -> set[Resource]:
    out: set[Resource] = {(c,) for c in record["connectors"]}
    out |= {(t["connector"], int(t["task"])) for t in record["tasks"]}
    return out


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def running_by_worker(records: Iterable[dict[str, Any]]) -> dict[str, set[Resource]]:
    """What each worker runs now, by its hook records in order of their end."""
    out: dict[str, set[Resource]] = {}
    for r in sorted(records, key=lambda r: r["t_end"]):
        held = out.setdefault(r["worker"], set())
        if r["event"] == "assigned":
            held |= resources_of(r)
        elif r["event"] == "revoked":
            held -= resources_of(r)
    return out


def overlaps(records: list[dict[str, Any]], end: float) -> list[str]:
    """Every pair of intervals in which two workers ran one resource at the same instant."""
    open_at: dict[tuple[str, Resource], float] = {}
    intervals: dict[Resource, list[tuple[float, float, str]]] = {}
    for r in sorted(records, key=lambda r: r["t_start"]):
        for res in resources_of(r):
            key = (r["worker"], res)
            if r["event"] == "assigned" and key not in open_at:
                open_at[key] = r["t_start"]
            elif r["event"] == "revoked" and key in open_at:
                intervals.setdefault(res, []).append((open_at.pop(key), r["t_end"], r["worker"]))
    for (worker, res), since in open_at.items():
        intervals.setdefault(res, []).append((since, end, worker))
    found = []
    for res, spans in intervals.items():
        spans.sort()
        latest = spans[0]  # of the spans so far, the one that ends last
        for span in spans[1:]:
            if span[0] < latest[1] and span[2] != latest[2]:
                found.append(
                    f"{res}: {latest[2]} [{latest[0]:.3f}, {latest[1]:.3f}] and "
                    f"{span[2]} [{span[0]:.3f}, {span[1]:.3f}]"
                )
            if span[1] > latest[1]:
                latest = span
    return found


class Bench:
    def __init__(self, args: argparse.Namespace, stack: ExitStack) -> None:
        self.args = args
        self.stack = stack
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-mixed-"))
        stack.callback(shutil.rmtree, self.tmp, True)
        self.catalogue = {f"c{i:02d}": args.tasks for i in range(args.connectors)}
        self.keys: set[Resource] = {(c,) for c in self.catalogue}
        self.keys |= {(c, t) for c, n in self.catalogue.items() for t in range(n)}
        self.go_binary = ""
        self.node = shutil.which("node") or ""

    # --- set-up ---

    def start_coordinator(self) -> None:
        a = self.args
        from tests.support.pgcluster import ThrowawayCluster, create_database

        log("starting a throwaway PostgreSQL")
        cluster = ThrowawayCluster()
        cluster.start()
        self.stack.callback(cluster.stop)
        db_url = create_database(cluster.url, "mixed")
        RESULTS.mkdir(parents=True, exist_ok=True)
        coordinator_log = RESULTS / "mixed-coordinator.log"
        coordinator_log.unlink(missing_ok=True)
        self.coordinator = CoordinatorProcess(
            db_url,
            "--session-timeout-ms",
            str(a.session_timeout_ms),
            "--heartbeat-interval-ms",
            str(a.heartbeat_interval_ms),
            "--rebalance-timeout-ms",
            str(a.rebalance_timeout_ms),
            "--scheduled-rebalance-max-delay-ms",
            str(a.scheduled_rebalance_max_delay_ms),
            log_path=coordinator_log,
        )
        self.coordinator.start()
        self.stack.callback(self.coordinator.close)
        self.stack.callback(self._stop_coordinator)
        self.channel = grpc.insecure_channel(self.coordinator.address)
        self.stack.callback(self.channel.close)
        self.admin = admin_pb2_grpc.ConnectGroupAdminStub(self.channel)
        log(f"coordinator on {self.coordinator.address}")

    def _stop_coordinator(self) -> None:
        proc = self.coordinator.proc
        if proc is not None and proc.poll() is None:
            self.coordinator.terminate(20)

    def prepare_clients(self, kinds: set[str]) -> None:
        if "go" in kinds:
            built = subprocess.run([str(GO_BUILD)], capture_output=True, text=True, check=False)
            if built.returncode != 0:
                raise SystemExit(f"clients/go/build failed:\n{built.stdout}{built.stderr}")
            self.go_binary = built.stdout.strip().splitlines()[-1]
        if "node" in kinds:
            if not self.node:
                raise SystemExit("node is not installed (the Node worker needs it)")
            if not (NODE_WORKER.parent / "node_modules").is_dir():
                log("npm ci in clients/node")
                subprocess.run(
                    ["npm", "ci", "--no-audit", "--no-fund"],
                    cwd=NODE_WORKER.parent,
                    check=True,
                    capture_output=True,
                )

    def worker(self, kind: str, member_id: str, group: str, records: Path) -> Worker:
        a = self.args
        hook = f"{shlex.quote(sys.executable)} -S {shlex.quote(str(HOOK))} "
        hook += shlex.quote(str(records))
        common = [
            "--coordinator",
            self.coordinator.address,
            "--group",
            group,
            "--member-id",
            member_id,
            "--rebalance-timeout-ms",
            str(a.rebalance_timeout_ms),
            "--exec-hook",
            hook,
        ]
        if kind == "python":
            command = [
                sys.executable,
                "-m",
                "worker_agent.cli",
                "run",
                *common,
                "--log-format",
                "text",
            ]
        elif kind == "node":
            command = [self.node, str(NODE_WORKER), *common]
        else:
            command = [self.go_binary, *common]
        return Worker(kind, member_id, command, self.tmp / f"{group}-{member_id}.log")

    def put_catalogue(self, group: str) -> None:
        for name, tasks in sorted(self.catalogue.items()):
            resp = self.admin.PutConnector(
                admin_pb2.PutConnectorRequest(group_id=group, connector=name, task_count=tasks),
                timeout=10,
            )
            if resp.error_code != 0:
                raise RuntimeError(f"PutConnector {name}: {resp.error_code} {resp.error_message}")

    # --- observation ---

    def not_quiet(self, run: GroupRun) -> str:
        try:
            g = self.admin.DescribeGroups(
                admin_pb2.DescribeGroupsRequest(group_ids=[run.group]), timeout=5
            ).groups[0]
        except grpc.RpcError as error:
            return f"DescribeGroups failed: {error.code()}"
        if g.error_code != 0:
            return f"DescribeGroups: {g.error_code} {g.error_message}"
        if g.state != "STABLE" or g.group_epoch != g.assignment_epoch:
            return f"group {g.state}, epochs {g.group_epoch}/{g.assignment_epoch}"
        if g.HasField("scheduled_rebalance_at_ms"):
            return "a delayed rebalance is scheduled"
        members = {m.member_id: m for m in g.members}
        expected = {w.member_id for w in run.workers}
        if set(members) != expected:
            return f"members {sorted(members)} != {sorted(expected)}"
        running = running_by_worker(read_records(run.records))
        covered: set[Resource] = set()
        for member_id, m in members.items():
            if m.pending_revocation.connectors or m.pending_revocation.tasks:
                return f"{member_id} has revocations pending"
            current: set[Resource] = {(c,) for c in m.current_assignment.connectors}
            current |= {(t.connector, int(t.task)) for t in m.current_assignment.tasks}
            if running.get(member_id, set()) != current:
                return f"{member_id} runs {len(running.get(member_id, ()))}, holds {len(current)}"
            covered |= current
        if covered != self.keys:
            return f"{len(self.keys - covered)} resources run by no one"
        return ""

    def wait_quiet(self, run: GroupRun, what: str) -> float:
        start = time.monotonic()
        deadline = start + self.args.quiet_timeout_s
        reason = ""
        while time.monotonic() < deadline:
            reason = self.not_quiet(run)
            if not reason:
                return time.monotonic() - start
            for w in run.workers:
                if w.proc is not None and w.proc.poll() is not None:
                    raise RuntimeError(
                        f"{w.kind} worker {w.member_id} exited ({w.proc.returncode}) while "
                        f"waiting for {what}; log: {w.log_path}"
                    )
            time.sleep(0.05)
        raise RuntimeError(
            f"{run.label}: not quiet {self.args.quiet_timeout_s:g} s after {what}: {reason}"
        )

    # --- the scenario ---

    def footprint(self, kind: str) -> tuple[int, float]:
        """One worker of `kind` alone in a group of RSS_TASKS tasks (its hook `true`): its
        resident set (KiB, /proc) once it runs them all, and the seconds that took."""
        a = self.args
        group = f"rss-{kind}-{int(time.time() * 1000)}"
        connectors = max(1, a.rss_tasks // 100)
        for i in range(connectors):
            resp = self.admin.PutConnector(
                admin_pb2.PutConnectorRequest(
                    group_id=group, connector=f"r{i:03d}", task_count=a.rss_tasks // connectors
                ),
                timeout=10,
            )
            if resp.error_code != 0:
                raise RuntimeError(f"PutConnector: {resp.error_code} {resp.error_message}")
        w = self.worker(kind, f"{kind}-rss", group, self.tmp / "unused.jsonl")
        w.command[w.command.index("--exec-hook") + 1] = "true"
        start = time.monotonic()
        w.start()
        self.stack.callback(w.kill)
        want = connectors + connectors * (a.rss_tasks // connectors)
        deadline = start + a.quiet_timeout_s
        while True:
            g = self.admin.DescribeGroups(
                admin_pb2.DescribeGroupsRequest(group_ids=[group]), timeout=5
            ).groups[0]
            held = [
                len(m.current_assignment.connectors) + len(m.current_assignment.tasks)
                for m in g.members
            ]
            log_text = w.log_path.read_text(errors="replace") if w.log_path.exists() else ""
            if g.state == "STABLE" and held == [want] and _all_started(kind, log_text, want):
                break
            if time.monotonic() > deadline or (w.proc is not None and w.proc.poll() is not None):
                w.kill()
                raise RuntimeError(f"{kind}: did not come to run {want} resources ({held})")
            time.sleep(0.2)
        took = time.monotonic() - start
        time.sleep(1.0)
        assert w.proc is not None
        rss = _rss_kib(w.proc.pid)
        w.terminate(30)
        return rss, took

    def run_group(self, label: str, kinds: list[str]) -> GroupRun:
        group = f"mixed-{label}-{int(time.time() * 1000)}"
        records = self.tmp / f"{group}.jsonl"
        run = GroupRun(label, group, [], records)
        seen: dict[str, int] = {}
        for kind in kinds:
            seen[kind] = seen.get(kind, -1) + 1
            run.workers.append(self.worker(kind, f"{kind}-{seen[kind]}", group, records))
        self.put_catalogue(group)
        for w in run.workers:
            w.start()
            self.stack.callback(w.kill)
        try:
            formed = self.wait_quiet(run, "forming")
            log(f"{label}: {len(kinds)} workers formed, quiet after {formed:.1f} s")
            window_start = time.time()
            leaving: list[tuple[str, float, float]] = []  # (worker, SIGTERM, exit)
            for w in run.workers:
                sent = time.time()
                code = w.terminate(self.args.rebalance_timeout_ms / 1000 + 10)
                leaving.append((w.member_id, sent, time.time()))
                if code != 0:
                    raise RuntimeError(f"{w.kind} {w.member_id} exited {code} on SIGTERM")
                w.start()
                run.restart_s.append(self.wait_quiet(run, f"restarting {w.member_id}"))
                log(
                    f"{label}: restarted {w.member_id} ({w.kind}), quiet after "
                    f"{run.restart_s[-1]:.2f} s"
                )
            recs = read_records(records)
            window = [r for r in recs if r["event"] == "revoked" and r["t_start"] >= window_start]
            run.stops = sum(len(resources_of(r)) for r in window)
            # A restarted worker's own stops are those between its SIGTERM and its exit; the
            # rest are stops of workers that were not restarting (work handed back to it).
            run.stops_by_others = sum(
                len(resources_of(r))
                for r in window
                if not any(
                    r["worker"] == who and sent <= r["t_start"] <= left
                    for who, sent, left in leaving
                )
            )
        except RuntimeError as error:
            run.error = str(error)
        finally:
            for w in run.workers:
                if w.proc is not None and w.proc.poll() is None:
                    try:
                        w.terminate(20)
                    except RuntimeError as error:
                        run.error = run.error or str(error)
        run.overlaps = overlaps(read_records(records), time.time())
        return run


def _rss_kib(pid: int) -> int:
    """VmRSS of `pid` and its children (the Python agent's hooks are done by then)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def _all_started(kind: str, log_text: str, want: int) -> bool:
    """Whether the worker's own log says it runs `want` resources: the Go and Node workers print
    a JSON `start` / `stop` line naming what they started or stopped; the agent logs the
    assignment it then starts in one hook call (`true`, done at once)."""
    if kind == "python":
        return "assignment at epoch" in log_text
    running: set[Resource] = set()
    for line in log_text.splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("event") == "start":
            running |= resources_of(entry)
        elif entry.get("event") == "stop":
            running -= resources_of(entry)
    return len(running) >= want


def table(runs: list[GroupRun], restarts: int) -> str:
    rows = [("figure", *[r.label for r in runs])]

    def per(r: GroupRun, n: int) -> str:
        return f"{n / restarts:.1f}" if not r.error else "-"

    rows.append(("workers", *[", ".join(sorted({w.kind for w in r.workers})) for r in runs]))
    rows.append(("stops per restart", *[per(r, r.stops) for r in runs]))
    rows.append(
        ("  of which by workers not restarting", *[per(r, r.stops_by_others) for r in runs])
    )
    rows.append(
        (
            "time to quiet per restart, median / max s",
            *[
                f"{statistics.median(r.restart_s):.2f} / {max(r.restart_s):.2f}"
                if r.restart_s
                else "-"
                for r in runs
            ],
        )
    )
    rows.append(("resources on two workers at once", *[str(len(r.overlaps)) for r in runs]))
    rows.append(("error", *[r.error[:60] or "none" for r in runs]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(" | ".join(c.ljust(widths[i]) for i, c in enumerate(row)) for row in rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--python", type=int, default=2, help="Python agents in the mixed group")
    p.add_argument("--node", type=int, default=2, help="Node workers in the mixed group")
    p.add_argument("--go", type=int, default=2, help="Go workers in the mixed group")
    p.add_argument("--connectors", type=int, default=6)
    p.add_argument("--tasks", type=int, default=8, help="tasks per connector")
    p.add_argument("--session-timeout-ms", type=int, default=6000)
    p.add_argument("--heartbeat-interval-ms", type=int, default=500)
    p.add_argument("--rebalance-timeout-ms", type=int, default=10000)
    p.add_argument("--scheduled-rebalance-max-delay-ms", type=int, default=5000)
    p.add_argument("--quiet-timeout-s", type=float, default=60.0)
    p.add_argument(
        "--rss-tasks",
        type=int,
        default=1000,
        help="then one worker of each kind alone with this many tasks: its RSS (0: skip)",
    )
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the Python-only group (the figure the mixed group must equal)",
    )
    a = p.parse_args()
    counts = {"python": a.python, "node": a.node, "go": a.go}
    # Round robin over the kinds, so that the restart order alternates between clients.
    mixed = [k for i in range(max(counts.values())) for k in KINDS if i < counts[k]]
    if not mixed:
        p.error("no workers")
    with ExitStack() as stack:
        bench = Bench(a, stack)
        bench.start_coordinator()
        bench.prepare_clients(set(mixed))
        runs = []
        if not a.no_baseline:
            runs.append(bench.run_group("python-only", ["python"] * len(mixed)))
        runs.append(bench.run_group("mixed", mixed))
        footprints = {}
        if a.rss_tasks > 0:
            for kind in KINDS:
                if counts[kind] or kind == "python":
                    footprints[kind] = bench.footprint(kind)
        print()
        print(
            f"rolling restart of {len(mixed)} workers, {a.connectors} connectors x {a.tasks} "
            f"tasks ({len(bench.keys)} resources); session {a.session_timeout_ms} ms, "
            f"heartbeat {a.heartbeat_interval_ms} ms, scheduled delay "
            f"{a.scheduled_rebalance_max_delay_ms} ms"
        )
        print(table(runs, len(mixed)))
        for r in runs:
            for o in r.overlaps[:10]:
                print(f"OVERLAP {r.label}: {o}")
            if r.error:
                print(f"ERROR {r.label}: {r.error}")
        if footprints:
            print(f"\none worker alone running {a.rss_tasks:,} tasks (exec hook `true`):")
            for kind, (rss, took) in footprints.items():
                binary = (
                    f", binary {Path(bench.go_binary).stat().st_size / 1e6:.1f} MB"
                    if (kind == "go")
                    else ""
                )
                print(
                    f"  {kind:6s} RSS {rss / 1024:.1f} MiB, all started after {took:.1f} s{binary}"
                )
        out = RESULTS / "mixed-clients-latest.json"
        out.write_text(
            json.dumps(
                [
                    {
                        "label": r.label,
                        "kinds": [w.kind for w in r.workers],
                        "stops": r.stops,
                        "restarts": len(mixed),
                        "restart_s": r.restart_s,
                        "overlaps": r.overlaps,
                        "error": r.error,
                    }
                    for r in runs
                ],
                indent=1,
            )
        )
        ok = all(not r.error and not r.overlaps for r in runs)
        print(f"\nRESULT {'OK' if ok else 'FAILED'} (results: {out})")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
