#!/usr/bin/env python3
"""The coordinator benchmark's driver (run it through ./bench/run-coordinator; see bench/README.md).

It starts a throwaway PostgreSQL with durable commits (fsync=on, synchronous_commit=on), starts
`coordinator-svc serve` on 127.0.0.1 against it, starts PROCS load generators (bench/loadgen.py),
runs the phases, prints the table and writes bench/results/coordinator-latest.json:

  1. ceiling   grpc.health.v1.Health/Check on the coordinator process: the same gRPC server
               stack doing no work. Every other rate is compared with it.
  0. database  what the disk allows: durable update+insert transactions from 1 and from N
               connections straight to PostgreSQL (a separate database), for reference.
  2. setup     catalogue (CONNECTORS connectors x TASKS tasks), MEMBERS members join, the driver
               plays the assignor member (COMPUTE_ASSIGNMENT -> Prepare -> Install a round-robin
               target) and every member heartbeats until the group is STABLE.
  3. steady    every member heartbeats at its epoch with no field changed, as fast as the load
               generators go; database writes counted from pg_stat_database deltas.
  5. classic   a classic group (ConnectGroupClassic, DESIGN 3.19) of MEMBERS members on the same
               catalogue forms (ids, one join phase, the leader's round-robin SyncGroup), then
               every member heartbeats at its generation as fast as the load generators go: its
               share of the ceiling is compared with phase 3's (aim: within 5 points).
  6. parked    the connect group's steady heartbeats for PARKED_S with no classic call held, then
               again while PARKED JoinGroups of another classic group are held (a member that
               does not rejoin keeps its join phase open); then that member rejoins and the time
               until every held call is answered is measured.
  4. changes   revocation rounds (a target that moves K tasks from each member to the next;
               members are told, acknowledge, then collect what others released) and fresh
               members joining with every field and leaving again.

Every load phase also records where the machine's cores went (coordinator, load generators,
PostgreSQL, other processes), and --profile records a py-spy profile of the coordinator per phase
(bench/profile_summary.py reads it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import queue
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "generated"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import grpc  # noqa: E402
import psycopg  # noqa: E402
from connect.group.v1 import (  # noqa: E402
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from bench.classic_phases import CALLS_PER_CHANNEL, ClassicCalls, wait_for  # noqa: E402
from connect_protocol.safe_text import mask_url  # noqa: E402
from tests.support.pgcluster import ThrowawayCluster, create_database, libpq_url  # noqa: E402

RESULTS = REPO / "bench" / "results"
GROUP = "bench-group"
CLASSIC_GROUP = "bench-classic"
PARKED_GROUP = "bench-parked"
#: Classic members' own timeouts: long enough that no phase's pause expires a session.
CLASSIC_SESSION_MS = 60_000
CLASSIC_REBALANCE_MS = 60_000
NONE, COMPUTE_ASSIGNMENT = 0, 10001
IC = common_pb2.Assignor(
    name="incremental_cooperative", minimum_version=1, maximum_version=2, version=2
)
PG_SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    # Autovacuum's own transactions would land in xact_commit; a run this short makes too little
    # garbage for it to matter, so it is off to keep the write counts exact.
    "autovacuum": "off",
}

Resources = tuple[frozenset[str], frozenset[tuple[str, int]]]
EMPTY: Resources = (frozenset(), frozenset())


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- resources ---------------------------------------------------------------------------------


def from_cat(msg: Any) -> Resources:
    return frozenset(msg.connectors), frozenset((t.connector, t.task) for t in msg.tasks)


def to_cat(res: Resources, msg: Any) -> None:
    msg.SetInParent()
    msg.connectors.extend(sorted(res[0]))
    for c, t in sorted(res[1]):
        msg.tasks.add(connector=c, task=t)


def res_json(res: Resources) -> dict[str, Any]:
    return {"connectors": sorted(res[0]), "tasks": [[c, t] for c, t in sorted(res[1])]}


def round_robin(member_ids: Iterable[str], catalogue: dict[str, int]) -> dict[str, Resources]:
    """Connectors and, separately, tasks dealt in turn to the members sorted by id: each member
    gets the floor or the ceiling of both (DESIGN 3.8's balance)."""
    ids = sorted(member_ids)
    conns: dict[str, set[str]] = {m: set() for m in ids}
    tasks: dict[str, set[tuple[str, int]]] = {m: set() for m in ids}
    for i, name in enumerate(sorted(catalogue)):
        conns[ids[i % len(ids)]].add(name)
    all_tasks = [(name, t) for name in sorted(catalogue) for t in range(catalogue[name])]
    for j, task in enumerate(all_tasks):
        tasks[ids[j % len(ids)]].add(task)
    return {m: (frozenset(conns[m]), frozenset(tasks[m])) for m in ids}


def rotated(
    previous: dict[str, Resources], catalogue: dict[str, int], move: int
) -> dict[str, Resources]:
    """The previous target fitted to the catalogue (vanished tasks dropped, new ones given to the
    member with fewest tasks), then each member (sorted by id) hands its `move` lowest tasks to
    the next member: every member gives up and receives `move` tasks; the balance is kept."""
    ids = sorted(previous)
    wanted = {(name, t) for name in catalogue for t in range(catalogue[name])}
    conns = {m: set(previous[m][0]) & set(catalogue) for m in ids}
    tasks = {m: set(previous[m][1]) & wanted for m in ids}
    placed = set().union(*tasks.values())
    for task in sorted(wanted - placed):
        fewest = min(ids, key=lambda m: (len(tasks[m]), m))
        tasks[fewest].add(task)
    for name in sorted(set(catalogue) - set().union(*conns.values())):
        fewest = min(ids, key=lambda m: (len(conns[m]), m))
        conns[fewest].add(name)
    gives = {m: sorted(tasks[m])[:move] for m in ids}
    for i, m in enumerate(ids):
        receiver = ids[(i + 1) % len(ids)]
        for task in gives[m]:
            tasks[m].discard(task)
            tasks[receiver].add(task)
    return {m: (frozenset(conns[m]), frozenset(tasks[m])) for m in ids}


# --- database statistics -----------------------------------------------------------------------
#
# PostgreSQL (15 here) keeps each backend's statistics pending and flushes them at most once a
# second, and an idle backend that flushed less than a second ago waits up to 10 s: a plain
# "sleep, then read pg_stat_database" mis-assigns transactions to the wrong window. So before
# every snapshot the driver terminates the benchmark database's *idle* backends (the
# coordinator's pooled connections: a backend flushes its counters when it exits; SQLAlchemy's
# pre-ping reconnects on the next use) and waits until they are gone. Every snapshot then reads
# pg_stat_database and pg_stat_user_tables in one transaction of a fresh connection, whose two
# transactions (start-up and the snapshot) land, exactly, in the next window and are subtracted.
#
# What xact_commit counts besides the coordinator's BEGIN..COMMIT transactions: SQLAlchemy's
# pool_pre_ping sends an empty statement on every checkout, and PostgreSQL counts an empty
# statement as a committed transaction; a reconnected pool connection skips that ping, but its
# start-up transaction counts instead. So a request that writes costs 2 counted commits, and the
# lease renewer's loop (renew, then the scan for free groups, each its own checkout) costs 4 per
# renewal, the renewals being counted as group_leases row updates. The idle calibration checks
# that: nothing is left unexplained there.

OWN_COMMITS_PER_WINDOW = 2  # the "before" snapshot connection: start-up + the snapshot
OWN_SESSIONS_PER_WINDOW = 1
LEASE_UPKEEP_COMMITS_PER_RENEWAL = 4


@dataclass
class Snapshot:
    at: float
    xact_commit: int
    xact_rollback: int
    tup_inserted: int
    tup_updated: int
    tup_deleted: int
    sessions: int
    tables: dict[str, tuple[int, int, int]]  # relname -> (ins, upd, del)
    terminated: int
    retries: int  # snapshot connections made and closed before the final read


class DbStats:
    def __init__(self, admin_url: str, bench_url: str, database: str) -> None:
        self.admin = psycopg.connect(libpq_url(admin_url), autocommit=True)  # not the bench db
        self.bench_url = libpq_url(bench_url)
        self.database = database

    def close(self) -> None:
        self.admin.close()

    def flush(self) -> int:
        """Terminate the benchmark database's idle backends so that they flush their counters;
        first wait (briefly) until none is in the middle of a transaction (the lease renewer),
        so that no transaction is split across two windows."""
        pids: list[int] = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            rows = self.admin.execute(
                "SELECT pid, state FROM pg_stat_activity WHERE datname = %s "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                (self.database,),
            ).fetchall()
            if all(r[1] == "idle" for r in rows):
                pids = [int(r[0]) for r in rows]
                break
            time.sleep(0.01)
        for pid in pids:
            self.admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        deadline = time.monotonic() + 10
        while pids and time.monotonic() < deadline:
            left = self.admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            ).fetchone()
            if not left or not left[0]:
                break
            time.sleep(0.02)
        return len(pids)

    def snapshot(self) -> Snapshot:
        """Flush, then read from a fresh connection; valid only if no other backend of the
        benchmark database exists once the read is done (the lease renewer may reconnect in
        between: then its counters may be half-flushed, and the snapshot is taken again)."""
        time.sleep(0.2)  # let answers already sent finish their bookkeeping
        for retries in range(20):
            terminated = self.flush()
            self.admin.execute("SELECT 'bench snapshot'")  # a marker for log_statement=all
            with psycopg.connect(self.bench_url) as conn:
                mine = conn.info.backend_pid
                with conn.transaction():
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
                            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del "
                            "FROM pg_stat_user_tables"
                        ).fetchall()
                    }
                others = self.admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                    "AND backend_type = 'client backend' AND pid <> %s",
                    (self.database, mine),
                ).fetchone()
            if others is not None and others[0] == 0:
                return Snapshot(
                    time.time(),
                    *(int(v) for v in row),
                    tables=tables,
                    terminated=terminated,
                    retries=retries,
                )
            # Retry; first let this connection's backend exit (flushing its own counters).
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                gone = self.admin.execute(
                    "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = %s", (mine,)
                ).fetchone()
                if gone and gone[0]:
                    break
                time.sleep(0.01)
        raise RuntimeError("could not take a clean statistics snapshot")

    settle = snapshot


