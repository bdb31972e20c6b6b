"""ConnectGroupHeartbeat: joins, leaves, fencing, metadata updates, reconciliation, and the
COMPUTE_ASSIGNMENT signal to the assignor member (seed 000 "Request Handling"; DESIGN 3.2-3.14).

A connect heartbeat to a classic group (DESIGN 3.19): a join (epoch 0) converts it to connect and
joins it: an EMPTY group with no holds under any migration policy (`conversion.to_connect`), a
non-empty one where the policy allows the upgrade (`conversion.upgrade`), else
INCONSISTENT_GROUP_PROTOCOL naming the policy; any other epoch is UNKNOWN_MEMBER_ID (no connect
member can be in a classic group). A connect heartbeat naming a classic-protocol member of a
connect group is UNKNOWN_MEMBER_ID too. When the last connect-protocol member is removed and the
policy allows, the group is downgraded in the same change (`conversion.maybe_downgrade`)."""

from __future__ import annotations

from dataclasses import replace

from connect_protocol.configs import (
    ASSIGNMENT_INTERVAL,
    HEARTBEAT_INTERVAL,
    MIGRATION_POLICY,
    SESSION_TIMEOUT,
)
from connect_protocol.errors import (
    CoordinatorError,
    ErrorCode,
    FencedInstanceId,
    GroupAuthorizationFailed,
    GroupMaxSizeReached,
    PolicyViolation,
    UnknownMemberId,
    UnreleasedInstanceId,
    UnsupportedAssignor,
    UnsupportedVersion,
)
from connect_protocol.messages import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    AssignmentMessage,
    HeartbeatRequest,
    HeartbeatResponse,
)
from connect_protocol.resources import EMPTY, ResourceSet

from .change import GroupChange
from .conversion import convertible, maybe_downgrade, to_connect, upgrade
from .delivery import grant, reconcile_member
from .features import CONNECT_PROTOCOL_LEVEL, GROUP_VERSION
from .mixed_group import TO_CONNECT, conversion_allowed, upgrade_refused
from .model import GroupConfigDefaults, GroupState, Member, MemberState, next_compute_request_ms
from .records import EventType
from .results import ASSIGNOR, HOLD, REVOCATION, SESSION, Result, refused
from .selection import NoSelection, select_with
from .validation import validate_heartbeat
from .wire_size import prepare_bytes


def told_its_assignment_at(member: Member, epoch: int) -> bool:
    """Whether a heartbeat at `epoch` from `member` is one a member moved at install would send
    (DESIGN 3.21, amending 3.12): STABLE with nothing pending, and `epoch` between the epoch at
    which it was last sent its current assignment and its epoch now. Every epoch in that range
    carried this same assignment, so the member runs nothing it was not given. (0: never set, as
    for a `Member` built by hand: not accepted.)"""
    return (
        member.state is MemberState.STABLE
        and not member.pending_revocation
        and 0 < member.stable_since_epoch <= epoch <= member.member_epoch
    )


def heartbeat(
    state: GroupState | None,
    req: HeartbeatRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
    group_version: int = CONNECT_PROTOCOL_LEVEL,
) -> Result[HeartbeatResponse]:
    """Handle one heartbeat from `principal` (None: the caller's identity is not checked, as
    in the core's own tests; the gRPC layer always passes one). `group_version`: the cluster's
    feature level in force in this process (DESIGN 3.19). Errors leave the group as it was,
    except FENCED_MEMBER_EPOCH, which removes the member (seed 000, step 3)."""
    try:
        if not validated:  # the gRPC layer validates before it takes the group
            validate_heartbeat(req)
        if group_version < CONNECT_PROTOCOL_LEVEL and req.member_epoch == JOIN_EPOCH:
            refuse_new_member(state, req, group_version)
        return _Heartbeat(state, req, now_ms, defaults, principal).run()
    except CoordinatorError as error:
        interval, session = defaults.heartbeat_interval_ms, defaults.session_timeout_ms
        if state is not None:
            interval = state.config(HEARTBEAT_INTERVAL, defaults)
            session = state.config(SESSION_TIMEOUT, defaults)
        return refused(
            HeartbeatResponse,
            error,
            member_epoch=req.member_epoch,
            heartbeat_interval_ms=interval,
            session_timeout_ms=session,
        )


