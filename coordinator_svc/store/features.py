"""The cluster features' finalized levels (migration 0010, DESIGN 3.19 "Feature flag"): read by
every coordinator at start and within --acl-refresh-ms after (`runtime/features.py`), set by
UpdateFeatures in one transaction with its FEATURE_UPDATED event, which names the caller and has
group id "" like every cluster-level event (DESIGN 3.17; as `acl_store` writes ACL_ADDED)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa

from coordinator_svc.core.records import EventType

from . import schema
from .acl_store import CLUSTER_EVENT_GROUP, NO_EPOCH, AclCaller
from .engine import Database


@dataclass(frozen=True, slots=True)
class FeatureChange:
    """What an update did: the level before and after, and whether it changed."""

    previous_level: int
    level: int

    @property
    def changed(self) -> bool:
        return self.previous_level != self.level


class FeatureStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    def levels(self) -> dict[str, int]:
        """Every feature's finalized level (one small read; a row of a feature this release
        does not know is returned too, and ignored by the caller)."""

        def read(conn: sa.Connection) -> dict[str, int]:
            f = schema.features.c
            return {str(r.name): int(r.level) for r in conn.execute(sa.select(f.name, f.level))}

        return self._db.retrying(False, read)

    def set_level(
        self, name: str, level: int, default_level: int, by: AclCaller, validate_only: bool = False
    ) -> FeatureChange:
        """Set `name` to `level` (a feature without a row counts as at `default_level`), with a
        FEATURE_UPDATED event naming `by` in the same transaction; nothing written when the
        level is already that, or `validate_only`. The row is locked first, so concurrent
        updates are serialized and each event's `previous_level` is the level it replaced."""
        with self._db.transaction(write=True) as conn:
            f = schema.features.c
            current = conn.execute(
                sa.select(f.level).where(f.name == name).with_for_update()
            ).scalar_one_or_none()
            previous = default_level if current is None else int(current)
            change = FeatureChange(previous, level)
            if validate_only or not change.changed:
                return change
            now = datetime.now(UTC)
            values = {"level": level, "updated_at": now, "updated_by": by.principal}
            if current is None:
                conn.execute(sa.insert(schema.features).values(name=name, **values))
            else:
                conn.execute(sa.update(schema.features).where(f.name == name).values(**values))
            payload = {
                "feature": name,
                "level": level,
                "previous_level": previous,
                "principal": by.principal,
                "address": by.address,
                "via": by.via,
            }
            conn.execute(
                sa.insert(schema.events),
                [
                    {
                        "occurred_at": now,
                        "at_ms": int(now.timestamp() * 1000),
                        "group_id": CLUSTER_EVENT_GROUP,
                        "group_epoch": NO_EPOCH,
                        "event_type": EventType.FEATURE_UPDATED.value,
                        "member_id": None,
                        "payload": payload,
                    }
                ],
            )
            return change
