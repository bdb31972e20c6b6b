#!/usr/bin/env python3
"""Fuzz benchmark (issue 12): many hostile requests across every RPC of a real coordinator.

Run it through ./bench/run-fuzz (see bench/README.md, "Fuzz benchmark"). It starts a throwaway
PostgreSQL and `coordinator-svc serve` on 127.0.0.1 (with a small --max-message-bytes, so that
oversized bodies are cheap to send), a healthy group of a few scripted members heartbeating every
200 ms on a thread of its own, then client threads, each with its own channel, that send
--requests hostile requests in all over every RPC of ConnectGroupCoordinator, ConnectGroupAdmin
and ConnectGroupClassic: half well-formed messages with hostile field values, half raw bodies
(random or mutated encodings). The generators, the judge of answers, the log scan and the SQL
invariants are the fuzz tests' (`tests/support/hostile.py`); here they draw from seeded
`random.Random`s (--seed), so a run is reproducible up to the interleaving of the threads.

It prints the answers per RPC per outcome (gRPC status, or OK with the in-band error code) and
the counts that must be zero: INTERNAL/UNKNOWN statuses, in-band UNKNOWN_SERVER_ERROR, other
answers outside the contract, tracebacks in the coordinator's log, broken SQL invariants, and
error answers or failed calls of the healthy group (with its heartbeat p50/p99). It exits 1 when
any of them is not zero, and writes bench/results/fuzz-latest.json (every count, the first
examples of each problem with the request that caused it, the configuration).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "generated"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import grpc  # noqa: E402

from tests.support import hostile  # noqa: E402
from tests.support.coordinator import CoordinatorProcess  # noqa: E402

RESULTS = REPO / "bench" / "results"
ORDER = (
    "ConnectGroupHeartbeat",
    "ConnectGroupPrepareAssignment",
    "ConnectGroupInstallAssignment",
    "ConnectGroupConfigs",
    "ConnectGroupReportStatus",
    "PutConnector",
    "DeleteConnector",
    "AlterGroupConfigs",
    "ListGroups",
    "DescribeGroups",
    "FindCoordinator",
    "ListAcls",
    "AddAcl",
    "RemoveAcl",
    "DescribeFeatures",
    "UpdateFeatures",
    "PauseConnector",
    "ResumeConnector",
    "StopConnector",
    "RestartConnector",
    "RemoveMember",
    "DeleteGroup",
    "JoinGroup",
    "SyncGroup",
    "Heartbeat",
    "LeaveGroup",
)
assert set(ORDER) == set(hostile.RPCS), "every RPC the fuzz tests know is fuzzed here too"
#: The logger and message of a JSON log line.
LOGGER_MSG = re.compile(r'"logger":"([^"]*)","msg":"((?:[^"\\]|\\.)*)"')
#: How many examples of each problem the report keeps.
EXAMPLES_KEPT = 5


def log(msg: str) -> None:
    print(f"[fuzz {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Tally:
    """What the client threads saw, merged under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: Counter[tuple[str, str, str]] = Counter()  # (rpc, kind, label)
        self.latencies_s: dict[str, list[float]] = {rpc: [] for rpc in ORDER}
        self.fatal = 0
        self.violations = 0
        self.problems: Counter[str] = Counter()
        self.examples: dict[str, list[dict[str, str]]] = {}
        #: The first request and answer of each outcome, for the report.
        self.first: dict[tuple[str, str, str], dict[str, str]] = {}

    def add(
        self,
        rpc: str,
        kind: str,
        verdict: hostile.Verdict,
        request: str,
        details: str,
        seconds: float,
    ) -> None:
        with self.lock:
            self.latencies_s[rpc].append(seconds)
            key_ = (rpc, kind, verdict.label)
            self.outcomes[key_] += 1
            if key_ not in self.first:
                self.first[key_] = {"request": request[:300], "answer": _answer(verdict, details)}
            if not verdict.problems:
                return
            if verdict.fatal:
                self.fatal += 1
            else:
                self.violations += 1
            for problem in verdict.problems:
                key = f"{rpc}: {problem[:160]}"
                self.problems[key] += 1
                kept = self.examples.setdefault(key, [])
                if len(kept) < EXAMPLES_KEPT:
                    kept.append(
                        {"kind": kind, "request": request, "answer": _answer(verdict, details)}
                    )


