"""A small downstream store that checks fencing tokens (DESIGN 3.18), for the fencing demonstration
(tests/e2e/test_fencing_demo.py).

It is the pattern the README documents: the store keeps the highest token it has seen per
resource and refuses a write that carries a lower one, so a worker that no longer owns a resource
(a zombie: paused, partitioned, resumed after its work moved on) cannot overwrite what the new
owner wrote.

One SQLite file in WAL mode, shared by several processes (each opens its own `FencedStore`; one
per thread, as sqlite3 connections are not shared between threads):

    fence(resource TEXT PRIMARY KEY, token INTEGER)   the highest token accepted per resource
    writes(id, resource, token, writer, seq, accepted, at)
                                                      every attempt, accepted (1) or refused (0);
                                                      `id` is the commit order

`write()` is one transaction (BEGIN IMMEDIATE, so the check and the raise of the fence cannot
interleave with another writer's): accept iff there is no fence for the resource yet or
`token >= fence.token`; an accepted write raises the fence to `token` and records the row; a
refused one records the row with accepted=0 and changes nothing else.

`fenced=False` makes a naive store (no fence: every write accepted), the control the test replays
the same attempts into to show what the fence prevented.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = ["FencedStore", "WriteRow"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS fence (
    resource TEXT PRIMARY KEY,
    token INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS writes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    resource TEXT NOT NULL,
    token INTEGER NOT NULL,
    writer TEXT NOT NULL,
    seq INTEGER NOT NULL,
    accepted INTEGER NOT NULL,
    at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class WriteRow:
    """One attempted write, as the store recorded it (`id`: commit order)."""

    id: int
    resource: str
    token: int
    writer: str
    seq: int
    accepted: bool
    at: float  # time.time() inside the transaction


class FencedStore:
    """A connection to the store at `path` (created on first use)."""

    def __init__(self, path: Path | str, *, fenced: bool = True, busy_timeout_s: float = 20.0):
        self.path = Path(path)
        self.fenced = fenced
        # isolation_level=None: no implicit transactions, ours are explicit (BEGIN IMMEDIATE).
        self._db = sqlite3.connect(
            str(self.path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=True
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> FencedStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def write(
        self, resource: str, token: int, writer: str, seq: int, at: float | None = None
    ) -> bool:
        """Attempt one write; True if accepted. Always recorded in `writes`, with `at` (default:
        now; a replay passes the original's)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT token FROM fence WHERE resource = ?", (resource,)).fetchone()
            accepted = not self.fenced or row is None or token >= int(row[0])
            if accepted and self.fenced:
                db.execute(
                    "INSERT INTO fence (resource, token) VALUES (?, ?) "
                    "ON CONFLICT (resource) DO UPDATE SET token = excluded.token",
                    (resource, token),
                )
            db.execute(
                "INSERT INTO writes (resource, token, writer, seq, accepted, at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (resource, token, writer, seq, int(accepted), time.time() if at is None else at),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return accepted

    def write_locked(self, wait_s: float = 0.0) -> bool:
        """Whether another connection holds the write lock for longer than `wait_s` (a live
        writer's transactions take well under a millisecond; a paused one's do not end)."""
        probe = sqlite3.connect(str(self.path), timeout=wait_s, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                return True
            raise
        else:
            probe.execute("ROLLBACK")
            return False
        finally:
            probe.close()

    def rows(self) -> list[WriteRow]:
        """Every attempt, in commit order."""
        cur = self._db.execute(
            "SELECT id, resource, token, writer, seq, accepted, at FROM writes ORDER BY id"
        )
        return [
            WriteRow(int(i), str(r), int(t), str(w), int(s), bool(a), float(at))
            for i, r, t, w, s, a, at in cur.fetchall()
        ]

    def fences(self) -> dict[str, int]:
        """resource -> the highest token accepted."""
        return {str(r): int(t) for r, t in self._db.execute("SELECT resource, token FROM fence")}

    def replay(self, rows: Iterable[WriteRow]) -> list[WriteRow]:
        """Make the same attempts, in the same order (and with the same times), against this
        store; what it recorded."""
        for row in rows:
            self.write(row.resource, row.token, row.writer, row.seq, at=row.at)
        return self.rows()
