"""Every validation rule and every error code of every RPC, over real gRPC and real PostgreSQL.

Seed 000's "Request Validation" / "Request Handling" lists per API, DESIGN 2.1 (in-band errors,
COMPUTE_ASSIGNMENT is a signal), 3.1 (admin), 3.4 (UNSUPPORTED_ASSIGNOR), 3.6/3.9 (install
validity), 3.11 (identical heartbeats write nothing), 3.12 (epochs, fencing) and 3.14 (static
membership). Each test asserts the wire error code, that the message names the broken rule, and
that ``store_dump.dump`` (every state table and the audit trail) and the group as DescribeGroups
shows it are identical before and after the failing call. The one documented exception is
FENCED_MEMBER_EPOCH on a heartbeat, which removes the member (seed step 3; DESIGN 3.12, 3.13): those
tests assert exactly that change.

The server is pytest-grpc's real server (DESIGN 2.4) on 127.0.0.1, serving a CoordinatorServicer
and an AdminServicer over one GroupManager + SqlStore on a module-scoped PostgreSQL database. The
tests share that database, so each uses its own group id, and the group defaults use long
timeouts so that no timer of an earlier test's group fires (and writes) during a later test.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from connect.group.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
)

from coordinator_svc.core.model import GroupConfigDefaults
from coordinator_svc.grpc_api.servicers import AdminServicer, CoordinatorServicer
from coordinator_svc.runtime.groups import GroupManager
from coordinator_svc.store import SqlStore
from tests.support import store_dump
from tests.support.client import Resources, from_cat, names, parse, to_cat
from tests.support.pgcluster import create_database, drop_database

# pytest-grpc serves with one worker thread unless this is raised (DESIGN 2.4).
grpc_max_workers = 8

# Wire error codes (connect.group.v1.ErrorCode).
NONE = common_pb2.NONE
UNKNOWN_MEMBER_ID = common_pb2.UNKNOWN_MEMBER_ID
INVALID_REQUEST = common_pb2.INVALID_REQUEST
GROUP_ID_NOT_FOUND = common_pb2.GROUP_ID_NOT_FOUND
FENCED_INSTANCE_ID = common_pb2.FENCED_INSTANCE_ID
FENCED_MEMBER_EPOCH = common_pb2.FENCED_MEMBER_EPOCH
UNRELEASED_INSTANCE_ID = common_pb2.UNRELEASED_INSTANCE_ID
UNSUPPORTED_ASSIGNOR = common_pb2.UNSUPPORTED_ASSIGNOR
COMPUTE_ASSIGNMENT = common_pb2.COMPUTE_ASSIGNMENT
INVALID_ASSIGNMENT = common_pb2.INVALID_ASSIGNMENT

# Long enough that no session, revocation, assignor or hold timer fires while the module runs.
SESSION_MS = 600_000
INTERVAL_MS = 3_000
REBALANCE_MS = 600_000
DEFAULTS = GroupConfigDefaults(
    session_timeout_ms=SESSION_MS,
    heartbeat_interval_ms=INTERVAL_MS,
    rebalance_timeout_ms=REBALANCE_MS,
    scheduled_rebalance_max_delay_ms=600_000,
    assignment_error_backoff_ms=100,
    assignment_interval_ms=0,  # a computation at every epoch bump (DESIGN 3.21)
)

IC = common_pb2.Assignor(
    name="incremental_cooperative", minimum_version=1, maximum_version=2, version=2
)
EAGER = common_pb2.Assignor(name="eager", minimum_version=0, maximum_version=0, version=0)
LONG = "x" * 250
EMPTY: Resources = (frozenset(), frozenset())


# --- pytest-grpc fixtures (real-server mode) ------------------------------------------------------


@pytest.fixture(scope="module")
def grpc_addr() -> str:
    """pytest-grpc's own fixture binds 'localhost' and leaves its probe socket open."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def module_database_url(postgres_admin_url: str) -> Iterator[str]:
    name = f"t_errors_{uuid.uuid4().hex}"
    url = create_database(postgres_admin_url, name)
    try:
        yield url
    finally:
        drop_database(postgres_admin_url, name)


@pytest.fixture(scope="module")
def grpc_servicer(module_database_url: str, grpc_addr: str) -> Iterator[CoordinatorServicer]:
    store = SqlStore(
        module_database_url,
        owner_id=f"errors-{uuid.uuid4().hex[:8]}",
        advertised_address=grpc_addr,
        lease_ms=30_000,
    )
    store.migrate()
    manager = GroupManager(store, DEFAULTS)
    manager.start()
    try:
        yield CoordinatorServicer(manager)
    finally:
        manager.stop()
        store.close()


@pytest.fixture(scope="module")
def grpc_add_to_server(grpc_servicer: CoordinatorServicer, _grpc_server: Any) -> Any:
    """The coordinator service is added by pytest-grpc's `grpc_server` through the function
    returned here; the admin service, over the same GroupManager (one lease owner for every
    group), is added to the same not-yet-started server now."""
    admin_pb2_grpc.add_ConnectGroupAdminServicer_to_server(
        AdminServicer(grpc_servicer.manager), _grpc_server
    )
    return coordinator_pb2_grpc.add_ConnectGroupCoordinatorServicer_to_server


@pytest.fixture(scope="module")
def grpc_stub_cls() -> Any:
    return coordinator_pb2_grpc.ConnectGroupCoordinatorStub


@pytest.fixture(scope="module")
def admin_stub(grpc_channel: Any) -> Any:
    return admin_pb2_grpc.ConnectGroupAdminStub(grpc_channel)


@dataclass
class Api:
    coordinator: Any
    admin: Any
    store: SqlStore


@pytest.fixture
def api(grpc_stub: Any, admin_stub: Any, grpc_servicer: CoordinatorServicer) -> Api:
    return Api(grpc_stub, admin_stub, grpc_servicer.manager.store)


@pytest.fixture
def gid() -> str:
    """A group id of this test's own: the module shares one database."""
    return f"g-{uuid.uuid4().hex[:16]}"


# --- helpers --------------------------------------------------------------------------------------


Dump = dict[str, list[dict[str, Any]]]


def dump_diff(before: Dump, after: Dump) -> str:
    lines = []
    for table in sorted(set(before) | set(after)):
        old, new = before.get(table, []), after.get(table, [])
        for row in old:
            if row not in new:
                lines.append(f"  {table} - {row}")
        for row in new:
            if row not in old:
                lines.append(f"  {table} + {row}")
    return "\n".join(lines)


def assert_same_dump(before: Dump, after: Dump) -> None:
    assert after == before, "the database changed:\n" + dump_diff(before, after)


def view(api: Api, group_id: str) -> Any:
    """The group as DescribeGroups shows it (the coordinator's in-memory state), minus the clock."""
    resp = api.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=[group_id]), timeout=10
    )
    group = resp.groups[0]
    group.ClearField("coordinator_time_ms")
    return group


def rejected(api: Api, group_id: str, call: Callable[[], Any], code: int, *rule: str) -> Any:
    """Run a call that must fail with `code`, a message containing every `rule` fragment, and
    no change at all: database (events included) and in-memory group identical."""
    seen = view(api, group_id) if 0 < len(group_id) <= 249 else None
    before = store_dump.dump(api.store)
    resp = call()
    after = store_dump.dump(api.store)
    assert resp.error_code == code, f"expected {common_pb2.ErrorCode.Name(code)}, got:\n{resp}"
    for fragment in rule:
        assert fragment in resp.error_message, (fragment, resp.error_message)
    assert_same_dump(before, after)
    if seen is not None:
        assert view(api, group_id) == seen
    return resp