def member_rows(db: dict[str, Any]) -> int:
    m = db["tables"].get("members", {})
    return int(m.get("inserted", 0) + m.get("updated", 0) + m.get("deleted", 0))


def db_delta(before: Snapshot, after: Snapshot) -> dict:
    tables = {}
    for name in sorted(set(after.tables) | set(before.tables)):
        a = after.tables.get(name, (0, 0, 0))
        b = before.tables.get(name, (0, 0, 0))
        d = tuple(x - y for x, y in zip(a, b, strict=True))
        if any(d):
            tables[name] = {"inserted": d[0], "updated": d[1], "deleted": d[2]}
    raw_commits = after.xact_commit - before.xact_commit
    # The "before" snapshot's connection, and any the "after" one retried with, count here.
    own_commits = OWN_COMMITS_PER_WINDOW * (1 + after.retries)
    reconnects = after.sessions - before.sessions - OWN_SESSIONS_PER_WINDOW * (1 + after.retries)
    tuples = (
        after.tup_inserted
        + after.tup_updated
        + after.tup_deleted
        - before.tup_inserted
        - before.tup_updated
        - before.tup_deleted
    )
    leases = tables.get("group_leases", {"inserted": 0, "updated": 0, "deleted": 0})
    renewals = leases["updated"]
    lease_tuples = leases["inserted"] + leases["updated"] + leases["deleted"]
    upkeep = renewals * LEASE_UPKEEP_COMMITS_PER_RENEWAL
    return {
        "window_s": round(after.at - before.at, 3),
        "raw_xact_commit_delta": raw_commits,
        "own_commits_subtracted": own_commits,
        "snapshot_retries": after.retries,
        "coordinator_reconnects": reconnects,
        "commits": raw_commits - own_commits,
        "rollbacks": after.xact_rollback - before.xact_rollback,
        "tuple_writes": tuples,
        "lease_renewals": renewals,
        "lease_upkeep_commits": upkeep,
        "commits_excl_lease_upkeep": raw_commits - own_commits - upkeep,
        "tuple_writes_excl_leases": tuples - lease_tuples,
        "tables": tables,
    }


# --- CPU accounting -----------------------------------------------------------------------------


CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int, children: bool = False) -> float:
    """CPU seconds (user + system) of a process; with `children`, plus its reaped children's."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / CLK_TCK


def _proc_sys(pid: int) -> float:
    """System (kernel) CPU seconds of a process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return int(fields[12]) / CLK_TCK


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _machine() -> tuple[float, float, float]:
    """(busy, steal, total) CPU seconds of the whole machine since boot; busy excludes idle,
    iowait and steal (time the hypervisor gave to someone else)."""
    parts = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = parts
    busy = user + nice + system + irq + softirq
    return busy / CLK_TCK, steal / CLK_TCK, sum(parts) / CLK_TCK


class CpuMeter:
    """Where the machine's cores go during a phase: the coordinator, the load generators,
    PostgreSQL (postmaster, live backends and exited ones), this driver, and everything else
    on the machine (other tenants), in cores (CPU seconds per second)."""

    def __init__(self, coordinator: int, loadgens: list[int], postmaster: int) -> None:
        self.coordinator, self.loadgens, self.postmaster = coordinator, loadgens, postmaster

    def sample(self) -> dict[str, float]:
        pg = _proc_cpu(self.postmaster, children=True)
        pg += sum(_proc_cpu(c) for c in _children(self.postmaster))
        busy, steal, total = _machine()
        return {
            "at": time.monotonic(),
            "coordinator": _proc_cpu(self.coordinator),
            "coordinator_sys": _proc_sys(self.coordinator),
            "loadgens": sum(_proc_cpu(p) for p in self.loadgens),
            "postgres": pg,
            "driver": _proc_cpu(os.getpid()),
            "machine_busy": busy,
            "machine_steal": steal,
            "machine_total": total,
        }

    @staticmethod
    def cores(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        wall = max(after["at"] - before["at"], 1e-9)
        out = {
            k: round((after[k] - before[k]) / wall, 2)
            for k in ("coordinator", "loadgens", "postgres", "driver")
        }
        busy = (after["machine_busy"] - before["machine_busy"]) / wall
        out["other_processes"] = round(max(0.0, busy - sum(out.values())), 2)
        out["steal"] = round((after["machine_steal"] - before["machine_steal"]) / wall, 2)
        out["idle"] = round(
            (after["machine_total"] - before["machine_total"]) / wall - busy - out["steal"], 2
        )
        out["coordinator_sys"] = round(
            (after["coordinator_sys"] - before["coordinator_sys"]) / wall, 2
        )
        return out


# --- processes ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Child:
    """A child process whose stdout lines are read by a thread into a queue."""

    def __init__(self, name: str, args: list[str], log_path: Path, stdin: bool = False) -> None:
        self.name = name
        self.log_file = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args,
            cwd=REPO,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdin else self.log_file,
            stderr=self.log_file,
            text=True,
            env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}"},
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        if stdin:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError(f"{self.name}: no answer within {timeout_s:.0f}s") from None
        if line is None:
            raise RuntimeError(f"{self.name} exited ({self.proc.poll()}); see its log")
        return json.loads(line)  # type: ignore[no-any-return]

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log_file.close()


