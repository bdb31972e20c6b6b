"""Seed 000's "Case Studies" replayed on the core, read as DESIGN's section "Where seed 000's case
studies and seed 003's scenarios differ from this page" says:

- epochs are compared relative to the group's epoch before the first join (the catalogue is put
  first, which moves the epochs of the empty group too), so the seed's numbers appear as offsets;
- a joining member is answered at once with the current assignment epoch (DESIGN 3.2), where the
  seed shows epoch 0;
- in "W2 joins", W2 reaches the new target epoch holding nothing before W1 acknowledges (3.11);
- the delayed rebalance of "Worker Leaving" is declared by the install and fired by the
  coordinator (3.7); in "Worker Bounces" W2 rejoins at epoch 0 and gets its work back at once
  (3.8, 3.12);
- the seed's typos ("BC1" for BT1, "W2" for W3, group epoch 36 where 37 is meant) are read as meant.

A scripted assignor installs the seed's targets. The seed's resource names are kept: AC0 is
connector A, AT1 and AT2 its tasks 0 and 1, BC0 connector B, BT1 its task 0.
"""

from __future__ import annotations

from typing import Any

from connect_protocol.errors import ErrorCode
from connect_protocol.resources import EMPTY, ResourceSet
from coordinator_svc.core.model import GroupStatus
from coordinator_svc.core.results import SCHEDULED_REBALANCE
from tests.core.harness import SESSION_MS, GroupHarness, rs

SEED_NAMES = {"AC0": "A", "AT1": "A-0", "AT2": "A-1", "BC0": "B", "BT1": "B-0"}
OUR_NAMES = {ours: seed for seed, ours in SEED_NAMES.items()}

DELAY_MS = 2_000


def seed(*names: str) -> ResourceSet:
    return rs(*(SEED_NAMES[n] for n in names))


def seed_names(resources: ResourceSet) -> list[str]:
    return sorted(OUR_NAMES[n] for n in resources.names())


class Study:
    """A group with the seed's catalogue, and snapshots of it in the seed's terms."""

    def __init__(self) -> None:
        self.h = GroupHarness()
        self.h.put_connector("A", 2)
        self.h.put_connector("B", 1)
        self.base = self.h.group_epoch  # the seed's "epoch 0"

    def snapshot(self) -> dict[str, Any]:
        """Group epoch, target epoch and shares, and every member's epoch, state and assignment,
        epochs relative to `base`."""
        s = self.h.state
        assert s is not None
        return {
            "group": s.group_epoch - self.base,
            "target": s.target.assignment_epoch - self.base,
            "target_shares": {
                mid: seed_names(entry.resources) for mid, entry in s.target.members.items()
            },
            "members": {
                mid: (m.member_epoch - self.base, m.state.value, seed_names(m.owned))
                for mid, m in sorted(s.members.items())
            },
        }

    def expect(
        self,
        group: int,
        target: int,
        target_shares: dict[str, list[str]],
        members: dict[str, tuple[int, str, list[str]]],
    ) -> None:
        assert self.snapshot() == {
            "group": group,
            "target": target,
            "target_shares": {mid: sorted(names) for mid, names in target_shares.items()},
            "members": {
                mid: (epoch, state, sorted(names)) for mid, (epoch, state, names) in members.items()
            },
        }

    def ack(self, member_id: str) -> Any:
        return self.h.ack(member_id)


def test_w1_joins_an_empty_group_and_gets_everything() -> None:
    study = Study()
    h = study.h
    # Empty Group: group epoch 0, target epoch 0, no members.
    study.expect(0, 0, {}, {})

    # W1 joins: the group epoch is bumped to 1; W1 has an empty assignment at the target epoch.
    response = h.join("W1")
    assert response.member_epoch == study.base + 0
    assert response.assignment is not None and response.assignment.resources == EMPTY
    # W1 is selected as the member to run the client assignor.
    assert response.error_code == ErrorCode.COMPUTE_ASSIGNMENT
    study.expect(1, 0, {}, {"W1": (0, "STABLE", [])})

    # W1 computes: everything to W1, installed as the target at epoch 1.
    h.compute("W1", {"W1": seed("AC0", "AT1", "AT2", "BC0", "BT1")})
    study.expect(1, 1, {"W1": ["AC0", "AT1", "AT2", "BC0", "BT1"]}, {"W1": (0, "STABLE", [])})

    # W1 heartbeats: nothing to revoke, so it moves to epoch 1 with everything.
    response = study.ack("W1")
    assert response.error_code == ErrorCode.NONE
    assert response.member_epoch == study.base + 1
    assert response.assignment is not None
    assert seed_names(response.assignment.resources) == ["AC0", "AT1", "AT2", "BC0", "BT1"]
    study.expect(
        1,
        1,
        {"W1": ["AC0", "AT1", "AT2", "BC0", "BT1"]},
        {"W1": (1, "STABLE", ["AC0", "AT1", "AT2", "BC0", "BT1"])},
    )
    assert h.status() is GroupStatus.STABLE


