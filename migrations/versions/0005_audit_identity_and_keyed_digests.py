"""Who did what, and ACLs and digests that mean what they show (issue 23).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27 00:00:00+00:00

- `groups.created_by`: the principal that created a group (existing groups: NULL, counted only
  against --max-groups), indexed for --max-groups-per-principal.
- `acl_audit`: one row whose `revision` a trigger raises on every INSERT, UPDATE or DELETE of
  `acls` (statement-level on PostgreSQL, one per row on SQLite), so that an edit made in place
  is noticed; `audited_revision` / `audited_entries` are what the audit trail last accounted
  for (the ACLs as they are now, here).
- `coordinator_secrets` with a fresh random `config_digest_key`, and every connector's
  `config_digest` re-keyed as an HMAC under it. Digests already written to events and exported
  files stay as they were (unkeyed).

Hand-written to match coordinator_svc/store/schema.py; `alembic check` in the test suite proves
they agree (the triggers are not part of the metadata).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from connect_protocol.configs import config_digest

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
PRINCIPAL = sa.String(1024)

_PG_FUNCTION = """
CREATE OR REPLACE FUNCTION acl_audit_bump() RETURNS trigger AS $$
BEGIN
    UPDATE acl_audit SET revision = revision + 1 WHERE id = 1;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql
"""
_PG_TRIGGER = """
CREATE TRIGGER acls_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON acls
FOR EACH STATEMENT EXECUTE FUNCTION acl_audit_bump()
"""
_SQLITE_TRIGGERS = tuple(
    f"""
CREATE TRIGGER acls_changed_{what.lower()} AFTER {what} ON acls
BEGIN
    UPDATE acl_audit SET revision = revision + 1 WHERE id = 1;
END
"""
    for what in ("INSERT", "UPDATE", "DELETE")
)


def upgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.add_column(sa.Column("created_by", PRINCIPAL, nullable=True))
        batch.create_index(op.f("ix_groups_created_by"), ["created_by"], unique=False)
    op.create_table(
        "acl_audit",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("revision", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("audited_revision", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("audited_entries", JSON, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_acl_audit")),
    )
    op.create_table(
        "coordinator_secrets",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_coordinator_secrets")),
    )
    conn = op.get_bind()
    _start_acl_audit(conn)
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(_PG_FUNCTION)
        conn.exec_driver_sql(_PG_TRIGGER)
    else:
        for trigger in _SQLITE_TRIGGERS:
            conn.exec_driver_sql(trigger)
    _rekey_digests(conn)


def _start_acl_audit(conn: sa.Connection) -> None:
    acls = sa.table(
        "acls",
        sa.column("id", sa.BigInteger()),
        sa.column("principal", sa.String()),
        sa.column("operation", sa.String()),
        sa.column("resource_type", sa.String()),
        sa.column("pattern_type", sa.String()),
        sa.column("pattern", sa.String()),
        sa.column("permission", sa.String()),
    )
    entries = [
        dict(row._mapping)
        for row in conn.execute(
            sa.select(
                acls.c.id,
                acls.c.principal,
                acls.c.operation,
                acls.c.resource_type,
                acls.c.pattern_type,
                acls.c.pattern,
                acls.c.permission,
            ).order_by(acls.c.id)
        )
    ]
    audit = sa.table(
        "acl_audit",
        sa.column("id", sa.Integer()),
        sa.column("revision", sa.BigInteger()),
        sa.column("audited_revision", sa.BigInteger()),
        sa.column("audited_entries", JSON),
    )
    conn.execute(
        audit.insert().values(id=1, revision=0, audited_revision=0, audited_entries=entries)
    )


def _rekey_digests(conn: sa.Connection) -> None:
    key = secrets.token_bytes(32)
    secrets_table = sa.table(
        "coordinator_secrets", sa.column("name", sa.String()), sa.column("value", sa.LargeBinary())
    )
    conn.execute(secrets_table.insert().values(name="config_digest_key", value=key))
    _set_digests(conn, key)


def _set_digests(conn: sa.Connection, key: bytes | None) -> None:
    """Every connector's `config_digest` computed again: keyed by `key`, or unkeyed (None)."""
    connectors = sa.table(
        "connectors",
        sa.column("group_id", sa.String()),
        sa.column("name", sa.String()),
        sa.column("config", sa.JSON()),
        sa.column("config_digest", sa.String()),
    )
    rows = conn.execute(sa.select(connectors.c.group_id, connectors.c.name, connectors.c.config))
    for group_id, name, config in rows.all():
        digest = config_digest({str(k): str(v) for k, v in (config or {}).items()}, key)
        conn.execute(
            connectors.update()
            .where(connectors.c.group_id == group_id, connectors.c.name == name)
            .values(config_digest=digest)
        )


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("DROP TRIGGER IF EXISTS acls_changed ON acls")
        conn.exec_driver_sql("DROP FUNCTION IF EXISTS acl_audit_bump()")
    else:
        for what in ("insert", "update", "delete"):
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS acls_changed_{what}")
    # Digests go back to unkeyed ones (what revision 0004's code computes).
    _set_digests(conn, None)
    op.drop_table("coordinator_secrets")
    op.drop_table("acl_audit")
    with op.batch_alter_table("groups") as batch:
        batch.drop_index(op.f("ix_groups_created_by"))
        batch.drop_column("created_by")
