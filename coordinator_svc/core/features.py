"""Cluster features (DESIGN 3.19 "Feature flag"), modelled on Kafka's finalized features: a name,
the levels this release supports, and the level new and migrated databases start at. The level in
force is held in the database (`store/features.py`) and kept in each coordinator's memory
(`runtime/features.py`); the handlers are given it as a plain value. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from connect_protocol.errors import InvalidRequest, InvalidUpdateVersion

#: Kafka's name for the feature that switches the new group protocol (here: the connect one).
GROUP_VERSION = "group.version"
#: The group.version level from which new members are admitted with the connect protocol.
CONNECT_PROTOCOL_LEVEL = 1
#: The longest feature name accepted (the column's width; Kafka's are far shorter).
MAX_FEATURE_NAME_LENGTH = 64
#: How much of a refused name an error message shows.
_SHOWN_NAME = 80


@dataclass(frozen=True, slots=True)
class Feature:
    """A feature this release knows.

    Attributes:
        name: Kafka's name, e.g. `group.version`.
        min_level: the lowest level this release serves.
        max_level: the highest level this release serves.
        default_level: the level a new or migrated database starts at (migration 0010).
        doc: what the levels mean.
    """

    name: str
    min_level: int
    max_level: int
    default_level: int
    doc: str

    def supports(self, level: int) -> bool:
        return self.min_level <= level <= self.max_level


FEATURES: dict[str, Feature] = {
    GROUP_VERSION: Feature(
        GROUP_VERSION,
        min_level=0,
        max_level=1,
        default_level=1,
        doc="1: the connect protocol (ConnectGroupHeartbeat) admits new members; 0: it admits "
        "none (members already admitted are served; the classic protocol always is)",
    ),
}
"""Every feature, by name."""


def default_levels() -> dict[str, int]:
    """Each feature at the level a new database starts at."""
    return {name: feature.default_level for name, feature in FEATURES.items()}


def check_update(name: str, level: int) -> Feature:
    """The feature an UpdateFeatures may set `name` to `level` on. INVALID_REQUEST for a
    malformed name (empty, too long, a NUL), INVALID_UPDATE_VERSION for a feature this release
    does not know or a level outside its supported range; the messages say what is served."""
    if not name:
        raise InvalidRequest(f"feature must be non-empty (known: {_known()}).")
    if len(name) > MAX_FEATURE_NAME_LENGTH or "\x00" in name:
        raise InvalidRequest(
            f"feature must be at most {MAX_FEATURE_NAME_LENGTH} characters without NUL "
            f"(known: {_known()})."
        )
    feature = FEATURES.get(name)
    if feature is None:
        raise InvalidUpdateVersion(
            f"unknown feature {name[:_SHOWN_NAME]!r}; this coordinator knows {_known()}."
        )
    if not feature.supports(level):
        raise InvalidUpdateVersion(
            f"{name} level {level} is not supported: this coordinator serves levels "
            f"{feature.min_level} to {feature.max_level} ({feature.doc})."
        )
    return feature


def _known() -> str:
    return ", ".join(sorted(FEATURES))
