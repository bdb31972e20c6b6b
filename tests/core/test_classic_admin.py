"""The admin surface on classic groups (issue 25 P3; DESIGN 3.19): AlterGroupConfigs refuses to set
keys that do not apply to classic groups (INVALID_REQUEST naming the type) and allows unsetting
them; a catalogue change that would bump a connect group's epoch starts a classic rebalance
(no generation bump) when the group has members, nothing when it is EMPTY, and a config-only
change starts none; DescribeGroups and ListGroups show the group type, the classic block and
each member's protocol, and `describe` renders them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from connect_protocol.configs import (
    ASSIGNOR_PRINCIPALS,
    GROUP_CONFIGS,
    MIGRATION_POLICY,
    RESTART_FAILED_BACKOFF,
    RESTART_FAILED_MAX_ATTEMPTS,
    SCHEDULED_REBALANCE_MAX_DELAY_MS,
    SESSION_TIMEOUT_MS,
    applies_to,
)
from connect_protocol.errors import ErrorCode
from coordinator_svc.core import classic_rebalance
from coordinator_svc.core.change import GroupChange
from coordinator_svc.core.classic_model import (
    AcceptedAssignment,
    ClassicGroupMeta,
    ClassicState,
    PendingId,
)
from coordinator_svc.core.records import EventType
from coordinator_svc.describe_view import render_group
from coordinator_svc.grpc_api.convert import described_group, listed_groups
from coordinator_svc.runtime.listing import ListedGroup
from coordinator_svc.store.reads import GroupSummary

from .harness import GroupHarness, rs
from .test_conversions import classic_group, make_classic, run, used_connect_group

CLASSIC_ONLY_NOT = [row.name for row in GROUP_CONFIGS if not applies_to(row, "classic")]
CLASSIC_KEYS = [row.name for row in GROUP_CONFIGS if applies_to(row, "classic")]


class Spy:
    """Stands in for `classic_rebalance.prepare_rebalance` (what `start_classic_rebalance`
    calls): records each call and marks the round, so its write is seen in the records."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, dict[str, Any]]] = []

    def __call__(
        self, change: GroupChange, reason: str, member_id: str | None = None, **details: Any
    ) -> None:
        self.calls.append((reason, member_id, details))
        change.set_round(reason=reason)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    recorder = Spy()
    monkeypatch.setattr(classic_rebalance, "prepare_rebalance", recorder)
    return recorder


# --- AlterGroupConfigs --------------------------------------------------------------------


def test_the_table_has_keys_of_both_kinds() -> None:
    assert SESSION_TIMEOUT_MS in CLASSIC_ONLY_NOT
    assert set(CLASSIC_KEYS) == {
        SCHEDULED_REBALANCE_MAX_DELAY_MS,
        ASSIGNOR_PRINCIPALS,
        MIGRATION_POLICY.name,
        RESTART_FAILED_MAX_ATTEMPTS.name,
        RESTART_FAILED_BACKOFF.name,
    }


@pytest.mark.parametrize("key", CLASSIC_ONLY_NOT)
def test_setting_a_key_that_does_not_apply_to_classic_groups_is_refused(key: str) -> None:
    h = classic_group(members=2)
    before = h.dump()
    value = next(str(row.default) for row in GROUP_CONFIGS if row.name == key)
    resp = h.alter_configs({key: value})
    assert resp.error_code == ErrorCode.INVALID_REQUEST
    assert "is a classic group" in resp.error_message and key in resp.error_message
    assert SCHEDULED_REBALANCE_MAX_DELAY_MS in resp.error_message  # what may be set
    assert h.records_of_last_call == [] and h.dump() == before


def test_a_refused_key_refuses_the_whole_request() -> None:
    h = classic_group(members=0)
    resp = h.alter_configs({SCHEDULED_REBALANCE_MAX_DELAY_MS: "10", SESSION_TIMEOUT_MS: "7000"})
    assert resp.error_code == ErrorCode.INVALID_REQUEST
    assert h.state is not None and h.state.configs.get(SCHEDULED_REBALANCE_MAX_DELAY_MS) != "10"


def test_keys_that_apply_to_classic_groups_are_set(spy: Spy) -> None:
    h = classic_group(members=2)
    resp = h.alter_configs(
        {SCHEDULED_REBALANCE_MAX_DELAY_MS: "5000", ASSIGNOR_PRINCIPALS: "User:leader"}
    )
    assert resp.error_code == ErrorCode.NONE, resp
    assert h.state is not None
    assert h.state.configs[SCHEDULED_REBALANCE_MAX_DELAY_MS] == "5000"
    assert h.state.configs[ASSIGNOR_PRINCIPALS] == "User:leader"
    # A config change starts no rebalance, and a classic group has no assignor to reselect.
    assert spy.calls == []
    assert h.events_of_last_call() == [EventType.CONFIG_ALTERED]
    assert h.state.meta.classic is not None
    assert h.state.meta.classic.state is ClassicState.STABLE


