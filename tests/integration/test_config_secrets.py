"""Issue 16: connector configs are secrets. A secret put with PutConnector never appears in a
PrepareAssignment answer, a default DescribeGroups answer, the coordinator's or the agent's log
at DEBUG, or the events table; it appears where an allowed caller asks for it (a server that
allows it with authorization off; the DESCRIBE_CONFIGS ACL with authorization on)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from connect.group.v1 import admin_pb2, coordinator_pb2

from connect_protocol.configs import HIDDEN_VALUE, KEYED_DIGEST_PREFIX, config_digest
from connect_protocol.errors import ErrorCode
from coordinator_svc.core.acls import ANONYMOUS, AclEntry, Operation, ResourceType
from coordinator_svc.store import SqlStore
from tests.support.agents import AgentProcess
from tests.support.client import ScriptedWorker
from tests.support.coordinator import CoordinatorProcess, InProcessCoordinator, Stubs
from tests.support.digests import digest_key, keyed_digest
from tests.support.pgcluster import create_database, drop_database


@pytest.fixture
def secret() -> str:
    return f"s3cr3t-{uuid.uuid4().hex}"


def _put(stubs: Stubs, group: str, secret: str) -> dict[str, str]:
    config = {"connector.class": "FileStreamSink", "db.password": secret}
    resp = stubs.admin.PutConnector(
        admin_pb2.PutConnectorRequest(group_id=group, connector="A", task_count=2, config=config),
        timeout=10,
    )
    assert resp.error_code == ErrorCode.NONE, resp
    return config


def _describe(stubs: Stubs, group: str, values: bool = False) -> admin_pb2.DescribedGroup:
    return stubs.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=[group], include_config_values=values),
        timeout=10,
    ).groups[0]


@pytest.fixture
def debug_coordinator(database_url: str, tmp_path: Path) -> Iterator[CoordinatorProcess]:
    proc = CoordinatorProcess(
        database_url,
        "--log-level",
        "DEBUG",
        "--describe-config-values",
        "allow",
        log_path=tmp_path / "coordinator.log",
    ).start()
    try:
        yield proc
    finally:
        proc.close()


def test_a_secret_stays_out_of_prepare_describe_logs_and_events(
    debug_coordinator: CoordinatorProcess, database_url: str, secret: str, tmp_path: Path
) -> None:
    stubs = Stubs(debug_coordinator.address)
    group = f"secrets-{uuid.uuid4().hex[:6]}"
    try:
        config = _put(stubs, group, secret)

        # PrepareAssignment, as the assignor member sees it: names and task counts only.
        worker = ScriptedWorker(stubs, group, "scripted")
        joined = worker.join()
        assert joined.error_code == ErrorCode.COMPUTE_ASSIGNMENT, joined
        prepared = stubs.coordinator.ConnectGroupPrepareAssignment(
            coordinator_pb2.ConnectGroupPrepareAssignmentRequest(
                group_id=group, member_id="scripted", member_epoch=worker.epoch
            ),
            timeout=10,
        )
        assert prepared.error_code == ErrorCode.NONE, prepared
        assert [(c.name, c.task_count) for c in prepared.catalogue] == [("A", 2)]
        assert secret.encode() not in prepared.SerializeToString()
        assert not prepared.catalogue[0].config
        worker.leave()

        # DescribeGroups by default: the keys, every value hidden, and the digest.
        described = _describe(stubs, group)
        assert described.error_code == ErrorCode.NONE
        assert dict(described.catalogue[0].config) == dict.fromkeys(config, HIDDEN_VALUE)
        keyed = keyed_digest(database_url, config)
        assert keyed != config_digest(config) and keyed.startswith(KEYED_DIGEST_PREFIX)
        assert described.catalogue[0].config_digest == keyed
        assert secret.encode() not in described.SerializeToString()
        # ... and where the server allows it, to a caller that asks.
        shown = _describe(stubs, group, values=True)
        assert dict(shown.catalogue[0].config) == config

        # A real agent at DEBUG computes the assignment and runs the work.
        agent = AgentProcess(
            "agent-1",
            debug_coordinator.address,
            group,
            tmp_path / "agents",
            extra_args=("--log-level", "DEBUG"),
        ).start()
        try:
            deadline = time.monotonic() + 30
            while _running(agent) != {"A", "A-0", "A-1"} or not agent.current.log_lines("DEBUG"):
                assert time.monotonic() < deadline, "\n".join(agent.current.log_lines()[-20:])
                time.sleep(0.2)
        finally:
            agent.close()
        agent_log = agent.current.log_file.read_bytes()
        assert b"DEBUG" in agent_log  # it did log at DEBUG
        assert secret.encode() not in agent_log
    finally:
        stubs.close()

    coordinator_log = debug_coordinator.log_path.read_bytes()  # type: ignore[union-attr]
    assert b'"level":"debug"' in coordinator_log or b"DEBUG" in coordinator_log
    assert secret.encode() not in coordinator_log

    store = SqlStore(database_url, owner_id="reader", advertised_address="-")
    try:
        with store._transaction(write=False) as conn:
            events = conn.execute(sa.text("SELECT CAST(payload AS TEXT) FROM events")).scalars()
            payloads = list(events)
            digests = conn.execute(sa.text("SELECT config_digest FROM connectors")).scalars()
            assert list(digests) == [keyed]
    finally:
        store.close()
    assert payloads and not any(secret in p for p in payloads)
    assert any(keyed in p for p in payloads)  # CONNECTOR_PUT carries the digest
    assert not any(config_digest(config) in p for p in payloads)  # and never the unkeyed one


def _running(agent: AgentProcess) -> set[str]:
    out: set[str] = set()
    for rec in agent.current.records():
        out = out | rec.resources if rec.event == "assigned" else out - rec.resources
    return out


def test_a_server_refuses_config_values_by_default(database_url: str, secret: str) -> None:
    with InProcessCoordinator(database_url) as coordinator:
        assert coordinator.stubs is not None
        _put(coordinator.stubs, "g", secret)
        refused = _describe(coordinator.stubs, "g", values=True)
        assert refused.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        assert secret.encode() not in refused.SerializeToString()
        assert _describe(coordinator.stubs, "g").error_code == ErrorCode.NONE


def test_with_acls_config_values_need_describe_configs(database_url: str, secret: str) -> None:
    with InProcessCoordinator(database_url, authorization=True, acl_refresh_s=0.1) as coordinator:
        assert coordinator.stubs is not None
        acls = coordinator.store.acls
        acls.add(AclEntry(ANONYMOUS, Operation.ALTER, ResourceType.GROUP, "g"))
        coordinator.authorizer.refresh()
        _put(coordinator.stubs, "g", secret)
        assert _describe(coordinator.stubs, "g").error_code == ErrorCode.NONE  # ALTER => DESCRIBE
        denied = _describe(coordinator.stubs, "g", values=True)
        assert denied.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        acls.add(AclEntry(ANONYMOUS, Operation.DESCRIBE_CONFIGS, ResourceType.GROUP, "g"))
        coordinator.authorizer.refresh()
        shown = _describe(coordinator.stubs, "g", values=True)
        assert shown.error_code == ErrorCode.NONE
        assert shown.catalogue[0].config["db.password"] == secret


def _put_config(stubs: Stubs, group: str, connector: str, config: dict[str, str]) -> None:
    resp = stubs.admin.PutConnector(
        admin_pb2.PutConnectorRequest(
            group_id=group, connector=connector, task_count=1, config=config
        ),
        timeout=10,
    )
    assert resp.error_code == ErrorCode.NONE, resp


def _digests_seen(coordinator: InProcessCoordinator, group: str) -> dict[str, tuple[str, ...]]:
    """Each connector's digest as DescribeGroups, the connectors table and the CONNECTOR_PUT
    events show it (the events of every put, oldest first)."""
    assert coordinator.stubs is not None
    seen: dict[str, list[str]] = {
        c.name: [c.config_digest] for c in _describe(coordinator.stubs, group).catalogue
    }
    with coordinator.store._transaction(write=False) as conn:
        for name, digest in conn.execute(
            sa.text("SELECT name, config_digest FROM connectors WHERE group_id = :g ORDER BY name"),
            {"g": group},
        ):
            seen[name].append(digest)
    for event in coordinator.store.list_events(group, 0, None):
        if event["event_type"] == "CONNECTOR_PUT":
            seen[event["payload"]["connector"]].append(event["payload"]["config_digest"])
    return {name: tuple(digests) for name, digests in seen.items()}


def test_digests_are_keyed_by_the_database_and_equal_configs_still_match(
    postgres_admin_url: str, database_url: str, secret: str
) -> None:
    """Issue 23 item 7: the digest is an HMAC under the database's own key (migration 0005), in
    DescribeGroups, the stored row and the CONNECTOR_PUT event alike; equal configs give equal
    digests under one key, and another database (another key) gives another digest."""
    config = {"connector.class": "FileStreamSink", "db.password": secret}
    other = {**config, "db.password": secret + "-other"}
    name = f"t_{uuid.uuid4().hex}"
    second_url = create_database(postgres_admin_url, name)
    try:
        seen = []
        for url in (database_url, second_url):
            with InProcessCoordinator(url) as coordinator:
                assert coordinator.stubs is not None
                _put_config(coordinator.stubs, "g", "A", config)
                _put_config(coordinator.stubs, "g", "B", dict(config))
                _put_config(coordinator.stubs, "g", "C", other)
                _put_config(coordinator.stubs, "h", "A", config)
                seen.append(
                    _digests_seen(coordinator, "g") | {"hA": _digests_seen(coordinator, "h")["A"]}
                )
        keys = digest_key(database_url), digest_key(second_url)
    finally:
        drop_database(postgres_admin_url, name)
    assert keys[0] != keys[1] and len(keys[0]) == 32
    for key, digests in zip(keys, seen, strict=True):
        expected = config_digest(config, key)
        assert expected != config_digest(config)
        # describe, row, event: the same keyed digest, for every connector with this config
        assert digests["A"] == digests["B"] == digests["hA"] == (expected,) * 3
        assert digests["C"] == (config_digest(other, key),) * 3 != digests["A"]
    assert seen[0]["A"] != seen[1]["A"]
    # Another coordinator loads the group: the digest read back from the column is shown.
    with InProcessCoordinator(database_url) as reloaded:
        assert reloaded.stubs is not None
        shown = {c.name: c.config_digest for c in _describe(reloaded.stubs, "g").catalogue}
    assert shown == {"A": seen[0]["A"][0], "B": seen[0]["B"][0], "C": seen[0]["C"][0]}


def test_serve_refuses_to_start_without_the_digest_key(database_url: str, tmp_path: Path) -> None:
    """A database without its digest key (the row deleted) stops `serve` with a clear message,
    instead of computing digests under no key or a new one."""
    store = SqlStore(database_url, owner_id="setup", advertised_address="-")
    try:
        store.migrate()
        with store._transaction(write=True) as conn:
            conn.execute(sa.text("DELETE FROM coordinator_secrets"))
    finally:
        store.close()
    proc = CoordinatorProcess(database_url, log_path=tmp_path / "coordinator.log")
    try:
        with pytest.raises(RuntimeError, match="coordinator exited with 2"):
            proc.start()
    finally:
        proc.close()
    assert b"'config_digest_key'" in (tmp_path / "coordinator.log").read_bytes()