def _answer(verdict: hostile.Verdict, details: str) -> str:
    return hostile.show(verdict.response, 600) if verdict.response is not None else details


def rss_mib(pid: int) -> float:
    """Resident memory of a process, in MiB (Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def percentile_ms(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def client_thread(
    index: int,
    args: argparse.Namespace,
    address: str,
    world: hostile.World,
    tally: Tally,
    claim: Any,
) -> None:
    src = hostile.RandomSource(args.seed * 1_000 + index)
    client = hostile.RawClient(address, timeout_s=args.timeout_s)
    try:
        while claim():
            rpc = src.pick(ORDER)
            if src.integer(0, 99) < args.raw_percent:
                kind, message = "raw", None
                body = hostile.raw_body(src, world, rpc, args.max_message_bytes)
            else:
                kind, message = "message", hostile.well_formed(src, world, rpc)
                body = message.SerializeToString()
            sent = time.perf_counter()
            status, details, answer = client.send(rpc, body)
            seconds = time.perf_counter() - sent
            verdict = hostile.judge(rpc, body, status, details, answer, args.max_message_bytes)
            if message is not None and verdict.response is not None and not verdict.problems:
                world.learn(rpc, message, verdict.response)
            if hostile.may_have_lowered_group_version(rpc, verdict.response):
                client.send(rpc, hostile.RESTORE_GROUP_VERSION)
            tally.add(rpc, kind, verdict, hostile.show(message or body, 600), details, seconds)
    finally:
        client.close()


#: The read-amplification cases (issue 23): DescribeGroups naming one ~250 KB group 10,000
#: times (the finding: 1,000 repeats took the coordinator from 89 to 1,101 MiB), naming 1,000
#: unknown groups (at --max-describe-groups: once a lease row each) and 10,000 (past it).
AMPLIFICATION_CASES = (
    ("one 250 KB group x 10,000", "big", 10_000),
    ("unknown ids x 1,000", "unknown", 1_000),
    ("unknown ids x 10,000", "unknown", 10_000),
)


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set so far (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def amplification_client(
    index: int,
    address: str,
    big: str,
    seconds: float,
    timeout_s: float,
    max_message_bytes: int,
    results: Any,
) -> None:
    """One read-amplification client (its own process): after a 2 s start, the cases back to
    back for `seconds`; puts ([(case, outcome, count)], [wrong entry counts]) on `results`."""
    from connect.group.v1 import admin_pb2

    time.sleep(2.0)
    client = hostile.RawClient(address, timeout_s=timeout_s)
    counted: Counter[tuple[str, str]] = Counter()
    wrong: list[str] = []
    n = index
    stop = time.monotonic() + seconds
    try:
        while time.monotonic() < stop:
            name, kind, count = AMPLIFICATION_CASES[n % len(AMPLIFICATION_CASES)]
            n += 1
            ids = [big] * count if kind == "big" else [f"nx-{index}-{n}-{i}" for i in range(count)]
            body = admin_pb2.DescribeGroupsRequest(group_ids=ids).SerializeToString()
            status, details, answer = client.send("DescribeGroups", body)
            verdict = hostile.judge(
                "DescribeGroups", body, status, details, answer, max_message_bytes
            )
            label = status.name
            if answer is not None and status == grpc.StatusCode.OK:
                decoded = admin_pb2.DescribeGroupsResponse.FromString(answer)
                if [g.group_id for g in decoded.groups] != ids:
                    wrong.append(f"{name}: {len(decoded.groups)} entries")
                codes = Counter(g.error_code for g in decoded.groups)
                label = "OK " + ", ".join(f"{c}x{k}" for c, k in sorted(codes.items()))
            if verdict.problems:
                label += " (outside the contract: " + "; ".join(verdict.problems) + ")"
            counted[(name, label)] += 1
    finally:
        client.close()
        results.put(([(name, label, k) for (name, label), k in counted.items()], wrong))


def amplification_phase(
    args: argparse.Namespace, address: str, pid: int, healthy: hostile.HealthyGroup
) -> dict[str, Any]:
    """The healthy group's heartbeat p99 over a quiet window, then over a window in which
    --amplification-clients processes send the read-amplification cases back to back; each
    answer judged by the fuzz judge (INTERNAL/UNKNOWN must be zero) and checked to hold one
    entry per id; and the coordinator's peak RSS before and after."""
    from connect.group.v1 import admin_pb2

    from tests.support.coordinator import Stubs

    stubs = Stubs(address, max_message_bytes=args.max_message_bytes)
    big = "amplify-big"
    keys = 2_600  # ~100 bytes a key: a description of ~260 KB (values are hidden, keys shown)
    put = stubs.admin.PutConnector(
        admin_pb2.PutConnectorRequest(
            group_id=big,
            connector="wide",
            task_count=1,
            config={f"setting.{i:06d}.{'k' * 80}": "v" for i in range(keys)},
        ),
        timeout=60,
    )
    assert put.error_code == 0, put.error_message
    size = (
        stubs.admin.DescribeGroups(admin_pb2.DescribeGroupsRequest(group_ids=[big]), timeout=60)
        .groups[0]
        .ByteSize()
    )
    log(f"read amplification: a quiet window of {args.amplification_s:g} s first")
    first = len(healthy.latencies_s)
    time.sleep(args.amplification_s)
    quiet = healthy.latencies_s[first:]
    rss_before = peak_rss_mib(pid)
    outcomes: Counter[tuple[str, str]] = Counter()
    wrong_entries: list[str] = []
    # The clients run in processes of their own, so that decoding 10,000-entry answers does
    # not hold this process's GIL while the healthy group's latencies are measured here.
    context = multiprocessing.get_context("spawn")
    results: Any = context.Queue()
    workers = [
        context.Process(
            target=amplification_client,
            args=(i, address, big, args.amplification_s, args.timeout_s, args.max_message_bytes),
            kwargs={"results": results},
            name=f"amplify-{i}",
            daemon=True,
        )
        for i in range(args.amplification_clients)
    ]
    for w in workers:
        w.start()
    time.sleep(2.0)  # the clients' interpreters start (imports) before the window counts
    first = len(healthy.latencies_s)
    for _ in workers:
        counted, wrong = results.get(timeout=args.amplification_s + args.timeout_s + 60)
        outcomes.update({(name, label): n for name, label, n in counted})
        wrong_entries.extend(wrong)
    for w in workers:
        w.join(timeout=30)
    during = healthy.latencies_s[first:]
    rss_after = peak_rss_mib(pid)
    stubs.close()
    internal = sum(
        n for (_name, label), n in outcomes.items() if label.startswith(("INTERNAL", "UNKNOWN"))
    )
    return {
        "big_group_description_bytes": size,
        "outcomes": {f"{name}: {label}": n for (name, label), n in sorted(outcomes.items())},
        "internal": internal,
        "wrong_entries": wrong_entries,
        "outside_contract": sum(n for (_n, label), n in outcomes.items() if "outside" in label),
        "healthy_quiet": {
            "calls": len(quiet),
            "p50_ms": round(percentile_ms(quiet, 0.50), 2),
            "p99_ms": round(percentile_ms(quiet, 0.99), 2),
        },
        "healthy_during": {
            "calls": len(during),
            "p50_ms": round(percentile_ms(during, 0.50), 2),
            "p99_ms": round(percentile_ms(during, 0.99), 2),
        },
        "peak_rss_mib_before": round(rss_before, 1),
        "peak_rss_mib_after": round(rss_after, 1),
    }


