"""Listing groups and the limits on creating them, read from the database without taking any
lease (ListGroups, DescribeGroups' existence check, --max-groups-per-principal). A listed group
carries its type; a classic group its classic state and protocol (DESIGN 3.19)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from connect_protocol.errors import PolicyViolation

from ..core.classic_model import ClassicState, GroupType
from ..core.model import GroupConfigDefaults, GroupStatus
from ..store.errors import StoreUnavailable
from ..store.reads import GroupSummary
from .owned_group import OwnedGroup
from .refusals import database_unavailable
from .store_port import ListingStore

DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class ListedGroup:
    """A group as ListGroups shows it.

    Attributes:
        status: a connect group's state from the database's counts (for a classic group, what
            the same counts would say of a connect group: not shown; see `state`).
        group_type: "connect" or "classic".
        classic_state: a classic group's state (None for connect groups).
        protocol_name: a classic group's current protocol ("" when none, and for connect).
    """

    group_id: str
    status: GroupStatus
    group_epoch: int
    member_count: int
    group_type: str = GroupType.CONNECT.value
    classic_state: str | None = None
    protocol_name: str = ""

    @property
    def state(self) -> str:
        """The state ListGroups shows (`GroupState.display_state`): a classic group's classic
        state, a connect group's status."""
        return self.status.value if self.classic_state is None else self.classic_state

    @staticmethod
    def of(summary: GroupSummary) -> ListedGroup:
        """The group's state from the database's counts, by `GroupState.status`'s rules; a
        classic group's from its stored classic state (EMPTY when none is stored)."""
        if summary.member_count == 0:
            status = GroupStatus.EMPTY
        elif summary.group_epoch > summary.assignment_epoch:
            status = GroupStatus.ASSIGNING
        elif summary.unsettled_members > 0:
            status = GroupStatus.RECONCILING
        else:
            status = GroupStatus.STABLE
        classic = summary.group_type == GroupType.CLASSIC.value
        return ListedGroup(
            summary.group_id,
            status,
            summary.group_epoch,
            summary.member_count,
            summary.group_type,
            (summary.classic_state or ClassicState.EMPTY.value) if classic else None,
            (summary.protocol_name or "") if classic else "",
        )


class GroupListing:
    """Listings over `store`; `current` gives a group this process serves (from memory)."""

    def __init__(
        self,
        store: ListingStore,
        defaults: GroupConfigDefaults,
        current: Callable[[str], OwnedGroup | None],
    ) -> None:
        self.store = store
        self.defaults = defaults
        self.current = current

    def check_groups_created_by(self, principal: str) -> None:
        """POLICY_VIOLATION if `principal` created `defaults.max_groups_per_principal` groups
        already (0: no such limit). Like --max-groups, approximate by the number of groups
        being created at the same moment."""
        limit = self.defaults.max_groups_per_principal
        if limit <= 0:
            return
        try:
            created = self.store.count_groups_created_by(principal)
        except StoreUnavailable as error:
            raise database_unavailable(error) from error
        if created >= limit:
            raise PolicyViolation(
                f"{principal} has created {created:,} groups, the most one principal may "
                f"(--max-groups-per-principal {limit:,}); use an existing group."
            )

    def existing_groups(self, group_ids: list[str]) -> set[str]:
        """Which of `group_ids` exist: those this process serves from memory, the rest from
        one read of the database (a statement per 10,000 ids), without taking any lease."""
        found: set[str] = set()
        ask: list[str] = []
        for group_id in group_ids:
            owned = self.current(group_id)
            if owned is not None and owned.state is not None:
                found.add(group_id)
            else:
                ask.append(group_id)
        if ask:
            try:
                found |= self.store.existing_group_ids(ask)
            except StoreUnavailable as error:
                raise database_unavailable(error) from error
        return found

    def list_groups(self, page_token: str, page_size: int) -> tuple[list[ListedGroup], str]:
        """One page of every group in the database (those other processes own included), in
        group id order, with each group's state computed by the database (no group is loaded);
        and the token of the next page ("" after the last)."""
        size = DEFAULT_PAGE_SIZE if page_size <= 0 else min(page_size, MAX_PAGE_SIZE)
        try:
            summaries = self.store.group_summaries(page_token, size + 1)
        except StoreUnavailable as error:
            raise database_unavailable(error) from error
        page = [ListedGroup.of(s) for s in summaries[:size]]
        return page, (page[-1].group_id if len(summaries) > size else "")
