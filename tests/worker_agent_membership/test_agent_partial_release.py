"""The real `Agent` (runtime, membership machine, listener, status endpoint) against a scripted
coordinator (`fake_coordinator.FakeCoordinator`: real gRPC on 127.0.0.1, answers chosen by the
test), so that partial releases and fencing tokens are checked without depending on the real
coordinator's version.

The script: the join is answered at epoch 1 with ALL (and TOKENS); once the member reports that it
runs ALL, it is told to keep KEEP only (the rest is revoked, the member stays at epoch 1); once it
reports KEEP, it moves to epoch 2. The heartbeat interval is long (3 s), so a heartbeat that
follows a release within a fraction of a second was sent because of it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from connect_protocol.messages import HeartbeatRequest, HeartbeatResponse
from connect_protocol.resources import EMPTY, ResourceSet
from connect_protocol.tokens import FencingTokens
from tests.worker_agent_membership.fake_coordinator import FakeCoordinator, Seen, answer, rs
from worker_agent.assignors import assignors_for_protocol
from worker_agent.hooks import ExecHookListener
from worker_agent.listener import CallbackListener, RebalanceEvent, WorkerRebalanceListener
from worker_agent.runtime import Agent, AgentSettings
from worker_agent.status import StatusServer

KEEP = rs("A", "A-0")
REVOKED = rs("B", "B-0", "B-1", "C")
ALL = KEEP | REVOKED
TOKENS = FencingTokens.granted(ALL, 5).with_grant(rs("B-1"), 11)
INTERVAL_MS = 3_000
SESSION_MS = 30_000


@dataclass
class Script:
    """The coordinator's side of the scenario above."""

    owned: ResourceSet = EMPTY
    epoch: int = 1
    revoked: bool = False

    def __call__(self, req: HeartbeatRequest, seen: list[Seen]) -> HeartbeatResponse:
        if req.member_epoch < 0:
            return HeartbeatResponse(member_epoch=req.member_epoch)  # the leave
        timing = {"interval_ms": INTERVAL_MS, "session_ms": SESSION_MS}
        if req.member_epoch == 0:
            return answer(1, ALL, TOKENS, **timing)
        if req.owned is not None:
            self.owned = req.owned
        if not self.revoked and self.owned == ALL:
            self.revoked = True
            return answer(1, KEEP, TOKENS.restricted(KEEP), **timing)
        if self.revoked and self.epoch == 1 and self.owned == KEEP:
            self.epoch = 2
            return answer(2, KEEP, TOKENS.restricted(KEEP), **timing)
        return answer(self.epoch, None, **timing)


@dataclass
class Recorder:
    """What the listener was called with, and when each release was made."""

    events: list[RebalanceEvent] = field(default_factory=list)
    releases: list[tuple[float, ResourceSet]] = field(default_factory=list)

    def revoked(self) -> list[RebalanceEvent]:
        return [e for e in self.events if e.event == "revoked"]

    def assigned(self) -> list[RebalanceEvent]:
        return [e for e in self.events if e.event == "assigned"]


