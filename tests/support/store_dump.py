"""Every row of a store's database, for tests that compare it before and after (formerly
``SqlStore.dump()``, which was test-only)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from coordinator_svc.store import SqlStore, schema

Dump = dict[str, list[dict[str, Any]]]


def dump(store: SqlStore) -> Dump:
    """Every row of every state table and of the audit trail (not leases), by table name,
    sorted by primary key, read in one transaction (one snapshot) of `store`."""
    result: Dump = {}
    with store._transaction(write=False) as conn:
        for table in (*schema.STATE_TABLES, schema.events):
            stmt = sa.select(table).order_by(*table.primary_key.columns)
            result[table.name] = [dict(row) for row in conn.execute(stmt).mappings()]
    return result
