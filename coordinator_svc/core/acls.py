"""Access control lists, modelled on Kafka's: who (a principal, or `User:*`) may or may not do
which operation on which resource (a group by literal name or name prefix, or the cluster).
Deny wins over allow; nothing allowed means denied. Pure: the store loads the entries, the
runtime's authorizer caches the decisions."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from connect_protocol.errors import InvalidRequest

#: The principal of a caller without a client certificate.
ANONYMOUS = "User:ANONYMOUS"
#: Matches every principal in an ACL.
ANY_PRINCIPAL = "User:*"
#: As a literal group pattern: every group.
ANY_GROUP = "*"


class Operation(StrEnum):
    """What a call does. MEMBER: ConnectGroupHeartbeat (join, heartbeat, leave) and, for the
    assignor member, PrepareAssignment / InstallAssignment. DESCRIBE: DescribeGroups (configs
    masked) and FindCoordinator. ALTER: PutConnector, DeleteConnector, AlterGroupConfigs.
    DESCRIBE_CONFIGS: connector config values in DescribeGroups. DELETE: DeleteGroup (DESIGN
    3.20; Kafka's DELETE on a group). On the cluster, DESCRIBE:
    ListGroups, ListAcls, DescribeFeatures; ALTER: AddAcl, RemoveAcl, UpdateFeatures. ALL: every
    operation."""

    MEMBER = "MEMBER"
    DESCRIBE = "DESCRIBE"
    ALTER = "ALTER"
    DESCRIBE_CONFIGS = "DESCRIBE_CONFIGS"
    DELETE = "DELETE"
    ALL = "ALL"


#: Operations that imply others, as in Kafka (who may act on a group may find and describe it).
IMPLIED_BY: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset(
        {
            Operation.MEMBER,
            Operation.ALTER,
            Operation.DESCRIBE_CONFIGS,
            Operation.DELETE,
            Operation.ALL,
        }
    ),
}


class ResourceType(StrEnum):
    GROUP = "GROUP"
    CLUSTER = "CLUSTER"


class PatternType(StrEnum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


class Permission(StrEnum):
    ALLOW = "ALLOW"
    DENY = "DENY"


#: The one name of the cluster resource.
CLUSTER_NAME = "cluster"


@dataclass(frozen=True, slots=True)
class AclEntry:
    principal: str
    operation: Operation
    resource_type: ResourceType
    pattern: str
    pattern_type: PatternType = PatternType.LITERAL
    permission: Permission = Permission.ALLOW

    def __post_init__(self) -> None:
        if not self.principal.startswith("User:") or len(self.principal) == len("User:"):
            raise InvalidRequest(
                f"a principal looks like 'User:<name>' or 'User:*', not {self.principal!r}"
            )
        if not self.pattern:
            raise InvalidRequest("an ACL needs a non-empty resource pattern")
        if self.resource_type is ResourceType.CLUSTER and self.pattern != CLUSTER_NAME:
            raise InvalidRequest(f"the cluster resource is named {CLUSTER_NAME!r}")

    def matches(self, resource_type: ResourceType, name: str) -> bool:
        if resource_type is not self.resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.pattern)
        return self.pattern == name or self.pattern == ANY_GROUP

    def grants(self, operation: Operation) -> bool:
        return (
            self.operation is operation
            or self.operation is Operation.ALL
            or self.operation in IMPLIED_BY.get(operation, frozenset())
        )

    def describe(self) -> str:
        return (
            f"{self.permission} {self.principal} {self.operation} on "
            f"{self.resource_type} {self.pattern_type} {self.pattern!r}"
        )


class AclSet:
    """The ACLs in force, indexed by principal. `allows` costs O(entries of that principal and
    of `User:*`)."""

    def __init__(self, entries: Iterable[AclEntry] = ()) -> None:
        self.entries = tuple(entries)
        self._by_principal: dict[str, list[AclEntry]] = {}
        for entry in self.entries:
            self._by_principal.setdefault(entry.principal, []).append(entry)

    def allows(
        self, principal: str, operation: Operation, resource_type: ResourceType, name: str
    ) -> bool:
        allowed = False
        for entries in (
            self._by_principal.get(principal, ()),
            self._by_principal.get(ANY_PRINCIPAL, ()),
        ):
            for entry in entries:
                if not entry.matches(resource_type, name):
                    continue
                if entry.permission is Permission.DENY:
                    # A DENY of an operation denies exactly it (and ALL denies everything).
                    if entry.operation in (operation, Operation.ALL):
                        return False
                elif entry.grants(operation):
                    allowed = True
        return allowed
