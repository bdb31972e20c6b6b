"""ConnectGroupAdmin's state-changing calls: the catalogue and group configurations (DESIGN 2.1,
3.1)."""

from __future__ import annotations

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import PutConnectorResponse
from coordinator_svc.core.model import GroupStatus
from coordinator_svc.core.records import (
    ConfigRecord,
    ConnectorRecord,
    ConnectorRemovedRecord,
    EventType,
    GroupMetaRecord,
    MemberRecord,
    TargetRecord,
)
from coordinator_svc.core.results import SESSION
from tests.core.harness import (
    DEFAULTS,
    INTERVAL_MS,
    SESSION_MS,
    W1_SHARE,
    W2_SHARE,
    GroupHarness,
    catalogue_group,
    rs,
    stable_group,
)

# --- PutConnector ----------------------------------------------------------------------------


def test_putting_a_connector_into_a_missing_group_creates_the_group() -> None:
    h = GroupHarness()

    response = h.put_connector("A", 2, {"connector.class": "X"})

    assert response == PutConnectorResponse(group_epoch=2, created=True, rebalance_triggered=True)
    assert h.state is not None
    # The group starts at epoch 1 and the new connector bumps it; with no members the
    # assignment epoch follows (DESIGN 3.2).
    assert (h.group_epoch, h.assignment_epoch) == (2, 2)
    assert h.state.catalogue_resources() == rs("A", "A-0", "A-1")
    assert dict(h.state.catalogue["A"].config) == {"connector.class": "X"}
    assert h.status() is GroupStatus.EMPTY
    assert h.events_of_last_call() == [
        EventType.GROUP_CREATED,
        EventType.CONNECTOR_PUT,
        EventType.GROUP_EPOCH_BUMPED,
    ]
    assert h.dump() == h.rebuilt()


def test_a_new_connector_bumps_the_epoch_and_asks_for_a_new_target() -> None:
    h = stable_group()

    response = h.put_connector("C", 1)

    assert response.created and response.rebalance_triggered
    assert response.group_epoch == h.group_epoch == 6
    assert h.assignment_epoch == 5
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT


def test_a_config_only_change_is_recorded_but_does_not_bump_the_epoch() -> None:
    h = stable_group()

    response = h.put_connector("A", 2, {"topics": "t2"})

    assert response == PutConnectorResponse(group_epoch=5, created=False, rebalance_triggered=False)
    assert h.group_epoch == 5
    assert h.state is not None and dict(h.state.catalogue["A"].config) == {"topics": "t2"}
    # The connector, and its holder w1 with its lifecycle revision raised (DESIGN 3.20).
    records = h.state_records_of_last_call()
    assert [type(r) for r in records] == [ConnectorRecord, MemberRecord]
    assert isinstance(records[1], MemberRecord) and records[1].epoch_only
    [put] = h.last_events(EventType.CONNECTOR_PUT)
    assert put.payload["config_changed"] is True and put.payload["holders_told"] == 1
    assert put.payload["caller"] == "test"
    assert h.keepalive("w1").error_code == ErrorCode.NONE
    assert h.status() is GroupStatus.STABLE


def test_putting_the_same_connector_again_writes_nothing() -> None:
    h = stable_group()
    h.put_connector("A", 2, {"k": "v"})
    before = h.dump()

    response = h.put_connector("A", 2, {"k": "v"})

    assert response == PutConnectorResponse(group_epoch=5)
    assert h.records_of_last_call == []
    assert h.dump() == before


def test_a_task_count_increase_bumps_the_epoch() -> None:
    h = stable_group()

    response = h.put_connector("A", 3)

    assert response.rebalance_triggered and not response.created
    assert h.group_epoch == 6
    [put] = h.last_events(EventType.CONNECTOR_PUT)
    assert (put.payload["previous_task_count"], put.payload["task_count"]) == (2, 3)
    assert h.state is not None and h.state.catalogue_resources() >= rs("A-2")


def test_a_task_count_decrease_bumps_the_epoch_and_the_next_target_drops_the_tasks() -> None:
    h = stable_group()

    h.put_connector("A", 1)
    h.compute("w1", {"w1": rs("A", "A-0"), "w2": W2_SHARE})
    h.keepalive("w1")
    h.heartbeat("w1", 5, owned=rs("A", "A-0"))
    h.keepalive("w2")

    assert h.group_epoch == 6
    assert h.member("w1").assigned == rs("A", "A-0")
    assert h.status() is GroupStatus.STABLE


def test_a_catalogue_change_on_an_empty_group_moves_both_epochs() -> None:
    h = catalogue_group()

    h.put_connector("C", 0)
    h.delete_connector("C")

    assert (h.group_epoch, h.assignment_epoch) == (5, 5)


