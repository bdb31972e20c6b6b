"""A scripted worker for tests: builds heartbeat/prepare/install protos and remembers its epoch."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from connect.group.v1 import admin_pb2, common_pb2, coordinator_pb2

IC = common_pb2.Assignor(
    name="incremental_cooperative", minimum_version=1, maximum_version=2, version=2
)

Resources = tuple[frozenset[str], frozenset[tuple[str, int]]]


def parse(*names: str) -> Resources:
    """`parse("A", "A-0", "B-1")`: connectors are names without a `-<int>` suffix."""
    connectors: set[str] = set()
    tasks: set[tuple[str, int]] = set()
    for name in names:
        head, _, tail = name.rpartition("-")
        if head and tail.isdigit():
            tasks.add((head, int(tail)))
        else:
            connectors.add(name)
    return frozenset(connectors), frozenset(tasks)


def to_cat(resources: Resources) -> Any:
    connectors, tasks = resources
    return common_pb2.ConnectorsAndTasks(
        connectors=sorted(connectors),
        tasks=[common_pb2.ConnectorTaskId(connector=c, task=t) for c, t in sorted(tasks)],
    )


def from_cat(cat: Any) -> Resources:
    return frozenset(cat.connectors), frozenset((t.connector, t.task) for t in cat.tasks)


def names(resources: Resources) -> list[str]:
    connectors, tasks = resources
    return sorted(connectors) + [f"{c}-{t}" for c, t in sorted(tasks)]


class ScriptedWorker:
    """Plays one worker honestly: runs what it is told, reports it as owned."""

    def __init__(
        self,
        stubs: Any,
        group_id: str,
        member_id: str,
        instance_id: str | None = None,
        assignors: Iterable[Any] = (IC,),
    ) -> None:
        self.stubs = stubs
        self.group_id = group_id
        self.member_id = member_id
        self.instance_id = instance_id
        self.assignors = list(assignors)
        self.epoch = 0
        self.owned: Resources = (frozenset(), frozenset())
        self.last: Any = None

    def heartbeat(
        self,
        *,
        full: bool = False,
        report_owned: bool = True,
        epoch: int | None = None,
        **fields: Any,
    ) -> Any:
        req = coordinator_pb2.ConnectGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=self.epoch if epoch is None else epoch,
            **fields,
        )
        joining = req.member_epoch == 0
        if joining or full:
            req.rebalance_timeout_ms = fields.get("rebalance_timeout_ms", 5_000)
            req.client_assignors.assignors.extend(self.assignors)
            if self.instance_id is not None:
                req.instance_id = self.instance_id
        if report_owned:
            req.connectors_and_tasks.CopyFrom(to_cat(self.owned))
        resp = self.stubs.coordinator.ConnectGroupHeartbeat(req, timeout=10)
        self.last = resp
        if resp.error_code in (0, 10001):
            self.epoch = resp.member_epoch
            if resp.HasField("assignment"):
                self.owned = from_cat(resp.assignment.connectors_and_tasks)
        return resp

    def join(self) -> Any:
        self.epoch = 0
        self.owned = (frozenset(), frozenset())
        return self.heartbeat()

    def leave(self, static: bool = False) -> Any:
        return self.heartbeat(
            epoch=-2 if static else -1,
            report_owned=False,
            **({"instance_id": self.instance_id} if static else {}),
        )

    def prepare(self) -> Any:
        return self.stubs.coordinator.ConnectGroupPrepareAssignment(
            coordinator_pb2.ConnectGroupPrepareAssignmentRequest(
                group_id=self.group_id, member_id=self.member_id, member_epoch=self.epoch
            ),
            timeout=10,
        )

    def install(
        self,
        group_epoch: int,
        targets: dict[str, Resources],
        delay_ms: int = 0,
        state: bytes = b"",
        error: int = 0,
    ) -> Any:
        req = coordinator_pb2.ConnectGroupInstallAssignmentRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=self.epoch,
            group_epoch=group_epoch,
            scheduled_rebalance_delay_ms=delay_ms,
            assignor_state=state,
            error=error,
        )
        for member_id, resources in sorted(targets.items()):
            req.members.add(member_id=member_id, connectors_and_tasks=to_cat(resources))
        return self.stubs.coordinator.ConnectGroupInstallAssignment(req, timeout=10)


def describe(stubs: Any, group_id: str) -> Any:
    resp = stubs.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=[group_id]), timeout=10
    )
    return resp.groups[0]


def put_connector(stubs: Any, group_id: str, name: str, tasks: int) -> Any:
    return stubs.admin.PutConnector(
        admin_pb2.PutConnectorRequest(group_id=group_id, connector=name, task_count=tasks),
        timeout=10,
    )
