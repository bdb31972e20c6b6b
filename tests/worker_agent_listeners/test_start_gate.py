"""The agent's start gate for new grants (worker_agent/lifecycle.py `StartGate`, DESIGN 3.20 "a
grant records the count"): a connector granted something starts it only with the answer to a
ConnectGroupConfigs fetch sent after the grant, so the restart counts the start records are the
grant's (an older answer does not name the resource: its count would read 0, and the persisted
count of a restart done on the previous holder would restart it right after its fresh start).

- Unit: a fetch sent before the grant does not open the gate, one sent after does; no gate
  (None) stays none.
- Property: whatever the order of grants, sends and answers, a connector may start exactly when
  every grant of it came before the send of a fetch answered since.
- The control plane (scripted transport, no coordinator): a grant while a fetch is in flight is
  not opened by that fetch's answer, and makes one more fetch, whose answer opens it with the
  grant's restart count."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connect_protocol.lifecycle_messages import ConfigsResponse, HeldConnector
from connect_protocol.resources import ResourceSet, TaskId
from tests.support.agents import wait_for
from tests.worker_agent_membership.test_agent_lifecycle import GROUP, FakeTransport, Host, Scripted
from worker_agent.control import ControlPlane
from worker_agent.lifecycle import StartGate

ALL = frozenset({"a", "b"})


def test_a_grant_waits_for_a_fetch_sent_after_it() -> None:
    gate = StartGate()
    gate.granted({"a"}, fetches_sent=2)  # fetches 1 and 2 were sent before the grant
    assert gate.gated(ALL) == {"b"} and gate.waiting == {"a"}
    gate.answered(2)
    assert gate.gated(ALL) == {"b"}
    gate.answered(3)
    assert gate.gated(ALL) == ALL and not gate.waiting
    assert gate.gated(None) is None  # no configs served: no gate


def test_a_later_grant_waits_again() -> None:
    gate = StartGate()
    gate.granted({"a"}, 0)
    gate.granted({"a"}, 1)  # granted more while fetch 1 was in flight
    gate.answered(1)
    assert gate.gated(ALL) == {"b"}
    gate.answered(2)
    assert gate.gated(ALL) == ALL


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("grant"), st.sampled_from(sorted(ALL))),
        st.tuples(st.just("send"), st.just("")),
        st.tuples(st.just("answer"), st.just("")),
    ),
    max_size=40,
)


@given(OPS)
def test_a_connector_starts_exactly_when_a_fetch_sent_after_its_grants_was_answered(
    ops: list[tuple[str, str]],
) -> None:
    gate = StartGate()
    sent = 0  # fetches sent; they are answered in order
    answered = 0
    sent_at: dict[int, int] = {}  # fetch number -> when it was sent
    last_grant: dict[str, int] = {}  # connector -> when it was last granted something
    for clock, (op, name) in enumerate(ops, start=1):
        if op == "grant":
            gate.granted({name}, sent)
            last_grant[name] = clock
        elif op == "send":
            sent += 1
            sent_at[sent] = clock
        elif answered < sent:
            answered += 1
            gate.answered(answered)
        covered = sent_at.get(answered, 0)  # the send time of the last fetch answered
        expected = {c for c in ALL if last_grant.get(c, 0) < covered or c not in last_grant}
        assert gate.gated(ALL) == expected


# --- the control plane --------------------------------------------------------------------------


class Held(FakeTransport):
    """Holds the first ConnectGroupConfigs call until `release` is set."""

    def __init__(self, script: Scripted) -> None:
        super().__init__(script)
        self.release = threading.Event()
        self.in_flight = threading.Event()
        self._calls = 0

    def configs(self, request: Any, timeout_s: float) -> Any:
        self._calls += 1
        if self._calls == 1:
            self.in_flight.set()
            assert self.release.wait(5)
        return super().configs(request, timeout_s)


@pytest.fixture
def held() -> Iterator[tuple[ControlPlane, Scripted, Host, Held]]:
    a = HeldConnector("a", "d1", {"k": "v"})
    task = TaskId("a", 1)
    script = Scripted(
        [
            ConfigsResponse(lifecycle_revision=3, connectors=(a,)),  # before the grant
            ConfigsResponse(lifecycle_revision=4, connectors=(a,), restart_counts={task: 2}),
        ]
    )
    host = Host()
    transport = Held(script)
    control = ControlPlane(host, transport, GROUP, lambda: 1.0)  # type: ignore[arg-type]
    control.start()
    try:
        yield control, script, host, transport
    finally:
        transport.release.set()
        control.close()


def test_a_fetch_in_flight_at_a_grant_does_not_open_it_and_one_more_follows(
    held: tuple[ControlPlane, Scripted, Host, Held],
) -> None:
    control, script, host, transport = held
    control.joined()
    control.saw_revision(3)
    assert transport.in_flight.wait(2)
    # The grant's answer arrives while that fetch is out (its revision moved, too).
    assert control.granted(frozenset({"a"}), ALL) == {"b"}
    control.saw_revision(4)
    transport.release.set()
    wait_for("two answers", lambda: len(host.changes) == 2, timeout_s=2)
    assert len(script.times("configs")) == 2
    assert control.gated(ALL) == ALL
    # The start now reads the grant's count: a restart done elsewhere is not repeated here.
    grant = ResourceSet.of((), [TaskId("a", 1)])
    assert control.restart_counts_for(grant) == {TaskId("a", 1): 2}


def test_without_configs_served_there_is_no_gate(
    held: tuple[ControlPlane, Scripted, Host, Held],
) -> None:
    control, _, _, _ = held
    assert control.granted(frozenset({"a"}), None) is None
