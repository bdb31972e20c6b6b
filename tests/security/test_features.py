"""The cluster feature group.version end to end (issue 27, DESIGN 3.19 "Feature flag"), on real
PostgreSQL and real gRPC over mTLS: DescribeFeatures needs DESCRIBE on the cluster and
UpdateFeatures ALTER (refusals counted and recorded as cluster denials); an update is one
FEATURE_UPDATED event naming the caller, group id ""; INVALID_UPDATE_VERSION for a level or a
feature this release does not serve; at level 0 a new connect member is refused with
UNSUPPORTED_VERSION while an admitted one is served and classic joins go on; a second
coordinator of the database applies a change within its refresh interval; `coordinator-svc
features` goes through the RPCs."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from dataclasses import replace
from typing import Any

import pytest
import sqlalchemy as sa
from connect.group.v1 import admin_pb2

from coordinator_svc.cli import main
from coordinator_svc.core.acls import CLUSTER_NAME, AclEntry, Operation, ResourceType
from coordinator_svc.core.records import EventType
from coordinator_svc.store import schema
from tests.support.classic_client import ClassicMember
from tests.support.client import ScriptedWorker
from tests.support.coordinator import CHILD_ENV, FAST_DEFAULTS, REPO, InProcessCoordinator

from .conftest import ADMIN, BOB, Clients, Pki, clear_acls, denial_count, grant, unique

CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_REQUEST = 42
INVALID_UPDATE_VERSION = 95
UNSUPPORTED_VERSION = 35
#: NONE, or the signal to the assignor member (not an error).
SERVED = (0, 10001)
GROUP_VERSION = "group.version"


def update(stubs: Any, level: int, feature: str = GROUP_VERSION, **kw: Any) -> Any:
    return stubs.admin.UpdateFeatures(
        admin_pb2.UpdateFeaturesRequest(feature=feature, level=level, **kw), timeout=10
    )


def levels(stubs: Any) -> dict[str, tuple[int, int, int]]:
    answer = stubs.admin.DescribeFeatures(admin_pb2.DescribeFeaturesRequest(), timeout=10)
    assert answer.error_code == 0, answer
    return {
        f.name: (f.finalized_level, f.min_supported_level, f.max_supported_level)
        for f in answer.features
    }


def feature_events(database_url: str) -> list[dict[str, Any]]:
    engine = sa.create_engine(database_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(schema.events)
                .where(schema.events.c.event_type == EventType.FEATURE_UPDATED.value)
                .order_by(schema.events.c.id)
            ).mappings()
            return [dict(row) for row in rows]
    finally:
        engine.dispose()


@pytest.fixture
def level_restored(secured: InProcessCoordinator, clients: Clients) -> Iterator[None]:
    """The module's database back at group.version 1 after the test."""
    yield
    assert update(clients.admin, 1).error_code == 0


