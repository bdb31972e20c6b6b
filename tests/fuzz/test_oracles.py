"""The fuzz checks can fail: `judge` refuses every answer the contract does not allow, the log
check finds tracebacks, every SQL invariant finds its broken rows, and the healthy group reports
an error answer. (A check that cannot fail would make the fuzz tests pass whatever the server
does.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from connect.group.v1 import admin_pb2, coordinator_pb2
from google.protobuf.message import Message

from tests.support import hostile
from tests.support.coordinator import InProcessCoordinator

LIMIT = 1024

FIND = admin_pb2.FindCoordinatorRequest(group_id="g").SerializeToString()
UNDECODABLE = b"\x0a\x02\xff\xfe"  # field 1, a string, with invalid UTF-8


def _code(value: int) -> Any:
    """An in-band error code as the generated stubs' constructors take it."""
    return value


def _judge(
    status: grpc.StatusCode,
    answer: Message | None = None,
    body: bytes = FIND,
    rpc: str = "FindCoordinator",
    details: str = "",
) -> hostile.Verdict:
    encoded = answer.SerializeToString() if answer is not None else None
    return hostile.judge(rpc, body, status, details, encoded, LIMIT)


def test_allowed_answers_pass() -> None:
    for code in (0, 42, 15):
        verdict = _judge(
            grpc.StatusCode.OK, admin_pb2.FindCoordinatorResponse(error_code=_code(code))
        )
        assert not verdict.problems, verdict
    assert _judge(grpc.StatusCode.OK, admin_pb2.FindCoordinatorResponse()).label == "OK/NONE"
    refused = _judge(
        grpc.StatusCode.INVALID_ARGUMENT,
        body=UNDECODABLE,
        details="the request body is not a valid connect.group.v1.FindCoordinatorRequest.",
    )
    assert not refused.problems and refused.label == "INVALID_ARGUMENT"
    oversized = _judge(grpc.StatusCode.RESOURCE_EXHAUSTED, body=b"\x0a" + b"x" * LIMIT)
    assert not oversized.problems
    computing = _judge(
        grpc.StatusCode.OK,
        coordinator_pb2.ConnectGroupHeartbeatResponse(error_code=_code(10001)),
        body=b"",
        rpc="ConnectGroupHeartbeat",
    )
    assert not computing.problems


@pytest.mark.parametrize(
    ("case", "verdict", "fatal"),
    [
        ("INTERNAL", lambda: _judge(grpc.StatusCode.INTERNAL, details="boom"), True),
        ("UNKNOWN", lambda: _judge(grpc.StatusCode.UNKNOWN, details="boom"), True),
        (
            "in-band UNKNOWN_SERVER_ERROR",
            lambda: _judge(
                grpc.StatusCode.OK, admin_pb2.FindCoordinatorResponse(error_code=_code(-1))
            ),
            True,
        ),
        (
            "UNKNOWN_SERVER_ERROR in one described group",
            lambda: _judge(
                grpc.StatusCode.OK,
                admin_pb2.DescribeGroupsResponse(
                    groups=[admin_pb2.DescribedGroup(group_id="g", error_code=_code(-1))]
                ),
                body=admin_pb2.DescribeGroupsRequest(group_ids=["g"]).SerializeToString(),
                rpc="DescribeGroups",
            ),
            True,
        ),
        (
            "INVALID_ARGUMENT for a valid body",
            lambda: _judge(grpc.StatusCode.INVALID_ARGUMENT),
            False,
        ),
        (
            "OK for an undecodable body",
            lambda: _judge(grpc.StatusCode.OK, admin_pb2.FindCoordinatorResponse(), UNDECODABLE),
            False,
        ),
        (
            "RESOURCE_EXHAUSTED for a small body",
            lambda: _judge(grpc.StatusCode.RESOURCE_EXHAUSTED),
            False,
        ),
        ("DEADLINE_EXCEEDED", lambda: _judge(grpc.StatusCode.DEADLINE_EXCEEDED), False),
        (
            "a code outside the contract",
            lambda: _judge(
                grpc.StatusCode.OK, admin_pb2.FindCoordinatorResponse(error_code=_code(4242))
            ),
            False,
        ),
        (
            "COMPUTE_ASSIGNMENT from an admin RPC",
            lambda: _judge(
                grpc.StatusCode.OK, admin_pb2.FindCoordinatorResponse(error_code=_code(10001))
            ),
            False,
        ),
        (
            "SQL in an error message",
            lambda: _judge(
                grpc.StatusCode.OK,
                admin_pb2.FindCoordinatorResponse(
                    error_code=_code(15), error_message="(psycopg.DataError) [SQL: SELECT 1]"
                ),
            ),
            False,
        ),
        (
            "a described group missing",
            lambda: _judge(
                grpc.StatusCode.OK,
                admin_pb2.DescribeGroupsResponse(),
                body=admin_pb2.DescribeGroupsRequest(group_ids=["g"]).SerializeToString(),
                rpc="DescribeGroups",
            ),
            False,
        ),
    ],
)
def test_answers_the_contract_does_not_allow_are_problems(
    case: str, verdict: Callable[[], hostile.Verdict], fatal: bool
) -> None:
    found = verdict()
    assert found.problems, case
    assert found.fatal is fatal, case


