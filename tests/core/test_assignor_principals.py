"""Who may compute (issue 23, DESIGN 3.4): the group configuration `assignor.principals`. Only a
member of a listed principal is chosen as assignor member (every member still votes for the
assignor); with none present the group stays ASSIGNING and DescribeGroups' reason says why,
joiners get no error for it; a change of the list chooses again, at once and without an epoch
bump; members from before principals ("") compute only while the list is empty. Bad values are
INVALID_REQUEST. The filter keeps selection's cost: a reselection does not look at the members
of principals it does not list."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from connect_protocol.configs import ASSIGNOR_PRINCIPALS, principal_list
from connect_protocol.errors import ErrorCode
from connect_protocol.messages import AlterConfigsRequest, HeartbeatRequest, PrepareRequest
from connect_protocol.resources import EMPTY
from coordinator_svc.core.admin import alter_configs
from coordinator_svc.core.assignment import current_selection, start_prepare
from coordinator_svc.core.heartbeat import heartbeat
from coordinator_svc.core.model import GroupStatus
from coordinator_svc.core.records import EventType
from coordinator_svc.core.selection import NoSelection
from coordinator_svc.core.validation import MAX_ASSIGNOR_PRINCIPALS, MAX_PRINCIPAL_LENGTH
from tests.core.harness import DEFAULTS, REBALANCE_MS, SESSIONED, GroupHarness, catalogue_group
from tests.core.test_handler_cost_growth import CONSTANT, assert_growth, count_calls

ALICE = "User:CN=alice,O=example"  # a subject: its commas stay in the principal
BOB = "User:bob"
CAROL = "User:carol"
COMPUTE = ErrorCode.COMPUTE_ASSIGNMENT


def join_as(h: GroupHarness, principal: str | None, member_id: str) -> ErrorCode:
    req = HeartbeatRequest(
        h.group_id,
        member_id,
        0,
        rebalance_timeout_ms=REBALANCE_MS,
        client_assignors=SESSIONED,
        owned=EMPTY,
    )
    response = h._run(lambda s: heartbeat(s, req, h.now_ms, h.defaults, principal=principal))
    return ErrorCode(response.error_code)


def beat_as(h: GroupHarness, principal: str | None, member_id: str) -> ErrorCode:
    member = h.member(member_id)
    req = HeartbeatRequest(h.group_id, member_id, member.member_epoch, owned=member.assigned)
    response = h._run(lambda s: heartbeat(s, req, h.now_ms, h.defaults, principal=principal))
    return ErrorCode(response.error_code)


def configure(h: GroupHarness, value: str | None) -> ErrorCode:
    """Set `assignor.principals` (None: unset it)."""
    if value is None:
        return ErrorCode(h.alter_configs(unset=[ASSIGNOR_PRINCIPALS]).error_code)
    return ErrorCode(h.alter_configs({ASSIGNOR_PRINCIPALS: value}).error_code)


def assignor(h: GroupHarness) -> str | None:
    assert h.state is not None
    return h.state.meta.assignor_member_id


def reason(h: GroupHarness) -> str:
    assert h.state is not None
    selection = current_selection(h.state, h.defaults)
    return selection.reason if isinstance(selection, NoSelection) else ""


def test_the_list_is_read_with_a_subjects_commas_kept() -> None:
    assert principal_list("") == principal_list("  ") == ()
    assert principal_list(f"{ALICE}, {BOB},User:CN=x,OU=y") == (ALICE, BOB, "User:CN=x,OU=y")


def test_only_a_listed_principals_member_is_chosen_to_compute() -> None:
    h = catalogue_group()
    assert configure(h, BOB) == ErrorCode.NONE
    assert join_as(h, ALICE, "a1") == ErrorCode.NONE  # joins; nobody may compute yet
    assert assignor(h) is None and h.status() is GroupStatus.ASSIGNING
    assert join_as(h, BOB, "b1") == COMPUTE  # the larger id, but the listed principal
    assert assignor(h) == "b1"
    for _ in range(3):
        assert beat_as(h, ALICE, "a1") == ErrorCode.NONE  # never asked to compute
    assert beat_as(h, BOB, "b1") == COMPUTE


def test_with_no_listed_principal_present_the_group_stays_assigning_and_says_why() -> None:
    h = catalogue_group()
    assert configure(h, f"{CAROL},{BOB}") == ErrorCode.NONE
    assert join_as(h, ALICE, "a1") == ErrorCode.NONE  # no error to the joiner for this alone
    assert join_as(h, ALICE, "a2") == ErrorCode.NONE
    h.sleep(500)
    assert beat_as(h, ALICE, "a1") == ErrorCode.NONE
    assert h.status() is GroupStatus.ASSIGNING and assignor(h) is None
    why = reason(h)
    assert ASSIGNOR_PRINCIPALS in why and "'User:bob', 'User:carol'" in why, why
    assert "a1" not in why  # names no member
    assert join_as(h, CAROL, "c1") == COMPUTE
    assert assignor(h) == "c1" and reason(h) == ""


def test_a_change_of_the_list_moves_the_role_at_once_without_an_epoch_bump() -> None:
    h = catalogue_group()
    join_as(h, ALICE, "a1")
    join_as(h, BOB, "b1")
    assert assignor(h) == "a1"
    epochs = (h.group_epoch, h.assignment_epoch)

    assert configure(h, BOB) == ErrorCode.NONE
    assert assignor(h) == "b1"
    assert (h.group_epoch, h.assignment_epoch) == epochs
    chosen = h.last_events(EventType.ASSIGNOR_CHOSEN)
    assert [e.member_id for e in chosen] == ["b1"]
    assert beat_as(h, ALICE, "a1") == ErrorCode.NONE  # no longer asked
    assert beat_as(h, BOB, "b1") == COMPUTE
    # The old assignor's Prepare is refused as a non-assignor's.
    member = h.member("a1")
    refused = start_prepare(
        h.state, PrepareRequest(h.group_id, "a1", member.member_epoch), h.now_ms, h.defaults
    )
    assert refused.response.error_code == ErrorCode.UNKNOWN_MEMBER_ID

    assert configure(h, None) == ErrorCode.NONE  # any principal again: b1 keeps the role
    assert assignor(h) == "b1"
    assert configure(h, CAROL) == ErrorCode.NONE  # nobody present: the role is taken away
    assert assignor(h) is None
    assert h.last_events(EventType.ASSIGNOR_UNAVAILABLE)
    assert beat_as(h, BOB, "b1") == ErrorCode.NONE
    assert configure(h, ALICE) == ErrorCode.NONE
    assert assignor(h) == "a1"


def test_members_from_before_principals_compute_only_while_the_list_is_empty() -> None:
    h = catalogue_group()
    assert join_as(h, None, "old") == COMPUTE  # principal "" (not checked)
    assert h.member("old").principal == ""
    assert configure(h, ALICE) == ErrorCode.NONE
    assert assignor(h) is None
    assert configure(h, "") == ErrorCode.NONE  # empty: any principal, "" included
    assert assignor(h) == "old"


def test_the_servers_default_applies_and_a_stale_assignor_passes_the_role_on() -> None:
    """`--assignor-principals` is the default of groups that do not set the config. A group
    whose assignor was chosen under another default (a coordinator restarted with a new one)
    moves the role at that member's next heartbeat when a computation is due."""
    h = catalogue_group()
    join_as(h, ALICE, "a1")
    join_as(h, BOB, "b1")
    assert assignor(h) == "a1"
    h.defaults = replace(DEFAULTS, assignor_principals=BOB)
    h.put_connector("C", 1)  # a computation is due
    member = h.member("a1")
    prepare = PrepareRequest(h.group_id, "a1", member.member_epoch)
    refused = start_prepare(h.state, prepare, h.now_ms, h.defaults)
    assert refused.response.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert ASSIGNOR_PRINCIPALS in refused.response.error_message
    assert beat_as(h, ALICE, "a1") == ErrorCode.NONE
    assert assignor(h) == "b1"
    assert beat_as(h, BOB, "b1") == COMPUTE


