#!/usr/bin/env python3
"""Server model benchmark: grpc.aio against the synchronous thread-pool server (bench/README.md).

One command, `./bench/run-server-model` (this module's `--help` lists every knob). In one run, on
127.0.0.1 only, it starts in turn, each as its own subprocess of this module:

  sync  `grpc.server(futures.ThreadPoolExecutor(max_workers=32))`, as the coordinator builds it;
  aio   `grpc.aio.server()` with coroutine handlers.

Both serve the standard health service (`grpc_health.v1`; for aio its asyncio servicer) and a
unary method `/bench.servermodel.v1.ServerModel/Work` on raw bytes (no protobuf codegen) that runs
the same ~25 us of pure Python (`cpu_work`: a loop building a small dict, calibrated at start-up),
like the coordinator's steady heartbeat handler; aio calls it straight in the coroutine.

Each server is driven, per method (Health/Check, Work), by two load shapes, each from separate
client processes (subprocesses of this module too), closed loop, a warm-up then a measured window
that all processes share (absolute wall-clock times sent by the driver):

  threads   2 processes x 6 threads, each thread its own channel (own TCP connection);
  inflight  200 calls in flight at all times: 2 asyncio processes (grpc.aio) x 100 coroutines over
            4 channels each; beyond the sync server's 32 workers, calls wait in its queue.

The driver samples the server's CPU time (/proc/<pid>/stat, every thread) and the clients' and the
machine's (/proc/stat) at the window's edges, prints a table (calls/s, spread of the per-second
rate, p50, p99, server CPU seconds per 1,000 calls, ...) and a conclusion computed from the
figures, and writes bench/results/server-model-latest.json. Everything it starts is stopped on
exit; children also die with the driver (PR_SET_PDEATHSIG) and every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import math
import os
import platform
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
import timeit
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
RESULTS_JSON = RESULTS_DIR / "server-model-latest.json"
CHILD_LOG = RESULTS_DIR / "server-model-children.log"

WORK_SERVICE = "bench.servermodel.v1.ServerModel"
METHODS = {
    "health": "/grpc.health.v1.Health/Check",
    "work": f"/{WORK_SERVICE}/Work",
}
MODELS = ("sync", "aio")
SHAPES = ("threads", "inflight")
SYNC_WORKERS = 32
WORK_PAYLOAD = bytes(range(64))  # about a steady heartbeat's size
HEALTH_REQUEST = health_pb2.HealthCheckRequest().SerializeToString()  # b"": service ""
RPC_TIMEOUT_S = 10.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1
SERVER_MAX_LIFETIME_S = 600.0
DISTURBED_CORES = 0.25  # CPU used by other processes in a window above which a cell is flagged


# --------------------------------------------------------------------------------------------
# The work both servers do


def cpu_work(request: bytes, iters: int) -> bytes:
    """Pure Python, no I/O: `iters` small dicts built and read, like a steady heartbeat's
    bookkeeping. The same function in both servers."""
    total = 0
    size = len(request)
    for i in range(iters):
        fields = {"member": i, "epoch": i + 1, "error": 0, "size": size}
        total += fields["epoch"] - fields["member"]
    return b"%d" % total


def time_work_us(iters: int, number: int = 1000, repeat: int = 5) -> float:
    """Best-of-`repeat` time of one `cpu_work` call, microseconds."""
    best = min(timeit.repeat(lambda: cpu_work(WORK_PAYLOAD, iters), number=number, repeat=repeat))
    return best / number * 1e6


def calibrate_iters(target_us: float) -> int:
    per_iter_us = (time_work_us(400) - time_work_us(0)) / 400
    return max(1, round(target_us / per_iter_us))


# --------------------------------------------------------------------------------------------
# Children: shared helpers


def die_with_parent(parent_pid: int) -> None:
    """SIGTERM this process when the driver dies, however it dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:  # the driver died before prctl
        sys.exit(1)


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def read_cpu_s(pid: int) -> float:
    """utime + stime of every thread of `pid`, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def read_machine_busy_s() -> float:
    """CPU seconds the whole machine spent outside idle and iowait."""
    parts = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = parts
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


# --------------------------------------------------------------------------------------------
# Child: the servers


def work_handler_sync(iters: int) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    def work(request: bytes, context: grpc.ServicerContext) -> bytes:
        return cpu_work(request, iters)

    return work


def serve_sync(iters: int, workers: int, stop: threading.Event) -> None:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc"),
        options=[("grpc.so_reuseport", 0)],
    )
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                WORK_SERVICE,
                {"Work": grpc.unary_unary_rpc_method_handler(work_handler_sync(iters))},
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    emit({"ready": True, "port": port, "pid": os.getpid(), "health": "grpc_health.v1.health"})
    stop.wait(SERVER_MAX_LIFETIME_S)
    server.stop(grace=1).wait(5)


class _AsyncHealthCheck:
    """Fallback when grpc_health has no asyncio servicer: Health/Check only, on raw bytes."""

    SERVING: bytes = health_pb2.HealthCheckResponse(
        status=health_pb2.HealthCheckResponse.SERVING
    ).SerializeToString()

    async def check(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        return self.SERVING


async def serve_aio(iters: int, stop_thread: threading.Event) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    threading.Thread(
        target=lambda: (stop_thread.wait(), loop.call_soon_threadsafe(stop.set)), daemon=True
    ).start()

    async def work(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        return cpu_work(request, iters)

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    try:
        from grpc_health.v1.health import aio as health_aio

        health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
        health_impl = "grpc_health.v1.health.aio"
    except ImportError:
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "grpc.health.v1.Health",
                    {"Check": grpc.unary_unary_rpc_method_handler(_AsyncHealthCheck().check)},
                ),
            )
        )
        health_impl = "hand-written async Health/Check"
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                WORK_SERVICE, {"Work": grpc.unary_unary_rpc_method_handler(work)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    emit({"ready": True, "port": port, "pid": os.getpid(), "health": health_impl})
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), SERVER_MAX_LIFETIME_S)
    await server.stop(grace=1)


def child_serve(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="server_model_bench _serve")
    p.add_argument("--model", choices=MODELS, required=True)
    p.add_argument("--iters", type=int, required=True)
    p.add_argument("--workers", type=int, default=SYNC_WORKERS)
    p.add_argument("--parent-pid", type=int, required=True)
    a = p.parse_args(argv)
    die_with_parent(a.parent_pid)
    stop = threading.Event()

    def stdin_watch() -> None:  # the driver closes our stdin to stop us
        sys.stdin.read()
        stop.set()

    threading.Thread(target=stdin_watch, daemon=True).start()
    if a.model == "sync":
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        serve_sync(a.iters, a.workers, stop)
    else:
        asyncio.run(serve_aio(a.iters, stop))
    return 0


# --------------------------------------------------------------------------------------------
# Child: the load generators


@dataclass
class Tally:
    """What one load process saw in the measured window."""

    window_start: float
    window_end: float
    samples_us: list[int] = field(default_factory=list)
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    buckets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.buckets = [0] * max(1, math.ceil(self.window_end - self.window_start))

    def record(self, done_wall: float, latency_s: float, error: str | None) -> None:
        if not self.window_start <= done_wall < self.window_end:
            return
        if error is not None:
            self.errors += 1
            self.error_kinds[error] = self.error_kinds.get(error, 0) + 1
            return
        self.samples_us.append(int(latency_s * 1e6))
        self.buckets[min(len(self.buckets) - 1, int(done_wall - self.window_start))] += 1

    def merge(self, other: Tally) -> None:
        self.samples_us.extend(other.samples_us)
        self.errors += other.errors
        for k, v in other.error_kinds.items():
            self.error_kinds[k] = self.error_kinds.get(k, 0) + v
        self.buckets = [x + y for x, y in zip(self.buckets, other.buckets, strict=True)]

    def as_json(self) -> dict[str, Any]:
        return {
            "count": len(self.samples_us),
            "errors": self.errors,
            "error_kinds": self.error_kinds,
            "buckets": self.buckets,
            "samples_us": self.samples_us,
        }


def request_for(method: str) -> bytes:
    return HEALTH_REQUEST if method == "health" else WORK_PAYLOAD


def check_answer(method: str, answer: bytes) -> None:
    if method == "health":
        status = health_pb2.HealthCheckResponse.FromString(answer).status
        if status != health_pb2.HealthCheckResponse.SERVING:
            raise RuntimeError(f"health answered {status}")
    elif not answer:
        raise RuntimeError("empty Work answer")


def read_start() -> tuple[float, float, float]:
    """The driver's go: (start, window start, window end), wall clock."""
    line = sys.stdin.readline()
    if not line:
        sys.exit(1)
    go = json.loads(line)
    start = float(go["start"])
    window_start = start + float(go["warmup_s"])
    return start, window_start, window_start + float(go["duration_s"])


CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]  # one TCP connection per channel


def client_threads(target: str, method: str, threads: int) -> None:
    channels = [grpc.insecure_channel(target, options=CHANNEL_OPTIONS) for _ in range(threads)]
    try:
        for ch in channels:
            grpc.channel_ready_future(ch).result(timeout=20)
        calls = [ch.unary_unary(METHODS[method]) for ch in channels]
        request = request_for(method)
        for call in calls:
            check_answer(method, call(request, timeout=RPC_TIMEOUT_S))
        emit({"ready": True, "pid": os.getpid()})
        start, ws, we = read_start()
        tallies = [Tally(ws, we) for _ in calls]

        def loop(call: grpc.UnaryUnaryMultiCallable, tally: Tally) -> None:
            time.sleep(max(0.0, start - time.time()))
            while True:
                t0 = time.perf_counter()
                error: str | None = None
                try:
                    call(request, timeout=RPC_TIMEOUT_S)
                except grpc.RpcError as e:
                    error = str(e.code())
                done = time.time()
                tally.record(done, time.perf_counter() - t0, error)
                if done >= we:
                    return

        workers = [
            threading.Thread(target=loop, args=(c, t), daemon=True)
            for c, t in zip(calls, tallies, strict=True)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join(max(0.1, we - time.time() + RPC_TIMEOUT_S + 2))
        total = Tally(ws, we)
        for t in tallies:
            total.merge(t)
        emit({"result": total.as_json(), "pid": os.getpid()})
    finally:
        for ch in channels:
            ch.close()


async def client_inflight(target: str, method: str, inflight: int, n_channels: int) -> None:
    channels = [
        grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) for _ in range(n_channels)
    ]
    try:
        for ch in channels:
            await asyncio.wait_for(ch.channel_ready(), 20)
        calls = [ch.unary_unary(METHODS[method]) for ch in channels]
        request = request_for(method)
        for call in calls:
            check_answer(method, await call(request, timeout=RPC_TIMEOUT_S))
        emit({"ready": True, "pid": os.getpid()})
        start, ws, we = await asyncio.get_running_loop().run_in_executor(None, read_start)
        tally = Tally(ws, we)

        async def one(call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]) -> None:
            await asyncio.sleep(max(0.0, start - time.time()))
            while True:
                t0 = time.perf_counter()
                error: str | None = None
                try:
                    await call(request, timeout=RPC_TIMEOUT_S)
                except grpc.aio.AioRpcError as e:
                    error = str(e.code())
                done = time.time()
                tally.record(done, time.perf_counter() - t0, error)
                if done >= we:
                    return

        await asyncio.wait_for(
            asyncio.gather(*(one(calls[i % len(calls)]) for i in range(inflight))),
            we - time.time() + RPC_TIMEOUT_S + 2,
        )
        emit({"result": tally.as_json(), "pid": os.getpid()})
    finally:
        for ch in channels:
            await ch.close()


