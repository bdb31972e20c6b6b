"""Member reconciliation toward the target, revoke before assign (DESIGN 3.11).

One pure function of (member, target epoch, target share, owned list, who holds what), after
Kafka's CurrentAssignmentBuilder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from connect_protocol.resources import ResourceSet, TaskId

from .model import Member, MemberState

IsFree = Callable[[ResourceSet], ResourceSet]
"""Given resources, returns the subset that no other member (or hold) holds."""


def acknowledges_revocation(member: Member, owned: ResourceSet | None) -> bool:
    """A heartbeat acknowledges a pending revocation when its owned list no longer holds any of
    it. A heartbeat without the owned list never acknowledges."""
    return (
        owned is not None
        and bool(member.pending_revocation)
        and owned.isdisjoint(member.pending_revocation)
    )


def partially_released(member: Member, owned: ResourceSet | None) -> ResourceSet:
    """The pending resources a heartbeat's owned list no longer holds (a member reports a
    resource as not owned only after it has stopped it). O(pending)."""
    if owned is None or not member.pending_revocation:
        return ResourceSet()
    return member.pending_revocation - owned


def reconcile(
    member: Member,
    target_epoch: int,
    target: ResourceSet,
    owned: ResourceSet | None,
    free: IsFree,
) -> Member:
    """Move `member` as far toward (`target_epoch`, `target`) as is safe now.

    (a) While it holds resources outside its target it keeps only the intersection, stays at its
    epoch and is UNREVOKED; pending resources its owned list no longer holds are released at
    once (partial release), the rest stay pending; (b) once its owned list holds none of them it
    is reconciled again;
    (c) with nothing to revoke it moves to the target epoch at once and gets each target resource
    that nobody else holds (UNRELEASED until it has them all).
    """
    if member.state is MemberState.LEFT:
        return member
    if member.state is MemberState.UNREVOKED:
        if not acknowledges_revocation(member, owned):
            released = partially_released(member, owned)
            if not released:
                return member
            # Partial release (DESIGN 3.11): what it no longer owns goes at once; it stays
            # UNREVOKED at its epoch for the rest.
            return replace(member, pending_revocation=member.pending_revocation - released)
        member = replace(member, pending_revocation=ResourceSet(), state=MemberState.STABLE)
    if member.pending_revocation:
        return member

    to_revoke = member.assigned - target
    if to_revoke:
        return replace(
            member,
            state=MemberState.UNREVOKED,
            assigned=member.assigned & target,
            pending_revocation=to_revoke,
        )

    missing = target - member.assigned
    assigned = member.assigned | free(missing) if missing else member.assigned
    state = MemberState.STABLE if assigned == target else MemberState.UNRELEASED
    if member.member_epoch != target_epoch:
        return replace(
            member,
            member_epoch=target_epoch,
            previous_epoch=member.member_epoch,
            assigned=assigned,
            state=state,
        )
    if assigned == member.assigned and state is member.state:
        return member
    return replace(member, assigned=assigned, state=state)


def free_in(
    member_id: str,
    connector_owner: Callable[[str], str | None],
    task_owner: Callable[[TaskId], str | None],
) -> IsFree:
    """Build an IsFree from owner lookups: a resource is free if unowned or owned by member_id."""

    def free(resources: ResourceSet) -> ResourceSet:
        return ResourceSet(
            frozenset(c for c in resources.connectors if connector_owner(c) in (None, member_id)),
            frozenset(t for t in resources.tasks if task_owner(t) in (None, member_id)),
        )

    return free
