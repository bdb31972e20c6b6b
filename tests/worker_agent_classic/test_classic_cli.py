"""`worker-agent run --group-protocol classic|connect` (issue 26, plan §4 and §5.2): what the
command line refuses at start, before any connection (exit 2, the reason on stderr), and the
settings it hands to the agent of each protocol.

In process (`cli.main`), with the agents replaced by fakes that record their settings: nothing
there connects anywhere (the coordinator address is a closed port). Then one real run, to prove
the wiring end to end: `python -m worker_agent.cli run --group-protocol classic` against a
`coordinator-svc serve` process, with the recording exec hook: it joins, runs the catalogue and,
on SIGTERM, revokes it and leaves (scaled timeouts: session 1000 ms, heartbeat 100 ms).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from connect_protocol.resources import ResourceSet
from tests.support.agents import AgentProcess, wait_for
from tests.support.client import describe, put_connector
from tests.support.coordinator import CoordinatorProcess, Stubs
from worker_agent import cli
from worker_agent.runtime import AgentSettings

CLOSED = "127.0.0.1:1"
BASE = ["run", "--coordinator", CLOSED, "--log-format", "text"]
CLASSIC = [*BASE, "--group-protocol", "classic"]
# Every WORKER_AGENT_* variable `run` reads that a test here sets or that the environment of
# whoever runs the suite might (a stray one would change what is refused).
VARIABLES = (
    "GROUP_PROTOCOL",
    "PROTOCOL",
    "MEMBER_ID",
    "INSTANCE_ID",
    "SESSION_TIMEOUT_MS",
    "HEARTBEAT_INTERVAL_MS",
    "RELEASE",
    "STATUS_PORT",
    "METRICS_PORT",
)


class _Phase(Enum):
    LEFT = "left"


class FakeAgent:
    """Stands for `Agent` and `ClassicAgent`: records what it was built with, runs nothing."""

    built: list[tuple[str, AgentSettings]] = []
    status_member_ids: list[str | None] = []  # the status endpoint's member id (None: no endpoint)
    kind = "connect"

    def __init__(
        self, settings: AgentSettings, listener: object, status: object = None, **_: Any
    ) -> None:
        FakeAgent.built.append((self.kind, settings))
        FakeAgent.status_member_ids.append(getattr(status, "member_id", None))
        self.phase = _Phase.LEFT
        self.fatal: str | None = None
        self.running = ResourceSet()

    def run(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def abandon(self) -> None:
        pass

    def leave(self, timeout_s: float) -> bool:
        return True


class FakeClassicAgent(FakeAgent):
    kind = "classic"


@pytest.fixture(autouse=True)
def fakes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, AgentSettings]]]:
    """A clean environment, fake agents of both protocols, and no signal handler installed in
    the test process."""
    for name in VARIABLES:
        monkeypatch.delenv(f"WORKER_AGENT_{name}", raising=False)
    FakeAgent.built = []
    FakeAgent.status_member_ids = []
    monkeypatch.setattr(cli, "Agent", FakeAgent)
    classic_runtime = types.ModuleType("worker_agent.classic.runtime")
    classic_runtime.ClassicAgent = FakeClassicAgent  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "worker_agent.classic.runtime", classic_runtime)
    monkeypatch.setattr(cli.signal, "signal", lambda *_: None)
    yield FakeAgent.built


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """`main(argv)` exits 2 before building an agent; its stderr."""
    assert cli.main(argv) == 2
    assert FakeAgent.built == [], "refused only after an agent was built"
    return capsys.readouterr().err


# --- refusals ---------------------------------------------------------------------------------


def test_classic_refuses_an_instance_id_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*CLASSIC, "--instance-id", "worker-7"], capsys)
    assert (
        "--instance-id (WORKER_AGENT_INSTANCE_ID) cannot be used with --group-protocol classic"
        in err
    )
    assert "static membership is offered on the connect protocol only (DESIGN 3.19, 3.14)" in err
    assert "refuses group_instance_id on classic calls" in err
    assert "Remove --instance-id, or use --group-protocol connect." in err


def test_classic_refuses_an_instance_id_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORKER_AGENT_GROUP_PROTOCOL", "classic")
    monkeypatch.setenv("WORKER_AGENT_INSTANCE_ID", "connect-worker-0")
    assert "static membership is offered on the connect protocol only" in refused(BASE, capsys)


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_classic_refuses_a_member_id_given_explicitly(
    how: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*CLASSIC, "--member-id", "w-1"] if how == "flag" else CLASSIC
    if how == "environment":
        monkeypatch.setenv("WORKER_AGENT_MEMBER_ID", "w-1")
    err = refused(argv, capsys)
    assert (
        "--member-id (WORKER_AGENT_MEMBER_ID) cannot be used with --group-protocol classic" in err
    )
    assert "made by the coordinator" in err and "KIP-394" in err


def test_an_unknown_group_protocol_from_the_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORKER_AGENT_GROUP_PROTOCOL", "bogus")
    err = refused(BASE, capsys)
    assert "--group-protocol (WORKER_AGENT_GROUP_PROTOCOL) must be one of" in err
    assert "'bogus'" in err


def test_an_unknown_group_protocol_flag_is_refused_by_argparse(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([*BASE, "--group-protocol", "bogus"])
    assert exited.value.code == 2
    assert "--group-protocol: invalid choice: 'bogus'" in capsys.readouterr().err


def test_an_unknown_connect_protocol_from_the_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORKER_AGENT_PROTOCOL", "cooperative")
    assert "--protocol (WORKER_AGENT_PROTOCOL) must be one of" in refused(CLASSIC, capsys)


@pytest.mark.parametrize(
    ("flag", "variable"),
    [
        ("--session-timeout-ms", "SESSION_TIMEOUT_MS"),
        ("--heartbeat-interval-ms", "HEARTBEAT_INTERVAL_MS"),
    ],
)
@pytest.mark.parametrize("how", ["flag", "environment"])
def test_the_classic_timeouts_are_refused_on_the_connect_protocol(
    flag: str,
    variable: str,
    how: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [*BASE, "--group-protocol", "connect"]
    if how == "flag":
        argv += [flag, "100"]
    else:
        monkeypatch.setenv(f"WORKER_AGENT_{variable}", "100")
    err = refused(argv, capsys)
    assert f"{flag} (WORKER_AGENT_{variable}) applies to --group-protocol classic only" in err
    assert "on the connect protocol the coordinator sends both" in err and "DESIGN 2.1" in err


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ["--session-timeout-ms", "1000", "--heartbeat-interval-ms", "1000"],
            "1000 is not below 1000",
        ),
        (["--session-timeout-ms", "1000"], "3000 is not below 1000"),
        (["--heartbeat-interval-ms", "20000"], "20000 is not below 10000, the default"),
    ],
)
def test_classic_refuses_a_heartbeat_interval_not_below_the_session_timeout(
    extra: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused([*CLASSIC, *extra], capsys)
    assert "--heartbeat-interval-ms (WORKER_AGENT_HEARTBEAT_INTERVAL_MS) must be below" in err
    assert expected in err


@pytest.mark.parametrize("value", ["0", "-5", "ten", "1.5"])
@pytest.mark.parametrize("flag", ["--session-timeout-ms", "--heartbeat-interval-ms"])
def test_the_classic_timeouts_must_be_positive_whole_milliseconds(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([*CLASSIC, f"{flag}={value}"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be a positive whole number of milliseconds" in err
    assert repr(value) in err and "WORKER_AGENT_" in err


def test_a_bad_timeout_from_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORKER_AGENT_SESSION_TIMEOUT_MS", "10s")
    with pytest.raises(SystemExit):
        cli.main(CLASSIC)
    assert "WORKER_AGENT_SESSION_TIMEOUT_MS" in capsys.readouterr().err


# --- what each protocol's agent is given --------------------------------------------------------


def test_connect_is_the_default_and_keeps_its_settings(
    fakes: list[tuple[str, AgentSettings]],
) -> None:
    assert cli.main([*BASE, "--member-id", "w-1", "--instance-id", "worker-7"]) == 0
    [(kind, settings)] = fakes
    assert kind == "connect"
    assert settings.group_protocol == "connect" and settings.protocol == "sessioned"
    assert settings.member_id == "w-1" and settings.instance_id == "worker-7"
    assert [a.name for a in settings.assignors] == ["incremental_cooperative", "eager"]


@pytest.mark.parametrize("protocol", ["eager", "compatible", "sessioned"])
def test_classic_builds_the_classic_agent_with_connects_defaults(
    protocol: str, fakes: list[tuple[str, AgentSettings]]
) -> None:
    assert cli.main([*CLASSIC, "--protocol", protocol, "--rebalance-timeout-ms", "2000"]) == 0
    [(kind, settings)] = fakes
    assert kind == "classic"
    assert settings.group_protocol == "classic" and settings.protocol == protocol
    assert settings.eager is (protocol == "eager")
    assert (settings.session_timeout_ms, settings.heartbeat_interval_ms) == (10_000, 3_000)
    assert settings.rebalance_timeout_ms == 2000
    assert settings.instance_id is None
    # A label of this process until the coordinator makes the member id.
    assert settings.member_id and settings.member_id != "w-1"


def test_classic_takes_its_timeouts_from_flags_or_the_environment(
    monkeypatch: pytest.MonkeyPatch, fakes: list[tuple[str, AgentSettings]]
) -> None:
    assert (
        cli.main([*CLASSIC, "--session-timeout-ms", "1000", "--heartbeat-interval-ms", "100"]) == 0
    )
    monkeypatch.setenv("WORKER_AGENT_GROUP_PROTOCOL", "classic")
    monkeypatch.setenv("WORKER_AGENT_SESSION_TIMEOUT_MS", "6000")
    monkeypatch.setenv("WORKER_AGENT_HEARTBEAT_INTERVAL_MS", "2000")
    assert cli.main(BASE) == 0
    assert [(k, s.session_timeout_ms, s.heartbeat_interval_ms) for k, s in fakes] == [
        ("classic", 1000, 100),
        ("classic", 6000, 2000),
    ]


def test_the_status_endpoint_reports_no_member_id_until_the_coordinator_made_one() -> None:
    """Classic: the label the agent logs under is no member id; a worker beside the agent reads a
    change of member id as a new agent process (examples/sample_worker.py), so the endpoint says
    "" until the classic runtime reports the coordinator's."""
    assert cli.main([*CLASSIC, "--status-port", "0"]) == 0
    assert cli.main([*BASE, "--status-port", "0", "--member-id", "w-1"]) == 0
    assert FakeAgent.status_member_ids == ["", "w-1"]


