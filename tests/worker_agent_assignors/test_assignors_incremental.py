"""The incremental cooperative assignor, one behaviour per test: stickiness and balance, then
each rule of the delay for departed workers' resources (DESIGN 3.8), then the same rules through
a real coordinator group."""

from __future__ import annotations

from dataclasses import replace

import pytest

from connect_protocol.resources import EMPTY
from coordinator_svc.core.results import SCHEDULED_REBALANCE
from tests.core.harness import MAX_DELAY_MS, GroupHarness
from tests.worker_agent_assignors.test_assignors_support import (
    Coordinated,
    Sim,
    assert_installable,
    rs,
    view,
)
from worker_agent.assignor import SCHEDULED_REBALANCE_MAX_DELAY_MS, MemberView
from worker_agent.assignors import DEFAULT_MAX_DELAY_MS, IncrementalCooperativeAssignor
from worker_agent.assignors.state import AssignorState, HeldShare, decode_state, encode_state

IC = IncrementalCooperativeAssignor()
DELAY = 1_000


def three_workers(max_delay_ms: int | None = DELAY, **instances: str) -> Sim:
    """w1, w2, w3 over A, B, C with two tasks each: one connector and two tasks apiece."""
    sim = Sim(IC, {"A": 2, "B": 2, "C": 2}, max_delay_ms=max_delay_ms)
    for member in ("w1", "w2", "w3"):
        sim.join(member, instances.get(member))
    sim.round()
    assert sim.shares() == {
        "w1": ["A", "A-0", "B-1"],
        "w2": ["B", "A-1", "C-0"],
        "w3": ["C", "B-0", "C-1"],
    }
    return sim


W1, W2, W3 = rs("A", "A-0", "B-1"), rs("B", "A-1", "C-0"), rs("C", "B-0", "C-1")


def held(sim: Sim) -> dict[str, list[str]]:
    return {s.member_id: list(s.resources.names()) for s in decode_state(sim.state).held}


# --- stickiness and balance -------------------------------------------------------------------


def test_a_balanced_sticky_start_moves_nothing() -> None:
    target = {"w1": rs("A", "B-0", "B-1"), "w2": rs("B", "A-0"), "w3": rs("A-1")}
    members = [MemberView(m, owned=r) for m, r in target.items()]
    group = view({"A": 2, "B": 2}, members, target=target)

    result = IC.assign(group)

    assert result.members == target
    assert result.scheduled_rebalance_delay_ms == 0
    assert_installable(group, result)


def test_a_new_worker_takes_only_what_balance_requires() -> None:
    target = {"w1": rs("A", "B", "A-0", "A-1", "A-2", "A-3"), "w2": rs("C", "B-0")}
    group = view({"A": 4, "B": 1, "C": 0}, ["w1", "w2", "w3"], target=target)

    result = IC.assign(group)

    # Connectors 3 over 3: w1 gives up one (B). Tasks 5 over 3 (2, 2, 1): w1 gives up two;
    # the least loaded takes first: A-2 to the empty w3, then A-3 to w2.
    assert result.members == {
        "w1": rs("A", "A-0", "A-1"),
        "w2": rs("C", "B-0", "A-3"),
        "w3": rs("B", "A-2"),
    }
    assert_installable(group, result)


def test_the_ceilings_go_to_the_members_that_already_hold_more() -> None:
    # 7 tasks over 3 members: one gets 3. w2 holds 4, so w2 keeps 3 and only one task moves.
    target = {"w1": rs("A-0", "A-1", "A-2"), "w2": rs("B-0", "B-1", "B-2", "B-3")}
    group = view({"A": 3, "B": 4}, ["w1", "w2", "w3"], target=target)

    result = IC.assign(group)

    tasks = {m: len(r.tasks) for m, r in result.members.items()}
    assert tasks == {"w1": 2, "w2": 3, "w3": 2}
    moved = sum(len(target[m] - result.members[m]) for m in target)
    assert moved == 2  # one from w1 (3 -> 2), one from w2 (4 -> 3)