def test_a_key_carried_over_from_connect_may_be_unset() -> None:
    h = used_connect_group()
    assert h.alter_configs({SESSION_TIMEOUT_MS: "7000"}).error_code == ErrorCode.NONE
    make_classic(h)
    assert h.state is not None and h.state.configs[SESSION_TIMEOUT_MS] == "7000"
    resp = h.alter_configs(unset=[SESSION_TIMEOUT_MS])
    assert resp.error_code == ErrorCode.NONE, resp
    assert SESSION_TIMEOUT_MS not in h.state.configs
    assert h.state.meta.session_floor_ms == 0  # no connect member was told anything


def test_a_connect_group_still_takes_every_key() -> None:
    h = used_connect_group()
    for key in CLASSIC_ONLY_NOT:
        value = next(str(row.default) for row in GROUP_CONFIGS if row.name == key)
        assert h.alter_configs({key: value}).error_code == ErrorCode.NONE, key


# --- the catalogue trigger ----------------------------------------------------------------


def test_adding_a_connector_to_a_classic_group_with_members_starts_a_rebalance(spy: Spy) -> None:
    h = classic_group(members=2, generation=4)
    resp = h.put_connector("B", 3)
    assert resp.error_code == ErrorCode.NONE, resp
    assert resp.rebalance_triggered and resp.created
    assert spy.calls == [("catalogue changed: connector added", None, {"connector": "B"})]
    assert resp.group_epoch == 4 and h.group_epoch == 4  # no generation bump
    assert EventType.GROUP_EPOCH_BUMPED not in h.events_of_last_call()
    assert h.state is not None and h.state.round is not None
    assert h.state.round.reason == "catalogue changed: connector added"  # the spy's write


def test_resizing_and_deleting_a_connector_start_a_rebalance(spy: Spy) -> None:
    h = classic_group(members=2, generation=4)
    assert h.put_connector("A", 5, {"k": "v"}).rebalance_triggered
    assert h.delete_connector("A").error_code == ErrorCode.NONE
    assert spy.calls == [
        ("catalogue changed: connector task count changed", None, {"connector": "A"}),
        ("catalogue changed: connector deleted", None, {"connector": "A"}),
    ]
    assert h.group_epoch == 4


def test_a_config_only_change_starts_no_rebalance(spy: Spy) -> None:
    h = classic_group(members=2, generation=4)
    resp = h.put_connector("A", 2, {"k": "changed"})
    assert resp.error_code == ErrorCode.NONE and not resp.rebalance_triggered
    assert spy.calls == []
    assert h.events_of_last_call() == [EventType.CONNECTOR_PUT]
    assert h.group_epoch == 4


def test_a_catalogue_change_on_an_empty_classic_group_bumps_nothing(spy: Spy) -> None:
    h = classic_group(members=0, generation=6)
    resp = h.put_connector("B", 1)
    assert resp.error_code == ErrorCode.NONE and not resp.rebalance_triggered
    assert h.delete_connector("B").error_code == ErrorCode.NONE
    assert spy.calls == [] and h.group_epoch == 6
    assert h.state is not None and h.state.assignment_epoch == 6


def test_a_connect_group_still_bumps_its_epoch(spy: Spy) -> None:
    h = used_connect_group()
    epoch = h.group_epoch
    assert h.put_connector("B", 1).rebalance_triggered
    assert h.group_epoch == epoch + 1 and spy.calls == []


def test_a_catalogue_change_takes_a_stable_classic_group_to_preparing() -> None:
    """With P1: the real rebalance starts, PREPARING_REBALANCE, the generation unchanged."""
    h = classic_group(members=2, generation=4)
    h.put_connector("B", 1)
    assert h.state is not None and h.state.meta.classic is not None
    assert h.state.meta.classic.state is ClassicState.PREPARING_REBALANCE
    assert h.group_epoch == 4
    (started,) = h.last_events(EventType.CLASSIC_REBALANCE_STARTED)
    assert started.payload["connector"] == "B" and started.payload["generation"] == 4


# --- Describe / List ----------------------------------------------------------------------


def preparing_group() -> GroupHarness:
    """A classic group in PREPARING_REBALANCE with a pending id and one member rejoined."""
    h = classic_group(members=3, generation=4)

    def round_(change: GroupChange) -> None:
        change.set_meta(classic=ClassicGroupMeta(ClassicState.PREPARING_REBALANCE, "compatible"))
        change.put_pending_id("p-9", PendingId("User:w", 6_000, h.now_ms + 6_000))
        change.join_round("c3")
        change.join_round("c1")
        change.set_round(reason="member joined", leader_unavailable_reason="")

    run(h, round_)
    return h


