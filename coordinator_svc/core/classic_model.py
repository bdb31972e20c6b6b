"""Classic groups in the core's model (DESIGN 3.19): the group types, the classic states and
protocol constants, what a classic group and a classic member persist beside what every group and
member has, and the volatile join round (`ClassicRound`) with its delta (`RoundDelta`).

A classic member reuses `Member`: its held set is `assigned`, what it was told to stop and has not
released is `pending_revocation`, its tokens, principal, url and rebalance timeout are the
member's, and `member_epoch` is the last generation it joined; `Member.classic` holds the rest.
So the owner index of `GroupState` asserts single ownership for classic members too (3.11).

The round (who rejoined this phase and in what order, the ids handed out with
MEMBER_ID_REQUIRED, who still has to sync, whose SyncGroup is parked) is never persisted
(3.19 "Takeover"). It changes only through `ClassicRoundRecord`s carrying a `RoundDelta`, applied
in place at the cost of what changed (a 10,000-member barrier costs O(1) per join, 3.21), and
taken back like any record when a commit fails (`remember` gives the inverse).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from connect_protocol.classic_messages import (
    PROTOCOL_TYPE,
    PROTOCOL_VERSIONS,
    ClassicProtocol,
    protocol_version,
)
from connect_protocol.configs import GROUP_TYPE_CLASSIC, GROUP_TYPE_CONNECT
from connect_protocol.resources import EMPTY, ResourceSet

__all__ = [
    "KNOWN_GROUP_TYPES",
    "PROTOCOL_TYPE",
    "PROTOCOL_VERSIONS",
    "AcceptedAssignment",
    "ClassicGroupMeta",
    "ClassicMemberInfo",
    "ClassicProtocol",
    "ClassicRound",
    "ClassicState",
    "GroupType",
    "PendingId",
    "RoundChange",
    "RoundDelta",
    "protocol_version",
]


class GroupType(StrEnum):
    """The protocol a group speaks (DESIGN 3.19); stored in `groups.group_type`."""

    CONNECT = GROUP_TYPE_CONNECT
    CLASSIC = GROUP_TYPE_CLASSIC


#: The group types this code can load; a group of another type (written by a newer release) is
#: refused at load, never rewritten (3.19 "Takeover").
KNOWN_GROUP_TYPES: frozenset[str] = frozenset(t.value for t in GroupType)


class ClassicState(StrEnum):
    """Kafka's classic group states (ClassicGroupState), named for what the group waits on."""

    EMPTY = "EMPTY"
    PREPARING_REBALANCE = "PREPARING_REBALANCE"  # the join phase: members rejoin
    COMPLETING_REBALANCE = "COMPLETING_REBALANCE"  # the generation is set: the leader's sync
    STABLE = "STABLE"  # the leader's assignments accepted


@dataclass(frozen=True, slots=True)
class ClassicGroupMeta:
    """What a classic group persists beside `GroupMeta` (its generation is the group epoch:
    one counter, 3.19 "Empty conversions").

    Attributes:
        state: the classic state (a new owner loads PREPARING or COMPLETING as PREPARING).
        protocol_name: the current generation's protocol; None before the first generation
            and after a generation completed with no members.
        leader_id: the current generation's leader; None when there is none.
    """

    state: ClassicState = ClassicState.EMPTY
    protocol_name: str | None = None
    leader_id: str | None = None


@dataclass(frozen=True, slots=True)
class AcceptedAssignment:
    """A member's share of the leader's accepted assignments for one generation: what its
    SyncGroup is answered (retries in STABLE too, after a takeover).

    Attributes:
        generation: the generation it was accepted for.
        version: the embedded protocol version of that generation.
        assignment: version 0: the whole set; versions 1-2: what is newly given.
        revoked: versions 1-2: what it must stop; None in version 0.
        delay: the leader's scheduled rebalance delay (ms).
        answered: whether its SyncGroup of that generation was answered (the first answer
            emits the delivery events; retries write nothing).
    """

    generation: int
    version: int
    assignment: ResourceSet = EMPTY
    revoked: ResourceSet | None = None
    delay: int = 0
    answered: bool = False


