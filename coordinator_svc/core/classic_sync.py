"""The classic SyncGroup (DESIGN 3.19): followers park until the leader's assignments arrive; the
leader's are validated as an install is (members of this generation, resources of the catalogue
it was shown, none given twice or while another member or a hold owns it) and either refused
(ASSIGNMENT_REFUSED, a new rebalance) or accepted (each member's held and pending sets, a fencing
token per grant, the answers to the parked calls); in STABLE a SyncGroup is answered from the
accepted assignment.

Behaviour as Kafka's GroupMetadataManager documents it (`classicGroupSync`, `validateSyncGroup`,
`classicGroupSyncToClassicGroup`; GroupMetadataManagerTest `testSyncGroupFollowerAfterLeader`,
`testSyncGroupLeaderAfterFollower`, `testSyncGroupFromIllegalGeneration`), with ownership
tracked (Departure: Kafka stores the leader's bytes unread).
"""

from __future__ import annotations

from dataclasses import replace

from connect_protocol.classic_messages import (
    PROTOCOL_TYPE,
    ConnectWorkerAssignment,
    SyncGroupRequest,
    SyncGroupResponse,
    protocol_version,
)
from connect_protocol.errors import (
    CoordinatorError,
    ErrorCode,
    GroupAuthorizationFailed,
    IllegalGeneration,
    InconsistentGroupProtocol,
    RebalanceInProgress,
    UnknownMemberId,
)
from connect_protocol.resources import EMPTY, ResourceSet
from connect_protocol.tokens import Resource

from . import mixed_group
from .change import GroupChange
from .classic_model import AcceptedAssignment, ClassicState
from .classic_rebalance import (
    REBALANCING,
    classic_meta,
    prepare_rebalance,
    set_classic,
    shown_catalogue,
)
from .classic_validation import validate_sync
from .model import GroupConfigDefaults, GroupState, Member, MemberState
from .records import EventType
from .results import (
    CLASSIC_SYNC,
    REVOCATION,
    SESSION,
    WAKE_SYNC,
    Parked,
    Result,
    refused,
)

SyncAnswer = SyncGroupResponse | Parked


def sync_group(
    state: GroupState | None,
    req: SyncGroupRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
) -> Result[SyncAnswer]:
    """Handle one SyncGroup from `principal` (None: not checked). The response is a
    `SyncGroupResponse`, or `Parked` for a follower waiting for the leader's assignments."""
    try:
        if not validated:
            validate_sync(req)
        return _Sync(state, req, now_ms, defaults, principal).run()
    except CoordinatorError as error:
        return refused(SyncGroupResponse, error)


class AssignmentRefused(Exception):
    """The leader's assignments break a rule: why, and the resources concerned."""

    def __init__(self, reason: str, resources: ResourceSet = EMPTY) -> None:
        super().__init__(reason)
        self.reason = reason
        self.resources = resources