def refuse_new_member(state: GroupState | None, req: HeartbeatRequest, group_version: int) -> None:
    """Below CONNECT_PROTOCOL_LEVEL no new member is admitted with the connect protocol (DESIGN
    3.19 "Feature flag"): UNSUPPORTED_VERSION for a join whose member id the group does not have
    as a connect-protocol member nor under a hold (a fenced or expired member's id, whose work
    it still holds). Members already admitted rejoin; a classic group admits no connect joiner,
    an empty one included. O(holds), at this level only."""
    if state is not None and not state.meta.is_classic:
        member = state.members.get(req.member_id)
        if member is not None and member.classic is None:
            return
        if member is None and any(h.member_id == req.member_id for h in state.meta.holds):
            return
    raise UnsupportedVersion(
        f"the cluster feature {GROUP_VERSION} is at level {group_version}: no new member is "
        f"admitted with the connect protocol. Join with the classic protocol "
        "(worker-agent run --group-protocol classic), or ask an operator to raise it to "
        f"{CONNECT_PROTOCOL_LEVEL} with `coordinator-svc features update`."
    )


class _Heartbeat:
    def __init__(
        self,
        state: GroupState | None,
        req: HeartbeatRequest,
        now_ms: int,
        defaults: GroupConfigDefaults,
        principal: str | None = None,
    ) -> None:
        self.req = req
        self.principal = principal
        self.now_ms = now_ms
        self.defaults = defaults
        self.state = state
        self.change = GroupChange(state, req.group_id, now_ms, defaults, creator=principal)

    def response(
        self,
        member_epoch: int,
        assignment: AssignmentMessage | None = None,
        error: ErrorCode = ErrorCode.NONE,
        message: str = "",
        revision: int = 0,
    ) -> HeartbeatResponse:
        return HeartbeatResponse(
            error_code=error,
            error_message=message,
            member_epoch=member_epoch,
            heartbeat_interval_ms=self.change.config(HEARTBEAT_INTERVAL),
            session_timeout_ms=self.change.config(SESSION_TIMEOUT),
            assignment=assignment,
            lifecycle_revision=revision,
        )

    def result(self, response: HeartbeatResponse) -> Result[HeartbeatResponse]:
        # Wakeups: an upgrade answers the classic calls it found parked (DESIGN 3.19).
        return self.change.result(response)

    def run(self) -> Result[HeartbeatResponse]:
        req = self.req
        if req.client_assignors:
            self.check_metadata_size(sum(len(a.metadata) for a in req.client_assignors))
        if req.server_assignor is not None:
            raise UnsupportedAssignor(
                f"server-side assignor {req.server_assignor!r} is not supported: this coordinator "
                "offers none; advertise client assignors instead."
            )
        if self.state is None and req.member_epoch != JOIN_EPOCH:
            raise UnknownMemberId(
                f"group {req.group_id!r} does not exist; abandon your work and rejoin with epoch 0."
            )
        if self.state is not None and self.state.meta.is_classic:
            self.into_classic_group()
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self.leave()
        if req.member_epoch == JOIN_EPOCH:
            return self.join()
        return self.existing()

    def into_classic_group(self) -> None:
        """A connect heartbeat to a classic group (DESIGN 3.19): a join converts it (the join
        then proceeds on the connect group): an empty one under any policy, O(1) but for
        dropping its pending ids; a non-empty one if its migration policy allows the upgrade,
        O(members); otherwise INCONSISTENT_GROUP_PROTOCOL naming the policy."""
        req, change = self.req, self.change
        if req.member_epoch != JOIN_EPOCH:
            raise UnknownMemberId(
                f"member {req.member_id!r} is not in group {req.group_id!r}: it is a classic "
                "group, whose members use the classic protocol (JoinGroup/SyncGroup); abandon "
                "your work and rejoin with epoch 0."
            )
        if not convertible(change):
            policy = change.config(MIGRATION_POLICY)
            if not conversion_allowed(policy, TO_CONNECT):
                raise upgrade_refused(req.group_id, policy)
            upgrade(change)  # the classic members become members of a connect group (3.19)
            return
        to_connect(change)

    # --- the three entry paths ---

    def leave(self) -> Result[HeartbeatResponse]:
        req, change = self.req, self.change
        member = self.known_member()
        if req.member_epoch == STATIC_LEAVE_EPOCH:
            left = replace(
                member,
                state=MemberState.LEFT,
                pending_revocation=EMPTY,
                stable_since_epoch=member.member_epoch,
                instance_id=member.instance_id or req.instance_id,
            )
            change.put_member(left)
            change.event(
                EventType.MEMBER_LEFT, member.member_id, static=True, held=left.assigned.payload()
            )
            change.cancel((REVOCATION, member.member_id))
            change.schedule((SESSION, member.member_id), self.now_ms + change.fencing_session_ms())
            change.reselect_assignor()
            return self.result(self.response(STATIC_LEAVE_EPOCH))
        change.remove_member(member.member_id)
        change.event(
            EventType.MEMBER_LEFT, member.member_id, static=False, released=member.owned.payload()
        )
        change.cancel((SESSION, member.member_id))
        change.cancel((REVOCATION, member.member_id))
        change.bump_epoch("member left", member_id=member.member_id)
        change.reselect_assignor()
        maybe_downgrade(change, "last connect-protocol member left")
        return self.result(self.response(LEAVE_EPOCH))

    def join(self) -> Result[HeartbeatResponse]:
        req, change = self.req, self.change
        existing = change.member(req.member_id)
        if existing is not None:
            self.check_bound(existing.principal, f"member id {req.member_id!r}")
            if existing.classic is not None:
                raise UnknownMemberId(
                    f"member id {req.member_id!r} is a classic-protocol member of group "
                    f"{req.group_id!r}; join with a new member id."
                )
        else:
            hold = change.hold(req.member_id)
            if hold is not None:
                self.check_bound(hold.principal, f"member id {req.member_id!r}")
        if req.instance_id is not None:
            holder = change.member_by_instance(req.instance_id)
            if holder is not None and holder.member_id != req.member_id:
                self.check_bound(holder.principal, f"instance id {req.instance_id!r}")
                if holder.state is not MemberState.LEFT:
                    raise UnreleasedInstanceId(
                        f"instance id {req.instance_id!r} is still held by live member "
                        f"{holder.member_id!r}; retry after it leaves or its session expires."
                    )
                if existing is not None:
                    raise FencedInstanceId(
                        f"member {req.member_id!r} is already in the group and cannot take over "
                        f"instance id {req.instance_id!r}."
                    )
                return self.take_over_static(holder)
            if holder is None:
                self.check_instance_holds(req.instance_id)
        if existing is not None:
            return self.rejoin(existing)
        if change.member_count() >= self.defaults.max_group_size:
            raise GroupMaxSizeReached(
                f"group {req.group_id!r} has reached its maximum of "
                f"{self.defaults.max_group_size} members."
            )
        assert req.rebalance_timeout_ms is not None
        member = Member(
            member_id=req.member_id,
            member_epoch=change.target.assignment_epoch,
            instance_id=req.instance_id,
            url=req.url or "",
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            assignors=req.client_assignors or (),
            principal=self.principal or "",
            stable_since_epoch=change.target.assignment_epoch,
        )
        self.check_assignors(member)
        change.put_member(member)
        change.event(
            EventType.MEMBER_JOINED,
            member.member_id,
            instance_id=member.instance_id,
            url=member.url,
            assignors=[a.name for a in member.assignors],
        )
        change.bump_epoch("member joined", member_id=member.member_id)
        change.reselect_assignor()
        return self.finish(member, self.req.owned or EMPTY, send=True)

    def rejoin(self, member: Member) -> Result[HeartbeatResponse]:
        change = self.change
        was_left = member.state is MemberState.LEFT
        if was_left:
            member = replace(
                member, state=MemberState.STABLE, stable_since_epoch=member.member_epoch
            )
        updated, assignors_changed = self.updated(member)
        if change.release_hold(member.member_id) is not None:
            change.cancel((HOLD, member.member_id))
        if updated != change.member(member.member_id) or was_left:
            change.put_member(updated)
            change.event(EventType.MEMBER_REJOINED, member.member_id, epoch=updated.member_epoch)
        if assignors_changed:
            change.bump_epoch("member assignors changed", member_id=member.member_id)
        if assignors_changed or was_left:
            change.reselect_assignor()
        return self.finish(updated, self.req.owned or EMPTY, send=True)

    def take_over_static(self, holder: Member) -> Result[HeartbeatResponse]:
        """A new member id presents a departed static member's instance id: it takes the
        assignment over without a rebalance (DESIGN 3.14)."""
        req, change = self.req, self.change
        successor = replace(
            holder,
            member_id=req.member_id,
            state=MemberState.STABLE,
            stable_since_epoch=holder.member_epoch,
        )
        successor, assignors_changed = self.updated(successor)
        if successor.assigned:
            # A member that did not hold them: a grant, with a new token (DESIGN 3.18).
            successor = grant(change, replace(successor, assigned=EMPTY), successor.assigned)
            successor = replace(successor, assigned=holder.assigned)
        change.remove_member(holder.member_id)
        change.cancel((SESSION, holder.member_id))
        change.put_member(successor)
        target = change.target
        if holder.member_id in target.members:
            members = dict(target.members)
            members[successor.member_id] = members.pop(holder.member_id)
            change.set_target(
                replace(target, members=members), (holder.member_id, successor.member_id)
            )
        meta = change.meta
        if meta.assignor_member_id == holder.member_id:
            change.set_meta(assignor_member_id=successor.member_id)
        # An assignor may be computing from a Prepare that showed the holder. Its install is
        # validated against the group as that Prepare showed it (the holder's id included) and
        # the holder's share is then dropped (DESIGN 3.9), so the group epoch must move on for a
        # new computation to place that share: the takeover is a membership change for it.
        racing = (
            meta.prepared is not None
            and meta.prepared.group_epoch > change.target.assignment_epoch
            and holder.member_id in meta.prepared.member_ids
        )
        change.event(
            EventType.STATIC_MEMBER_REPLACED,
            successor.member_id,
            instance_id=req.instance_id,
            previous_member_id=holder.member_id,
        )
        if assignors_changed:
            change.bump_epoch("member assignors changed", member_id=successor.member_id)
        elif racing:
            change.bump_epoch(
                "static member replaced during an assignment computation",
                member_id=successor.member_id,
            )
        change.reselect_assignor()
        return self.finish(successor, req.owned or EMPTY, send=True)

    def existing(self) -> Result[HeartbeatResponse]:
        req, change = self.req, self.change
        member = self.known_member()
        if member.state is MemberState.LEFT:
            raise UnknownMemberId(f"member {req.member_id!r} left the group; rejoin with epoch 0.")
        resend = False
        if req.member_epoch != member.member_epoch:
            if told_its_assignment_at(member, req.member_epoch):
                pass  # moved since (DESIGN 3.21): answered at its epoch, as if it had sent it
            elif (
                req.member_epoch == member.previous_epoch
                and req.owned is not None
                and req.owned <= member.assigned
            ):
                resend = True  # its last response was lost: answer it again
            else:
                return self.fence(member)
        updated, assignors_changed = self.updated(member)
        if updated != member:
            change.put_member(updated)
        if assignors_changed:
            change.bump_epoch("member assignors changed", member_id=member.member_id)
            change.reselect_assignor()
        return self.finish(updated, req.owned, send=resend)

    # --- helpers ---

    def check_metadata_size(self, size: int) -> None:
        """POLICY_VIOLATION if a member's assignor metadata of `size` bytes is over the
        per-member limit, or would make the group's PrepareAssignment answer (every member's
        metadata is in it) larger than --max-message-bytes: no assignor could then be asked.
        O(1): the group keeps the total."""
        defaults = self.defaults
        if size > defaults.max_assignor_metadata_bytes:
            raise PolicyViolation(
                f"the client assignors' metadata take {size:,} bytes, over the limit of "
                f"{defaults.max_assignor_metadata_bytes:,} per member "
                "(--max-assignor-metadata-bytes)."
            )
        state = self.state
        if state is None:
            return
        member = state.members.get(self.req.member_id)
        grows = size - (0 if member is None else member.metadata_bytes())
        if grows <= 0:
            return
        members = len(state.members) + (1 if member is None else 0)
        answer = prepare_bytes(
            state.catalogue_wire_bytes + state.assignor_metadata_bytes + grows, members
        )
        if answer > defaults.max_message_bytes:
            raise PolicyViolation(
                f"the group's PrepareAssignment answer would be about {answer:,} bytes with this "
                f"member's assignor metadata, over the maximum message size of "
                f"{defaults.max_message_bytes:,} bytes (--max-message-bytes); send less "
                "metadata, or raise the limit on the coordinator and every agent."
            )

    def check_bound(self, bound_to: str, what: str) -> None:
        """A member id or instance id acts only for the principal that created it ("": bound
        to nobody yet, from before principals existed)."""
        if self.principal is not None and bound_to and bound_to != self.principal:
            raise GroupAuthorizationFailed(
                f"{what} belongs to another principal; use an id of your own."
            )

    def check_instance_holds(self, instance_id: str) -> None:
        """An instance id that no member has now stays bound to the principal of a member that
        was removed with a hold, until the hold ends (DESIGN 3.13, 3.14): that member's agent
        may still run the held work, and its restarted pod must get the id back."""
        for hold in self.change.holds_of_instance(instance_id):
            self.check_bound(hold.principal, f"instance id {instance_id!r}")

    def known_member(self) -> Member:
        req = self.req
        member = self.change.member(req.member_id)
        if member is not None:
            self.check_bound(member.principal, f"member id {req.member_id!r}")
        if req.instance_id is not None:
            holder = self.change.member_by_instance(req.instance_id)
            if holder is not None and holder.member_id != req.member_id:
                self.check_bound(holder.principal, f"instance id {req.instance_id!r}")
                raise FencedInstanceId(
                    f"instance id {req.instance_id!r} belongs to member {holder.member_id!r}; "
                    "this member has been replaced and must stop."
                )
            if holder is None and (member is None or member.instance_id != req.instance_id):
                self.check_instance_holds(req.instance_id)  # it would take the id: not steady
        if member is None:
            raise UnknownMemberId(
                f"member {req.member_id!r} is not in group {req.group_id!r}; abandon your work "
                "and rejoin with epoch 0."
            )
        if member.classic is not None:
            raise UnknownMemberId(
                f"member {req.member_id!r} of group {req.group_id!r} uses the classic protocol "
                "(JoinGroup/SyncGroup); abandon your work and rejoin with epoch 0 and a new "
                "member id."
            )
        if (
            req.instance_id is not None
            and member.instance_id is not None
            and member.instance_id != req.instance_id
        ):
            raise FencedInstanceId(
                f"member {req.member_id!r} is registered with instance id "
                f"{member.instance_id!r}, not {req.instance_id!r}."
            )
        return member

    def fence(self, member: Member) -> Result[HeartbeatResponse]:
        """Epoch mismatch: remove the member; what it held goes to nobody until a session timeout
        has passed, by when its agent has stopped it (DESIGN 3.12, 3.13)."""
        change, req = self.change, self.req
        until = self.now_ms + change.fencing_session_ms()
        change.remove_member(member.member_id)
        change.add_hold(member.member_id, member.owned, until, member.principal, member.instance_id)
        if member.owned:
            change.schedule((HOLD, member.member_id), until)
        change.cancel((SESSION, member.member_id))
        change.cancel((REVOCATION, member.member_id))
        change.event(
            EventType.MEMBER_FENCED,
            member.member_id,
            request_epoch=req.member_epoch,
            member_epoch=member.member_epoch,
            held=member.owned.payload(),
            held_until_ms=until,
        )
        change.bump_epoch("member fenced", member_id=member.member_id)
        change.reselect_assignor()
        maybe_downgrade(change, "last connect-protocol member fenced")
        message = (
            f"member epoch {req.member_epoch} does not match the coordinator's "
            f"{member.member_epoch}; the member has been removed: abandon all connectors and "
            "tasks and rejoin with epoch 0."
        )
        return self.result(
            self.response(req.member_epoch, None, ErrorCode.FENCED_MEMBER_EPOCH, message)
        )

    def updated(self, member: Member) -> tuple[Member, bool]:
        """The member with the request's non-absent fields applied; whether assignors changed."""
        req = self.req
        updated = member
        if req.url is not None and req.url != member.url:
            updated = replace(updated, url=req.url)
        if (
            req.rebalance_timeout_ms is not None
            and req.rebalance_timeout_ms > 0
            and (req.rebalance_timeout_ms != member.rebalance_timeout_ms)
        ):
            updated = replace(updated, rebalance_timeout_ms=req.rebalance_timeout_ms)
        if req.instance_id is not None and req.instance_id != member.instance_id:
            updated = replace(updated, instance_id=req.instance_id)
        if self.principal and not member.principal:
            updated = replace(updated, principal=self.principal)  # adopted (see Member)
        changed = False
        if req.client_assignors is not None and req.client_assignors != member.assignors:
            updated = replace(updated, assignors=req.client_assignors)
            self.check_assignors(updated)
            changed = True
        return updated, changed

    def check_assignors(self, member: Member) -> None:
        selection = select_with(self.change.profiles(extra=member))
        if isinstance(selection, NoSelection):
            raise UnsupportedAssignor(
                f"member {member.member_id!r} cannot join group {self.req.group_id!r} with "
                f"these assignors: {selection.for_member()}."
            )

    def finish(
        self, member: Member, owned: ResourceSet | None, send: bool
    ) -> Result[HeartbeatResponse]:
        """Reconcile the member, arm its timers, and signal COMPUTE_ASSIGNMENT if it is due."""
        change = self.change
        target = change.target
        after = reconcile_member(change, member, owned)
        change.schedule((SESSION, member.member_id), self.now_ms + change.fencing_session_ms())
        send = (
            send
            or after.assigned != member.assigned
            or after.member_epoch != member.member_epoch
            or (owned is not None and owned != after.assigned)
        )
        assignment = None
        if send:
            entry = target.of(member.member_id)
            assignment = AssignmentMessage(
                after.assigned, entry.version, entry.metadata, tokens=after.tokens
            )
        error, message = self.compute_signal(after)
        response = self.response(
            after.member_epoch, assignment, error, message, after.lifecycle_revision
        )
        return self.result(response)

    def compute_signal(self, member: Member) -> tuple[ErrorCode, str]:
        """COMPUTE_ASSIGNMENT for the assignor member while the group epoch is ahead of the
        assignment epoch (DESIGN 3.4), paced by `assignment.interval.ms` (DESIGN 3.21): a new
        computation is requested only when none is outstanding and the interval has passed
        since the last request; epoch bumps meanwhile are folded into it. While one is
        outstanding it is repeated on every heartbeat (a lost response must not stall it)."""
        change = self.change
        meta = change.meta
        if (
            change.group_epoch <= change.target.assignment_epoch
            or meta.assignor_member_id != member.member_id
            or (meta.compute_not_before_ms is not None and self.now_ms < meta.compute_not_before_ms)
        ):
            return ErrorCode.NONE, ""
        if meta.compute_requested_epoch is None:
            due_at = next_compute_request_ms(meta, change.config(ASSIGNMENT_INTERVAL))
            if due_at is not None and self.now_ms < due_at:
                return ErrorCode.NONE, ""  # its first heartbeat from `due_at` on asks
        allowed = change.assignor_principals()
        if allowed is not None and member.principal not in allowed:
            # Chosen before the server's default assignor.principals changed: pass the role on.
            change.reselect_assignor()
            return ErrorCode.NONE, ""
        if meta.compute_requested_epoch is None:
            change.set_meta(
                compute_requested_epoch=change.group_epoch, compute_requested_at_ms=self.now_ms
            )
            change.event(
                EventType.ASSIGNMENT_REQUESTED, member.member_id, group_epoch=change.group_epoch
            )
            change.schedule((ASSIGNOR, ""), self.now_ms + member.rebalance_timeout_ms)
        return ErrorCode.COMPUTE_ASSIGNMENT, (
            f"compute the target assignment of group {change.group_id!r} for group epoch "
            f"{change.group_epoch}: call ConnectGroupPrepareAssignment, then "
            "ConnectGroupInstallAssignment."
        )