@dataclass(frozen=True, slots=True)
class ClassicMemberInfo:
    """What a classic member persists beside `Member` (`Member.classic`; None for members of
    the connect protocol).

    Attributes:
        protocols: the protocols it supports with its metadata for each, most preferred first.
        session_timeout_ms: its own session timeout (classic members choose theirs).
        last_joined_generation: the last generation whose join phase it completed in.
        accepted: its share of the last accepted assignments, or None.
    """

    protocols: tuple[ClassicProtocol, ...]
    session_timeout_ms: int
    last_joined_generation: int = 0
    accepted: AcceptedAssignment | None = None

    def protocol(self, name: str) -> ClassicProtocol | None:
        for p in self.protocols:
            if p.name == name:
                return p
        return None

    def protocol_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.protocols)


@dataclass(frozen=True, slots=True)
class PendingId:
    """A member id handed out with MEMBER_ID_REQUIRED whose JoinGroup has not arrived (KIP-394):
    bound to the caller's principal, it holds the join barrier until it joins or lapses."""

    principal: str
    session_timeout_ms: int
    expires_at_ms: int


# --- the volatile round -------------------------------------------------------------------

#: The scalar fields of a round, which a delta sets when it names them.
_SCALARS = (
    "initial",
    "initial_remaining_ms",
    "new_member_added",
    "reason",
    "started_at_ms",
    "join_seq",
    "leader_unavailable_reason",
    "join_deadline_ms",
    "sync_deadline_ms",
    "takeover_from",
)


