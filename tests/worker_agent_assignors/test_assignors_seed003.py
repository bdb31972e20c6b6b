"""Seed 003's (KIP-415's) scenarios, run through the incremental cooperative assignor directly.

Read per DESIGN ("Where seed 000's case studies and seed 003's scenarios differ", 3.5, 3.8): a
bounced worker gets its work back at once instead of waiting for the delay; a departed leader's
work is held like anyone's (the delay lives in the assignor state, not in the leader); and
connectors and tasks are balanced separately, so where the seed gives one worker two connectors
and another none, the target here gives each one.

The seed's notation: AC0 is connector A, AT1 and AT2 are its tasks (our A-0 and A-1: the seed
numbers tasks from 1), BC0 is connector B and BT1 its task (B-0). The config topic holds AC0, AT1,
AT2, BC0, BT1 throughout.
"""

from __future__ import annotations

import re

from connect_protocol.resources import ResourceSet
from tests.worker_agent_assignors.test_assignors_support import Sim
from worker_agent.assignors import IncrementalCooperativeAssignor

D = 60_000  # the seed's delay d
CONFIG_TOPIC = {"A": 2, "B": 1}


def seed(*names: str) -> ResourceSet:
    """Resources in the seed's notation: `AC0` is connector A, `AT1` is task A-0."""
    connectors: list[str] = []
    tasks: list[tuple[str, int]] = []
    for name in names:
        match = re.fullmatch(r"([A-Z]+)([CT])(\d+)", name)
        assert match, name
        connector, kind, number = match[1], match[2], int(match[3])
        if kind == "C":
            connectors.append(connector)
        else:
            tasks.append((connector, number - 1))
    return ResourceSet.of(connectors, tasks)


def initial_group() -> Sim:
    """Initial group and assignment: W1([AC0, AT1]), W2([AT2, BC0]), W3([BT1]); W1 computes."""
    sim = Sim(IncrementalCooperativeAssignor(), dict(CONFIG_TOPIC), max_delay_ms=D)
    sim.join("W1")
    sim.round()
    sim.join("W2")
    sim.join("W3")
    sim.round()
    assert sim.target == {"W1": seed("AC0", "AT1"), "W2": seed("AT2", "BC0"), "W3": seed("BT1")}
    return sim


def test_first_new_member_joins() -> None:
    sim = Sim(IncrementalCooperativeAssignor(), dict(CONFIG_TOPIC), max_delay_ms=D)
    sim.join("W1")

    result = sim.round()

    assert result.members == {"W1": seed("AC0", "AT1", "AT2", "BC0", "BT1")}
    assert result.scheduled_rebalance_delay_ms == 0


def test_non_first_new_member_joins() -> None:
    sim = Sim(IncrementalCooperativeAssignor(), dict(CONFIG_TOPIC), max_delay_ms=D)
    sim.join("W1")
    sim.round()
    sim.join("W2")
    sim.join("W3")

    result = sim.round()

    # W1 keeps [AC0, AT1] and gives up AT2, BC0, BT1 (the coordinator revokes them before
    # W2 and W3 get them: the seed's two rounds are one target here).
    assert result.members == {
        "W1": seed("AC0", "AT1"),
        "W2": seed("AT2", "BC0"),
        "W3": seed("BT1"),
    }
    assert result.scheduled_rebalance_delay_ms == 0


def test_worker_leaves() -> None:
    sim = initial_group()
    sim.leave("W2")

    during = sim.round()
    assert during.members == {"W1": seed("AC0", "AT1"), "W3": seed("BT1")}
    assert during.scheduled_rebalance_delay_ms == D

    sim.now_ms = D  # after delay d
    after = sim.round()

    # The seed gives W1 [AC0, AT1, BC0] and W3 [BT1, AT2]: two connectors on W1. Balanced per
    # kind, W3 takes the connector and W1 the task.
    assert after.members == {"W1": seed("AC0", "AT1", "AT2"), "W3": seed("BC0", "BT1")}
    assert after.scheduled_rebalance_delay_ms == 0


def test_worker_bounces() -> None:
    sim = initial_group()
    sim.leave("W2")
    assert sim.round().scheduled_rebalance_delay_ms == D
    sim.now_ms = D // 3  # before delay d expires
    sim.join("W2")

    result = sim.round()

    # The seed makes W2 wait for the remaining delay d'; here it gets its work back at once.
    assert result.members == {
        "W1": seed("AC0", "AT1"),
        "W2": seed("AT2", "BC0"),
        "W3": seed("BT1"),
    }
    assert result.scheduled_rebalance_delay_ms == 0


def test_leader_leaves() -> None:
    sim = initial_group()
    sim.leave("W1")  # W1, which computed every target so far

    during = sim.round()  # computed by W2 or W3: the assignor keeps nothing in memory

    # The seed moves a departed leader's work at once; here it is held like anyone's.
    assert during.members == {"W2": seed("AT2", "BC0"), "W3": seed("BT1")}
    assert during.scheduled_rebalance_delay_ms == D

    sim.now_ms = D
    after = sim.round()

    # The seed: W2 [AT2, BC0, AC0], W3 [BT1, AT1]; balanced per kind, W3 takes the connector.
    assert after.members == {"W2": seed("AT1", "AT2", "BC0"), "W3": seed("AC0", "BT1")}
    assert after.scheduled_rebalance_delay_ms == 0


def test_leader_bounces() -> None:
    sim = initial_group()
    sim.leave("W2")
    assert sim.round().scheduled_rebalance_delay_ms == D
    sim.now_ms = 10_000
    sim.join("W2")  # before delay d expires: back at once, the delay ends
    assert sim.round().members["W2"] == seed("AT2", "BC0")
    sim.now_ms = 20_000
    sim.leave("W1")  # the leader leaves

    during = sim.round()
    assert during.members == {"W2": seed("AT2", "BC0"), "W3": seed("BT1")}
    assert during.scheduled_rebalance_delay_ms == D  # a new departure, a full delay

    sim.now_ms = 30_000
    sim.join("W1")  # before that delay expires
    back = sim.round()

    # The seed cannot promise the initial assignment again; with the delay in the assignor
    # state, W1 gets its own work back at once and the group is as it started.
    assert back.members == {
        "W1": seed("AC0", "AT1"),
        "W2": seed("AT2", "BC0"),
        "W3": seed("BT1"),
    }
    assert back.scheduled_rebalance_delay_ms == 0


def test_leader_leaves_while_a_delay_is_in_progress() -> None:
    sim = initial_group()
    sim.leave("W2")
    sim.round()
    sim.now_ms = 10_000
    sim.leave("W1")  # the leader leaves while W2's delay runs

    during = sim.round()
    assert during.members == {"W3": seed("BT1")}
    assert during.scheduled_rebalance_delay_ms == D - 10_000  # the delay is honoured, d''

    sim.now_ms = 20_000
    sim.join("W1")  # the leader bounces back before d'' expires
    back = sim.round()
    assert back.members == {"W1": seed("AC0", "AT1"), "W3": seed("BT1")}
    assert back.scheduled_rebalance_delay_ms == D - 20_000  # W2's share is still held

    sim.now_ms = D
    after = sim.round()
    assert after.members == {"W1": seed("AC0", "AT1", "AT2"), "W3": seed("BC0", "BT1")}
    assert after.scheduled_rebalance_delay_ms == 0