class Worker:
    """A scripted worker sending exactly the requests a test asks for."""

    def __init__(
        self,
        api: Api,
        group_id: str,
        member_id: str,
        *,
        instance_id: str | None = None,
        assignors: tuple[Any, ...] = (IC,),
        url: str | None = None,
    ) -> None:
        self.api = api
        self.group_id = group_id
        self.member_id = member_id
        self.instance_id = instance_id
        self.assignors = assignors
        self.url = url
        self.epoch = 0
        self.owned: Resources = EMPTY

    # requests

    def request(self, epoch: int | None = None, *, owned: bool = True) -> Any:
        """A light heartbeat: ids, epoch and (by default) the owned list."""
        req = coordinator_pb2.ConnectGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=self.epoch if epoch is None else epoch,
        )
        if owned:
            req.connectors_and_tasks.CopyFrom(to_cat(self.owned))
        return req

    def full_request(self, epoch: int | None = None) -> Any:
        """Every top-level field set (what a join, or a retry after an error, sends)."""
        req = self.request(epoch)
        req.rebalance_timeout_ms = REBALANCE_MS
        req.client_assignors.SetInParent()
        req.client_assignors.assignors.extend(self.assignors)
        if self.instance_id is not None:
            req.instance_id = self.instance_id
        if self.url is not None:
            req.url = self.url
        return req

    def join_request(self) -> Any:
        req = self.full_request(0)
        req.connectors_and_tasks.CopyFrom(to_cat(EMPTY))
        return req

    # calls

    def send(self, req: Any) -> Any:
        resp = self.api.coordinator.ConnectGroupHeartbeat(req, timeout=10)
        if resp.error_code in (NONE, COMPUTE_ASSIGNMENT):
            self.epoch = resp.member_epoch
            if resp.HasField("assignment"):
                self.owned = from_cat(resp.assignment.connectors_and_tasks)
        return resp

    def join(self) -> Any:
        self.epoch, self.owned = 0, EMPTY
        resp = self.send(self.join_request())
        assert resp.error_code in (NONE, COMPUTE_ASSIGNMENT), resp
        return resp

    def static_leave(self) -> Any:
        assert self.instance_id is not None
        req = self.request(-2, owned=False)
        req.instance_id = self.instance_id
        resp = self.send(req)
        assert (resp.error_code, resp.member_epoch) == (NONE, -2), resp
        return resp

    def heartbeat(self) -> Any:
        resp = self.send(self.request())
        assert resp.error_code in (NONE, COMPUTE_ASSIGNMENT), resp
        return resp

    def prepare(self, epoch: int | None = None, member_id: str | None = None) -> Any:
        return self.api.coordinator.ConnectGroupPrepareAssignment(
            coordinator_pb2.ConnectGroupPrepareAssignmentRequest(
                group_id=self.group_id,
                member_id=self.member_id if member_id is None else member_id,
                member_epoch=self.epoch if epoch is None else epoch,
            ),
            timeout=10,
        )

    def install_request(
        self,
        group_epoch: int,
        targets: list[tuple[str, Resources]] | dict[str, Resources],
        *,
        delay_ms: int = 0,
        error: int = 0,
    ) -> Any:
        req = coordinator_pb2.ConnectGroupInstallAssignmentRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=self.epoch,
            group_epoch=group_epoch,
            scheduled_rebalance_delay_ms=delay_ms,
            error=error,
        )
        items = list(targets.items()) if isinstance(targets, dict) else targets
        for member_id, resources in items:
            req.members.add(member_id=member_id, connectors_and_tasks=to_cat(resources))
        return req

    def install_raw(self, req: Any) -> Any:
        return self.api.coordinator.ConnectGroupInstallAssignment(req, timeout=10)

    def install(self, group_epoch: int, targets: dict[str, Resources], **kw: Any) -> Any:
        return self.install_raw(self.install_request(group_epoch, targets, **kw))


def put_connector(api: Api, group_id: str, name: str, tasks: int) -> None:
    resp = api.admin.PutConnector(
        admin_pb2.PutConnectorRequest(group_id=group_id, connector=name, task_count=tasks),
        timeout=10,
    )
    assert resp.error_code == NONE, resp


def describe(api: Api, group_id: str) -> Any:
    return view(api, group_id)


W1_TARGET = parse("A", "A-0", "A-1")
W2_TARGET = parse("B", "B-0")
EVERYTHING = parse("A", "A-0", "A-1", "B", "B-0")


def two_members(api: Api, group_id: str, **w1_kw: Any) -> tuple[Worker, Worker]:
    """Catalogue A (2 tasks) and B (1 task); W1 (the assignor member) and W2 joined, no target
    installed yet, W1 told to compute."""
    put_connector(api, group_id, "A", 2)
    put_connector(api, group_id, "B", 1)
    w1 = Worker(api, group_id, "W1", **w1_kw)
    w2 = Worker(api, group_id, "W2")
    assert w1.join().error_code == COMPUTE_ASSIGNMENT
    assert w2.join().error_code == NONE
    assert w1.heartbeat().error_code == COMPUTE_ASSIGNMENT
    assert describe(api, group_id).assignor_member_id == "W1"
    return w1, w2


def prepared(api: Api, group_id: str) -> tuple[Worker, Worker, int]:
    """`two_members`, and W1 has prepared: returns the group epoch the Prepare returned."""
    w1, w2 = two_members(api, group_id)
    resp = w1.prepare()
    assert resp.error_code == NONE, resp
    assert sorted(m.member_id for m in resp.members) == ["W1", "W2"]
    return w1, w2, int(resp.group_epoch)


def stable(api: Api, group_id: str, **w1_kw: Any) -> tuple[Worker, Worker]:
    """W1 runs A, A-0, A-1 and W2 runs B, B-0, both at the target epoch; the group is STABLE."""
    w1, w2 = two_members(api, group_id, **w1_kw)
    epoch = w1.prepare().group_epoch
    assert w1.install(epoch, {"W1": W1_TARGET, "W2": W2_TARGET}).error_code == NONE
    for _ in range(3):
        w1.heartbeat()
        w2.heartbeat()
    group = describe(api, group_id)
    assert group.state == "STABLE", group
    assert (w1.epoch, w2.epoch) == (epoch, epoch)
    assert (names(w1.owned), names(w2.owned)) == (names(W1_TARGET), names(W2_TARGET))
    return w1, w2


def one_member(api: Api, group_id: str, **kw: Any) -> Worker:
    w1 = Worker(api, group_id, "W1", **kw)
    w1.join()
    return w1


# --- ConnectGroupHeartbeat: request validation (INVALID_REQUEST) ---------------------------------

Mutation = Callable[[Any, int], None]


def _assignors(*assignors: Any) -> Mutation:
    def mutate(req: Any, _epoch: int) -> None:
        del req.client_assignors.assignors[:]
        req.client_assignors.assignors.extend(assignors)

    return mutate


def _as_w1(epoch: int | None = None, **fields: Any) -> Mutation:
    """Turn the base join into a heartbeat of the existing member W1 (at `epoch`, default its
    current one) with `fields` set."""

    def mutate(req: Any, w1_epoch: int) -> None:
        req.member_id = "W1"
        req.member_epoch = w1_epoch if epoch is None else epoch
        for name, value in fields.items():
            if value is None:
                req.ClearField(name)
            else:
                setattr(req, name, value)

    return mutate


def _set(**fields: Any) -> Mutation:
    def mutate(req: Any, _epoch: int) -> None:
        for name, value in fields.items():
            if value is None:
                req.ClearField(name)
            else:
                setattr(req, name, value)

    return mutate


