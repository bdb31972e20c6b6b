"""Replays, against a real coordinator, the message-by-message rebalance that protos/README.md
("One rebalance, message by message") shows client authors, and checks every answer it quotes
(with the lifecycle calls of its last step: ConnectGroupConfigs, ConnectGroupReportStatus)."""

from __future__ import annotations

from typing import Any

from connect.group.v1 import admin_pb2, common_pb2, coordinator_pb2

from tests.support.client import ScriptedWorker, describe, from_cat, parse, put_connector
from tests.support.coordinator import Stubs

NONE = common_pb2.ErrorCode.Value("NONE")
COMPUTE = common_pb2.ErrorCode.Value("COMPUTE_ASSIGNMENT")


def assignment(resp: Any) -> list[str] | None:
    """The answer's assignment as sorted names ("A", "A-0"), or None when ABSENT."""
    if not resp.HasField("assignment"):
        return None
    connectors, tasks = from_cat(resp.assignment.connectors_and_tasks)
    return sorted(connectors) + sorted(f"{c}-{t}" for c, t in tasks)


def test_the_guides_rebalance_happens_as_documented(stubs: Stubs, group: str) -> None:
    assert put_connector(stubs, group, "A", 2).group_epoch == 2
    w1, w2 = ScriptedWorker(stubs, group, "w1"), ScriptedWorker(stubs, group, "w2")
    # Before: w1 alone runs A, A-0, A-1 at epoch 3.
    assert w1.join().error_code == COMPUTE
    prepared = w1.prepare()
    w1.install(prepared.group_epoch, {"w1": parse("A", "A-0", "A-1")})
    w1.heartbeat(report_owned=False)
    assert (w1.epoch, sorted(w1.owned[0]), len(w1.owned[1])) == (3, ["A"], 2)
    assert w1.heartbeat().error_code == NONE

    # 1. w2 joins: every field set, owned present and empty.
    r = w2.join()
    assert (r.error_code, r.member_epoch, assignment(r)) == (NONE, 3, [])
    assert r.lifecycle_revision == 0  # granted nothing yet: nothing to fetch
    # 2. w1's next heartbeat (nothing changed, so every optional field absent).
    r = w1.heartbeat(report_owned=False)
    assert (r.error_code, r.member_epoch, assignment(r)) == (COMPUTE, 3, None)
    # 3. Prepare.
    p = w1.prepare()
    assert (p.error_code, p.group_epoch, p.assignment_epoch) == (NONE, 4, 3)
    assert (p.assignor_name, p.assignor_version) == ("incremental_cooperative", 2)
    assert sorted(m.member_id for m in p.members) == ["w1", "w2"]
    # 4. Install: w1 keeps A and A-0, w2 gets A-1.
    assert w1.install(4, {"w1": parse("A", "A-0"), "w2": parse("A-1")}).error_code == NONE
    # 5. w1 is told to run only A and A-0 (revoke A-1), still at epoch 3.
    r = w1.heartbeat(report_owned=False)
    assert (r.error_code, r.member_epoch, assignment(r)) == (NONE, 3, ["A", "A-0"])
    # 6. w2 moves to epoch 4 but gets nothing yet: A-1 still runs on w1.
    r = w2.heartbeat(report_owned=False)
    assert (r.error_code, r.member_epoch, assignment(r)) == (NONE, 4, [])
    # 7. w1 has stopped A-1 and acknowledges by reporting what it runs: epoch 4.
    r = w1.heartbeat()
    assert (r.error_code, r.member_epoch, assignment(r)) == (NONE, 4, ["A", "A-0"])
    # 8. w2 now receives A-1 ...
    r = w2.heartbeat(report_owned=False)
    assert (r.error_code, r.member_epoch, assignment(r)) == (NONE, 4, ["A-1"])
    assert r.lifecycle_revision == 1  # the grant raised it
    ((connector, task, token),) = [
        (t.connector, t.task, t.token) for t in r.assignment.fencing_tokens
    ]
    assert (connector, task, token) == ("A", 1, 2)  # A-1 ran under token 1 on w1
    # 9. ... fetches A's config (the revision differs from its last fetch's: none) ...
    c = stubs.coordinator.ConnectGroupConfigs(
        coordinator_pb2.ConnectGroupConfigsRequest(group_id=group, member_id="w2", member_epoch=4),
        timeout=10,
    )
    assert (c.error_code, c.lifecycle_revision, [h.connector for h in c.connectors]) == (
        NONE,
        1,
        ["A"],
    )
    assert c.connectors[0].HasField("config")
    assert c.connectors[0].config_digest.startswith("hmac-sha256:")
    assert c.connectors[0].target_state == common_pb2.TARGET_STARTED
    # ... starts it, and reports it in its heartbeat ...
    r = w2.heartbeat()
    assert (r.error_code, r.member_epoch, assignment(r)) == (NONE, 4, None)
    assert r.lifecycle_revision == 1  # no change: no fetch
    # ... and its status.
    entry = coordinator_pb2.StatusEntry(
        connector="A", task=1, fencing_token=token, state=common_pb2.RUNNING
    )
    s = stubs.coordinator.ConnectGroupReportStatus(
        coordinator_pb2.ConnectGroupReportStatusRequest(
            group_id=group, member_id="w2", member_epoch=4, entries=[entry]
        ),
        timeout=10,
    )
    assert (s.error_code, [e.error_code for e in s.results]) == (NONE, [NONE])
    (view,) = stubs.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=[group], include_status=True), timeout=10
    ).groups
    (a1,) = [x for x in view.statuses if x.connector == "A" and x.HasField("task") and x.task == 1]
    assert (a1.state, a1.worker_id) == (common_pb2.RUNNING, "w2")
    described = describe(stubs, group)
    assert (described.state, described.group_epoch, described.assignment_epoch) == (
        "STABLE",
        4,
        4,
    )