def test_a_member_gives_up_what_it_does_not_run_yet_first() -> None:
    # w1's target holds A and B, but it runs only B so far: A moves, not the higher-named B.
    members = [MemberView("w1", owned=rs("B")), MemberView("w2")]
    group = view({"A": 0, "B": 0}, members, target={"w1": rs("A", "B")})

    result = IC.assign(group)

    assert result.members == {"w1": rs("B"), "w2": rs("A")}


def test_a_member_without_a_target_share_starts_from_what_it_owns() -> None:
    members = [MemberView("w1", owned=rs("A", "A-0")), MemberView("w2", owned=rs("B", "B-0"))]
    group = view({"A": 1, "B": 1}, members)

    result = IC.assign(group)

    assert result.members == {"w1": rs("A", "A-0"), "w2": rs("B", "B-0")}


def test_a_resource_in_a_target_share_and_in_another_members_owned_list_goes_by_the_target() -> (
    None
):
    members = [MemberView("w1", owned=rs("A")), MemberView("w2", owned=rs("A", "B"))]
    group = view({"A": 0, "B": 0}, members, target={"w1": rs("A")})

    result = IC.assign(group)

    assert result.members == {"w1": rs("A"), "w2": rs("B")}


def test_resources_deleted_from_the_catalogue_disappear_and_the_rest_rebalances() -> None:
    target = {"w1": rs("A", "A-0", "A-1"), "w2": rs("B", "B-0", "B-1")}
    group = view({"A": 2}, ["w1", "w2"], target=target)

    result = IC.assign(group)

    assert result.members == {"w1": rs("A", "A-0"), "w2": rs("A-1")}
    assert_installable(group, result)


def test_the_first_member_gets_everything_at_once() -> None:
    group = view({"A": 2, "B": 1}, ["w1"])

    result = IC.assign(group)

    assert result.members == {"w1": rs("A", "A-0", "A-1", "B", "B-0")}
    assert result.scheduled_rebalance_delay_ms == 0


def test_no_members_assign_nothing_and_keep_the_state() -> None:
    group = view({"A": 1}, [], target={"w1": rs("A")}, state=b"kept")

    result = IC.assign(group)

    assert result.members == {}
    assert result.assignor_state == b"kept"


# --- the delay --------------------------------------------------------------------------------


def test_a_departed_workers_resources_are_held_back_for_the_full_delay() -> None:
    sim = three_workers()
    sim.now_ms = 10_000
    sim.leave("w2")

    result = sim.round()

    assert result.members == {"w1": W1, "w3": W3}
    assert result.scheduled_rebalance_delay_ms == DELAY
    assert held(sim) == {"w2": ["B", "A-1", "C-0"]}
    assert decode_state(sim.state).deadline_ms == 10_000 + DELAY


@pytest.mark.parametrize("configs", [{}, {SCHEDULED_REBALANCE_MAX_DELAY_MS: "soon"}])
def test_the_delay_defaults_to_five_minutes(configs: dict[str, str]) -> None:
    target = {"w1": rs("A"), "w2": rs("B")}
    group = replace(view({"A": 0, "B": 0}, ["w1"], target=target, now_ms=7), configs=configs)

    result = IC.assign(group)

    assert result.scheduled_rebalance_delay_ms == DEFAULT_MAX_DELAY_MS == 300_000
    assert result.members == {"w1": rs("A")}


def test_a_later_round_during_the_delay_uses_the_remaining_delay() -> None:
    sim = three_workers()
    sim.leave("w2")
    sim.round()
    sim.now_ms = 400
    sim.catalogue["D"] = 0  # any change: a new round during the delay

    result = sim.round()

    assert result.scheduled_rebalance_delay_ms == DELAY - 400
    assert decode_state(sim.state).deadline_ms == DELAY
    assert held(sim) == {"w2": ["B", "A-1", "C-0"]}