class Stubs:
    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.coordinator = coordinator_pb2_grpc.ConnectGroupCoordinatorStub(self.channel)
        self.admin = admin_pb2_grpc.ConnectGroupAdminStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def close(self) -> None:
        self.channel.close()


def wait_serving(stubs: Stubs, coordinator: Child, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if coordinator.proc.poll() is not None:
            raise RuntimeError(f"coordinator exited with {coordinator.proc.returncode}")
        try:
            if stubs.health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.1)
    raise RuntimeError("coordinator not serving in time")


# --- aggregation -------------------------------------------------------------------------------


def pct(values: list[int], q: float) -> float:
    if not values:
        return 0.0
    index = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[index] / 1000.0


def aggregate(results: list[dict[str, Any]], kinds: Iterable[str]) -> dict[str, Any]:
    """Merge the processes' figures for `kinds`: total count, the rate over the union of their
    windows (first start to last end), percentiles over every sample."""
    samples: list[int] = []
    count = total = 0
    starts: list[float] = []
    ends: list[float] = []
    per_proc = []
    for r in results:
        for kind in kinds:
            k = r["kinds"].get(kind)
            if not k:
                continue
            samples.extend(k["samples_us"])
            count += k["count"]
            total += k.get("total_incl_warmup", k["count"])
            if k["count"]:
                starts.append(k["start_wall"])
                ends.append(k["end_wall"])
                per_proc.append(
                    {
                        "proc": r["proc"],
                        "kind": kind,
                        "count": k["count"],
                        "rate_per_s": k["rate_per_s"],
                        "p50_ms": k["p50_ms"],
                        "p99_ms": k["p99_ms"],
                    }
                )
    samples.sort()
    window = (max(ends) - min(starts)) if starts else 0.0
    return {
        "count": count,
        "total_incl_warmup": total,
        "window_s": round(window, 3),
        "rate_per_s": round(count / window, 1) if window > 0 else 0.0,
        "p50_ms": round(pct(samples, 0.50), 3),
        "p90_ms": round(pct(samples, 0.90), 3),
        "p99_ms": round(pct(samples, 0.99), 3),
        "max_ms": round(samples[-1] / 1000, 3) if samples else 0.0,
        "per_process": per_proc,
    }


