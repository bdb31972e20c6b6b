#!/usr/bin/env python3
"""The scale benchmark's driver (run it through ./bench/run-scale; see bench/README.md).

It starts a throwaway PostgreSQL with durable commits (fsync=on, synchronous_commit=on) and, per
stage, a fresh database, `coordinator-svc serve` on 127.0.0.1 and PROCS load processes
(bench/scale_loadgen.py: asyncio + grpc.aio, many simulated `sessioned` members each). Stages:

  main    one group: ceiling (grpc.health Check), catalogue (CONNECTORS x TASKS, 40-character
          names), then members join in segments up to each of 3 marks; at each mark: settle to
          all-STABLE, one more member joins (rebalance), a steady window, the message sizes.
          Phases form, rebalance, steady, messages.
  mid     (rebalance) one group of MID_MEMBERS x MID_CONNECTORS*MID_TASKS: form, settle, one join.
  groups  (groups) a) groups of 10 members up to 3 marks: RSS per group; b) idle groups (one
          connector, no member) up to 3 marks: RSS per group, idle database writes, ListGroups,
          and a restart of the coordinator (time to SERVING and to the first answered Describe).

Prints one table per phase (each figure with its baseline and aim) and a growth table (each figure
at the 3 sizes), and writes bench/results/scale-latest.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "generated"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import grpc  # noqa: E402
import psycopg  # noqa: E402
from connect.group.v1 import admin_pb2, admin_pb2_grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench.coordinator_bench import (  # noqa: E402
    Child,
    DbStats,
    Snapshot,
    db_delta,
    free_port,
    git_state,
)
from connect_protocol.safe_text import mask_url  # noqa: E402
from tests.support.pgcluster import (  # noqa: E402
    ThrowawayCluster,
    create_database,
    find_pg_bin_dir,
    libpq_url,
)

RESULTS = REPO / "bench" / "results"
COORDINATOR_LOG = RESULTS / "scale-coordinator.log"
MAX_BYTES = 64 * 1024 * 1024
PHASES = ("form", "rebalance", "steady", "groups", "messages")
PG_SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "autovacuum": "off",  # nothing but the coordinator writes in the measured windows
    "max_connections": "300",
}
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: The coordinator's own time per call (issue 24); older coordinators export only the heartbeat
#: series, under its older name.
RPC_HISTOGRAM = "coordinator_rpc_latency_seconds"
HEARTBEAT_HISTOGRAM = "coordinator_heartbeat_latency_seconds"
HEARTBEAT_RPC = "ConnectGroupHeartbeat"
#: The state tables an install and the members' heartbeats write (per-install writes).
MEMBER_TABLES = ("members", "target_assignments", "target_assignment_members")
#: The machine counts as saturated when it is this busy (share of all cores) over a window.
SATURATED = 0.9

PRESETS: dict[str, dict[str, Any]] = {
    "full": {
        "marks": "1000,5000,10000",
        "connectors": 1000,
        "tasks": 100,
        "mid_members": 1000,
        "mid_connectors": 500,
        "mid_tasks": 100,
        "join_window": 500,
        "steady_s": 30.0,
        "idle_s": 20.0,
        "groups_a": "100,500,1000",
        "groups_b": "10000,50000,100000",
        "put_budget_s": 240.0,
        "stable_deadline_s": 900.0,
        "ceiling_s": 5.0,
        "calibrate_s": 8.0,
    },
    "small": {
        "marks": "100,300,1000",
        "connectors": 100,
        "tasks": 50,
        "mid_members": 100,
        "mid_connectors": 50,
        "mid_tasks": 50,
        "join_window": 50,
        "steady_s": 5.0,
        "idle_s": 4.0,
        "groups_a": "10,30,100",
        "groups_b": "500,1500,3000",
        "put_budget_s": 60.0,
        "stable_deadline_s": 180.0,
        "ceiling_s": 3.0,
        "calibrate_s": 5.0,
    },
}


def log(msg: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pct(values: list[int], q: float) -> float:
    """Percentile of microsecond samples, in milliseconds (values sorted)."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))] / 1000.0


def proc_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def runs_note(runs: list[dict[str, Any]]) -> str:
    """How the assignor runs ended: installed, refused (a stale epoch: normal while the group
    changes; the member asks again), skipped, failed."""
    counts = {
        "installed": sum(1 for c in runs if c.get("installed")),
        "refused": sum(1 for c in runs if c.get("refused")),
        "skipped": sum(1 for c in runs if c.get("skipped")),
        "failed": sum(1 for c in runs if c.get("error")),
    }
    return ", ".join(f"{v} {k}" for k, v in counts.items() if v)


def marks_of(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def connector_name(i: int) -> str:
    """A 40-character connector name (as bench/scale_loadgen.py makes them)."""
    return f"scale-benchmark-connector-number-{i:07d}"


# --- the coordinator's own latency (its /metrics) ----------------------------------------------


@dataclass
class Scrape:
    """One read of the coordinator's time-per-call histograms: rpc -> {le: cumulative count},
    rpc -> sum of seconds."""

    buckets: dict[str, dict[float, float]]
    sums: dict[str, float]


def scrape(port: int | None) -> Scrape | None:
    """The coordinator's histograms of time per call (None: no metrics port, or no answer)."""
    if port is None:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    legacy: dict[float, float] = {}
    legacy_sum = 0.0
    for family in text_string_to_metric_families(text):
        if family.name not in (RPC_HISTOGRAM, HEARTBEAT_HISTOGRAM):
            continue
        for sample in family.samples:
            rpc = sample.labels.get("rpc", HEARTBEAT_RPC)
            if sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                if family.name == RPC_HISTOGRAM:
                    buckets.setdefault(rpc, {})[le] = sample.value
                else:
                    legacy[le] = sample.value
            elif sample.name.endswith("_sum"):
                if family.name == RPC_HISTOGRAM:
                    sums[rpc] = sample.value
                else:
                    legacy_sum = sample.value
    if HEARTBEAT_RPC not in buckets and legacy:  # a coordinator from before the `rpc` label
        buckets[HEARTBEAT_RPC], sums[HEARTBEAT_RPC] = legacy, legacy_sum
    return Scrape(buckets, sums)


def served(before: Scrape | None, after: Scrape | None, rpc: str) -> dict[str, float] | None:
    """Calls of `rpc` the coordinator answered between two scrapes: count, mean, p50 and p99 in
    milliseconds (quantiles interpolated in their bucket from the buckets' deltas, as
    Prometheus's histogram_quantile does); None without both scrapes or without a call."""
    if before is None or after is None or rpc not in after.buckets:
        return None
    was = before.buckets.get(rpc, {})
    delta = sorted((le, c - was.get(le, 0.0)) for le, c in after.buckets[rpc].items())
    count = delta[-1][1] if delta else 0.0
    if count <= 0:
        return None

    def quantile(q: float) -> float:
        rank = q * count
        low, below = 0.0, 0.0
        for le, cumulative in delta:
            if cumulative >= rank:
                if le == float("inf"):
                    return low * 1000  # past the last finite bucket: its bound
                if cumulative <= below:
                    return le * 1000
                return (low + (le - low) * (rank - below) / (cumulative - below)) * 1000
            low, below = le, cumulative
        return low * 1000

    total_s = after.sums.get(rpc, 0.0) - before.sums.get(rpc, 0.0)
    return {
        "count": count,
        "mean_ms": total_s / count * 1000,
        "p50_ms": quantile(0.5),
        "p99_ms": quantile(0.99),
    }


# --- CPU per process over a window (/proc) -----------------------------------------------------


def machine_cpu() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine since boot (/proc/stat; idle and iowait are
    not busy)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    total = sum(ticks[:8])
    return (total - idle) / CLK_TCK, total / CLK_TCK


def postgres_cpu(data_dir: Path) -> float:
    """CPU seconds of a PostgreSQL cluster: the postmaster with its reaped children (backends
    that exited) and its live children (backends, background processes)."""
    try:
        postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    seconds = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        if pid == postmaster:
            seconds += sum(int(x) for x in fields[11:15]) / CLK_TCK  # with reaped children
        elif int(fields[1]) == postmaster:
            seconds += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return seconds


class CpuMeter:
    """CPU seconds of the coordinator, PostgreSQL, each load process (with its assignor worker
    process), this driver and the whole machine between `start()` and `stop()`."""

    def __init__(self, st: Stage) -> None:
        self.st = st

    def read(self) -> dict[str, float]:
        st = self.st
        out = {
            "coordinator": proc_cpu(st.pid),
            "PostgreSQL": postgres_cpu(st.bench.cluster.data_dir),
        }
        for k, gen in enumerate(st.loadgens):
            pids = [gen.proc.pid, *st.worker_pids.get(k, [])]
            out[f"load process {k}"] = sum(proc_cpu(p) for p in pids)
        out["driver (this process)"] = proc_cpu(os.getpid())
        out["machine: busy"], out["machine: capacity"] = machine_cpu()
        return out

    def start(self) -> None:
        self.t0, self.before = time.monotonic(), self.read()

    def stop(self) -> dict[str, Any]:
        after, window = self.read(), time.monotonic() - self.t0
        seconds = {k: max(0.0, after[k] - self.before[k]) for k in after}
        capacity = seconds.pop("machine: capacity") or window * (os.cpu_count() or 1)
        busy = seconds.pop("machine: busy")
        listed = sum(seconds.values())
        seconds["other processes (not this benchmark's)"] = max(0.0, busy - listed)
        return {
            "window_s": window,
            "cores": capacity / max(window, 1e-9),
            "seconds": seconds,
            "machine_busy_s": busy,
            "machine_busy_share": busy / max(capacity, 1e-9),
            "load_processes_s": sum(v for k, v in seconds.items() if k.startswith("load process")),
        }


# --- database statistics --------------------------------------------------------------------------
#
# As bench/coordinator_bench.py does it (read its comment): PostgreSQL flushes a backend's
# counters late, so before a snapshot the benchmark database's idle backends are terminated (a
# backend flushes when it exits) and the counters are read after pg_stat_clear_snapshot() from a
# fresh connection. One difference: terminating a pooled connection the instant the coordinator's
# lease renewer checks it out fails the renewal, and the coordinator then drops its groups and
# answers COORDINATOR_NOT_AVAILABLE until its own lease lapses (seen at once with members
# heartbeating). So here the idle backends are terminated only inside a quiet gap of the renewer
# (no backend of the database active, the last activity 0.1-0.5 s ago; the renewer runs every
# lease/3 = 1.7 s), in one statement that checks `idle` and terminates together. If no such gap
# comes within 15 s (a renewer busy all the time), the counters are read without the flush and
# the snapshot is marked `unflushed` (its window is then blurred by up to 10 s at each end).


class QuietDbStats(DbStats):
    def __init__(self, admin_url: str, bench_url: str, database: str) -> None:
        super().__init__(admin_url, bench_url, database)
        self.unflushed = 0

    def flush(self) -> int:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            row = self.admin.execute(
                "SELECT count(*) FILTER (WHERE state IS DISTINCT FROM 'idle'), "
                "EXTRACT(EPOCH FROM clock_timestamp() - max(state_change)) "
                "FROM pg_stat_activity WHERE datname = %s "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                (self.database,),
            ).fetchone()
            assert row is not None
            busy, quiet = int(row[0]), row[1]
            if busy == 0 and (quiet is None or 0.1 <= float(quiet) <= 0.5):
                pids = [
                    int(r[0])
                    for r in self.admin.execute(
                        # MATERIALIZED: the filter is applied before anything is terminated.
                        "WITH idle AS MATERIALIZED (SELECT pid FROM pg_stat_activity "
                        "WHERE datname = %s AND backend_type = 'client backend' "
                        "AND pid <> pg_backend_pid() AND state = 'idle') "
                        "SELECT pid FROM idle WHERE pg_terminate_backend(pid)",
                        (self.database,),
                    ).fetchall()
                ]
                until = time.monotonic() + 10
                while pids and time.monotonic() < until:
                    left = self.admin.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
                    ).fetchone()
                    if not left or not left[0]:
                        break
                    time.sleep(0.02)
                return len(pids)
            time.sleep(0.005)
        raise RuntimeError("no quiet gap to flush the statistics in")

    def snapshot(self) -> Snapshot:
        try:
            return super().snapshot()
        except RuntimeError:
            self.unflushed += 1
            with psycopg.connect(self.bench_url) as conn, conn.transaction():
                conn.execute("SELECT pg_stat_clear_snapshot()")
                row = conn.execute(
                    "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, "
                    "tup_deleted, sessions FROM pg_stat_database "
                    "WHERE datname = current_database()"
                ).fetchone()
                assert row is not None
                tables = {
                    str(r[0]): (int(r[1]), int(r[2]), int(r[3]))
                    for r in conn.execute(
                        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables"
                    ).fetchall()
                }
            return Snapshot(
                time.time(),
                int(row[0]),
                int(row[1]),
                int(row[2]),
                int(row[3]),
                int(row[4]),
                int(row[5]),
                tables=tables,
                terminated=-1,
                retries=0,
            )