def test_prepare_does_not_send_the_list_to_the_assignor() -> None:
    h = catalogue_group()
    configure(h, BOB)
    join_as(h, BOB, "b1")
    prepared = h.prepare("b1")
    assert prepared.error_code == ErrorCode.NONE
    assert ASSIGNOR_PRINCIPALS not in prepared.group_configs


@pytest.mark.parametrize(
    "value",
    [
        "alice",  # not a principal as the coordinator names callers
        "User:",
        "Group:admins",
        "User: alice",
        f"{BOB},",
        f"{BOB},,{CAROL}",
        f"{BOB},{BOB}",
        "User:a\nUser:b",
        "User:a\x00",
        "User:" + "x" * MAX_PRINCIPAL_LENGTH,
        ",".join(f"User:w{i}" for i in range(MAX_ASSIGNOR_PRINCIPALS + 1)),
    ],
)
def test_bad_values_are_invalid_requests_and_change_nothing(value: str) -> None:
    h = catalogue_group()
    before = h.dump()
    answer = h.alter_configs({ASSIGNOR_PRINCIPALS: value})
    assert answer.error_code == ErrorCode.INVALID_REQUEST, answer
    assert ASSIGNOR_PRINCIPALS in answer.error_message
    assert h.dump() == before


def test_good_values_are_stored_and_shown_with_the_others() -> None:
    h = catalogue_group()
    most = ",".join(f"User:w{i}" for i in range(MAX_ASSIGNOR_PRINCIPALS))
    for value in ("", f"{ALICE},{BOB}", most, "User:ANONYMOUS"):
        answer = h.alter_configs({ASSIGNOR_PRINCIPALS: value})
        assert answer.error_code == ErrorCode.NONE, answer
        assert answer.effective_configs[ASSIGNOR_PRINCIPALS] == value
        assert h.state is not None and h.state.configs[ASSIGNOR_PRINCIPALS] == value
    req = AlterConfigsRequest(h.group_id, {ASSIGNOR_PRINCIPALS: BOB, "session.timeout.ms": "x"})
    assert alter_configs(h.state, req, 0, DEFAULTS).response.error_code == (
        ErrorCode.INVALID_REQUEST
    )