def _owned(connectors: list[str], tasks: list[tuple[str, int]]) -> Mutation:
    def mutate(req: Any, _epoch: int) -> None:
        req.connectors_and_tasks.CopyFrom(
            common_pb2.ConnectorsAndTasks(
                connectors=connectors,
                tasks=[common_pb2.ConnectorTaskId(connector=c, task=t) for c, t in tasks],
            )
        )

    return mutate


def _both(first: Mutation, second: Mutation) -> Mutation:
    def mutate(req: Any, epoch: int) -> None:
        first(req, epoch)
        second(req, epoch)

    return mutate


def _assignor(name: str = "incremental_cooperative", lo: int = 1, hi: int = 2, **kw: Any) -> Any:
    return common_pb2.Assignor(
        name=name, minimum_version=lo, maximum_version=hi, version=kw.pop("version", hi), **kw
    )


HEARTBEAT_RULES: list[tuple[str, Mutation, str]] = [
    ("empty-group-id", _set(group_id=""), "GroupId must be non-empty"),
    ("long-group-id", _set(group_id=LONG), "GroupId must be at most 249 characters"),
    ("empty-member-id", _set(member_id=""), "MemberId must be non-empty"),
    ("long-member-id", _set(member_id=LONG), "MemberId must be at most 249 characters"),
    ("member-epoch-below-minus-2", _as_w1(epoch=-3), "MemberEpoch must be >= -2"),
    ("empty-instance-id", _set(instance_id=""), "InstanceId, if provided, must be non-empty"),
    (
        "join-without-rebalance-timeout",
        _set(rebalance_timeout_ms=None),
        "RebalanceTimeoutMs must be larger than zero in the first heartbeat request",
    ),
    (
        "join-with-zero-rebalance-timeout",
        _set(rebalance_timeout_ms=0),
        "RebalanceTimeoutMs must be larger than zero in the first heartbeat request",
    ),
    (
        "join-with-unchanged-rebalance-timeout",
        _set(rebalance_timeout_ms=-1),
        "RebalanceTimeoutMs must be larger than zero in the first heartbeat request",
    ),
    (
        "rejoin-without-rebalance-timeout",
        _as_w1(epoch=0, rebalance_timeout_ms=None),
        "RebalanceTimeoutMs must be larger than zero in the first heartbeat request",
    ),
    (
        "heartbeat-with-zero-rebalance-timeout",
        _as_w1(rebalance_timeout_ms=0),
        "RebalanceTimeoutMs must be larger than zero, or -1 for unchanged",
    ),
    (
        "heartbeat-with-negative-rebalance-timeout",
        _as_w1(rebalance_timeout_ms=-5),
        "RebalanceTimeoutMs must be larger than zero, or -1 for unchanged",
    ),
    (
        "static-leave-without-instance-id",
        _as_w1(epoch=-2, instance_id=None),
        "MemberEpoch -2 (static leave) is accepted only with an InstanceId",
    ),
    (
        "server-and-client-assignors",
        _set(server_assignor="uniform"),
        "ServerAssignor and ClientAssignors cannot be used together",
    ),
    ("empty-assignor-name", _assignors(_assignor(name="")), "Assignor.Name must be non-empty"),
    (
        "minimum-version-below-minus-1",
        _assignors(_assignor(lo=-2, hi=2)),
        "Assignor.MinimumVersion must be >= -1",
    ),
    (
        "maximum-version-negative",
        _assignors(_assignor(lo=-1, hi=-1)),
        "Assignor.MaximumVersion must be >= 0 and >= Assignor.MinimumVersion",
    ),
    (
        "maximum-version-below-minimum",
        _assignors(_assignor(lo=3, hi=2, version=2)),
        "Assignor.MaximumVersion must be >= 0 and >= Assignor.MinimumVersion",
    ),
    (
        "version-below-minimum",
        _assignors(_assignor(lo=1, hi=2, version=0)),
        "Assignor.Version must be >= Assignor.MinimumVersion and <= Assignor.MaximumVersion",
    ),
    (
        "version-above-maximum",
        _assignors(_assignor(lo=1, hi=2, version=3)),
        "Assignor.Version must be >= Assignor.MinimumVersion and <= Assignor.MaximumVersion",
    ),
    (
        "reason-outside-int8",
        _assignors(_assignor(reason=200)),
        "Assignor.Reason must fit an int8 and be >= 0",
    ),
    (
        "duplicate-assignor-names",
        _assignors(IC, EAGER, _assignor(lo=1, hi=1, version=1)),
        "Assignor names must be unique in ClientAssignors",
    ),
    (
        "owned-negative-task-id",
        _owned([], [("A", -1)]),
        "ConnectorsAndTasks: task ids must be >= 0",
    ),
    (
        "owned-empty-connector-name",
        _owned([""], []),
        "ConnectorsAndTasks: connector names must be non-empty",
    ),
    (
        "owned-task-of-empty-connector",
        _owned([], [("", 0)]),
        "ConnectorsAndTasks: a task's connector must be non-empty",
    ),
    (
        "owned-negative-task-id-on-heartbeat",
        _both(_as_w1(), _owned(["A"], [("A", 0), ("A", -7)])),
        "ConnectorsAndTasks: task ids must be >= 0",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "rule"),
    [pytest.param(m, r, id=i) for i, m, r in HEARTBEAT_RULES],
)
def test_heartbeat_invalid_request(api: Api, gid: str, mutate: Mutation, rule: str) -> None:
    """The base request, a valid join of W2 into a group where W1 is a member, would change the
    group; with one rule broken it is INVALID_REQUEST naming that rule, and nothing changes."""
    w1 = one_member(api, gid)
    req = Worker(api, gid, "W2").join_request()
    mutate(req, w1.epoch)
    resp = rejected(
        api,
        gid,
        lambda: api.coordinator.ConnectGroupHeartbeat(req, timeout=10),
        INVALID_REQUEST,
        rule,
    )
    assert not resp.HasField("assignment")


def test_heartbeat_base_request_of_the_rule_tests_is_valid(api: Api, gid: str) -> None:
    """Control for test_heartbeat_invalid_request: unmutated, its base request joins W2."""
    one_member(api, gid)
    w2 = Worker(api, gid, "W2")
    before = store_dump.dump(api.store)
    resp = w2.send(w2.join_request())
    assert resp.error_code == NONE, resp
    assert store_dump.dump(api.store) != before
    assert sorted(m.member_id for m in describe(api, gid).members) == ["W1", "W2"]


# --- ConnectGroupHeartbeat: UNKNOWN_MEMBER_ID ----------------------------------------------------


def test_heartbeat_unknown_member(api: Api, gid: str) -> None:
    one_member(api, gid)
    ghost = Worker(api, gid, "ghost")
    rejected(
        api,
        gid,
        lambda: ghost.send(ghost.full_request(3)),
        UNKNOWN_MEMBER_ID,
        "member 'ghost' is not in group",
        "rejoin with epoch 0",
    )


def test_heartbeat_epoch_above_zero_for_a_group_that_does_not_exist(api: Api, gid: str) -> None:
    """DESIGN 3.12: UNKNOWN_MEMBER_ID (the worker rejoins), and the group is not created."""
    w = Worker(api, gid, "W1")
    rejected(
        api,
        gid,
        lambda: w.send(w.full_request(5)),
        UNKNOWN_MEMBER_ID,
        f"group {gid!r} does not exist",
        "rejoin with epoch 0",
    )
    assert describe(api, gid).error_code == GROUP_ID_NOT_FOUND