def test_help_describes_both_group_protocols(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "10000")  # no wrapping (argparse wraps at hyphens too)
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in (
        "--group-protocol {classic,connect}",
        "WORKER_AGENT_GROUP_PROTOCOL",
        "WORKER_AGENT_SESSION_TIMEOUT_MS",
        "WORKER_AGENT_HEARTBEAT_INTERVAL_MS",
        "classic: the JoinGroup protocols offered",
        "Refused with --group-protocol classic",
    ):
        assert words in text, words


# --- one real classic agent process ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_classic_agent_process_joins_runs_the_catalogue_and_leaves_on_sigterm(
    database_url: str, tmp_path: Path
) -> None:
    coordinator = CoordinatorProcess(
        database_url,
        "--classic-min-session-timeout-ms",
        "100",
        "--classic-initial-rebalance-delay-ms",
        "50",
        log_path=tmp_path / "coordinator.log",
    ).start()
    stubs = Stubs(coordinator.address)
    group = "classic-cli"
    agent = AgentProcess(
        "W1",
        coordinator.address,
        group,
        tmp_path / "agent",
        explicit_member_id=False,
        rebalance_timeout_ms=2_000,
        extra_args=(
            "--group-protocol",
            "classic",
            "--session-timeout-ms",
            "1000",
            "--heartbeat-interval-ms",
            "100",
        ),
    )
    try:
        assert put_connector(stubs, group, "A", 2).error_code == 0
        agent.start()

        def assigned() -> set[str] | None:
            got = {r for rec in agent.records() if rec.event == "assigned" for r in rec.resources}
            return got if got == {"A", "A-0", "A-1"} else None

        wait_for(
            "the catalogue assigned to the classic agent", assigned, 30, diagnostics=agent.log_tail
        )
        [line] = agent.current.log_lines("agent starting: classic protocol")
        assert "session 1000 ms, heartbeat 100 ms" in line, line
        # The coordinator made the member id (KIP-394) and serves the group as classic.
        member_id = agent.records()[0].worker
        g = describe(stubs, group)
        assert g.group_type == "classic" and g.classic.state == "STABLE", g
        assert [m.member_id for m in g.members] == [member_id] == [g.classic.leader_id]
        assert g.classic.protocol_name == "sessioned"

        assert agent.stop() == 0
        last = agent.records()[-1]
        assert last.event == "revoked" and last.resources == {"A", "A-0", "A-1"}, last
        assert last.worker == member_id
        # It left (LeaveGroup): no member remains.
        assert list(describe(stubs, group).members) == []
    finally:
        agent.close()
        stubs.close()
        coordinator.close()