def test_a_worker_departing_during_a_delay_joins_the_held_set_with_the_deadline_unchanged() -> None:
    sim = three_workers()
    sim.leave("w2")
    sim.round()
    sim.now_ms = 300
    sim.leave("w3")

    result = sim.round()

    assert result.members == {"w1": W1}
    assert result.scheduled_rebalance_delay_ms == DELAY - 300
    assert held(sim) == {"w2": ["B", "A-1", "C-0"], "w3": ["C", "B-0", "C-1"]}


def test_a_returning_worker_gets_exactly_its_own_resources_back_at_once() -> None:
    sim = three_workers()
    sim.leave("w2")
    sim.round()
    sim.now_ms = 500
    sim.join("w2")

    result = sim.round()

    assert result.members == {"w1": W1, "w2": W2, "w3": W3}
    assert result.scheduled_rebalance_delay_ms == 0
    assert decode_state(sim.state).held == ()
    assert decode_state(sim.state).deadline_ms is None


def test_of_several_departed_workers_a_returning_one_gets_only_its_own() -> None:
    sim = three_workers()
    sim.leave("w2")
    sim.leave("w3")
    sim.round()
    sim.now_ms = 500
    sim.join("w3")

    result = sim.round()

    assert result.members == {"w1": W1, "w3": W3}
    assert result.scheduled_rebalance_delay_ms == DELAY - 500
    assert held(sim) == {"w2": ["B", "A-1", "C-0"]}


def test_a_worker_returning_under_a_new_member_id_with_its_instance_id_gets_its_own_back() -> None:
    sim = three_workers(w1="i1", w2="i2", w3="i3")
    sim.leave("w2")
    sim.leave("w3")
    sim.round()
    sim.now_ms = 500
    sim.join("w2-restarted", "i2")

    result = sim.round()

    # Not a newcomer: it gets w2's share, and w3's stays held for the rest of the delay.
    assert result.members == {"w1": W1, "w2-restarted": W2}
    assert result.scheduled_rebalance_delay_ms == DELAY - 500
    assert held(sim) == {"w3": ["C", "B-0", "C-1"]}


def test_a_blob_holding_a_resource_for_two_members_gives_it_to_one() -> None:
    blob = encode_state(
        AssignorState(
            deadline_ms=100,
            held=(HeldShare("w1", None, rs("A", "A-0")), HeldShare("w2", None, rs("A"))),
        )
    )
    group = view({"A": 1}, ["w1", "w2"], state=blob)

    result = IC.assign(group)

    assert result.members == {"w1": rs("A", "A-0"), "w2": EMPTY}
    assert_installable(group, result)


def test_a_new_worker_during_the_delay_ends_it_and_fills_first() -> None:
    sim = three_workers()
    sim.leave("w2")
    sim.round()
    sim.now_ms = 500
    sim.join("w4")

    result = sim.round()

    # The held share goes to the empty newcomer; w1 and w3 keep exactly theirs.
    assert result.members == {"w1": W1, "w3": W3, "w4": W2}
    assert result.scheduled_rebalance_delay_ms == 0
    assert decode_state(sim.state).held == ()


def test_a_new_worker_arriving_as_another_departs_takes_the_departed_share_at_once() -> None:
    sim = three_workers()
    sim.leave("w2")
    sim.join("w4")

    result = sim.round()

    assert result.members == {"w1": W1, "w3": W3, "w4": W2}
    assert result.scheduled_rebalance_delay_ms == 0


def test_after_the_deadline_the_lost_resources_are_spread_over_the_workers_present() -> None:
    sim = three_workers()
    sim.leave("w2")
    sim.round()
    sim.now_ms = DELAY

    result = sim.round()

    assert result.scheduled_rebalance_delay_ms == 0
    assert result.members["w1"] >= W1 and result.members["w3"] >= W3
    assert result.members == {"w1": W1 | rs("B", "A-1"), "w3": W3 | rs("C-0")}
    assert decode_state(sim.state).held == ()