class _Sync:
    def __init__(
        self,
        state: GroupState | None,
        req: SyncGroupRequest,
        now_ms: int,
        defaults: GroupConfigDefaults,
        principal: str | None,
    ) -> None:
        self.state, self.req, self.now_ms = state, req, now_ms
        self.principal = principal
        self.change = GroupChange(state, req.group_id, now_ms, defaults)

    def run(self) -> Result[SyncAnswer]:
        req, change = self.req, self.change
        if self.state is None:
            raise UnknownMemberId(
                f"group {req.group_id!r} has no classic member {req.member_id!r}."
            )
        if not self.state.meta.is_classic:  # a classic member of a connect group (3.19)
            return mixed_group.translated_sync(change, req, self.principal)
        member = change.member(req.member_id)
        if member is None or member.classic is None:
            raise UnknownMemberId(
                f"member {req.member_id!r} is not in group {req.group_id!r}; join with an "
                "empty member id."
            )
        if self.principal is not None and member.principal and member.principal != self.principal:
            raise GroupAuthorizationFailed(
                f"member id {req.member_id!r} belongs to another principal."
            )
        meta = classic_meta(change)
        if meta.state is ClassicState.EMPTY:
            raise UnknownMemberId(f"group {req.group_id!r} is empty; join with an empty member id.")
        if req.generation_id != change.group_epoch:
            raise IllegalGeneration(
                f"generation {req.generation_id} is not the group's ({change.group_epoch}); rejoin."
            )
        if req.protocol_type is not None and req.protocol_type != PROTOCOL_TYPE:
            raise InconsistentGroupProtocol(f"the group's protocol type is {PROTOCOL_TYPE!r}.")
        if req.protocol_name is not None and req.protocol_name != meta.protocol_name:
            raise InconsistentGroupProtocol(
                f"the generation's protocol is {meta.protocol_name!r}, not {req.protocol_name!r}."
            )
        if meta.state is ClassicState.PREPARING_REBALANCE:
            raise RebalanceInProgress(REBALANCING)
        session = (SESSION, member.member_id)
        change.schedule(session, self.now_ms + member.classic.session_timeout_ms)
        if meta.state is ClassicState.STABLE:
            return self.answer_from_accepted(member)
        if change.round.is_awaiting_sync(member.member_id):
            change.set_sync_sets(synced=[member.member_id])
        if member.member_id == meta.leader_id:
            return self.leader_sync()
        change.set_sync_sets(parked=[member.member_id])
        return change.result(Parked(WAKE_SYNC, member.member_id))

    # --- STABLE: the accepted assignment ---

    def answer_from_accepted(self, member: Member) -> Result[SyncAnswer]:
        """A SyncGroup in STABLE (a follower after the leader, or a retry, also after a
        takeover): the member's share of the accepted assignments; the first answer of the
        generation records the delivery."""
        change = self.change
        assert member.classic is not None
        accepted = member.classic.accepted
        if accepted is None or accepted.generation != change.group_epoch:
            raise RebalanceInProgress(REBALANCING)
        if accepted.answered:  # a retry: nothing to write, the session goes on
            return Result([], self.response(member, accepted), list(change.timers))
        answered = replace(
            member, classic=replace(member.classic, accepted=replace(accepted, answered=True))
        )
        change.put_member(answered)
        if change.round.is_awaiting_sync(member.member_id):
            change.set_sync_sets(synced=[member.member_id])
        record_delivery(change, answered, accepted)
        return change.result(self.response(answered, accepted))

    def response(self, member: Member, accepted: AcceptedAssignment) -> SyncGroupResponse:
        return sync_answer(self.change, member, accepted)

    # --- COMPLETING: the leader's assignments ---

    def leader_sync(self) -> Result[SyncAnswer]:
        change, req = self.change, self.req
        leader_id = req.member_id
        try:
            version = self.validate_assignments()
        except AssignmentRefused as refusal:
            change.event(
                EventType.ASSIGNMENT_REFUSED,
                leader_id,
                generation=change.group_epoch,
                reason=refusal.reason,
                resources=list(refusal.resources.names()),
            )
            prepare_rebalance(change, "assignment refused", leader_id, refused=refusal.reason)
            return change.result(
                SyncGroupResponse(
                    ErrorCode.REBALANCE_IN_PROGRESS,
                    f"your assignments were refused ({refusal.reason}); a new rebalance "
                    "started: rejoin.",
                )
            )
        return self.accept(version)

    def validate_assignments(self) -> int:
        """As an install is validated (DESIGN 3.6), but resources may stay unassigned: the
        version of the generation's protocol, error 0, members of this generation only, the
        catalogue the leader was shown (less what a hold withholds), nothing given twice,
        nothing given while another member owns it, nothing given and revoked at once.
        Returns the protocol version."""
        change = self.change
        generation = change.group_epoch
        version = protocol_version(classic_meta(change).protocol_name or "") or 0
        catalogue = change.catalogue_resources()
        _, withheld = shown_catalogue(change)
        given = EMPTY
        for entry in self.req.assignments:
            a = entry.assignment
            member = change.member(entry.member_id)
            if member is None or member.classic is None or member.member_epoch != generation:
                raise AssignmentRefused(
                    f"{entry.member_id!r} is not a member of generation {generation}"
                )
            if a.error != 0:
                raise AssignmentRefused(f"the assignment carries error {a.error}")
            if a.version != version:
                raise AssignmentRefused(
                    f"the assignment has version {a.version}; the generation's protocol has "
                    f"version {version}"
                )
            if version == 0 and a.revoked is not None:
                raise AssignmentRefused("a version 0 assignment carries no revoked set")
            outside = (a.assignment - catalogue) | (a.assignment & withheld)
            if outside:
                raise AssignmentRefused("resources outside the catalogue shown", outside)
            if a.revoked is not None and a.assignment & a.revoked:
                both = a.assignment & a.revoked
                raise AssignmentRefused("resources both given and revoked", both)
            twice = given & a.assignment
            if twice:
                raise AssignmentRefused("resources given to two members", twice)
            given = given | a.assignment
            taken = self.owned_by_others(entry.member_id, a.assignment)
            if taken:
                raise AssignmentRefused("resources another member still owns", taken)
        return version

    def owned_by_others(self, member_id: str, resources: ResourceSet) -> ResourceSet:
        change = self.change
        connectors = [
            c for c in resources.connectors if change.connector_owner(c) not in (None, member_id)
        ]
        tasks = [t for t in resources.tasks if change.task_owner(t) not in (None, member_id)]
        return ResourceSet.of(connectors, tasks)

    def accept(self, version: int) -> Result[SyncAnswer]:
        """Every member of the generation gets its share (none named: an empty one, as Kafka
        fills missing members); what it is given it holds at once, so no one else may be
        given it; each member's grant draws the group's next fencing token (DESIGN 3.18).
        The leader and the parked followers are answered now, the rest at their SyncGroup."""
        change, req = self.change, self.req
        generation = change.group_epoch
        given = {e.member_id: e.assignment for e in req.assignments}
        token = change.meta.last_fencing_token
        answered_now = change.round.parked_sync() | {req.member_id}
        accepted_members: list[tuple[Member, AcceptedAssignment]] = []
        for member in sorted(change.members().values(), key=lambda m: m.member_id):
            if member.member_epoch != generation or member.classic is None:
                continue
            a = given.get(member.member_id)
            assignment = EMPTY if a is None else a.assignment
            revoked = EMPTY if a is None or a.revoked is None else a.revoked & member.assigned
            granted = assignment - member.assigned
            assigned = (member.assigned - revoked) | assignment
            pending = (member.pending_revocation - assignment) | revoked
            tokens = member.tokens.restricted(assigned - granted)
            if granted:
                token += 1
                tokens = tokens.with_grant(granted, token)
            accepted = AcceptedAssignment(
                generation=generation,
                version=version,
                assignment=assignment,
                revoked=None if version == 0 else revoked,
                delay=0 if a is None else a.delay,
                answered=member.member_id in answered_now,
            )
            after = replace(
                member,
                assigned=assigned,
                pending_revocation=pending,
                tokens=tokens,
                state=MemberState.UNREVOKED if pending else MemberState.STABLE,
                last_grant_at_ms=self.now_ms if granted else member.last_grant_at_ms,
                lifecycle_revision=member.lifecycle_revision + (1 if granted else 0),
                classic=replace(member.classic, accepted=accepted),
            )
            change.put_member(after)
            accepted_members.append((after, accepted))
        change.set_meta(last_fencing_token=token)
        set_classic(change, state=ClassicState.STABLE)
        leader_answer = None
        for after, accepted in accepted_members:
            if not accepted.answered:
                continue
            record_delivery(change, after, accepted)
            change.schedule(
                (SESSION, after.member_id),
                self.now_ms + (after.classic.session_timeout_ms if after.classic else 0),
            )
            answer = sync_answer(change, after, accepted)
            if after.member_id == req.member_id:
                leader_answer = answer
            else:
                change.set_sync_sets(unparked=[after.member_id])
                change.wake(WAKE_SYNC, after.member_id, answer)
        if not change.round.awaiting_sync():
            change.cancel((CLASSIC_SYNC, ""))
            change.set_round(sync_deadline_ms=0)
        assert leader_answer is not None, "the leader is a member of its generation"
        return change.result(leader_answer)


