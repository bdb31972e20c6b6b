"""End to end, the connector lifecycle as the agents see it (issue 28, DESIGN 3.20): a real
coordinator (`coordinator-svc serve` on PostgreSQL, FAST_DEFAULTS: heartbeat 200 ms) and real
worker agents (`python -m worker_agent.cli run`, connect protocol, DEBUG logs) with the recording
exec hook, which keeps the configs each event carried.

What it shows: every `assigned` call carries exactly the configs of its resources' connectors; a
config change reaches exactly the holders of the connector or its tasks, as `reconfigured`
calls, within two heartbeat intervals, and nobody else's hook is called; a fetch after a
connector moved away omits it; an answer lost on the way (a TCP proxy drops it) is repaired by
the next heartbeat; a secret value is in no agent log (DEBUG included) and in no /assignment
read from outside the pod (a rebinding Host, a cross-site request), while the worker's own read
gets it; a start hook that fails shows FAILED with its output in DescribeGroups, then RUNNING
once its retry succeeds; statuses RUNNING for everything else.

The classic agents' counterpart is `test_lifecycle_classic_e2e.py`."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from connect.group.v1 import admin_pb2, common_pb2

from tests.support.agents import Fleet, HookRecord, wait_for
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

INTERVAL_S = 0.2  # FAST_DEFAULTS.heartbeat_interval_ms
#: What a hook call adds to a delivery: starting `python -S record_hook.py` on a busy machine.
HOOK_START_S = 0.15
SECRET = "hunter2-0123456789abcdef"
ROTATED = "rotated-fedcba9876543210"
DROPPED = "dropped-answer-0a1b2c3d4e"
CATALOGUE = {"A": 2, "B": 0, "C": 0, "D": 0}
DEBUG = "DEBUG"


def config_of(name: str, secret: str = SECRET) -> dict[str, str]:
    return {"topic": f"{name.lower()}-topic", "password": secret}


def connector_of(resource: str) -> str:
    head, _, tail = resource.rpartition("-")
    return head if head and tail.isdigit() else resource


def connectors(resources: set[str] | frozenset[str]) -> set[str]:
    return {connector_of(r) for r in resources}


def records(fleet: Fleet, member: str, event: str, after: float = 0.0) -> list[HookRecord]:
    return [r for r in fleet.records(member, after) if r.event == event]


def status_port(fleet: Fleet, member: str) -> int:
    pattern = re.compile(r"status endpoint on http://127\.0\.0\.1:(\d+)/")
    found = wait_for(
        f"{member}'s status endpoint",
        lambda: next(
            (
                m
                for line in fleet.agents[member].current.log_lines("status endpoint on")
                if (m := pattern.search(line))
            ),
            None,
        ),
    )
    return int(found.group(1))


def get_assignment(port: int, headers: dict[str, str]) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/assignment", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as resp:
        body: dict[str, Any] = json.loads(resp.read())
    return body


def statuses(fleet: Fleet) -> dict[str, Any]:
    resp = fleet.stubs.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=[fleet.group], include_status=True), timeout=10
    )
    (group,) = resp.groups
    return {
        f"{s.connector}-{s.task}" if s.HasField("task") else s.connector: s for s in group.statuses
    }


def all_running(fleet: Fleet) -> dict[str, Any] | None:
    view = statuses(fleet)
    return view if all(s.state == common_pb2.RUNNING for s in view.values()) else None


@pytest.fixture
def proxy(fleet: Fleet) -> Iterator[TcpProxy]:
    with TcpProxy(fleet.coordinator) as p:
        yield p


def test_configs_reach_exactly_their_holders_and_statuses_come_back(
    fleet: Fleet, proxy: TcpProxy, tmp_path: Path
) -> None:
    fail_file = tmp_path / "fail-to-start"
    for name, tasks in CATALOGUE.items():
        fleet.put_connector(name, tasks, config_of(name))
    common: dict[str, Any] = {"log_level": DEBUG, "fail_file": fail_file}
    fleet.agent("W1", extra_args=("--status-port", "0"), **common)
    fleet.agent("W3", coordinator=proxy.address, rpc_timeout_s=0.3, **common)
    fleet.start("W1")
    alone = fleet.wait_quiet({"W1"})
    (first,) = records(fleet, "W1", "assigned")
    assert first.configs is not None and set(first.configs) == set(CATALOGUE)
    assert all(first.configs[n]["config"] == config_of(n) for n in CATALOGUE)
    digests = {n: first.configs[n]["digest"] for n in CATALOGUE}

    fleet.start("W2", "W3", **common)
    quiet = fleet.wait_quiet({"W1", "W2", "W3"})
    # Every assigned call carried exactly the configs of its resources' connectors.
    for member in ("W1", "W2", "W3"):
        for rec in records(fleet, member, "assigned"):
            assert rec.configs is not None and set(rec.configs) == connectors(rec.resources), rec
            for name, held in rec.configs.items():
                assert held == {"digest": digests[name], "config": config_of(name)}, rec
    lost = connectors(alone.assigned["W1"]) - connectors(quiet.assigned["W1"])
    assert lost, quiet.assigned  # balance moved whole connectors away from W1

    # A config change reaches exactly the holders of the connector or its tasks.
    changed = sorted(connectors(quiet.assigned["W1"]))[0]
    holders = {m for m, held in quiet.assigned.items() if changed in connectors(held)}
    t_put = time.time()
    fleet.put_connector(changed, CATALOGUE[changed], config_of(changed, ROTATED))
    delivered = wait_for(
        f"{changed}'s new config at its holders {sorted(holders)}",
        lambda: (
            {m: rs for m in holders if (rs := records(fleet, m, "reconfigured", t_put))}
            if all(records(fleet, m, "reconfigured", t_put) for m in holders)
            else None
        ),
        timeout_s=5,
        diagnostics=fleet.diagnostics,
    )
    time.sleep(2 * INTERVAL_S)  # anyone else would have been told by now
    for member in ("W1", "W2", "W3"):
        calls = fleet.records(member, t_put)
        if member not in holders:
            assert not calls, (member, calls)
            continue
        (call,) = calls
        assert call.event == "reconfigured"
        assert call.resources == {r for r in quiet.assigned[member] if connector_of(r) == changed}
        assert call.configs is not None and set(call.configs) == {changed}
        assert call.configs[changed]["config"] == config_of(changed, ROTATED)
        assert call.configs[changed]["digest"] != digests[changed]
        assert call.t_start - t_put < 2 * INTERVAL_S + HOOK_START_S, (call, t_put)
    assert set(delivered) == holders
    # W1's fetch after the change answered only what it holds: never what moved away.
    (last_fetch,) = fleet.agents["W1"].current.log_lines("configs at lifecycle revision")[-1:]
    fetched = set(re.findall(r"(\w+) \([\w-]+:", last_fetch.split("):", 1)[1]))
    assert fetched == connectors(quiet.assigned["W1"]) and not fetched & lost, last_fetch

    # The worker's own read of /assignment has the values; a read from outside the pod has
    # digests only: a page whose name was rebound to 127.0.0.1, a cross-site request.
    port = status_port(fleet, "W1")
    own = get_assignment(port, {"Host": f"127.0.0.1:{port}", "X-Worker-Agent": "assignment"})
    assert own["configs"][changed]["config"] == config_of(changed, ROTATED)
    for headers, rule in (
        ({"Host": f"rebound.example:{port}", "X-Worker-Agent": "assignment"}, "host"),
        ({"Origin": "http://evil.example", "X-Worker-Agent": "assignment"}, "cross-site"),
        ({"Sec-Fetch-Site": "cross-site", "X-Worker-Agent": "assignment"}, "cross-site"),
        ({}, "header"),
    ):
        seen = get_assignment(port, headers)
        assert seen["configs_withheld"]["rule"] == rule, (headers, seen)
        assert set(seen["configs"]) == connectors(quiet.assigned["W1"])
        assert all(set(c) == {"digest"} for c in seen["configs"].values()), seen
        assert SECRET not in json.dumps(seen) and ROTATED not in json.dumps(seen)

    # An answer dropped on its way to W3 (the proxy throws W3's answers away) is repaired by
    # the next heartbeat: W3 still gets the change of a connector it holds.
    target = sorted(connectors(quiet.assigned["W3"]))[0]
    t_drop = time.time()
    proxy.cut("drop")
    fleet.put_connector(target, CATALOGUE[target], config_of(target, DROPPED))
    wait_for("an answer to W3 dropped", lambda: proxy.dropped_bytes > 0, timeout_s=3)
    # W3's next heartbeat (after its call deadline, 0.3 s) carries the raised revision: lost too.
    time.sleep(max(0.0, t_drop + 0.5 - time.time()))
    proxy.restore()
    t_restore = time.time()
    wait_for(
        f"W3 reconfigured with {target}'s config after the drop",
        lambda: any(
            r.configs and r.configs[target]["config"] == config_of(target, DROPPED)
            for r in records(fleet, "W3", "reconfigured", t_drop)
        ),
        timeout_s=5,
        diagnostics=fleet.diagnostics,
    )
    assert fleet.agents["W3"].current.log_lines("heartbeat failed")  # the answer was lost
    assert not fleet.agents["W3"].current.log_lines("membership lost")
    repaired = records(fleet, "W3", "reconfigured", t_drop)[-1]
    assert repaired.t_start - t_restore < 1.0 + 2 * INTERVAL_S, (repaired, t_restore)

    # Statuses came back from the holders: everything RUNNING, with its holder.
    held_by = {r: m for m, held in quiet.assigned.items() for r in held}
    view = wait_for("every resource RUNNING", lambda: all_running(fleet), timeout_s=5)
    assert {r: s.worker_id for r, s in view.items()} == held_by

    # A start hook that fails: FAILED with its output, then RUNNING once it is restarted (a
    # failed start is made once).
    fail_file.write_text("E\nthe sink is not reachable\n")
    fleet.put_connector("E", 0, config_of("E"))
    failed = wait_for(
        "E FAILED in DescribeGroups",
        lambda: s if (s := statuses(fleet).get("E")) and s.state == common_pb2.FAILED else None,
        timeout_s=10,
        diagnostics=fleet.diagnostics,
    )
    assert "exited with 1" in failed.trace, failed.trace
    assert "cannot start E: the sink is not reachable" in failed.trace, failed.trace
    assert SECRET not in failed.trace
    fail_file.unlink()
    time.sleep(4 * INTERVAL_S)
    assert statuses(fleet)["E"].state == common_pb2.FAILED  # a failed start is made once
    restarted = fleet.stubs.admin.RestartConnector(
        admin_pb2.RestartConnectorRequest(group_id=fleet.group, connector="E"), timeout=10
    )
    assert [p.worker_id for p in restarted.restarts] == [failed.worker_id], restarted
    running = wait_for(
        "E RUNNING after its restart",
        lambda: s if (s := statuses(fleet).get("E")) and s.state == common_pb2.RUNNING else None,
        timeout_s=10,
        diagnostics=fleet.diagnostics,
    )
    assert running.worker_id == failed.worker_id and running.trace == ""
    fleet.wait_quiet({"W1", "W2", "W3"})

    # No secret in any agent's log, DEBUG lines included (they name digests).
    for member, agent in fleet.agents.items():
        text = "\n".join(agent.current.log_lines())
        assert " DEBUG " in text, member
        for value in (SECRET, ROTATED, DROPPED):
            assert value not in text, (member, value)
