"""`python -m examples.demo`: a one-minute tour of the product on the embedded default.

It starts a coordinator on an embedded SQLite file and three `worker-agent run` processes, creates
a few connectors, then, while a live table shows which worker runs what, adds a worker, kills one
(its work is held back for the scheduled-rebalance delay while the rest keep running), brings it
back (it gets its own work back at once), and adds a connector (placed without moving anything
else). Every step is real: separate processes talking gRPC, state in the database.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
from connect.group.v1 import admin_pb2, admin_pb2_grpc

from connect_protocol.limits import channel_options

GROUP = "demo"
CONNECTORS = (("orders-sink", 4), ("clicks-source", 3), ("audit-log", 2))
LATE_CONNECTOR = ("payments-sink", 3)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Demo:
    def __init__(self, workdir: Path, delay_ms: int, pace_s: float, live: bool) -> None:
        self.workdir = workdir
        self.delay_ms = delay_ms
        self.pace_s = pace_s
        self.live = live
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.channel = grpc.insecure_channel(self.address, options=channel_options())
        self.admin = admin_pb2_grpc.ConnectGroupAdminStub(self.channel)
        self.step = ""
        self.history: list[str] = []

    # --- processes ---------------------------------------------------------------------------

    def _spawn(self, args: Sequence[str], log_name: str) -> subprocess.Popen[bytes]:
        log = open(self.workdir / log_name, "ab")  # noqa: SIM115 - the child keeps it
        return subprocess.Popen(
            [sys.executable, "-m", *args], stdout=log, stderr=log, start_new_session=True
        )

    def start_coordinator(self) -> None:
        self.coordinator = self._spawn(
            [
                "coordinator_svc.cli",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--database-url",
                f"sqlite:///{self.workdir / 'coordinator.db'}",
                "--session-timeout-ms",
                "3000",
                "--heartbeat-interval-ms",
                "300",
                "--scheduled-rebalance-max-delay-ms",
                str(self.delay_ms),
            ],
            "coordinator.log",
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(grpc.RpcError):
                self.admin.ListGroups(admin_pb2.ListGroupsRequest(), timeout=1)
                return
            if self.coordinator.poll() is not None:
                break
            time.sleep(0.1)
        raise SystemExit(f"the coordinator did not start; see {self.workdir / 'coordinator.log'}")

    def start_agent(self, member_id: str) -> None:
        self.agents[member_id] = self._spawn(
            [
                "worker_agent.cli",
                "run",
                "--coordinator",
                self.address,
                "--group",
                GROUP,
                "--member-id",
                member_id,
                "--rebalance-timeout-ms",
                "10000",
            ],
            f"{member_id}.log",
        )

    def kill_agent(self, member_id: str) -> None:
        proc = self.agents.pop(member_id)
        proc.kill()
        proc.wait()

    def close(self) -> None:
        for proc in self.agents.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in self.agents.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.agents.clear()
        if self.coordinator is not None and self.coordinator.poll() is None:
            self.coordinator.send_signal(signal.SIGTERM)
            try:
                self.coordinator.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.coordinator.kill()
        self.channel.close()

    # --- admin -------------------------------------------------------------------------------

    def put_connector(self, name: str, tasks: int) -> None:
        resp = self.admin.PutConnector(
            admin_pb2.PutConnectorRequest(group_id=GROUP, connector=name, task_count=tasks),
            timeout=5,
        )
        if resp.error_code != 0:
            raise SystemExit(f"PutConnector {name}: {resp.error_message}")

    def describe(self) -> Any:
        with contextlib.suppress(grpc.RpcError):
            resp = self.admin.DescribeGroups(
                admin_pb2.DescribeGroupsRequest(group_ids=[GROUP]), timeout=2
            )
            return resp.groups[0]
        return None

    # --- the table ---------------------------------------------------------------------------

    def render(self, group: Any) -> str:
        lines = [f"step: {self.step}", ""]
        if group is None or group.error_code != 0:
            lines.append("(waiting for the group)")
            return "\n".join(lines)
        delay = ""
        if group.HasField("scheduled_rebalance_at_ms"):
            left = max(0, group.scheduled_rebalance_at_ms - group.coordinator_time_ms) / 1000
            delay = f"   held-back work is reassigned in {left:.1f}s unless its worker returns"
        lines.append(f"group {GROUP}: {group.state}, epoch {group.group_epoch}{delay}")
        lines.append(f"{'WORKER':8} {'EPOCH':>5}  {'STATE':10} {'#':>2}  RUNS")
        running: set[str] = set()
        for m in sorted(group.members, key=lambda m: m.member_id):
            names = list(m.current_assignment.connectors) + [
                f"{t.connector}-{t.task}" for t in m.current_assignment.tasks
            ]
            running.update(names)
            lines.append(
                f"{m.member_id:8} {m.member_epoch:>5}  {m.state:10} {len(names):>2}  "
                + ", ".join(sorted(names))
            )
        everything = {c.name for c in group.catalogue} | {
            f"{c.name}-{t}" for c in group.catalogue for t in range(c.task_count)
        }
        idle = sorted(everything - running)
        lines.append(f"{'(nobody)':8} {'':>5}  {'':10} {len(idle):>2}  " + ", ".join(idle))
        return "\n".join(lines)

    def show_for(self, seconds: float, until: Callable[[Any], bool] | None = None) -> None:
        """Redraw the table for `seconds` (or until `until(group)` holds, then a little more)."""
        end = time.monotonic() + seconds
        last = ""
        while time.monotonic() < end:
            group = self.describe()
            text = self.render(group)
            if self.live:
                sys.stdout.write("\x1b[H\x1b[2J" + "\n".join(self.history[-8:]) + "\n\n" + text)
                sys.stdout.write("\n")
                sys.stdout.flush()
            last = text
            if until is not None and group is not None and group.error_code == 0 and until(group):
                end = min(end, time.monotonic() + 0.5)
                until = None
            time.sleep(0.3)
        if not self.live:
            print(last + "\n", flush=True)

    def announce(self, text: str) -> None:
        self.step = text
        self.history.append(f"[{time.strftime('%H:%M:%S')}] {text}")
        if not self.live:
            print(f"== {text}", flush=True)


def _gone(member_id: str) -> Callable[[Any], bool]:
    return lambda group: all(m.member_id != member_id for m in group.members)


def _quiet(group: Any) -> bool:
    return (
        group.state == "STABLE"
        and not group.HasField("scheduled_rebalance_at_ms")
        and all(m.state == "STABLE" for m in group.members)
    )


def _quiet_with(member_id: str) -> Callable[[Any], bool]:
    return lambda group: _quiet(group) and any(m.member_id == member_id for m in group.members)


def run_demo(demo: Demo) -> None:
    p = demo.pace_s
    demo.announce("starting the coordinator (embedded SQLite) and creating connectors")
    demo.start_coordinator()
    for name, tasks in CONNECTORS:
        demo.put_connector(name, tasks)
    demo.announce("three workers join: the first takes everything, then work spreads out")
    for member_id in ("worker-1", "worker-2", "worker-3"):
        demo.start_agent(member_id)
    demo.show_for(10 + p, _quiet_with("worker-3"))
    demo.announce("worker-4 joins: only what balance needs moves; nothing else stops")
    demo.start_agent("worker-4")
    demo.show_for(10 + p, _quiet_with("worker-4"))
    demo.announce(
        f"worker-2 is killed (SIGKILL): its work is held back up to {demo.delay_ms / 1000:.0f}s"
    )
    demo.kill_agent("worker-2")
    demo.show_for(10 + p, _gone("worker-2"))  # its session expires first (3 s)
    demo.show_for(p)
    demo.announce("worker-2 comes back within the delay: it gets exactly its own work back")
    demo.start_agent("worker-2")
    demo.show_for(10 + p, _quiet_with("worker-2"))
    demo.announce("worker-3 is killed and stays away: after the delay its work is spread out")
    demo.kill_agent("worker-3")
    demo.show_for(10 + p, _gone("worker-3"))
    demo.show_for(demo.delay_ms / 1000 + 3 * p, _quiet)
    name, tasks = LATE_CONNECTOR
    demo.announce(f"connector {name} ({tasks} tasks) is added: placed without moving the rest")
    demo.put_connector(name, tasks)
    demo.show_for(3 * p, _quiet)
    demo.announce("done: stopping the workers (they revoke, then leave) and the coordinator")
    demo.show_for(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.demo",
        description="A one-minute tour: a coordinator on an embedded SQLite file, worker "
        "agents joining, failing and returning, and a live table of who runs what.",
    )
    parser.add_argument(
        "--delay-ms",
        type=int,
        default=8_000,
        help="scheduled.rebalance.max.delay.ms (how long a lost worker's work waits for it)",
    )
    parser.add_argument(
        "--pace", type=float, default=1.5, help="seconds per beat (smaller = faster)"
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="print one table per step instead of a live screen (default when not a terminal)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    live = sys.stdout.isatty() and not args.plain and os.environ.get("TERM") != "dumb"
    with _workdir(args.keep) as workdir:
        demo = Demo(workdir, args.delay_ms, args.pace, live)
        try:
            run_demo(demo)
        except KeyboardInterrupt:
            print("\ninterrupted; stopping everything", flush=True)
        finally:
            demo.close()
        print(f"logs: {workdir}" if args.keep else "bye", flush=True)
    return 0


@contextlib.contextmanager
def _workdir(keep: bool) -> Iterator[Path]:
    if keep:
        yield Path(tempfile.mkdtemp(prefix="connect-demo-"))
        return
    with tempfile.TemporaryDirectory(prefix="connect-demo-") as path:
        yield Path(path)


if __name__ == "__main__":
    sys.exit(main())