def wait_for(what: str, condition: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def fake() -> Iterator[FakeCoordinator]:
    with FakeCoordinator(Script()) as coordinator:
        yield coordinator


@dataclass
class Running:
    agent: Agent
    thread: threading.Thread
    status: StatusServer


@pytest.fixture
def run_agent(fake: FakeCoordinator) -> Iterator[Callable[[WorkerRebalanceListener], Running]]:
    started: list[Running] = []

    def start(listener: WorkerRebalanceListener) -> Running:
        settings = AgentSettings(
            group_id="g",
            member_id="w1",
            coordinators=(fake.address,),
            assignors=tuple(assignors_for_protocol("sessioned")),
            rebalance_timeout_ms=30_000,
            rpc_timeout_s=2.0,
            listener_initial_backoff_s=0.05,
            listener_max_backoff_s=0.05,
        )
        status = StatusServer("g", "w1", keepalive_s=0.5)
        status.start()
        agent = Agent(settings, listener, status)
        thread = threading.Thread(target=agent.run, name="agent", daemon=True)
        thread.start()
        running = Running(agent, thread, status)
        started.append(running)
        return running

    yield start
    for running in started:
        running.agent.abandon()
        running.thread.join(20)
        running.status.close()
        assert not running.thread.is_alive(), "the agent did not stop"


def shrinking_steps(fake: FakeCoordinator) -> list[ResourceSet]:
    """The owned lists reported from the first that held ALL on, without repeats."""
    out: list[ResourceSet] = []
    for owned in fake.owned_lists():
        if (owned == ALL or out) and (not out or owned != out[-1]):
            out.append(owned)
    return out


def arrival_of(fake: FakeCoordinator, owned: ResourceSet) -> float:
    return next(s.at for s in fake.seen() if s.request.owned == owned)


def get(status: StatusServer, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{status.port}{path}", timeout=5) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


# --- in-process listeners ------------------------------------------------------------------------


def test_an_in_process_listener_releasing_one_by_one_shrinks_the_owned_list_step_by_step(
    fake: FakeCoordinator, run_agent: Callable[[WorkerRebalanceListener], Running]
) -> None:
    rec = Recorder()
    order = ["C", "B-1", "B-0"]  # B is left for the return

    def on_revoked(event: RebalanceEvent) -> None:
        rec.events.append(event)
        if event.resources != REVOKED:
            return  # leaving at the end of the test
        for name in order:
            time.sleep(0.2)
            rec.releases.append((time.monotonic(), rs(name)))
            event.release(rs(name))
        time.sleep(0.2)

    running = run_agent(CallbackListener(on_revoked=on_revoked, on_assigned=rec.events.append))
    wait_for("epoch 2", lambda: running.agent.member_epoch == 2)
    assert shrinking_steps(fake) == [
        ALL,
        ALL - rs("C"),
        ALL - rs("C", "B-1"),
        ALL - rs("C", "B-1", "B-0"),
        KEEP,  # the rest, when on_revoked returned
    ]
    # Each shrink was sent because of its release, not at the next 3 s heartbeat.
    for (released_at, resources), step in zip(
        rec.releases, shrinking_steps(fake)[1:], strict=False
    ):
        lag = arrival_of(fake, step) - released_at
        assert 0 <= lag < 1.0, (resources, lag)
    # The member stayed at epoch 1 while it released, one call, all the revoked resources.
    (revoked,) = rec.revoked()
    assert (revoked.member_epoch, revoked.resources) == (1, REVOKED)
    assert revoked.fencing_tokens == TOKENS.restricted(REVOKED)
    partial = [s.request for s in fake.seen() if s.request.owned not in (None, ALL, KEEP, EMPTY)]
    assert partial and all(r.member_epoch == 1 for r in partial)


def test_a_listener_that_just_returns_is_acknowledged_as_a_whole(
    fake: FakeCoordinator, run_agent: Callable[[WorkerRebalanceListener], Running]
) -> None:
    rec = Recorder()
    running = run_agent(
        CallbackListener(on_revoked=rec.events.append, on_assigned=rec.events.append)
    )
    wait_for("epoch 2", lambda: running.agent.member_epoch == 2)
    assert shrinking_steps(fake) == [ALL, KEEP]


def test_a_failed_listener_is_retried_with_the_unreleased_remainder_only(
    fake: FakeCoordinator, run_agent: Callable[[WorkerRebalanceListener], Running]
) -> None:
    rec = Recorder()

    def on_revoked(event: RebalanceEvent) -> None:
        rec.events.append(event)
        if len(rec.revoked()) == 1:
            event.release("C")
            raise RuntimeError("B would not stop")

    running = run_agent(CallbackListener(on_revoked=on_revoked, on_assigned=rec.events.append))
    wait_for("epoch 2", lambda: running.agent.member_epoch == 2)
    first, retry = rec.revoked()
    assert first.resources == REVOKED
    assert retry.resources == REVOKED - rs("C")
    assert retry.fencing_tokens == TOKENS.restricted(REVOKED - rs("C"))
    assert shrinking_steps(fake) == [ALL, ALL - rs("C"), KEEP]


# --- tokens: the assigned event, /assignment, /watch ----------------------------------------------


def test_tokens_reach_the_assigned_event_and_the_status_endpoint(
    fake: FakeCoordinator, run_agent: Callable[[WorkerRebalanceListener], Running]
) -> None:
    rec = Recorder()
    running = run_agent(
        CallbackListener(on_revoked=rec.events.append, on_assigned=rec.events.append)
    )
    watch = urllib.request.urlopen(f"http://127.0.0.1:{running.status.port}/watch", timeout=10)
    try:
        wait_for("epoch 2", lambda: running.agent.member_epoch == 2)
        (assigned,) = rec.assigned()
        assert assigned.resources == ALL
        assert assigned.fencing_tokens == TOKENS
        assert assigned.to_json()["fencing_tokens"] == TOKENS.to_json()
        assert assigned.to_json()["fencing_tokens"]["tasks"][1] == {  # type: ignore[index]
            "connector": "B",
            "task": 0,
            "token": 5,
        }
        snapshot = wait_for(
            "/assignment at epoch 2",
            lambda: (s := get(running.status, "/assignment"))["member_epoch"] == 2 and s,
        )
        assert snapshot["connectors"] == ["A"]
        assert snapshot["fencing_tokens"] == TOKENS.restricted(KEEP).to_json()
        seen_all = False
        for raw in watch:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = json.loads(line.removeprefix("data: "))
            if data["connectors"] == ["A", "B", "C"]:
                assert data["fencing_tokens"] == TOKENS.to_json()
                seen_all = True
            if data["member_epoch"] == 2:
                assert data["fencing_tokens"] == TOKENS.restricted(KEEP).to_json()
                break
        assert seen_all
    finally:
        watch.close()


# --- the exec hook in per-resource mode ------------------------------------------------------

#: argv: RECORD_DIR. Records each call's event; on `revoked`, reports each resource released (one
#: line, 0.2 s apart). The first revoked call exits 1 after reporting one resource; later ones
#: report all and exit 0 after reporting all but the last (exit 0 releases it).
HOOK = r"""
import json, os, sys, time
record_dir = sys.argv[1]
event = json.loads(sys.stdin.read())
n = len(os.listdir(record_dir))
with open(os.path.join(record_dir, f"{n:03d}-{event['event']}.json"), "w") as f:
    json.dump(event, f)
if event["event"] != "revoked":
    sys.exit(0)
first = sum(name.endswith("-revoked.json") for name in os.listdir(record_dir)) == 1
singles = [{"connectors": [c]} for c in event["connectors"]]
singles += [{"tasks": [t]} for t in event["tasks"]]
for released in (singles[:1] if first else singles[:-1]):
    time.sleep(0.2)
    print(json.dumps({"released": released}), flush=True)
time.sleep(0.2)
sys.exit(1 if first else 0)
"""


def test_exec_hook_per_resource_releases_by_lines_a_failure_only_what_it_reported_exit_0_the_rest(
    fake: FakeCoordinator,
    run_agent: Callable[[WorkerRebalanceListener], Running],
    tmp_path: Path,
) -> None:
    hook = ExecHookListener([sys.executable, "-c", HOOK, str(tmp_path)], release="per-resource")
    running = run_agent(hook)
    wait_for("epoch 2", lambda: running.agent.member_epoch == 2, timeout_s=20)
    records = sorted(tmp_path.iterdir())
    kinds = [p.name.split("-", 1)[1] for p in records]
    assert kinds == ["assigned.json", "revoked.json", "revoked.json"]
    assigned, first, retry = (json.loads(p.read_text()) for p in records)
    assert assigned["fencing_tokens"] == TOKENS.to_json()
    assert first["release"] == "per-resource"
    assert ResourceSet.from_json(first) == REVOKED
    # The first run reported B and failed: only B was released; the retry got the rest, reported
    # all but its last (B-1) line by line, and exit 0 released B-1.
    assert ResourceSet.from_json(retry) == REVOKED - rs("B")
    assert retry["fencing_tokens"] == TOKENS.restricted(REVOKED - rs("B")).to_json()
    assert shrinking_steps(fake) == [
        ALL,
        ALL - rs("B"),
        ALL - rs("B", "C"),
        ALL - rs("B", "C", "B-0"),
        KEEP,
    ]