def test_heartbeat_leave_of_an_unknown_member(api: Api, gid: str) -> None:
    one_member(api, gid)
    ghost = Worker(api, gid, "ghost")
    rejected(
        api,
        gid,
        lambda: ghost.send(ghost.request(-1, owned=False)),
        UNKNOWN_MEMBER_ID,
        "member 'ghost' is not in group",
    )


def test_heartbeat_of_a_static_member_that_left(api: Api, gid: str) -> None:
    """A static member that left with -2 is held, not live: a heartbeat at an epoch > 0 is
    UNKNOWN_MEMBER_ID (rejoin at 0 to take the assignment back)."""
    w1 = one_member(api, gid, instance_id="i-1")
    epoch = w1.epoch
    w1.static_leave()
    rejected(
        api,
        gid,
        lambda: w1.send(w1.request(epoch)),
        UNKNOWN_MEMBER_ID,
        "member 'W1' left the group",
    )


# --- ConnectGroupHeartbeat: FENCED_MEMBER_EPOCH (removes the member) -----------------------------


def from_json(data: dict[str, Any]) -> Resources:
    return (
        frozenset(data["connectors"]),
        frozenset((t["connector"], t["task"]) for t in data["tasks"]),
    )


def _rows(dump: Dump, table: str, group_id: str) -> list[dict[str, Any]]:
    return [r for r in dump[table] if r["group_id"] == group_id]


