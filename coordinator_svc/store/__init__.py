"""The persistence adapter: group state, group leases and the audit trail in PostgreSQL
(production) or SQLite (embedded default), through SQLAlchemy 2; schema managed by Alembic."""

from .errors import (
    Lease,
    LeaseHolder,
    LeaseLocked,
    LeaseLost,
    SecretMissing,
    StoreError,
    StoreUnavailable,
)
from .migrate import normalize_url, upgrade_to_head
from .sql_store import GroupSummary, SqlStore

DEFAULT_DATABASE_URL = "sqlite:///coordinator.db"
"""The embedded default, for trying the coordinator out (DESIGN 2.2)."""

__all__ = [
    "DEFAULT_DATABASE_URL",
    "GroupSummary",
    "Lease",
    "LeaseHolder",
    "LeaseLocked",
    "LeaseLost",
    "SecretMissing",
    "SqlStore",
    "StoreError",
    "StoreUnavailable",
    "normalize_url",
    "upgrade_to_head",
]
