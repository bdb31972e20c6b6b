"""The cluster features' levels as this process enforces them (DESIGN 3.19 "Feature flag"): read
from the database at start, re-read by the authorizer's refresher every --acl-refresh-ms (the
ACLs' cadence: one small read), and at once after this process's own UpdateFeatures. A request
reads them from memory (one attribute), so the heartbeat path touches no database for them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType

from connect_protocol.logs import fields

from ..core.features import FEATURES, GROUP_VERSION, default_levels
from ..store.features import FeatureStore

log = logging.getLogger("coordinator.features")


class FeatureLevels:
    """The finalized level of every feature this release knows. `store` None: the defaults,
    never re-read (a servicer built without one, in tests)."""

    def __init__(self, store: FeatureStore | None) -> None:
        self._store = store
        self._levels: Mapping[str, int] = MappingProxyType(default_levels())

    @property
    def levels(self) -> Mapping[str, int]:
        """Feature name -> level in force here (every known feature)."""
        return self._levels

    @property
    def group_version(self) -> int:
        return self._levels[GROUP_VERSION]

    def refresh(self) -> bool:
        """Re-read the levels; whether any changed (each change is logged). A row of a feature
        this release does not know is ignored, and a known feature without a row stays at its
        default. StoreUnavailable propagates (the caller keeps the levels in force)."""
        if self._store is None:
            return False
        stored = self._store.levels()
        levels = {name: stored.get(name, f.default_level) for name, f in FEATURES.items()}
        before = self._levels
        if levels == dict(before):
            return False
        self._levels = MappingProxyType(levels)  # swapped as one: readers see old or new
        for name, level in sorted(levels.items()):
            if before.get(name) != level:
                log.info(
                    "feature %s at level %d (was %s)",
                    name,
                    level,
                    before.get(name),
                    extra=fields(
                        event="feature_level", feature=name, level=level, previous=before.get(name)
                    ),
                )
        return True