def assert_fenced_change(
    before: Dump, after: Dump, group_id: str, member_id: str, holds: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Exactly the documented change of a fence: the member row is gone, the group epoch is
    bumped (and `holds` recorded, DESIGN 3.13), MEMBER_FENCED and GROUP_EPOCH_BUMPED appended;
    nothing else. Returns the two new events."""
    for table in before:
        if table not in ("groups", "members", "events"):
            assert after[table] == before[table], f"{table} changed:\n" + dump_diff(before, after)
    expected_members = [
        r
        for r in before["members"]
        if not (r["group_id"] == group_id and r["member_id"] == member_id)
    ]
    assert len(expected_members) == len(before["members"]) - 1
    assert after["members"] == expected_members
    (old_group,) = _rows(before, "groups", group_id)
    expected_group = {**old_group, "group_epoch": old_group["group_epoch"] + 1, "holds": holds}
    assert after["groups"] == [
        expected_group if r["group_id"] == group_id else r for r in before["groups"]
    ]
    n = len(before["events"])
    assert after["events"][:n] == before["events"]
    new = after["events"][n:]
    assert [(e["event_type"], e["group_id"], e["member_id"]) for e in new] == [
        ("MEMBER_FENCED", group_id, member_id),
        ("GROUP_EPOCH_BUMPED", group_id, member_id),
    ]
    assert new[1]["group_epoch"] == old_group["group_epoch"] + 1
    assert new[1]["payload"]["reason"] == "member fenced"
    return new


def test_heartbeat_fenced_member_epoch_removes_the_member(api: Api, gid: str) -> None:
    _w1, w2 = two_members(api, gid)
    member_epoch = w2.epoch
    wrong = member_epoch + 7
    before = store_dump.dump(api.store)
    resp = w2.send(w2.request(wrong))
    after = store_dump.dump(api.store)
    assert resp.error_code == FENCED_MEMBER_EPOCH, resp
    assert f"member epoch {wrong} does not match the coordinator's {member_epoch}" in (
        resp.error_message
    )
    assert "rejoin with epoch 0" in resp.error_message
    assert not resp.HasField("assignment")
    events = assert_fenced_change(before, after, gid, "W2", holds=[])
    assert events[0]["payload"]["request_epoch"] == wrong
    assert events[0]["payload"]["member_epoch"] == member_epoch
    assert [m.member_id for m in describe(api, gid).members] == ["W1"]
    # Removed: its old epoch is now unknown, it must rejoin at 0.
    assert w2.send(w2.request(member_epoch)).error_code == UNKNOWN_MEMBER_ID


def test_heartbeat_lost_response_retry_without_owned_list_is_fenced(api: Api, gid: str) -> None:
    """DESIGN 3.12: a retry with the previous epoch is accepted only with an owned list; without
    it, FENCED_MEMBER_EPOCH: the member is removed and what it ran is held for a session timeout
    (DESIGN 3.13), nothing else changes."""
    _w1, w2 = stable(api, gid)
    (row,) = [
        r for r in _rows(store_dump.dump(api.store), "members", gid) if r["member_id"] == "W2"
    ]
    previous = row["previous_epoch"]
    assert 0 < previous < w2.epoch
    before = store_dump.dump(api.store)
    resp = w2.send(w2.request(previous, owned=False))
    after = store_dump.dump(api.store)
    assert resp.error_code == FENCED_MEMBER_EPOCH, resp
    assert f"member epoch {previous} does not match the coordinator's {w2.epoch}" in (
        resp.error_message
    )
    (group_after,) = _rows(after, "groups", gid)
    (hold,) = group_after["holds"]
    assert hold["member_id"] == "W2"
    assert names(from_json(hold["resources"])) == names(W2_TARGET)
    events = assert_fenced_change(before, after, gid, "W2", holds=[hold])
    assert hold["until_ms"] == events[0]["payload"]["held_until_ms"]
    assert hold["until_ms"] == events[0]["at_ms"] + SESSION_MS


# --- ConnectGroupHeartbeat: UNSUPPORTED_ASSIGNOR -------------------------------------------------


def test_heartbeat_server_assignor_is_unsupported(api: Api, gid: str) -> None:
    """DESIGN 2.1: the coordinator offers no server-side assignor; the group is not created."""
    w = Worker(api, gid, "W1")
    req = w.join_request()
    req.ClearField("client_assignors")
    req.server_assignor = "uniform"
    rejected(
        api,
        gid,
        lambda: w.send(req),
        UNSUPPORTED_ASSIGNOR,
        "server-side assignor 'uniform' is not supported",
    )
    assert describe(api, gid).error_code == GROUP_ID_NOT_FOUND


def test_heartbeat_server_assignor_named_by_an_existing_member(api: Api, gid: str) -> None:
    w1 = one_member(api, gid)
    req = w1.request()
    req.server_assignor = "uniform"
    rejected(api, gid, lambda: w1.send(req), UNSUPPORTED_ASSIGNOR, "server-side assignor 'uniform'")


def test_heartbeat_joiner_with_no_assignor_in_common(api: Api, gid: str) -> None:
    one_member(api, gid)  # incremental_cooperative only
    w2 = Worker(api, gid, "W2", assignors=(EAGER,))
    rejected(
        api,
        gid,
        lambda: w2.send(w2.join_request()),
        UNSUPPORTED_ASSIGNOR,
        "member 'W2' cannot join group",
        "no client assignor is supported by every member",
    )


def test_heartbeat_joiner_with_overlapping_versions_in_no_common_range(api: Api, gid: str) -> None:
    one_member(api, gid, assignors=(_assignor(lo=1, hi=1, version=1),))
    w2 = Worker(api, gid, "W2", assignors=(_assignor(lo=2, hi=2),))
    rejected(
        api,
        gid,
        lambda: w2.send(w2.join_request()),
        UNSUPPORTED_ASSIGNOR,
        "member 'W2' cannot join group",
        "overlapping versions",
    )


def test_heartbeat_joiner_whose_version_range_no_member_covers(api: Api, gid: str) -> None:
    """DESIGN 3.4: W1 [1-2] and W2 [2-3] overlap, but neither range covers the other's."""
    one_member(api, gid, assignors=(_assignor(lo=1, hi=2),))
    w2 = Worker(api, gid, "W2", assignors=(_assignor(lo=2, hi=3),))
    rejected(
        api,
        gid,
        lambda: w2.send(w2.join_request()),
        UNSUPPORTED_ASSIGNOR,
        "member 'W2' cannot join group",
        "no member's version range of assignor 'incremental_cooperative' covers every other",
    )


def test_heartbeat_first_joiner_without_client_assignors(api: Api, gid: str) -> None:
    """A join that advertises no client assignor (and no server one) cannot form a group."""
    w = Worker(api, gid, "W1", assignors=())
    rejected(
        api,
        gid,
        lambda: w.send(w.join_request()),
        UNSUPPORTED_ASSIGNOR,
        "member 'W1' cannot join group",
    )
    assert describe(api, gid).error_code == GROUP_ID_NOT_FOUND


def test_heartbeat_member_changing_to_assignors_the_group_cannot_share(api: Api, gid: str) -> None:
    """An existing member's assignor update is checked like a join, and refused whole."""
    w1, _w2 = stable(api, gid)
    req = w1.request()
    req.client_assignors.assignors.extend([EAGER])
    rejected(
        api,
        gid,
        lambda: w1.send(req),
        UNSUPPORTED_ASSIGNOR,
        "member 'W1' cannot join group",
        "no client assignor is supported by every member",
    )


# --- ConnectGroupHeartbeat: static membership ----------------------------------------------------


def test_heartbeat_unreleased_instance_id(api: Api, gid: str) -> None:
    """DESIGN 3.14: a second live member claiming a held instance id."""
    one_member(api, gid, instance_id="i-1")
    w2 = Worker(api, gid, "W2", instance_id="i-1")
    rejected(
        api,
        gid,
        lambda: w2.send(w2.join_request()),
        UNRELEASED_INSTANCE_ID,
        "instance id 'i-1' is still held by live member 'W1'",
    )


def test_heartbeat_fenced_instance_id_of_another_member(api: Api, gid: str) -> None:
    """DESIGN 3.14: a heartbeat whose instance id belongs to another member id."""
    w1 = one_member(api, gid, instance_id="i-1")
    w2 = Worker(api, gid, "W2", instance_id="i-1")
    rejected(
        api,
        gid,
        lambda: w2.send(w2.full_request(w1.epoch)),
        FENCED_INSTANCE_ID,
        "instance id 'i-1' belongs to member 'W1'",
    )


def test_heartbeat_fenced_instance_id_changed_by_its_member(api: Api, gid: str) -> None:
    w1 = one_member(api, gid, instance_id="i-1")
    req = w1.request()
    req.instance_id = "i-2"
    rejected(
        api,
        gid,
        lambda: w1.send(req),
        FENCED_INSTANCE_ID,
        "member 'W1' is registered with instance id 'i-1', not 'i-2'",
    )


def test_heartbeat_fenced_instance_id_taken_over_by_an_existing_member(api: Api, gid: str) -> None:
    """W1 left statically (held); W2, already a member under another identity, cannot take
    W1's instance id over by rejoining."""
    w1 = one_member(api, gid, instance_id="i-1")
    w2 = Worker(api, gid, "W2", instance_id="i-2")
    w2.join()
    w1.static_leave()
    w2.instance_id = "i-1"
    rejected(
        api,
        gid,
        lambda: w2.send(w2.join_request()),
        FENCED_INSTANCE_ID,
        "member 'W2' is already in the group and cannot take over instance id 'i-1'",
    )


# --- ConnectGroupHeartbeat: COMPUTE_ASSIGNMENT is a signal, not a failure ------------------------


def test_compute_assignment_on_join_with_a_valid_response(api: Api, gid: str) -> None:
    put_connector(api, gid, "A", 1)
    w1 = Worker(api, gid, "W1")
    resp = w1.send(w1.join_request())
    group = describe(api, gid)
    assert resp.error_code == COMPUTE_ASSIGNMENT, resp
    assert "ConnectGroupPrepareAssignment" in resp.error_message
    assert f"group epoch {group.group_epoch}" in resp.error_message
    assert resp.member_epoch == group.assignment_epoch > 0
    assert (resp.heartbeat_interval_ms, resp.session_timeout_ms) == (INTERVAL_MS, SESSION_MS)
    assert resp.HasField("assignment"), "a join is always answered with its assignment"
    assert names(from_cat(resp.assignment.connectors_and_tasks)) == []
    # Repeated while the group epoch is ahead (a lost response must not stall the group), and
    # asking again writes nothing.
    before = store_dump.dump(api.store)
    again = w1.send(w1.request())
    assert again.error_code == COMPUTE_ASSIGNMENT, again
    assert again.member_epoch == resp.member_epoch
    assert (again.heartbeat_interval_ms, again.session_timeout_ms) == (INTERVAL_MS, SESSION_MS)
    assert_same_dump(before, store_dump.dump(api.store))
    assert w1.prepare().group_epoch == group.group_epoch


def test_compute_assignment_with_a_new_assignment_in_the_same_response(api: Api, gid: str) -> None:
    """The assignor member is moved to the installed target and asked to compute the next one
    in one response: epoch and assignment are valid and must be applied."""
    put_connector(api, gid, "A", 1)
    w1 = Worker(api, gid, "W1")
    w1.join()
    target = parse("A", "A-0")
    assert w1.install(w1.prepare().group_epoch, {"W1": target}).error_code == NONE
    installed = describe(api, gid).assignment_epoch
    put_connector(api, gid, "B", 1)  # the catalogue changes: the group epoch moves on
    assert describe(api, gid).group_epoch > installed
    resp = w1.send(w1.request())
    assert resp.error_code == COMPUTE_ASSIGNMENT, resp
    assert resp.member_epoch == installed
    assert (resp.heartbeat_interval_ms, resp.session_timeout_ms) == (INTERVAL_MS, SESSION_MS)
    assert names(from_cat(resp.assignment.connectors_and_tasks)) == names(target)
    (member,) = describe(api, gid).members
    assert (member.member_epoch, member.state) == (installed, "STABLE")


# --- ConnectGroupHeartbeat: identical full heartbeats ---------------------------------------------


def test_identical_full_heartbeat_twice_same_answer_writes_nothing(api: Api, gid: str) -> None:
    """DESIGN 3.11. The first full heartbeat changes the url (stored, no epoch bump, DESIGN 3.3);
    the byte-for-byte identical second one answers the same and writes nothing."""
    w1, _w2 = stable(api, gid)
    w1.url = "http://w1.example:8083"
    req = w1.full_request()
    epoch_before = describe(api, gid).group_epoch
    first = w1.send(req)
    after_first = store_dump.dump(api.store)
    second = w1.send(req)
    assert_same_dump(after_first, store_dump.dump(api.store))
    assert first.error_code == NONE, first
    assert second == first
    group = describe(api, gid)
    assert group.group_epoch == epoch_before
    assert [m.url for m in group.members if m.member_id == "W1"] == [w1.url]


def test_identical_join_twice_same_answer_writes_nothing(api: Api, gid: str) -> None:
    """DESIGN 3.2/3.11: the same epoch-0 join sent twice (its answer was lost) is accepted as
    that member, answered the same, and writes nothing the second time."""
    stable(api, gid)
    w3 = Worker(api, gid, "W3")
    req = w3.join_request()
    first = w3.send(req)
    after_first = store_dump.dump(api.store)
    second = w3.send(req)
    assert_same_dump(after_first, store_dump.dump(api.store))
    assert first.error_code == NONE, first
    assert second == first


# --- ConnectGroupPrepareAssignment ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        pytest.param("group_id", "", "GroupId must be non-empty", id="empty-group-id"),
        pytest.param(
            "group_id", LONG, "GroupId must be at most 249 characters", id="long-group-id"
        ),
        pytest.param("member_id", "", "MemberId must be non-empty", id="empty-member-id"),
        pytest.param("member_epoch", -1, "MemberEpoch must be >= 0", id="negative-epoch"),
    ],
)
def test_prepare_invalid_request(api: Api, gid: str, field: str, value: Any, rule: str) -> None:
    w1, _w2 = two_members(api, gid)
    req = coordinator_pb2.ConnectGroupPrepareAssignmentRequest(
        group_id=gid, member_id="W1", member_epoch=w1.epoch
    )
    setattr(req, field, value)
    rejected(
        api,
        gid,
        lambda: api.coordinator.ConnectGroupPrepareAssignment(req, timeout=10),
        INVALID_REQUEST,
        rule,
    )