def test_the_log_check_finds_tracebacks_and_error_lines() -> None:
    clean = '{"level":"info","msg":"connector put"}\n{"level":"warning","msg":"undecodable"}\n'
    assert hostile.log_findings(clean) == (0, [])
    bad = (
        clean
        + '{"level":"error","msg":"unexpected error","exc":"Traceback (most recent call last):\\n'
        + '  File x"}\nTraceback (most recent call last):\n  File "y", line 1\n'
    )
    tracebacks, errors = hostile.log_findings(bad)
    assert tracebacks == 2
    assert len(errors) == 2


def test_every_invariant_finds_its_broken_rows(database_url: str) -> None:
    """A real group (the healthy group's, with a target installed), checked clean; then each
    invariant broken with plain SQL, and each must be reported."""
    with InProcessCoordinator(database_url) as coord:
        healthy = hostile.HealthyGroup(coord.address).start()
        healthy.stop()
        assert not healthy.errors and not healthy.unavailable
    clean = hostile.check_invariants(database_url)
    assert clean.ok, clean.describe()
    assert clean.counts["members"] == 3 and clean.counts["group_leases"] <= 1

    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as conn:

            def run(sql: str) -> None:
                conn.execute(sa.text(sql))

            def copy_row(table: str, where: str, group_id: str) -> None:
                """A copy of a row under another group id (whatever the table's columns)."""
                run(f"CREATE TEMP TABLE copied AS SELECT * FROM {table} WHERE {where} LIMIT 1")
                run(f"UPDATE copied SET group_id = '{group_id}'")
                run(f"INSERT INTO {table} SELECT * FROM copied")
                run("DROP TABLE copied")

            # Two members hold ok-0's work; the target gives it twice; a hold keeps it too.
            run(
                "UPDATE members SET assigned = (SELECT assigned FROM members "
                "WHERE member_id = 'ok-0') WHERE member_id = 'ok-1'"
            )
            run(
                "UPDATE target_assignment_members SET resources = (SELECT resources FROM "
                "target_assignment_members WHERE member_id = 'ok-0') WHERE member_id = 'ok-1'"
            )
            run(
                "UPDATE groups SET holds = jsonb_build_array(jsonb_build_object("
                "'member_id', 'gone', 'until_ms', 0, 'principal', '', 'resources', "
                "(SELECT assigned FROM members WHERE member_id = 'ok-0')))"
            )
            # Epochs ahead of the group's.
            run("UPDATE members SET member_epoch = member_epoch + 100 WHERE member_id = 'ok-2'")
            run("UPDATE target_assignments SET assignment_epoch = assignment_epoch + 100")
            # Rows of a group that does not exist (foreign keys dropped to allow them).
            fks = conn.execute(
                sa.text(
                    "SELECT conrelid::regclass::text, conname FROM pg_constraint "
                    "WHERE contype = 'f' AND conrelid::regclass::text IN ('members', "
                    "'connectors', 'group_configs', 'target_assignments', "
                    "'target_assignment_members')"
                )
            ).all()
            for table, name in fks:
                run(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
            for table in ("members", "connectors", "group_configs", "target_assignments"):
                copy_row(table, "true", "ghost")
            copy_row("target_assignment_members", "true", "ghost-without-target")
            copy_row("group_leases", "true", "ghost")
    finally:
        engine.dispose()

    broken = hostile.check_invariants(database_url)
    missed = [name for name, rows in broken.violations.items() if not rows]
    assert not missed, broken.describe()
    allowed = hostile.check_invariants(database_url, allowed_leases=["ghost"])
    assert not allowed.violations["no leases of groups that do not exist"]


def test_the_healthy_group_reports_an_error_answer(database_url: str) -> None:
    """A member of the healthy group removed behind its back (a leave under its id) gets
    UNKNOWN_MEMBER_ID on its next heartbeat: reported."""
    with InProcessCoordinator(database_url) as coord:
        assert coord.stubs is not None
        healthy = hostile.HealthyGroup(coord.address).start()
        try:
            assert not healthy.errors
            left = coord.stubs.coordinator.ConnectGroupHeartbeat(
                coordinator_pb2.ConnectGroupHeartbeatRequest(
                    group_id=healthy.group_id, member_id="ok-0", member_epoch=-1
                ),
                timeout=10,
            )
            assert left.error_code == 0, left
            deadline = time.monotonic() + 10
            while not healthy.errors and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            healthy.stop()
    assert healthy.errors and "UNKNOWN_MEMBER_ID" in healthy.errors[0], healthy.errors
    assert healthy.latency_ms(0.5) > 0