def child_load(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="server_model_bench _load")
    p.add_argument("--target", required=True)
    p.add_argument("--method", choices=tuple(METHODS), required=True)
    p.add_argument("--shape", choices=SHAPES, required=True)
    p.add_argument("--threads", type=int, default=6)
    p.add_argument("--inflight", type=int, default=100)
    p.add_argument("--channels", type=int, default=4)
    p.add_argument("--parent-pid", type=int, required=True)
    a = p.parse_args(argv)
    die_with_parent(a.parent_pid)
    if a.shape == "threads":
        client_threads(a.target, a.method, a.threads)
    else:
        asyncio.run(client_inflight(a.target, a.method, a.inflight, a.channels))
    return 0


# --------------------------------------------------------------------------------------------
# Driver


class Child:
    """A subprocess of this module speaking JSON lines on stdin/stdout; stderr to the log."""

    def __init__(self, role: str, args: Sequence[str], log: TextIO, label: str) -> None:
        log.write(f"\n===== {label} ({time.strftime('%H:%M:%S')}) =====\n")
        log.flush()
        self.label = label
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.server_model_bench",
                role,
                *args,
                "--parent-pid",
                str(os.getpid()),
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def expect(self, key: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"{self.label}: no {key!r} within {timeout_s:.0f} s") from None
            if line is None:
                raise RuntimeError(
                    f"{self.label}: exited ({self.proc.poll()}) before {key!r}; see {CHILD_LOG}"
                )
            with contextlib.suppress(json.JSONDecodeError):
                obj: dict[str, Any] = json.loads(line)
                if key in obj:
                    return obj

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(3)