def test_describe_shows_a_preparing_classic_group() -> None:
    h = preparing_group()
    assert h.state is not None
    shown = described_group(h.state, h.defaults, h.now_ms, "no member lists a common", "x")
    assert (shown.group_type, shown.state, shown.group_epoch) == (
        "classic",
        "PREPARING_REBALANCE",
        4,
    )
    assert shown.assignor_name == "" and shown.assignor_unavailable_reason == ""
    c = shown.classic
    assert (c.state, c.generation_id, c.protocol_type, c.protocol_name, c.leader_id) == (
        "PREPARING_REBALANCE",
        4,
        "connect",
        "compatible",
        "",
    )
    assert list(c.pending_member_ids) == ["p-9"]
    assert list(c.members_joined) == ["c3", "c1"]  # join order
    assert list(c.members_awaiting_sync) == []
    assert c.rebalance_reason == "member joined"
    assert [m.group_protocol for m in shown.members] == ["classic"] * 3
    m1 = shown.members[0]
    assert m1.member_id == "c1" and list(m1.classic.protocols) == ["compatible"]
    assert m1.classic.session_timeout_ms == 6_000 and m1.classic.last_joined_generation == 4
    text = render_group(shown, h.now_ms)
    assert "Group g (classic)  state PREPARING_REBALANCE" in text
    assert "generation 4   protocol connect/compatible" in text and "no leader" in text
    assert "pending member ids: p-9   joined this phase: c3, c1" in text
    assert "last rebalance reason: member joined" in text
    assert "PROTOCOLS" in text and "compatible" in text and "SESSION MS" in text


def test_describe_shows_who_awaits_sync_and_who_synced() -> None:
    h = classic_group(members=2, generation=4)

    def completing(change: GroupChange) -> None:
        change.set_meta(
            classic=ClassicGroupMeta(ClassicState.COMPLETING_REBALANCE, "compatible", "c1")
        )
        change.set_sync_sets(awaiting=["c1", "c2"], synced=["c1"])
        c1 = change.member("c1")
        assert c1 is not None and c1.classic is not None
        accepted = AcceptedAssignment(4, 1, rs("A"), rs(), answered=True)
        change.put_member(replace(c1, classic=replace(c1.classic, accepted=accepted)))

    run(h, completing)
    assert h.state is not None
    shown = described_group(h.state, h.defaults, h.now_ms, "", "")
    assert list(shown.classic.members_awaiting_sync) == ["c2"]
    assert shown.classic.leader_id == "c1"
    assert [(m.member_id, m.classic.synced) for m in shown.members] == [
        ("c1", True),
        ("c2", False),
    ]
    text = render_group(shown, h.now_ms)
    assert "leader c1" in text and "awaiting sync: c2" in text


def test_a_connect_group_is_described_as_before_with_its_members_protocol() -> None:
    h = used_connect_group()
    h.join("w1")
    assert h.state is not None
    shown = described_group(h.state, h.defaults, h.now_ms, "", "incremental_cooperative")
    assert shown.group_type == "connect" and not shown.HasField("classic")
    assert shown.state == h.state.status().value
    assert shown.assignor_name == "incremental_cooperative"
    assert [(m.group_protocol, m.HasField("classic")) for m in shown.members] == [
        ("connect", False)
    ]
    text = render_group(shown, h.now_ms)
    assert "assignment (target) epoch" in text and "classic state" not in text


def test_listing_shows_type_classic_state_and_protocol() -> None:
    classic = ListedGroup.of(
        GroupSummary("c", 5, 5, 3, 3, "classic", "COMPLETING_REBALANCE", "sessioned")
    )
    empty_classic = ListedGroup.of(GroupSummary("e", 2, 2, 0, 0, "classic", None, None))
    connect = ListedGroup.of(GroupSummary("k", 3, 2, 1, 1))
    assert (classic.group_type, classic.state, classic.protocol_name) == (
        "classic",
        "COMPLETING_REBALANCE",
        "sessioned",
    )
    assert (empty_classic.state, empty_classic.protocol_name) == ("EMPTY", "")
    assert (connect.group_type, connect.state, connect.protocol_name) == (
        "connect",
        "ASSIGNING",
        "",
    )
    out = listed_groups([classic, empty_classic, connect], "")
    assert [(g.group_type, g.state, g.protocol_name, g.member_count) for g in out.groups] == [
        ("classic", "COMPLETING_REBALANCE", "sessioned", 3),
        ("classic", "EMPTY", "", 0),
        ("connect", "ASSIGNING", "", 1),
    ]
