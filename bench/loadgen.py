#!/usr/bin/env python3
"""One load-generating process of the coordinator benchmark (bench/README.md).

Started by bench/coordinator_bench.py; it opens THREADS gRPC channels to the coordinator (one per
thread, each with its own TCP connection), prints `{"ready": ...}`, then reads one JSON command per
line on stdin, runs it with all its threads as fast as they can go (closed loop: each thread sends
its next request when the previous answer arrives), and prints one JSON line with its own achieved
rate and latency percentiles (plus the raw samples, so that the driver can merge percentiles across
processes). Every loop is bounded by a deadline and a count. Commands:

  {"op": "health", "duration_s": D, "warmup_s": W}
      empty unary RPC grpc.health.v1.Health/Check (the ceiling).
  {"op": "steady", "group": G, "members": [{"id", "epoch", "owned"}], "duration_s", "warmup_s",
   "with_owned": bool}
      every member heartbeats at its epoch with no field changed (optionally reporting its owned
      list, unchanged). Any answer other than NONE at the same epoch without an assignment counts
      as an anomaly.
  {"op": "classic_steady", "group": G, "members": [{"id", "generation"}], "duration_s",
   "warmup_s"}
      every member of a STABLE classic group heartbeats (ConnectGroupClassic/Heartbeat) at its
      generation. Any answer other than NONE counts as an anomaly.
  {"op": "revoke", "group": G, "members": [{"id", "epoch", "owned", "target"}], "deadline_s"}
      a target that moves resources has been installed: pass A, every member heartbeats and is
      told what to give up; pass B, every member acknowledges (reports the smaller owned list) and
      moves to the target epoch; pass C, members whose target still misses resources heartbeat
      until they have them (resources arrive once their previous owner has acknowledged).
  {"op": "joinleave", "group": G, "prefix": P, "duration_s", "warmup_s", "max_per_thread"}
      fresh members join (epoch 0 with every field: rebalance timeout, assignors, url, an empty
      owned list) and leave again (epoch -1), so the group keeps its size.
  {"op": "quit"}
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
from connect.group.v1 import (
    classic_pb2,
    classic_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc

NONE = 0
COMPUTE_ASSIGNMENT = 10001
RPC_TIMEOUT_S = 10.0
IC = common_pb2.Assignor(
    name="incremental_cooperative", minimum_version=1, maximum_version=2, version=2
)
HeartbeatRequest = coordinator_pb2.ConnectGroupHeartbeatRequest

Resources = tuple[frozenset[str], frozenset[tuple[str, int]]]


def resources_of(data: dict[str, Any]) -> Resources:
    """{"connectors": [...], "tasks": [[connector, task], ...]} -> Resources."""
    return frozenset(data["connectors"]), frozenset((c, int(t)) for c, t in data["tasks"])


def resources_json(res: Resources) -> dict[str, Any]:
    return {"connectors": sorted(res[0]), "tasks": [[c, t] for c, t in sorted(res[1])]}


def to_cat(res: Resources, msg: Any) -> None:
    msg.SetInParent()
    msg.connectors.extend(sorted(res[0]))
    for c, t in sorted(res[1]):
        msg.tasks.add(connector=c, task=t)


def from_cat(msg: Any) -> Resources:
    return frozenset(msg.connectors), frozenset((t.connector, t.task) for t in msg.tasks)


class Recorder:
    """Latency samples (microseconds) per kind, kept only inside the measurement window."""

    def __init__(self) -> None:
        self.samples: dict[str, list[int]] = {}
        self.total: dict[str, int] = {}  # every request, warm-up included (for DB accounting)
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.errors: list[str] = []
        self.error_count = 0

    def add(self, kind: str, started: float, ended: float, measured: bool = True) -> None:
        self.total[kind] = self.total.get(kind, 0) + 1
        if not measured:
            return
        self.samples.setdefault(kind, []).append(int((ended - started) * 1e6))
        if kind not in self.first or started < self.first[kind]:
            self.first[kind] = started
        if kind not in self.last or ended > self.last[kind]:
            self.last[kind] = ended

    def error(self, text: str) -> None:
        self.error_count += 1
        if len(self.errors) < 5:
            self.errors.append(text)

    def merge(self, other: Recorder) -> None:
        for kind, values in other.samples.items():
            self.samples.setdefault(kind, []).extend(values)
        for kind, n in other.total.items():
            self.total[kind] = self.total.get(kind, 0) + n
        for kind, t in other.first.items():
            self.first[kind] = min(self.first.get(kind, t), t)
        for kind, t in other.last.items():
            self.last[kind] = max(self.last.get(kind, t), t)
        self.error_count += other.error_count
        self.errors.extend(other.errors[: max(0, 5 - len(self.errors))])


def percentile(sorted_values: list[int], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return float(sorted_values[index])


def summarize(rec: Recorder, proc: int, op: str, threads: int, window: tuple[float, float]) -> dict:
    """Per kind: count in the window, rate (count / window length), percentiles in ms."""
    kinds: dict[str, Any] = {}
    for kind, values in sorted(rec.samples.items()):
        values.sort()
        start = rec.first[kind] if window[0] <= 0 else window[0]
        end = rec.last[kind] if window[1] <= 0 else window[1]
        elapsed = max(end - start, 1e-9)
        kinds[kind] = {
            "count": len(values),
            "total_incl_warmup": rec.total.get(kind, 0),
            "window_s": round(elapsed, 4),
            "start_wall": start,
            "end_wall": end,
            "rate_per_s": round(len(values) / elapsed, 1),
            "p50_ms": round(percentile(values, 0.50) / 1000, 3),
            "p90_ms": round(percentile(values, 0.90) / 1000, 3),
            "p99_ms": round(percentile(values, 0.99) / 1000, 3),
            "max_ms": round(values[-1] / 1000, 3) if values else 0.0,
            "samples_us": values,
        }
    for kind, n in rec.total.items():
        kinds.setdefault(kind, {"count": 0, "total_incl_warmup": n, "samples_us": []})
    return {
        "proc": proc,
        "op": op,
        "threads": threads,
        "kinds": kinds,
        "errors": rec.error_count,
        "error_samples": rec.errors,
    }


class LoadGen:
    def __init__(self, target: str, threads: int, proc: int) -> None:
        self.proc = proc
        self.threads = threads
        # One channel per thread, each on its own TCP connection (no shared subchannel pool).
        self.channels = [
            grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(threads)
        ]
        for channel in self.channels:
            grpc.channel_ready_future(channel).result(timeout=30)
        self.coordinator = [
            coordinator_pb2_grpc.ConnectGroupCoordinatorStub(c) for c in self.channels
        ]
        self.health = [health_pb2_grpc.HealthStub(c) for c in self.channels]
        self.classic = [classic_pb2_grpc.ConnectGroupClassicStub(c) for c in self.channels]

    def close(self) -> None:
        for channel in self.channels:
            channel.close()

    def run_threads(self, body: Callable[[int, Recorder], None]) -> Recorder:
        recorders = [Recorder() for _ in range(self.threads)]
        start = threading.Barrier(self.threads)

        def run(i: int) -> None:
            start.wait()
            try:
                body(i, recorders[i])
            except Exception as error:
                recorders[i].error(f"thread {i}: {type(error).__name__}: {error}")

        workers = [threading.Thread(target=run, args=(i,)) for i in range(self.threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        total = Recorder()
        for r in recorders:
            total.merge(r)
        return total

    # --- ops ---------------------------------------------------------------------------------

    def op_health(self, cmd: dict[str, Any]) -> dict[str, Any]:
        warmup, duration = float(cmd.get("warmup_s", 1.0)), float(cmd["duration_s"])
        t0 = time.time() + 0.05
        measure_from, stop_at = t0 + warmup, t0 + warmup + duration
        request = health_pb2.HealthCheckRequest()

        def body(i: int, rec: Recorder) -> None:
            stub = self.health[i]
            while True:
                started = time.time()
                if started >= stop_at:
                    return
                resp = stub.Check(request, timeout=RPC_TIMEOUT_S)
                ended = time.time()
                if resp.status != health_pb2.HealthCheckResponse.SERVING:
                    rec.error(f"health status {resp.status}")
                rec.add("health", started, ended, started >= measure_from)

        rec = self.run_threads(body)
        return summarize(rec, self.proc, "health", self.threads, (measure_from, stop_at))

    def closed_loop(
        self,
        cmd: dict[str, Any],
        kind: str,
        requests_of: Callable[[int, list[dict[str, Any]]], list[Any]],
        call: Callable[[int, Any], str | None],
    ) -> dict[str, Any]:
        """Every thread cycles through its share of `cmd["members"]`, sending each member's
        request (`requests_of`) as soon as the previous answer arrived, for the warm-up and then
        the measured window. `call` sends one and returns an anomaly's text (None if the answer
        was the expected one)."""
        warmup, duration = float(cmd.get("warmup_s", 1.0)), float(cmd["duration_s"])
        members = cmd["members"]
        shares = [members[i :: self.threads] for i in range(self.threads)]
        t0 = time.time() + 0.05
        measure_from, stop_at = t0 + warmup, t0 + warmup + duration

        def body(i: int, rec: Recorder) -> None:
            if not shares[i]:
                return
            requests = requests_of(i, shares[i])
            n = 0
            while True:
                req = requests[n % len(requests)]
                n += 1
                started = time.time()
                if started >= stop_at:
                    return
                anomaly = call(i, req)
                ended = time.time()
                if anomaly is not None:
                    rec.error(anomaly)
                rec.add(kind, started, ended, started >= measure_from)

        rec = self.run_threads(body)
        return summarize(rec, self.proc, cmd["op"], self.threads, (measure_from, stop_at))

    def op_steady(self, cmd: dict[str, Any]) -> dict[str, Any]:
        with_owned = bool(cmd.get("with_owned", False))
        group = cmd["group"]
        epochs: dict[str, int] = {m["id"]: m["epoch"] for m in cmd["members"]}

        def requests_of(_i: int, mine: list[dict[str, Any]]) -> list[Any]:
            requests = []
            for m in mine:
                req = HeartbeatRequest(group_id=group, member_id=m["id"], member_epoch=m["epoch"])
                if with_owned:
                    to_cat(resources_of(m["owned"]), req.connectors_and_tasks)
                requests.append(req)
            return requests

        def call(i: int, req: Any) -> str | None:
            resp = self.coordinator[i].ConnectGroupHeartbeat(req, timeout=RPC_TIMEOUT_S)
            if (
                resp.error_code != NONE
                or resp.member_epoch != epochs[req.member_id]
                or resp.HasField("assignment")
            ):
                return (
                    f"{req.member_id}: error {resp.error_code} epoch {resp.member_epoch} "
                    f"assignment={resp.HasField('assignment')} {resp.error_message[:120]}"
                )
            return None

        return self.closed_loop(cmd, "steady_owned" if with_owned else "steady", requests_of, call)

    def op_classic_steady(self, cmd: dict[str, Any]) -> dict[str, Any]:
        group = cmd["group"]

        def requests_of(_i: int, mine: list[dict[str, Any]]) -> list[Any]:
            return [
                classic_pb2.HeartbeatRequest(
                    group_id=group, generation_id=m["generation"], member_id=m["id"]
                )
                for m in mine
            ]

        def call(i: int, req: Any) -> str | None:
            resp = self.classic[i].Heartbeat(req, timeout=RPC_TIMEOUT_S)
            if resp.error_code != NONE:
                return f"{req.member_id}: error {resp.error_code} {resp.error_message[:120]}"
            return None

        return self.closed_loop(cmd, "classic_steady", requests_of, call)

    def op_revoke(self, cmd: dict[str, Any]) -> dict[str, Any]:
        group = cmd["group"]
        deadline = time.time() + float(cmd.get("deadline_s", 30.0))
        members = [
            {
                "id": m["id"],
                "epoch": m["epoch"],
                "owned": resources_of(m["owned"]),
                "target": resources_of(m["target"]),
            }
            for m in cmd["members"]
        ]
        shares = [members[i :: self.threads] for i in range(self.threads)]

        def heartbeat(stub: Any, m: dict[str, Any], rec: Recorder, kind: str) -> bool:
            """One heartbeat reporting the owned list; returns whether it changed the member's
            state (a new epoch, or an assignment different from what it owned)."""
            req = HeartbeatRequest(group_id=group, member_id=m["id"], member_epoch=m["epoch"])
            to_cat(m["owned"], req.connectors_and_tasks)
            started = time.time()
            resp = stub.ConnectGroupHeartbeat(req, timeout=RPC_TIMEOUT_S)
            ended = time.time()
            if resp.error_code not in (NONE, COMPUTE_ASSIGNMENT):
                rec.error(f"{m['id']} {kind}: error {resp.error_code} {resp.error_message[:160]}")
                rec.add(kind + "_error", started, ended)
                return False
            changed = resp.member_epoch != m["epoch"]
            m["epoch"] = resp.member_epoch
            if resp.HasField("assignment"):
                told = from_cat(resp.assignment.connectors_and_tasks)
                changed = changed or told != m["owned"]
                m["owned"] = told
            rec.add(kind if changed else "unchanged", started, ended)
            return changed

        def body(i: int, rec: Recorder) -> None:
            stub = self.coordinator[i]
            mine = shares[i]
            # Pass A: learn what to give up (the target moved some of what the member owns).
            for m in mine:
                if not m["owned"][0] <= m["target"][0] or not m["owned"][1] <= m["target"][1]:
                    heartbeat(stub, m, rec, "revocation_delivered")
            # Pass B: acknowledge (the owned list no longer holds the revoked resources).
            for m in mine:
                heartbeat(stub, m, rec, "revocation_acked")
            # Pass C: collect resources as their previous owners release them.
            while time.time() < deadline:
                waiting = [m for m in mine if m["owned"] != m["target"]]
                if not waiting:
                    return
                progressed = False
                for m in waiting:
                    progressed |= heartbeat(stub, m, rec, "released_delivered")
                if not progressed:
                    time.sleep(0.005)
            rec.error(f"thread {i}: members still not at their target at the deadline")

        rec = self.run_threads(body)
        out = summarize(rec, self.proc, "revoke", self.threads, (0.0, 0.0))
        out["members"] = [
            {"id": m["id"], "epoch": m["epoch"], "owned": resources_json(m["owned"])}
            for m in members
        ]
        return out

    def op_joinleave(self, cmd: dict[str, Any]) -> dict[str, Any]:
        group, prefix = cmd["group"], cmd["prefix"]
        warmup, duration = float(cmd.get("warmup_s", 1.0)), float(cmd["duration_s"])
        max_per_thread = int(cmd.get("max_per_thread", 100_000))
        t0 = time.time() + 0.05
        measure_from, stop_at = t0 + warmup, t0 + warmup + duration

        def body(i: int, rec: Recorder) -> None:
            stub = self.coordinator[i]
            for n in range(max_per_thread):
                if time.time() >= stop_at:
                    return
                member_id = f"{prefix}-p{self.proc}-t{i}-{n}"
                join = HeartbeatRequest(
                    group_id=group,
                    member_id=member_id,
                    member_epoch=0,
                    rebalance_timeout_ms=60_000,
                    url=f"http://{member_id}.bench.invalid:8083",
                )
                join.client_assignors.assignors.append(IC)
                join.connectors_and_tasks.SetInParent()
                started = time.time()
                resp = stub.ConnectGroupHeartbeat(join, timeout=RPC_TIMEOUT_S)
                ended = time.time()
                if resp.error_code not in (NONE, COMPUTE_ASSIGNMENT) or resp.member_epoch <= 0:
                    rec.error(f"join {member_id}: {resp.error_code} {resp.error_message[:160]}")
                    continue
                rec.add("join", started, ended, started >= measure_from)
                leave = HeartbeatRequest(group_id=group, member_id=member_id, member_epoch=-1)
                started = time.time()
                resp = stub.ConnectGroupHeartbeat(leave, timeout=RPC_TIMEOUT_S)
                ended = time.time()
                if resp.error_code != NONE or resp.member_epoch != -1:
                    rec.error(f"leave {member_id}: {resp.error_code} {resp.error_message[:160]}")
                    continue
                rec.add("leave", started, ended, started >= measure_from)

        rec = self.run_threads(body)
        return summarize(rec, self.proc, "joinleave", self.threads, (measure_from, stop_at))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="coordinator host:port (127.0.0.1 only)")
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--proc", type=int, default=0, help="this process's number")
    args = parser.parse_args()
    host = args.target.rpartition(":")[0]
    if host not in ("127.0.0.1", "localhost", "[::1]"):
        parser.error("the benchmark only sends traffic to the loopback address")
    gen = LoadGen(args.target, args.threads, args.proc)
    ops = {
        "health": gen.op_health,
        "steady": gen.op_steady,
        "classic_steady": gen.op_classic_steady,
        "revoke": gen.op_revoke,
        "joinleave": gen.op_joinleave,
    }
    print(json.dumps({"ready": True, "proc": args.proc, "threads": args.threads}), flush=True)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            try:
                out = ops[cmd["op"]](cmd)
            except Exception as error:
                out = {
                    "proc": args.proc,
                    "op": cmd["op"],
                    "failed": f"{type(error).__name__}: {error}",
                }
            print(json.dumps(out, separators=(",", ":")), flush=True)
    finally:
        gen.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
