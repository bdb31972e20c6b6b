"""The operator commands (describe, list-groups, put-connector, delete-connector,
alter-configs, features): calls to a running coordinator's admin RPCs over gRPC, following a
group to the process that owns it, and the printing of their answers. grpc and the generated
code are imported only when a command runs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from connect_protocol.errors import ErrorCode
from connect_protocol.safe_text import printable

#: The answers that mean "ask FindCoordinator and try the owner".
_NOT_HERE = (ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR)


def _stubs(args: argparse.Namespace, address: str) -> tuple[Any, Any]:
    """A channel to `address` (TLS from the command's --tls-* flags, else plaintext, which the
    parser allows only to loopback unless --allow-plaintext) and its admin stub."""
    import grpc
    from connect.group.v1 import admin_pb2_grpc

    from connect_protocol.limits import channel_options
    from connect_protocol.tls import ClientTls, plaintext_problem

    options = channel_options(args.max_message_bytes)
    tls: ClientTls | None = args.tls
    if tls is None:
        problem = plaintext_problem(address, args.allow_plaintext, "--allow-plaintext")
        if problem is not None:
            raise PlaintextRefused(problem)
        channel = grpc.insecure_channel(address, options=options)
    else:
        channel = grpc.secure_channel(
            address,
            grpc.ssl_channel_credentials(*tls.pem()),
            options=[*options, *tls.channel_options()],
        )
    return channel, admin_pb2_grpc.ConnectGroupAdminStub(channel)


class PlaintextRefused(Exception):
    """A plaintext connection to a non-loopback address without --allow-plaintext."""


def _call_owner(args: argparse.Namespace, group_id: str, rpc: str, request: Any) -> Any:
    """Call an admin RPC about one group on the process that owns it: if the process asked
    answers NOT_COORDINATOR (or is between owners), ask FindCoordinator and go there."""
    from connect.group.v1 import admin_pb2, admin_pb2_grpc

    address = args.coordinator
    resp: Any = None
    for attempt in range(4):
        channel, admin = _stubs(args, address)
        with channel:
            resp = getattr(admin, rpc)(request, timeout=args.timeout)
            code = resp.groups[0].error_code if rpc == "DescribeGroups" else resp.error_code
            if code not in _NOT_HERE:
                return resp
            if code == ErrorCode.COORDINATOR_NOT_AVAILABLE:
                time.sleep(0.2 * (attempt + 1))
            found = admin_pb2_grpc.ConnectGroupAdminStub(channel).FindCoordinator(
                admin_pb2.FindCoordinatorRequest(group_id=group_id), timeout=args.timeout
            )
            if found.error_code == ErrorCode.NONE and found.host:
                address = f"{found.host}:{found.port}"
    return resp


def _check(resp: Any) -> int:
    if resp.error_code != ErrorCode.NONE:
        from connect.group.v1 import common_pb2

        name = common_pb2.ErrorCode.Name(resp.error_code)
        print(f"error: {name}: {printable(resp.error_message)}", file=sys.stderr)
        return 1
    return 0


def describe(args: argparse.Namespace) -> int:
    """`describe` and `status`: DescribeGroups per group (with statuses), shown as text or as
    JSON (one object per group, proto field names; `--output json`)."""
    from connect.group.v1 import admin_pb2
    from google.protobuf.json_format import MessageToDict

    from .describe_view import render_group, render_statuses

    status = 0
    for group_id in args.groups:
        request = admin_pb2.DescribeGroupsRequest(
            group_ids=[group_id],
            include_config_values=getattr(args, "show_config_values", False),
            include_status=True,
        )
        if args.follow:
            group = _call_owner(args, group_id, "DescribeGroups", request).groups[0]
        else:
            channel, admin = _stubs(args, args.coordinator)
            with channel:
                group = admin.DescribeGroups(request, timeout=args.timeout).groups[0]
        if group.error_code != ErrorCode.NONE:
            status |= _check(group)
            continue
        if args.output == "json":
            shown = MessageToDict(group, preserving_proto_field_name=True)
            if args.command == "status":
                keep = ("group_id", "group_type", "state", "statuses")
                shown = {k: v for k, v in shown.items() if k in keep}
            print(json.dumps(shown, sort_keys=True))
        elif args.command == "status":
            print(render_statuses(group))
        else:
            print(render_group(group, now_ms=int(time.time() * 1000)))
    return status


def list_groups(args: argparse.Namespace) -> int:
    from connect.group.v1 import admin_pb2

    channel, admin = _stubs(args, args.coordinator)
    with channel:
        token, header = "", True
        while True:  # page by page, printing as the pages come
            resp = admin.ListGroups(
                admin_pb2.ListGroupsRequest(page_token=token), timeout=args.timeout
            )
            if _check(resp):
                return 1
            if header:
                print(
                    f"{'GROUP':<30} {'TYPE':<8} {'STATE':<20} {'EPOCH':>6} {'MEMBERS':>8}  PROTOCOL"
                )
                header = False
            for g in resp.groups:
                group_id, state = printable(g.group_id), printable(g.state)
                group_type = printable(g.group_type) or "connect"
                protocol = printable(g.protocol_name) or "-"
                print(
                    f"{group_id:<30} {group_type:<8} {state:<20} {g.group_epoch:>6} "
                    f"{g.member_count:>8}  {protocol}"
                )
            token = resp.next_page_token
            if not token:
                return 0


def put_connector_cmd(args: argparse.Namespace) -> int:
    from connect.group.v1 import admin_pb2

    config = dict(item.split("=", 1) for item in args.config)
    resp = _call_owner(
        args,
        args.group,
        "PutConnector",
        admin_pb2.PutConnectorRequest(
            group_id=args.group, connector=args.connector, task_count=args.tasks, config=config
        ),
    )
    if _check(resp):
        return 1
    print(
        f"connector {args.connector}: {'created' if resp.created else 'updated'}; "
        f"group epoch {resp.group_epoch}"
        f"{' (rebalance triggered)' if resp.rebalance_triggered else ''}"
    )
    return 0


def delete_connector_cmd(args: argparse.Namespace) -> int:
    from connect.group.v1 import admin_pb2

    resp = _call_owner(
        args,
        args.group,
        "DeleteConnector",
        admin_pb2.DeleteConnectorRequest(group_id=args.group, connector=args.connector),
    )
    if _check(resp):
        return 1
    print(f"connector {args.connector} deleted; group epoch {resp.group_epoch}")
    return 0


#: `pause`, `resume`, `stop`: the RPC and what the connector becomes.
_TARGET_STATE_RPCS = {
    "pause": ("PauseConnector", "paused"),
    "resume": ("ResumeConnector", "resumed"),
    "stop": ("StopConnector", "stopped"),
}


def target_state_cmd(args: argparse.Namespace) -> int:
    """pause, resume, stop (DESIGN 3.20)."""
    from connect.group.v1 import admin_pb2, common_pb2

    rpc, done = _TARGET_STATE_RPCS[args.command]
    request = getattr(admin_pb2, f"{rpc}Request")(group_id=args.group, connector=args.connector)
    resp = _call_owner(args, args.group, rpc, request)
    if _check(resp):
        return 1
    previous = common_pb2.TargetState.Name(resp.previous_target_state).removeprefix("TARGET_")
    if not resp.changed:
        print(f"connector {printable(args.connector)}: already {previous}; nothing changed")
        return 0
    print(
        f"connector {printable(args.connector)} {done} (was {previous}); "
        f"{resp.holders_told} worker(s) told; group epoch {resp.group_epoch}"
        f"{' (rebalance triggered)' if resp.rebalance_triggered else ''}"
    )
    return 0


def restart_cmd(args: argparse.Namespace) -> int:
    """restart (DESIGN 3.20, KIP-745): prints the plan."""
    from connect.group.v1 import admin_pb2

    request = admin_pb2.RestartConnectorRequest(
        group_id=args.group,
        connector=args.connector,
        include_tasks=args.include_tasks,
        only_failed=args.only_failed,
    )
    if args.task is not None:
        request.task = args.task
    resp = _call_owner(args, args.group, "RestartConnector", request)
    if _check(resp):
        return 1
    if not resp.restarts:
        print(f"connector {printable(args.connector)}: nothing to restart")
        return 0
    for p in resp.restarts:
        name = f"{p.connector}-{p.task}" if p.HasField("task") else p.connector
        worker = printable(p.worker_id) or "(unassigned: its next holder starts it)"
        print(f"{printable(name)}: restart {p.restart_count} requested; worker {worker}")
    return 0


def delete_group_cmd(args: argparse.Namespace) -> int:
    """delete-group (DESIGN 3.20): says what was deleted and where a re-created group goes on."""
    from connect.group.v1 import admin_pb2

    request = admin_pb2.DeleteGroupRequest(group_id=args.group, with_catalogue=args.with_catalogue)
    resp = _call_owner(args, args.group, "DeleteGroup", request)
    if _check(resp):
        return 1
    print(
        f"group {printable(args.group)} deleted: {resp.connectors_deleted} connector(s) with "
        f"{resp.tasks_deleted} task(s), {resp.configs_deleted} configuration override(s); its "
        f"events are kept. Last epoch {resp.group_epoch}, last fencing token "
        f"{resp.last_fencing_token}: a group created again under this id continues above both."
    )
    return 0


def remove_member_cmd(args: argparse.Namespace) -> int:
    """remove-member (DESIGN 3.20): the member is fenced; its work is held, then placed."""
    from connect.group.v1 import admin_pb2

    request = admin_pb2.RemoveMemberRequest(
        group_id=args.group,
        member_id=args.member or "",
        instance_id=args.instance_id or "",
        reason=args.reason,
    )
    resp = _call_owner(args, args.group, "RemoveMember", request)
    if _check(resp):
        return 1
    held = (
        f"its {resp.resources_held} resource(s) are held for nobody until "
        f"{_utc(resp.held_until_ms)}, then placed"
        if resp.resources_held
        else "it held nothing"
    )
    print(
        f"member {printable(resp.member_id)} removed from group {printable(args.group)}; "
        f"{held}; group epoch {resp.group_epoch}"
    )
    return 0


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def alter_configs_cmd(args: argparse.Namespace) -> int:
    from connect.group.v1 import admin_pb2

    updates = dict(item.split("=", 1) for item in args.set)
    resp = _call_owner(
        args,
        args.group,
        "AlterGroupConfigs",
        admin_pb2.AlterGroupConfigsRequest(group_id=args.group, set=updates, unset=args.unset),
    )
    if _check(resp):
        return 1
    for key, value in sorted(resp.effective_configs.items()):
        print(f"{printable(key)}={printable(value)}")
    return 0


def features_cmd(args: argparse.Namespace) -> int:
    """`features describe`: one line per feature; `features update`: the level set (or, with
    --validate-only, what would be). 1 on an error answer or when the call fails."""
    import grpc

    try:
        return _features(args)
    except grpc.RpcError as error:
        status = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else ""
        print(
            f"coordinator-svc features {args.features_command}: the call to "
            f"{printable(args.coordinator)} failed: {getattr(status, 'name', status)}: "
            f"{printable(str(details))}",
            file=sys.stderr,
        )
        return 1


def _features(args: argparse.Namespace) -> int:
    from connect.group.v1 import admin_pb2

    channel, admin = _stubs(args, args.coordinator)
    with channel:
        if args.features_command == "describe":
            described = admin.DescribeFeatures(
                admin_pb2.DescribeFeaturesRequest(), timeout=args.timeout
            )
            if _check(described):
                return 1
            print(f"{'FEATURE':<24} {'LEVEL':>5}  SUPPORTED")
            for f in described.features:
                supported = f"{f.min_supported_level}-{f.max_supported_level}"
                print(f"{printable(f.name):<24} {f.finalized_level:>5}  {supported}")
            return 0
        updated = admin.UpdateFeatures(
            admin_pb2.UpdateFeaturesRequest(
                feature=args.feature, level=args.level, validate_only=args.validate_only
            ),
            timeout=args.timeout,
        )
    if _check(updated):
        return 1
    name = printable(args.feature)
    if not updated.changed:
        print(f"{name} is already at level {updated.finalized_level}; nothing changed")
    elif args.validate_only:
        print(
            f"{name} would go from level {updated.previous_level} to "
            f"{updated.finalized_level} (validate only: nothing changed)"
        )
    else:
        print(
            f"{name} set to level {updated.finalized_level} (was {updated.previous_level}); "
            "every coordinator applies it within its --acl-refresh-ms"
        )
    return 0