def run(args: argparse.Namespace, stack: ExitStack) -> dict[str, Any]:
    state_dir = Path(args.state_dir) if args.state_dir else None

    def note_state(name: str, value: str) -> None:
        """Tell bench/run-fuzz's exit trap what to clean up if this process dies."""
        if state_dir is not None:
            (state_dir / name).write_text(value)

    from tests.support.pgcluster import ThrowawayCluster, create_database

    RESULTS.mkdir(parents=True, exist_ok=True)
    log("starting a throwaway PostgreSQL")
    cluster = ThrowawayCluster()
    cluster.start()
    stack.callback(cluster.stop)
    note_state("pg_base", str(cluster.base_dir))
    note_state("pg_bin", str(cluster.bin_dir))
    database_url = create_database(cluster.url, "fuzz")

    coordinator_log = RESULTS / "fuzz-coordinator.log"
    coordinator_log.unlink(missing_ok=True)
    coordinator = CoordinatorProcess(
        database_url,
        "--node-id",
        "bench-fuzz",
        "--max-message-bytes",
        str(args.max_message_bytes),
        "--log-level",
        args.coordinator_log_level,
        # The fuzz's classic sessions are short (tests/fuzz): with the default bounds most of
        # its JoinGroups would stop at INVALID_SESSION_TIMEOUT and never reach a group.
        *hostile.CLASSIC_FLAGS,
        log_path=coordinator_log,
    )
    log(f"starting coordinator-svc serve on {coordinator.address} (log: {coordinator_log})")
    coordinator.start()
    assert coordinator.proc is not None
    note_state("coordinator_pid", str(coordinator.proc.pid))

    def stop_coordinator() -> None:
        if coordinator.proc is not None and coordinator.proc.poll() is None:
            try:
                coordinator.terminate(30)
            except subprocess.TimeoutExpired:
                log("the coordinator did not stop on SIGTERM within 30 s; killing it")
        coordinator.close()

    stack.callback(stop_coordinator)

    healthy = hostile.HealthyGroup(coordinator.address, members=args.healthy_members).start()
    stack.callback(healthy.stop)
    log(f"healthy group {healthy.group_id!r}: {args.healthy_members} members, stable")

    amplification = amplification_phase(args, coordinator.address, coordinator.proc.pid, healthy)

    world = hostile.World(healthy_group=healthy.group_id)
    tally = Tally()
    claimed = 0
    claim_lock = threading.Lock()

    def claim() -> bool:
        nonlocal claimed
        with claim_lock:
            if claimed >= args.requests:
                return False
            claimed += 1
            return True

    threads = [
        threading.Thread(
            target=client_thread,
            args=(i, args, coordinator.address, world, tally, claim),
            name=f"fuzz-{i}",
            daemon=True,
        )
        for i in range(args.threads)
    ]
    log(f"sending {args.requests:,} hostile requests from {args.threads} threads")
    started = time.monotonic()
    for t in threads:
        t.start()
    last = started
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=0.5)
        if time.monotonic() - last >= args.progress_s:
            last = time.monotonic()
            done = sum(tally.outcomes.values())
            log(
                f"  {done:,} answered, {done / (last - started):,.0f}/s; must-be-zero so far: "
                f"{tally.fatal} fatal, {tally.violations} other; coordinator "
                f"{rss_mib(coordinator.proc.pid):,.0f} MiB resident"
            )
    seconds = time.monotonic() - started
    answered = sum(tally.outcomes.values())
    log(f"{answered:,} answered in {seconds:.1f} s ({answered / seconds:,.0f}/s)")

    rss_after = rss_mib(coordinator.proc.pid)
    healthy.stop()
    heartbeats = len(healthy.latencies_s)
    time.sleep(0.5)  # lines gRPC logs just after the last answers
    log_text = coordinator_log.read_text(encoding="utf-8", errors="replace")
    tracebacks, error_lines = hostile.log_findings(log_text)
    invariants = hostile.check_invariants(database_url)
    return {
        "seconds": round(seconds, 1),
        "answered": answered,
        "rate_per_s": round(answered / seconds, 1),
        "outcomes": tally.outcomes,
        "latency_ms": {
            rpc: {
                "p50": round(percentile_ms(v, 0.50), 2),
                "p99": round(percentile_ms(v, 0.99), 2),
                "max": round(percentile_ms(v, 1.0), 2),
            }
            for rpc, v in tally.latencies_s.items()
        },
        "coordinator_rss_mib": round(rss_after, 1),
        "fatal": tally.fatal,
        "violations": tally.violations,
        "problems": tally.problems,
        "examples": tally.examples,
        "first": tally.first,
        "tracebacks": tracebacks,
        "error_lines": error_lines,
        "invariants": invariants,
        "amplification": amplification,
        "healthy": {
            "heartbeats_and_calls": heartbeats,
            "p50_ms": round(healthy.latency_ms(0.50), 2),
            "p99_ms": round(healthy.latency_ms(0.99), 2),
            "installs": healthy.installs,
            "errors": healthy.errors,
            "unavailable": healthy.unavailable,
        },
    }