class ClassicRound:
    """A classic group's volatile state (never persisted), in `GroupState.round`. Changed only
    by `apply` (through replay); read by handlers through `RoundChange`.

    Attributes:
        joined: member id -> its join order in this phase (who has rejoined).
        pending_ids: MEMBER_ID_REQUIRED ids not yet joined.
        awaiting_sync: members of the generation whose SyncGroup has not been answered.
        parked_sync: members whose SyncGroup waits for the leader's.
        initial: whether the phase started from EMPTY (the initial delay applies).
        initial_remaining_ms: what is left of the initial delay's extensions.
        new_member_added: a member joined since the last initial-delay step.
        reason: why the current (or last) rebalance started.
        started_at_ms: when it started.
        join_seq: the next join order number.
        leader_unavailable_reason: why no leader can be chosen ("" when one can).
        join_deadline_ms: when the armed join-phase timer is due (a timer firing earlier is
            stale and re-armed; 0: none armed).
        sync_deadline_ms: when the generation's sync deadline is due (0: none armed).
        takeover_from: the state this process loaded the group in when its load made it
            PREPARING_REBALANCE ("" otherwise); the join phase's completion records it as
            the rebalance's CLASSIC_REBALANCE_STARTED (the load itself writes nothing).
    """

    __slots__ = ("joined", "pending_ids", "awaiting_sync", "parked_sync", *_SCALARS)

    def __init__(self) -> None:
        self.joined: dict[str, int] = {}
        self.pending_ids: dict[str, PendingId] = {}
        self.awaiting_sync: set[str] = set()
        self.parked_sync: set[str] = set()
        self.initial = False
        self.initial_remaining_ms = 0
        self.new_member_added = False
        self.reason = ""
        self.started_at_ms = 0
        self.join_seq = 0
        self.leader_unavailable_reason = ""
        self.join_deadline_ms = 0
        self.sync_deadline_ms = 0
        self.takeover_from = ""

    def copy(self) -> ClassicRound:
        """A copy later changes to this round do not reach (O(round))."""
        out = ClassicRound()
        out.joined = dict(self.joined)
        out.pending_ids = dict(self.pending_ids)
        out.awaiting_sync = set(self.awaiting_sync)
        out.parked_sync = set(self.parked_sync)
        for name in _SCALARS:
            setattr(out, name, getattr(self, name))
        return out

    def is_idle(self) -> bool:
        """Nothing in flight: no one joined, pending, awaiting or parked."""
        return not (self.joined or self.pending_ids or self.awaiting_sync or self.parked_sync)

    def snapshot(self) -> dict[str, Any]:
        """Every field, copied (for tests and describe)."""
        return {
            "joined": dict(self.joined),
            "pending_ids": dict(self.pending_ids),
            "awaiting_sync": set(self.awaiting_sync),
            "parked_sync": set(self.parked_sync),
            **{name: getattr(self, name) for name in _SCALARS},
        }

    def apply(self, delta: RoundDelta) -> None:
        """Apply `delta` in place: O(what it names), but for `cleared` and a replaced
        `awaiting_sync` (a completion: O(members) anyway)."""
        if delta.cleared:
            self.joined.clear()
            self.awaiting_sync.clear()
            self.parked_sync.clear()
        for member_id in delta.unjoined:
            self.joined.pop(member_id, None)
        self.joined.update(delta.joined)
        for pending_id in delta.pending_dropped:
            self.pending_ids.pop(pending_id, None)
        self.pending_ids.update(delta.pending_put)
        if delta.awaiting_sync is not None:
            self.awaiting_sync = set(delta.awaiting_sync)
        self.awaiting_sync.difference_update(delta.synced)
        self.parked_sync.difference_update(delta.unparked)
        self.parked_sync.update(delta.parked)
        for name, value in delta.scalars.items():
            setattr(self, name, value)

    def remember(self, delta: RoundDelta) -> Callable[[ClassicRound], None]:
        """The inverse of applying `delta` to this round as it is now: a step that puts back
        every field `delta` touches (O(what it names); whole copies only where it clears or
        replaces)."""
        whole = delta.cleared
        joined: dict[str, int | None] | dict[str, int]
        if whole:
            joined = dict(self.joined)
        else:
            joined = {m: self.joined.get(m) for m in (*delta.unjoined, *delta.joined)}
        pending = {p: self.pending_ids.get(p) for p in (*delta.pending_dropped, *delta.pending_put)}
        awaiting: set[str] | None = None
        awaiting_touched: dict[str, bool] = {}
        if whole or delta.awaiting_sync is not None:
            awaiting = set(self.awaiting_sync)
        else:
            awaiting_touched = {m: m in self.awaiting_sync for m in delta.synced}
        parked: set[str] | None = None
        parked_touched: dict[str, bool] = {}
        if whole:
            parked = set(self.parked_sync)
        else:
            parked_touched = {m: m in self.parked_sync for m in (*delta.parked, *delta.unparked)}
        scalars = {name: getattr(self, name) for name in delta.scalars}

        def restore(r: ClassicRound) -> None:
            if whole:
                r.joined = dict(joined)  # type: ignore[arg-type]
            else:
                for m, seq in joined.items():
                    if seq is None:
                        r.joined.pop(m, None)
                    else:
                        r.joined[m] = seq
            for p, was in pending.items():
                if was is None:
                    r.pending_ids.pop(p, None)
                else:
                    r.pending_ids[p] = was
            if awaiting is not None:
                r.awaiting_sync = set(awaiting)
            for m, present in awaiting_touched.items():
                (r.awaiting_sync.add if present else r.awaiting_sync.discard)(m)
            if parked is not None:
                r.parked_sync = set(parked)
            for m, present in parked_touched.items():
                (r.parked_sync.add if present else r.parked_sync.discard)(m)
            for name, value in scalars.items():
                setattr(r, name, value)

        return restore


_NO_IDS: frozenset[str] = frozenset()
_NO_MAP: Mapping[str, Any] = MappingProxyType({})


def _no_map() -> Mapping[str, Any]:
    return _NO_MAP


