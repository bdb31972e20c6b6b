"""The conversions between the classic protocol's values and the ports' shapes
(worker_agent.classic.messages), driven through both ports."""

from __future__ import annotations

from connect_protocol.classic_messages import ConnectWorkerMetadata, JoinGroupMember
from connect_protocol.messages import ConnectorInfo
from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from worker_agent.classic.eager import eager_assignment
from worker_agent.classic.incremental import IncrementalCooperativeAssignor
from worker_agent.classic.messages import catalogue_of, sync_assignments, worker_states


def _members() -> list[JoinGroupMember]:
    return [
        JoinGroupMember("b", ConnectWorkerMetadata(version=2, url="http://b", allocation=None)),
        JoinGroupMember(
            "a",
            ConnectWorkerMetadata(
                version=2, url="http://a", allocation=ResourceSet.of(["x"], [TaskId("x", 0)])
            ),
        ),
    ]


def test_join_answer_to_inputs_and_answers_to_sync_assignments() -> None:
    states = worker_states(_members())
    assert states["b"].allocation == EMPTY
    assert states["a"].url == "http://a"
    catalogue = catalogue_of([ConnectorInfo("x", 2, {}), ConnectorInfo("y", 0, {})])
    assert catalogue == {"x": 2, "y": 0}

    answers = IncrementalCooperativeAssignor().perform_assignment(
        "a", states, catalogue, generation=1, last_completed_generation=-1, now_ms=0
    )
    synced = sync_assignments(answers)
    assert [s.member_id for s in synced] == ["a", "b"]
    by_member = {s.member_id: s.assignment for s in synced}
    assert by_member["b"].assignment == ResourceSet.of(["y"], [TaskId("x", 1)])
    assert by_member["b"].revoked == EMPTY
    assert (by_member["b"].leader, by_member["b"].leader_url, by_member["b"].version) == (
        "a",
        "http://a",
        2,
    )

    eager = {
        s.member_id: s.assignment
        for s in sync_assignments(eager_assignment("a", states, catalogue))
    }
    assert eager["a"].revoked is None and eager["a"].version == 0
    assert eager["a"].assignment | eager["b"].assignment == ResourceSet.of(
        ["x", "y"], [TaskId("x", 0), TaskId("x", 1)]
    )
