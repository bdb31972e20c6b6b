"""The classic JoinGroup (DESIGN 3.19): MEMBER_ID_REQUIRED ids bound to the caller's principal, a
pending id becoming a member, an existing member rejoining (what its allocation no longer names
is released), and the per-state rules that start a rebalance, park the call until the join
phase completes, or answer with the current generation at once.

Behaviour as Kafka's GroupMetadataManager documents it (`classicGroupJoinNewDynamicMember`,
`classicGroupJoinExistingMember`, `addMemberThenRebalanceOrCompleteJoin`,
`updateMemberThenRebalanceOrCompleteJoin`, `acceptJoiningMember`; ClassicGroup
`supportsProtocols`); the handler reads no clock and makes no id: the caller passes `now_ms`
and the id a MEMBER_ID_REQUIRED answer hands out (`new_member_id`).
"""

from __future__ import annotations

from dataclasses import replace

from connect_protocol.classic_messages import (
    JoinGroupRequest,
    JoinGroupResponse,
    protocol_version,
)
from connect_protocol.errors import (
    CoordinatorError,
    ErrorCode,
    GroupAuthorizationFailed,
    GroupMaxSizeReached,
    InconsistentGroupProtocol,
    UnknownMemberId,
)
from connect_protocol.resources import EMPTY

from . import conversion, mixed_group
from .change import GroupChange
from .classic_model import ClassicGroupMeta, ClassicMemberInfo, ClassicState, GroupType, PendingId
from .classic_rebalance import (
    classic_meta,
    join_answer,
    maybe_complete_join,
    prepare_rebalance,
)
from .classic_validation import validate_join
from .model import GroupConfigDefaults, GroupState, Member, MemberState
from .records import EventType
from .results import CLASSIC_PENDING, REVOCATION, SESSION, WAKE_JOIN, Parked, Result, refused

JoinAnswer = JoinGroupResponse | Parked


def join_group(
    state: GroupState | None,
    req: JoinGroupRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
    new_member_id: str = "",
) -> Result[JoinAnswer]:
    """Handle one JoinGroup from `principal` (None: not checked, as in the core's own tests).
    The response is a `JoinGroupResponse` when the call is answered now, or `Parked` when it
    waits for the join phase to complete (its answer then comes as a wakeup)."""
    try:
        if not validated:
            validate_join(req, defaults)
        return _Join(state, req, now_ms, defaults, principal, new_member_id).run()
    except CoordinatorError as error:
        return refused(JoinGroupResponse, error, member_id=req.member_id)


def answer_or_park(change: GroupChange, kind: str, member_id: str) -> Result[JoinAnswer]:
    """The caller's own answer if this change produced one (the phase completed in it), else
    `Parked`: the answer comes as a wakeup later."""
    for i, wakeup in enumerate(change.wakeups):
        if wakeup.kind == kind and wakeup.member_id == member_id:
            del change.wakeups[i]
            return change.result(wakeup.response)
    return change.result(Parked(kind, member_id))


