"""The derived snapshot tables as SQL the database runs: the JSON resource sets are flattened
and joined where they are stored, so Spark only streams rows from JDBC to Parquet (no JSON
parsing, no joins, no shuffles on the Spark side; flattening 100,000 resources this way costs
the database a fraction of what it costs a fresh Spark JVM).

Two dialects, one shape:
- PostgreSQL (`jsonb_array_elements[_text]`, `generate_series`),
- SQLite (`json_each`, `json_extract`, a recursive CTE for the task numbers).

Every query yields the columns of its table in order; `columns` types them for Spark
(`customSchema`). Pure text, no I/O: tests run these queries against both databases.

Connector configs are secrets (passwords, keys): the catalogue carries each connector's
`config_digest` as the coordinator stored it (`connect_protocol.configs.config_digest`: since
migration 0005 "hmac-sha256:<hex>", an HMAC under the database's own key, which the export never
reads; unkeyed "sha256:<hex>" in rows and events written before), and its `config` column is
NULL, not even read from the database, unless the export is asked for the values
(`CATALOGUE_WITH_CONFIG_VALUES`, `--include-config-values`).

Status traces may carry secrets too: `RESOURCE_STATUSES` never names the trace column, so no
trace is read from the database at all; it copies the digest the coordinator stored beside it
(`trace_digest`, `coordinator_svc.core.status.trace_digest`: "hmac-sha256:<hex>" under the same
key as config digests, the STATUS_CHANGED event's own; "" for no trace, read as NULL).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal

Dialect = Literal["postgresql", "sqlite"]


@dataclass(frozen=True)
class DerivedTable:
    """One derived snapshot table: its columns (name, Spark type) and its query per dialect.

    Attributes:
        name: the output table.
        columns: (name, Spark SQL type) in order.
        source_table: the stored table the rows come from; its row count sizes parallel reads.
        source_key: that table's key column as the query names it: parallel reads split on it
            (hash predicates on PostgreSQL).
        query: which query yields the rows (default: the one named like the table).
        carries: the stored columns its rows carry, per stored table (what
            `snapshot.exported_columns` counts as exported; a test checks it against the
            store's schema).
    """

    name: str
    columns: tuple[tuple[str, str], ...]
    source_table: str
    source_key: str
    query: str = ""
    carries: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def ddl(self) -> str:
        return ", ".join(f"{name} {kind}" for name, kind in self.columns)

    def column_names(self) -> list[str]:
        return [name for name, _ in self.columns]

    def sql(self, dialect: Dialect, where: str | None = None) -> str:
        """The query; `where`, a condition on a `{key}` placeholder (replaced by `source_key`),
        limits it to part of the source table's rows."""
        condition = where.format(key=self.source_key) if where else None
        return _QUERIES[self.query or self.name](_Json(dialect), condition)


class _Json:
    """The dialect's way of turning a stored resource set into rows."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect

    def connectors(self, doc: str, alias: str) -> str:
        """A table of the set's connector names (column `<alias>.value`)."""
        if self.dialect == "postgresql":
            arr = f"{doc}->'connectors'"
            return (
                f"jsonb_array_elements_text(CASE WHEN jsonb_typeof({arr}) = 'array' "
                f"THEN {arr} ELSE '[]'::jsonb END) AS {alias}(value)"
            )
        return f"json_each({doc}, '$.connectors') AS {alias}"

    def tasks(self, doc: str, alias: str) -> str:
        """A table of the set's tasks (one JSON object per row, see `task_connector`)."""
        if self.dialect == "postgresql":
            arr = f"{doc}->'tasks'"
            return (
                f"jsonb_array_elements(CASE WHEN jsonb_typeof({arr}) = 'array' "
                f"THEN {arr} ELSE '[]'::jsonb END) AS {alias}(value)"
            )
        return f"json_each({doc}, '$.tasks') AS {alias}"

    def task_connector(self, alias: str) -> str:
        if self.dialect == "postgresql":
            return f"({alias}.value->>'connector')"
        return f"json_extract({alias}.value, '$.connector')"

    def task_number(self, alias: str) -> str:
        if self.dialect == "postgresql":
            return f"({alias}.value->>'task')::int"
        return f"CAST(json_extract({alias}.value, '$.task') AS INTEGER)"

    def task_name(self, alias: str) -> str:
        number = (
            f"({alias}.value->>'task')"
            if self.dialect == "postgresql"
            else f"CAST(json_extract({alias}.value, '$.task') AS TEXT)"
        )
        return f"{self.task_connector(alias)} || '-' || {number}"

    def task_ranges(self, doc: str, base: str, alias: str, number: str) -> str:
        """A table of the set's ranged tasks: each range (`<alias>.value`) joined with its task
        numbers (`<number>.value`)."""
        if self.dialect == "postgresql":
            arr = f"{doc}->'task_ranges'"
            return (
                f"jsonb_array_elements(CASE WHEN jsonb_typeof({arr}) = 'array' "
                f"THEN {arr} ELSE '[]'::jsonb END) AS {alias}(value) "
                f"CROSS JOIN generate_series(({alias}.value->>'first')::int, "
                f"({alias}.value->>'last')::int) AS {number}(value)"
            )
        # No generate_series in SQLite: numbers from a recursive CTE up to the largest `last`
        # of any range in this column of `base`.
        table, _, own = base.partition(" ")
        largest = (
            f"SELECT coalesce(max(CAST(json_extract(x.value, '$.last') AS INTEGER)), -1) "
            f"FROM {table} {own} CROSS JOIN json_each({doc}, '$.task_ranges') AS x"
        )
        numbers = (
            f"(WITH RECURSIVE s(value) AS (SELECT 0 UNION ALL SELECT value + 1 FROM s "
            f"WHERE value + 1 <= ({largest})) SELECT value FROM s) AS {number}"
        )
        return (
            f"json_each({doc}, '$.task_ranges') AS {alias} JOIN {numbers} "
            f"ON {number}.value BETWEEN CAST(json_extract({alias}.value, '$.first') AS INTEGER) "
            f"AND CAST(json_extract({alias}.value, '$.last') AS INTEGER)"
        )

    def range_connector(self, alias: str) -> str:
        if self.dialect == "postgresql":
            return f"({alias}.value->>'connector')"
        return f"json_extract({alias}.value, '$.connector')"

    def range_task_name(self, alias: str, number: str) -> str:
        return f"{self.range_connector(alias)} || '-' || CAST({number}.value AS TEXT)"

    def null_int(self) -> str:
        return "CAST(NULL AS INTEGER)"

    def text(self, column: str) -> str:
        """A JSON column as JSON text."""
        return f"{column}::text" if self.dialect == "postgresql" else column


def _items(j: _Json, doc: str, select: str, tail: str, base: str, where: str | None = None) -> str:
    """`select` over every resource of the set `doc` of `base`: one SELECT for its connectors,
    one for its tasks and one for its task ranges (the stored form of large sets,
    `coordinator_svc.store.stored_sets`), united; `select` names the resource as `{resource}`,
    `{kind}`, `{connector}`, `{task}`; `where` filters the rows of `base`."""
    tail = f"{tail} WHERE {where}" if where else tail
    connector = select.format(
        resource="c.value", kind="'connector'", connector="c.value", task=j.null_int()
    )
    task = select.format(
        resource=j.task_name("t"),
        kind="'task'",
        connector=j.task_connector("t"),
        task=j.task_number("t"),
    )
    ranged = select.format(
        resource=j.range_task_name("r", "n"),
        kind="'task'",
        connector=j.range_connector("r"),
        task="n.value",
    )
    return (
        f"SELECT {connector} FROM {base} CROSS JOIN {j.connectors(doc, 'c')} {tail}\n"
        f"UNION ALL\n"
        f"SELECT {task} FROM {base} CROSS JOIN {j.tasks(doc, 't')} {tail}\n"
        f"UNION ALL\n"
        f"SELECT {ranged} FROM {base} CROSS JOIN {j.task_ranges(doc, base, 'r', 'n')} {tail}"
    )


def _catalogue(j: _Json, where: str | None, *, config_values: bool = False) -> str:
    """One row per connector (its digest, and its config only with `config_values`) and per
    task (neither)."""
    config = j.text("c.config") if config_values else "CAST(NULL AS TEXT)"
    filtered = f" WHERE {where}" if where else ""
    if j.dialect == "postgresql":
        numbers = "CROSS JOIN generate_series(0, c.task_count - 1) AS s(n)"
        prefix = ""
    else:
        prefix = (
            "WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s "
            "WHERE n + 1 < (SELECT coalesce(max(task_count), 0) FROM connectors)) "
        )
        numbers = "JOIN s ON s.n < c.task_count"
    return (
        f"{prefix}SELECT c.group_id, c.name AS resource, 'connector' AS resource_type, "
        f"c.name AS connector, {j.null_int()} AS task, c.task_count, "
        # '': a row written without a digest (by a coordinator older than the column).
        f"NULLIF(c.config_digest, '') AS config_digest, {config} AS config, "
        # The connector's target state (migration 0012); its tasks' rows carry it too.
        f"c.target_state "
        f"FROM connectors c{filtered}\n"
        f"UNION ALL\n"
        f"SELECT c.group_id, c.name || '-' || CAST(s.n AS TEXT), 'task', c.name, s.n, "
        f"c.task_count, NULL, NULL, c.target_state FROM connectors c {numbers}{filtered}"
    )


def _target_assignment(j: _Json, where: str | None) -> str:
    select = (
        "tm.group_id, tm.member_id, {resource} AS resource, {kind} AS resource_type, "
        "{connector} AS connector, {task} AS task, ta.assignment_epoch, g.group_epoch, "
        "tm.version AS target_version, m.member_epoch, m.state AS member_state, "
        "ta.scheduled_rebalance_at_ms, ta.lost_work_rebalance_at_ms, ta.next_wave_at_ms"
    )
    tail = (
        "LEFT JOIN target_assignments ta ON ta.group_id = tm.group_id "
        "LEFT JOIN groups g ON g.group_id = tm.group_id "
        "LEFT JOIN members m ON m.group_id = tm.group_id AND m.member_id = tm.member_id"
    )
    return _items(
        j,
        "tm.resources",
        select,
        tail,
        "target_assignment_members tm",
        where,
    )


def _current_assignment(j: _Json, where: str | None) -> str:
    owners = _items(
        j,
        "tm.resources",
        "tm.group_id, tm.member_id, {resource} AS resource",
        "",
        "target_assignment_members tm",
    )
    parts = []
    for column, pending in (("m.assigned", "0"), ("m.pending_revocation", "1")):
        flag = f"CAST({pending} AS BOOLEAN)" if j.dialect == "postgresql" else pending
        select = (
            "m.group_id, m.member_id, m.instance_id, {resource} AS resource, "
            "{kind} AS resource_type, {connector} AS connector, {task} AS task, "
            f"{flag} AS pending_revocation, m.member_epoch, m.previous_epoch, "
            "m.state AS member_state"
        )
        parts.append(_items(j, column, select, "", "members m", where))
    held = "\nUNION ALL\n".join(parts)
    return (
        f"WITH owners AS ({owners}), held AS ({held})\n"
        "SELECT h.group_id, h.member_id, h.instance_id, h.resource, h.resource_type, "
        "h.connector, h.task, h.pending_revocation, h.member_epoch, h.previous_epoch, "
        "h.member_state, g.group_epoch, ta.assignment_epoch, o.member_id AS target_member_id "
        "FROM held h "
        "LEFT JOIN groups g ON g.group_id = h.group_id "
        "LEFT JOIN target_assignments ta ON ta.group_id = h.group_id "
        "LEFT JOIN owners o ON o.group_id = h.group_id AND o.resource = h.resource"
    )


def _resource_statuses(j: _Json, where: str | None) -> str:
    """One row per stored status, named as the other tables name resources (a connector's
    row: task NULL; stored as task -1), with the trace's stored keyed digest (NULL for none);
    the trace itself is never read."""
    filtered = f" WHERE {where}" if where else ""
    return (
        "SELECT s.group_id, "
        "CASE WHEN s.task < 0 THEN s.connector "
        "ELSE s.connector || '-' || CAST(s.task AS TEXT) END AS resource, "
        "CASE WHEN s.task < 0 THEN 'connector' ELSE 'task' END AS resource_type, "
        f"s.connector, CASE WHEN s.task < 0 THEN {j.null_int()} ELSE s.task END AS task, "
        "s.state, s.member_id, s.fencing_token, s.restart_count, s.reported_at_ms, "
        # '': no trace (the trace column itself is never named: it may carry secrets).
        "NULLIF(s.trace_digest, '') AS trace_digest "
        f"FROM resource_statuses s{filtered}"
    )


_QUERIES: dict[str, Callable[[_Json, str | None], str]] = {
    "catalogue": _catalogue,
    "catalogue_with_config_values": partial(_catalogue, config_values=True),
    "target_assignment": _target_assignment,
    "current_assignment": _current_assignment,
    "resource_statuses": _resource_statuses,
}

_RESOURCE = (
    ("resource", "STRING"),
    ("resource_type", "STRING"),
    ("connector", "STRING"),
    ("task", "INT"),
)

CATALOGUE = DerivedTable(
    "catalogue",
    (
        ("group_id", "STRING"),
        *_RESOURCE,
        ("task_count", "INT"),
        ("config_digest", "STRING"),
        ("config", "STRING"),
        ("target_state", "STRING"),
    ),
    source_table="connectors",
    source_key="c.name",
    carries=(("connectors", ("group_id", "name", "task_count", "config_digest", "target_state")),),
)
CATALOGUE_WITH_CONFIG_VALUES = replace(
    CATALOGUE,
    query="catalogue_with_config_values",
    carries=(
        (
            "connectors",
            ("group_id", "name", "task_count", "config_digest", "config", "target_state"),
        ),
    ),
)
"""The catalogue with each connector's config values as well (same columns)."""
TARGET_ASSIGNMENT = DerivedTable(
    "target_assignment",
    (
        ("group_id", "STRING"),
        ("member_id", "STRING"),
        *_RESOURCE,
        ("assignment_epoch", "INT"),
        ("group_epoch", "INT"),
        ("target_version", "INT"),
        ("member_epoch", "INT"),
        ("member_state", "STRING"),
        ("scheduled_rebalance_at_ms", "BIGINT"),
        ("lost_work_rebalance_at_ms", "BIGINT"),
        ("next_wave_at_ms", "BIGINT"),
    ),
    source_table="target_assignment_members",
    source_key="tm.member_id",
    carries=(
        ("target_assignment_members", ("group_id", "member_id", "resources", "version")),
        (
            "target_assignments",
            (
                "group_id",
                "assignment_epoch",
                "scheduled_rebalance_at_ms",
                "lost_work_rebalance_at_ms",
                "next_wave_at_ms",
            ),
        ),
    ),
)
CURRENT_ASSIGNMENT = DerivedTable(
    "current_assignment",
    (
        ("group_id", "STRING"),
        ("member_id", "STRING"),
        ("instance_id", "STRING"),
        *_RESOURCE,
        ("pending_revocation", "BOOLEAN"),
        ("member_epoch", "INT"),
        ("previous_epoch", "INT"),
        ("member_state", "STRING"),
        ("group_epoch", "INT"),
        ("assignment_epoch", "INT"),
        ("target_member_id", "STRING"),
    ),
    source_table="members",
    source_key="m.member_id",
    carries=(
        (
            "members",
            (
                "group_id",
                "member_id",
                "instance_id",
                "assigned",
                "pending_revocation",
                "member_epoch",
                "previous_epoch",
                "state",
            ),
        ),
    ),
)

RESOURCE_STATUSES = DerivedTable(
    "resource_statuses",
    (
        ("group_id", "STRING"),
        *_RESOURCE,
        ("state", "STRING"),
        ("member_id", "STRING"),
        ("fencing_token", "BIGINT"),
        ("restart_count", "BIGINT"),
        ("reported_at_ms", "BIGINT"),
        ("trace_digest", "STRING"),
    ),
    source_table="resource_statuses",
    # The row's own key: one connector's 100,000 tasks spread over the parallel reads.
    source_key="(s.connector || '-' || CAST(s.task AS TEXT))",
    carries=(
        (
            "resource_statuses",
            (
                "group_id",
                "connector",
                "task",
                "state",
                "member_id",
                "fencing_token",
                "restart_count",
                "reported_at_ms",
                "trace_digest",
            ),
        ),
    ),
)
"""The stored statuses with each trace's stored keyed digest; the trace is never read."""

DERIVED_TABLES = (CATALOGUE, TARGET_ASSIGNMENT, CURRENT_ASSIGNMENT, RESOURCE_STATUSES)
"""The derived tables as exported by default (the catalogue without config values)."""


def derived_tables(include_config_values: bool = False) -> tuple[DerivedTable, ...]:
    """The derived tables; the catalogue with config values only if asked."""
    if not include_config_values:
        return DERIVED_TABLES
    return (CATALOGUE_WITH_CONFIG_VALUES, TARGET_ASSIGNMENT, CURRENT_ASSIGNMENT, RESOURCE_STATUSES)
