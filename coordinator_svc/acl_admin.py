"""`coordinator-svc acl add|remove|list`: the ACL table, edited in the database directly (like
`migrate`: whoever may write the coordinator's database administers its ACLs; there is no RPC
for it, so no caller of the gRPC port can grant itself anything). Running coordinators pick a
change up within --acl-refresh-ms."""

from __future__ import annotations

import argparse
import sys

from connect_protocol.errors import InvalidRequest

from .core.acls import (
    CLUSTER_NAME,
    AclEntry,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

DEFAULT_DATABASE_URL = "sqlite:///coordinator.db"


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
        "DESCRIBE_CONFIGS, ALL; on the cluster, DESCRIBE lets a principal list groups. "
        "DENY wins over ALLOW; with --authorization acl, nothing allowed is denied.",
    )
    acl_sub = acl.add_subparsers(dest="acl_command", required=True)
    for name, text in (
        ("add", "add an entry"),
        ("remove", "remove an entry (the same arguments as it was added with)"),
    ):
        p = acl_sub.add_parser(name, help=text, description=text)
        p.add_argument("--database-url", default=database_url, help="SQLAlchemy URL (DATABASE_URL)")
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
    ls.add_argument("--database-url", default=database_url, help="SQLAlchemy URL (DATABASE_URL)")
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


def acl_cmd(args: argparse.Namespace) -> int:
    from .store.acl_store import AclStore
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
                    print(entry.describe())
            return 0
        try:
            entry = _entry(args)
        except InvalidRequest as error:
            print(f"coordinator-svc acl {args.acl_command}: {error.message}", file=sys.stderr)
            return 2
        if args.acl_command == "add":
            added = store.add(entry)
            print(("added: " if added else "already there: ") + entry.describe())
            return 0
        removed = store.remove(entry)
        if not removed:
            print(f"no such entry: {entry.describe()}", file=sys.stderr)
            return 1
        print(f"removed: {entry.describe()}")
        return 0
    finally:
        db.dispose()