class _Join:
    def __init__(
        self,
        state: GroupState | None,
        req: JoinGroupRequest,
        now_ms: int,
        defaults: GroupConfigDefaults,
        principal: str | None,
        new_member_id: str,
    ) -> None:
        self.state, self.req, self.now_ms = state, req, now_ms
        self.defaults, self.principal, self.new_member_id = defaults, principal, new_member_id
        self.change = GroupChange(state, req.group_id, now_ms, defaults, creator=principal)

    def run(self) -> Result[JoinAnswer]:
        req, change = self.req, self.change
        if self.state is None:
            if req.member_id:
                raise UnknownMemberId(
                    f"group {req.group_id!r} does not exist; join with an empty member id."
                )
            change.set_meta(group_type=GroupType.CLASSIC, classic=ClassicGroupMeta())
        elif not self.state.meta.is_classic:
            if conversion.convertible(change):
                conversion.to_classic(change)
            elif not conversion.downgrade_for_classic_join(change):
                # Classic members of a connect group (DESIGN 3.19): the call is translated.
                return mixed_group.translated_join(change, req, self.principal, self.new_member_id)
        if not req.member_id:
            return self.hand_out_member_id()
        pending = change.round.pending(req.member_id)
        if pending is not None:
            self.check_bound(pending.principal)
            return self.pending_id_joins()
        member = change.member(req.member_id)
        if member is None or member.classic is None:
            raise UnknownMemberId(
                f"member {req.member_id!r} is not in group {req.group_id!r}; join with an "
                "empty member id."
            )
        self.check_bound(member.principal)
        return self.existing_member_joins(member)

    # --- the paths ---

    def hand_out_member_id(self) -> Result[JoinAnswer]:
        """KIP-394: a new id, bound to the caller, holding the join barrier until it joins or
        its session timeout passes (GroupMetadataManager `classicGroupJoinNewDynamicMember`)."""
        change, req = self.change, self.req
        if not self.new_member_id:
            raise ValueError("a JoinGroup without a member id needs a new member id to hand out")
        if change.member_count() + change.round.pending_count() >= self.defaults.max_group_size:
            raise self.group_full()
        expires = self.now_ms + req.session_timeout_ms
        change.put_pending_id(
            self.new_member_id, PendingId(self.principal or "", req.session_timeout_ms, expires)
        )
        change.schedule((CLASSIC_PENDING, self.new_member_id), expires)
        return change.result(
            JoinGroupResponse(
                ErrorCode.MEMBER_ID_REQUIRED,
                "send JoinGroup again at once with this member id.",
                member_id=self.new_member_id,
            )
        )

    def pending_id_joins(self) -> Result[JoinAnswer]:
        """The pending id becomes a member (GroupMetadataManager
        `addMemberThenRebalanceOrCompleteJoin`): a parked join that cannot heartbeat, so its
        session is the new-member join timeout until the phase completes."""
        change, req = self.change, self.req
        if change.member_count() >= self.defaults.max_group_size:
            raise self.group_full()
        self.check_protocols(None)
        member_id = req.member_id
        change.drop_pending_id(member_id)
        change.cancel((CLASSIC_PENDING, member_id))
        member = Member(
            member_id=member_id,
            member_epoch=0,
            url=req.protocols[0].metadata.url,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            principal=self.principal or "",
            classic=ClassicMemberInfo(req.protocols, req.session_timeout_ms),
        )
        change.put_member(member)
        change.event(
            EventType.MEMBER_JOINED,
            member_id,
            instance_id=None,
            url=member.url,
            assignors=[],
            group_protocol=GroupType.CLASSIC.value,
            protocols=[p.name for p in req.protocols],
            session_timeout_ms=req.session_timeout_ms,
        )
        change.schedule(
            (SESSION, member_id), self.now_ms + self.defaults.classic_new_member_join_timeout_ms
        )
        if classic_meta(change).state is ClassicState.PREPARING_REBALANCE:
            if change.round.initial:
                change.set_round(new_member_added=True)
        else:
            prepare_rebalance(change, "member joined", member_id)
        change.join_round(member_id)
        maybe_complete_join(change)
        return answer_or_park(change, WAKE_JOIN, member_id)

    def existing_member_joins(self, member: Member) -> Result[JoinAnswer]:
        """GroupMetadataManager `classicGroupJoinExistingMember`: PREPARING joins the phase;
        COMPLETING or STABLE with unchanged metadata answer the current generation (but the
        leader's in STABLE, and in STABLE one whose JoinGroup released what it held); otherwise
        a rebalance starts."""
        change, req = self.change, self.req
        state = classic_meta(change).state
        if state is ClassicState.EMPTY:
            raise UnknownMemberId(f"group {req.group_id!r} is empty; join with an empty member id.")
        self.check_protocols(member)
        info = member.classic
        assert info is not None
        changed = info.protocols != req.protocols
        original = member
        member = self.undelivered_revocation_taken_back(member)
        updated = replace(
            self.released_per_allocation(member),
            url=req.protocols[0].metadata.url,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            classic=replace(
                info, protocols=req.protocols, session_timeout_ms=req.session_timeout_ms
            ),
        )
        if self.principal and not member.principal:
            updated = replace(updated, principal=self.principal)
        if updated != original:
            change.put_member(updated)
        # A member that never completed a join phase keeps the new-member join timeout (its
        # parked JoinGroup cannot heartbeat); others their own session timeout.
        new_member = info.last_joined_generation == 0
        timeout = (
            self.defaults.classic_new_member_join_timeout_ms
            if new_member
            else req.session_timeout_ms
        )
        change.schedule((SESSION, member.member_id), self.now_ms + timeout)
        member_id = member.member_id
        if state is not ClassicState.PREPARING_REBALANCE:
            is_leader = member_id == classic_meta(change).leader_id
            # A STABLE member whose JoinGroup released what it held (an eager worker's, or one
            # that fenced itself) must not be answered the current generation: its SyncGroup
            # would be answered with the accepted share, which it no longer holds here, and it
            # would run work nobody holds. Kafka has no such case (it tracks no ownership).
            released = state is ClassicState.STABLE and updated.owned != member.owned
            if not changed and not released and not (state is ClassicState.STABLE and is_leader):
                return change.result(join_answer(change, member_id))
            leader_rejoined = state is ClassicState.STABLE and is_leader
            if leader_rejoined:
                reason = "leader rejoined"
            elif released and not changed:
                reason = "member released its assignment"
            else:
                reason = "member metadata changed"
            prepare_rebalance(change, reason, member_id)
        change.join_round(member_id)
        maybe_complete_join(change)
        return answer_or_park(change, WAKE_JOIN, member_id)

    # --- helpers ---

    @staticmethod
    def undelivered_revocation_taken_back(member: Member) -> Member:
        """A revocation the member was never told of (the leader's accepted assignment revoked
        it, but a new rebalance began before the member's SyncGroup collected that answer) is
        no revocation: the member still runs that work as its own. It is counted as assigned
        again, so that the member keeps it (its allocation says so) until a delivered answer
        revokes it; left pending, no bound would run and no leader would revoke it again."""
        info = member.classic
        accepted = info.accepted if info is not None else None
        if accepted is None or accepted.answered or not accepted.revoked:
            return member
        undelivered = member.pending_revocation & accepted.revoked
        if not undelivered:
            return member
        pending = member.pending_revocation - undelivered
        return replace(
            member,
            assigned=member.assigned | undelivered,
            pending_revocation=pending,
            state=MemberState.UNREVOKED if pending else MemberState.STABLE,
        )

    def acting_version(self, member: Member) -> int | None:
        """The embedded protocol version the member's worker acts on: that of the last answer it
        was given (`accepted`: a generation's protocol in a classic group, its own first
        protocol when its calls were translated in a connect group, DESIGN 3.19), else the
        group's generation protocol; None when neither is known. After a downgrade the group's
        protocol is a vote no member was told: a cooperative worker keeps running its work."""
        info = member.classic
        if info is not None and info.accepted is not None:
            return info.accepted.version
        protocol = classic_meta(self.change).protocol_name
        return None if protocol is None else protocol_version(protocol)

    def released_per_allocation(self, member: Member) -> Member:
        """What the member no longer runs (DESIGN 3.19): a JoinGroup allocation omits it, the
        generation's protocol is version 0 (an eager worker stops everything before it joins)
        or it sends no allocation (Connect's worker without an assignment snapshot). Released
        pending revocations are acknowledged, and the revocation bound ends with the last."""
        if not member.owned:
            return member
        keep = EMPTY
        if (self.acting_version(member) or 0) > 0:
            # Connect's worker sends the same allocation under each cooperative protocol.
            listed = next(
                (p for p in self.req.protocols if p.metadata.allocation is not None), None
            )
            if listed is not None and listed.metadata.allocation is not None:
                keep = listed.metadata.allocation
        assigned = member.assigned & keep
        pending = member.pending_revocation & keep
        if assigned == member.assigned and pending == member.pending_revocation:
            return member
        released = member.owned - (assigned | pending)
        change, member_id = self.change, member.member_id
        if pending:
            change.event(
                EventType.REVOCATION_PARTIALLY_ACKNOWLEDGED,
                member_id,
                released=released.payload(),
                pending=pending.payload(),
                member_epoch=member.member_epoch,
            )
        else:
            change.event(
                EventType.REVOCATION_ACKNOWLEDGED,
                member_id,
                revoked=released.payload(),
                member_epoch=member.member_epoch,
            )
            if member.pending_revocation:
                change.cancel((REVOCATION, member_id))
        state = MemberState.UNREVOKED if pending else MemberState.STABLE
        if assigned != member.assigned:
            # What it still runs, as a delivery says it: the audit's timeline takes a member's
            # running set from deliveries, and a release of assigned work (an eager worker
            # stops everything before it joins) would otherwise leave it running there until
            # its next SyncGroup, beside whoever is given that work first.
            change.event(
                EventType.ASSIGNMENT_DELIVERED,
                member_id,
                member_epoch=member.member_epoch,
                state=state.value,
                assigned=assigned.payload(),
                added=EMPTY.payload(),
                removed=(member.assigned - assigned).payload(),
                released_by="join",
            )
        return replace(
            member,
            assigned=assigned,
            pending_revocation=pending,
            tokens=member.tokens.restricted(assigned),
            state=state,
        )

    def check_protocols(self, member: Member | None) -> None:
        """The joining member must share a protocol with every other member (Kafka's
        ClassicGroup `supportsProtocols`). O(protocols): the group keeps a count of members
        per protocol."""
        state = self.state
        if state is None or not state.meta.is_classic:
            return
        counts = dict(state.classic_protocol_counts)
        others = state.classic_members
        own = None if member is None else state.members.get(member.member_id)
        if own is not None and own.classic is not None:
            others -= 1
            for name in own.classic.protocol_names():
                counts[name] -= 1
        if others == 0:
            return
        shared = {name for name, count in counts.items() if count == others}
        if not shared.intersection(p.name for p in self.req.protocols):
            raise InconsistentGroupProtocol(
                f"none of the protocols {[p.name for p in self.req.protocols]} is supported by "
                f"every member of group {self.req.group_id!r} (they share {sorted(shared)})."
            )

    def check_bound(self, bound_to: str) -> None:
        """A member id or pending id acts only for the principal it was handed to."""
        if self.principal is not None and bound_to and bound_to != self.principal:
            raise GroupAuthorizationFailed(
                f"member id {self.req.member_id!r} belongs to another principal; join with an "
                "empty member id."
            )

    def group_full(self) -> GroupMaxSizeReached:
        return GroupMaxSizeReached(
            f"group {self.req.group_id!r} has reached its maximum of "
            f"{self.defaults.max_group_size} members (--max-group-size)."
        )