def test_w2_joins_and_gets_its_share_once_w1_has_revoked_it() -> None:
    study = Study()
    h = study.h
    h.join("W1")
    h.compute("W1", {"W1": seed("AC0", "AT1", "AT2", "BC0", "BT1")})
    study.ack("W1")
    everything = ["AC0", "AT1", "AT2", "BC0", "BT1"]

    # W2 joins: group epoch 2; W2 is answered at once at the assignment epoch, holding nothing.
    response = h.join("W2")
    assert response.member_epoch == study.base + 1
    study.expect(
        2,
        1,
        {"W1": everything},
        {"W1": (1, "STABLE", everything), "W2": (1, "STABLE", [])},
    )

    # W1 is chosen to compute; it installs the new target at epoch 2.
    assert h.keepalive("W1").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    h.compute("W1", {"W1": seed("AC0", "AT1", "AT2"), "W2": seed("BC0", "BT1")})
    study.expect(
        2,
        2,
        {"W1": ["AC0", "AT1", "AT2"], "W2": ["BC0", "BT1"]},
        {"W1": (1, "STABLE", everything), "W2": (1, "STABLE", [])},
    )

    # W2 heartbeats: nothing to revoke, so it reaches epoch 2, but it cannot have BC0 and BT1
    # until W1 revokes them (DESIGN 3.11; the seed's table shows epoch 1 here).
    response = h.keepalive("W2")
    assert response.member_epoch == study.base + 2
    assert response.assignment is not None and response.assignment.resources == EMPTY
    study.expect(
        2,
        2,
        {"W1": ["AC0", "AT1", "AT2"], "W2": ["BC0", "BT1"]},
        {"W1": (1, "STABLE", everything), "W2": (2, "UNRELEASED", [])},
    )

    # W1 heartbeats: it is asked to revoke BC0 and BT1, and stays at epoch 1 meanwhile.
    response = study.ack("W1")
    assert response.member_epoch == study.base + 1
    assert response.assignment is not None
    assert seed_names(response.assignment.resources) == ["AC0", "AT1", "AT2"]
    study.expect(
        2,
        2,
        {"W1": ["AC0", "AT1", "AT2"], "W2": ["BC0", "BT1"]},
        {"W1": (1, "UNREVOKED", everything), "W2": (2, "UNRELEASED", [])},
    )

    # W1 acknowledges the revocation: the coordinator moves it to epoch 2.
    response = h.heartbeat("W1", study.base + 1, owned=seed("AC0", "AT1", "AT2"))
    assert response.member_epoch == study.base + 2
    study.expect(
        2,
        2,
        {"W1": ["AC0", "AT1", "AT2"], "W2": ["BC0", "BT1"]},
        {"W1": (2, "STABLE", ["AC0", "AT1", "AT2"]), "W2": (2, "UNRELEASED", [])},
    )

    # W2 heartbeats: it gets its assignment at epoch 2.
    response = h.keepalive("W2")
    assert response.assignment is not None
    assert seed_names(response.assignment.resources) == ["BC0", "BT1"]
    study.expect(
        2,
        2,
        {"W1": ["AC0", "AT1", "AT2"], "W2": ["BC0", "BT1"]},
        {"W1": (2, "STABLE", ["AC0", "AT1", "AT2"]), "W2": (2, "STABLE", ["BC0", "BT1"])},
    )
    assert h.status() is GroupStatus.STABLE


def three_workers() -> Study:
    """The seed's "epoch 35" group: W1 [AC0, AT1], W2 [BC0, BT1], W3 [AT2], all stable, W3 the
    assignor member (it joined first). `base` is moved so that this epoch reads as 35."""
    study = Study()
    h = study.h
    h.join("W3")
    h.join("W1")
    h.join("W2")
    h.compute("W3", {"W1": seed("AC0", "AT1"), "W2": seed("BC0", "BT1"), "W3": seed("AT2")})
    for member_id in ("W1", "W2", "W3"):
        study.ack(member_id)
    study.base = h.group_epoch - 35
    study.expect(
        35,
        35,
        {"W1": ["AC0", "AT1"], "W2": ["BC0", "BT1"], "W3": ["AT2"]},
        {
            "W1": (35, "STABLE", ["AC0", "AT1"]),
            "W2": (35, "STABLE", ["BC0", "BT1"]),
            "W3": (35, "STABLE", ["AT2"]),
        },
    )
    return study


