"""DeleteGroup and RemoveMember over gRPC on PostgreSQL (issue 30, DESIGN 3.20 "DeleteGroup and
RemoveMember"): NON_EMPTY_GROUP for a live member, a LEFT static member, a hold, a classic
member and connectors without --with-catalogue; a group deleted and re-created continues its
epochs, and every token it grants is above every token granted before; the creator's quota and
--max-groups are freed; RemoveMember of a connect member and of a classic member holds their
work for a session timeout, then places it. One in-process coordinator (real gRPC server on
127.0.0.1, real database) driven by scripted workers."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
from connect.group.v1 import admin_pb2

from connect_protocol.errors import ErrorCode
from coordinator_svc.store import schema
from tests.integration.test_lifecycle_grpc import GROUP, formed, put, tokens
from tests.support import store_dump
from tests.support.classic_client import ClassicMember
from tests.support.client import ScriptedWorker, parse
from tests.support.coordinator import FAST_DEFAULTS, InProcessCoordinator, Stubs, run_cli

#: Sessions of 1 s (the scripted workers here heartbeat every 200 ms while they wait): the holds
#: these tests wait out last one session.
DEFAULTS = dataclasses.replace(FAST_DEFAULTS, session_timeout_ms=1_000)
SESSION_S = DEFAULTS.session_timeout_ms / 1000


def delete(stubs: Stubs, group_id: str = GROUP, with_catalogue: bool = False) -> Any:
    return stubs.admin.DeleteGroup(
        admin_pb2.DeleteGroupRequest(group_id=group_id, with_catalogue=with_catalogue), timeout=10
    )


def remove(stubs: Stubs, group_id: str = GROUP, **named: str) -> Any:
    return stubs.admin.RemoveMember(
        admin_pb2.RemoveMemberRequest(group_id=group_id, reason="decommissioned", **named),
        timeout=10,
    )


def events(coord: InProcessCoordinator, kind: str, group_id: str = GROUP) -> list[dict[str, Any]]:
    return [e for e in coord.store.list_events(group_id) if e["event_type"] == kind]


def describe(stubs: Stubs, group_id: str = GROUP) -> Any:
    return stubs.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=[group_id]), timeout=10
    ).groups[0]


def refused(resp: Any, *words: str) -> None:
    assert resp.error_code == ErrorCode.NON_EMPTY_GROUP, resp
    for word in words:
        assert word in resp.error_message, resp.error_message


def test_delete_is_refused_while_anything_is_left_then_deletes_everything_but_events(
    database_url: str,
) -> None:
    with InProcessCoordinator(database_url, defaults=DEFAULTS) as coord:
        assert coord.stubs is not None
        stubs = coord.stubs
        w1, _w2 = formed(stubs)
        w3 = ScriptedWorker(stubs, GROUP, "w3", instance_id="pod-3")
        w3.join()
        refused(delete(stubs, with_catalogue=True), "3 members", "RemoveMember")

        w3.leave(static=True)  # LEFT: its instance id is kept for its rejoin
        w1.leave()
        refused(delete(stubs, with_catalogue=True), "2 members", "1 of them static")

        # w2 removed while it holds B and B-0: they are held for a session timeout.
        removed = remove(stubs, member_id="w2")
        assert (removed.error_code, removed.member_id, removed.resources_held) == (0, "w2", 2)
        gone = remove(stubs, instance_id="pod-3")  # a LEFT static member holds nothing
        assert (gone.error_code, gone.member_id, gone.resources_held, gone.held_until_ms) == (
            0,
            "w3",
            0,
            0,
        )
        refused(delete(stubs, with_catalogue=True), "holds the work of 1 removed member")
        assert remove(stubs, member_id="w2").error_code == ErrorCode.UNKNOWN_MEMBER_ID

        time.sleep(max(0.0, removed.held_until_ms / 1000 - time.time()) + 0.5)
        refused(delete(stubs), "2 connectors", "--with-catalogue")
        epoch = describe(stubs).group_epoch
        deleted = delete(stubs, with_catalogue=True)
        assert deleted.error_code == 0, deleted.error_message
        assert (deleted.connectors_deleted, deleted.tasks_deleted, deleted.group_epoch) == (
            2,
            2,
            epoch,
        )
        assert describe(stubs).error_code == ErrorCode.GROUP_ID_NOT_FOUND
        assert delete(stubs).error_code == ErrorCode.GROUP_ID_NOT_FOUND
        # Every state row is gone; the events stay, ending with GROUP_DELETED.
        rows = store_dump.dump(coord.store)
        for table in schema.STATE_TABLES:
            assert not [r for r in rows[table.name] if r["group_id"] == GROUP], table.name
        (event,) = events(coord, "GROUP_DELETED")
        assert event["group_epoch"] == epoch
        assert event["payload"]["connectors_deleted"] == 2
        assert event["payload"]["last_fencing_token"] == deleted.last_fencing_token
        assert coord.store.list_events(GROUP)[-1]["event_type"] == "GROUP_DELETED"
        (member_removed, _static) = events(coord, "MEMBER_REMOVED")
        assert member_removed["payload"]["reason"] == "decommissioned"
        assert member_removed["payload"]["held_until_ms"] == removed.held_until_ms


def test_a_recreated_group_continues_its_epochs_and_its_tokens_rise_above_every_earlier_one(
    database_url: str,
) -> None:
    with InProcessCoordinator(database_url, defaults=DEFAULTS) as coord:
        assert coord.stubs is not None
        stubs = coord.stubs
        w1, w2 = formed(stubs)
        before = max([*tokens(w1).values(), *tokens(w2).values()])
        w1.leave()
        w2.leave()
        deleted = delete(stubs, with_catalogue=True)
        assert deleted.error_code == 0, deleted.error_message
        assert deleted.last_fencing_token == before

        w1, w2 = formed(stubs)  # the same id, the same catalogue, the same members
        after = min([*tokens(w1).values(), *tokens(w2).values()])
        assert after > before
        (created_again,) = [
            e for e in events(coord, "GROUP_CREATED") if "continues_from_epoch" in e["payload"]
        ]
        assert created_again["group_epoch"] == deleted.group_epoch + 1
        assert created_again["payload"]["continues_from_epoch"] == deleted.group_epoch
        # (group, epoch) stays unique across both incarnations' epoch bumps.
        bumps = [e["group_epoch"] for e in events(coord, "GROUP_EPOCH_BUMPED")]
        assert len(bumps) == len(set(bumps))
        assert min(e for e in bumps if e > deleted.group_epoch) > deleted.group_epoch


def test_deleting_a_group_frees_its_place_under_max_groups_and_the_creators_quota(
    database_url: str,
) -> None:
    defaults = dataclasses.replace(DEFAULTS, max_groups=1, max_groups_per_principal=1)
    with InProcessCoordinator(database_url, defaults=defaults) as coord:
        assert coord.stubs is not None
        stubs = coord.stubs
        put(stubs, "A", 1)
        second = stubs.admin.PutConnector(
            admin_pb2.PutConnectorRequest(group_id="other", connector="A", task_count=1),
            timeout=10,
        )
        assert second.error_code == ErrorCode.POLICY_VIOLATION, second
        assert delete(stubs, with_catalogue=True).error_code == 0
        again = stubs.admin.PutConnector(
            admin_pb2.PutConnectorRequest(group_id="other", connector="A", task_count=1),
            timeout=10,
        )
        assert again.error_code == 0, again.error_message


def test_removing_a_connect_member_holds_its_work_for_a_session_then_places_it(
    database_url: str,
) -> None:
    with InProcessCoordinator(database_url, defaults=DEFAULTS) as coord:
        assert coord.stubs is not None
        stubs = coord.stubs
        w1, w2 = formed(stubs)
        epoch = describe(stubs).group_epoch
        removed = remove(stubs, member_id="w2")
        assert removed.error_code == 0, removed.error_message
        assert removed.group_epoch == epoch + 1
        assert removed.resources_held == 2
        assert w2.heartbeat().error_code == ErrorCode.UNKNOWN_MEMBER_ID
        # w2's id stays bound while its work is held: nobody else may join as w2 meanwhile.
        w1.heartbeat()
        prepared = w1.prepare()
        assert prepared.error_code == 0, prepared.error_message
        everything = parse("A", "A-0", "B", "B-0")
        installed = w1.install(prepared.group_epoch, {"w1": everything})
        assert installed.error_code == 0, installed.error_message
        deadline = removed.held_until_ms / 1000
        while time.time() < deadline - 0.3:
            w1.heartbeat()
            assert w1.owned == parse("A", "A-0"), "held work placed before the hold ended"
            time.sleep(0.2)
        end = time.monotonic() + SESSION_S + 5
        while w1.owned != everything and time.monotonic() < end:
            w1.heartbeat()
            time.sleep(0.1)
        assert w1.owned == everything
        assert time.time() >= deadline - 0.05
        (released,) = events(coord, "HOLD_RELEASED")
        assert released["member_id"] == "w2"


def test_removing_a_classic_member_holds_its_work_for_its_session_then_places_it(
    database_url: str,
) -> None:
    defaults = dataclasses.replace(
        DEFAULTS,
        classic_min_session_timeout_ms=100,
        classic_initial_rebalance_delay_ms=0,
    )
    with InProcessCoordinator(database_url, defaults=defaults) as coord:
        assert coord.stubs is not None
        stubs = coord.stubs
        group = "classic-removal"
        channel = grpc.insecure_channel(coord.address)
        try:
            stubs.admin.PutConnector(
                admin_pb2.PutConnectorRequest(group_id=group, connector="A", task_count=1),
                timeout=10,
            )
            first = ClassicMember(channel, group, session_timeout_ms=1_500)
            first.join()
            assert first.sync().error_code == 0
            assert sorted(first.assignment.assignment.connectors) == ["A"]
            refused(delete(stubs, group, with_catalogue=True), "is STABLE, not EMPTY")

            removed = remove(stubs, group, member_id=first.member_id)
            assert removed.error_code == 0, removed.error_message
            assert removed.resources_held == 2
            assert first.heartbeat().error_code == ErrorCode.UNKNOWN_MEMBER_ID

            second = ClassicMember(channel, group, session_timeout_ms=6_000)
            joined = second.join()
            held = joined.withheld
            assert list(held.connectors) == ["A"] and len(held.tasks) == 1, joined
            assert second.sync().error_code == 0
            assert not second.assignment.assignment.connectors  # A is held
            time.sleep(max(0.0, removed.held_until_ms / 1000 - time.time()) + 0.3)
            # The next rebalance (the leader rejoining) shows A to the leader again.
            rejoined = second.join()
            assert not rejoined.withheld.connectors, rejoined
            assert second.sync().error_code == 0
            assert list(second.assignment.assignment.connectors) == ["A"]
        finally:
            channel.close()


@contextlib.contextmanager
def kept_alive(*workers: ScriptedWorker) -> Iterator[None]:
    """`workers` heartbeat from a thread while the block runs: each CLI call starts a Python
    process, and on a slow machine a few of them outlast the 1 s session (the members then
    expired before the removal the test asks for)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(SESSION_S / 5):
            for worker in workers:
                worker.heartbeat()

    thread = threading.Thread(target=beat, name="kept-alive", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_the_cli_removes_members_and_deletes_groups_saying_what_it_did(
    database_url: str,
) -> None:
    with InProcessCoordinator(database_url, defaults=DEFAULTS) as coord:
        assert coord.stubs is not None
        stubs = coord.stubs
        w1, w2 = formed(stubs)
        address = ("--coordinator", coord.address)

        with kept_alive(w1, w2):  # w2's heartbeats after its removal are refused: harmless
            refused_cli = run_cli("delete-group", GROUP, *address)
            assert refused_cli.returncode == 1
            assert "NON_EMPTY_GROUP" in refused_cli.stderr and "2 members" in refused_cli.stderr
            both = run_cli("remove-member", GROUP, "w2", "--instance-id", "x", *address)
            assert both.returncode == 1 and "exactly one of MemberId and InstanceId" in both.stderr

            removed = run_cli("remove-member", GROUP, "w2", "--reason", "node lost", *address)
        assert removed.returncode == 0, removed.stderr
        assert "member w2 removed from group lifecycle; its 2 resource(s) are held" in (
            removed.stdout
        )
        w1.leave()
        (event,) = events(coord, "MEMBER_REMOVED")
        assert event["payload"]["reason"] == "node lost"
        assert event["payload"]["caller"]  # who asked: the CLI's address

        held = run_cli("delete-group", GROUP, "--with-catalogue", *address)
        assert held.returncode == 1 and "holds the work of 1 removed member" in held.stderr
        time.sleep(SESSION_S + 0.5)
        deleted = run_cli("delete-group", GROUP, "--with-catalogue", *address)
        assert deleted.returncode == 0, deleted.stderr
        assert f"group {GROUP} deleted: 2 connector(s) with 2 task(s)" in deleted.stdout
        assert "continues above both" in deleted.stdout
        gone = run_cli("describe", GROUP, *address)
        assert "GROUP_ID_NOT_FOUND" in gone.stdout + gone.stderr
