"""What the scenarios read and check, whatever the client: the group as the coordinator describes
it, the statuses, and the hook records' contract."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from connect.group.v1 import admin_pb2, common_pb2

from tests.clients.conformance.drivers import Client, Resource
from tests.clients.workers import catalogue_resources, resources_of, wait_for
from tests.support.client import describe, from_cat

__all__ = [
    "alive",
    "alter_configs",
    "as_resources",
    "check_records",
    "counts",
    "describe",
    "diagnostics",
    "put",
    "settled",
    "statuses",
    "wait_for",
    "wait_settled",
]


def put(
    stubs: Any, group: str, name: str, tasks: int, config: dict[str, str] | None = None
) -> None:
    resp = stubs.admin.PutConnector(
        admin_pb2.PutConnectorRequest(
            group_id=group, connector=name, task_count=tasks, config=config or {}
        ),
        timeout=10,
    )
    assert resp.error_code == 0, resp.error_message


def alter_configs(stubs: Any, group: str, **configs: int) -> None:
    resp = stubs.admin.AlterGroupConfigs(
        admin_pb2.AlterGroupConfigsRequest(
            group_id=group, set={k.replace("_", "."): str(v) for k, v in configs.items()}
        ),
        timeout=10,
    )
    assert resp.error_code == 0, resp.error_message


def as_resources(cat: Any) -> set[Resource]:
    connectors, tasks = from_cat(cat)
    out: set[Resource] = {(c,) for c in connectors}
    out |= set(tasks)
    return out


def counts(share: set[Resource]) -> tuple[int, int]:
    """(connectors, tasks) in a share."""
    connectors = sum(1 for r in share if len(r) == 1)
    return connectors, len(share) - connectors


def statuses(stubs: Any, group: str) -> dict[Resource, tuple[str, str, str]]:
    """resource -> (state name, worker id, trace), as DescribeGroups reports them."""
    resp = stubs.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=[group], include_status=True), timeout=10
    )
    (entry,) = resp.groups
    out: dict[Resource, tuple[str, str, str]] = {}
    for s in entry.statuses:
        key: Resource = (s.connector, s.task) if s.HasField("task") else (s.connector,)
        out[key] = (common_pb2.ResourceState.Name(s.state), s.worker_id, s.trace)
    return out


class Runs(Protocol):
    """What `settled` needs of a worker: a client of the suite, or a test's own worker."""

    @property
    def member_id(self) -> str: ...

    def running(self) -> set[Resource]: ...


def settled(stubs: Any, group_id: str, clients: Sequence[Runs]) -> dict[str, set[Resource]] | None:
    """Who runs what once the group is quiet: STABLE, every member at the assignment epoch with
    nothing pending, each client running exactly its current assignment (by its hook records),
    every catalogue resource on exactly one client. None until then."""
    group = describe(stubs, group_id)
    if group.error_code != 0 or group.state != "STABLE":
        return None
    if group.group_epoch != group.assignment_epoch:
        return None
    members = {m.member_id: m for m in group.members}
    if set(members) != {c.member_id for c in clients}:
        return None
    shares: dict[str, set[Resource]] = {}
    for client in clients:
        member = members[client.member_id]
        current = as_resources(member.current_assignment)
        if (
            member.state != "STABLE"
            or member.member_epoch != group.assignment_epoch
            or as_resources(member.pending_revocation)
            or current != as_resources(member.target_assignment)
            or client.running() != current
        ):
            return None
        shares[client.member_id] = current
    everything = catalogue_resources({c.name: c.task_count for c in group.catalogue})
    if sorted(r for s in shares.values() for r in s) != sorted(everything):
        return None
    return shares


def diagnostics(stubs: Any, group_id: str, clients: Sequence[Client]) -> str:
    group = describe(stubs, group_id)
    lines = [f"group: {group.state} epoch {group.group_epoch}/{group.assignment_epoch}"]
    for m in group.members:
        lines.append(
            f"  {m.member_id} {m.state} e{m.member_epoch} current "
            f"{sorted(as_resources(m.current_assignment))} pending "
            f"{sorted(as_resources(m.pending_revocation))}"
        )
    lines += [f"  {c!r} runs {sorted(c.running())}" for c in clients]
    lines += [f"--- {c!r} log\n{c.log_text()[-3000:]}" for c in clients]
    lines += [f"--- {c!r} hook\n{c.records()[-10:]}" for c in clients]
    return "\n".join(lines)


def wait_settled(
    stubs: Any, group_id: str, clients: Sequence[Client], what: str, timeout_s: float = 25
) -> dict[str, set[Resource]]:
    return wait_for(
        what,
        lambda: settled(stubs, group_id, clients),
        timeout_s=timeout_s,
        diagnostics=lambda: diagnostics(stubs, group_id, clients),
    )


def check_records(client: Client, group: str) -> None:
    """The hook contract every client keeps (plan §1): each call names at least one resource,
    the environment names the event, group, member and epoch of the object on stdin, and each
    resource a call names carries its fencing token."""
    for r in client.records():
        assert resources_of(r), (client, r)
        env = r["env"]
        event = "assigned" if r["event"] == "start_failed" else r["event"]
        assert env == {
            "WORKER_AGENT_EVENT": event,
            "WORKER_AGENT_GROUP_ID": group,
            "WORKER_AGENT_MEMBER_ID": r["worker"],
            "WORKER_AGENT_MEMBER_EPOCH": str(r["member_epoch"]),
        }, (client, r)
        tokens = r["fencing_tokens"]
        assert set(tokens["connectors"]) == set(r["connectors"]), (client, r)
        tasks = {(t["connector"], t["task"]) for t in tokens["tasks"]}
        assert tasks == {(t["connector"], t["task"]) for t in r["tasks"]}, (client, r)


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, killed and not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(") ", 1)[1][:1] not in ("Z", "X")
    except (OSError, IndexError):
        return False
