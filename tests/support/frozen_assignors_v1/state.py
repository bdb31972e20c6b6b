"""The IncrementalCooperative assignor's memory between rounds: the `assignor_state` blob.

The coordinator stores the blob with each installed target and hands it to whichever member
computes the next one (DESIGN 3.5), so everything a delay needs lives here. The encoding is JSON,
versioned and tolerant: an empty, undecodable or unknown-version blob decodes as "no state".

Format (version 1; keys sorted, no spaces)::

    {"version": 1,
     "deadline_ms": 12345 | null,       # coordinator clock; null when no delay runs
     "held": [{"member_id": "w2", "instance_id": "i2" | null,
               "resources": {"connectors": ["B"], "tasks": [{"connector": "A", "task": 1}]}}],
     "instances": {"w1": "i1"}}         # instance ids of the members this round saw
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from connect_protocol.resources import EMPTY, ResourceSet

__all__ = ["STATE_VERSION", "AssignorState", "HeldShare", "decode_state", "encode_state"]

STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class HeldShare:
    """Resources lost with a departed member, held back for it while a delay runs.

    Attributes:
        member_id: the departed member's id.
        instance_id: its instance id, if it had one (a successor presenting it gets the share).
        resources: what it was assigned and nobody else has been given since.
    """

    member_id: str
    instance_id: str | None
    resources: ResourceSet


@dataclass(frozen=True, slots=True)
class AssignorState:
    """The decoded blob. `AssignorState()` is "no state".

    Attributes:
        deadline_ms: when the running delay ends (coordinator clock), or None.
        held: the shares held back, one per departed member, sorted by member id.
        instances: member id -> instance id of the members present in the round that wrote it,
            so that the next round knows the instance id of a member that departs meanwhile.
    """

    deadline_ms: int | None = None
    held: tuple[HeldShare, ...] = ()
    instances: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def held_resources(self) -> ResourceSet:
        """Every resource held back, whoever it is held for."""
        out = EMPTY
        for share in self.held:
            out = out | share.resources
        return out


def encode_state(state: AssignorState) -> bytes:
    """The blob for `state`, deterministic (equal states give equal bytes)."""
    document = {
        "version": STATE_VERSION,
        "deadline_ms": state.deadline_ms,
        "held": [
            {
                "member_id": share.member_id,
                "instance_id": share.instance_id,
                "resources": share.resources.to_json(),
            }
            for share in sorted(state.held, key=lambda s: s.member_id)
        ],
        "instances": dict(sorted(state.instances.items())),
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def decode_state(blob: bytes) -> AssignorState:
    """The state in `blob`; "no state" if it is empty, malformed or of another version."""
    if not blob:
        return AssignorState()
    try:
        return _decode(json.loads(blob.decode()))
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
        return AssignorState()


def _decode(document: Any) -> AssignorState:
    if not isinstance(document, dict) or document.get("version") != STATE_VERSION:
        return AssignorState()
    deadline = document.get("deadline_ms")
    if deadline is not None and (not isinstance(deadline, int) or isinstance(deadline, bool)):
        raise ValueError("deadline_ms must be an integer or null")
    held = tuple(_share(entry) for entry in document.get("held", []))
    instances = document.get("instances", {})
    if not isinstance(instances, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in instances.items()
    ):
        raise ValueError("instances must map member ids to instance ids")
    return AssignorState(deadline, held, MappingProxyType(dict(instances)))


def _share(entry: Any) -> HeldShare:
    member_id, instance_id = entry["member_id"], entry.get("instance_id")
    if not isinstance(member_id, str) or not (instance_id is None or isinstance(instance_id, str)):
        raise ValueError("member_id must be a string and instance_id a string or null")
    resources = entry["resources"]
    if not isinstance(resources, dict):
        raise ValueError("resources must be an object")
    for task in resources.get("tasks", []):
        if not isinstance(task, dict) or type(task["task"]) is not int:
            raise ValueError("tasks must be objects with an integer task number")
    parsed = ResourceSet.from_json(resources)
    return HeldShare(member_id, instance_id, _only_valid(parsed))


def _only_valid(resources: ResourceSet) -> ResourceSet:
    """Drop names no catalogue can hold (empty names, negative task numbers)."""
    return ResourceSet(
        frozenset(c for c in resources.connectors if c),
        frozenset(t for t in resources.tasks if t.connector and t.task >= 0),
    )