def test_a_worker_departing_after_the_deadline_starts_a_new_full_delay() -> None:
    sim = three_workers()
    sim.leave("w2")
    sim.round()
    sim.now_ms = DELAY + 50
    sim.leave("w3")

    result = sim.round()

    assert result.members == {"w1": W1 | W2}
    assert result.scheduled_rebalance_delay_ms == DELAY
    assert held(sim) == {"w3": ["C", "B-0", "C-1"]}


def test_with_a_delay_of_zero_a_departed_workers_resources_move_at_once() -> None:
    sim = three_workers(max_delay_ms=0)
    sim.leave("w2")

    result = sim.round()

    assert result.scheduled_rebalance_delay_ms == 0
    assert result.members == {"w1": W1 | rs("B", "A-1"), "w3": W3 | rs("C-0")}
    assert sim.state and decode_state(sim.state).held == ()


def test_a_shorter_delay_configured_during_a_delay_brings_the_deadline_forward() -> None:
    sim = three_workers()
    sim.leave("w2")
    sim.round()
    sim.now_ms = 100
    sim.max_delay_ms = 200
    sim.catalogue["D"] = 0

    result = sim.round()

    assert result.scheduled_rebalance_delay_ms == 200
    assert decode_state(sim.state).deadline_ms == 300


def test_a_new_connector_is_placed_at_once_during_a_delay_on_the_least_loaded() -> None:
    sim = three_workers()
    sim.leave("w2")
    sim.round()
    sim.now_ms = 100
    sim.catalogue["D"] = 2
    sim.catalogue["A"] = 3

    result = sim.round()

    # D, A-2, D-0 and D-1 are new: w1 and w3 (one connector, two tasks each) share them, the
    # least loaded first (ties by member id): 2 connectors and 7 tasks over two members.
    assert result.members == {"w1": W1 | rs("D", "A-2", "D-1"), "w3": W3 | rs("D-0")}
    assert result.scheduled_rebalance_delay_ms == DELAY - 100
    assert held(sim) == {"w2": ["B", "A-1", "C-0"]}


def test_a_deleted_connector_drops_out_of_the_held_set() -> None:
    sim = three_workers()
    sim.leave("w2")
    sim.round()
    sim.now_ms = 100
    del sim.catalogue["B"]

    result = sim.round()

    # B-1 (w1's) and B-0 (w3's) are gone; of w2's share only A-1 and C-0 are still held.
    assert held(sim) == {"w2": ["A-1", "C-0"]}
    assert result.members == {"w1": rs("A", "A-0"), "w3": rs("C", "C-1")}
    assert result.scheduled_rebalance_delay_ms == DELAY - 100


def test_when_every_held_resource_is_deleted_the_delay_ends() -> None:
    sim = Sim(IC, {"A": 1, "B": 1}, max_delay_ms=DELAY)
    sim.join("w1")
    sim.join("w2")
    sim.round()
    assert sim.shares() == {"w1": ["A", "A-0"], "w2": ["B", "B-0"]}
    sim.leave("w2")
    assert sim.round().scheduled_rebalance_delay_ms == DELAY
    del sim.catalogue["B"]

    result = sim.round()

    assert result.members == {"w1": rs("A", "A-0")}
    assert result.scheduled_rebalance_delay_ms == 0
    assert decode_state(sim.state).deadline_ms is None


def test_an_undecodable_state_blob_is_no_state() -> None:
    target = {"w1": rs("A", "A-0"), "w2": rs("B", "B-0")}
    group = view(
        {"A": 1, "B": 1}, ["w1"], target=target, state=b"\x00garbage", now_ms=5, max_delay_ms=DELAY
    )

    result = IC.assign(group)

    # Nothing remembered, so w2's departure is detected afresh: a full delay.
    assert result.members == {"w1": rs("A", "A-0")}
    assert result.scheduled_rebalance_delay_ms == DELAY
    assert_installable(group, result)


