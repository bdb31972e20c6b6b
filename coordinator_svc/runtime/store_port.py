"""The store as the runtime sees it (a port): exactly the operations that group ownership, group
commit and listing use, as Protocols, so that the runtime depends on them and not on the SQL store
(`store.SqlStore` satisfies them; a fake may too). One Protocol per job, and `GroupStore`, all of
them together, for the `GroupManager` that composes the jobs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from ..core.model import GroupState, Tombstone
from ..core.records import Record
from ..store.acl_store import AclStore
from ..store.errors import Lease, LeaseHolder
from ..store.features import FeatureStore
from ..store.reads import GroupSummary


class LeaseStore(Protocol):
    """Group leases and loading a group taken over (DESIGN 3.16, `runtime.ownership`)."""

    @property
    def advertised_address(self) -> str: ...

    @property
    def lease_ms(self) -> int: ...

    def try_acquire(self, group_id: str, held: Lease | None = None) -> Lease | LeaseHolder: ...

    def renew(self, leases: Iterable[Lease]) -> list[Lease]: ...

    def release(self, lease: Lease) -> None: ...

    def forget(self, lease: Lease) -> None: ...

    def load_group(self, group_id: str) -> GroupState | None: ...

    def load_tombstone(self, group_id: str) -> Tombstone | None: ...

    def groups_needing_owner(self, limit: int) -> list[str]: ...


class CommitStore(Protocol):
    """Committing a batch's records under the group's lease (`runtime.group_commit`)."""

    def commit(self, lease: Lease, records: Sequence[Record]) -> None: ...

    def count_groups(self) -> int: ...


class ListingStore(Protocol):
    """What listings and limits read without taking any lease (`runtime.listing`)."""

    def count_groups_created_by(self, principal: str) -> int: ...

    def existing_group_ids(self, group_ids: Sequence[str]) -> set[str]: ...

    def group_summaries(self, after: str, limit: int) -> list[GroupSummary]: ...


class GroupStore(LeaseStore, CommitStore, ListingStore, Protocol):
    """Every job's operations, plus the key of config digests, the ACL table and the feature
    levels (which the API reaches through the manager)."""

    @property
    def acls(self) -> AclStore: ...

    @property
    def features(self) -> FeatureStore: ...

    def config_digest_key(self) -> bytes: ...
