"""The event table's vocabulary (DESIGN 3.17) as Spark sees it: event types, the payload keys the
coordinator writes (coordinator_svc/core/*.py: `change.event(...)`; for classic groups the
contract of docs/plan-issue25-classic-groups.md 3.4), and resource sets.

A resource set is stored as `{"connectors": [...], "tasks": [{"connector", "task"}]}`, or, above
32 tasks, with its tasks as runs `"task_ranges": [{"connector", "first", "last"}]`
(`coordinator_svc.store.stored_sets`); a resource is named as the coordinator names it: a
connector `A`, a task `A-0`.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

# Event types (coordinator_svc.core.records.EventType; tests check they agree).
GROUP_CREATED = "GROUP_CREATED"
MEMBER_JOINED = "MEMBER_JOINED"
MEMBER_REJOINED = "MEMBER_REJOINED"
MEMBER_LEFT = "MEMBER_LEFT"
MEMBER_FENCED = "MEMBER_FENCED"
MEMBER_SESSION_EXPIRED = "MEMBER_SESSION_EXPIRED"
REVOCATION_TIMED_OUT = "REVOCATION_TIMED_OUT"
STATIC_MEMBER_REPLACED = "STATIC_MEMBER_REPLACED"
GROUP_EPOCH_BUMPED = "GROUP_EPOCH_BUMPED"
TARGET_INSTALLED = "TARGET_INSTALLED"
ASSIGNMENT_DELIVERED = "ASSIGNMENT_DELIVERED"
REVOCATION_REQUESTED = "REVOCATION_REQUESTED"
REVOCATION_ACKNOWLEDGED = "REVOCATION_ACKNOWLEDGED"
REVOCATION_PARTIALLY_ACKNOWLEDGED = "REVOCATION_PARTIALLY_ACKNOWLEDGED"
SCHEDULED_REBALANCE_SET = "SCHEDULED_REBALANCE_SET"
SCHEDULED_REBALANCE_FIRED = "SCHEDULED_REBALANCE_FIRED"
HOLD_RELEASED = "HOLD_RELEASED"
CONNECTOR_PUT = "CONNECTOR_PUT"
CONNECTOR_DELETED = "CONNECTOR_DELETED"
# Classic groups (DESIGN 3.19): a rebalance started at generation g (the row of g + 1), its join
# phase completed (at g + 1: leader, protocol, members), the leader's assignments refused; and a
# group changing type (read by no finding: a classic row is named by the events above).
CLASSIC_REBALANCE_STARTED = "CLASSIC_REBALANCE_STARTED"
CLASSIC_JOIN_COMPLETED = "CLASSIC_JOIN_COMPLETED"
ASSIGNMENT_REFUSED = "ASSIGNMENT_REFUSED"
GROUP_CONVERTED = "GROUP_CONVERTED"
# DeleteGroup and RemoveMember (DESIGN 3.20): a deleted group's open rows end at its
# GROUP_DELETED (the fold; a group created again under the id continues its epochs, so its
# rows stay apart); a removed member is removed as a fenced one, its work held.
GROUP_DELETED = "GROUP_DELETED"
MEMBER_REMOVED = "MEMBER_REMOVED"

USED_EVENT_TYPES = frozenset(
    {
        GROUP_CREATED,
        MEMBER_JOINED,
        MEMBER_REJOINED,
        MEMBER_LEFT,
        MEMBER_FENCED,
        MEMBER_SESSION_EXPIRED,
        REVOCATION_TIMED_OUT,
        STATIC_MEMBER_REPLACED,
        GROUP_EPOCH_BUMPED,
        TARGET_INSTALLED,
        ASSIGNMENT_DELIVERED,
        REVOCATION_REQUESTED,
        REVOCATION_ACKNOWLEDGED,
        REVOCATION_PARTIALLY_ACKNOWLEDGED,
        SCHEDULED_REBALANCE_SET,
        SCHEDULED_REBALANCE_FIRED,
        HOLD_RELEASED,
        CONNECTOR_PUT,
        CONNECTOR_DELETED,
        CLASSIC_REBALANCE_STARTED,
        CLASSIC_JOIN_COMPLETED,
        ASSIGNMENT_REFUSED,
        GROUP_DELETED,
        MEMBER_REMOVED,
    }
)
"""The event types the findings read."""

REMOVAL_TYPES = (MEMBER_FENCED, MEMBER_SESSION_EXPIRED, REVOCATION_TIMED_OUT, MEMBER_REMOVED)
"""Events that remove their member from the group (besides a dynamic MEMBER_LEFT)."""

HOLDING_TYPES = (MEMBER_FENCED, REVOCATION_TIMED_OUT, MEMBER_REMOVED)
"""Removals whose member's work is held (`held`, until `held_until_ms`): lost at the removal,
and excused from UNASSIGNED_TOO_LONG while held (DESIGN 3.13)."""

RESOURCE_SET = StructType(
    [
        StructField("connectors", ArrayType(StringType())),
        StructField(
            "tasks",
            ArrayType(
                StructType(
                    [
                        StructField("connector", StringType()),
                        StructField("task", IntegerType()),
                    ]
                )
            ),
        ),
        StructField(
            "task_ranges",
            ArrayType(
                StructType(
                    [
                        StructField("connector", StringType()),
                        StructField("first", IntegerType()),
                        StructField("last", IntegerType()),
                    ]
                )
            ),
        ),
    ]
)

MOVE = StructType(
    [
        StructField("resource", StringType()),
        StructField("from", StringType()),
        StructField("to", StringType()),
    ]
)

PAYLOAD = StructType(
    [
        # GROUP_EPOCH_BUMPED, CLASSIC_REBALANCE_STARTED, ASSIGNMENT_REFUSED
        StructField("reason", StringType()),
        StructField("connector", StringType()),
        # TARGET_INSTALLED, SCHEDULED_REBALANCE_SET
        StructField("assignment_epoch", IntegerType()),
        StructField("moves", ArrayType(MOVE)),
        StructField("unassigned", ArrayType(StringType())),
        StructField("scheduled_rebalance_delay_ms", LongType()),
        StructField("at_ms", LongType()),
        # TARGET_INSTALLED: members moved to its epoch at once, their share unchanged (3.21)
        StructField("moved_members", ArrayType(StringType())),
        # ASSIGNMENT_DELIVERED, REVOCATION_REQUESTED
        StructField("member_epoch", IntegerType()),
        StructField("state", StringType()),
        StructField("assigned", RESOURCE_SET),
        StructField("revoke", RESOURCE_SET),
        # REVOCATION_PARTIALLY_ACKNOWLEDGED: what is still pending (and "released" below)
        StructField("pending", RESOURCE_SET),
        StructField("target_epoch", IntegerType()),
        # membership
        StructField("static", BooleanType()),
        StructField("static_left", BooleanType()),
        StructField("released", RESOURCE_SET),
        StructField("held", RESOURCE_SET),
        StructField("held_until_ms", LongType()),
        StructField("previous_member_id", StringType()),
        # catalogue
        StructField("task_count", IntegerType()),
        # classic groups: CLASSIC_REBALANCE_STARTED (the current generation), ASSIGNMENT_REFUSED
        # and CLASSIC_JOIN_COMPLETED (the new one); the join's leader, protocol and members
        StructField("generation", IntegerType()),
        StructField("leader", StringType()),
        StructField("protocol", StringType()),
        StructField("members", ArrayType(StringType())),
        # CLASSIC_JOIN_COMPLETED: what a hold kept from the leader
        StructField("withheld", RESOURCE_SET),
        # ASSIGNMENT_DELIVERED: what this answer gave the member (a classic row's moves)
        StructField("added", RESOURCE_SET),
    ]
)
"""The payload keys the findings read. Others are left unparsed, among them ASSIGNMENT_DELIVERED's
`removed` and CLASSIC_JOIN_COMPLETED's `removed` (member ids there, a resource set here: one
schema cannot read both; the members a join removed have their own MEMBER_FENCED events), and
GROUP_CONVERTED's (`direction`, `members` as counts: no finding reads it, so it is not parsed)."""


