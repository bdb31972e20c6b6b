"""lz4 compression for the large values a group's commits rewrite (issue 24).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 00:00:00+00:00

A member's row carries its whole share and fencing tokens (23 KB of JSON for 100 tasks with long
connector names), and every change of the member rewrites it; a group's commits are one serial
pipeline, so the time PostgreSQL spends compressing those values is paid by every member of the
group. On a PostgreSQL built with lz4 (14 and later; Debian's is), the columns below compress
with lz4: commits of 10 member changes (rows and their events) took 84-93 % of the time they
take with pglz, in the same run (`bench/run-toast`; the larger the shares, the larger the gain),
for a members table 1.0-1.6 times larger; these tables hold one row per member, target share or
group, so their size is bounded. Events, written once and kept, stay on the server's default
(pglz unless the operator chose otherwise), which stores them smaller.

Only newly written values are affected; stored ones keep their method, and both are read alike.
The change is to the columns' metadata, no table rewrite: the ALTER waits for the transactions
running on these tables (a coordinator's are milliseconds long) and holds them for an instant.
Older coordinators run on the migrated schema unchanged. Without lz4, or on SQLite, nothing
changes. Downgrade puts the columns back on the server's default.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: table -> its JSONB columns rewritten by a group's changes (one row per member, target share
#: or group).
REWRITTEN = {
    "members": ("assigned", "pending_revocation", "fencing_tokens", "classic_assignment"),
    "target_assignment_members": ("resources",),
    "groups": ("prepared",),
}


def _has_lz4() -> bool:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return False
    return bool(
        conn.execute(
            sa.text(
                "SELECT 'lz4' = ANY(enumvals) FROM pg_settings "
                "WHERE name = 'default_toast_compression'"
            )
        ).scalar()
    )


def _set_compression(method: str) -> None:
    for table, columns in REWRITTEN.items():
        clauses = ", ".join(f"ALTER COLUMN {c} SET COMPRESSION {method}" for c in columns)
        op.execute(f"ALTER TABLE {table} {clauses}")


def upgrade() -> None:
    if _has_lz4():
        _set_compression("lz4")


def downgrade() -> None:
    if _has_lz4():
        _set_compression("default")