# --- cost ---------------------------------------------------------------------------------------

SMALL, LARGE = 100, 400
LISTED = 3  # the listed principal's members: the largest ids, as many at every size


def principals_group(size: int) -> GroupHarness:
    """`size` members, all but the last LISTED of a principal that `assignor.principals` does
    not list; the first listed member computes."""
    h = catalogue_group()
    configure(h, CAROL)
    for i in range(size):
        join_as(h, CAROL if i >= size - LISTED else BOB, f"m{i:05d}")
    assert assignor(h) == f"m{size - LISTED:05d}"
    return h


def test_reselection_with_a_list_does_not_look_at_other_principals_members() -> None:
    """The assignor member's leave reselects: the next listed member is found through the
    principal's own ids, not by passing over every member of the others (O(members))."""

    def make(h: GroupHarness) -> Callable[[], Any]:
        chosen = assignor(h)
        assert chosen is not None
        req = HeartbeatRequest(h.group_id, chosen, -1)
        return lambda: heartbeat(h.state, req, h.now_ms, h.defaults, principal=CAROL)

    counts = [count_calls(make(principals_group(size))) for size in (SMALL, LARGE)]
    assert_growth(counts, CONSTANT)
    h = principals_group(SMALL)
    leave = HeartbeatRequest(h.group_id, f"m{SMALL - LISTED:05d}", -1)
    h._run(lambda s: heartbeat(s, leave, h.now_ms, h.defaults, principal=CAROL))
    assert assignor(h) == f"m{SMALL - LISTED + 1:05d}"