def test_prepare_group_id_not_found(api: Api, gid: str) -> None:
    w = Worker(api, gid, "W1")
    rejected(api, gid, lambda: w.prepare(epoch=1), GROUP_ID_NOT_FOUND, f"group {gid!r} does not")


def test_prepare_unknown_member(api: Api, gid: str) -> None:
    w1, _w2 = two_members(api, gid)
    rejected(
        api,
        gid,
        lambda: w1.prepare(member_id="ghost"),
        UNKNOWN_MEMBER_ID,
        f"member 'ghost' is not in group {gid!r}",
    )


def test_prepare_by_a_member_that_is_not_the_assignor_member(api: Api, gid: str) -> None:
    _w1, w2 = two_members(api, gid)
    rejected(
        api,
        gid,
        w2.prepare,
        UNKNOWN_MEMBER_ID,
        "member 'W2' is not the group's assignor member (W1 is)",
    )


def test_prepare_fenced_member_epoch_does_not_remove_the_member(api: Api, gid: str) -> None:
    w1, _w2 = two_members(api, gid)
    rejected(
        api,
        gid,
        lambda: w1.prepare(epoch=w1.epoch + 3),
        FENCED_MEMBER_EPOCH,
        f"member epoch {w1.epoch + 3} does not match the coordinator's {w1.epoch}",
    )
    assert sorted(m.member_id for m in describe(api, gid).members) == ["W1", "W2"]
    assert w1.prepare().error_code == NONE


# --- ConnectGroupInstallAssignment: INVALID_REQUEST ---------------------------------------------

InstallMutation = Callable[[Any], None]


def _install_set(**fields: Any) -> InstallMutation:
    def mutate(req: Any) -> None:
        for name, value in fields.items():
            setattr(req, name, value)

    return mutate


def _install_add(member_id: str, resources: Resources) -> InstallMutation:
    def mutate(req: Any) -> None:
        req.members.add(member_id=member_id, connectors_and_tasks=to_cat(resources))

    return mutate


def _install_task(member_id: str, connector: str, task: int) -> InstallMutation:
    def mutate(req: Any) -> None:
        (m,) = [m for m in req.members if m.member_id == member_id]
        m.connectors_and_tasks.tasks.add(connector=connector, task=task)

    return mutate


INSTALL_RULES: list[tuple[str, InstallMutation, str]] = [
    ("empty-group-id", _install_set(group_id=""), "GroupId must be non-empty"),
    ("long-group-id", _install_set(group_id=LONG), "GroupId must be at most 249 characters"),
    ("empty-member-id", _install_set(member_id=""), "MemberId must be non-empty"),
    ("negative-member-epoch", _install_set(member_epoch=-1), "MemberEpoch must be >= 0"),
    ("negative-group-epoch", _install_set(group_epoch=-1), "GroupEpoch must be >= 0"),
    (
        "negative-delay",
        _install_set(scheduled_rebalance_delay_ms=-1),
        "ScheduledRebalanceDelayMs must be >= 0",
    ),
    ("error-outside-int8", _install_set(error=300), "Error must fit an int8"),
    (
        "member-listed-twice",
        _install_add("W2", parse("A")),
        "member W2 is listed twice in Members",
    ),
    ("empty-target-member-id", _install_add("", EMPTY), "Members[].MemberId must be non-empty"),
    (
        "negative-task-id-in-target",
        _install_task("W1", "A", -1),
        "Members[W1].ConnectorsAndTasks: task ids must be >= 0",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "rule"),
    [pytest.param(m, r, id=i) for i, m, r in INSTALL_RULES],
)
def test_install_invalid_request(api: Api, gid: str, mutate: InstallMutation, rule: str) -> None:
    """The base request, W1's valid install of the prepared epoch, would install a target; with
    one rule broken it is INVALID_REQUEST naming that rule, and nothing changes."""
    w1, _w2, epoch = prepared(api, gid)
    req = w1.install_request(epoch, {"W1": W1_TARGET, "W2": W2_TARGET})
    mutate(req)
    rejected(api, gid, lambda: w1.install_raw(req), INVALID_REQUEST, rule)


def test_install_base_request_of_the_rule_tests_is_valid(api: Api, gid: str) -> None:
    """Control for test_install_invalid_request: unmutated, its base request installs."""
    w1, _w2, epoch = prepared(api, gid)
    resp = w1.install_raw(w1.install_request(epoch, {"W1": W1_TARGET, "W2": W2_TARGET}))
    assert resp.error_code == NONE, resp
    assert describe(api, gid).assignment_epoch == epoch


# --- ConnectGroupInstallAssignment: seed checks 1-4 ----------------------------------------------


def test_install_group_id_not_found(api: Api, gid: str) -> None:
    w = Worker(api, gid, "W1")
    w.epoch = 1
    rejected(
        api,
        gid,
        lambda: w.install(2, {"W1": EMPTY}),
        GROUP_ID_NOT_FOUND,
        f"group {gid!r} does not exist",
    )


def test_install_unknown_member(api: Api, gid: str) -> None:
    w1, _w2, epoch = prepared(api, gid)
    req = w1.install_request(epoch, {"W1": W1_TARGET, "W2": W2_TARGET})
    req.member_id = "ghost"
    rejected(
        api,
        gid,
        lambda: w1.install_raw(req),
        UNKNOWN_MEMBER_ID,
        f"member 'ghost' is not in group {gid!r}",
    )


def test_install_by_a_member_that_is_not_the_assignor_member(api: Api, gid: str) -> None:
    _w1, w2, epoch = prepared(api, gid)
    rejected(
        api,
        gid,
        lambda: w2.install(epoch, {"W1": W1_TARGET, "W2": W2_TARGET}),
        UNKNOWN_MEMBER_ID,
        "member 'W2' is not the group's assignor member (W1 is)",
    )


def test_install_fenced_member_epoch_does_not_remove_the_member(api: Api, gid: str) -> None:
    w1, _w2, epoch = prepared(api, gid)
    req = w1.install_request(epoch, {"W1": W1_TARGET, "W2": W2_TARGET})
    req.member_epoch = w1.epoch + 2
    rejected(
        api,
        gid,
        lambda: w1.install_raw(req),
        FENCED_MEMBER_EPOCH,
        f"member epoch {w1.epoch + 2} does not match the coordinator's {w1.epoch}",
    )
    assert sorted(m.member_id for m in describe(api, gid).members) == ["W1", "W2"]


# --- ConnectGroupInstallAssignment: INVALID_ASSIGNMENT (DESIGN 3.6, 3.9) -------------------------


def test_install_member_that_was_never_in_the_group(api: Api, gid: str) -> None:
    w1, _w2, epoch = prepared(api, gid)
    rejected(
        api,
        gid,
        lambda: w1.install(epoch, {"W1": W1_TARGET, "W2": parse("B"), "ghost": parse("B-0")}),
        INVALID_ASSIGNMENT,
        f"member 'ghost' was not in the group at epoch {epoch}",
    )


