#!/usr/bin/env python3
"""One load process of the scale benchmark (bench/run-scale; see bench/README.md).

Started by bench/scale_bench.py. It simulates many members of coordinator groups on one asyncio
loop with `grpc.aio` channels (CHANNELS of them, each its own TCP connection), and behaves like the
product's `sessioned` agent (worker_agent/membership.py): it joins with epoch 0 and every field
(rebalance timeout, assignors `incremental_cooperative` [1-2] then `eager` [0-0], url, an empty
owned list), then heartbeats at the interval the coordinator answers with, sending only the
required fields plus the owned list when it changed. Work starts and stops instantly: an answer
with an assignment makes the member run exactly that, and it reports the new owned list at once
(which acknowledges any revocation). A member told COMPUTE_ASSIGNMENT runs the product's assignor
in a separate worker process (spawned at start; PrepareAssignment, `wire.group_view`, the
assignor's `assign()`, `wire.install_request`, InstallAssignment), timing each step.

It prints `{"ready": ...}`, then reads one JSON command per line on stdin and answers each with one
JSON line; members keep heartbeating in the background between commands. Commands (every loop has
a deadline):

  health        {"duration_s", "warmup_s", "concurrency"}: closed-loop grpc.health Check
  put           {"group_prefix", "groups": [start, stop, step] | "group", "connectors":
                 [start, stop, step], "tasks", "concurrency", "deadline_s", "report_missing"}:
                 PutConnector (with report_missing: the groups not made before the deadline)
  join          {"group", "ids" | "pairs": [[group, id], ...], "concurrency", "deadline_s",
                 "rebalance_timeout_ms"}: join, then heartbeat in the background
  samples       {"group", "t0", "t1"}: heartbeat latencies started in [t0, t1) by kind
  status        {"group"}: members, last state-changing answer, errors
  computes      {"since"}: the assignor runs that started after `since`
  sizes         {"reset"}: the largest serialized message per RPC since the last reset
  drop          {"group"}: stop that group's members (no leave: the stage is discarded)
  quit
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from connect.group.v1 import admin_pb2, admin_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from connect_protocol import wire as protocol_wire
from connect_protocol.messages import HeartbeatRequest
from connect_protocol.resources import EMPTY, ResourceSet
from connect_protocol.wire import resources_from
from worker_agent import wire
from worker_agent.assignor import AssignmentResult
from worker_agent.assignors import assignors_for_protocol
from worker_agent.runtime import advertised

NONE = 0
COMPUTE_ASSIGNMENT = 10001
RPC_TIMEOUT_S = 30.0
COMPUTE_TIMEOUT_S = 300.0
MIN_BACKOFF_S = 0.5
REJOIN_ERRORS = (25, 110)  # UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH (worker_agent/membership.py)
PROTOCOL = "sessioned"
ADVERTISED = advertised(assignors_for_protocol(PROTOCOL))


def channel_options(max_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_bytes),
        ("grpc.max_receive_message_length", max_bytes),
        ("grpc.use_local_subchannel_pool", 1),
    ]


# --- the assignor member's work, in a separate process -------------------------------------------

_compute_stub: Any = None


def compute_job(
    target: str, max_bytes: int, group: str, member_id: str, epoch: int, last_installed: int
) -> dict[str, Any]:
    """The first part of the agent's Prepare -> assign() -> Install
    (`worker_agent/assigning.py`), timed step by step: Prepare, decode (`wire.group_view`), the
    assignor's `assign()`, encode (`wire.install_request`). Runs in the compute worker process,
    so that `assign()` is not slowed by the event loop; the install
    request comes back serialized and is sent by the member, with the epoch it has by then (as
    the agent reads its epoch again before installing)."""
    global _compute_stub
    if _compute_stub is None:
        channel = grpc.insecure_channel(target, options=channel_options(max_bytes))
        _compute_stub = coordinator_pb2_grpc.ConnectGroupCoordinatorStub(channel)
    stub = _compute_stub
    out: dict[str, Any] = {"group": group, "member": member_id, "started_wall": time.time()}
    prep_req = coordinator_pb2.ConnectGroupPrepareAssignmentRequest(
        group_id=group, member_id=member_id, member_epoch=epoch
    )
    out["prepare_request_bytes"] = prep_req.ByteSize()
    t0 = time.perf_counter()
    try:
        prepared = stub.ConnectGroupPrepareAssignment(prep_req, timeout=COMPUTE_TIMEOUT_S)
    except grpc.RpcError as error:
        out["error"] = f"prepare: {error.code().name} {str(error.details())[:200]}"
        out["prepare_ms"] = (time.perf_counter() - t0) * 1000
        return out
    out["prepare_ms"] = (time.perf_counter() - t0) * 1000
    out["prepare_response_bytes"] = prepared.ByteSize()
    out["group_epoch"] = prepared.group_epoch
    out["members"] = len(prepared.members)
    if prepared.error_code != NONE:
        out["refused"] = f"prepare: {prepared.error_code} {prepared.error_message[:200]}"
        return out
    if prepared.group_epoch == last_installed:
        out["skipped"] = True
        return out
    t0 = time.perf_counter()
    view = wire.group_view(prepared)
    out["decode_ms"] = (time.perf_counter() - t0) * 1000
    out["tasks"] = sum(view.catalogue.values())
    assignors = assignors_for_protocol(PROTOCOL)
    assignor = next((a for a in assignors if a.name == view.assignor_name), None)
    out["assignor"] = view.assignor_name
    t0 = time.perf_counter()
    if assignor is None:
        result = AssignmentResult(error=1, error_message=f"no assignor {view.assignor_name!r}")
    else:
        result = assignor.assign(view)
    out["assign_ms"] = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    install = wire.install_request(
        group, member_id, epoch, view.group_epoch, result, view.assignor_version
    )
    out["encode_ms"] = (time.perf_counter() - t0) * 1000
    out["install"] = install.SerializeToString()
    return out


def _warm_up() -> int:
    return os.getpid()


# --- the simulated members -----------------------------------------------------------------------


@dataclass
class Member:
    group: str
    member_id: str
    channel: int
    epoch: int = 0
    owned: ResourceSet = EMPTY
    last_reported: ResourceSet | None = None
    interval_s: float = 5.0
    next_due: float = 0.0
    computing: bool = False
    last_installed: int = -1
    last_change_wall: float = 0.0
    stopped: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


@dataclass(slots=True)
class Sample:
    started: float
    us: int
    kind: str
    group: str


class Sizes:
    """The largest serialized message per RPC (protobuf ByteSize)."""

    def __init__(self) -> None:
        self.largest: dict[str, int] = {}

    def see(self, rpc: str, size: int) -> None:
        if size > self.largest.get(rpc, -1):
            self.largest[rpc] = size


class LoadProcess:
    def __init__(self, target: str, proc: int, channels: int, max_bytes: int) -> None:
        self.target, self.proc, self.max_bytes = target, proc, max_bytes
        opts = channel_options(max_bytes)
        self.channels = [grpc.aio.insecure_channel(target, options=opts) for _ in range(channels)]
        self.coordinator = [
            coordinator_pb2_grpc.ConnectGroupCoordinatorStub(c) for c in self.channels
        ]
        self.admin = [admin_pb2_grpc.ConnectGroupAdminStub(c) for c in self.channels]
        self.health = [health_pb2_grpc.HealthStub(c) for c in self.channels]
        self.members: dict[tuple[str, str], Member] = {}
        self.samples: list[Sample] = []
        self.computes: list[dict[str, Any]] = []
        self.sizes = Sizes()
        self.errors: list[str] = []
        self.error_count = 0
        self.worker_pid = 0
        self.pool = concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn")
        )

    async def start(self) -> None:
        for channel in self.channels:
            await asyncio.wait_for(channel.channel_ready(), 30)
        loop = asyncio.get_running_loop()
        # Spawn the worker (and its imports) now; its pid goes to run-scale's exit trap.
        self.worker_pid = await loop.run_in_executor(self.pool, _warm_up)

    async def close(self) -> None:
        for m in self.members.values():
            m.stopped = True
            if m.task is not None:
                m.task.cancel()
        for channel in self.channels:
            await channel.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(OSError):
            os.kill(self.worker_pid, signal.SIGTERM)

    def error(self, text: str) -> None:
        self.error_count += 1
        if len(self.errors) < 20:
            self.errors.append(text)

    # --- members ---

    async def heartbeat_once(self, m: Member, full: bool) -> bool:
        """One heartbeat as the agent sends it; returns False on a transport error."""
        if full:
            req = HeartbeatRequest(
                m.group,
                m.member_id,
                m.epoch,
                rebalance_timeout_ms=self.rebalance_timeout_ms,
                client_assignors=ADVERTISED,
                owned=m.owned,
                url=f"http://{m.member_id}.scale.invalid:8083",
            )
        else:
            req = HeartbeatRequest(
                m.group,
                m.member_id,
                m.epoch,
                owned=m.owned if m.owned != m.last_reported else None,
            )
        msg = protocol_wire.heartbeat_request_to_wire(req)
        self.sizes.see("heartbeat_request", msg.ByteSize())
        started = time.time()
        t0 = time.perf_counter()
        try:
            resp = await self.coordinator[m.channel].ConnectGroupHeartbeat(
                msg, timeout=RPC_TIMEOUT_S
            )
        except grpc.RpcError as error:
            self.error(f"{m.member_id} heartbeat: {error.code().name} {str(error.details())[:160]}")
            self.samples.append(
                Sample(started, int((time.perf_counter() - t0) * 1e6), "error", m.group)
            )
            m.next_due = time.monotonic() + max(MIN_BACKOFF_S, m.interval_s / 5)
            return False
        us = int((time.perf_counter() - t0) * 1e6)
        self.sizes.see("heartbeat_response", resp.ByteSize())
        if req.owned is not None:
            m.last_reported = req.owned
        code = resp.error_code
        if code not in (NONE, COMPUTE_ASSIGNMENT):
            self.error(f"{m.member_id} heartbeat: error {code} {resp.error_message[:160]}")
            self.samples.append(Sample(started, us, "error", m.group))
            if code in REJOIN_ERRORS:
                # As the agent does when fenced or unknown: rejoin with nothing.
                m.epoch, m.owned, m.last_reported = 0, EMPTY, None
            # Otherwise (coordinator not available, ...) retry later with the same state.
            m.next_due = time.monotonic() + max(MIN_BACKOFF_S, m.interval_s / 5)
            return False
        changed = resp.member_epoch != m.epoch
        m.epoch = resp.member_epoch
        if resp.HasField("assignment"):
            told = resources_from(resp.assignment.connectors_and_tasks)
            changed = changed or told != m.owned
            m.owned = told  # stops and starts are instant
        if changed:
            m.last_change_wall = time.time()
        if full:
            kind = "join"
        elif changed:
            kind = "changed"
        elif req.owned is not None:
            kind = "owned"
        else:
            kind = "unchanged"
        self.samples.append(Sample(started, us, kind, m.group))
        if resp.heartbeat_interval_ms > 0:
            m.interval_s = resp.heartbeat_interval_ms / 1000
        now = time.monotonic()
        m.next_due = now if m.owned != m.last_reported else now + m.interval_s
        if code == COMPUTE_ASSIGNMENT and not m.computing:
            m.computing = True
            asyncio.get_running_loop().create_task(self.compute(m))
        return True

    async def compute(self, m: Member) -> None:
        loop = asyncio.get_running_loop()
        try:
            out = await loop.run_in_executor(
                self.pool,
                compute_job,
                self.target,
                self.max_bytes,
                m.group,
                m.member_id,
                m.epoch,
                m.last_installed,
            )
        except Exception as error:
            out = {"group": m.group, "member": m.member_id, "error": f"{type(error).__name__}"}
        data = out.pop("install", None)
        if data is not None:
            install = coordinator_pb2.ConnectGroupInstallAssignmentRequest.FromString(data)
            install.member_epoch = m.epoch
            out["install_request_bytes"] = install.ByteSize()
            t0 = time.perf_counter()
            try:
                answer = await self.coordinator[m.channel].ConnectGroupInstallAssignment(
                    install, timeout=COMPUTE_TIMEOUT_S
                )
                out["install_ms"] = (time.perf_counter() - t0) * 1000
                out["install_response_bytes"] = answer.ByteSize()
                if answer.error_code != NONE:
                    out["refused"] = f"install: {answer.error_code} {answer.error_message[:200]}"
                else:
                    out["installed"] = True
                    m.last_installed = int(out["group_epoch"])
            except grpc.RpcError as error:
                out["install_ms"] = (time.perf_counter() - t0) * 1000
                out["error"] = f"install: {error.code().name} {str(error.details())[:200]}"
        out["ended_wall"] = time.time()
        self.computes.append(out)
        for rpc in ("prepare_request", "prepare_response", "install_request", "install_response"):
            if f"{rpc}_bytes" in out:
                self.sizes.see(rpc, int(out[f"{rpc}_bytes"]))
        if out.get("error"):
            self.error(f"{m.member_id} compute: {out['error']}")
        m.computing = False
        m.next_due = time.monotonic()  # as compute_done: heartbeat at once
        m.wake.set()

    async def member_loop(self, m: Member) -> None:
        while not m.stopped:
            delay = m.next_due - time.monotonic()
            if delay > 0:
                m.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(m.wake.wait(), delay)
                continue
            await self.heartbeat_once(m, full=m.epoch == 0)

    # --- commands ---

    async def op_health(self, cmd: dict[str, Any]) -> dict[str, Any]:
        warmup, duration = float(cmd.get("warmup_s", 1.0)), float(cmd["duration_s"])
        t0 = time.time() + 0.05
        measure_from, stop_at = t0 + warmup, t0 + warmup + duration
        request = health_pb2.HealthCheckRequest()
        lat: list[int] = []

        async def one(i: int) -> None:
            stub = self.health[i % len(self.health)]
            while True:
                started = time.time()
                if started >= stop_at:
                    return
                p0 = time.perf_counter()
                resp = await stub.Check(request, timeout=RPC_TIMEOUT_S)
                us = int((time.perf_counter() - p0) * 1e6)
                if resp.status != health_pb2.HealthCheckResponse.SERVING:
                    self.error(f"health status {resp.status}")
                if started >= measure_from:
                    lat.append(us)

        await asyncio.gather(*(one(i) for i in range(int(cmd.get("concurrency", 2)))))
        return {"samples_us": lat, "window": [measure_from, stop_at]}

    async def op_put(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """PutConnector for (group, connector) pairs: either many groups with the same
        connectors, or one group; closed loop with `concurrency` calls in flight."""
        tasks = int(cmd["tasks"])
        deadline = time.monotonic() + float(cmd.get("deadline_s", 600))
        if "groups" in cmd:
            gs = [f"{cmd['group_prefix']}-{i:06d}" for i in range(*cmd["groups"])]
        else:
            gs = [cmd["group"]]
        names = [connector_name(i) for i in range(*cmd["connectors"])]
        pairs = [(g, n) for g in gs for n in names]
        missing: list[str] = []
        done = 0
        lat: list[int] = []
        position = 0

        async def one(i: int) -> None:
            nonlocal done, position
            stub = self.admin[i % len(self.admin)]
            while position < len(pairs) and time.monotonic() < deadline:
                g, n = pairs[position]
                position += 1
                p0 = time.perf_counter()
                try:
                    r = await stub.PutConnector(
                        admin_pb2.PutConnectorRequest(group_id=g, connector=n, task_count=tasks),
                        timeout=RPC_TIMEOUT_S,
                    )
                except grpc.RpcError as error:
                    self.error(f"PutConnector {g}/{n}: {error.code().name}")
                    missing.append(g)
                    continue
                lat.append(int((time.perf_counter() - p0) * 1e6))
                if r.error_code != NONE:
                    self.error(f"PutConnector {g}/{n}: {r.error_code} {r.error_message[:160]}")
                    missing.append(g)
                    continue
                done += 1

        t0 = time.time()
        await asyncio.gather(*(one(i) for i in range(int(cmd.get("concurrency", 4)))))
        out: dict[str, Any] = {
            "done": done,
            "wanted": len(pairs),
            "seconds": time.time() - t0,
            "samples_us": lat,
        }
        if cmd.get("report_missing"):
            out["missing"] = sorted({*missing, *(g for g, _ in pairs[position:])})
        return out

    async def op_join(self, cmd: dict[str, Any]) -> dict[str, Any]:
        if "pairs" in cmd:
            pairs = [(str(g), str(i)) for g, i in cmd["pairs"]]
        else:
            pairs = [(str(cmd["group"]), str(i)) for i in cmd["ids"]]
        self.rebalance_timeout_ms = int(cmd.get("rebalance_timeout_ms", 120_000))
        deadline = time.monotonic() + float(cmd.get("deadline_s", 600))
        joins: list[tuple[float, int]] = []  # (answer's wall time, latency us)
        position = 0
        failures = 0

        async def one() -> None:
            nonlocal position, failures
            while position < len(pairs) and time.monotonic() < deadline:
                group, member_id = pairs[position]
                position += 1
                m = Member(group, member_id, hash(member_id) % len(self.channels))
                while True:
                    p0 = time.perf_counter()
                    ok = await self.heartbeat_once(m, full=True)
                    us = int((time.perf_counter() - p0) * 1e6)
                    if (ok and m.epoch > 0) or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(MIN_BACKOFF_S)  # retried as the agent would
                if m.epoch <= 0:
                    failures += 1
                    continue
                joins.append((time.time(), us))
                self.members[(group, member_id)] = m
                m.task = asyncio.get_running_loop().create_task(self.member_loop(m))

        await asyncio.gather(*(one() for _ in range(int(cmd.get("concurrency", 2)))))
        return {"joins": joins, "failures": failures, "left_over": len(pairs) - position}

    def op_samples(self, cmd: dict[str, Any]) -> dict[str, Any]:
        group, t0, t1 = cmd["group"], float(cmd["t0"]), float(cmd["t1"])
        kinds: dict[str, list[int]] = {}
        for s in self.samples:
            if s.group == group and t0 <= s.started < t1:
                kinds.setdefault(s.kind, []).append(s.us)
        return {"kinds": kinds}

    def op_status(self, cmd: dict[str, Any]) -> dict[str, Any]:
        group = cmd["group"]
        mine = [m for (g, _), m in self.members.items() if g == group]
        return {
            "members": len(mine),
            "last_change_wall": max((m.last_change_wall for m in mine), default=0.0),
            "computing": sum(m.computing for m in mine),
            "epochs": sorted({m.epoch for m in mine}),
        }

    def op_computes(self, cmd: dict[str, Any]) -> dict[str, Any]:
        since = float(cmd.get("since", 0.0))
        return {"computes": [c for c in self.computes if c.get("started_wall", 0.0) >= since]}

    def op_sizes(self, cmd: dict[str, Any]) -> dict[str, Any]:
        out = dict(self.sizes.largest)
        if cmd.get("reset"):
            self.sizes = Sizes()
        return {"largest": out}

    def op_drop(self, cmd: dict[str, Any]) -> dict[str, Any]:
        group = cmd["group"]
        dropped = 0
        for key in [k for k in self.members if k[0] == group]:
            m = self.members.pop(key)
            m.stopped = True
            if m.task is not None:
                m.task.cancel()
            dropped += 1
        self.samples = [s for s in self.samples if s.group != group]
        return {"dropped": dropped}

    rebalance_timeout_ms = 120_000


def connector_name(i: int) -> str:
    """A 40-character connector name."""
    return f"scale-benchmark-connector-number-{i:07d}"


async def serve(args: argparse.Namespace) -> None:
    lp = LoadProcess(args.target, args.proc, args.channels, args.max_message_bytes)
    await lp.start()
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read, daemon=True).start()
    loop.add_signal_handler(signal.SIGTERM, lambda: lines.put_nowait(None))
    print(
        json.dumps({"ready": True, "proc": args.proc, "worker_pids": [lp.worker_pid]}), flush=True
    )
    ops: dict[str, Any] = {
        "health": lp.op_health,
        "put": lp.op_put,
        "join": lp.op_join,
        "samples": lp.op_samples,
        "status": lp.op_status,
        "computes": lp.op_computes,
        "sizes": lp.op_sizes,
        "drop": lp.op_drop,
    }
    try:
        while True:
            line = await lines.get()
            if line is None:
                break
            if not line.strip():
                continue
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            try:
                result = ops[cmd["op"]](cmd)
                if asyncio.iscoroutine(result):
                    result = await result
                out = {"proc": args.proc, "op": cmd["op"], **result}
            except Exception as error:
                out = {
                    "proc": args.proc,
                    "op": cmd["op"],
                    "failed": f"{type(error).__name__}: {error}",
                }
            out["errors"] = lp.error_count
            out["error_samples"] = lp.errors[:5]
            lp.errors, lp.error_count = [], 0
            print(json.dumps(out, separators=(",", ":")), flush=True)
    finally:
        await lp.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="coordinator host:port (127.0.0.1 only)")
    parser.add_argument("--proc", type=int, default=0)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--max-message-bytes", type=int, default=64 * 1024 * 1024)
    args = parser.parse_args()
    if args.target.rpartition(":")[0] not in ("127.0.0.1", "localhost"):
        parser.error("the benchmark only sends traffic to the loopback address")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