# Statements, by pg_stat_statements when the cluster has it (shared_preload_libraries; the
# extension is created in each benchmark database): a call of a prepared or pipelined statement
# counts once per execution, so an `executemany` of 10,000 rows is 10,000 statements, a single
# UPDATE ... WHERE member_id = ANY(...) one.

WRITE_STATEMENT = re.compile(
    r'(?<!FOR )\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+"?(\w+)"?', re.IGNORECASE
)


def write_statements(db_url: str) -> dict[str, int] | None:
    """Write statements executed in the database since the last reset, by "VERB table" (None:
    no pg_stat_statements)."""
    try:
        with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT query, calls FROM pg_stat_statements s JOIN pg_database d "
                "ON d.oid = s.dbid WHERE d.datname = current_database()"
            ).fetchall()
    except psycopg.Error:
        return None
    out: dict[str, int] = {}
    for query, calls in rows:
        m = WRITE_STATEMENT.search(str(query))
        if m is None:
            continue
        key = f"{m.group(1).split()[0].upper()} {m.group(2)}"
        out[key] = out.get(key, 0) + int(calls)
    return out


def reset_statements(db_url: str) -> bool:
    try:
        with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
        return True
    except psycopg.Error:
        return False


# --- figures and tables ---------------------------------------------------------------------------


@dataclass
class Figure:
    phase: str
    name: str
    size: str
    value: float | None
    unit: str
    baseline: str = "-"
    aim: str = "-"
    met: bool | None = None
    note: str = ""


def fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "ms":
        return f"{v:,.1f} ms" if v >= 100 else f"{v:.2f} ms"
    if unit == "s":
        return f"{v:,.2f} s"
    if unit == "/s":
        return f"{v:,.1f}/s" if v < 100 else f"{v:,.0f}/s"
    if unit == "B":
        return f"{v:,.0f} B"
    if unit == "MB":
        return f"{v:,.1f} MB"
    if unit == "KB":
        return f"{v:,.1f} KB"
    if unit == "cores":
        return f"{v:.2f} cores"
    if unit == "%":
        return f"{v:.1f} %"
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.3f}"


def print_rows(header: tuple[str, ...], rows: list[tuple[str, ...]], right: set[int]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def show(cells: tuple[str, ...]) -> str:
        return " | ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    print(show(header))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(show(r))


# --- processes ------------------------------------------------------------------------------------


class Coordinator:
    """`coordinator-svc serve` on 127.0.0.1; its log is appended to
    bench/results/scale-coordinator.log."""

    def __init__(self, argv: list[str], label: str) -> None:
        self.log_file = open(COORDINATOR_LOG, "ab")  # noqa: SIM115 - closed in stop()
        self.log_file.write(
            f"\n=== scale benchmark: {label}: {' '.join(mask_url(a) for a in argv)}\n".encode()
        )
        self.log_file.flush()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=self.log_file,
            env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}"},
        )

    def stop(self, timeout_s: float = 60.0) -> float:
        """SIGTERM (graceful: leases released), then SIGKILL; returns seconds until it exited."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log_file.close()
        return time.monotonic() - t0


class Client:
    """The driver's own synchronous channel (64 MiB limits)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_send_message_length", MAX_BYTES),
                ("grpc.max_receive_message_length", MAX_BYTES),
                ("grpc.use_local_subchannel_pool", 1),
            ],
        )
        self.admin = admin_pb2_grpc.ConnectGroupAdminStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def close(self) -> None:
        self.channel.close()


