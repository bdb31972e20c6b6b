"""Moving one member toward its target and recording what it is told (DESIGN 3.11, 3.18): the
reconciliation of a member against the group's target with the owned list it reports, the
fencing token of each grant, and the events of the transition (revocation requested,
acknowledged or partly acknowledged; assignment delivered).

Shared by the connect heartbeat (`heartbeat.py`) and the translated classic calls of a connect
group's classic-protocol members (`mixed_group.py`). O(the member's share)."""

from __future__ import annotations

import functools
from dataclasses import replace

from connect_protocol.resources import ResourceSet
from connect_protocol.tokens import Resource

from .change import GroupChange
from .model import Member, MemberState
from .reconciliation import reconcile
from .records import EventType
from .results import REVOCATION


def reconcile_member(change: GroupChange, member: Member, owned: ResourceSet | None) -> Member:
    """The member reconciled toward its target share with the owned list it reported (None:
    not reported), put into `change` with the events of its transition when anything changed.
    Returns the member as it is after."""
    target = change.target
    after = reconcile(
        member,
        target.assignment_epoch,
        target.of(member.member_id).resources,
        owned,
        functools.partial(change.free_for, member.member_id),
    )
    if after.assigned != member.assigned:  # O(1) when unchanged (the same sets)
        granted = after.assigned - member.assigned
        if granted:
            after = grant(change, after, granted)
        elif after.tokens:
            after = replace(after, tokens=after.tokens.restricted(after.assigned))
    if (
        after.assigned != member.assigned
        or after.pending_revocation != member.pending_revocation
        or after.state is not member.state
    ):
        # What it runs or waits on changed: it is told so at this epoch (DESIGN 3.21).
        after = replace(after, stable_since_epoch=after.member_epoch)
    if after != member:
        change.put_member(after)
        record_transition(change, member, after)
    return after


def grant(change: GroupChange, member: Member, granted: ResourceSet) -> Member:
    """Give `granted` (resources the member did not hold) the group's next fencing token,
    one token for the whole grant: greater than every token granted before in the group,
    so than every earlier token of each of these resources (DESIGN 3.18). The tokens of what
    it no longer holds are dropped. O(assigned)."""
    token = change.meta.last_fencing_token + 1
    change.set_meta(last_fencing_token=token)
    kept = member.tokens.restricted(member.assigned - granted)
    return replace(
        member,
        tokens=kept.with_grant(granted, token),
        last_grant_at_ms=change.now_ms,
        lifecycle_revision=member.lifecycle_revision + 1,  # its configs to fetch (DESIGN 3.20)
    )


def record_transition(change: GroupChange, before: Member, after: Member) -> None:
    """The events of a member's change, and its revocation bound armed or cancelled."""
    member_id = before.member_id
    released = before.pending_revocation - after.pending_revocation
    if released and after.state is MemberState.UNREVOKED and after.pending_revocation:
        # A partial release (DESIGN 3.11): the revocation timer keeps running from the
        # request, so it is neither cancelled nor re-armed.
        change.event(
            EventType.REVOCATION_PARTIALLY_ACKNOWLEDGED,
            member_id,
            released=released.payload(),
            pending=after.pending_revocation.payload(),
            member_epoch=before.member_epoch,
        )
    elif before.pending_revocation and not (before.pending_revocation <= after.pending_revocation):
        change.event(
            EventType.REVOCATION_ACKNOWLEDGED,
            member_id,
            revoked=before.pending_revocation.payload(),
            member_epoch=before.member_epoch,
        )
        change.cancel((REVOCATION, member_id))
    if after.pending_revocation and not (after.pending_revocation <= before.pending_revocation):
        change.event(
            EventType.REVOCATION_REQUESTED,
            member_id,
            revoke=after.pending_revocation.payload(),
            target_epoch=change.target.assignment_epoch,
        )
        change.schedule((REVOCATION, member_id), change.now_ms + after.rebalance_timeout_ms)
    if after.assigned != before.assigned or after.member_epoch != before.member_epoch:
        added = after.assigned - before.assigned
        change.event(
            EventType.ASSIGNMENT_DELIVERED,
            member_id,
            member_epoch=after.member_epoch,
            state=after.state.value,
            assigned=after.assigned.payload(),
            added=added.payload(),
            removed=(before.assigned - after.assigned).payload(),
            **_grant_details(added, after),
        )


def _grant_details(added: ResourceSet, after: Member) -> dict[str, int]:
    """The fencing token of what a delivery adds (one grant, one token), for its event."""
    resources: list[Resource] = [*added.connectors, *added.tasks]
    for resource in resources:
        if resource in after.tokens:
            return {"fencing_token": after.tokens[resource]}
    return {}