def sync_answer(
    change: GroupChange, member: Member, accepted: AcceptedAssignment
) -> SyncGroupResponse:
    """The member's SyncGroup answer: its share with the generation's leader and the fencing
    token of everything it holds (`config_offset` and `error` always 0)."""
    meta = classic_meta(change)
    leader = None if meta.leader_id is None else change.member(meta.leader_id)
    return SyncGroupResponse(
        protocol_type=PROTOCOL_TYPE,
        protocol_name=meta.protocol_name or "",
        lifecycle_revision=member.lifecycle_revision,
        assignment=ConnectWorkerAssignment(
            version=accepted.version,
            leader=meta.leader_id or "",
            leader_url="" if leader is None else leader.url,
            assignment=accepted.assignment,
            revoked=accepted.revoked,
            delay=accepted.delay,
            tokens=member.tokens,
        ),
    )


def record_delivery(change: GroupChange, member: Member, accepted: AcceptedAssignment) -> None:
    """The events of a member's first answer of a generation (ASSIGNMENT_DELIVERED, and
    REVOCATION_REQUESTED with the revocation bound armed when it revokes)."""
    member_id = member.member_id
    revoked = accepted.revoked or EMPTY
    payload: dict[str, object] = {}
    added: list[Resource] = [*accepted.assignment.connectors, *accepted.assignment.tasks]
    for resource in added:
        if resource in member.tokens:
            payload["fencing_token"] = member.tokens[resource]
            break
    change.event(
        EventType.ASSIGNMENT_DELIVERED,
        member_id,
        member_epoch=accepted.generation,
        state=member.state.value,
        assigned=member.assigned.payload(),
        added=accepted.assignment.payload(),
        removed=revoked.payload(),
        **payload,
    )
    if revoked:
        change.event(
            EventType.REVOCATION_REQUESTED,
            member_id,
            revoke=revoked.payload(),
            target_epoch=accepted.generation,
        )
        change.schedule((REVOCATION, member_id), change.now_ms + member.rebalance_timeout_ms)