def test_install_member_that_joined_after_the_prepare(api: Api, gid: str) -> None:
    """Validated against the group the Prepare showed: a member that joined since is not in it
    (it gets nothing from this install, DESIGN 3.9)."""
    w1, _w2, epoch = prepared(api, gid)
    Worker(api, gid, "W3").join()
    assert describe(api, gid).group_epoch == epoch + 1
    rejected(
        api,
        gid,
        lambda: w1.install(epoch, {"W1": W1_TARGET, "W2": parse("B"), "W3": parse("B-0")}),
        INVALID_ASSIGNMENT,
        f"member 'W3' was not in the group at epoch {epoch}",
    )


def test_install_resource_not_in_the_catalogue(api: Api, gid: str) -> None:
    w1, _w2, epoch = prepared(api, gid)
    rejected(
        api,
        gid,
        lambda: w1.install(epoch, {"W1": parse("A", "A-0", "A-1", "A-2"), "W2": W2_TARGET}),
        INVALID_ASSIGNMENT,
        f"[A-2] assigned to 'W1' are not in the catalogue of epoch {epoch}",
    )


def test_install_unknown_connector(api: Api, gid: str) -> None:
    w1, _w2, epoch = prepared(api, gid)
    rejected(
        api,
        gid,
        lambda: w1.install(epoch, {"W1": W1_TARGET, "W2": parse("B", "B-0", "Z")}),
        INVALID_ASSIGNMENT,
        f"[Z] assigned to 'W2' are not in the catalogue of epoch {epoch}",
    )


def test_install_resource_assigned_twice(api: Api, gid: str) -> None:
    w1, _w2, epoch = prepared(api, gid)
    rejected(
        api,
        gid,
        lambda: w1.install(epoch, {"W1": W1_TARGET, "W2": parse("A-1", "B", "B-0")}),
        INVALID_ASSIGNMENT,
        "[A-1] assigned more than once",
    )


def test_install_resource_unassigned_without_delay(api: Api, gid: str) -> None:
    w1, _w2, epoch = prepared(api, gid)
    rejected(
        api,
        gid,
        lambda: w1.install(epoch, {"W1": W1_TARGET, "W2": parse("B")}),
        INVALID_ASSIGNMENT,
        "[B-0] left unassigned without a scheduled rebalance delay",
    )


def test_install_for_an_epoch_older_than_the_last_prepare(api: Api, gid: str) -> None:
    w1, _w2, epoch = prepared(api, gid)
    Worker(api, gid, "W3").join()
    assert w1.heartbeat().error_code == COMPUTE_ASSIGNMENT
    again = w1.prepare()
    assert again.error_code == NONE and again.group_epoch == epoch + 1
    rejected(
        api,
        gid,
        lambda: w1.install(epoch, {"W1": W1_TARGET, "W2": W2_TARGET}),
        INVALID_ASSIGNMENT,
        f"install for group epoch {epoch}, but the last PrepareAssignment returned epoch "
        f"{epoch + 1}",
    )


def test_install_for_an_epoch_that_already_has_a_target(api: Api, gid: str) -> None:
    w1, _w2, epoch = prepared(api, gid)
    assert w1.install(epoch, {"W1": W1_TARGET, "W2": W2_TARGET}).error_code == NONE
    rejected(
        api,
        gid,
        lambda: w1.install(epoch, {"W1": W2_TARGET, "W2": W1_TARGET}),
        INVALID_ASSIGNMENT,
        f"install for group epoch {epoch}, but epoch {epoch} already has a target installed",
    )


def test_install_for_an_epoch_older_than_the_installed_target(api: Api, gid: str) -> None:
    w1, _w2, epoch = prepared(api, gid)
    Worker(api, gid, "W3").join()
    assert w1.heartbeat().error_code == COMPUTE_ASSIGNMENT
    newer = w1.prepare().group_epoch
    assert newer == epoch + 1
    assert w1.install(newer, {"W1": W1_TARGET, "W2": W2_TARGET, "W3": EMPTY}).error_code == NONE
    rejected(
        api,
        gid,
        lambda: w1.install(epoch, {"W1": W1_TARGET, "W2": W2_TARGET}),
        INVALID_ASSIGNMENT,
        f"install for group epoch {epoch}, but epoch {newer} already has a target installed",
    )


def test_install_for_a_future_epoch(api: Api, gid: str) -> None:
    w1, _w2, epoch = prepared(api, gid)
    rejected(
        api,
        gid,
        lambda: w1.install(epoch + 1, {"W1": W1_TARGET, "W2": W2_TARGET}),
        INVALID_ASSIGNMENT,
        f"install for group epoch {epoch + 1}, but the group is at epoch {epoch}",
    )


def test_install_without_any_prepare(api: Api, gid: str) -> None:
    w1, _w2 = two_members(api, gid)
    epoch = describe(api, gid).group_epoch
    rejected(
        api,
        gid,
        lambda: w1.install(epoch, {"W1": W1_TARGET, "W2": W2_TARGET}),
        INVALID_ASSIGNMENT,
        f"install for group epoch {epoch} without a PrepareAssignment for it",
    )


# --- ConnectGroupAdmin: PutConnector -------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        pytest.param("group_id", "", "GroupId must be non-empty", id="empty-group-id"),
        pytest.param(
            "group_id", LONG, "GroupId must be at most 249 characters", id="long-group-id"
        ),
        pytest.param("connector", "", "Connector must be non-empty", id="empty-connector"),
        pytest.param(
            "connector", LONG, "Connector must be at most 249 characters", id="long-connector"
        ),
        pytest.param(
            "task_count", -1, "TaskCount must be between 0 and 100000", id="negative-task-count"
        ),
        pytest.param(
            "task_count", 100_001, "TaskCount must be between 0 and 100000", id="too-many-tasks"
        ),
    ],
)
def test_put_connector_invalid_request(
    api: Api, gid: str, field: str, value: Any, rule: str
) -> None:
    put_connector(api, gid, "A", 1)
    req = admin_pb2.PutConnectorRequest(group_id=gid, connector="A", task_count=2)
    setattr(req, field, value)
    rejected(api, gid, lambda: api.admin.PutConnector(req, timeout=10), INVALID_REQUEST, rule)


# --- ConnectGroupAdmin: DeleteConnector ----------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        pytest.param("group_id", "", "GroupId must be non-empty", id="empty-group-id"),
        pytest.param(
            "group_id", LONG, "GroupId must be at most 249 characters", id="long-group-id"
        ),
        pytest.param("connector", "", "Connector must be non-empty", id="empty-connector"),
    ],
)
def test_delete_connector_invalid_request(
    api: Api, gid: str, field: str, value: Any, rule: str
) -> None:
    put_connector(api, gid, "A", 1)
    req = admin_pb2.DeleteConnectorRequest(group_id=gid, connector="A")
    setattr(req, field, value)
    rejected(api, gid, lambda: api.admin.DeleteConnector(req, timeout=10), INVALID_REQUEST, rule)


def test_delete_unknown_connector(api: Api, gid: str) -> None:
    """DESIGN 3.1: deleting an unknown connector is INVALID_REQUEST."""
    put_connector(api, gid, "A", 1)
    rejected(
        api,
        gid,
        lambda: api.admin.DeleteConnector(
            admin_pb2.DeleteConnectorRequest(group_id=gid, connector="Z"), timeout=10
        ),
        INVALID_REQUEST,
        f"connector 'Z' is not in the catalogue of group {gid!r}",
    )