@dataclass(frozen=True, slots=True)
class RoundDelta:
    """A change of a `ClassicRound`, applied in this order: `cleared` (joined, awaiting and
    parked emptied), `unjoined` then `joined`, `pending_dropped` then `pending_put`,
    `awaiting_sync` (replaces the set when not None) then `synced` (removed from it),
    `unparked` then `parked`, then the `scalars` (a field of `ClassicRound` -> its value)."""

    cleared: bool = False
    joined: Mapping[str, int] = field(default_factory=_no_map)
    unjoined: frozenset[str] = _NO_IDS
    pending_put: Mapping[str, PendingId] = field(default_factory=_no_map)
    pending_dropped: frozenset[str] = _NO_IDS
    awaiting_sync: frozenset[str] | None = None
    synced: frozenset[str] = _NO_IDS
    parked: frozenset[str] = _NO_IDS
    unparked: frozenset[str] = _NO_IDS
    scalars: Mapping[str, Any] = field(default_factory=_no_map)

    def __post_init__(self) -> None:
        unknown = set(self.scalars) - set(_SCALARS)
        if unknown:
            raise ValueError(f"not fields of a classic round: {sorted(unknown)}")


class RoundChange:
    """A handler's working view of a group's round: the committed round (or none) with this
    change's edits on top, read and written at O(1) per member; `delta()` is what they add up
    to (one `RoundDelta` per change)."""

    def __init__(self, base: ClassicRound | None) -> None:
        self._base = base if base is not None else ClassicRound()
        self._cleared = False
        self._joined: dict[str, int] = {}
        self._unjoined: set[str] = set()
        self._pending_put: dict[str, PendingId] = {}
        self._pending_dropped: set[str] = set()
        self._awaiting: set[str] | None = None
        self._synced: set[str] = set()
        self._parked: set[str] = set()
        self._unparked: set[str] = set()
        self._scalars: dict[str, Any] = {}

    # --- reads ---

    def joined_seq(self, member_id: str) -> int | None:
        """The member's join order in this phase, or None if it has not rejoined."""
        if member_id in self._joined:
            return self._joined[member_id]
        if self._cleared or member_id in self._unjoined:
            return None
        return self._base.joined.get(member_id)

    def has_joined(self, member_id: str) -> bool:
        return self.joined_seq(member_id) is not None

    def joined_count(self) -> int:
        """How many members have rejoined this phase: O(members changed in this change)."""
        base = {} if self._cleared else self._base.joined
        gone = sum(1 for m in self._unjoined if m in base)
        new = sum(1 for m in self._joined if m not in base)
        return len(base) - gone + new

    def pending_count(self) -> int:
        """How many MEMBER_ID_REQUIRED ids are outstanding: O(ids changed in this change)."""
        base = self._base.pending_ids
        dropped = sum(1 for p in self._pending_dropped if p in base)
        put = sum(1 for p in self._pending_put if p not in base)
        return len(base) - dropped + put

    def joined(self) -> dict[str, int]:
        """Every member that rejoined this phase -> its order (O(members))."""
        out = {} if self._cleared else dict(self._base.joined)
        for m in self._unjoined:
            out.pop(m, None)
        out.update(self._joined)
        return out

    def pending(self, pending_id: str) -> PendingId | None:
        if pending_id in self._pending_put:
            return self._pending_put[pending_id]
        if pending_id in self._pending_dropped:
            return None
        return self._base.pending_ids.get(pending_id)

    def pending_ids(self) -> dict[str, PendingId]:
        out = dict(self._base.pending_ids)
        for p in self._pending_dropped:
            out.pop(p, None)
        out.update(self._pending_put)
        return out

    def has_pending_ids(self) -> bool:
        """O(ids dropped in this change)."""
        if self._pending_put:
            return True
        base = self._base.pending_ids
        return sum(1 for p in self._pending_dropped if p in base) < len(base)

    def is_awaiting_sync(self, member_id: str) -> bool:
        if member_id in self._synced:
            return False
        if self._awaiting is not None:
            return member_id in self._awaiting
        return not self._cleared and member_id in self._base.awaiting_sync

    def awaiting_sync(self) -> set[str]:
        base = (
            self._awaiting
            if self._awaiting is not None
            else (set() if self._cleared else self._base.awaiting_sync)
        )
        return set(base) - self._synced

    def is_parked(self, member_id: str) -> bool:
        if member_id in self._parked:
            return True
        if member_id in self._unparked or self._cleared:
            return False
        return member_id in self._base.parked_sync

    def parked_sync(self) -> set[str]:
        out = set() if self._cleared else set(self._base.parked_sync)
        return (out - self._unparked) | self._parked

    def get(self, name: str) -> Any:
        """A scalar field of the round as this change leaves it."""
        if name in self._scalars:
            return self._scalars[name]
        return getattr(self._base, name)

    @property
    def initial(self) -> bool:
        return bool(self.get("initial"))

    @property
    def initial_remaining_ms(self) -> int:
        return int(self.get("initial_remaining_ms"))

    @property
    def new_member_added(self) -> bool:
        return bool(self.get("new_member_added"))

    @property
    def reason(self) -> str:
        return str(self.get("reason"))

    @property
    def started_at_ms(self) -> int:
        return int(self.get("started_at_ms"))

    @property
    def leader_unavailable_reason(self) -> str:
        return str(self.get("leader_unavailable_reason"))

    # --- writes ---

    def join(self, member_id: str) -> int:
        """Mark `member_id` as rejoined this phase (keeping its order if it already had);
        returns its order."""
        seq = self.joined_seq(member_id)
        if seq is not None:
            return seq
        seq = int(self.get("join_seq"))
        self._joined[member_id] = seq
        self._unjoined.discard(member_id)
        self._scalars["join_seq"] = seq + 1
        return seq

    def unjoin(self, member_id: str) -> None:
        self._joined.pop(member_id, None)
        self._unjoined.add(member_id)

    def clear(self) -> None:
        """A new phase: nobody joined, awaiting or parked (pending ids stay)."""
        self._cleared = True
        self._joined.clear()
        self._unjoined.clear()
        self._awaiting = None
        self._synced.clear()
        self._parked.clear()
        self._unparked.clear()

    def put_pending(self, pending_id: str, pending: PendingId) -> None:
        self._pending_dropped.discard(pending_id)
        self._pending_put[pending_id] = pending

    def drop_pending(self, pending_id: str) -> None:
        self._pending_put.pop(pending_id, None)
        self._pending_dropped.add(pending_id)

    def set_awaiting_sync(self, member_ids: Iterable[str]) -> None:
        self._awaiting = set(member_ids)
        self._synced.clear()

    def mark_synced(self, member_id: str) -> None:
        if self._awaiting is not None:
            self._awaiting.discard(member_id)
        else:
            self._synced.add(member_id)

    def park(self, member_id: str) -> None:
        self._unparked.discard(member_id)
        self._parked.add(member_id)

    def unpark(self, member_id: str) -> None:
        self._parked.discard(member_id)
        self._unparked.add(member_id)

    def set(self, **scalars: Any) -> None:
        unknown = set(scalars) - set(_SCALARS)
        if unknown:
            raise ValueError(f"not fields of a classic round: {sorted(unknown)}")
        self._scalars.update(scalars)

    def delta(self) -> RoundDelta | None:
        """What this change adds up to, or None when it changed nothing."""
        changed = (
            self._cleared
            or self._joined
            or self._unjoined
            or self._pending_put
            or self._pending_dropped
            or self._awaiting is not None
            or self._synced
            or self._parked
            or self._unparked
            or any(getattr(self._base, k) != v for k, v in self._scalars.items())
        )
        if not changed:
            return None
        return RoundDelta(
            cleared=self._cleared,
            joined=MappingProxyType(dict(self._joined)),
            unjoined=frozenset(self._unjoined),
            pending_put=MappingProxyType(dict(self._pending_put)),
            pending_dropped=frozenset(self._pending_dropped),
            awaiting_sync=None if self._awaiting is None else frozenset(self._awaiting),
            synced=frozenset(self._synced),
            parked=frozenset(self._parked),
            unparked=frozenset(self._unparked),
            scalars=MappingProxyType(dict(self._scalars)),
        )
