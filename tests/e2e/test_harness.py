"""The end-to-end harness checks itself: the recording hook, the interval reconstruction and the
overlap check (a check that cannot fail proves nothing), and the TCP proxy's cut modes."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agents import (
    HOOK_SCRIPT,
    HookRecord,
    check_balanced,
    check_no_overlap,
    intervals_of,
    running_now,
)
from tests.support.tcp_proxy import TcpProxy


def rec(worker: str, event: str, resources: set[str], t0: float, t1: float) -> HookRecord:
    return HookRecord(worker, event, 1, frozenset(resources), t0, t1)


# --- the recording hook ---------------------------------------------------------------------


def test_record_hook_appends_one_line_per_call(tmp_path: Path) -> None:
    out = tmp_path / "w.jsonl"
    event = {
        "event": "assigned",
        "group_id": "g",
        "member_id": "W1",
        "member_epoch": 7,
        "connectors": ["A"],
        "tasks": [{"connector": "A", "task": 0}],
    }
    for _ in range(2):
        subprocess.run(
            [sys.executable, "-S", str(HOOK_SCRIPT), str(out), "0.01"],
            input=json.dumps(event).encode(),
            check=True,
            timeout=10,
        )
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    parsed = HookRecord.parse(lines[0], "W1#1")
    assert (parsed.worker, parsed.event, parsed.member_epoch) == ("W1", "assigned", 7)
    assert parsed.resources == {"A", "A-0"}
    assert parsed.t_end - parsed.t_start >= 0.01


# --- intervals and the checks ---------------------------------------------------------------


def test_intervals_run_from_the_assigned_call_to_the_revoked_call() -> None:
    ivs, problems = intervals_of(
        [
            rec("W1", "assigned", {"A", "A-0"}, 1.0, 1.1),
            rec("W1", "revoked", {"A-0"}, 2.0, 2.2),
        ],
        "W1#1",
        "W1",
    )
    assert not problems
    by = {iv.resource: iv for iv in ivs}
    assert (by["A-0"].start, by["A-0"].end, by["A-0"].started, by["A-0"].stopping) == (
        1.0,
        2.2,
        1.1,
        2.0,
    )
    assert by["A"].open and math.isinf(by["A"].end)
    assert running_now(ivs) == {"W1#1": {"A"}}


def test_a_kill_ends_everything_and_inconsistencies_are_reported() -> None:
    ivs, problems = intervals_of(
        [rec("W1", "assigned", {"A"}, 1.0, 1.1), rec("W1", "revoked", {"B"}, 1.5, 1.6)],
        "W1#1",
        "W1",
        killed_at=3.0,
    )
    assert [(iv.resource, iv.end) for iv in ivs] == [("A", 3.0)]
    assert running_now(ivs) == {}
    assert problems == [f"W1#1: B revoked but not running: {rec('W1', 'revoked', {'B'}, 1.5, 1.6)}"]


def test_overlap_is_caught_and_a_clean_handover_is_not() -> None:
    old, _ = intervals_of(
        [rec("W1", "assigned", {"A"}, 1.0, 1.1), rec("W1", "revoked", {"A"}, 2.0, 2.3)],
        "W1#1",
        "W1",
    )
    clean, _ = intervals_of([rec("W2", "assigned", {"A"}, 2.4, 2.5)], "W2#1", "W2")
    assert check_no_overlap(old + clean) == []
    # W2 began starting A while W1 was still stopping it: that counts as running twice.
    early, _ = intervals_of([rec("W2", "assigned", {"A"}, 2.2, 2.5)], "W2#1", "W2")
    [problem] = check_no_overlap(old + early)
    assert problem.startswith("A ran on W1#1") and "W2#1" in problem
    # Two runs of one worker are two runners too.
    again, _ = intervals_of([rec("W1", "assigned", {"A"}, 1.5, 1.6)], "W1#2", "W1")
    assert check_no_overlap(old + again)


def test_balance_is_within_one_for_connectors_and_tasks_separately() -> None:
    assert check_balanced({"W1": {"A", "A-0"}, "W2": {"B", "A-1"}, "W3": {"B-0"}}) == []
    [problem] = check_balanced({"W1": {"A", "B"}, "W2": {"A-0"}, "W3": {"A-1"}})
    assert problem.startswith("connectors")


# --- the TCP proxy --------------------------------------------------------------------------


@pytest.fixture
def echo_server() -> Iterator[str]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(1024):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    server.close()


def roundtrip(address: str, payload: bytes = b"ping", timeout_s: float = 1.0) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(payload)
        return sock.recv(1024)


def test_proxy_forwards_cuts_and_restores(echo_server: str) -> None:
    with TcpProxy(echo_server) as proxy:
        assert roundtrip(proxy.address) == b"ping"

        proxy.cut("refuse")
        with pytest.raises(ConnectionRefusedError):
            roundtrip(proxy.address)
        proxy.restore()
        assert roundtrip(proxy.address) == b"ping"

        proxy.cut("blackhole")
        with pytest.raises(TimeoutError):
            roundtrip(proxy.address, timeout_s=0.3)  # accepted, never answered
        proxy.restore()
        assert roundtrip(proxy.address) == b"ping"


def test_proxy_freeze_holds_open_connections_and_restore_delivers(echo_server: str) -> None:
    with TcpProxy(echo_server) as proxy:
        host, port = proxy.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=1.0) as sock:
            sock.sendall(b"one")
            assert sock.recv(1024) == b"one"
            proxy.cut("freeze")
            sock.sendall(b"two")
            sock.settimeout(0.3)
            with pytest.raises(TimeoutError):
                sock.recv(1024)
            proxy.restore()
            sock.settimeout(2.0)
            assert sock.recv(1024) == b"two"