# --- DeleteConnector -------------------------------------------------------------------------


def test_deleting_a_connector_removes_it_and_its_tasks_and_bumps_the_epoch() -> None:
    h = stable_group()

    response = h.delete_connector("B")

    assert response.error_code == ErrorCode.NONE
    assert response.group_epoch == h.group_epoch == 6
    assert h.state is not None and "B" not in h.state.catalogue
    assert [type(r) for r in h.state_records_of_last_call()] == [
        GroupMetaRecord,
        ConnectorRemovedRecord,
    ]
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    h.compute("w1", {"w1": W1_SHARE, "w2": rs()})
    h.keepalive("w2")
    h.heartbeat("w2", 5, owned=rs())
    assert h.member("w2").assigned == rs()


def test_deleting_an_unknown_connector_is_an_invalid_request() -> None:
    h = stable_group()
    before = h.dump()

    response = h.delete_connector("Z")

    assert response.error_code == ErrorCode.INVALID_REQUEST
    assert "'Z'" in response.error_message
    assert h.dump() == before


def test_deleting_from_a_missing_group_is_group_id_not_found() -> None:
    h = GroupHarness()

    response = h.delete_connector("A")

    assert response.error_code == ErrorCode.GROUP_ID_NOT_FOUND
    assert h.state is None


def test_deleting_the_last_connector_of_an_empty_group_keeps_the_group() -> None:
    h = GroupHarness()
    h.put_connector("A", 0)

    h.delete_connector("A")

    assert h.state is not None
    assert h.state.catalogue == {}
    assert (h.group_epoch, h.assignment_epoch) == (3, 3)


# --- AlterGroupConfigs -----------------------------------------------------------------------


def test_altered_configs_are_returned_with_the_defaults_and_told_to_members() -> None:
    h = stable_group()

    response = h.alter_configs({"session.timeout.ms": "5000", "heartbeat.interval.ms": "250"})

    assert response.error_code == ErrorCode.NONE
    assert response.effective_configs == {
        **DEFAULTS.as_map(),
        "session.timeout.ms": "5000",
        "heartbeat.interval.ms": "250",
    }
    assert [type(r) for r in h.state_records_of_last_call()] == [ConfigRecord]
    assert h.group_epoch == 5
    heartbeat = h.keepalive("w1")
    assert (heartbeat.heartbeat_interval_ms, heartbeat.session_timeout_ms) == (250, 5000)
    assert h.deadline((SESSION, "w1")) == h.now_ms + 5000


def test_an_altered_session_timeout_governs_expiry() -> None:
    h = stable_group()
    h.alter_configs({"session.timeout.ms": "3000"})
    h.keepalive("w2")

    h.run_for(SESSION_MS * 2, "w1")
    assert h.has_member("w2")
    h.run_for(SESSION_MS, "w1")

    assert not h.has_member("w2")


def test_unsetting_a_config_falls_back_to_the_default() -> None:
    h = stable_group()
    h.alter_configs({"heartbeat.interval.ms": "250"})

    response = h.alter_configs(unset=["heartbeat.interval.ms"])

    assert response.effective_configs["heartbeat.interval.ms"] == str(INTERVAL_MS)
    assert h.keepalive("w1").heartbeat_interval_ms == INTERVAL_MS
    assert h.state is not None and h.state.configs == {}


def test_altering_nothing_writes_nothing() -> None:
    h = stable_group()
    h.alter_configs({"heartbeat.interval.ms": "250"})

    response = h.alter_configs({"heartbeat.interval.ms": "250"})

    assert response.error_code == ErrorCode.NONE
    assert h.records_of_last_call == []


def test_configs_may_be_set_before_the_first_worker_joins() -> None:
    h = GroupHarness()

    h.alter_configs({"session.timeout.ms": "4000"})
    response = h.join("w1")

    assert response.session_timeout_ms == 4000
    assert h.state is not None and h.state.configs == {"session.timeout.ms": "4000"}


def test_the_scheduled_rebalance_maximum_caps_install_delays() -> None:
    h = stable_group()
    h.alter_configs({"scheduled.rebalance.max.delay.ms": "250"})
    h.join("w3")
    h.prepare("w1")

    h.install("w1", {"w1": W1_SHARE, "w2": rs(), "w3": rs()}, delay_ms=10_000)

    assert h.state is not None
    assert h.state.target.scheduled_rebalance_at_ms == h.now_ms + 250
    assert TargetRecord in [type(r) for r in h.state_records_of_last_call()]