def print_report(args: argparse.Namespace, r: dict[str, Any]) -> int:
    outcomes: Counter[tuple[str, str, str]] = r["outcomes"]
    print()
    print(
        f"Answers per RPC and outcome ({r['answered']:,} requests in {r['seconds']} s, "
        f"{r['rate_per_s']:,.0f}/s; message = well-formed with hostile values, raw = raw body)"
    )
    for rpc in ORDER:
        lat = r["latency_ms"][rpc]
        print(f"  {rpc}: p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms, max {lat['max']:.0f} ms")
        for kind in ("message", "raw"):
            row = {label: n for (rr, k, label), n in outcomes.items() if rr == rpc and k == kind}
            if not row:
                continue
            cells = ", ".join(f"{label} {n:,}" for label, n in sorted(row.items(), key=_order))
            print(f"  {rpc:30s} {kind:7s} {sum(row.values()):>7,}: {cells}")
    by_label: Counter[str] = Counter()
    for (_rpc, _kind, label), n in outcomes.items():
        by_label[label.split("/")[0] if not label.startswith("OK/") else "OK"] += n
    print(f"  gRPC statuses: {', '.join(f'{k} {v:,}' for k, v in by_label.most_common())}")
    print(f"  coordinator's resident memory at the end: {r['coordinator_rss_mib']:,.0f} MiB")

    internal = sum(n for (_r, _k, label), n in outcomes.items() if label in ("INTERNAL", "UNKNOWN"))
    in_band = r["fatal"] - internal
    h = r["healthy"]
    healthy_bad = len(h["errors"]) + len(h["unavailable"])
    amp = r["amplification"]
    checks = [
        ("read amplification: INTERNAL/UNKNOWN statuses", amp["internal"]),
        ("read amplification: answers outside the contract", amp["outside_contract"]),
        ("read amplification: answers without one entry per id", len(amp["wrong_entries"])),
        ("gRPC INTERNAL/UNKNOWN statuses", internal),
        ("in-band UNKNOWN_SERVER_ERROR answers", in_band),
        ("other answers outside the contract", r["violations"]),
        ("tracebacks in the coordinator's log", r["tracebacks"]),
        ("broken SQL invariants (rows)", sum(len(v) for v in r["invariants"].violations.values())),
        ("healthy group: error answers", len(h["errors"])),
        ("healthy group: failed calls (unavailable)", len(h["unavailable"])),
    ]
    print()
    print(
        f"Read amplification (DescribeGroups, {args.amplification_clients} client processes for "
        f"{args.amplification_s:g} s; the group described is {amp['big_group_description_bytes']:,}"
        " bytes; codes: 0 described, 42 named before, 44 past a limit, 69 not found):"
    )
    for case, n in amp["outcomes"].items():
        print(f"  {n:>6,}  {case}")
    q, d = amp["healthy_quiet"], amp["healthy_during"]
    print(
        f"  healthy group's heartbeat p99: {q['p99_ms']:.2f} ms without ({q['calls']:,} calls), "
        f"{d['p99_ms']:.2f} ms during ({d['calls']:,} calls); p50 {q['p50_ms']:.2f} -> "
        f"{d['p50_ms']:.2f} ms"
    )
    print(
        f"  coordinator's peak RSS: {amp['peak_rss_mib_before']:,.0f} MiB before, "
        f"{amp['peak_rss_mib_after']:,.0f} MiB after"
    )
    print()
    print("Must be zero:")
    for name, value in checks:
        print(f"  {name:45s} {value:>8,}   {'OK' if value == 0 else 'FAILED'}")
    print(
        f"  (error lines in the coordinator's log, tracebacks included: {len(r['error_lines']):,};"
        f" log: {RESULTS / 'fuzz-coordinator.log'})"
    )
    print()
    print("SQL invariants (plain SQL, one snapshot, after the run):")
    for line in r["invariants"].describe().splitlines():
        print(f"  {line}")
    counts = r["invariants"].counts
    print(f"  rows: {', '.join(f'{k} {v:,}' for k, v in counts.items())}")
    print()
    print(
        f"Healthy group ({args.healthy_members} members, a heartbeat each every 200 ms): "
        f"{h['heartbeats_and_calls']:,} calls, heartbeat p50 {h['p50_ms']:.2f} ms, "
        f"p99 {h['p99_ms']:.2f} ms, {h['installs']} assignments installed; "
        f"error answers {len(h['errors'])}, unavailable {len(h['unavailable'])}"
    )
    for line in (h["errors"] + h["unavailable"])[:10]:
        print(f"  {line[:300]}")
    if r["problems"]:
        print()
        print("Problems (count, then the first example of each):")
        for key, n in r["problems"].most_common():
            print(f"  {n:>6,}  {key}")
            example = r["examples"][key][0]
            print(f"          {example['kind']} request: {example['request'][:400]}")
            print(f"          answer: {example['answer'][:400]}")
    if r["tracebacks"]:
        print()
        print("Tracebacks and error lines in the coordinator's log (distinct messages):")
        seen: Counter[str] = Counter()
        for line in r["error_lines"]:
            found = LOGGER_MSG.search(line)
            seen[f"{found[1]}: {found[2]}" if found else line[:160]] += 1
        for msg, n in seen.most_common(10):
            print(f"  {n:>6,}  {msg[:200]}")
    failed = any(value for _name, value in checks) or healthy_bad
    print()
    print("RESULT: " + ("FAILED (a must-be-zero count is not zero)" if failed else "OK"))
    return 1 if failed else 0


