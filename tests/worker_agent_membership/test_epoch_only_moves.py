"""The agent accepts a new member epoch without an assignment (DESIGN 3.21: an install moves a
member whose share it does not change to its epoch, and the member learns the epoch from its next
heartbeat's answer with the assignment ABSENT): it keeps running what it runs, starts and stops
nothing, and heartbeats at the new epoch without repeating its unchanged owned list."""

from __future__ import annotations

from tests.worker_agent_membership.test_membership import (
    INTERVAL,
    assert_partial,
    joined,
    of_type,
    ok,
    only_heartbeat,
    rs,
)
from worker_agent.membership import StartWork, StopWork


def test_a_new_epoch_without_an_assignment_keeps_the_work_and_is_used_from_then_on() -> None:
    d = joined(rs("A", "A-0", "B"), epoch=3)
    only_heartbeat(d.poll(INTERVAL))

    d.answer(ok(7))  # moved 3 -> 5 -> 7 by two installs since its last heartbeat

    actions = d.poll_until(2 * INTERVAL - 1, step=50)
    assert of_type(actions, StopWork) == [] and of_type(actions, StartWork) == []
    assert d.m.epoch == 7
    assert d.m.assigned == d.running == rs("A", "A-0", "B")
    assert_partial(only_heartbeat(d.poll(2 * INTERVAL)), epoch=7, owned=None)
