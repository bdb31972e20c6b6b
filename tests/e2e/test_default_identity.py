"""DESIGN 3.2: one member id, one process. Agents started with default settings take a fresh
random member id each, so two of them on one host are two members; the identity that survives a
restart is the instance id, and a StatefulSet-style rolling restart (same instance ids, new
random member ids) moves nothing. Real agents, recording exec hooks, a real coordinator."""

from __future__ import annotations

import time

from tests.support.agents import AgentProcess, Fleet, check_no_overlap, intervals, wait_for


def _running(agent: AgentProcess) -> set[str]:
    """What the agent's current incarnation runs, by its hook records."""
    out: set[str] = set()
    for rec in agent.current.records():
        if rec.event == "assigned":
            out |= rec.resources
        else:
            out -= rec.resources
    return out


def _settled(fleet: Fleet, agents: dict[str, AgentProcess]) -> dict[str, set[str]]:
    """Wait until the group is STABLE with exactly the agents' current member ids, each
    running its current assignment; returns label -> resources."""
    ids = {label: agent.joined_as() for label, agent in agents.items()}

    def probe() -> dict[str, set[str]] | None:
        group = fleet.try_describe()
        if group is None or group.state != "STABLE":
            return None
        members = {m.member_id: m for m in group.members}
        if set(members) != set(ids.values()):
            return None
        shares: dict[str, set[str]] = {}
        for label, member_id in ids.items():
            m = members[member_id]
            share = set(m.current_assignment.connectors) | {
                f"{t.connector}-{t.task}" for t in m.current_assignment.tasks
            }
            if m.pending_revocation.connectors or m.pending_revocation.tasks:
                return None
            if _running(agents[label]) != share:
                return None
            shares[label] = share
        return shares

    return wait_for("the group settled with every agent running its share", probe, 30.0)


def test_two_agents_with_default_settings_on_one_host_are_two_members(fleet: Fleet) -> None:
    fleet.put_connector("orders", 4)
    agents = {label: fleet.agent(label, explicit_member_id=False).start() for label in ("A", "B")}
    first, second = agents["A"].joined_as(), agents["B"].joined_as()
    assert first != second  # not the host name twice
    shares = _settled(fleet, agents)
    assert shares["A"] and shares["B"]
    assert not shares["A"] & shares["B"]
    assert shares["A"] | shares["B"] == {"orders", *(f"orders-{t}" for t in range(4))}
    ivs, problems = intervals(agents.values())
    assert problems == []
    assert check_no_overlap(ivs) == []


def test_rolling_restart_with_random_member_ids_and_instance_ids_moves_nothing(
    fleet: Fleet,
) -> None:
    fleet.put_connector("orders", 6)
    agents = {
        label: fleet.agent(label, explicit_member_id=False, instance_id=f"pod-{label}").start()
        for label in ("0", "1", "2")
    }
    before = _settled(fleet, agents)
    epoch_before = fleet.describe().group_epoch
    for label in ("2", "1", "0"):  # as a StatefulSet rolls: highest ordinal first
        old_id = agents[label].joined_as()
        agents[label].stop()
        restarted_at = time.time()
        agents[label].start()
        assert agents[label].joined_as() != old_id  # a new process, a new member id
        after = _settled(fleet, agents)
        assert after == before, f"work moved when pod-{label} restarted"
        for other in set(agents) - {label}:  # the others were not touched meanwhile
            touched = [r for r in agents[other].current.records() if r.t_start >= restarted_at]
            assert touched == [], (other, touched)
    assert fleet.describe().group_epoch == epoch_before  # no rebalance at all
    ivs, problems = intervals(agents.values())
    assert problems == []
    assert check_no_overlap(ivs) == []