def _order(item: tuple[str, int]) -> tuple[int, str]:
    return (-item[1], item[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=100_000, help="hostile requests in all")
    parser.add_argument("--threads", type=int, default=4, help="client threads (own channel each)")
    parser.add_argument("--seed", type=int, default=12, help="seed of the generators")
    parser.add_argument(
        "--raw-percent", type=int, default=50, help="share of raw bodies, in percent"
    )
    parser.add_argument("--healthy-members", type=int, default=3)
    parser.add_argument(
        "--max-message-bytes",
        type=int,
        default=1024 * 1024,
        help="the coordinator's --max-message-bytes (small: oversized bodies are cheap to send)",
    )
    parser.add_argument("--timeout-s", type=float, default=30.0, help="deadline of each call")
    parser.add_argument(
        "--amplification-s",
        type=float,
        default=10.0,
        help="length of the quiet window and of the read-amplification window",
    )
    parser.add_argument(
        "--amplification-clients",
        type=int,
        default=2,
        help="read-amplification clients (processes)",
    )
    parser.add_argument("--coordinator-log-level", default="INFO")
    parser.add_argument("--progress-s", type=float, default=10.0)
    parser.add_argument("--output", default=str(RESULTS / "fuzz-latest.json"))
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.threads < 1 or not 0 <= args.raw_percent <= 100:
        parser.error("--requests and --threads must be >= 1, --raw-percent within 0..100")

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with ExitStack() as stack:
        result = run(args, stack)
        log("stopping the coordinator and PostgreSQL")
    rc = print_report(args, result)
    report = {
        "run": {
            "started": started,
            "host": {"python": platform.python_version(), "grpcio": grpc.__version__},
            "config": {k: v for k, v in vars(args).items() if k not in ("state_dir", "output")},
            "result": "OK" if rc == 0 else "FAILED",
        },
        "seconds": result["seconds"],
        "answered": result["answered"],
        "rate_per_s": result["rate_per_s"],
        "outcomes": [
            {"rpc": rpc, "kind": kind, "outcome": label, "count": n}
            for (rpc, kind, label), n in sorted(result["outcomes"].items())
        ],
        "must_be_zero": {
            "fatal_answers": result["fatal"],
            "other_violations": result["violations"],
            "tracebacks": result["tracebacks"],
            "invariant_violations": result["invariants"].violations,
            "healthy_errors": result["healthy"]["errors"],
            "healthy_unavailable": result["healthy"]["unavailable"],
        },
        "problems": [
            {"problem": key, "count": n, "examples": result["examples"][key]}
            for key, n in result["problems"].most_common()
        ],
        "first_of_each_outcome": [
            {"rpc": rpc, "kind": kind, "outcome": label, **example}
            for (rpc, kind, label), example in sorted(result["first"].items())
        ],
        "log_error_lines": result["error_lines"][:50],
        "table_rows": result["invariants"].counts,
        "latency_ms": result["latency_ms"],
        "coordinator_rss_mib": result["coordinator_rss_mib"],
        "healthy": result["healthy"],
        "amplification": result["amplification"],
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {args.output}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
