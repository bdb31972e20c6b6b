"""Issue 12 in the pure core: the limits that keep one group or caller from costing others
(POLICY_VIOLATION, nothing changed), the identity binding of member ids, instance ids and the
assignor role to the principal that created the member (GROUP_AUTHORIZATION_FAILED, nothing
changed), and the per-principal token buckets (THROTTLING_QUOTA_EXCEEDED)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connect_protocol.errors import ErrorCode, ThrottlingQuotaExceeded
from connect_protocol.messages import (
    Assignor,
    HeartbeatRequest,
    InstallRequest,
    MemberTarget,
    PrepareRequest,
)
from coordinator_svc.core.assignment import install_assignment, start_prepare
from coordinator_svc.core.heartbeat import heartbeat
from coordinator_svc.runtime.quotas import TokenBuckets
from tests.core.harness import (
    DEFAULTS,
    REBALANCE_MS,
    SESSIONED,
    GroupHarness,
    catalogue_group,
    ok,
    rs,
    stable_group,
)

ALICE, MALLORY = "User:alice", "User:mallory"


# --- catalogue limits --------------------------------------------------------------------------


def _limited(**limits: int) -> GroupHarness:
    return GroupHarness(defaults=replace(DEFAULTS, **limits))


def test_connectors_per_group_limit_refuses_the_one_too_many_and_changes_nothing() -> None:
    h = _limited(max_connectors_per_group=2)
    ok(h.put_connector("A", 1))
    ok(h.put_connector("B", 1))
    before = h.dump()

    refused = h.put_connector("C", 1)

    assert refused.error_code == ErrorCode.POLICY_VIOLATION
    assert "--max-connectors-per-group" in refused.error_message
    assert h.dump() == before
    ok(h.put_connector("A", 3))  # changing an existing connector adds none


def test_tasks_per_group_limit_counts_every_connector_and_a_resize() -> None:
    h = _limited(max_tasks_per_group=10)
    ok(h.put_connector("A", 6))
    ok(h.put_connector("B", 4))
    assert h.put_connector("B", 5).error_code == ErrorCode.POLICY_VIOLATION
    assert h.put_connector("C", 1).error_code == ErrorCode.POLICY_VIOLATION
    ok(h.delete_connector("A"))
    ok(h.put_connector("C", 6))
    assert h.state is not None and h.state.catalogue_tasks == 10


def test_config_limits_per_connector_and_per_group() -> None:
    h = _limited(max_config_bytes_per_connector=100, max_config_bytes_per_group=150)
    big = {"k": "v" * 100}
    refused = h.put_connector("A", 1, big)
    assert refused.error_code == ErrorCode.POLICY_VIOLATION
    assert "--max-config-bytes-per-connector" in refused.error_message
    ok(h.put_connector("A", 1, {"k": "v" * 90}))
    refused = h.put_connector("B", 1, {"k": "v" * 90})
    assert refused.error_code == ErrorCode.POLICY_VIOLATION
    assert "--max-config-bytes-per-group" in refused.error_message
    ok(h.put_connector("A", 1, {"k": "v" * 10}))  # shrinking frees room
    ok(h.put_connector("B", 1, {"k": "v" * 90}))


def test_a_group_over_a_lowered_limit_may_still_shrink() -> None:
    h = _limited(max_tasks_per_group=100)
    ok(h.put_connector("A", 50))
    ok(h.put_connector("B", 50))
    h.defaults = replace(h.defaults, max_tasks_per_group=10)
    ok(h.put_connector("A", 40))  # still over, but smaller
    assert h.put_connector("A", 45).error_code == ErrorCode.POLICY_VIOLATION


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ABCDE"), st.integers(0, 9), st.integers(0, 30))))
def test_running_catalogue_totals_always_equal_a_recount(
    puts: list[tuple[str, int, int]],
) -> None:
    h = _limited(max_tasks_per_group=25, max_config_bytes_per_group=60)
    for name, tasks, config_size in puts:
        if tasks == 0 and config_size == 0:
            h.delete_connector(name)
        else:
            h.put_connector(name, tasks, {"x": "y" * config_size})
        if h.state is None:
            continue
        catalogue = h.state.catalogue.values()
        assert h.state.catalogue_tasks == sum(c.task_count for c in catalogue)
        assert h.state.catalogue_config_bytes == sum(c.config_bytes() for c in catalogue)
        assert h.state.catalogue_tasks <= 25
        assert h.state.catalogue_config_bytes <= 60


# --- assignor metadata and state -----------------------------------------------------------------


def test_assignor_metadata_over_the_limit_is_refused_on_join() -> None:
    h = _limited(max_assignor_metadata_bytes=16)
    fat = (Assignor("incremental_cooperative", 1, 2, version=2, metadata=b"x" * 17),)
    refused = h.join("w1", assignors=fat)
    assert refused.error_code == ErrorCode.POLICY_VIOLATION
    assert h.state is None
    ok(h.join("w1", assignors=(replace(fat[0], metadata=b"x" * 16),)))


def test_assignor_state_over_the_limit_is_refused_on_install() -> None:
    h = catalogue_group()
    h.defaults = replace(h.defaults, max_assignor_state_bytes=100)
    h.join("w1")
    h.prepare("w1")
    before = h.dump()
    refused = h.install("w1", {"w1": rs("A", "A-0", "A-1", "B", "B-0")}, assignor_state=b"s" * 101)
    assert refused.error_code == ErrorCode.POLICY_VIOLATION
    assert h.dump() == before
    ok(h.install("w1", {"w1": rs("A", "A-0", "A-1", "B", "B-0")}, assignor_state=b"s" * 100))


# --- identity binding --------------------------------------------------------------------------


def _as(h: GroupHarness, principal: str, req: HeartbeatRequest) -> ErrorCode:
    response = h._run(lambda s: heartbeat(s, req, h.now_ms, h.defaults, principal=principal))
    return ErrorCode(response.error_code)


def _join(member_id: str, instance_id: str | None = None) -> HeartbeatRequest:
    return HeartbeatRequest(
        group_id=h_group(),
        member_id=member_id,
        member_epoch=0,
        instance_id=instance_id,
        rebalance_timeout_ms=REBALANCE_MS,
        client_assignors=SESSIONED,
        owned=rs(),
    )


def h_group() -> str:
    return GroupHarness().group_id


def test_a_member_id_acts_only_for_the_principal_that_created_it() -> None:
    h = GroupHarness()
    assert _as(h, ALICE, _join("w1")) in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT)
    assert h.member("w1").principal == ALICE
    epoch = h.member("w1").member_epoch
    before = h.dump()
    for epoch_sent in (epoch, -1, 0):
        req = replace(_join("w1"), member_epoch=epoch_sent)
        assert _as(h, MALLORY, req) == ErrorCode.GROUP_AUTHORIZATION_FAILED
        assert h.dump() == before
    keep = replace(_join("w1"), member_epoch=epoch, rebalance_timeout_ms=None)
    assert _as(h, ALICE, keep) in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT)


def test_an_instance_id_acts_only_for_its_principal_even_after_a_static_leave() -> None:
    h = GroupHarness()
    _as(h, ALICE, _join("w1", instance_id="pod-0"))
    epoch = h.member("w1").member_epoch
    leave = replace(_join("w1", "pod-0"), member_epoch=-2, rebalance_timeout_ms=None)
    assert _as(h, ALICE, leave) == ErrorCode.NONE
    before = h.dump()
    assert _as(h, MALLORY, _join("w9", instance_id="pod-0")) == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert h.dump() == before
    assert _as(h, ALICE, _join("w2", instance_id="pod-0")) in (
        ErrorCode.NONE,
        ErrorCode.COMPUTE_ASSIGNMENT,
    )
    assert h.member("w2").principal == ALICE
    assert epoch > 0


def test_a_fenced_members_id_stays_bound_while_its_work_is_held() -> None:
    h = stable_group()
    # Bind w2 to alice (it was created without a principal: adopted on its next heartbeat).
    assert h.member("w2").principal == ""
    keep = HeartbeatRequest(h.group_id, "w2", h.member("w2").member_epoch, owned=None)
    assert _as(h, ALICE, keep) in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT)
    assert h.member("w2").principal == ALICE
    # A wrong epoch from alice fences w2: removed, its work held.
    assert _as(h, ALICE, replace(keep, member_epoch=99)) == ErrorCode.FENCED_MEMBER_EPOCH
    assert not h.has_member("w2")
    assert h.state is not None and h.state.meta.holds[0].principal == ALICE
    before = h.dump()
    assert _as(h, MALLORY, _join("w2")) == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert h.dump() == before


def test_prepare_and_install_only_from_the_assignor_members_principal() -> None:
    h = GroupHarness()
    h.put_connector("A", 1)
    _as(h, ALICE, _join("w1"))
    member = h.member("w1")
    prepare = PrepareRequest(h.group_id, "w1", member.member_epoch)
    refused = start_prepare(h.state, prepare, h.now_ms, h.defaults, principal=MALLORY)
    assert refused.response.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert not refused.records
    install = InstallRequest(
        h.group_id,
        "w1",
        member.member_epoch,
        h.group_epoch,
        members=(MemberTarget("evil", rs("A", "A-0")),),
    )
    refused_install = install_assignment(h.state, install, h.now_ms, h.defaults, principal=MALLORY)
    assert refused_install.response.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert not refused_install.records
    allowed = start_prepare(h.state, prepare, h.now_ms, h.defaults, principal=ALICE)
    assert allowed.response.error_code == ErrorCode.NONE


# --- token buckets -----------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_token_bucket_allows_its_burst_then_its_rate_per_key() -> None:
    clock = FakeClock()
    buckets = TokenBuckets("joins", "--max-joins-per-s", rate=10, burst=5, clock=clock)
    for _ in range(5):
        buckets.take(ALICE)
    with pytest.raises(ThrottlingQuotaExceeded) as refused:
        buckets.take(ALICE)
    assert "--max-joins-per-s" in refused.value.message
    buckets.take(MALLORY)  # another principal has its own bucket
    clock.now += 0.11  # one token back (and a little)
    buckets.take(ALICE)
    with pytest.raises(ThrottlingQuotaExceeded):
        buckets.take(ALICE)


def test_rate_zero_is_unlimited() -> None:
    buckets = TokenBuckets("joins", "--max-joins-per-s", rate=0, burst=0, clock=FakeClock())
    for _ in range(10_000):
        buckets.take(ALICE)


def _fenced_static_member_of_alice() -> GroupHarness:
    """A settled group whose w2 (instance `pod-1`, alice's) was fenced: its work is held."""
    h = stable_group()
    keep = HeartbeatRequest(
        h.group_id, "w2", h.member("w2").member_epoch, instance_id="pod-1", owned=None
    )
    assert _as(h, ALICE, keep) in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT)
    assert (h.member("w2").principal, h.member("w2").instance_id) == (ALICE, "pod-1")
    assert _as(h, ALICE, replace(keep, member_epoch=99)) == ErrorCode.FENCED_MEMBER_EPOCH
    assert not h.has_member("w2")
    assert h.state is not None
    assert [(x.member_id, x.principal, x.instance_id) for x in h.state.meta.holds] == [
        ("w2", ALICE, "pod-1")
    ]
    return h