def strip_samples(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in results:
        r = dict(r)
        r.pop("members", None)
        r["kinds"] = {
            k: {kk: vv for kk, vv in v.items() if kk != "samples_us"}
            for k, v in r.get("kinds", {}).items()
        }
        out.append(r)
    return out


# --- the benchmark -----------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, stack: ExitStack) -> None:
        self.args = args
        self.stack = stack
        self.state_dir = Path(args.state_dir) if args.state_dir else None
        self.report: dict[str, Any] = {"phases": {}, "figures": []}

    def note_state(self, name: str, value: str) -> None:
        """Tell bench/run-coordinator's exit trap what to clean up if this process dies."""
        if self.state_dir is not None:
            (self.state_dir / name).write_text(value)

    # --- processes ---

    def start(self) -> None:
        a = self.args
        RESULTS.mkdir(parents=True, exist_ok=True)
        log(
            "starting a throwaway PostgreSQL ("
            + ", ".join(f"{k}={v}" for k, v in PG_SETTINGS.items())
            + ")"
        )
        settings = dict(PG_SETTINGS)
        for item in a.pg_setting:
            name, _, value = item.partition("=")
            settings[name] = value
        cluster = ThrowawayCluster(settings=settings)
        cluster.start()
        self.stack.callback(cluster.stop)
        # Keep PostgreSQL's log (the cluster's directory is removed when it stops).
        self.stack.callback(
            lambda: (
                shutil.copyfile(cluster.log_file, RESULTS / "postgres.log")
                if cluster.log_file.exists()
                else None
            )
        )
        self.note_state("pg_base", str(cluster.base_dir))
        self.note_state("pg_bin", str(cluster.bin_dir))
        self.db_url = create_database(cluster.url, "bench")
        self.scratch_url = create_database(cluster.url, "bench_scratch")
        with psycopg.connect(libpq_url(self.db_url)) as conn:
            self.pg_settings = {
                name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                for name in ("server_version", *PG_SETTINGS, "wal_sync_method")
            }
        log(
            f"PostgreSQL {self.pg_settings['server_version']} on port {cluster.port}: "
            f"{self.pg_settings}"
        )

        port = free_port()
        self.address = f"127.0.0.1:{port}"
        exe = a.serve_command or str(Path(sys.executable).parent / "coordinator-svc")
        serve = [
            *shlex.split(exe),
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
            "bench-coordinator",
            "--session-timeout-ms",
            str(a.session_timeout_ms),
            "--rebalance-timeout-ms",
            "60000",
            "--heartbeat-interval-ms",
            "3000",
            "--lease-ms",
            str(a.lease_ms),
            "--log-level",
            a.log_level,
        ]
        self.metrics_port = 0
        if not a.no_classic:
            self.metrics_port = free_port()
            serve += [
                "--metrics-port",
                str(self.metrics_port),
                "--metrics-host",
                "127.0.0.1",
                # A classic group forms once every pending id has rejoined: no extra wait.
                "--classic-initial-rebalance-delay-ms",
                "0",
            ]
        log(f"starting coordinator: {' '.join(mask_url(arg) for arg in serve[1:])}")
        self.coordinator = Child("coordinator", serve, RESULTS / "coordinator.log")
        self.stack.callback(self.coordinator.stop)
        self.note_state("coordinator_pid", str(self.coordinator.proc.pid))
        self.stubs = Stubs(self.address)
        self.stack.callback(self.stubs.close)
        wait_serving(self.stubs, self.coordinator)
        self.stats = DbStats(cluster.url, self.db_url, "bench")
        self.stack.callback(self.stats.close)

        self.loadgens = []
        for k in range(a.procs):
            gen = Child(
                f"loadgen-{k}",
                [
                    sys.executable,
                    str(REPO / "bench" / "loadgen.py"),
                    "--target",
                    self.address,
                    "--threads",
                    str(a.threads),
                    "--proc",
                    str(k),
                ],
                RESULTS / f"loadgen-{k}.log",
                stdin=True,
            )
            self.stack.callback(gen.stop)
            self.loadgens.append(gen)
        self.note_state("loadgen_pids", " ".join(str(g.proc.pid) for g in self.loadgens))
        for gen in self.loadgens:
            gen.receive(60)
        postmaster = int((cluster.data_dir / "postmaster.pid").read_text().split()[0])
        self.cpu = CpuMeter(
            self.coordinator.proc.pid, [g.proc.pid for g in self.loadgens], postmaster
        )
        log(f"coordinator on {self.address}; {a.procs} load generators x {a.threads} threads ready")

    def run_all(self, commands: list[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
        """Send each load generator its command at once; collect their answers."""
        for gen, cmd in zip(self.loadgens, commands, strict=True):
            gen.send(cmd)
        results = [gen.receive(timeout_s) for gen in self.loadgens]
        for r in results:
            if "failed" in r:
                raise RuntimeError(f"load generator {r['proc']} failed: {r['failed']}")
            short = {
                k: (v.get("count"), v.get("rate_per_s"), v.get("p50_ms"), v.get("p99_ms"))
                for k, v in r["kinds"].items()
            }
            print(
                "  loadgen "
                + json.dumps(
                    {
                        "proc": r["proc"],
                        "op": r["op"],
                        "errors": r["errors"],
                        "kinds(count,rate/s,p50ms,p99ms)": short,
                    }
                ),
                flush=True,
            )
            for sample in r.get("error_samples", []):
                print(f"    error: {sample}", flush=True)
        return results

    def split(self, members: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        n = len(self.loadgens)
        return [members[k::n] for k in range(n)]

    # --- group helpers ---

    def describe(self) -> Any:
        resp = self.stubs.admin.DescribeGroups(
            admin_pb2.DescribeGroupsRequest(group_ids=[GROUP]), timeout=30
        )
        return resp.groups[0]

    def members_now(self) -> dict[str, dict[str, Any]]:
        group = self.describe()
        return {
            m.member_id: {
                "id": m.member_id,
                "epoch": m.member_epoch,
                "state": m.state,
                "owned": from_cat(m.current_assignment),
                "pending": from_cat(m.pending_revocation),
                "target": from_cat(m.target_assignment),
            }
            for m in group.members
        }

    def heartbeat(self, member_id: str, epoch: int, owned: Resources | None = None) -> Any:
        req = coordinator_pb2.ConnectGroupHeartbeatRequest(
            group_id=GROUP, member_id=member_id, member_epoch=epoch
        )
        if owned is not None:
            to_cat(owned, req.connectors_and_tasks)
        return self.stubs.coordinator.ConnectGroupHeartbeat(req, timeout=30)

    def compute_and_install(self, make_target: Any) -> dict[str, Resources]:
        """Play the assignor member: heartbeat until COMPUTE_ASSIGNMENT, Prepare, Install."""
        group = self.describe()
        assignor = group.assignor_member_id
        epoch = next(m.member_epoch for m in group.members if m.member_id == assignor)
        resp = self.heartbeat(assignor, epoch)
        if resp.error_code != COMPUTE_ASSIGNMENT:
            raise RuntimeError(f"assignor {assignor} not asked to compute: {resp}")
        prep = self.stubs.coordinator.ConnectGroupPrepareAssignment(
            coordinator_pb2.ConnectGroupPrepareAssignmentRequest(
                group_id=GROUP, member_id=assignor, member_epoch=resp.member_epoch
            ),
            timeout=30,
        )
        if prep.error_code != NONE:
            raise RuntimeError(f"prepare failed: {prep.error_code} {prep.error_message}")
        catalogue = {c.name: c.task_count for c in prep.catalogue}
        target = make_target([m.member_id for m in prep.members], catalogue)
        install = coordinator_pb2.ConnectGroupInstallAssignmentRequest(
            group_id=GROUP,
            member_id=assignor,
            member_epoch=resp.member_epoch,
            group_epoch=prep.group_epoch,
        )
        for member_id, res in sorted(target.items()):
            entry = install.members.add(member_id=member_id)
            to_cat(res, entry.connectors_and_tasks)
        done = self.stubs.coordinator.ConnectGroupInstallAssignment(install, timeout=30)
        if done.error_code != NONE:
            raise RuntimeError(f"install failed: {done.error_code} {done.error_message}")
        return target

    def wait_stable(self, members: dict[str, dict[str, Any]], timeout_s: float = 30.0) -> None:
        """Heartbeat (reporting owned lists) every member not yet at its target, until STABLE."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            group = self.describe()
            if group.state == "STABLE":
                return
            for m in group.members:
                if m.state == "STABLE" and m.member_epoch == group.assignment_epoch:
                    continue
                owned = from_cat(m.current_assignment)
                self.heartbeat(m.member_id, m.member_epoch, owned)
        raise RuntimeError(f"group not STABLE after {timeout_s}s: {self.describe().state}")

    # --- phases ---

    def calibrate(self) -> None:
        """An idle window: the coordinator's background transactions (lease renewal and the scan
        for free groups) must be all that is counted (checks the accounting above)."""
        a = self.args
        renew_s = a.lease_ms / 3000
        window = renew_s + 0.6
        log(f"calibration: idle for {window:.1f}s (the lease renewer alone writes)")
        before = self.stats.settle()
        time.sleep(window)
        after = self.stats.settle()
        d = db_delta(before, after)
        d["tuple_writes_note"] = "expected: only group_leases updates"
        self.report["phases"]["calibration"] = d
        log(
            f"  idle: {d['commits']} commits for {d['lease_renewals']} lease renewals, "
            f"{d['commits_excl_lease_upkeep']} unexplained (expected 0), "
            f"{d['tuple_writes_excl_leases']} tuple writes outside the lease table"
        )

    def phase_database(self) -> dict[str, Any]:
        """What the disk allows: durable transactions shaped like a small state change (update
        one row, insert one event row), from 1 connection and from as many connections as the
        load generators have threads (PostgreSQL then flushes several commits per WAL sync)."""
        a = self.args
        out: dict[str, Any] = {}
        url = libpq_url(self.scratch_url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE m (id int PRIMARY KEY, v int NOT NULL)")
            conn.execute("CREATE TABLE e (id bigserial PRIMARY KEY, m int, payload jsonb)")
            conn.execute("INSERT INTO m SELECT g, 0 FROM generate_series(0, 255) g")
        for clients in (1, a.procs * a.threads):
            log(
                f"phase 0, database: durable update+insert transactions, {clients} connection(s), "
                f"{a.db_s}s"
            )
            stop_at = time.monotonic() + a.db_s
            lat: list[list[int]] = [[] for _ in range(clients)]

            def run(k: int, lat: list[list[int]] = lat, stop_at: float = stop_at) -> None:
                with psycopg.connect(url) as conn:
                    while time.monotonic() < stop_at:
                        started = time.perf_counter()
                        with conn.transaction():
                            conn.execute("UPDATE m SET v = v + 1 WHERE id = %s", (k,))
                            conn.execute(
                                "INSERT INTO e (m, payload) VALUES (%s, %s::jsonb)",
                                (k, '{"event": "bench"}'),
                            )
                        lat[k].append(int((time.perf_counter() - started) * 1e6))

            t0 = time.monotonic()
            workers = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            elapsed = time.monotonic() - t0
            samples = sorted(v for part in lat for v in part)
            out[f"clients_{clients}"] = {
                "clients": clients,
                "commits": len(samples),
                "rate_per_s": round(len(samples) / elapsed, 1),
                "p50_ms": round(pct(samples, 0.5), 3),
                "p99_ms": round(pct(samples, 0.99), 3),
            }
            r = out[f"clients_{clients}"]
            log(f"  {r['rate_per_s']:.0f} commits/s, p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms")
        self.report["phases"]["database"] = out
        return out

    def phase_ceiling(self, key: str = "ceiling") -> dict[str, Any]:
        """The empty RPC. Run twice, before the setup and after the steady phases: the baseline
        is their mean, so that a drift of the machine (steal time) during the run biases the
        ratios less; both are kept."""
        a = self.args
        when = "before setup" if key == "ceiling" else "again, after the steady phases"
        log(f"phase 1, ceiling ({when}): Health/Check for {a.ceiling_s}s (+1s warm-up)")
        self.profile_start(key, a.ceiling_s + 1)
        results = self.run_all(
            [{"op": "health", "duration_s": a.ceiling_s, "warmup_s": 1.0}] * a.procs,
            a.ceiling_s + 60,
        )
        agg = aggregate(results, ["health"])
        agg["cpu_cores"] = self.profile_stop()
        self.report["phases"][key] = {"aggregate": agg, "processes": strip_samples(results)}
        log(
            f"  ceiling {agg['rate_per_s']:.0f} calls/s, p50 {agg['p50_ms']} ms, "
            f"p99 {agg['p99_ms']} ms"
        )
        return agg

    def put_catalogue(self, group_id: str) -> None:
        """CONNECTORS connectors of TASKS tasks each into `group_id` (creating it)."""
        a = self.args
        for i in range(a.connectors):
            r = self.stubs.admin.PutConnector(
                admin_pb2.PutConnectorRequest(
                    group_id=group_id, connector=f"conn-{i:02d}", task_count=a.tasks
                ),
                timeout=30,
            )
            if r.error_code != NONE:
                raise RuntimeError(f"PutConnector: {r.error_code} {r.error_message}")

    def phase_setup(self) -> dict[str, Any]:
        a = self.args
        log(f"phase 2, setup: {a.connectors} connectors x {a.tasks} tasks, {a.members} members")
        t0 = time.perf_counter()
        self.put_catalogue(GROUP)
        join_ms = []
        for i in range(a.members):
            req = coordinator_pb2.ConnectGroupHeartbeatRequest(
                group_id=GROUP,
                member_id=f"member-{i:04d}",
                member_epoch=0,
                rebalance_timeout_ms=60_000,
                url=f"http://member-{i:04d}.bench.invalid:8083",
            )
            req.client_assignors.assignors.append(IC)
            req.connectors_and_tasks.SetInParent()
            started = time.perf_counter()
            resp = self.stubs.coordinator.ConnectGroupHeartbeat(req, timeout=30)
            join_ms.append((time.perf_counter() - started) * 1000)
            if resp.error_code not in (NONE, COMPUTE_ASSIGNMENT):
                raise RuntimeError(f"join: {resp.error_code} {resp.error_message}")
        joined = time.perf_counter()
        self.target = self.compute_and_install(round_robin)
        self.wait_stable(self.members_now())
        took = time.perf_counter() - t0
        join_ms.sort()
        members = self.members_now()
        sizes = sorted(len(m["owned"][1]) for m in members.values())
        out = {
            "seconds_to_stable": round(took, 3),
            "seconds_catalogue_and_joins": round(joined - t0, 3),
            "sequential_join_p50_ms": round(join_ms[len(join_ms) // 2], 3),
            "sequential_join_p99_ms": round(join_ms[int(0.99 * (len(join_ms) - 1))], 3),
            "members": len(members),
            "tasks_per_member_min_max": [sizes[0], sizes[-1]],
            "group_state": self.describe().state,
        }
        self.report["phases"]["setup"] = out
        log(
            f"  STABLE after {took:.2f}s; {len(members)} members with "
            f"{sizes[0]}-{sizes[-1]} tasks each; "
            f"sequential (1 client) join p50 {out['sequential_join_p50_ms']} ms"
        )
        return out

    def heartbeat_window(
        self,
        name: str,
        kind: str,
        command: dict[str, Any],
        members: list[dict[str, Any]],
        duration_s: float,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """One measured window of the load generators' `command` over `members` (split among
        them), warm-up 1 s: the merged figures of `kind` with CPU, anomalies and tuple writes per
        heartbeat, kept in the report as phase `name`; returns them and the database delta."""
        before = self.stats.settle()
        self.profile_start(name, duration_s + 1)
        results = self.run_all(
            [
                {**command, "members": share, "duration_s": duration_s, "warmup_s": 1.0}
                for share in self.split(members)
            ],
            duration_s + 60,
        )
        cpu = self.profile_stop()
        after = self.stats.settle()
        agg = aggregate(results, [kind])
        agg["cpu_cores"] = cpu
        db = db_delta(before, after)
        agg["errors"] = sum(r["errors"] for r in results)
        agg["db"] = db
        agg["tuple_writes_per_heartbeat"] = db["tuple_writes_excl_leases"] / max(
            agg["total_incl_warmup"], 1
        )
        self.report["phases"][name] = {"aggregate": agg, "processes": strip_samples(results)}
        return agg, db

    def phase_steady(
        self, with_owned: bool, duration_s: float, key: str = "", label: str = "phase 3"
    ) -> dict[str, Any]:
        kind = "steady_owned" if with_owned else "steady"
        name = key or kind
        log(
            f"{label}, {name}: every member heartbeats at its epoch, no field changed"
            + (" (owned list reported, unchanged)" if with_owned else "")
            + f", for {duration_s}s (+1s warm-up)"
        )
        members = [
            {"id": m["id"], "epoch": m["epoch"], "owned": res_json(m["owned"])}
            for m in self.members_now().values()
        ]
        agg, db = self.heartbeat_window(
            name,
            kind,
            {"op": "steady", "group": GROUP, "with_owned": with_owned},
            members,
            duration_s,
        )
        heartbeats = agg["total_incl_warmup"]
        agg["commits_per_heartbeat"] = db["commits_excl_lease_upkeep"] / max(heartbeats, 1)
        agg["raw_commits_per_heartbeat"] = db["commits"] / max(heartbeats, 1)
        if self.describe().state != "STABLE":
            raise RuntimeError("the group left STABLE during steady heartbeats")
        log(
            f"  {agg['rate_per_s']:.0f} heartbeats/s, p50 {agg['p50_ms']} ms, "
            f"p99 {agg['p99_ms']} ms; {heartbeats} heartbeats, {db['commits']} commits "
            f"({db['lease_renewals']} lease renewals: "
            f"{db['lease_upkeep_commits']}), "
            f"{db['tuple_writes_excl_leases']} tuple writes outside leases"
        )
        return agg

    def classic_calls(self, members: int) -> ClassicCalls:
        calls = ClassicCalls(self.address, -(-members // CALLS_PER_CHANNEL))
        self.stack.callback(calls.close)
        return calls

    def parked_joins(self) -> int:
        """coordinator_parked_calls{kind="join"} from the coordinator's metrics endpoint."""
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10
        ) as page:
            for line in page.read().decode().splitlines():
                if line.startswith('coordinator_parked_calls{kind="join"}'):
                    return int(float(line.split()[-1]))
        return 0

    def classic_state(self, group_id: str) -> tuple[str, int]:
        resp = self.stubs.admin.DescribeGroups(
            admin_pb2.DescribeGroupsRequest(group_ids=[group_id]), timeout=30
        )
        return resp.groups[0].state, len(resp.groups[0].members)

    def phase_classic_setup(self) -> dict[str, Any]:
        a = self.args
        log(
            f"phase 5, classic setup: {a.connectors} connectors x {a.tasks} tasks, {a.members} "
            "classic members (ids, one join phase, one SyncGroup each)"
        )
        self.put_catalogue(CLASSIC_GROUP)
        calls = self.classic_calls(a.members)
        started = time.perf_counter()
        self.classic = calls.form(
            CLASSIC_GROUP, "classic", a.members, CLASSIC_SESSION_MS, CLASSIC_REBALANCE_MS
        )
        took = time.perf_counter() - started
        state, size = self.classic_state(CLASSIC_GROUP)
        if state != "STABLE" or size != a.members:
            raise RuntimeError(f"classic group {state} with {size} members after its sync")
        out = {
            "seconds_to_stable": round(took, 3),
            "members": size,
            "generation": self.classic.generation,
        }
        self.report["phases"]["classic_setup"] = out
        log(f"  STABLE after {took:.2f}s at generation {self.classic.generation}")
        return out

    def phase_classic_steady(self, duration_s: float) -> dict[str, Any]:
        log(
            "phase 5, classic_steady: every classic member heartbeats at its generation, "
            f"for {duration_s}s (+1s warm-up)"
        )
        agg, db = self.heartbeat_window(
            "classic_steady",
            "classic_steady",
            {"op": "classic_steady", "group": CLASSIC_GROUP},
            self.classic.as_load(),
            duration_s,
        )
        state, _ = self.classic_state(CLASSIC_GROUP)
        if state != "STABLE" or agg["errors"]:
            raise RuntimeError(
                f"classic group {state} after steady heartbeats, {agg['errors']} anomalies"
            )
        log(
            f"  {agg['rate_per_s']:.0f} classic heartbeats/s, p50 {agg['p50_ms']} ms, "
            f"p99 {agg['p99_ms']} ms; {db['tuple_writes_excl_leases']} tuple writes outside "
            "leases"
        )
        self.classic_calls(1).leave_all(CLASSIC_GROUP, self.classic.ids)
        return agg

    def phase_parked(self) -> dict[str, Any]:
        """Another group's steady heartbeats with 0, then with `--parked` JoinGroups held."""
        a = self.args
        calls = self.classic_calls(a.parked + 1)
        blocker = calls.form(PARKED_GROUP, "blocker", 1, CLASSIC_SESSION_MS, CLASSIC_REBALANCE_MS)
        quiet = self.phase_steady(False, a.parked_s, key="parked_0", label="phase 6")
        log(f"phase 6, parking {a.parked} JoinGroups in {PARKED_GROUP}")
        ids = calls.member_ids(
            PARKED_GROUP, "parked", a.parked, CLASSIC_SESSION_MS, CLASSIC_REBALANCE_MS
        )
        held = calls.rejoin(PARKED_GROUP, ids, CLASSIC_SESSION_MS, CLASSIC_REBALANCE_MS)
        took = wait_for(
            lambda: self.parked_joins() >= a.parked, 30, f"{a.parked} parked JoinGroups"
        )
        log(f"  {self.parked_joins()} JoinGroups parked after {took:.2f}s")
        loaded = self.phase_steady(False, a.parked_s, key="parked_n", label="phase 6")
        parked_after = self.parked_joins()
        answered_early = sum(f.done() for f in held)
        started = time.perf_counter()
        rejoin = calls.rejoin(
            PARKED_GROUP, [blocker.ids[0]], CLASSIC_SESSION_MS, CLASSIC_REBALANCE_MS
        )
        answers = calls.joined(held + rejoin)
        released_s = time.perf_counter() - started
        generations = {x.generation_id for x in answers}
        calls.leave_all(PARKED_GROUP, [*ids, *blocker.ids])
        out = {
            "parked": a.parked,
            "parked_at_end_of_window": parked_after,
            "answered_before_release": answered_early,
            "seconds_to_park": round(took, 3),
            "seconds_release_to_last_answer": round(released_s, 3),
            "generations_answered": sorted(generations),
            "p99_ms_0_parked": quiet["p99_ms"],
            "p99_ms_n_parked": loaded["p99_ms"],
            "rate_0_parked": quiet["rate_per_s"],
            "rate_n_parked": loaded["rate_per_s"],
        }
        self.report["phases"]["parked"] = out
        if answered_early or parked_after < a.parked or len(generations) != 1:
            raise RuntimeError(f"parked JoinGroups not held through the window: {out}")
        log(
            f"  another group's steady p99 {quiet['p99_ms']} ms with 0 parked, "
            f"{loaded['p99_ms']} ms with {a.parked} parked; all {a.parked + 1} answered "
            f"{released_s * 1000:.0f} ms after the last member rejoined"
        )
        return out

    def phase_revocations(self) -> dict[str, Any]:
        a = self.args
        log(
            f"phase 4a, revocations: {a.rounds} rounds; each moves {a.move} tasks from every "
            "member to the next"
        )
        rounds = []
        all_results: list[dict[str, Any]] = []
        totals = {"changed": 0, "window": 0.0, "acks": 0, "ack_window": 0.0, "commits": 0.0}
        for rnd in range(a.rounds):
            # Bump the group epoch: a task count change (DESIGN 3.1), toggled each round.
            count = a.tasks + (1 if rnd % 2 == 0 else 0)
            r = self.stubs.admin.PutConnector(
                admin_pb2.PutConnectorRequest(
                    group_id=GROUP, connector=f"conn-{a.connectors - 1:02d}", task_count=count
                ),
                timeout=30,
            )
            if r.error_code != NONE:
                raise RuntimeError(f"PutConnector: {r.error_code} {r.error_message}")
            previous = self.target
            self.target = self.compute_and_install(
                lambda ids, cat, prev=previous: rotated(
                    {m: prev.get(m, EMPTY) for m in ids}, cat, a.move
                )
            )
            members = [
                {
                    "id": m["id"],
                    "epoch": m["epoch"],
                    "owned": res_json(m["owned"]),
                    "target": res_json(m["target"]),
                }
                for m in self.members_now().values()
            ]
            before = self.stats.settle()
            self.profile_start(f"revocations-{rnd}", 6)
            results = self.run_all(
                [
                    {"op": "revoke", "group": GROUP, "members": share, "deadline_s": 30}
                    for share in self.split(members)
                ],
                90,
            )
            cpu = self.profile_stop()
            after = self.stats.settle()
            all_results.extend(results)
            kinds = ["revocation_delivered", "revocation_acked", "released_delivered"]
            changed = aggregate(results, kinds)
            acks = aggregate(results, ["revocation_acked"])
            db = db_delta(before, after)
            state = self.describe().state
            rounds.append(
                {
                    "round": rnd,
                    "state_changes": changed,
                    "acks": acks,
                    "db": db,
                    "member_rows_written": member_rows(db),
                    "cpu_cores": cpu,
                    "unchanged_heartbeats": aggregate(results, ["unchanged"])["count"],
                    "errors": sum(r["errors"] for r in results),
                    "group_state_after": state,
                }
            )
            totals["changed"] += changed["count"]
            totals["window"] += changed["window_s"]
            totals["acks"] += acks["count"]
            totals["ack_window"] += acks["window_s"]
            totals["commits"] += db["commits_excl_lease_upkeep"]
            log(
                f"  round {rnd}: {changed['count']} state changes in {changed['window_s']}s "
                f"({changed['rate_per_s']:.0f}/s, p50 {changed['p50_ms']} ms, "
                f"p99 {changed['p99_ms']} ms); acks {acks['rate_per_s']:.0f}/s; "
                f"{db['commits']} commits, {member_rows(db)} member rows "
                f"written; group {state}"
            )
            if state != "STABLE":
                raise RuntimeError(f"group {state} after revocation round {rnd}")
        kinds = ["revocation_delivered", "revocation_acked", "released_delivered"]
        merged = aggregate(all_results, kinds)
        ack_merged = aggregate(all_results, ["revocation_acked"])
        out = {
            "state_changes": totals["changed"],
            "rate_per_s": round(totals["changed"] / max(totals["window"], 1e-9), 1),
            "p50_ms": merged["p50_ms"],
            "p99_ms": merged["p99_ms"],
            "acks": totals["acks"],
            "ack_rate_per_s": round(totals["acks"] / max(totals["ack_window"], 1e-9), 1),
            "ack_p50_ms": ack_merged["p50_ms"],
            "ack_p99_ms": ack_merged["p99_ms"],
            "commits_per_state_change": totals["commits"] / max(totals["changed"], 1),
            "rounds": rounds,
        }
        self.report["phases"]["revocations"] = out
        return out

    def phase_joins(self) -> dict[str, Any]:
        a = self.args
        log(
            f"phase 4b, joins: fresh members join (epoch 0, every field) and leave, {a.join_s}s "
            "(+1s warm-up)"
        )
        before = self.stats.settle()
        self.profile_start("joins", a.join_s + 1)
        results = self.run_all(
            [
                {
                    "op": "joinleave",
                    "group": GROUP,
                    "prefix": "fresh",
                    "duration_s": a.join_s,
                    "warmup_s": 1.0,
                    "max_per_thread": 5000,
                }
            ]
            * a.procs,
            a.join_s + 60,
        )
        cpu = self.profile_stop()
        after = self.stats.settle()
        both = aggregate(results, ["join", "leave"])
        joins = aggregate(results, ["join"])
        leaves = aggregate(results, ["leave"])
        db = db_delta(before, after)
        changes = both["total_incl_warmup"]
        out = {
            "rate_per_s": both["rate_per_s"],
            "p50_ms": both["p50_ms"],
            "p99_ms": both["p99_ms"],
            "join": joins,
            "leave": leaves,
            "state_changes_incl_warmup": changes,
            "member_rows_written": member_rows(db),
            "cpu_cores": cpu,
            "db": db,
            "commits_per_state_change": db["commits_excl_lease_upkeep"] / max(changes, 1),
            "tuple_writes_per_state_change": db["tuple_writes_excl_leases"] / max(changes, 1),
            "errors": sum(r["errors"] for r in results),
            "members_after": len(self.describe().members),
            "processes": strip_samples(results),
        }
        self.report["phases"]["joins"] = out
        log(
            f"  {both['rate_per_s']:.0f} joins+leaves/s (joins p50 {joins['p50_ms']} ms p99 "
            f"{joins['p99_ms']} ms; leaves p50 {leaves['p50_ms']} ms p99 {leaves['p99_ms']} ms); "
            f"{db['commits']} commits, {member_rows(db)} member rows written, for {changes} state "
            "changes"
        )
        return out

    # --- profiling (optional) ---

    def profile_start(self, name: str, duration_s: float) -> None:
        """Start measuring a phase: CPU per process group, and py-spy if --profile."""
        self._profiler = None
        self._cpu_before = self.cpu.sample()
        if not self.args.profile:
            return
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        out = RESULTS / f"profile-{name}.txt"
        self._profiler = subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(self.coordinator.proc.pid),
                "--duration",
                str(int(duration_s + 0.999)),
                "--rate",
                "250",
                "--format",
                "raw",
                "--output",
                str(out),
                "--nonblocking",
                "--threads",
                "--gil",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(RESULTS / f"profile-{name}.log", "wb"),  # noqa: SIM115
        )
        time.sleep(0.3)

    def profile_stop(self) -> dict[str, float]:
        cores = CpuMeter.cores(self._cpu_before, self.cpu.sample())
        print("  cpu (cores): " + ", ".join(f"{k} {v}" for k, v in cores.items()), flush=True)
        self.last_cpu = cores
        if self._profiler is not None:
            try:
                self._profiler.wait(30)
            except subprocess.TimeoutExpired:
                self._profiler.terminate()
                self._profiler.wait(5)
        return cores

    # --- report ---

    def figures(self) -> list[dict[str, Any]]:
        p = self.report["phases"]
        first, again = p["ceiling"]["aggregate"], p["ceiling_after"]["aggregate"]
        c_rate = round((first["rate_per_s"] + again["rate_per_s"]) / 2, 1)
        c50 = round((first["p50_ms"] + again["p50_ms"]) / 2, 3)
        c99 = round((first["p99_ms"] + again["p99_ms"]) / 2, 3)
        self.report["baseline"] = {"rate_per_s": c_rate, "p50_ms": c50, "p99_ms": c99}
        rows: list[dict[str, Any]] = []

        def row(
            name: str,
            value: float,
            unit: str,
            baseline: float | None = None,
            aim: str = "-",
            met: bool | None = None,
            kind: str = "rate",
        ) -> None:
            ratio = None
            if baseline:
                ratio = value / baseline
            rows.append(
                {
                    "figure": name,
                    "value": value,
                    "unit": unit,
                    "baseline": baseline,
                    "ratio": ratio,
                    "ratio_kind": kind,
                    "aim": aim,
                    "met": met,
                }
            )

        def rate_row(name: str, value: float, aim: float | None) -> None:
            met = None if aim is None else value >= aim * c_rate
            row(name, value, "/s", c_rate, f">= {aim:.0%} of ceiling" if aim else "-", met)

        db = p["database"]
        many = max(db.values(), key=lambda r: r["clients"])
        row("0 database: durable commits, 1 connection", db["clients_1"]["rate_per_s"], "/s")
        row("0 database: commit p50, 1 connection", db["clients_1"]["p50_ms"], "ms")
        row(f"0 database: durable commits, {many['clients']} connections", many["rate_per_s"], "/s")
        row("1 ceiling: Health/Check calls (mean)", c_rate, "/s", c_rate)
        row("1 ceiling: before setup", first["rate_per_s"], "/s", c_rate)
        row("1 ceiling: after steady phases", again["rate_per_s"], "/s", c_rate)
        row("1 ceiling: p50 latency", c50, "ms", c50, kind="latency")
        row("1 ceiling: p99 latency", c99, "ms", c99, kind="latency")
        s = p["setup"]
        row("2 setup: seconds until STABLE", s["seconds_to_stable"], "s")
        row("2 setup: join p50, 1 client, unloaded", s["sequential_join_p50_ms"], "ms")
        st = p["steady"]["aggregate"]
        rate_row("3 steady heartbeats", st["rate_per_s"], 0.90)
        row("3 steady: p50 latency", st["p50_ms"], "ms", c50, kind="latency")
        row("3 steady: p99 latency", st["p99_ms"], "ms", c99, kind="latency")
        row(
            "3 steady: commits per heartbeat",
            round(st["commits_per_heartbeat"], 5),
            "",
            aim="0",
            met=abs(st["commits_per_heartbeat"]) < 1e-9,
        )
        row(
            "3 steady: tuple writes per heartbeat",
            round(st["tuple_writes_per_heartbeat"], 5),
            "",
            aim="0",
            met=st["tuple_writes_per_heartbeat"] == 0,
        )
        if "steady_owned" in p:
            so = p["steady_owned"]["aggregate"]
            rate_row("3 steady, owned list sent (info)", so["rate_per_s"], None)
            row(
                "3 steady, owned list: writes per hb",
                round(so["tuple_writes_per_heartbeat"], 5),
                "",
                aim="0",
                met=so["tuple_writes_per_heartbeat"] == 0,
            )
        if "classic_steady" in p:
            cs = p["classic_steady"]["aggregate"]
            row(
                "5 classic setup: seconds until STABLE",
                p["classic_setup"]["seconds_to_stable"],
                "s",
            )
            connect_share = st["rate_per_s"] / c_rate
            row(
                "5 classic steady heartbeats",
                cs["rate_per_s"],
                "/s",
                c_rate,
                f">= {connect_share - 0.05:.1%} (3's share - 5 points)",
                cs["rate_per_s"] / c_rate >= connect_share - 0.05,
            )
            row("5 classic steady: p50 latency", cs["p50_ms"], "ms", c50, kind="latency")
            row("5 classic steady: p99 latency", cs["p99_ms"], "ms", c99, kind="latency")
            row(
                "5 classic steady: tuple writes per hb",
                round(cs["tuple_writes_per_heartbeat"], 5),
                "",
                aim="0",
                met=cs["tuple_writes_per_heartbeat"] == 0,
            )
        if "parked" in p:
            pk = p["parked"]
            n = pk["parked"]
            row("6 another group's steady p99, 0 parked", pk["p99_ms_0_parked"], "ms")
            row(
                f"6 another group's steady p99, {n} parked",
                pk["p99_ms_n_parked"],
                "ms",
                pk["p99_ms_0_parked"],
                "<= x1.25 of 0 parked",
                pk["p99_ms_n_parked"] <= 1.25 * pk["p99_ms_0_parked"],
                kind="latency",
            )
            row(
                f"6 another group's steady rate, {n} parked",
                pk["rate_n_parked"],
                "/s",
                pk["rate_0_parked"],
                ">= 90% of 0 parked",
                pk["rate_n_parked"] >= 0.9 * pk["rate_0_parked"],
            )
            row(
                f"6 all {n + 1} answered after the rejoin",
                pk["seconds_release_to_last_answer"],
                "s",
            )
        rv = p["revocations"]
        rate_row("4 revocation rounds: state changes", rv["rate_per_s"], 0.50)
        row("4 revocation rounds: p50 latency", rv["p50_ms"], "ms", c50, kind="latency")
        row("4 revocation rounds: p99 latency", rv["p99_ms"], "ms", c99, kind="latency")
        rate_row("4 revocation acks (info)", rv["ack_rate_per_s"], None)
        row("4 revocation acks: p50 latency", rv["ack_p50_ms"], "ms", c50, kind="latency")
        row("4 revocation acks: p99 latency", rv["ack_p99_ms"], "ms", c99, kind="latency")
        row(
            "4 revocations: commits/change (w/ pings)",
            round(rv["commits_per_state_change"], 3),
            "",
            aim="1 (one transaction)",
            met=rv["commits_per_state_change"] <= 1.0 + 1e-9,
        )
        loads = [first, again, st, p["joins"], *rv["rounds"]]
        others = [
            x["cpu_cores"]["other_processes"] + x["cpu_cores"].get("steal", 0.0)
            for x in loads
            if "cpu_cores" in x
        ]
        self.report["other_processes_cores_avg"] = round(sum(others) / max(len(others), 1), 2)
        j = p["joins"]
        rate_row("4 joins+leaves", j["rate_per_s"], 0.50)
        row("4 joins: p50 latency", j["join"]["p50_ms"], "ms", c50, kind="latency")
        row("4 joins: p99 latency", j["join"]["p99_ms"], "ms", c99, kind="latency")
        row("4 leaves: p50 latency", j["leave"]["p50_ms"], "ms", c50, kind="latency")
        row("4 leaves: p99 latency", j["leave"]["p99_ms"], "ms", c99, kind="latency")
        row(
            "4 joins+leaves: commits/change (w/ pings)",
            round(j["commits_per_state_change"], 3),
            "",
            aim="1 (one transaction)",
            met=j["commits_per_state_change"] <= 1.0 + 1e-9,
        )
        row(
            "machine: other processes + steal (avg)",
            self.report["other_processes_cores_avg"],
            "cores",
            aim="~0 (quiet machine)",
            met=self.report["other_processes_cores_avg"] < 0.2,
        )
        return rows

    def print_table(self, rows: list[dict[str, Any]]) -> None:
        def fmt(v: float | None, unit: str = "") -> str:
            if v is None:
                return "-"
            if unit == "/s":
                return f"{v:,.0f}/s"
            if unit == "ms":
                return f"{v:.3f} ms"
            if unit == "s":
                return f"{v:.2f} s"
            if unit == "cores":
                return f"{v:.2f} cores"
            return f"{v:g}"

        header = ("figure", "value", "baseline (ceiling*)", "ratio", "aim", "met")
        lines = []
        for r in rows:
            ratio = "-"
            if r["ratio"] is not None:
                ratio = f"{r['ratio']:.1%}" if r["ratio_kind"] == "rate" else f"x{r['ratio']:.2f}"
            met = "-" if r["met"] is None else ("met" if r["met"] else "NOT MET")
            lines.append(
                (
                    r["figure"],
                    fmt(r["value"], r["unit"]),
                    fmt(r["baseline"], r["unit"]),
                    ratio,
                    r["aim"],
                    met,
                )
            )
        widths = [max(len(str(x[i])) for x in [header, *lines]) for i in range(len(header))]
        sep = "-+-".join("-" * w for w in widths)

        def show(cells: tuple[str, ...]) -> str:
            return " | ".join(
                c.ljust(w) if i in (0, 4, 5) else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )

        print()
        a = self.args
        print(
            f"Coordinator benchmark ({self.report['run']['started']}): one group, "
            f"{a.members} members, "
            f"{a.connectors} connectors x {a.tasks} tasks; load: {a.procs} processes x {a.threads} "
            f"threads, one gRPC channel each; PostgreSQL {self.pg_settings['server_version']} "
            f"fsync={self.pg_settings['fsync']} "
            f"synchronous_commit={self.pg_settings['synchronous_commit']}"
        )
        print(show(header))
        print(sep)
        for line in lines:
            print(show(line))
        print("* phase 6's rows compare with the same figure with no call parked")
        print()