def w2_times_out_and_w3_defers(study: Study) -> None:
    h = study.h
    # W2 fails to heartbeat; the coordinator removes it when its session expires: epoch 36.
    h.run_for(SESSION_MS, "W1", "W3")
    study.expect(
        36,
        35,
        {"W1": ["AC0", "AT1"], "W2": ["BC0", "BT1"], "W3": ["AT2"]},
        {"W1": (35, "STABLE", ["AC0", "AT1"]), "W3": (35, "STABLE", ["AT2"])},
    )

    # W3 computes, and changes nothing to give W2 a chance to come back: BC0 and BT1 stay
    # unassigned, which the install declares with a scheduled rebalance delay. W1's and W3's
    # shares do not change, so the install moves them to epoch 36 at once (DESIGN 3.21; the
    # seed's table shows 35 until their next heartbeats).
    assert h.keepalive("W3").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    h.compute("W3", {"W1": seed("AC0", "AT1"), "W3": seed("AT2")}, delay_ms=DELAY_MS)
    study.expect(
        36,
        36,
        {"W1": ["AC0", "AT1"], "W3": ["AT2"]},
        {"W1": (36, "STABLE", ["AC0", "AT1"]), "W3": (36, "STABLE", ["AT2"])},
    )

    # W1 and W3 heartbeat: they learn epoch 36, with the same assignments.
    study.ack("W1")
    study.ack("W3")
    study.expect(
        36,
        36,
        {"W1": ["AC0", "AT1"], "W3": ["AT2"]},
        {"W1": (36, "STABLE", ["AC0", "AT1"]), "W3": (36, "STABLE", ["AT2"])},
    )


def test_a_worker_leaves_and_its_work_is_placed_after_the_scheduled_delay() -> None:
    study = three_workers()
    h = study.h
    w2_times_out_and_w3_defers(study)
    assert h.state is not None
    fires_at = h.state.target.scheduled_rebalance_at_ms
    assert fires_at is not None and h.deadline((SCHEDULED_REBALANCE, "")) == fires_at

    # Nothing moves before the delay has passed...
    h.run_for(fires_at - h.now_ms - 1, "W1", "W3")
    assert study.snapshot()["group"] == 36
    # ...then the coordinator fires the scheduled rebalance: epoch 37.
    h.run_for(1, "W1", "W3")
    study.expect(
        37,
        36,
        {"W1": ["AC0", "AT1"], "W3": ["AT2"]},
        {"W1": (36, "STABLE", ["AC0", "AT1"]), "W3": (36, "STABLE", ["AT2"])},
    )

    # W3 is asked to compute; it places the lost work (the seed's target, scripted).
    assert h.keepalive("W3").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    h.compute("W3", {"W1": seed("AC0", "AT1", "BC0"), "W3": seed("BT1", "AT2")})
    study.expect(
        37,
        37,
        {"W1": ["AC0", "AT1", "BC0"], "W3": ["AT2", "BT1"]},
        {"W1": (36, "STABLE", ["AC0", "AT1"]), "W3": (36, "STABLE", ["AT2"])},
    )

    # W1 and W3 heartbeat: they receive their assignments; the rebalance is done.
    study.ack("W1")
    study.ack("W3")
    study.expect(
        37,
        37,
        {"W1": ["AC0", "AT1", "BC0"], "W3": ["AT2", "BT1"]},
        {"W1": (37, "STABLE", ["AC0", "AT1", "BC0"]), "W3": (37, "STABLE", ["AT2", "BT1"])},
    )
    assert h.status() is GroupStatus.STABLE


def test_a_bouncing_worker_gets_its_resources_back_at_once() -> None:
    study = three_workers()
    h = study.h
    w2_times_out_and_w3_defers(study)

    # Before the delay has passed, W2 comes back. It was removed, so it rejoins at epoch 0
    # (DESIGN 3.12); the join bumps the group epoch to 37.
    response = h.join("W2")
    assert response.member_epoch == study.base + 36
    study.expect(
        37,
        36,
        {"W1": ["AC0", "AT1"], "W3": ["AT2"]},
        {
            "W1": (36, "STABLE", ["AC0", "AT1"]),
            "W2": (36, "STABLE", []),
            "W3": (36, "STABLE", ["AT2"]),
        },
    )

    # W3 sees the delay in progress and gives W2 back its work; the install has no delay, so
    # the pending scheduled rebalance is cleared.
    assert h.keepalive("W3").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    h.compute("W3", {"W1": seed("AC0", "AT1"), "W2": seed("BC0", "BT1"), "W3": seed("AT2")})
    assert h.deadline((SCHEDULED_REBALANCE, "")) is None

    # Everyone heartbeats: the group is at epoch 37 with the original assignments.
    for member_id in ("W1", "W2", "W3"):
        study.ack(member_id)
    final_targets = {"W1": ["AC0", "AT1"], "W2": ["BC0", "BT1"], "W3": ["AT2"]}
    final_members = {
        "W1": (37, "STABLE", ["AC0", "AT1"]),
        "W2": (37, "STABLE", ["BC0", "BT1"]),
        "W3": (37, "STABLE", ["AT2"]),
    }
    study.expect(37, 37, final_targets, final_members)
    assert h.status() is GroupStatus.STABLE

    # The cleared delay never fires.
    h.run_for(2 * DELAY_MS, "W1", "W2", "W3")
    study.expect(37, 37, final_targets, final_members)
