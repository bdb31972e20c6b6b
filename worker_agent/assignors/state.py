"""The IncrementalCooperative assignor's memory between rounds: the `assignor_state` blob.

The coordinator stores the blob with each installed target and hands it to whichever member
computes the next one (DESIGN 3.5), so everything a delay needs lives here. The encoding is JSON,
versioned and tolerant: an empty, undecodable or unknown-version blob decodes as "no state".

Format (version 1; keys sorted, no spaces)::

    {"version": 1,
     "deadline_ms": 12345 | null,       # the lost-work delay's end; null when none runs
     "held": [{"member_id": "w2", "instance_id": "i2" | null,
               "resources": {"connectors": ["B"], "tasks": [{"connector": "A", "task": 1}]}}],
     "instances": {"w1": "i1"},         # instance ids of the members this round saw
     # Paced waves (DESIGN 3.18), each key present only when set:
     "wave": [{"member_id": "w4", "resources": {...}}],  # in motion: moved to w4, not yet seen
     "wave_delivered_ms": 12000,        # latest grant time seen of the wave's receivers
     "next_wave_ms": 15000}             # the deadline asked for the next wave (or to look again)

The paced-wave keys were added without a version bump: they are written only when set, so a
state without a wave plan encodes exactly as before (byte for byte), a blob from before them
decodes as it did, and an assignor from before them reads a newer blob's delay and held shares
and ignores the wave plan (it balances at once, as it always did). Malformed wave keys drop the
wave bookkeeping only (pacing starts afresh), never the held shares.

Encoding and decoding are linear in the size of the state (the only sorts are the ones the
format prescribes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from connect_protocol.resources import ResourceSet

__all__ = [
    "STATE_VERSION",
    "AssignorState",
    "HeldShare",
    "WaveShare",
    "decode_state",
    "encode_state",
]

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
class WaveShare:
    """Resources a paced wave moved to one member for balancing, not yet seen delivered.

    Attributes:
        member_id: the receiver (their new owner).
        resources: what was moved to it and did not yet show in its owned list.
    """

    member_id: str
    resources: ResourceSet


@dataclass(frozen=True, slots=True)
class AssignorState:
    """The decoded blob. `AssignorState()` is "no state".

    Attributes:
        deadline_ms: when the running lost-work delay ends (coordinator clock), or None.
        held: the shares held back, one per departed member, sorted by member id.
        instances: member id -> instance id of the members present in the round that wrote it,
            so that the next round knows the instance id of a member that departs meanwhile.
        wave: the resources in motion for balancing (DESIGN 3.18), per receiver, sorted by
            member id: moved by a paced wave and not yet in their new owner's owned list.
        wave_delivered_ms: the latest grant time (`MemberView.last_grant_at_ms`) seen of the
            receivers of the current or last wave whose resources have arrived, or None; once
            the wave is all delivered, the next wave is due `rebalance.wave.pause.ms` after it.
        next_wave_ms: the deadline this state asked for the next wave (or to look again whether
            the wave in motion has arrived), or None: beside `deadline_ms`, the other reason
            for the one scheduled rebalance.
    """

    deadline_ms: int | None = None
    held: tuple[HeldShare, ...] = ()
    instances: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    wave: tuple[WaveShare, ...] = ()
    wave_delivered_ms: int | None = None
    next_wave_ms: int | None = None

    def held_resources(self) -> ResourceSet:
        """Every resource held back, whoever it is held for."""
        return ResourceSet(
            frozenset().union(*(share.resources.connectors for share in self.held)),
            frozenset().union(*(share.resources.tasks for share in self.held)),
        )


def encode_state(state: AssignorState) -> bytes:
    """The blob for `state`, deterministic (equal states give equal bytes)."""
    document = {
        "version": STATE_VERSION,
        "deadline_ms": state.deadline_ms,
        "held": [
            {
                "member_id": share.member_id,
                "instance_id": share.instance_id,
                "resources": _resources_json(share.resources),
            }
            for share in sorted(state.held, key=lambda s: s.member_id)
        ],
        "instances": dict(sorted(state.instances.items())),
    }
    if state.wave:  # the paced-wave keys only when set: no plan, the same bytes as before them
        document["wave"] = [
            {"member_id": share.member_id, "resources": _resources_json(share.resources)}
            for share in sorted(state.wave, key=lambda s: s.member_id)
        ]
    if state.wave_delivered_ms is not None:
        document["wave_delivered_ms"] = state.wave_delivered_ms
    if state.next_wave_ms is not None:
        document["next_wave_ms"] = state.next_wave_ms
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


_TASK_FIELDS = attrgetter("connector", "task")


def _resources_json(resources: ResourceSet) -> dict[str, object]:
    """`resources.to_json()`, sorting tasks as (connector, task) tuples: the same order as
    `TaskId`'s, without calling its `__lt__` for every comparison."""
    return {
        "connectors": sorted(resources.connectors),
        "tasks": [
            {"connector": connector, "task": task}
            for connector, task in sorted(map(_TASK_FIELDS, resources.tasks))
        ],
    }


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
    deadline = _time(document.get("deadline_ms"), "deadline_ms")
    held = tuple(_share(entry) for entry in document.get("held", []))
    instances = document.get("instances", {})
    if not isinstance(instances, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in instances.items()
    ):
        raise ValueError("instances must map member ids to instance ids")
    state = AssignorState(deadline, held, MappingProxyType(dict(instances)))
    try:  # the wave bookkeeping alone is dropped if malformed (the held shares are kept)
        wave = tuple(_wave_share(entry) for entry in document.get("wave", []))
        delivered = _time(document.get("wave_delivered_ms"), "wave_delivered_ms")
        next_wave = _time(document.get("next_wave_ms"), "next_wave_ms")
    except (ValueError, TypeError, KeyError, AttributeError):
        return state
    return replace(
        state,
        wave=tuple(s for s in wave if s.resources),
        wave_delivered_ms=delivered,
        next_wave_ms=next_wave,
    )


def _time(value: Any, name: str) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{name} must be an integer or null")
    return value


def _wave_share(entry: Any) -> WaveShare:
    member_id = entry["member_id"]
    if not isinstance(member_id, str):
        raise ValueError("member_id must be a string")
    return WaveShare(member_id, _resources(entry["resources"]))


def _share(entry: Any) -> HeldShare:
    member_id, instance_id = entry["member_id"], entry.get("instance_id")
    if not isinstance(member_id, str) or not (instance_id is None or isinstance(instance_id, str)):
        raise ValueError("member_id must be a string and instance_id a string or null")
    return HeldShare(member_id, instance_id, _resources(entry["resources"]))


def _resources(resources: Any) -> ResourceSet:
    if not isinstance(resources, dict):
        raise ValueError("resources must be an object")
    for task in resources.get("tasks", []):
        if not isinstance(task, dict) or type(task["task"]) is not int:
            raise ValueError("tasks must be objects with an integer task number")
    return _only_valid(ResourceSet.from_json(resources))


def _only_valid(resources: ResourceSet) -> ResourceSet:
    """Drop names no catalogue can hold (empty names, negative task numbers)."""
    return ResourceSet(
        frozenset(c for c in resources.connectors if c),
        frozenset(t for t in resources.tasks if t.connector and t.task >= 0),
    )