def test_describe_and_update_need_the_cluster_acls_and_refusals_are_cluster_denials(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    clear_acls(secured)
    before = (
        denial_count(secured, "DescribeFeatures", "DESCRIBE"),
        denial_count(secured, "UpdateFeatures", "ALTER"),
    )
    described = clients.bob.admin.DescribeFeatures(admin_pb2.DescribeFeaturesRequest(), timeout=10)
    assert described.error_code == CLUSTER_AUTHORIZATION_FAILED
    assert not described.features
    refused = update(clients.bob, 0)
    assert refused.error_code == CLUSTER_AUTHORIZATION_FAILED, refused
    assert "ALTER on the cluster" in refused.error_message
    # Refused before anything is read or checked: an unknown feature is refused the same.
    assert update(clients.bob, 7, "no.such").error_code == CLUSTER_AUTHORIZATION_FAILED
    assert levels(clients.admin)[GROUP_VERSION][0] == 1
    assert denial_count(secured, "DescribeFeatures", "DESCRIBE") == before[0] + 1
    assert denial_count(secured, "UpdateFeatures", "ALTER") == before[1] + 2
    secured.authorizer.flush_denials()
    engine = sa.create_engine(secured.database_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(schema.events.c.group_id, schema.events.c.payload).where(
                    schema.events.c.event_type == EventType.AUTHORIZATION_DENIED.value
                )
            ).all()
    finally:
        engine.dispose()
    mine = {(r.payload["operation"], tuple(r.payload["rpcs"])): r for r in rows}
    for key in (("DESCRIBE", ("DescribeFeatures",)), ("ALTER", ("UpdateFeatures",))):
        row = mine[key]
        assert row.group_id == "" and row.payload["resource_type"] == "CLUSTER"
        assert row.payload["principal"] == BOB

    grant(secured, AclEntry(BOB, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME))
    assert levels(clients.bob) == {GROUP_VERSION: (1, 0, 1)}
    assert update(clients.bob, 1).error_code == CLUSTER_AUTHORIZATION_FAILED
    grant(secured, AclEntry(BOB, Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME))
    answer = update(clients.bob, 1, validate_only=True)
    assert answer.error_code == 0 and not answer.changed, answer


def test_an_update_round_trip_is_one_event_naming_the_caller(
    secured: InProcessCoordinator, clients: Clients, level_restored: None
) -> None:
    events = len(feature_events(secured.database_url))
    checked = update(clients.admin, 0, validate_only=True)
    assert (checked.error_code, checked.previous_level, checked.finalized_level) == (0, 1, 0)
    assert checked.changed
    assert levels(clients.admin)[GROUP_VERSION][0] == 1  # validate_only changed nothing
    assert len(feature_events(secured.database_url)) == events

    lowered = update(clients.admin, 0)
    assert (lowered.error_code, lowered.previous_level, lowered.finalized_level) == (0, 1, 0)
    assert lowered.changed
    assert levels(clients.admin) == {GROUP_VERSION: (0, 0, 1)}  # this coordinator: at once
    again = update(clients.admin, 0)
    assert again.error_code == 0 and not again.changed
    (event,) = feature_events(secured.database_url)[events:]
    assert event["group_id"] == "" and event["group_epoch"] == -1
    assert event["payload"]["principal"] == ADMIN
    assert event["payload"]["address"].startswith("ipv4:127.0.0.1:")
    assert {k: event["payload"][k] for k in ("feature", "level", "previous_level", "via")} == {
        "feature": GROUP_VERSION,
        "level": 0,
        "previous_level": 1,
        "via": "UpdateFeatures",
    }


def test_a_level_or_feature_not_served_is_invalid_update_version_and_changes_nothing(
    secured: InProcessCoordinator, clients: Clients
) -> None:
    events = len(feature_events(secured.database_url))
    for level, feature in ((2, GROUP_VERSION), (-1, GROUP_VERSION), (1, "transaction.version")):
        answer = update(clients.admin, level, feature)
        assert answer.error_code == INVALID_UPDATE_VERSION, answer
    too_high = update(clients.admin, 2)
    assert "serves levels 0 to 1" in too_high.error_message
    assert "knows group.version" in update(clients.admin, 1, "x" * 60).error_message
    for feature in ("", "g\x00", "x" * 65):
        assert update(clients.admin, 1, feature).error_code == INVALID_REQUEST
    assert len(feature_events(secured.database_url)) == events
    assert levels(clients.admin)[GROUP_VERSION][0] == 1


def test_at_level_0_only_new_connect_members_are_refused_and_another_coordinator_follows(
    secured: InProcessCoordinator, clients: Clients, level_restored: None
) -> None:
    group = unique("features")
    admitted = ScriptedWorker(clients.admin, group, "w1")
    assert admitted.heartbeat().error_code in SERVED
    defaults = replace(FAST_DEFAULTS, classic_initial_rebalance_delay_ms=0)
    with InProcessCoordinator(secured.database_url, defaults=defaults, acl_refresh_s=0.1) as other:
        assert other.stubs is not None and other.features.group_version == 1
        assert update(clients.admin, 0).error_code == 0
        started = time.monotonic()
        while other.features.group_version != 0:
            assert time.monotonic() - started < 2.0, "the other coordinator did not follow"
            time.sleep(0.02)
        assert levels(other.stubs)[GROUP_VERSION][0] == 0

        newcomer = ScriptedWorker(clients.admin, group, "w2").heartbeat()
        assert newcomer.error_code == UNSUPPORTED_VERSION, newcomer
        assert "group.version is at level 0" in newcomer.error_message
        assert admitted.heartbeat().error_code in SERVED  # an admitted member is served
        elsewhere = ScriptedWorker(other.stubs, unique("other"), "w1").heartbeat()
        assert elsewhere.error_code == UNSUPPORTED_VERSION, elsewhere
        classic = ClassicMember(other.stubs.channel, unique("classic"))
        assert classic.join().error_code == 0  # the classic protocol is always served

        assert update(clients.admin, 1).error_code == 0
        started = time.monotonic()
        while other.features.group_version != 1:
            assert time.monotonic() - started < 2.0, "the other coordinator did not follow"
            time.sleep(0.02)
    assert ScriptedWorker(clients.admin, group, "w2").heartbeat().error_code in SERVED


def test_the_features_command_goes_through_the_rpcs(
    secured: InProcessCoordinator, pki: Pki, level_restored: None
) -> None:
    tls = [
        "--coordinator",
        secured.address,
        "--tls-ca",
        str(pki.ca.cert_file),
        "--tls-cert",
        str(pki.admin.cert),
        "--tls-key",
        str(pki.admin.key),
    ]
    command = [sys.executable, "-m", "coordinator_svc.cli", "features", "update"]
    lowered = subprocess.run(
        [*command, "--feature", GROUP_VERSION, "--level", "0", *tls],
        capture_output=True,
        text=True,
        env=CHILD_ENV,
        cwd=REPO,
        timeout=60,
    )
    assert lowered.returncode == 0, lowered.stderr
    assert "group.version set to level 0 (was 1)" in lowered.stdout
    update_args = ["features", "update", "--feature", GROUP_VERSION]
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["features", "describe", *tls]) == 0
        assert main([*update_args, "--level", "2", *tls]) == 1  # INVALID_UPDATE_VERSION
        assert main([*update_args, "--level", "1", "--validate-only", *tls]) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["FEATURE", "LEVEL", "SUPPORTED"]
    assert lines[1].split() == [GROUP_VERSION, "0", "0-1"]
    assert "would go from level 0 to 1 (validate only" in lines[2]