def test_a_second_round_on_its_own_output_changes_nothing_during_a_delay() -> None:
    sim = three_workers()
    sim.leave("w2")
    first = sim.round()

    second = sim.round()

    assert second == first


# --- through a real coordinator group ---------------------------------------------------------


def coordinated_three_workers() -> Coordinated:
    """A (2 tasks) and B (1 task); w1 joins alone, then w2 and w3: seed 003's starting point."""
    c = Coordinated(IncrementalCooperativeAssignor())
    c.h.put_connector("A", 2)
    c.h.put_connector("B", 1)
    c.h.join("w1")
    c.compute()
    c.converge()
    c.h.join("w2")
    c.h.join("w3")
    c.compute()
    c.converge()
    assert c.targets() == {"w1": ["A", "A-0"], "w2": ["B", "A-1"], "w3": ["B-0"]}
    return c


def test_coordinated_the_coordinator_fires_the_delayed_rebalance_and_the_work_spreads() -> None:
    c = coordinated_three_workers()
    h = c.h
    h.leave("w2")
    _, held_back = c.compute()
    assert held_back.scheduled_rebalance_delay_ms == MAX_DELAY_MS
    assert c.targets() == {"w1": ["A", "A-0"], "w3": ["B-0"]}
    epoch = h.group_epoch

    h.run_for(MAX_DELAY_MS, "w1", "w3")
    assert h.group_epoch == epoch + 1  # the scheduled rebalance fired
    _, spread = c.compute()
    c.converge()

    assert spread.scheduled_rebalance_delay_ms == 0
    assert c.targets() == {"w1": ["A", "A-0", "A-1"], "w3": ["B", "B-0"]}


def test_coordinated_a_returning_worker_gets_its_work_back_and_the_delay_is_cancelled() -> None:
    c = coordinated_three_workers()
    h = c.h
    h.leave("w2")
    c.compute()
    h.run_for(1_000, "w1", "w3")
    h.join("w2")
    _, back = c.compute()
    c.converge()

    assert back.scheduled_rebalance_delay_ms == 0
    assert c.targets() == {"w1": ["A", "A-0"], "w2": ["B", "A-1"], "w3": ["B-0"]}
    assert h.deadline((SCHEDULED_REBALANCE, "")) is None


def test_coordinated_the_delay_survives_the_assignor_member_leaving() -> None:
    c = coordinated_three_workers()
    h = c.h
    assert h.state is not None and h.state.meta.assignor_member_id == "w1"
    h.leave("w2")
    c.compute()
    h.run_for(1_000, "w1", "w3")
    h.leave("w1")  # the assignor member goes; w3 computes from the stored state
    assert h.state.meta.assignor_member_id == "w3"

    group, result = c.compute()

    # w1's share joins the held set; the deadline set when w2 left stands.
    assert result.scheduled_rebalance_delay_ms == MAX_DELAY_MS - 1_000
    assert group.coordinator_time_ms == h.now_ms
    assert held_of(result.assignor_state) == {"w1": ["A", "A-0"], "w2": ["B", "A-1"]}
    assert c.targets() == {"w3": ["B-0"]}


def test_coordinated_a_static_worker_back_under_a_new_member_id_gets_its_work_back() -> None:
    c = Coordinated(IncrementalCooperativeAssignor(), GroupHarness())
    h = c.h
    h.put_connector("A", 1)
    h.put_connector("B", 1)
    h.join("w1", instance_id="i1")
    h.join("w2", instance_id="i2")
    c.compute()
    c.converge()
    before = c.targets()
    assert before["w2"]
    h.leave("w2")  # dynamic leave: removed at once, its share held
    c.compute()
    h.join("w2-new", instance_id="i2")

    c.compute()

    assert c.targets() == {"w1": before["w1"], "w2-new": before["w2"]}


def held_of(blob: bytes) -> dict[str, list[str]]:
    return {s.member_id: list(s.resources.names()) for s in decode_state(blob).held}