def git_state() -> dict[str, Any]:
    def run(*cmd: str) -> str:
        try:
            return subprocess.run(
                cmd, cwd=REPO, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except OSError:
            return ""

    import hashlib

    digest = hashlib.sha256()
    for path in sorted((REPO / "coordinator_svc").rglob("*.py")):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return {
        "commit": run("git", "rev-parse", "HEAD"),
        "dirty": bool(run("git", "status", "--porcelain", "--", "coordinator_svc")),
        "coordinator_svc_sha256": digest.hexdigest()[:16],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="coordinator benchmark driver")
    parser.add_argument("--procs", type=int, default=int(os.environ.get("BENCH_PROCS", 2)))
    parser.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", 6)))
    parser.add_argument("--members", type=int, default=200)
    parser.add_argument("--connectors", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=100, help="tasks per connector")
    parser.add_argument("--ceiling-s", type=float, default=6.0)
    parser.add_argument("--db-s", type=float, default=2.0, help="database baseline, per step")
    parser.add_argument("--steady-s", type=float, default=10.0)
    parser.add_argument("--steady-owned-s", type=float, default=5.0, help="0 to skip")
    parser.add_argument("--rounds", type=int, default=3, help="revocation rounds")
    parser.add_argument("--move", type=int, default=2, help="tasks each member gives up per round")
    parser.add_argument("--join-s", type=float, default=6.0)
    parser.add_argument(
        "--parked", type=int, default=500, help="JoinGroups held in phase 6 (0 to skip it)"
    )
    parser.add_argument(
        "--parked-s", type=float, default=8.0, help="each of phase 6's two windows (< 20 s)"
    )
    parser.add_argument(
        "--no-classic",
        action="store_true",
        help="skip phases 5 and 6 (a --serve-command build from before classic groups)",
    )
    parser.add_argument("--session-timeout-ms", type=int, default=60_000)
    parser.add_argument("--lease-ms", type=int, default=10_000, help="coordinator --lease-ms")
    parser.add_argument("--log-level", default="INFO", help="coordinator --log-level")
    parser.add_argument(
        "--pg-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra PostgreSQL setting (diagnostics, e.g. log_statement=all)",
    )
    parser.add_argument(
        "--serve-command",
        default="",
        help="command run as `<it> serve ...` instead of .venv/bin/coordinator-svc "
        "(experiments: a patched build, a wrapper)",
    )
    parser.add_argument(
        "--skip-state-changes",
        action="store_true",
        help="stop after the steady phases (experiments; no table)",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the coordinator per phase")
    parser.add_argument("--state-dir", default="", help="(for run-coordinator's exit trap)")
    parser.add_argument("--output", default=str(RESULTS / "coordinator-latest.json"))
    args = parser.parse_args()

    if args.profile:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(py_spy).exists():
            parser.error(
                "--profile needs py-spy: ./bench/run-coordinator --install-py-spy --profile"
            )

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    started = time.time()
    with ExitStack() as stack:
        bench = Bench(args, stack)
        bench.report["run"] = {
            "started": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "grpcio": grpc.__version__,
                "platform": platform.platform(),
            },
            "git": git_state(),
            "config": {k: v for k, v in vars(args).items() if k not in ("state_dir", "output")},
        }
        bench.start()
        bench.report["run"]["postgres"] = bench.pg_settings
        bench.phase_database()
        bench.phase_ceiling()
        bench.phase_setup()
        bench.calibrate()
        bench.phase_steady(False, args.steady_s)
        if args.steady_owned_s > 0:
            bench.phase_steady(True, args.steady_owned_s)
        if not args.no_classic:
            bench.phase_classic_setup()
            bench.phase_classic_steady(args.steady_s)
        bench.phase_ceiling("ceiling_after")
        if not args.no_classic and args.parked > 0:
            bench.phase_parked()
        if args.skip_state_changes:
            rows = []
        else:
            bench.phase_revocations()
            bench.phase_joins()
            rows = bench.figures()
        bench.report["figures"] = rows
        bench.report["run"]["seconds"] = round(time.time() - started, 1)
        bench.report["run"]["profiled"] = args.profile
        bench.print_table(rows)
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(bench.report, indent=2, default=str) + "\n")
        log(
            f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}; coordinator log: "
            f"{(RESULTS / 'coordinator.log').relative_to(REPO)}"
        )
        log("stopping the coordinator, the load generators and PostgreSQL")
    log(f"done in {time.time() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