def parsed(events: DataFrame) -> DataFrame:
    """The events (id, at_ms, group_id, group_epoch, event_type, member_id) with the payload
    keys the findings read as columns `p_<key>`; resource sets become arrays of resource names
    (empty when absent). The JSON text itself is dropped."""
    columns = []
    for f in PAYLOAD.fields:
        value = F.col("p")[f.name]
        columns.append((names(value) if f.dataType == RESOURCE_SET else value).alias(f"p_{f.name}"))
    # Parsed once into a column first: referenced per key, from_json would run per key.
    return events.withColumn("p", F.from_json(F.col("payload"), PAYLOAD)).select(
        "id", "at_ms", "group_id", "group_epoch", "event_type", "member_id", *columns
    )


def _tasks(resource_set: Column) -> Column:
    """A set's tasks as `{connector, task}` structs, its ranges flattened after its listed tasks
    (an absent list or range list: none)."""
    listed = F.coalesce(
        resource_set["tasks"], F.array().cast("array<struct<connector:string,task:int>>")
    )
    ranges = F.coalesce(
        resource_set["task_ranges"],
        F.array().cast("array<struct<connector:string,first:int,last:int>>"),
    )
    ranged = F.flatten(
        F.transform(
            ranges,
            lambda r: F.transform(
                F.sequence(r["first"], r["last"]),
                lambda n: F.struct(r["connector"].alias("connector"), n.alias("task")),
            ),
        )
    )
    return F.concat(listed, ranged)


def names(resource_set: Column) -> Column:
    """A resource set -> its resource names (connectors, then tasks as `connector-task`);
    an absent set -> an empty array."""
    connectors = F.coalesce(resource_set["connectors"], F.array().cast("array<string>"))
    return F.concat(
        connectors,
        F.transform(
            _tasks(resource_set),
            lambda t: F.concat(t["connector"], F.lit("-"), t["task"].cast("string")),
        ),
    )


def items(resource_set: Column) -> Column:
    """A resource set -> an array of structs (resource, resource_type, connector, task), one per
    connector (task null) and per task."""
    connectors = F.coalesce(resource_set["connectors"], F.array().cast("array<string>"))
    return F.concat(
        F.transform(
            connectors,
            lambda c: F.struct(
                c.alias("resource"),
                F.lit("connector").alias("resource_type"),
                c.alias("connector"),
                F.lit(None).cast("int").alias("task"),
            ),
        ),
        F.transform(
            _tasks(resource_set),
            lambda t: F.struct(
                F.concat(t["connector"], F.lit("-"), t["task"].cast("string")).alias("resource"),
                F.lit("task").alias("resource_type"),
                t["connector"].alias("connector"),
                t["task"].alias("task"),
            ),
        ),
    )


def empty_names() -> Column:
    return F.array().cast("array<string>")
