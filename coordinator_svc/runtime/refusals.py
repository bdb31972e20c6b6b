"""How the runtime refuses a request it cannot serve: a database failure named by its kind
(the driver's text only in the log, at most every UNAVAILABLE_LOG_INTERVAL_S), and
NOT_COORDINATOR naming the process that serves the group (DESIGN 3.16)."""

from __future__ import annotations

import logging
import time

from connect_protocol.errors import CoordinatorNotAvailable, NotCoordinator
from connect_protocol.logs import fields

from ..store.errors import LeaseHolder, LeaseLocked, StoreUnavailable

log = logging.getLogger("coordinator")

#: How often a database failure met by requests is logged (with its detail) at most.
UNAVAILABLE_LOG_INTERVAL_S = 10.0
_unavailable_logged = {"at": -UNAVAILABLE_LOG_INTERVAL_S}
#: Modules whose exceptions carry the database's or the driver's text.
DATABASE_MODULES = ("sqlalchemy", "psycopg", "sqlite3", "alembic")


def database_unavailable(error: StoreUnavailable) -> CoordinatorNotAvailable:
    """What a client is told of a database failure: its kind, no host, port or driver text
    (those are logged, at most every UNAVAILABLE_LOG_INTERVAL_S). A lease row locked by another
    process (LeaseLocked) is no database failure: the answer names that process."""
    now = time.monotonic()
    if now - _unavailable_logged["at"] >= UNAVAILABLE_LOG_INTERVAL_S:
        _unavailable_logged["at"] = now
        event = "lease_locked" if isinstance(error, LeaseLocked) else "database_unavailable"
        log.warning("a request failed: %s", error, extra=fields(event=event, kind=error.kind))
    return CoordinatorNotAvailable(error.client_message)


def failure_for_client(error: Exception) -> str:
    """A failure named for a client: the database's failure kind, or the exception's type
    unless it comes from the database's libraries (their names are driver text)."""
    if isinstance(error, StoreUnavailable):
        return error.client_message.removesuffix("; retry.")
    if type(error).__module__.split(".")[0] in DATABASE_MODULES:
        return "a database error"
    return type(error).__name__


class NotOwner(NotCoordinator):
    """NOT_COORDINATOR, with the address of the process that serves the group."""

    def __init__(self, group_id: str, holder: LeaseHolder) -> None:
        super().__init__(not_coordinator_message(group_id, holder))
        self.owner_address = holder.advertised_address


def not_coordinator_message(group_id: str, holder: LeaseHolder) -> str:
    return (
        f"group {group_id!r} is served by the coordinator at {holder.advertised_address} "
        f"({holder.owner_id}); send its requests there."
    )
