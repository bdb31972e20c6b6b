"""A web page cannot make a local agent leave its group: a real `worker-agent run` (its status
endpoint on 0.0.0.0, as in the manifests) joined to a real coordinator refuses every POST /leave
that a browser could send (from another site, to a rebound name, without the agent's header),
with 403 naming the rule, and stays in its group; `worker-agent leave` still makes it leave."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agents import AgentProcess, wait_for
from tests.support.client import describe
from tests.support.coordinator import InProcessCoordinator, free_port
from worker_agent.status import refusal_of_state_change

GROUP = "leave-cross-site"
BIN = Path(sys.executable).parent

#: (headers of a POST /leave to 127.0.0.1, the rule it breaks). Host is given explicitly.
REFUSED = [
    (
        {"Host": "{local}", "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
        "cross-site",
    ),
    ({"Host": "{local}", "Origin": "http://evil.example", "X-Worker-Agent": "leave"}, "cross-site"),
    ({"Host": "{local}", "Sec-Fetch-Site": "same-site", "X-Worker-Agent": "leave"}, "cross-site"),
    ({"Host": "{local}", "Origin": "null", "X-Worker-Agent": "leave"}, "cross-site"),
    ({"Host": "{local}"}, "header"),  # a form or fetch without the custom header
    ({"Host": "{local}", "X-Worker-Agent": "something-else"}, "header"),
    ({"Host": "evil.example:{port}", "X-Worker-Agent": "leave"}, "host"),  # DNS rebinding
    ({"Host": "10.9.9.9", "X-Worker-Agent": "leave"}, "host"),
    ({"X-Worker-Agent": "leave"}, "host"),  # no Host at all
]


def _post(port: int, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("POST", "/leave?timeout_s=5", skip_host=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", "0")
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.fixture
def coordinator(database_url: str) -> Iterator[InProcessCoordinator]:
    with InProcessCoordinator(database_url) as coord:
        yield coord


def test_cross_site_requests_to_leave_are_refused_and_worker_agent_leave_works(
    coordinator: InProcessCoordinator, tmp_path: Path
) -> None:
    stubs = coordinator.stubs
    assert stubs is not None
    port = free_port()
    agent = AgentProcess(
        "w1",
        coordinator.address,
        GROUP,
        tmp_path,
        extra_args=("--status-port", str(port), "--status-host", "0.0.0.0"),
    ).start()
    try:
        wait_for("the agent's membership", lambda: len(describe(stubs, GROUP).members) == 1)
        epoch = describe(stubs, GROUP).group_epoch
        answers = []
        for headers, rule in REFUSED:
            filled = {k: v.format(local=f"127.0.0.1:{port}", port=port) for k, v in headers.items()}
            code, body = _post(port, filled)
            answers.append((code, body.get("rule"), rule))
        assert [(code, got) for code, got, _ in answers] == [(403, rule) for _, rule in REFUSED]
        # Nothing happened: the agent is still in its group, at the same group epoch.
        group = describe(stubs, GROUP)
        assert [m.member_id for m in group.members] == ["w1"] and group.group_epoch == epoch
        assert agent.alive
        # What the preStop hook runs is accepted: the agent leaves.
        done = subprocess.run(
            [str(BIN / "worker-agent"), "leave", f"--status-url=http://127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done
        wait_for("the leave", lambda: len(describe(stubs, GROUP).members) == 0)
    finally:
        agent.close()


@pytest.mark.parametrize(
    ("peer", "local", "headers", "rule"),
    [
        (
            "10.1.2.1",
            "10.1.2.3",
            {"Host": "10.1.2.3:8084", "X-Worker-Agent": "leave"},
            "same-pod-address",
        ),
        ("10.1.2.3", "10.1.2.3", {"Host": "10.1.2.3:8084", "X-Worker-Agent": "leave"}, None),
        ("127.0.0.1", "127.0.0.1", {"Host": "localhost:8084", "X-Worker-Agent": "leave"}, None),
        ("::1", "::1", {"Host": "[::1]:8084", "X-Worker-Agent": "LEAVE"}, None),
        (
            "127.0.0.1",
            "127.0.0.1",
            {
                "Host": "127.0.0.1:8084",
                "Origin": "http://127.0.0.1:8084",
                "Sec-Fetch-Site": "same-origin",
                "X-Worker-Agent": "leave",
            },
            None,
        ),
        (
            "127.0.0.1",
            "127.0.0.1",
            {"Host": "127.0.0.1:8084", "Sec-Fetch-Site": "none", "X-Worker-Agent": "leave"},
            None,
        ),
        (
            "127.0.0.1",
            "127.0.0.1",
            {
                "Host": "127.0.0.1:8084",
                "Origin": "http://localhost:8084",
                "X-Worker-Agent": "leave",
            },
            "cross-site",
        ),
        ("127.0.0.1", "10.1.2.3", {"Host": "10.1.2.4:8084", "X-Worker-Agent": "leave"}, "host"),
        (
            "127.0.0.1",
            "127.0.0.1",
            {"Host": "localhost.evil.example", "X-Worker-Agent": "leave"},
            "host",
        ),
    ],
)
def test_the_state_change_gate(
    peer: str, local: str, headers: dict[str, str], rule: str | None
) -> None:
    refusal = refusal_of_state_change(peer, local, "/leave", headers)
    assert (refusal[0] if refusal else None) == rule