def test_delete_connector_of_an_unknown_group(api: Api, gid: str) -> None:
    rejected(
        api,
        gid,
        lambda: api.admin.DeleteConnector(
            admin_pb2.DeleteConnectorRequest(group_id=gid, connector="A"), timeout=10
        ),
        GROUP_ID_NOT_FOUND,
        f"group {gid!r} does not exist",
    )


# --- ConnectGroupAdmin: AlterGroupConfigs --------------------------------------------------------


def alter(api: Api, group_id: str, set_: dict[str, str], unset: list[str] | None = None) -> Any:
    return api.admin.AlterGroupConfigs(
        admin_pb2.AlterGroupConfigsRequest(group_id=group_id, set=set_, unset=unset or []),
        timeout=10,
    )


def test_alter_configs_empty_group_id(api: Api) -> None:
    rejected(
        api,
        "",
        lambda: alter(api, "", {"session.timeout.ms": "5000"}),
        INVALID_REQUEST,
        "GroupId must be non-empty",
    )


def test_alter_configs_unknown_key(api: Api, gid: str) -> None:
    put_connector(api, gid, "A", 1)
    rejected(
        api,
        gid,
        lambda: alter(api, gid, {"session.timeout.ms": "5000", "max.poll.records": "5"}),
        INVALID_REQUEST,
        "unknown group configuration 'max.poll.records'",
        "session.timeout.ms",
    )


def test_alter_configs_unknown_key_to_unset(api: Api, gid: str) -> None:
    put_connector(api, gid, "A", 1)
    rejected(
        api,
        gid,
        lambda: alter(api, gid, {}, ["group.protocol"]),
        INVALID_REQUEST,
        "unknown group configuration 'group.protocol'",
    )


@pytest.mark.parametrize("value", ["ten", "1.5", "", "1e3", "0x10", "10_000"])
def test_alter_configs_non_integer_value(api: Api, gid: str, value: str) -> None:
    """Values are integer milliseconds, written as plain decimal digits (what clients in any
    language parse back from DescribeGroups)."""
    put_connector(api, gid, "A", 1)
    rejected(
        api,
        gid,
        lambda: alter(api, gid, {"session.timeout.ms": value}),
        INVALID_REQUEST,
        f"session.timeout.ms must be an integer number of milliseconds, got {value!r}",
    )


@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        pytest.param(
            "session.timeout.ms", "0", "session.timeout.ms must be >= 1, got 0", id="zero-session"
        ),
        pytest.param(
            "scheduled.rebalance.max.delay.ms",
            "-1",
            "scheduled.rebalance.max.delay.ms must be >= 0, got -1",
            id="negative-delay",
        ),
        pytest.param(
            "rebalance.timeout.ms",
            str(2**31),
            f"rebalance.timeout.ms must fit an int32, got {2**31}",
            id="beyond-int32",
        ),
    ],
)
def test_alter_configs_value_out_of_range(
    api: Api, gid: str, key: str, value: str, rule: str
) -> None:
    put_connector(api, gid, "A", 1)
    rejected(api, gid, lambda: alter(api, gid, {key: value}), INVALID_REQUEST, rule)


def test_alter_configs_heartbeat_interval_not_below_session_timeout(api: Api, gid: str) -> None:
    put_connector(api, gid, "A", 1)
    rejected(
        api,
        gid,
        lambda: alter(api, gid, {"session.timeout.ms": "5000", "heartbeat.interval.ms": "5000"}),
        INVALID_REQUEST,
        "heartbeat.interval.ms must be smaller than session.timeout.ms",
    )


def test_alter_configs_heartbeat_interval_not_below_effective_session_timeout(
    api: Api, gid: str
) -> None:
    """The rule holds for the effective values: one set now against one stored earlier."""
    put_connector(api, gid, "A", 1)
    assert alter(api, gid, {"session.timeout.ms": "5000"}).error_code == NONE
    rejected(
        api,
        gid,
        lambda: alter(api, gid, {"heartbeat.interval.ms": "6000"}),
        INVALID_REQUEST,
        "heartbeat.interval.ms (6000) must be smaller than session.timeout.ms (5000)",
    )


def test_alter_configs_unset_making_interval_not_below_session(api: Api, gid: str) -> None:
    """Unsetting the session timeout falls back to the server default, which must still exceed
    the stored heartbeat interval; here it would not, so the unset is refused."""
    put_connector(api, gid, "A", 1)
    big = str(SESSION_MS + 1)
    assert alter(api, gid, {"session.timeout.ms": str(SESSION_MS + 2)}).error_code == NONE
    assert alter(api, gid, {"heartbeat.interval.ms": big}).error_code == NONE
    rejected(
        api,
        gid,
        lambda: alter(api, gid, {}, ["session.timeout.ms"]),
        INVALID_REQUEST,
        f"heartbeat.interval.ms ({big}) must be smaller than session.timeout.ms ({SESSION_MS})",
    )


def test_alter_configs_key_both_set_and_unset(api: Api, gid: str) -> None:
    put_connector(api, gid, "A", 1)
    rejected(
        api,
        gid,
        lambda: alter(api, gid, {"session.timeout.ms": "5000"}, ["session.timeout.ms"]),
        INVALID_REQUEST,
        "a configuration cannot be both set and unset",
    )


# --- ConnectGroupAdmin: DescribeGroups, FindCoordinator ------------------------------------------


def test_describe_unknown_group(api: Api, gid: str) -> None:
    put_connector(api, gid, "A", 1)
    unknown = f"{gid}-unknown"
    before = store_dump.dump(api.store)
    resp = api.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=[gid, unknown]), timeout=10
    )
    assert_same_dump(before, store_dump.dump(api.store))
    known, missing = resp.groups
    assert (known.group_id, known.error_code, known.state) == (gid, NONE, "EMPTY")
    assert (missing.group_id, missing.error_code) == (unknown, GROUP_ID_NOT_FOUND)
    assert f"group {unknown!r} does not exist" in missing.error_message


def test_describe_empty_group_id(api: Api, gid: str) -> None:
    put_connector(api, gid, "A", 1)
    before = store_dump.dump(api.store)
    resp = api.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=["", gid]), timeout=10
    )
    assert_same_dump(before, store_dump.dump(api.store))
    empty, known = resp.groups
    assert empty.error_code == INVALID_REQUEST, empty
    assert "GroupId must be non-empty" in empty.error_message
    assert (known.group_id, known.error_code) == (gid, NONE)


def test_describe_too_long_group_id(api: Api) -> None:
    """Like every other RPC: a client error, not an internal one."""
    before = store_dump.dump(api.store)
    resp = api.admin.DescribeGroups(admin_pb2.DescribeGroupsRequest(group_ids=[LONG]), timeout=10)
    assert_same_dump(before, store_dump.dump(api.store))
    (group,) = resp.groups
    assert group.error_code == INVALID_REQUEST, group
    assert "GroupId must be at most 249 characters" in group.error_message


def test_find_coordinator_empty_group_id(api: Api) -> None:
    rejected(
        api,
        "",
        lambda: api.admin.FindCoordinator(
            admin_pb2.FindCoordinatorRequest(group_id=""), timeout=10
        ),
        INVALID_REQUEST,
        "GroupId must be non-empty",
    )


def test_find_coordinator_too_long_group_id(api: Api) -> None:
    rejected(
        api,
        LONG,
        lambda: api.admin.FindCoordinator(
            admin_pb2.FindCoordinatorRequest(group_id=LONG), timeout=10
        ),
        INVALID_REQUEST,
        "GroupId must be at most 249 characters",
    )