def test_a_fenced_static_members_instance_id_stays_bound_while_its_work_is_held() -> None:
    """Issue 23: the hold keeps the instance id bound, not only the member id. Mallory's join
    with it, under a new member id, and her own member's heartbeat that would take it on, are
    refused and change nothing; alice's restarted pod (a new member id) gets it."""
    h = _fenced_static_member_of_alice()
    assert _as(h, MALLORY, _join("m1")) in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT)
    before = h.dump()
    assert _as(h, MALLORY, _join("m2", instance_id="pod-1")) == (
        ErrorCode.GROUP_AUTHORIZATION_FAILED
    )
    last = h.records_of_last_call
    assert h.dump() == before and not last
    taking = HeartbeatRequest(
        h.group_id, "m1", h.member("m1").member_epoch, instance_id="pod-1", owned=None
    )
    assert _as(h, MALLORY, taking) == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert h.dump() == before
    assert _as(h, MALLORY, replace(_join("m1", instance_id="pod-1"))) == (
        ErrorCode.GROUP_AUTHORIZATION_FAILED
    )
    assert h.dump() == before

    assert _as(h, ALICE, _join("w3", instance_id="pod-1")) in (
        ErrorCode.NONE,
        ErrorCode.COMPUTE_ASSIGNMENT,
    )
    assert (h.member("w3").principal, h.member("w3").instance_id) == (ALICE, "pod-1")


def test_the_instance_id_is_free_again_once_the_hold_ends() -> None:
    h = _fenced_static_member_of_alice()
    h.sleep(DEFAULTS.session_timeout_ms)  # the hold ends (and w1 expires: nobody heartbeats)
    assert h.state is not None and not h.state.meta.holds
    assert _as(h, MALLORY, _join("m2", instance_id="pod-1")) in (
        ErrorCode.NONE,
        ErrorCode.COMPUTE_ASSIGNMENT,
    )
    assert h.member("m2").instance_id == "pod-1"
