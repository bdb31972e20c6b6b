"""The ACL model (`core/acls.py`), against its specification (README, "ACLs"): a principal may do
an operation on a resource when an ALLOW entry of it (or of `User:*`) matching the resource
grants the operation (the operation itself, ALL, or, for DESCRIBE, any other group operation)
and no matching DENY entry names the operation or ALL. Literal patterns match one name (`*`
every group), prefixed patterns every name that starts with them; groups and the cluster are
separate resources. Nothing allowed is denied.

The property tests compare `AclSet.allows` with `spec_allows`, written from that text, over
random sets of entries drawn from few principals, names and patterns (so that they collide),
and check the laws that follow from it (order does not matter, adding an ALLOW never denies,
adding a DENY never allows, a matching DENY always wins)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connect_protocol.errors import InvalidRequest
from coordinator_svc.core.acls import (
    ANONYMOUS,
    CLUSTER_NAME,
    AclEntry,
    AclSet,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

ALICE = "User:alice"
BOB = "User:bob"
ANY = "User:*"

GROUP = ResourceType.GROUP
CLUSTER = ResourceType.CLUSTER
LITERAL = PatternType.LITERAL
PREFIXED = PatternType.PREFIXED
ALLOW = Permission.ALLOW
DENY = Permission.DENY

#: The operations a call asks for (ALL is only ever granted or denied, never asked).
ASKED = (
    Operation.MEMBER,
    Operation.DESCRIBE,
    Operation.ALTER,
    Operation.DESCRIBE_CONFIGS,
    Operation.DELETE,
)

#: What an ALLOW of each operation lets a principal do (README's table).
GRANTS: dict[Operation, frozenset[Operation]] = {
    Operation.MEMBER: frozenset({Operation.MEMBER, Operation.DESCRIBE}),
    Operation.DESCRIBE: frozenset({Operation.DESCRIBE}),
    Operation.ALTER: frozenset({Operation.ALTER, Operation.DESCRIBE}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.DESCRIBE}),
    Operation.DELETE: frozenset({Operation.DELETE, Operation.DESCRIBE}),
    Operation.ALL: frozenset(ASKED),
}


def entry(
    principal: str,
    operation: Operation,
    pattern: str,
    pattern_type: PatternType = LITERAL,
    permission: Permission = ALLOW,
    resource_type: ResourceType = GROUP,
) -> AclEntry:
    return AclEntry(principal, operation, resource_type, pattern, pattern_type, permission)


def spec_matches(e: AclEntry, resource_type: ResourceType, name: str) -> bool:
    if e.resource_type is not resource_type:
        return False
    if e.pattern_type is PREFIXED:
        return name.startswith(e.pattern)
    return name == e.pattern or (resource_type is GROUP and e.pattern == "*")


def spec_allows(
    entries: Sequence[AclEntry],
    principal: str,
    operation: Operation,
    resource_type: ResourceType,
    name: str,
) -> bool:
    relevant = [
        e
        for e in entries
        if e.principal in (principal, ANY) and spec_matches(e, resource_type, name)
    ]
    denied = any(
        e.permission is DENY and e.operation in (operation, Operation.ALL) for e in relevant
    )
    allowed = any(e.permission is ALLOW and operation in GRANTS[e.operation] for e in relevant)
    return allowed and not denied


# --- strategies ---------------------------------------------------------------------------------

PRINCIPALS = st.sampled_from([ALICE, BOB, ANY])
ASKERS = st.sampled_from([ALICE, BOB, ANONYMOUS])
NAMES = st.sampled_from(["g", "g1", "g-1", "g-12", "team-a", "team-ab", "Team-a", "*", "x", ""])
LITERAL_PATTERNS = st.sampled_from(["g", "g1", "g-1", "team-a", "*", "x"])
PREFIXES = st.sampled_from(["g", "g-", "g-1", "team-", "team-a", "t", "*", "x"])


@st.composite
def entries(draw: st.DrawFn) -> AclEntry:
    principal = draw(PRINCIPALS)
    operation = draw(st.sampled_from(list(Operation)))
    permission = draw(st.sampled_from(list(Permission)))
    if draw(st.integers(0, 4)) == 0:
        kind = draw(st.sampled_from([LITERAL, PREFIXED]))
        return entry(principal, operation, CLUSTER_NAME, kind, permission, CLUSTER)
    if draw(st.booleans()):
        return entry(principal, operation, draw(LITERAL_PATTERNS), LITERAL, permission)
    return entry(principal, operation, draw(PREFIXES), PREFIXED, permission)


@st.composite
def queries(draw: st.DrawFn) -> tuple[str, Operation, ResourceType, str]:
    principal = draw(ASKERS)
    operation = draw(st.sampled_from(ASKED))
    if draw(st.integers(0, 4)) == 0:
        return principal, operation, CLUSTER, CLUSTER_NAME
    return principal, operation, GROUP, draw(NAMES.filter(bool))


ENTRY_LISTS = st.lists(entries(), max_size=8)


# --- properties -----------------------------------------------------------------------------


@settings(max_examples=600, deadline=None)
@given(ENTRY_LISTS, st.lists(queries(), min_size=1, max_size=6))
def test_allows_is_the_specification(
    acl_entries: list[AclEntry], asked: list[tuple[str, Operation, ResourceType, str]]
) -> None:
    acls = AclSet(acl_entries)
    for principal, operation, resource_type, name in asked:
        assert acls.allows(principal, operation, resource_type, name) == spec_allows(
            acl_entries, principal, operation, resource_type, name
        ), (principal, operation, resource_type, name, [e.describe() for e in acl_entries])


@settings(max_examples=200, deadline=None)
@given(ENTRY_LISTS, queries(), st.randoms(use_true_random=False))
def test_the_order_of_the_entries_does_not_matter(
    acl_entries: list[AclEntry], query: tuple[str, Operation, ResourceType, str], rnd: object
) -> None:
    shuffled = list(acl_entries)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert AclSet(acl_entries).allows(*query) == AclSet(shuffled).allows(*query)


@settings(max_examples=200, deadline=None)
@given(queries())
def test_nothing_allowed_is_denied(query: tuple[str, Operation, ResourceType, str]) -> None:
    assert not AclSet().allows(*query)


@settings(max_examples=300, deadline=None)
@given(ENTRY_LISTS, entries(), queries())
def test_an_allow_never_denies_and_a_deny_never_allows(
    acl_entries: list[AclEntry], extra: AclEntry, query: tuple[str, Operation, ResourceType, str]
) -> None:
    before = AclSet(acl_entries).allows(*query)
    after = AclSet([*acl_entries, extra]).allows(*query)
    if extra.permission is ALLOW:
        assert after or not before, extra.describe()
    else:
        assert before or not after, extra.describe()


@settings(max_examples=300, deadline=None)
@given(ENTRY_LISTS, queries(), st.sampled_from([ANY, "self"]), st.booleans())
def test_a_matching_deny_wins_over_any_allow(
    acl_entries: list[AclEntry],
    query: tuple[str, Operation, ResourceType, str],
    whose: str,
    deny_all: bool,
) -> None:
    principal, operation, resource_type, name = query
    pattern = CLUSTER_NAME if resource_type is CLUSTER else name
    deny = entry(
        principal if whose == "self" else ANY,
        Operation.ALL if deny_all else operation,
        pattern,
        LITERAL,
        DENY,
        resource_type,
    )
    allow_everything = entry(principal, Operation.ALL, pattern, LITERAL, ALLOW, resource_type)
    acls = AclSet([allow_everything, *acl_entries, deny])
    assert not acls.allows(*query)


@settings(max_examples=200, deadline=None)
@given(ENTRY_LISTS, queries())
def test_another_principals_entries_change_nothing(
    acl_entries: list[AclEntry], query: tuple[str, Operation, ResourceType, str]
) -> None:
    principal = query[0]
    others = [
        entry("User:carol", e.operation, e.pattern, e.pattern_type, e.permission, e.resource_type)
        for e in acl_entries
    ]
    mine = [e for e in acl_entries if e.principal in (principal, ANY)]
    assert AclSet([*mine, *others]).allows(*query) == AclSet(mine).allows(*query)


# --- the operations -----------------------------------------------------------------------------


@pytest.mark.parametrize("granted", list(Operation))
@pytest.mark.parametrize("asked", ASKED)
def test_what_each_operation_grants(granted: Operation, asked: Operation) -> None:
    acls = AclSet([entry(ALICE, granted, "g")])
    assert acls.allows(ALICE, asked, GROUP, "g") == (asked in GRANTS[granted])


def test_every_group_operation_implies_describe_and_nothing_else() -> None:
    for granted in (
        Operation.MEMBER,
        Operation.ALTER,
        Operation.DESCRIBE_CONFIGS,
        Operation.DELETE,
    ):
        acls = AclSet([entry(ALICE, granted, "g")])
        assert acls.allows(ALICE, Operation.DESCRIBE, GROUP, "g"), granted
        others = set(ASKED) - {granted, Operation.DESCRIBE}
        assert not any(acls.allows(ALICE, o, GROUP, "g") for o in others), granted
    describe_only = AclSet([entry(ALICE, Operation.DESCRIBE, "g")])
    assert [o for o in ASKED if describe_only.allows(ALICE, o, GROUP, "g")] == [Operation.DESCRIBE]


def test_a_deny_names_exactly_its_operation_and_deny_all_names_every_one() -> None:
    allow_all = entry(ALICE, Operation.ALL, "g")
    deny_alter = entry(ALICE, Operation.ALTER, "g", permission=DENY)
    acls = AclSet([allow_all, deny_alter])
    assert not acls.allows(ALICE, Operation.ALTER, GROUP, "g")
    assert acls.allows(ALICE, Operation.MEMBER, GROUP, "g")
    assert acls.allows(ALICE, Operation.DESCRIBE, GROUP, "g")
    # As in Kafka: denying DESCRIBE does not deny what would imply it.
    deny_describe = AclSet([allow_all, entry(ALICE, Operation.DESCRIBE, "g", permission=DENY)])
    assert not deny_describe.allows(ALICE, Operation.DESCRIBE, GROUP, "g")
    assert deny_describe.allows(ALICE, Operation.MEMBER, GROUP, "g")
    deny_all = AclSet([allow_all, entry(ALICE, Operation.ALL, "g", permission=DENY)])
    assert not any(deny_all.allows(ALICE, o, GROUP, "g") for o in ASKED)


# --- the patterns -------------------------------------------------------------------------------


def test_a_literal_pattern_matches_its_name_only() -> None:
    acls = AclSet([entry(ALICE, Operation.MEMBER, "g-1")])
    assert acls.allows(ALICE, Operation.MEMBER, GROUP, "g-1")
    for other in ("g-12", "g-", "g", "G-1", "xg-1"):
        assert not acls.allows(ALICE, Operation.MEMBER, GROUP, other), other


def test_a_prefixed_pattern_matches_every_name_that_starts_with_it() -> None:
    acls = AclSet([entry(ALICE, Operation.MEMBER, "team-", PREFIXED)])
    for name in ("team-", "team-a", "team-a-b", "team--"):
        assert acls.allows(ALICE, Operation.MEMBER, GROUP, name), name
    for name in ("team", "Team-a", "xteam-a", "tea"):
        assert not acls.allows(ALICE, Operation.MEMBER, GROUP, name), name


def test_the_literal_star_matches_every_group_but_a_prefixed_star_only_names_with_a_star() -> None:
    literal = AclSet([entry(ALICE, Operation.DESCRIBE, "*")])
    for name in ("g", "team-a", "*", "x*"):
        assert literal.allows(ALICE, Operation.DESCRIBE, GROUP, name), name
    assert not literal.allows(ALICE, Operation.DESCRIBE, CLUSTER, CLUSTER_NAME)
    prefixed = AclSet([entry(ALICE, Operation.DESCRIBE, "*", PREFIXED)])
    assert prefixed.allows(ALICE, Operation.DESCRIBE, GROUP, "*-ops")
    assert not prefixed.allows(ALICE, Operation.DESCRIBE, GROUP, "g")


def test_a_prefixed_deny_wins_over_a_literal_allow() -> None:
    acls = AclSet(
        [
            entry(ALICE, Operation.ALTER, "prod-a"),
            entry(ALICE, Operation.ALTER, "prod-", PREFIXED, DENY),
        ]
    )
    assert not acls.allows(ALICE, Operation.ALTER, GROUP, "prod-a")
    assert acls.allows(ALICE, Operation.DESCRIBE, GROUP, "prod-a")


def test_groups_and_the_cluster_are_separate_resources() -> None:
    every_group = AclSet([entry(ALICE, Operation.ALL, "*")])
    assert not every_group.allows(ALICE, Operation.DESCRIBE, CLUSTER, CLUSTER_NAME)
    cluster = AclSet([entry(ALICE, Operation.ALL, CLUSTER_NAME, resource_type=CLUSTER)])
    assert cluster.allows(ALICE, Operation.DESCRIBE, CLUSTER, CLUSTER_NAME)
    assert not cluster.allows(ALICE, Operation.DESCRIBE, GROUP, CLUSTER_NAME)
    group_named_cluster = AclSet([entry(ALICE, Operation.DESCRIBE, CLUSTER_NAME)])
    assert not group_named_cluster.allows(ALICE, Operation.DESCRIBE, CLUSTER, CLUSTER_NAME)


# --- the principals -----------------------------------------------------------------------------


def test_user_star_allows_and_denies_for_every_principal() -> None:
    acls = AclSet([entry(ANY, Operation.DESCRIBE, "g")])
    for who in (ALICE, BOB, ANONYMOUS, "User:CN=x,O=y"):
        assert acls.allows(who, Operation.DESCRIBE, GROUP, "g"), who
    denied = AclSet(
        [entry(ALICE, Operation.ALL, "g"), entry(ANY, Operation.MEMBER, "g", permission=DENY)]
    )
    assert not denied.allows(ALICE, Operation.MEMBER, GROUP, "g")
    assert denied.allows(ALICE, Operation.ALTER, GROUP, "g")


def test_an_entry_of_one_principal_is_nobody_elses() -> None:
    acls = AclSet([entry(ALICE, Operation.ALL, "*")])
    assert acls.allows(ALICE, Operation.MEMBER, GROUP, "g")
    for who in (BOB, ANONYMOUS, "User:alice2", "User:Alice", "User:*"):
        assert not acls.allows(who, Operation.MEMBER, GROUP, "g"), who


# --- what an entry may be -----------------------------------------------------------------------


@pytest.mark.parametrize("principal", ["alice", "User:", "Group:ops", "", "user:alice"])
def test_a_principal_is_user_and_a_name(principal: str) -> None:
    with pytest.raises(InvalidRequest):
        entry(principal, Operation.MEMBER, "g")


def test_an_entry_needs_a_pattern_and_the_cluster_has_one_name() -> None:
    with pytest.raises(InvalidRequest):
        entry(ALICE, Operation.MEMBER, "")
    with pytest.raises(InvalidRequest):
        entry(ALICE, Operation.MEMBER, "", PREFIXED)
    with pytest.raises(InvalidRequest):
        entry(ALICE, Operation.DESCRIBE, "kafka-cluster", resource_type=CLUSTER)
    assert entry(ALICE, Operation.DESCRIBE, CLUSTER_NAME, resource_type=CLUSTER).pattern == (
        CLUSTER_NAME
    )
