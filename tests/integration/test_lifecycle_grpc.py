"""The connector lifecycle's member calls over gRPC on PostgreSQL (issue 28, DESIGN 3.20):
lifecycle revisions raised for exactly the holders of a reconfigured connector,
ConnectGroupConfigs answering only what the caller holds, ConnectGroupReportStatus refusing
entries one by one, statuses derived on read (UNASSIGNED until the current holder reports under
its grant), surviving a takeover, and the member-call rate. One in-process coordinator (real
gRPC server on 127.0.0.1, real database)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import sqlalchemy as sa
from connect.group.v1 import admin_pb2, common_pb2, coordinator_pb2

from connect_protocol.errors import ErrorCode
from coordinator_svc.runtime.quotas import PrincipalQuotas
from tests.support.client import ScriptedWorker, parse
from tests.support.coordinator import InProcessCoordinator, Stubs, run_cli

GROUP = "lifecycle"
SECRET = "s3cr3t-password-value"


def put(stubs: Stubs, name: str, tasks: int, **config: str) -> Any:
    resp = stubs.admin.PutConnector(
        admin_pb2.PutConnectorRequest(
            group_id=GROUP, connector=name, task_count=tasks, config=config
        ),
        timeout=10,
    )
    assert resp.error_code == 0, resp.error_message
    return resp


def configs(worker: ScriptedWorker, epoch: int | None = None, **known: str) -> Any:
    return worker.stubs.coordinator.ConnectGroupConfigs(
        coordinator_pb2.ConnectGroupConfigsRequest(
            group_id=GROUP,
            member_id=worker.member_id,
            member_epoch=worker.epoch if epoch is None else epoch,
            known_digests=known,
        ),
        timeout=10,
    )


def report(worker: ScriptedWorker, *entries: coordinator_pb2.StatusEntry, epoch: int = 0) -> Any:
    return worker.stubs.coordinator.ConnectGroupReportStatus(
        coordinator_pb2.ConnectGroupReportStatusRequest(
            group_id=GROUP,
            member_id=worker.member_id,
            member_epoch=epoch or worker.epoch,
            entries=entries,
        ),
        timeout=10,
    )


def entry(
    connector: str, token: int, state: int, task: int | None = None, trace: str = ""
) -> coordinator_pb2.StatusEntry:
    e = coordinator_pb2.StatusEntry(
        connector=connector, fencing_token=token, state=state, trace=trace
    )
    if task is not None:
        e.task = task
    return e


def tokens(worker: ScriptedWorker) -> dict[Any, int]:
    """The fencing tokens of the worker's assignment, by connector or (connector, task): a
    heartbeat reporting an empty owned list is answered with the whole assignment again."""
    owned = worker.owned
    worker.owned = (frozenset(), frozenset())
    resp = worker.heartbeat()
    assert resp.HasField("assignment") and worker.owned == owned
    return {
        (t.connector, t.task) if t.HasField("task") else t.connector: t.token
        for t in resp.assignment.fencing_tokens
    }


def statuses(stubs: Stubs) -> dict[Any, Any]:
    resp = stubs.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=[GROUP], include_status=True), timeout=10
    )
    group = resp.groups[0]
    assert group.error_code == 0, group.error_message
    return {(s.connector, s.task) if s.HasField("task") else s.connector: s for s in group.statuses}


def formed(stubs: Stubs) -> tuple[ScriptedWorker, ScriptedWorker]:
    """w1 runs A and A-0, w2 runs B and B-0 (installed by w1, the assignor)."""
    put(stubs, "A", 1, password=SECRET)
    put(stubs, "B", 1, topic="b")
    w1, w2 = ScriptedWorker(stubs, GROUP, "w1"), ScriptedWorker(stubs, GROUP, "w2")
    w1.join()
    w2.join()
    w1.heartbeat()
    prepared = w1.prepare()
    assert prepared.error_code == 0, prepared.error_message
    installed = w1.install(prepared.group_epoch, {"w1": parse("A", "A-0"), "w2": parse("B", "B-0")})
    assert installed.error_code == 0, installed.error_message
    for _ in range(3):
        w1.heartbeat()
        w2.heartbeat()
    assert w1.owned == parse("A", "A-0") and w2.owned == parse("B", "B-0")
    return w1, w2


def test_configs_go_to_holders_only_and_revisions_rise_for_them(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with InProcessCoordinator(database_url) as coord:
        assert coord.stubs is not None
        stubs = coord.stubs
        w1, w2 = formed(stubs)
        before_1 = w1.heartbeat().lifecycle_revision
        before_2 = w2.heartbeat().lifecycle_revision
        assert before_1 > 0 and before_2 > 0  # their grants raised them

        answer = configs(w1)
        assert answer.error_code == 0, answer.error_message
        assert answer.lifecycle_revision == before_1
        assert [c.connector for c in answer.connectors] == ["A"]  # never B
        (held,) = answer.connectors
        assert held.config.values["password"] == SECRET
        assert held.target_state == common_pb2.TARGET_STARTED
        digest = held.config_digest
        again = configs(w1, A=digest)
        assert not again.connectors[0].HasField("config")  # it has these values
        assert configs(w1, B="x").connectors[0].connector == "A"  # what it names is ignored

        put(stubs, "A", 1, password="rotated")  # a config-only change: no epoch bump
        after_1 = w1.heartbeat(report_owned=False)
        after_2 = w2.heartbeat(report_owned=False)
        assert after_1.lifecycle_revision == before_1 + 1
        assert after_2.lifecycle_revision == before_2  # not a holder of A
        changed = configs(w1, A=digest)
        assert changed.connectors[0].config.values["password"] == "rotated"
        assert changed.connectors[0].config_digest != digest
        assert changed.lifecycle_revision == after_1.lifecycle_revision

        # A stale epoch is fenced without removal; the member heartbeats on.
        stale = configs(w1, epoch=w1.epoch - 1)
        assert stale.error_code == ErrorCode.FENCED_MEMBER_EPOCH
        assert "not removed" in stale.error_message
        assert w1.heartbeat().error_code == 0
        unknown = configs(ScriptedWorker(stubs, GROUP, "nobody"), epoch=1)
        assert unknown.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        bad = configs(w1, epoch=0)
        assert bad.error_code == ErrorCode.INVALID_REQUEST

        events = coord.store.list_events(GROUP)
        put_events = [e for e in events if e["event_type"] == "CONNECTOR_PUT"]
        assert put_events[-1]["payload"]["holders_told"] == 1
        assert not any(SECRET in str(e["payload"]) or "rotated" in str(e) for e in events)
        prepared = w1.prepare()
        assert SECRET not in str(prepared) and "rotated" not in str(prepared)
    assert len(caplog.records) > 10  # the coordinator logged (events, at DEBUG too)
    assert SECRET not in caplog.text and "rotated" not in caplog.text  # at DEBUG included


def test_status_entries_are_refused_one_by_one_and_derived_on_read(database_url: str) -> None:
    with InProcessCoordinator(database_url) as coord:
        assert coord.stubs is not None
        stubs = coord.stubs
        w1, w2 = formed(stubs)
        t1, t2 = tokens(w1), tokens(w2)
        assert statuses(stubs)["A"].state == common_pb2.UNASSIGNED  # nobody reported yet
        answer = report(
            w1,
            entry("A", t1["A"], common_pb2.RUNNING),
            entry("A", t1[("A", 0)], common_pb2.FAILED, task=0, trace="boom " + SECRET),
            entry("B", t2["B"], common_pb2.RUNNING),  # w2's
        )
        assert answer.error_code == 0, answer.error_message
        codes = [r.error_code for r in answer.results]
        assert codes == [0, 0, ErrorCode.NOT_RESOURCE_OWNER]
        assert "not held by this member" in answer.results[2].error_message
        stale = report(w1, entry("A", t1[("A", 0)] + 7, common_pb2.RUNNING, task=0))
        assert stale.results[0].error_code == ErrorCode.NOT_RESOURCE_OWNER
        assert "fencing token" in stale.results[0].error_message
        view = statuses(stubs)
        assert view["A"].state == common_pb2.RUNNING and view["A"].worker_id == "w1"
        assert view[("A", 0)].state == common_pb2.FAILED
        assert view[("A", 0)].trace == "boom " + SECRET
        assert view["B"].state == common_pb2.UNASSIGNED and view["B"].worker_id == "w2"
        counted = coord.manager.group_stats().statuses
        assert counted == {"RUNNING": 1, "FAILED": 1}  # coordinator_resource_statuses
        shown = run_cli("status", GROUP, "--coordinator", coord.address)
        assert shown.returncode == 0, shown.stderr
        assert "connector A  RUNNING  worker w1" in shown.stdout
        assert "task A-0  FAILED  worker w1" in shown.stdout and "| boom" in shown.stdout
        as_json = run_cli("status", GROUP, "--coordinator", coord.address, "--output", "json")
        listed = json.loads(as_json.stdout)["statuses"]
        assert {"connector": "B", "task": 0, "worker_id": "w2"}.items() <= listed[-1].items()
        assert listed[-1].get("state", "UNASSIGNED") == "UNASSIGNED"
        described = run_cli("describe", GROUP, "--coordinator", coord.address, "--output", "json")
        assert json.loads(described.stdout)["group_epoch"] >= 1

        (changed,) = [
            e for e in coord.store.list_events(GROUP) if e["event_type"] == "STATUS_CHANGED"
        ]
        assert SECRET not in str(changed["payload"])  # the trace only as a digest
        failed = next(c for c in changed["payload"]["changes"] if c.get("task") == 0)
        assert failed["state"] == "FAILED" and failed["trace_digest"]

        # The same report again changes nothing and writes nothing.
        repeat = report(w1, entry("A", t1["A"], common_pb2.RUNNING))
        assert repeat.results[0].error_code == 0
        assert (
            len([e for e in coord.store.list_events(GROUP) if e["event_type"] == "STATUS_CHANGED"])
            == 1
        )

        # Bad entries refuse the whole request and change nothing.
        for bad in (
            entry("A", t1[("A", 0)], common_pb2.STOPPED, task=0),  # STOPPED is a connector's
            entry("A", t1["A"], common_pb2.RESTARTING),  # the coordinator's state
            entry("A", 0, common_pb2.RUNNING),  # no token
        ):
            refused = report(w1, bad)
            assert refused.error_code == ErrorCode.INVALID_REQUEST, refused
        duplicate = report(
            w1, entry("A", t1["A"], common_pb2.PAUSED), entry("A", t1["A"], common_pb2.PAUSED)
        )
        assert duplicate.error_code == ErrorCode.INVALID_REQUEST
        assert statuses(stubs)["A"].state == common_pb2.RUNNING

        # w1 leaves: A's statuses read UNASSIGNED (a rebalance writes no status), and its old
        # grant's token no longer counts for anyone.
        w1.leave()
        view = statuses(stubs)
        assert view["A"].state == common_pb2.UNASSIGNED and view["A"].worker_id == ""
        released = report(w2, entry("A", t1["A"], common_pb2.RUNNING))
        assert released.results[0].error_code == ErrorCode.NOT_RESOURCE_OWNER


def test_statuses_and_revisions_survive_a_takeover(database_url: str) -> None:
    with InProcessCoordinator(database_url) as coord:
        assert coord.stubs is not None
        w1, _w2 = formed(coord.stubs)
        t1 = tokens(w1)
        trace = "x" * 10_000
        answer = report(w1, entry("A", t1[("A", 0)], common_pb2.FAILED, task=0, trace=trace))
        assert answer.results[0].error_code == 0
        revision = w1.heartbeat().lifecycle_revision
        epoch = w1.epoch
    with InProcessCoordinator(database_url) as second:
        stubs = second.stubs
        assert stubs is not None
        view = statuses(stubs)
        kept = view[("A", 0)].trace
        assert view[("A", 0)].state == common_pb2.FAILED
        assert (
            len(kept.encode()) <= 4_096 and "cut to 4096 bytes" in kept
        )  # --status-trace-max-bytes
        w1 = ScriptedWorker(stubs, GROUP, "w1")
        w1.epoch, w1.owned = epoch, parse("A", "A-0")
        assert w1.heartbeat().lifecycle_revision == revision
        (changed,) = [
            e for e in second.store.list_events(GROUP) if e["event_type"] == "STATUS_CHANGED"
        ]
        digest = changed["payload"]["changes"][0]["trace_digest"]
        assert digest.startswith("hmac-sha256:")  # keyed, as config digests are
        engine = sa.create_engine(database_url, poolclass=sa.NullPool)
        try:
            with engine.connect() as conn:
                stored = conn.execute(
                    sa.text("SELECT trace_digest FROM resource_statuses WHERE task = 0")
                ).scalar()
        finally:
            engine.dispose()
        assert stored == digest


def test_member_calls_are_rate_limited_per_principal(database_url: str) -> None:
    quotas = PrincipalQuotas(member_call_rate=1.0, member_call_burst=2.0)
    with InProcessCoordinator(database_url, quotas=quotas) as coord:
        assert coord.stubs is not None
        w1, _w2 = formed(coord.stubs)
        answers = [configs(w1) for _ in range(4)]
        codes = [a.error_code for a in answers]
        assert codes[:2] == [0, 0]
        throttled = [a for a in answers if a.error_code == ErrorCode.THROTTLING_QUOTA_EXCEEDED]
        assert throttled and all(a.throttle_time_ms > 0 for a in throttled)
        assert "--max-member-calls-per-s" in throttled[0].error_message


def test_classic_members_get_revisions_and_configs_and_the_leader_no_values(
    database_url: str,
) -> None:
    from tests.integration.test_classic_grpc import GROUP as CLASSIC_GROUP
    from tests.integration.test_classic_grpc import Coordinator, classic_defaults

    with Coordinator(database_url, classic_defaults(100)) as coord:
        stubs = Stubs(coord.address)
        try:
            resp = stubs.admin.PutConnector(
                admin_pb2.PutConnectorRequest(
                    group_id=CLASSIC_GROUP, connector="A", task_count=1, config={"pw": SECRET}
                ),
                timeout=10,
            )
            assert resp.error_code == 0, resp.error_message
            member = coord.member(url="http://c0:8083")
            member.join_once()  # MEMBER_ID_REQUIRED: its id
            joined = member.join()
            assert joined.leader == member.member_id
            assert SECRET not in str(joined)  # the leader's catalogue: names and counts only
            assert all(not c.config for c in joined.catalogue)
            synced = member.sync()
            assert synced.error_code == 0, synced.error_message
            assert synced.lifecycle_revision > 0  # its grant
            beat = member.heartbeat()
            assert beat.lifecycle_revision == synced.lifecycle_revision
            worker = ScriptedWorker(stubs, CLASSIC_GROUP, member.member_id)
            worker.epoch = member.generation
            answer = worker.stubs.coordinator.ConnectGroupConfigs(
                coordinator_pb2.ConnectGroupConfigsRequest(
                    group_id=CLASSIC_GROUP,
                    member_id=member.member_id,
                    member_epoch=member.generation,
                ),
                timeout=10,
            )
            assert answer.error_code == 0, answer.error_message
            assert answer.connectors[0].config.values["pw"] == SECRET
            stale = stubs.coordinator.ConnectGroupConfigs(
                coordinator_pb2.ConnectGroupConfigsRequest(
                    group_id=CLASSIC_GROUP,
                    member_id=member.member_id,
                    member_epoch=member.generation + 1,
                ),
                timeout=10,
            )
            assert stale.error_code == ErrorCode.FENCED_MEMBER_EPOCH
            assert "generation" in stale.error_message
            stubs.admin.PutConnector(
                admin_pb2.PutConnectorRequest(
                    group_id=CLASSIC_GROUP, connector="A", task_count=1, config={"pw": "new"}
                ),
                timeout=10,
            )
            assert member.heartbeat().lifecycle_revision == synced.lifecycle_revision + 1
        finally:
            stubs.close()