class Stage:
    """A fresh database, a coordinator on it and the load processes."""

    def __init__(self, bench: ScaleBench, name: str, needs_loadgens: bool = True) -> None:
        self.bench, self.name = bench, name
        a = bench.args
        self.database = f"scale_{name}"
        self.db_url = create_database(bench.cluster.url, self.database)
        if bench.has_statements:
            with psycopg.connect(libpq_url(self.db_url), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.stats = QuietDbStats(bench.cluster.url, self.db_url, self.database)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.metrics_port = free_port() if bench.has_metrics_flag else None
        self.worker_pids: dict[int, list[int]] = {}
        self.restarts = 0
        self.stopped = False
        self.coordinator = self.start_coordinator()
        self.client = Client(self.address)
        self.wait_serving(120)
        self.loadgens: list[Child] = []
        if needs_loadgens:
            for k in range(a.procs):
                gen = Child(
                    f"scale-loadgen-{k}",
                    [
                        sys.executable,
                        str(REPO / "bench" / "scale_loadgen.py"),
                        "--target",
                        self.address,
                        "--proc",
                        str(k),
                        "--channels",
                        str(a.channels),
                        "--max-message-bytes",
                        str(MAX_BYTES),
                    ],
                    RESULTS / f"scale-loadgen-{name}-{k}.log",
                    stdin=True,
                )
                self.loadgens.append(gen)
            pids = [str(g.proc.pid) for g in self.loadgens]
            for k, gen in enumerate(self.loadgens):
                ready = gen.receive(120)
                self.worker_pids[k] = [int(p) for p in ready.get("worker_pids", [])]
                pids.extend(str(p) for p in self.worker_pids[k])
            bench.note_state("loadgen_pids", " ".join(pids))

    def serve_argv(self, node: str) -> list[str]:
        a = self.bench.args
        exe = a.serve_command or str(Path(sys.executable).parent / "coordinator-svc")
        argv = [
            *shlex.split(exe),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--advertised-address",
            self.address,
            "--database-url",
            self.db_url,
            "--node-id",
            node,
            "--session-timeout-ms",
            str(a.session_timeout_ms),
            "--rebalance-timeout-ms",
            str(a.rebalance_timeout_ms),
            "--heartbeat-interval-ms",
            str(a.heartbeat_interval_ms),
            "--lease-ms",
            str(a.lease_ms),
            "--max-group-size",
            str(a.max_group_size),
            "--log-level",
            "INFO",
        ]
        if self.bench.has_max_message_flag:
            argv += ["--max-message-bytes", str(MAX_BYTES)]
        if self.metrics_port is not None:
            argv += ["--metrics-port", str(self.metrics_port), "--metrics-host", "127.0.0.1"]
        return argv

    def scrape(self) -> Scrape | None:
        return scrape(self.metrics_port)

    def start_coordinator(self) -> Coordinator:
        node = f"scale-{self.name}-{self.restarts}"
        coord = Coordinator(self.serve_argv(node), f"stage {self.name}, node {node}")
        self.bench.note_state("coordinator_pid", str(coord.proc.pid))
        return coord

    @property
    def pid(self) -> int:
        return self.coordinator.proc.pid

    def wait_serving(self, timeout_s: float) -> float:
        """Seconds since the coordinator process started until Health/Check answers SERVING."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.coordinator.proc.poll() is not None:
                raise RuntimeError(
                    f"coordinator exited with {self.coordinator.proc.returncode}; see "
                    f"{COORDINATOR_LOG.relative_to(REPO)}"
                )
            try:
                resp = self.client.health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return time.monotonic() - self.coordinator.started
            except grpc.RpcError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"coordinator not serving after {timeout_s:.0f}s")

    def run_all(self, commands: list[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
        for gen, cmd in zip(self.loadgens, commands, strict=True):
            gen.send(cmd)
        results = [gen.receive(timeout_s) for gen in self.loadgens]
        for r in results:
            if "failed" in r:
                raise RuntimeError(f"load process {r['proc']} failed: {r['failed']}")
            if r.get("errors"):
                self.bench.errors += r["errors"]
                print(f"  load process {r['proc']}: {r['errors']} error(s), e.g.:", flush=True)
                for sample in r.get("error_samples", [])[:3]:
                    print(f"    {sample}", flush=True)
        return results

    def same(self, cmd: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
        return self.run_all([cmd] * len(self.loadgens), timeout_s)

    def describe(self, group: str, timeout_s: float = 120.0) -> tuple[Any, float, int]:
        t0 = time.perf_counter()
        resp = self.client.admin.DescribeGroups(
            admin_pb2.DescribeGroupsRequest(group_ids=[group]), timeout=timeout_s
        )
        took = time.perf_counter() - t0
        return resp.groups[0], took, resp.ByteSize()

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for gen in self.loadgens:
            with suppress(OSError):
                gen.send({"op": "quit"})
        for gen in self.loadgens:
            with suppress(subprocess.TimeoutExpired):
                gen.proc.wait(10)
            gen.stop()
        self.client.close()
        self.coordinator.stop()
        self.stats.close()


def list_groups(client: Client, deadline_s: float) -> dict[str, Any]:
    """Every group through ListGroups, following next_page_token when the server pages (an
    older server answers everything at once), within one overall deadline."""
    paged = "page_token" in admin_pb2.ListGroupsRequest.DESCRIPTOR.fields_by_name
    groups: list[Any] = []
    pages = 0
    size = 0
    token = ""
    t0 = time.perf_counter()
    while True:
        left = deadline_s - (time.perf_counter() - t0)
        if left <= 0:
            raise TimeoutError(f"ListGroups: {len(groups)} groups after {deadline_s:.0f}s")
        req = (
            admin_pb2.ListGroupsRequest(page_token=token)
            if paged
            else admin_pb2.ListGroupsRequest()
        )
        resp = client.admin.ListGroups(req, timeout=left)
        pages += 1
        size = max(size, resp.ByteSize())
        if resp.error_code != 0:
            raise RuntimeError(f"ListGroups: {resp.error_code} {resp.error_message}")
        groups.extend(resp.groups)
        token = resp.next_page_token if paged else ""
        if not token:
            break
    return {
        "groups": groups,
        "pages": pages,
        "seconds": time.perf_counter() - t0,
        "largest_page_bytes": size,
    }


# --- the benchmark -------------------------------------------------------------------------------


class ScaleBench:
    def __init__(self, args: argparse.Namespace, stack: ExitStack) -> None:
        self.args = args
        self.stack = stack
        self.state_dir = Path(args.state_dir) if args.state_dir else None
        self.figures: list[Figure] = []
        self.raw: dict[str, Any] = {}
        self.errors = 0
        self.baseline: dict[str, float] = {}
        self.describe_largest = 0
        self.has_max_message_flag = False
        self.has_metrics_flag = False
        self.has_statements = False
        self.per_renewal = 0.0
        self.idle: dict[str, Any] = {}
        self.put_total = 0
        self.cloned_total = 0

    def note_state(self, name: str, value: str) -> None:
        """Tell bench/run-scale's exit trap what to clean up if this process dies."""
        if self.state_dir is not None:
            (self.state_dir / name).write_text(value)

    def fig(
        self, phase: str, name: str, size: str, value: float | None, unit: str, **kw: Any
    ) -> None:
        self.figures.append(Figure(phase, name, size, value, unit, **kw))

    # --- set-up ---

    def start(self) -> None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        COORDINATOR_LOG.write_bytes(b"")
        exe = self.args.serve_command or str(Path(sys.executable).parent / "coordinator-svc")
        help_text = subprocess.run(
            [*shlex.split(exe), "serve", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        ).stdout
        self.has_max_message_flag = "--max-message-bytes" in help_text
        self.has_metrics_flag = "--metrics-port" in help_text
        log(
            "coordinator-svc serve "
            + (
                "has --max-message-bytes: the server's limit is 64 MiB"
                if self.has_max_message_flag
                else "has no --max-message-bytes: the server keeps gRPC's default limits "
                "(4 MiB received)"
            )
        )
        settings = dict(PG_SETTINGS)
        self.has_statements = (find_pg_bin_dir().parent / "lib" / "pg_stat_statements.so").exists()
        if self.has_statements:  # write statements per install (rebalance)
            settings["shared_preload_libraries"] = "pg_stat_statements"
        log(
            "starting a throwaway PostgreSQL ("
            + ", ".join(f"{k}={v}" for k, v in settings.items())
            + ")"
        )
        self.cluster = ThrowawayCluster(settings=settings)
        self.cluster.start()
        self.stack.callback(self.cluster.stop)
        self.note_state("pg_base", str(self.cluster.base_dir))
        self.note_state("pg_bin", str(self.cluster.bin_dir))
        with psycopg.connect(libpq_url(self.cluster.url)) as conn:
            self.pg = {
                n: str(conn.execute(f"SHOW {n}").fetchone()[0])  # type: ignore[index]
                for n in ("server_version", "fsync", "synchronous_commit", "full_page_writes")
            }
        log(f"PostgreSQL {self.pg}")

    def stage(self, name: str, needs_loadgens: bool = True) -> Stage:
        log(
            f"stage {name}: fresh database scale_{name}, coordinator, "
            f"{self.args.procs} load processes"
        )
        st = Stage(self, name, needs_loadgens)
        self.stack.callback(st.stop)
        return st

    # --- helpers on a stage ---

    def put_catalogue(self, st: Stage, group: str, connectors: int, tasks: int) -> float:
        n = len(st.loadgens)
        t0 = time.monotonic()
        results = st.run_all(
            [
                {
                    "op": "put",
                    "group": group,
                    "connectors": [k, connectors, n],
                    "tasks": tasks,
                    "concurrency": 2,
                    "deadline_s": self.args.stable_deadline_s,
                }
                for k in range(n)
            ],
            self.args.stable_deadline_s + 60,
        )
        done = sum(r["done"] for r in results)
        if done != connectors:
            raise RuntimeError(f"catalogue of {group}: {done} of {connectors} connectors put")
        return time.monotonic() - t0

    def join(
        self, st: Stage, group: str, ids: list[str], concurrency: int
    ) -> list[tuple[float, int]]:
        n = len(st.loadgens)
        results = st.run_all(
            [
                {
                    "op": "join",
                    "group": group,
                    "ids": ids[k::n],
                    "concurrency": concurrency,
                    "rebalance_timeout_ms": self.args.rebalance_timeout_ms,
                    "deadline_s": self.args.stable_deadline_s,
                }
                for k in range(n)
            ],
            self.args.stable_deadline_s + 60,
        )
        joins = sorted(tuple(j) for r in results for j in r["joins"])
        failed = sum(r["failures"] + r["left_over"] for r in results)
        if failed:
            raise RuntimeError(f"{failed} of {len(ids)} joins to {group} failed or ran out of time")
        return [(float(a), int(b)) for a, b in joins]

    def join_one(self, st: Stage, group: str, member_id: str) -> tuple[float, int]:
        gen = st.loadgens[0]
        gen.send(
            {
                "op": "join",
                "group": group,
                "ids": [member_id],
                "concurrency": 1,
                "rebalance_timeout_ms": self.args.rebalance_timeout_ms,
                "deadline_s": 60,
            }
        )
        r = gen.receive(120)
        if r.get("failed") or not r.get("joins"):
            raise RuntimeError(f"join of {member_id}: {r}")
        end, us = r["joins"][0]
        return float(end), int(us)

    def wait_stable(self, st: Stage, group: str, members: int, since: float) -> dict[str, Any]:
        """Poll DescribeGroups (every --describe-poll-s, or twice its own duration if longer)
        until the group is STABLE with `members` members; then read from the load processes when
        the last member's state changed (the precise time)."""
        a = self.args
        deadline = time.monotonic() + a.stable_deadline_s
        polls = 0
        largest = 0
        slowest = 0.0
        state = "?"
        while time.monotonic() < deadline:
            g, took, size = st.describe(group)
            polls += 1
            largest, slowest = max(largest, size), max(slowest, took)
            self.describe_largest = max(self.describe_largest, size)
            state = g.state
            if (
                g.state == "STABLE"
                and len(g.members) == members
                and g.group_epoch == g.assignment_epoch
            ):
                seen = time.time()
                status = st.same({"op": "status", "group": group}, 60)
                last = max(r["last_change_wall"] for r in status)
                return {
                    "seconds": max(0.0, last - since),
                    "describe_seconds": seen - since,
                    "polls": polls,
                    "describe_largest_bytes": largest,
                    "describe_slowest_s": round(slowest, 3),
                    "group_epoch": g.group_epoch,
                }
            time.sleep(max(a.describe_poll_s, 2 * took))
        raise RuntimeError(
            f"group {group} not STABLE with {members} members after {a.stable_deadline_s:.0f}s "
            f"(state {state})"
        )

    def computes(self, st: Stage, since: float) -> list[dict[str, Any]]:
        out = [c for r in st.same({"op": "computes", "since": since}, 60) for c in r["computes"]]
        return sorted(out, key=lambda c: c.get("started_wall", 0.0))

    # --- stage main: form, rebalance, steady, messages ---

    def run_main(self, phases: set[str]) -> None:
        a = self.args
        st = self.stage("main")
        group = "scale-main"
        self.describe_largest = 0
        self.phase_ceiling(st)
        marks = marks_of(a.marks)
        log(f"form: catalogue {a.connectors} connectors x {a.tasks} tasks")
        took = self.put_catalogue(st, group, a.connectors, a.tasks)
        log(f"  put in {took:.1f}s")
        self.raw["main"] = {"catalogue_seconds": took, "marks": {}}
        if "steady" in phases:
            self.calibrate(st)
        members = 0
        next_id = 0
        joining_s = 0.0
        for mark in marks:
            size = f"{mark:,}"
            raw: dict[str, Any] = {}
            self.raw["main"]["marks"][size] = raw
            want = mark - members
            ids = [f"worker-{i:05d}" for i in range(next_id, next_id + want)]
            next_id += want
            log(
                f"form: {want} members join ({members} -> {mark}), "
                f"{a.join_concurrency} at a time per process"
            )
            scraped = st.scrape()
            meter = CpuMeter(st)
            meter.start()
            t0 = time.time()
            joins = self.join(st, group, ids, a.join_concurrency)
            t1 = time.time()
            raw["form_cpu"] = meter.stop()
            own = served(scraped, st.scrape(), HEARTBEAT_RPC)
            joining_s += t1 - t0
            members += want
            window = joins[-min(a.join_window, len(joins)) :]
            lat = sorted(us for _, us in window)
            span = window[-1][0] - window[0][0] if len(window) > 1 else 0.0
            rate = (len(window) - 1) / span if span > 0 else 0.0
            raw["join"] = {
                "segment_seconds": t1 - t0,
                "window": len(window),
                "p50_ms": pct(lat, 0.5),
                "p99_ms": pct(lat, 0.99),
                "max_ms": lat[-1] / 1000 if lat else 0.0,
                "rate_per_s": rate,
                "all_p99_ms": pct(sorted(us for _, us in joins), 0.99),
                "coordinator_heartbeats": own,
            }
            b = self.baseline
            w = f"last {len(window)} joins"
            self.fig(
                "form",
                f"join p50 ({w})",
                size,
                raw["join"]["p50_ms"],
                "ms",
                baseline=f"{b['p50_ms']:.2f} ms (health p50)",
            )
            self.fig(
                "form",
                f"join p99 ({w})",
                size,
                raw["join"]["p99_ms"],
                "ms",
                baseline=f"{b['p99_ms']:.2f} ms (health p99)",
                aim="< 20 ms",
                met=raw["join"]["p99_ms"] < 20,
            )
            self.fig(
                "form",
                f"join rate ({w})",
                size,
                rate,
                "/s",
                baseline=f"{b['rate_per_s']:,.0f}/s (health)",
            )
            self.fig(
                "form",
                "coordinator's own heartbeat p99 while joining",
                size,
                own["p99_ms"] if own else None,
                "ms",
                note=(
                    f"its histogram: {own['count']:,.0f} heartbeats (joins and the joined "
                    f"members' beats), p50 {own['p50_ms']:.2f} ms"
                    if own
                    else "no coordinator_rpc_latency_seconds (no --metrics-port?)"
                ),
            )
            self.cpu_figures("form", size, raw["form_cpu"], "while joining")
            self.fig("form", "time joining (cumulative)", size, joining_s, "s")
            log(
                f"  {want} joins in {t1 - t0:.1f}s; last {len(window)}: p50 "
                f"{raw['join']['p50_ms']:.2f} ms p99 {raw['join']['p99_ms']:.2f} ms, {rate:.0f}/s"
            )
            log(f"settle: until all {members} members are STABLE")
            settle = self.wait_stable(st, group, members, t1)
            raw["settle"] = settle
            raw["settle_computes"] = self.computes(st, t0)
            formed = joining_s + settle["seconds"]
            last = mark == marks[-1]
            self.fig(
                "form",
                "time to STABLE after the last join",
                size,
                settle["seconds"],
                "s",
                baseline=f"{a.heartbeat_interval_ms / 1000:g} s (heartbeat interval)",
            )
            self.fig(
                "form",
                "time to form (joining + STABLE)",
                size,
                formed,
                "s",
                aim="< 120 s" if last else "-",
                met=(formed < 120) if last else None,
            )
            full = [
                c
                for c in raw["settle_computes"]
                if c.get("members") == members and "assign_ms" in c
            ]
            self.fig(
                "rebalance",
                "assign(): first with all members (settle)",
                size,
                full[0]["assign_ms"] if full else None,
                "ms",
                aim="< 1 s",
                met=(full[0]["assign_ms"] < 1000) if full else None,
            )
            self.fig(
                "form",
                "assignor runs while forming",
                size,
                float(len(raw["settle_computes"])),
                "",
                note=runs_note(raw["settle_computes"]),
            )
            log(
                f"  STABLE {settle['seconds']:.1f}s after the last join (Describe saw it at "
                f"{settle['describe_seconds']:.1f}s); {len(raw['settle_computes'])} assignor runs"
            )
            if "rebalance" in phases:
                self.rebalance(st, group, members, f"extra-{mark:05d}", size, raw, "< 1 s", 1000)
                members += 1
            if "steady" in phases:
                self.steady(st, group, members, size, raw)
            sizes = st.same({"op": "sizes", "reset": True}, 60)
            largest: dict[str, int] = {}
            for r in sizes:
                for rpc, n in r["largest"].items():
                    largest[rpc] = max(largest.get(rpc, 0), int(n))
            largest["describe_response"] = self.describe_largest
            self.describe_largest = 0
            raw["message_bytes"] = largest
            self.message_figures(size, largest, last)
        st.stop()

    def phase_ceiling(self, st: Stage) -> None:
        a = self.args
        log(
            f"ceiling: grpc.health Check, {a.procs} processes x {a.join_concurrency} in flight, "
            f"{a.ceiling_s}s (+1s warm-up)"
        )
        results = st.same(
            {
                "op": "health",
                "duration_s": a.ceiling_s,
                "warmup_s": 1.0,
                "concurrency": a.join_concurrency,
            },
            a.ceiling_s + 60,
        )
        lat = sorted(us for r in results for us in r["samples_us"])
        start = min(r["window"][0] for r in results)
        end = max(r["window"][1] for r in results)
        self.baseline = {
            "p50_ms": pct(lat, 0.5),
            "p99_ms": pct(lat, 0.99),
            "rate_per_s": len(lat) / max(end - start, 1e-9),
        }
        self.raw["ceiling"] = self.baseline
        b = self.baseline
        self.fig("form", "baseline: health Check p50", "-", b["p50_ms"], "ms")
        self.fig("form", "baseline: health Check p99", "-", b["p99_ms"], "ms")
        self.fig("form", "baseline: health Check rate", "-", b["rate_per_s"], "/s")
        log(f"  {b['rate_per_s']:.0f} calls/s, p50 {b['p50_ms']:.2f} ms, p99 {b['p99_ms']:.2f} ms")

    def rebalance(
        self,
        st: Stage,
        group: str,
        members: int,
        new_id: str,
        size: str,
        raw: dict[str, Any],
        aim_text: str,
        aim_ms: float,
    ) -> None:
        a = self.args
        interval_s = a.heartbeat_interval_ms / 1000
        log(f"rebalance: member {new_id} joins the STABLE group of {members}")
        db_before = st.stats.snapshot()
        counted = self.has_statements and reset_statements(st.db_url)
        scraped = st.scrape()
        t_join = time.time()
        _, join_us = self.join_one(st, group, new_id)
        stable = self.wait_stable(st, group, members + 1, t_join)
        statements = write_statements(st.db_url) if counted else None
        scraped_after = st.scrape()
        db = db_delta(db_before, st.stats.snapshot())
        runs = self.computes(st, t_join)
        done = [c for c in runs if c.get("installed")]
        c = done[0] if done else (runs[0] if runs else {})
        own = {
            rpc: served(scraped, scraped_after, rpc)
            for rpc in ("ConnectGroupPrepareAssignment", "ConnectGroupInstallAssignment")
        }
        raw["rebalance"] = {
            "join_ms": join_us / 1000,
            "stable": stable,
            "computes": runs,
            "db": db,
            "write_statements": statements,
            "coordinator": own,
        }
        self.install_writes(size, db, statements, max(len(done), 1))
        self.fig(
            "rebalance",
            "assign() after one join",
            size,
            c.get("assign_ms"),
            "ms",
            aim=aim_text,
            met=(c["assign_ms"] < aim_ms) if "assign_ms" in c else None,
        )
        health = f"{self.baseline['p50_ms']:.2f} ms (health p50)" if self.baseline else "-"
        self.fig(
            "rebalance",
            "PrepareAssignment latency (client)",
            size,
            c.get("prepare_ms"),
            "ms",
            baseline=health,
        )
        self.fig(
            "rebalance",
            "InstallAssignment latency (client)",
            size,
            c.get("install_ms"),
            "ms",
            baseline=health,
        )
        both = c["prepare_ms"] + c["install_ms"] if "install_ms" in c else None
        self.fig(
            "rebalance",
            "Prepare + Install",
            size,
            both,
            "ms",
            aim="< 1 s",
            met=(both < 1000) if both is not None else None,
        )
        for rpc, short in (
            ("ConnectGroupPrepareAssignment", "Prepare"),
            ("ConnectGroupInstallAssignment", "Install"),
        ):
            mine = own[rpc]
            self.fig(
                "rebalance",
                f"coordinator's own {short} (its histogram, mean)",
                size,
                mine["mean_ms"] if mine else None,
                "ms",
                note=f"{mine['count']:.0f} call(s)" if mine else "not scraped",
            )
        self.fig(
            "rebalance",
            "decode view + encode install (client)",
            size,
            c["decode_ms"] + c["encode_ms"] if "encode_ms" in c else None,
            "ms",
        )
        self.fig(
            "rebalance",
            "join -> every member STABLE",
            size,
            stable["seconds"],
            "s",
            baseline=f"{interval_s:g} s (heartbeat interval)",
            aim=f"<= {3 * interval_s:g} s (3 intervals)",
            met=stable["seconds"] <= 3 * interval_s,
        )
        self.fig(
            "rebalance",
            "assignor runs for the join",
            size,
            float(len(runs)),
            "",
            note=runs_note(runs),
        )
        log(
            f"  assign {c.get('assign_ms', 0):.1f} ms, prepare {c.get('prepare_ms', 0):.1f} ms, "
            f"install {c.get('install_ms', 0):.1f} ms; all STABLE {stable['seconds']:.1f}s after "
            f"the join ({len(runs)} assignor run(s))"
        )

    def install_writes(
        self, size: str, db: dict[str, Any], statements: dict[str, int] | None, installs: int
    ) -> None:
        """Database writes from one join to every member STABLE (the join, the install and the
        members' next heartbeats), on the member and target tables, per install: statements
        (pg_stat_statements) and tuple writes (pg_stat_user_tables)."""
        tables = {t: v for t, v in db["tables"].items() if t in MEMBER_TABLES}
        tuples = sum(sum(v.values()) for v in tables.values())
        self.fig(
            "rebalance",
            "DB tuple writes per install (member + target tables)",
            size,
            tuples / installs,
            "",
            note="; ".join(
                f"{t}: +{v['inserted']} ~{v['updated']} -{v['deleted']}" for t, v in tables.items()
            )
            + f"; join -> all STABLE, {installs} install(s), events "
            + str(sum(db["tables"].get("events", {}).values())),
        )
        if statements is None:
            self.fig(
                "rebalance",
                "DB write statements per install (member + target tables)",
                size,
                None,
                "",
                note="no pg_stat_statements in this PostgreSQL",
            )
            return
        mine = {k: v for k, v in statements.items() if k.split()[1] in MEMBER_TABLES}
        self.fig(
            "rebalance",
            "DB write statements per install (member + target tables)",
            size,
            sum(mine.values()) / installs,
            "",
            aim="constant in members",
            note=", ".join(f"{k}: {v}" for k, v in sorted(mine.items()))
            + f"; all tables {sum(statements.values())}",
        )

    def calibrate(self, st: Stage) -> None:
        """The idle baseline: the group exists, nobody heartbeats; only the lease renewer writes.
        Gives its commits per renewal, which the steady windows subtract."""
        a = self.args
        log(f"calibration: idle for {a.calibrate_s:g}s (the lease renewer alone writes)")
        time.sleep(1.0)
        before = st.stats.snapshot()
        time.sleep(a.calibrate_s)
        after = st.stats.snapshot()
        db = db_delta(before, after)
        w = max(db["window_s"], 1e-9)
        own = db["commits"] - max(db["coordinator_reconnects"], 0)
        self.per_renewal = own / db["lease_renewals"] if db["lease_renewals"] else 0.0
        self.idle = {
            "commits_per_s": db["commits"] / w,
            "tuple_writes_per_s": db["tuple_writes"] / w,
            "commits_per_renewal": self.per_renewal,
            "unflushed_snapshots": st.stats.unflushed,
            "db": db,
        }
        self.raw["main"]["calibration"] = self.idle
        log(
            f"  {db['commits']} commits ({db['coordinator_reconnects']} reconnects) for "
            f"{db['lease_renewals']} lease renewals: {self.per_renewal:.2f} commits per renewal; "
            f"{db['tuple_writes']} tuple writes"
        )

    def steady(self, st: Stage, group: str, members: int, size: str, raw: dict[str, Any]) -> None:
        a = self.args
        interval_s = a.heartbeat_interval_ms / 1000
        log(f"steady: {members} members heartbeat every {interval_s:g}s; window {a.steady_s:g}s")
        time.sleep(1.0)
        before: Snapshot = st.stats.snapshot()
        scraped = st.scrape()
        meter = CpuMeter(st)
        meter.start()
        cpu0, m0 = proc_cpu(st.pid), time.monotonic()
        t0 = time.time()
        time.sleep(a.steady_s)
        t1 = time.time()
        cpu1, m1 = proc_cpu(st.pid), time.monotonic()
        window_cpu = meter.stop()
        own = served(scraped, st.scrape(), HEARTBEAT_RPC)
        after: Snapshot = st.stats.snapshot()
        db = db_delta(before, after)
        kinds: dict[str, list[int]] = {}
        for r in st.same({"op": "samples", "group": group, "t0": t0, "t1": t1}, 60):
            for kind, values in r["kinds"].items():
                kinds.setdefault(kind, []).extend(values)
        lat = sorted(kinds.get("unchanged", []))
        others = {k: len(v) for k, v in kinds.items() if k != "unchanged"}
        window = t1 - t0
        db_window = max(db["window_s"], 1e-9)
        cpu = (cpu1 - cpu0) / (m1 - m0)
        # Commits the lease renewer does not explain (its commits per renewal come from the
        # idle calibration; a coordinator connection that was terminated for the flush counts
        # its start-up transaction once).
        renewer = db["lease_renewals"] * self.per_renewal + max(db["coordinator_reconnects"], 0)
        excess = db["commits"] - renewer
        hb_commits = excess / db_window
        hb_tuples = db["tuple_writes_excl_leases"] / db_window
        idle_commits = self.idle.get("commits_per_s", 0.0)
        idle_tuples = self.idle.get("tuple_writes_per_s", 0.0)
        raw["steady"] = {
            "heartbeats": len(lat),
            "other_answers": others,
            "p50_ms": pct(lat, 0.5),
            "p99_ms": pct(lat, 0.99),
            "max_ms": lat[-1] / 1000 if lat else 0.0,
            "rate_per_s": len(lat) / window,
            "cpu_cores": cpu,
            "cpu": window_cpu,
            "coordinator_heartbeats": own,
            "db": db,
        }
        b = self.baseline
        self.fig(
            "steady",
            "heartbeat p50",
            size,
            pct(lat, 0.5),
            "ms",
            baseline=f"{b['p50_ms']:.2f} ms (health p50)",
        )
        self.fig(
            "steady",
            "heartbeat p99",
            size,
            pct(lat, 0.99),
            "ms",
            baseline=f"{b['p99_ms']:.2f} ms (health p99)",
            aim="< 50 ms",
            met=pct(lat, 0.99) < 50,
        )
        own_p99 = own["p99_ms"] if own else None
        self.fig(
            "steady",
            "coordinator's own heartbeat p50",
            size,
            own["p50_ms"] if own else None,
            "ms",
            note=f"its histogram, {own['count']:,.0f} heartbeats" if own else "not scraped",
        )
        self.fig(
            "steady",
            "coordinator's own heartbeat p99",
            size,
            own_p99,
            "ms",
            aim="< 10 ms",
            met=(own_p99 < 10) if own_p99 is not None else None,
            note=f"mean {own['mean_ms']:.2f} ms" if own else "",
        )
        saturated = window_cpu["machine_busy_share"] >= SATURATED
        client_met = pct(lat, 0.99) < 50
        self.fig(
            "steady",
            "aim: p99 < 50 ms, or own p99 < 10 ms when saturated",
            size,
            pct(lat, 0.99) if client_met or own_p99 is None else own_p99,
            "ms",
            aim="client < 50 ms | own < 10 ms",
            met=client_met or (saturated and own_p99 is not None and own_p99 < 10),
            note=(
                "client p99"
                if client_met
                else f"own p99; machine {100 * window_cpu['machine_busy_share']:.0f} % busy"
                + ("" if saturated else f" (not saturated: < {100 * SATURATED:.0f} %)")
            ),
        )
        self.cpu_figures("steady", size, window_cpu, "")
        self.fig(
            "steady",
            "heartbeats/s",
            size,
            len(lat) / window,
            "/s",
            baseline=f"{members / interval_s:,.0f}/s (members / interval)",
        )
        self.fig(
            "steady",
            "answers that were not 'unchanged'",
            size,
            float(sum(others.values())),
            "",
            aim="0",
            met=not others,
            note=json.dumps(others) if others else "",
        )
        self.fig("steady", "coordinator CPU", size, cpu, "cores")
        self.fig(
            "steady",
            "DB commits/s (all)",
            size,
            db["commits"] / db_window,
            "/s",
            baseline=f"{idle_commits:.2f}/s (idle: lease renewer)",
        )
        self.fig(
            "steady",
            "DB tuple writes/s (all)",
            size,
            db["tuple_writes"] / db_window,
            "/s",
            baseline=f"{idle_tuples:.2f}/s (idle: lease renewer)",
        )
        self.fig(
            "steady",
            "DB commits/s beyond the lease renewer",
            size,
            hb_commits,
            "/s",
            baseline=f"{self.per_renewal:.2f} commits per renewal (idle)",
            aim="0",
            met=excess <= 0.5,
        )
        self.fig(
            "steady",
            "DB tuple writes/s outside group_leases",
            size,
            hb_tuples,
            "/s",
            aim="0",
            met=hb_tuples == 0,
            note=", ".join(f"{t}: {sum(v.values())}" for t, v in db["tables"].items()),
        )
        log(
            f"  {len(lat)} heartbeats ({len(lat) / window:.0f}/s), p50 {pct(lat, 0.5):.2f} ms, "
            f"p99 {pct(lat, 0.99):.2f} ms; coordinator {cpu:.2f} cores; {db['commits']} commits "
            f"({db['lease_upkeep_commits']} lease upkeep), {db['tuple_writes']} tuple writes"
        )

    def cpu_figures(self, phase: str, size: str, cpu: dict[str, Any], when: str) -> None:
        """The CPU shares of a window as figures (the full table: `print_cpu`)."""
        w = max(cpu["window_s"], 1e-9)
        suffix = f" {when}" if when else ""
        for name, seconds in (
            ("machine busy", cpu["machine_busy_s"]),
            ("PostgreSQL CPU", cpu["seconds"].get("PostgreSQL", 0.0)),
            ("load processes CPU", cpu["load_processes_s"]),
        ):
            self.fig(
                phase,
                f"{name}{suffix}",
                size,
                seconds / w,
                "cores",
                baseline=f"{cpu['cores']:.0f} cores",
                note=f"{100 * seconds / (w * cpu['cores']):.0f} % of the machine",
            )

    def message_figures(self, size: str, largest: dict[str, int], last: bool) -> None:
        limit = MAX_BYTES if self.has_max_message_flag else 4 * 1024 * 1024
        for rpc in (
            "heartbeat_request",
            "heartbeat_response",
            "prepare_request",
            "prepare_response",
            "install_request",
            "install_response",
            "describe_response",
        ):
            n = largest.get(rpc)
            # gRPC's default limit is on what a side receives: requests are received by the
            # server (its limit), responses by our clients (64 MiB).
            lim = limit if rpc.endswith("request") else MAX_BYTES
            self.fig(
                "messages",
                rpc.replace("_", " "),
                size,
                float(n) if n is not None else None,
                "B",
                baseline=f"{lim:,} B limit",
                aim=f"< {lim // (1024 * 1024)} MiB",
                met=(n < lim) if n is not None else None,
                note=f"{100 * n / lim:.2f} % of the limit" if n is not None else "not seen",
            )

    # --- stage mid: 1,000 x 50,000 ---

    def run_mid(self) -> None:
        a = self.args
        st = self.stage("mid")
        group = "scale-mid"
        self.describe_largest = 0
        size = f"{a.mid_members:,} x {a.mid_connectors * a.mid_tasks:,}"
        log(f"mid: {a.mid_connectors} connectors x {a.mid_tasks} tasks, {a.mid_members} members")
        self.put_catalogue(st, group, a.mid_connectors, a.mid_tasks)
        t0 = time.time()
        self.join(st, group, [f"worker-{i:05d}" for i in range(a.mid_members)], a.join_concurrency)
        t1 = time.time()
        settle = self.wait_stable(st, group, a.mid_members, t1)
        runs = self.computes(st, t0)
        full = [c for c in runs if c.get("members") == a.mid_members and "assign_ms" in c]
        raw: dict[str, Any] = {"join_seconds": t1 - t0, "settle": settle, "settle_computes": runs}
        self.raw["mid"] = raw
        first = full[0]["assign_ms"] if full else None
        self.fig(
            "rebalance",
            "mid group: assign(), first with all members",
            size,
            first,
            "ms",
            aim="< 200 ms",
            met=(first < 200) if first is not None else None,
        )
        self.rebalance(st, group, a.mid_members, "extra-mid", size, raw, "< 200 ms", 200)
        st.stop()

    # --- stage groups ---

    def run_groups(self) -> None:
        self.groups_members()
        self.groups_idle()

    def groups_members(self) -> None:
        a = self.args
        st = self.stage("groups_a")
        time.sleep(1.0)
        rss0 = rss_mb(st.pid)
        made = 0
        raw: dict[str, Any] = {"rss0_mb": rss0, "marks": {}}
        self.raw["groups_members"] = raw
        n = len(st.loadgens)
        for mark in marks_of(a.groups_a):
            size = f"{mark:,} groups"
            log(f"groups a: {made} -> {mark} groups, each 1 connector x 10 tasks and 10 members")
            t0 = time.monotonic()
            st.run_all(
                [
                    {
                        "op": "put",
                        "group_prefix": "busy",
                        "groups": [made + k, mark, n],
                        "connectors": [0, 1],
                        "tasks": 10,
                        "concurrency": 4,
                        "deadline_s": a.stable_deadline_s,
                    }
                    for k in range(n)
                ],
                a.stable_deadline_s + 60,
            )
            self.join_groups(st, "busy", made, mark, 10)
            listed = self.wait_groups_stable(st, "busy-", mark, 10)
            took = time.monotonic() - t0
            time.sleep(1.0)
            rss = rss_mb(st.pid)
            per = (rss - rss0) * 1024 / mark
            raw["marks"][size] = {"seconds": took, "rss_mb": rss, "list": listed}
            self.fig("groups", "a: create + join + all STABLE", size, took, "s")
            self.fig(
                "groups", "a: coordinator RSS", size, rss, "MB", baseline=f"{rss0:.1f} MB (empty)"
            )
            self.fig("groups", "a: RSS per group of 10 members", size, per, "KB")
            log(
                f"  {mark} groups STABLE after {took:.1f}s; RSS {rss:.1f} MB "
                f"({per:.1f} KB per group)"
            )
            made = mark
        st.stop()

    def join_groups(self, st: Stage, prefix: str, lo: int, hi: int, per_group: int) -> None:
        """`per_group` members for each of the groups [lo, hi), group after group; each process
        takes every n-th group."""
        n = len(st.loadgens)
        a = self.args
        results = st.run_all(
            [
                {
                    "op": "join",
                    "pairs": [
                        [f"{prefix}-{i:06d}", f"{prefix}-{i:06d}-m{j}"]
                        for i in range(lo + k, hi, n)
                        for j in range(per_group)
                    ],
                    "concurrency": a.join_concurrency,
                    "rebalance_timeout_ms": a.rebalance_timeout_ms,
                    "deadline_s": a.stable_deadline_s,
                }
                for k in range(n)
            ],
            a.stable_deadline_s + 60,
        )
        failed = sum(r["failures"] + r["left_over"] for r in results)
        if failed:
            raise RuntimeError(f"{failed} joins to the {prefix} groups failed or ran out of time")

    def wait_groups_stable(
        self, st: Stage, prefix: str, count: int, members: int
    ) -> dict[str, Any]:
        deadline = time.monotonic() + self.args.stable_deadline_s
        states: dict[str, int] = {}
        while time.monotonic() < deadline:
            listed = list_groups(st.client, 120)
            took = float(listed["seconds"])
            mine = [g for g in listed["groups"] if g.group_id.startswith(prefix)]
            states = {}
            for g in mine:
                states[g.state] = states.get(g.state, 0) + 1
            if len(mine) == count and all(
                g.state == "STABLE" and g.member_count == members for g in mine
            ):
                return {"list_seconds": took, "states": states}
            time.sleep(max(1.0, 2 * took))
        raise RuntimeError(f"groups {prefix}* not all STABLE in time: {states}")

    def groups_idle(self) -> None:
        a = self.args
        st = self.stage("groups_b")
        time.sleep(1.0)
        rss0 = rss_mb(st.pid)
        raw: dict[str, Any] = {"rss0_mb": rss0, "marks": {}}
        self.raw["groups_idle"] = raw
        made = 0
        budget_left = a.put_budget_s
        n = len(st.loadgens)
        for mark in marks_of(a.groups_b):
            size = f"{mark:,} groups"
            info: dict[str, Any] = {}
            raw["marks"][size] = info
            log(
                f"groups b: {made} -> {mark} idle groups (1 connector x 1 task, no members), "
                f"PutConnector from {n} processes x 8 in flight, {budget_left:.0f}s budget left"
            )
            t0 = time.monotonic()
            results = st.run_all(
                [
                    {
                        "op": "put",
                        "group_prefix": "idle",
                        "groups": [made + k, mark, n],
                        "connectors": [0, 1],
                        "tasks": 1,
                        "concurrency": 8,
                        "deadline_s": max(budget_left, 1.0),
                        "report_missing": True,
                    }
                    for k in range(n)
                ],
                budget_left + 120,
            )
            took = time.monotonic() - t0
            budget_left = max(0.0, budget_left - took)
            put = sum(r["done"] for r in results)
            missing = [g for r in results for g in r.get("missing", [])]
            info["put"] = {"groups": put, "seconds": took, "rate_per_s": put / max(took, 1e-9)}
            cloned = 0
            if missing:
                log(
                    f"  PutConnector made {put} groups in {took:.0f}s; {len(missing)} more by SQL "
                    "(copies of a PutConnector-made group, through the coordinator's schema)"
                )
                cloned = self.clone_groups(st, "idle-000000", missing)
            info["sql_cloned"] = cloned
            self.put_total += put
            self.cloned_total += cloned
            self.fig(
                "groups",
                "b: groups made by PutConnector (all so far)",
                size,
                float(self.put_total),
                "",
                note=f"{self.cloned_total:,} more by SQL copy"
                if self.cloned_total
                else "none by SQL copy",
            )
            self.fig(
                "groups", "b: PutConnector rate (new groups)", size, put / max(took, 1e-9), "/s"
            )
            time.sleep(2.0)
            rss = rss_mb(st.pid)
            info["rss_mb"] = rss
            self.fig(
                "groups",
                "b: coordinator RSS (live, created)",
                size,
                rss,
                "MB",
                baseline=f"{rss0:.1f} MB (empty)",
            )
            self.fig(
                "groups",
                "b: RSS per idle group (live, created)",
                size,
                (rss - rss0) * 1024 / max(self.put_total, 1),
                "KB",
                note="per group made by PutConnector (SQL copies are not in memory)"
                if self.cloned_total
                else "",
            )
            # The idle state measured is a restarted coordinator's: a process that has just
            # created groups holds them (and, depending on the version, their leases) for a while.
            self.restart(st, size, info)
            self.idle_window(st, size, info)
            self.list_groups(st, size, mark, info)
            made = mark
        st.stop()

    def clone_groups(self, st: Stage, template: str, new_ids: list[str]) -> int:
        """Copy the template group's rows (every state table of the coordinator's own schema,
        column by column) under new group ids; no lease (the coordinator adopts them) and no
        events (the audit trail is not read by an idle coordinator)."""
        from coordinator_svc.store import schema

        with psycopg.connect(libpq_url(st.db_url)) as conn:
            for lo in range(0, len(new_ids), 20_000):
                batch = new_ids[lo : lo + 20_000]
                with conn.transaction():
                    for table in schema.STATE_TABLES:
                        cols = [c.name for c in table.columns]
                        target = ", ".join(f'"{c}"' for c in cols)
                        source = ", ".join(
                            "ids.gid" if c == "group_id" else f't."{c}"' for c in cols
                        )
                        conn.execute(
                            f'INSERT INTO "{table.name}" ({target}) SELECT {source} '
                            f'FROM "{table.name}" t, unnest(%s::text[]) AS ids(gid) '
                            "WHERE t.group_id = %s",
                            (batch, template),
                        )
        return len(new_ids)

    def idle_window(self, st: Stage, size: str, info: dict[str, Any]) -> None:
        a = self.args
        log(f"  idle window {a.idle_s:g}s")
        before = st.stats.snapshot()
        cpu0, m0 = proc_cpu(st.pid), time.monotonic()
        time.sleep(a.idle_s)
        cpu1, m1 = proc_cpu(st.pid), time.monotonic()
        after = st.stats.snapshot()
        db = db_delta(before, after)
        w = max(db["window_s"], 1e-9)
        info["idle"] = {"db": db, "cpu_cores": (cpu1 - cpu0) / (m1 - m0)}
        self.fig("groups", "b: idle DB commits/s (after restart)", size, db["commits"] / w, "/s")
        self.fig(
            "groups",
            "b: idle DB tuple writes/s (after restart)",
            size,
            db["tuple_writes"] / w,
            "/s",
        )
        self.fig(
            "groups",
            "b: idle lease renewals/s (after restart)",
            size,
            db["lease_renewals"] / w,
            "/s",
        )
        self.fig(
            "groups",
            "b: idle coordinator CPU (after restart)",
            size,
            (cpu1 - cpu0) / (m1 - m0),
            "cores",
        )
        log(
            f"  idle: {db['commits'] / w:.1f} commits/s, "
            f"{db['tuple_writes'] / w:.1f} tuple writes/s, "
            f"coordinator {(cpu1 - cpu0) / (m1 - m0):.2f} cores"
        )

    def list_groups(self, st: Stage, size: str, groups: int, info: dict[str, Any]) -> None:
        took: float | None = None
        try:
            listed = list_groups(st.client, 60)
            took = float(listed["seconds"])
            n = len(listed["groups"])
            info["list_groups"] = {k: v for k, v in listed.items() if k != "groups"} | {"n": n}
            note = f"{n:,} of {groups:,} groups in {listed['pages']} page(s)"
            complete = n >= groups
        except (grpc.RpcError, TimeoutError) as error:
            info["list_groups"] = {"error": str(error)}
            note = f"past the 60 s deadline: {str(error)[:60]}"
            complete = False
        self.fig(
            "groups",
            "b: ListGroups (every page)",
            size,
            took,
            "s",
            aim="< 60 s (deadline), all groups",
            met=took is not None and complete,
            note=note,
        )

    def restart(self, st: Stage, size: str, info: dict[str, Any]) -> None:
        log(
            "  restart: SIGTERM the coordinator, start a fresh `serve` on the same port and "
            "database"
        )
        down = st.coordinator.stop(timeout_s=180)
        killed = st.coordinator.proc.returncode == -signal.SIGKILL
        st.restarts += 1
        st.coordinator = st.start_coordinator()
        serving = st.wait_serving(self.args.stable_deadline_s)
        deadline = time.monotonic() + self.args.stable_deadline_s
        answered: float | None = None
        while time.monotonic() < deadline:
            try:
                g, _, _ = st.describe("idle-000000", timeout_s=30)
                if g.error_code == 0:
                    answered = time.monotonic() - st.coordinator.started
                    break
            except grpc.RpcError:
                pass
            time.sleep(0.05)
        time.sleep(1.0)
        rss = rss_mb(st.pid)
        info["restart"] = {
            "stop_s": down,
            "serving_s": serving,
            "describe_s": answered,
            "rss_mb": rss,
        }
        self.fig(
            "groups",
            "b: restart: old process exits (SIGTERM)",
            size,
            down,
            "s",
            note="killed after 180 s" if killed else "",
        )
        self.fig("groups", "b: restart: start -> health SERVING", size, serving, "s")
        self.fig("groups", "b: restart: start -> Describe answered", size, answered, "s")
        self.fig("groups", "b: restart: RSS after", size, rss, "MB")
        rss0 = float(self.raw["groups_idle"]["rss0_mb"])
        groups = int(size.split()[0].replace(",", ""))
        self.fig(
            "groups",
            "b: RSS per idle group (after restart)",
            size,
            (rss - rss0) * 1024 / groups,
            "KB",
        )
        log(
            f"  stopped in {down:.1f}s; SERVING {serving:.1f}s after start, Describe answered "
            f"{answered if answered is None else round(answered, 1)}s after start; RSS {rss:.1f} MB"
        )

    # --- output ---

    def print_cpu(self) -> None:
        """Per process CPU over each mark's joining and steady windows (/proc): seconds, cores
        and share of the machine; "other processes" is what the machine was busy with beyond
        this benchmark's (it may be shared)."""
        marks = self.raw.get("main", {}).get("marks", {})
        for title, key in (
            ("while members join (each mark's joining window)", ("form_cpu",)),
            ("over the steady window", ("steady", "cpu")),
        ):
            windows: dict[str, dict[str, Any]] = {}
            for size, raw in marks.items():
                cpu: Any = raw
                for k in key:
                    cpu = cpu.get(k) if isinstance(cpu, dict) else None
                if cpu:
                    windows[size] = cpu
            if not windows:
                continue
            names: list[str] = []
            for cpu in windows.values():
                names += [n for n in cpu["seconds"] if n not in names]

            def cell(cpu: dict[str, Any], seconds: float) -> str:
                w = max(cpu["window_s"], 1e-9)
                share = 100 * seconds / (w * cpu["cores"])
                return f"{seconds:.1f} s = {seconds / w:.2f} cores ({share:.0f} %)"

            rows = [
                (n, *(cell(c, c["seconds"].get(n, 0.0)) for c in windows.values())) for n in names
            ]
            rows.append(
                ("machine: busy", *(cell(c, c["machine_busy_s"]) for c in windows.values()))
            )
            rows.append(
                (
                    "window",
                    *(f"{c['window_s']:.1f} s x {c['cores']:.0f} cores" for c in windows.values()),
                )
            )
            print()
            print(f"CPU {title}: CPU seconds, cores, share of the machine")
            print_rows(("process", *windows), rows, set(range(1, len(windows) + 1)))

    def print_tables(self, phases: set[str]) -> None:
        titles = {
            "form": "Phase 1, form: members join one group (catalogue "
            f"{self.args.connectors:,} x {self.args.tasks:,} tasks)",
            "rebalance": "Phase 2, settle + rebalance: the product's "
            "IncrementalCooperativeAssignor in the loop",
            "steady": f"Phase 3, steady: heartbeats every {self.args.heartbeat_interval_ms} ms, "
            f"{self.args.steady_s:g} s window",
            "groups": "Phase 4, groups: a) groups of 10 members, b) idle groups",
            "messages": "Phase 5, messages: largest serialized message per RPC (protobuf ByteSize)",
        }
        for phase in PHASES:
            rows = [f for f in self.figures if f.phase == phase]
            if phase not in phases or not rows:
                continue
            print()
            print(titles[phase])
            print_rows(
                ("figure", "size", "value", "baseline", "aim", "met", "note"),
                [
                    (
                        f.name,
                        f.size,
                        fmt(f.value, f.unit),
                        f.baseline,
                        f.aim,
                        "-" if f.met is None else ("met" if f.met else "NOT MET"),
                        f.note,
                    )
                    for f in rows
                ],
                {2},
            )
        self.print_cpu()
        print()
        print("Growth: each figure at its sizes")
        for phase in PHASES:
            rows = [f for f in self.figures if f.phase == phase and f.size != "-"]
            if phase not in phases or not rows:
                continue
            # One table per set of sizes (a figure measured at fewer sizes joins the table of a
            # set that covers them), columns in the order measured.
            order: list[str] = []
            by_name: dict[str, dict[str, Figure]] = {}
            for f in rows:
                if f.size not in order:
                    order.append(f.size)
                by_name.setdefault(f.name, {})[f.size] = f
            names = [n for n, by in by_name.items() if len(by) >= 2]
            sets: list[set[str]] = []
            for n in sorted(names, key=lambda n: -len(by_name[n])):
                if not any(set(by_name[n]) <= c for c in sets):
                    sets.append(set(by_name[n]))
            sets.sort(key=lambda c: min(order.index(x) for x in c))
            for cover in sets:
                sizes = [x for x in order if x in cover]
                table = [
                    (n, *(fmt(by[x].value, by[x].unit) if x in by else "" for x in sizes))
                    for n in names
                    if set(by := by_name[n]) <= cover
                    and next(c for c in sets if set(by) <= c) is cover
                ]
                print()
                print_rows((phase, *sizes), table, set(range(1, len(sizes) + 1)))
        print()


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="run-scale",
        description="The coordinator at scale: groups of 1k-10k members, 100k tasks, 100k groups "
        "(see bench/README.md). Sizes default to the full preset; --small scales everything down.",
    )
    parser.add_argument("--small", action="store_true", help="the small preset (~3 min)")
    parser.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma-separated subset of {','.join(PHASES)}; rebalance, steady "
        "and messages need form (added)",
    )
    parser.add_argument("--procs", type=int, default=4, help="load processes")
    parser.add_argument("--channels", type=int, default=4, help="gRPC channels per load process")
    parser.add_argument(
        "--join-concurrency",
        type=int,
        default=2,
        help="joins in flight per load process (also the ceiling's)",
    )
    parser.add_argument("--heartbeat-interval-ms", type=int, default=5000)
    parser.add_argument("--session-timeout-ms", type=int, default=60_000)
    parser.add_argument("--rebalance-timeout-ms", type=int, default=120_000)
    parser.add_argument("--lease-ms", type=int, default=5000, help="coordinator --lease-ms")
    parser.add_argument("--max-group-size", type=int, default=20_000)
    parser.add_argument("--describe-poll-s", type=float, default=1.0)
    for key, value in PRESETS["full"].items():
        parser.add_argument(
            f"--{key.replace('_', '-')}",
            type=type(value),
            default=None,
            help=f"default {value} (small: {PRESETS['small'][key]})",
        )
    parser.add_argument("--state-dir", default="", help="(for run-scale's exit trap)")
    parser.add_argument(
        "--serve-command",
        default="",
        help="command run as `<it> serve ...` instead of .venv/bin/coordinator-svc "
        "(experiments: a baseline build, a wrapper)",
    )
    parser.add_argument("--output", default=str(RESULTS / "scale-latest.json"))
    args = parser.parse_args()
    preset = PRESETS["small" if args.small else "full"]
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    unknown = phases - set(PHASES)
    if unknown:
        parser.error(
            f"unknown phase(s) {', '.join(sorted(unknown))}; choose from {', '.join(PHASES)}"
        )
    if phases & {"rebalance", "steady", "messages"} and "form" not in phases:
        phases.add("form")
        log("rebalance, steady and messages need a formed group: adding form")

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    started = time.time()
    with ExitStack() as stack:
        bench = ScaleBench(args, stack)
        bench.start()
        if "form" in phases:
            bench.run_main(phases)
        if "rebalance" in phases:
            bench.run_mid()
        if "groups" in phases:
            bench.run_groups()
        bench.print_tables(phases)
        seconds = time.time() - started
        report = {
            "run": {
                "started": dt.datetime.fromtimestamp(started, dt.UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
                "seconds": round(seconds, 1),
                "preset": "small" if args.small else "full",
                "phases": sorted(phases),
                "host": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "grpcio": grpc.__version__,
                    "platform": platform.platform(),
                },
                "git": git_state(),
                "postgres": bench.pg,
                "server_max_message_bytes": MAX_BYTES if bench.has_max_message_flag else None,
                "load_errors": bench.errors,
                "config": {k: v for k, v in vars(args).items() if k not in ("state_dir", "output")},
            },
            "baseline": bench.baseline,
            "figures": [vars(f) for f in bench.figures],
            "raw": bench.raw,
        }
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        log(f"wrote {out}; coordinator log: {COORDINATOR_LOG.relative_to(REPO)}")
        log("stopping everything")
    log(f"done in {time.time() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
