"""`coordinator-svc acl add|remove|list`: the ACL table, edited in the database directly (like
`migrate`: whoever may write the coordinator's database administers its ACLs, which is how the
first entries get there), or with `--coordinator` through the AddAcl / RemoveAcl / ListAcls
RPCs, as a principal with ALTER (DESCRIBE to list) on the cluster. Running coordinators pick a
change up within --acl-refresh-ms. Every change is recorded as an ACL_ADDED / ACL_REMOVED event
naming its caller: over gRPC the certificate's principal and the peer address; against the
database `local:<os user>` and the host name."""

from __future__ import annotations

import argparse
import sys

from connect_protocol.errors import InvalidRequest
from connect_protocol.limits import DEFAULT_MAX_MESSAGE_BYTES
from connect_protocol.safe_text import printable
from connect_protocol.tls import add_client_tls_arguments

from .core.acls import (
    CLUSTER_NAME,
    AclEntry,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)


def add_acl_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], database_url: str
) -> None:
    acl = sub.add_parser(
        "acl",
        help="add, remove or list access control entries",
        description="Edit the ACLs in the coordinator's database (the coordinators re-read them "
        "within --acl-refresh-ms). Operations: MEMBER (heartbeat, and Prepare/Install for the "
        "assignor member), DESCRIBE (DescribeGroups, FindCoordinator; implied by every other "
        "operation), ALTER (PutConnector, DeleteConnector, AlterGroupConfigs), "
        "DESCRIBE_CONFIGS, ALL; on the cluster, DESCRIBE lets a principal list groups and "
        "ACLs and describe the features, ALTER change ACLs and features. "
        "DENY wins over ALLOW; with --authorization acl, nothing allowed is denied.",
    )
    acl_sub = acl.add_subparsers(dest="acl_command", required=True)

    def connection(p: argparse.ArgumentParser) -> None:
        where = p.add_mutually_exclusive_group()
        where.add_argument(
            "--database-url",
            default=database_url,
            help="SQLAlchemy URL (DATABASE_URL); a change is recorded in the audit trail as "
            "made by local:<os user> on this host",
        )
        where.add_argument(
            "--coordinator",
            help="host:port of a coordinator: go through its ACL RPCs (needs ALTER, or "
            "DESCRIBE to list, on the cluster, and --authorization acl there) instead of the "
            "database",
        )
        p.add_argument("--timeout", type=float, default=10.0, help="seconds per call")
        add_client_tls_arguments(p, "COORDINATOR_CLIENT_", "the command")
        p.set_defaults(max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES)

    for name, text in (
        ("add", "add an entry"),
        ("remove", "remove an entry (the same arguments as it was added with)"),
    ):
        p = acl_sub.add_parser(name, help=text, description=text)
        connection(p)
        p.add_argument(
            "--principal", required=True, help="User:<name> as the coordinator maps it, or User:*"
        )
        p.add_argument(
            "--operation", required=True, choices=[o.value for o in Operation], type=str.upper
        )
        target = p.add_mutually_exclusive_group(required=True)
        target.add_argument("--group", help="a group id, or * for every group")
        target.add_argument("--group-prefix", help="every group whose id starts with this")
        target.add_argument("--cluster", action="store_true", help="the cluster resource")
        p.add_argument("--deny", action="store_true", help="a DENY entry (default: ALLOW)")
    ls = acl_sub.add_parser("list", help="list the entries", description="List the entries.")
    connection(ls)
    ls.add_argument("--principal", help="only this principal's entries")


def _entry(args: argparse.Namespace) -> AclEntry:
    if args.cluster:
        resource, pattern, kind = ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL
    elif args.group_prefix is not None:
        resource, pattern, kind = ResourceType.GROUP, args.group_prefix, PatternType.PREFIXED
    else:
        resource, pattern, kind = ResourceType.GROUP, args.group, PatternType.LITERAL
    return AclEntry(
        principal=args.principal,
        operation=Operation(args.operation),
        resource_type=resource,
        pattern=pattern,
        pattern_type=kind,
        permission=Permission.DENY if args.deny else Permission.ALLOW,
    )


def _over_grpc(args: argparse.Namespace) -> int:
    from connect.group.v1 import admin_pb2, common_pb2

    from .admin_client import _stubs

    channel, admin = _stubs(args, args.coordinator)
    with channel:
        if args.acl_command == "list":
            token = ""
            while True:  # every page
                listed = admin.ListAcls(
                    admin_pb2.ListAclsRequest(principal=args.principal or "", page_token=token),
                    timeout=args.timeout,
                )
                answer: object = listed
                if listed.error_code != 0:
                    break
                for e in listed.entries:
                    print(
                        printable(
                            f"{e.permission} {e.principal} {e.operation} on {e.resource_type} "
                            f"{e.pattern_type} {e.pattern!r}"
                        )
                    )
                if not listed.next_page_token:
                    return 0
                token = listed.next_page_token
        else:
            entry = _entry(args)
            wire = admin_pb2.AclEntry(
                principal=entry.principal,
                operation=entry.operation.value,
                resource_type=entry.resource_type.value,
                pattern_type=entry.pattern_type.value,
                pattern=entry.pattern,
                permission=entry.permission.value,
            )
            if args.acl_command == "add":
                changed = admin.AddAcl(admin_pb2.AddAclRequest(entry=wire), timeout=args.timeout)
            else:
                changed = admin.RemoveAcl(
                    admin_pb2.RemoveAclRequest(entry=wire), timeout=args.timeout
                )
            answer = changed
            if changed.error_code == 0:
                verb = {"add": ("added", "already there"), "remove": ("removed", "no such entry")}
                done = verb[args.acl_command][0 if changed.changed else 1]
                print(f"{done}: {printable(entry.describe())}")
                return 0 if changed.changed or args.acl_command == "add" else 1
    code = common_pb2.ErrorCode.Name(answer.error_code)  # type: ignore[attr-defined]
    message = printable(answer.error_message)  # type: ignore[attr-defined]
    print(f"error: {code}: {message}", file=sys.stderr)
    return 1


def acl_cmd(args: argparse.Namespace) -> int:
    if args.coordinator:
        try:
            return _over_grpc(args)
        except InvalidRequest as error:
            message = printable(error.message)
            print(f"coordinator-svc acl {args.acl_command}: {message}", file=sys.stderr)
            return 2
    from .store.acl_store import AclStore, local_caller
    from .store.engine import Database
    from .store.migrate import normalize_url, pending_revision

    problem = pending_revision(args.database_url)
    if problem is not None:
        print(f"coordinator-svc acl: {problem}", file=sys.stderr)
        return 2
    db = Database(normalize_url(args.database_url), 5_000)
    try:
        store = AclStore(db)
        if args.acl_command == "list":
            _, entries = store.load()
            for entry in entries:
                if args.principal is None or entry.principal == args.principal:
                    print(printable(entry.describe()))
            return 0
        try:
            entry = _entry(args)
        except InvalidRequest as error:
            message = printable(error.message)
            print(f"coordinator-svc acl {args.acl_command}: {message}", file=sys.stderr)
            return 2
        caller = local_caller()  # recorded as the change's principal and address
        if args.acl_command == "add":
            added = store.add(entry, caller)
            print(("added: " if added else "already there: ") + printable(entry.describe()))
            return 0
        removed = store.remove(entry, caller)
        if not removed:
            print(f"no such entry: {printable(entry.describe())}", file=sys.stderr)
            return 1
        print(f"removed: {printable(entry.describe())}")
        return 0
    finally:
        db.dispose()
