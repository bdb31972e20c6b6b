"""Found by the rehearsal: how long a worker pod's agent takes to act on a heartbeat answer.

A (re)started worker pod's agent joins, is asked to compute the assignment or gets its work back in
the answer, and should act on that at once. The agent's loop, though, computes how long to sleep
*before* it sends the heartbeat (with a heartbeat in flight only the next interval is due) and acts
on the answer (compute, start or stop work, follow NOT_COORDINATOR) only when it wakes up: up to one
heartbeat interval late, a whole 3 s on a fresh agent (the interval it uses until the coordinator
tells it its own). In the rehearsal (dev: heartbeat 1 s) each restarted pod ran its work about 3 s
after it was ready, and a redirected agent sent its next heartbeat 3 s after the redirect. With a
session timeout near 3 s the fresh agent even wakes up past its own self-fencing deadline, stops
everything and rejoins.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from tests.deploy.local import wait_for
from tests.support.client import put_connector
from tests.support.coordinator import CoordinatorProcess, Stubs


def _at(lines: list[str], prefix: str) -> datetime | None:
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if str(entry.get("msg", "")).startswith(prefix):
            return datetime.fromisoformat(entry["ts"].replace("Z", "+00:00"))
    return None


def test_a_joining_agent_acts_on_the_answers_at_once(database_url: str, tmp_path: Path) -> None:
    # FAST_DEFAULTS: heartbeat interval 200 ms, session timeout 3000 ms.
    coordinator = CoordinatorProcess(database_url, log_path=tmp_path / "coordinator.log")
    coordinator.start()
    log = tmp_path / "agent.log"
    try:
        stubs = Stubs(coordinator.address)
        try:
            assert put_connector(stubs, "g", "orders", 2).error_code == 0
        finally:
            stubs.close()
        with open(log, "wb") as out:
            agent = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "worker-agent"),
                    "run",
                    "--coordinator",
                    coordinator.address,
                    "--group",
                    "g",
                    "--member-id",
                    "connect-worker-0",
                    "--instance-id",
                    "connect-worker-0",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            try:

                def started() -> bool:
                    return _at(log.read_text().splitlines(), "starting:") is not None

                wait_for("the agent to start its work", started, 15, log.read_text)
            finally:
                agent.terminate()
                agent.wait(15)
    finally:
        coordinator.close()
    lines = log.read_text().splitlines()
    began = _at(lines, "agent starting")
    starting = _at(lines, "starting:")
    assert began is not None and starting is not None, lines
    assert not any("fencing itself" in line for line in lines), "\n".join(lines)
    # Join, compute, install, one more heartbeat: a few round trips on the loopback.
    took_s = (starting - began).total_seconds()
    assert took_s < 1.5, f"the agent started its first work {took_s:.2f} s after it started"
