"""Upper estimates of how large a group makes its PrepareAssignment answer, so that a catalogue
too large for the configured message size is refused when it is put, not discovered when an
assignor member's Prepare fails (issue 10).

Pure arithmetic over protobuf's encoding: a string field costs its length plus a tag and a
length prefix, an integer a tag and up to five bytes. Each task may appear three times in one
answer (in its member's owned list, in the current target, and in the assignor state's held
shares, as JSON), each connector the same plus its spec with the whole config.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Bytes per member besides the resources: member id (twice), instance id, url, the assignor
#: with its metadata, its target entry, its line in the assignor state.
MEMBER_BYTES = 400
#: The answer's fixed part: epochs, assignor name, configs, coordinator time.
FIXED_BYTES = 1_024


def _string(text: str) -> int:
    return len(text.encode()) + 3  # tag, length (up to two bytes for short strings)


def connector_bytes(name: str, task_count: int, config: Mapping[str, str]) -> int:
    """What one connector adds to a Prepare answer, at most."""
    spec = _string(name) + 6 + sum(_string(k) + _string(v) + 4 for k, v in config.items())
    as_resource = 2 * _string(name) + len(name) + 20  # owned, target, held (JSON)
    per_task = 2 * (_string(name) + 8) + len(name) + 30
    return spec + as_resource + task_count * per_task


def prepare_bytes(catalogue_bytes: int, member_count: int) -> int:
    """An upper estimate of a Prepare answer's size."""
    return FIXED_BYTES + catalogue_bytes + member_count * MEMBER_BYTES


def config_bytes(config: Mapping[str, str]) -> int:
    """The UTF-8 bytes of a config's keys and values."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in config.items())