@dataclass
class Config:
    warmup_s: float
    duration_s: float
    procs: int
    threads: int
    inflight: int
    inflight_procs: int
    inflight_channels: int
    iters: int
    work_us: float
    models: tuple[str, ...]
    methods: tuple[str, ...]
    shapes: tuple[str, ...]


def percentile(sorted_values: Sequence[int], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def run_cell(
    cfg: Config,
    server: Child,
    server_pid: int,
    target: str,
    method: str,
    shape: str,
    log: TextIO,
    children: list[Child],
) -> dict[str, Any]:
    """One (server model, method, load shape): start the load processes, measure, merge."""
    if shape == "threads":
        n, extra = cfg.procs, ["--threads", str(cfg.threads)]
        concurrency = cfg.procs * cfg.threads
    else:
        n = cfg.inflight_procs
        per = [cfg.inflight // n + (1 if i < cfg.inflight % n else 0) for i in range(n)]
        concurrency = sum(per)
    loads: list[Child] = []
    for i in range(n):
        if shape == "inflight":
            extra = ["--inflight", str(per[i]), "--channels", str(cfg.inflight_channels)]
        child = Child(
            "_load",
            ["--target", target, "--method", method, "--shape", shape, *extra],
            log,
            f"load {server.label} {method} {shape} #{i}",
        )
        loads.append(child)
        children.append(child)
    try:
        pids = [int(c.expect("ready", 30)["pid"]) for c in loads]
        start = time.time() + 0.3
        ws = start + cfg.warmup_s
        we = ws + cfg.duration_s
        for c in loads:
            c.send({"start": start, "warmup_s": cfg.warmup_s, "duration_s": cfg.duration_s})
        time.sleep(max(0.0, ws - time.time()))
        srv0, cli0, mach0, t0 = (
            read_cpu_s(server_pid),
            sum(read_cpu_s(p) for p in pids),
            read_machine_busy_s(),
            time.time(),
        )
        time.sleep(max(0.0, we - time.time()))
        srv1, cli1, mach1, t1 = (
            read_cpu_s(server_pid),
            sum(read_cpu_s(p) for p in pids),
            read_machine_busy_s(),
            time.time(),
        )
        results = [c.expect("result", cfg.duration_s + RPC_TIMEOUT_S + 15)["result"] for c in loads]
    finally:
        for c in loads:
            c.stop()
            children.remove(c)
    samples = sorted(s for r in results for s in r["samples_us"])
    buckets = [sum(col) for col in zip(*(r["buckets"] for r in results), strict=True)]
    count = len(samples)
    sampled_s = max(1e-9, t1 - t0)
    server_cpu = srv1 - srv0
    client_cpu = cli1 - cli0
    others = (mach1 - mach0) - server_cpu - client_cpu
    rate = count / cfg.duration_s
    spread = statistics.pstdev(buckets) / statistics.mean(buckets) if sum(buckets) else math.nan
    errors: dict[str, int] = {}
    for r in results:
        for k, v in r["error_kinds"].items():
            errors[k] = errors.get(k, 0) + v
    return {
        "model": server.label,
        "method": method,
        "shape": shape,
        "concurrency": concurrency,
        "load_processes": n,
        "calls": count,
        "errors": sum(r["errors"] for r in results),
        "error_kinds": errors,
        "calls_per_s": round(rate, 1),
        "per_second_rates": buckets,
        "rate_cv": round(spread, 4),
        "p50_ms": round(percentile(samples, 0.50) / 1000, 3),
        "p90_ms": round(percentile(samples, 0.90) / 1000, 3),
        "p99_ms": round(percentile(samples, 0.99) / 1000, 3),
        "max_ms": round(samples[-1] / 1000, 3) if samples else None,
        "server_cpu_s": round(server_cpu, 3),
        "server_cpu_s_per_1k_calls": round(server_cpu / count * 1000, 4) if count else None,
        "server_cores": round(server_cpu / sampled_s, 3),
        "client_cores": round(client_cpu / sampled_s, 3),
        "other_cores": round(others / sampled_s, 3),
    }


def run_model(cfg: Config, model: str, log: TextIO, children: list[Child]) -> list[dict[str, Any]]:
    server = Child(
        "_serve",
        ["--model", model, "--iters", str(cfg.iters), "--workers", str(SYNC_WORKERS)],
        log,
        model,
    )
    children.append(server)
    cells: list[dict[str, Any]] = []
    try:
        ready = server.expect("ready", 30)
        target = f"127.0.0.1:{ready['port']}"
        print(
            f"  {model}: server pid {ready['pid']} on {target}, health {ready['health']}",
            flush=True,
        )
        for method in cfg.methods:
            for shape in cfg.shapes:
                cell = run_cell(
                    cfg, server, int(ready["pid"]), target, method, shape, log, children
                )
                cell["server_health_impl"] = ready["health"]
                cells.append(cell)
                print("  " + row(cell), flush=True)
    finally:
        server.stop(timeout_s=8)
        children.remove(server)
    return cells


HEADER = (
    f"{'model':<5} | {'method':<6} | {'load':<16} | {'calls/s':>8} | {'+-/s':>4} | "
    f"{'p50 ms':>7} | {'p99 ms':>7} | {'srv CPU s/1k':>12} | {'srv cores':>9} | "
    f"{'clients':>7} | {'others':>6} | err"
)


def shape_label(cell: dict[str, Any]) -> str:
    if cell["shape"] == "threads":
        return f"{cell['load_processes']}p x threads={cell['concurrency']}"
    return f"aio inflight={cell['concurrency']}"


def row(c: dict[str, Any]) -> str:
    per1k = c["server_cpu_s_per_1k_calls"]
    return (
        f"{c['model']:<5} | {c['method']:<6} | {shape_label(c):<16} | {c['calls_per_s']:>8,.0f} | "
        f"{c['rate_cv'] * 100:>3.0f}% | {c['p50_ms']:>7.2f} | {c['p99_ms']:>7.2f} | "
        f"{(per1k if per1k is not None else math.nan):>12.4f} | {c['server_cores']:>9.2f} | "
        f"{c['client_cores']:>7.2f} | {c['other_cores']:>6.2f} | {c['errors']}"
    )


def compare(cells: list[dict[str, Any]], cfg: Config) -> dict[str, Any]:
    """aio against sync per (method, shape), and overall; computed, never assumed."""
    by_key = {(c["model"], c["method"], c["shape"]): c for c in cells}
    pairs: list[dict[str, Any]] = []
    for method in cfg.methods:
        for shape in cfg.shapes:
            s, a = by_key.get(("sync", method, shape)), by_key.get(("aio", method, shape))
            if not s or not a or not s["calls"] or not a["calls"]:
                continue
            # Noise band of the ratio of the two window means: 2 standard errors from the spread
            # of the per-second rates inside both windows, and at least 5 % (the drift between
            # windows of a shared 2-core machine, which that spread does not see).
            n = min(len(s["per_second_rates"]), len(a["per_second_rates"]))
            band = max(0.05, 2 * math.hypot(s["rate_cv"], a["rate_cv"]) / math.sqrt(n))
            ratio = a["calls_per_s"] / s["calls_per_s"]
            if ratio > 1 + band:
                verdict = "aio faster"
            elif ratio < 1 / (1 + band):
                verdict = "sync faster"
            else:
                verdict = "no clear difference"
            pairs.append(
                {
                    "method": method,
                    "shape": shape,
                    "rate_ratio_aio_over_sync": round(ratio, 3),
                    "p50_ratio_aio_over_sync": round(a["p50_ms"] / s["p50_ms"], 3),
                    "p99_ratio_aio_over_sync": round(a["p99_ms"] / s["p99_ms"], 3),
                    "cpu_per_call_ratio_aio_over_sync": round(
                        a["server_cpu_s_per_1k_calls"] / s["server_cpu_s_per_1k_calls"], 3
                    ),
                    "noise_band": round(band, 3),
                    "others_cores_max": max(s["other_cores"], a["other_cores"]),
                    "verdict": verdict,
                }
            )
    if not pairs:
        return {"pairs": [], "summary": "no comparable cells"}

    def geo(key: str) -> float:
        return math.exp(statistics.mean(math.log(p[key]) for p in pairs))

    g_rate, g_p99, g_cpu = (
        geo("rate_ratio_aio_over_sync"),
        geo("p99_ratio_aio_over_sync"),
        geo("cpu_per_call_ratio_aio_over_sync"),
    )
    wins = {
        v: sum(p["verdict"] == v for p in pairs)
        for v in ("aio faster", "sync faster", "no clear difference")
    }
    mean_band = statistics.mean(p["noise_band"] for p in pairs)
    if g_rate > 1 + mean_band:
        overall = f"grpc.aio is faster: {pct(g_rate)} calls/s"
    elif g_rate < 1 / (1 + mean_band):
        overall = f"the sync thread-pool server is faster: aio has {pct(g_rate)} calls/s"
    else:
        overall = (
            f"no clear winner on throughput: aio {pct(g_rate)} calls/s, inside the "
            f"noise band (+-{mean_band * 100:.0f} %)"
        )
    lines = [
        f"{overall} (geometric mean over {len(pairs)} cells; per cell: "
        f"{wins['aio faster']} aio faster, {wins['sync faster']} sync faster, "
        f"{wins['no clear difference']} no clear difference).",
        f"Latency: aio p99 {pct(g_p99)} (geomean); server CPU per call: aio {pct(g_cpu)}.",
    ]
    work = [p for p in pairs if p["method"] == "work"]
    if work:
        g_work = math.exp(statistics.mean(math.log(p["rate_ratio_aio_over_sync"]) for p in work))
        lines.append(
            f"Work (the heartbeat-like method): aio {pct(g_work)} calls/s (geomean over "
            f"{len(work)} load shape(s))."
        )
    disturbed = [p for p in pairs if p["others_cores_max"] > DISTURBED_CORES]
    if disturbed:
        lines.append(
            f"CAUTION: other processes used > {DISTURBED_CORES} cores during "
            + ", ".join(f"{p['method']}/{p['shape']}" for p in disturbed)
            + " (column 'others'); rerun if the verdict hinges on those cells."
        )
    for p in pairs:
        lines.append(
            f"  {p['method']:<6} {p['shape']:<8}: "
            f"aio/sync calls/s x{p['rate_ratio_aio_over_sync']:.2f}"
            f", p50 x{p['p50_ratio_aio_over_sync']:.2f}, p99 x{p['p99_ratio_aio_over_sync']:.2f}"
            f", CPU/call x{p['cpu_per_call_ratio_aio_over_sync']:.2f}"
            f"  -> {p['verdict']} (band +-{p['noise_band'] * 100:.0f} %)"
            + (" [disturbed]" if p["others_cores_max"] > DISTURBED_CORES else "")
        )
    return {
        "pairs": pairs,
        "geomean_rate_ratio_aio_over_sync": round(g_rate, 3),
        "geomean_p99_ratio_aio_over_sync": round(g_p99, 3),
        "geomean_cpu_per_call_ratio_aio_over_sync": round(g_cpu, 3),
        "summary": "\n".join(lines),
    }


def pct(ratio: float) -> str:
    """x1.23 -> '+23 %' (relative to sync)."""
    return f"{(ratio - 1) * 100:+.0f} %"


def drive(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="./bench/run-server-model",
        description=(
            "Measure grpc.aio against the synchronous ThreadPoolExecutor(32) gRPC server: "
            "health and a ~25 us CPU-work unary method, closed-loop threads and 200 in-flight "
            "calls, on 127.0.0.1. Prints a table and a computed conclusion; writes "
            f"{RESULTS_JSON.relative_to(ROOT)}. Child stderr goes to "
            f"{CHILD_LOG.relative_to(ROOT)}. About 75 s with the defaults."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--duration", type=float, default=5.0, help="measured window per cell, s")
    p.add_argument("--warmup", type=float, default=1.0, help="warm-up per cell, s")
    p.add_argument("--procs", type=int, default=2, help="load processes, 'threads' shape")
    p.add_argument(
        "--threads",
        type=int,
        default=6,
        help="threads (one channel each) per load process, 'threads' shape",
    )
    p.add_argument(
        "--inflight", type=int, default=200, help="calls kept in flight in total, 'inflight' shape"
    )
    p.add_argument(
        "--inflight-procs", type=int, default=2, help="asyncio load processes sharing --inflight"
    )
    p.add_argument(
        "--inflight-channels",
        type=int,
        default=4,
        help="grpc.aio channels per asyncio load process",
    )
    p.add_argument(
        "--work-us",
        type=float,
        default=25.0,
        help="target CPU time of the Work handler; iterations calibrated to it",
    )
    p.add_argument(
        "--work-iters",
        type=int,
        default=0,
        help="fixed loop iterations of the Work handler (0: calibrate to --work-us)",
    )
    p.add_argument("--models", default=",".join(MODELS), help="subset/order of sync,aio")
    p.add_argument("--methods", default=",".join(METHODS), help="subset of health,work")
    p.add_argument("--shapes", default=",".join(SHAPES), help="subset of threads,inflight")
    p.add_argument("--output", type=Path, default=RESULTS_JSON, help="JSON results file")
    a = p.parse_args(argv)

    def pick(value: str, allowed: Sequence[str], name: str) -> tuple[str, ...]:
        items = tuple(v.strip() for v in value.split(",") if v.strip())
        bad = [v for v in items if v not in allowed]
        if bad or not items:
            p.error(f"--{name}: {bad or value!r} not in {','.join(allowed)}")
        return items

    if (
        min(a.duration, a.procs, a.threads, a.inflight, a.inflight_procs, a.inflight_channels) <= 0
        or a.warmup < 0
    ):
        p.error("durations, counts and --inflight must be positive")
    iters = a.work_iters or calibrate_iters(a.work_us)
    cfg = Config(
        warmup_s=a.warmup,
        duration_s=a.duration,
        procs=a.procs,
        threads=a.threads,
        inflight=a.inflight,
        inflight_procs=min(a.inflight_procs, a.inflight),
        inflight_channels=a.inflight_channels,
        iters=iters,
        work_us=time_work_us(iters),
        models=pick(a.models, MODELS, "models"),
        methods=pick(a.methods, tuple(METHODS), "methods"),
        shapes=pick(a.shapes, SHAPES, "shapes"),
    )

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    started = time.time()
    print(
        f"server model benchmark: grpc {grpc.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {load0[0]:.2f}\n"
        f"  Work handler: {cfg.iters} iterations = {cfg.work_us:.1f} us of CPU (measured here); "
        f"cells: {cfg.warmup_s:g} s warm-up + {cfg.duration_s:g} s",
        flush=True,
    )
    children: list[Child] = []
    cells: list[dict[str, Any]] = []
    try:
        with CHILD_LOG.open("w") as log:
            print("  " + HEADER, flush=True)
            for model in cfg.models:
                cells.extend(run_model(cfg, model, log, children))
    finally:
        for child in list(children):
            child.stop(timeout_s=2)
    elapsed = time.time() - started
    load1 = os.getloadavg()
    conclusion = compare(cells, cfg)
    print(
        "\nResults (calls/s over the window; +-/s: spread of the per-second rate; srv CPU s/1k: "
        "server process CPU seconds per 1,000 calls; srv cores / clients / others: CPU cores "
        "used in the window by the server, the load processes, everything else)"
    )
    print(HEADER)
    print("-" * len(HEADER))
    for c in cells:
        print(row(c))
    print(f"\nConclusion ({elapsed:.0f} s run, load average {load0[0]:.2f} -> {load1[0]:.2f}):")
    print(conclusion["summary"])
    errors = sum(c["errors"] for c in cells)
    if errors:
        print(f"WARNING: {errors} failed calls in the measured windows (see error_kinds)")
    out = {
        "benchmark": "server-model",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": round(elapsed, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_start": load0,
            "loadavg_end": load1,
            "python": platform.python_version(),
            "grpc": grpc.__version__,
        },
        "config": {
            "sync_workers": SYNC_WORKERS,
            "warmup_s": cfg.warmup_s,
            "duration_s": cfg.duration_s,
            "threads_shape": {"processes": cfg.procs, "threads_per_process": cfg.threads},
            "inflight_shape": {
                "inflight": cfg.inflight,
                "processes": cfg.inflight_procs,
                "channels_per_process": cfg.inflight_channels,
            },
            "work_iters": cfg.iters,
            "work_us_measured": round(cfg.work_us, 2),
            "work_payload_bytes": len(WORK_PAYLOAD),
        },
        "cells": cells,
        "comparison": conclusion,
    }
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {a.output}")
    return 1 if errors else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "_serve":
        return child_serve(args[1:])
    if args and args[0] == "_load":
        return child_load(args[1:])
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
