"""Target states and restarts over gRPC on PostgreSQL (issue 29, DESIGN 3.20 "Target states",
"Restarts", "Automatic restarts"): Pause/Resume/StopConnector raise only the holders'
revisions and bump the epoch exactly on entering or leaving STOPPED; Prepare carries effective
task counts; RestartConnector selects as Connect's RestartRequest, persists restart counts
that survive a takeover, and refuses what cannot be restarted; automatic restarts follow the
backoff, stop at the maximum, and are cancelled by a pause. One in-process coordinator (real
gRPC server on 127.0.0.1, real database) driven by scripted workers."""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from connect.group.v1 import admin_pb2, common_pb2

from tests.integration.test_lifecycle_grpc import (
    GROUP,
    configs,
    entry,
    formed,
    put,
    report,
    statuses,
    tokens,
)
from tests.support.client import ScriptedWorker, parse
from tests.support.coordinator import FAST_DEFAULTS, InProcessCoordinator, Stubs, run_cli


def pause(stubs: Stubs, connector: str) -> Any:
    return stubs.admin.PauseConnector(
        admin_pb2.PauseConnectorRequest(group_id=GROUP, connector=connector), timeout=10
    )


def resume(stubs: Stubs, connector: str) -> Any:
    return stubs.admin.ResumeConnector(
        admin_pb2.ResumeConnectorRequest(group_id=GROUP, connector=connector), timeout=10
    )


def stop(stubs: Stubs, connector: str) -> Any:
    return stubs.admin.StopConnector(
        admin_pb2.StopConnectorRequest(group_id=GROUP, connector=connector), timeout=10
    )


def restart(stubs: Stubs, connector: str, **fields: Any) -> Any:
    return stubs.admin.RestartConnector(
        admin_pb2.RestartConnectorRequest(group_id=GROUP, connector=connector, **fields),
        timeout=10,
    )


def epoch_of(stubs: Stubs) -> int:
    group = stubs.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=[GROUP]), timeout=10
    ).groups[0]
    return int(group.group_epoch)


def events(coord: InProcessCoordinator, kind: str) -> list[dict[str, Any]]:
    return [e for e in coord.store.list_events(GROUP) if e["event_type"] == kind]


def alter(stubs: Stubs, **values: str) -> None:
    resp = stubs.admin.AlterGroupConfigs(
        admin_pb2.AlterGroupConfigsRequest(
            group_id=GROUP, set={k.replace("_", "."): v for k, v in values.items()}
        ),
        timeout=10,
    )
    assert resp.error_code == 0, resp.error_message


def test_pause_and_resume_raise_only_the_holders_revisions_and_move_nothing(
    database_url: str,
) -> None:
    with InProcessCoordinator(database_url) as coord:
        assert coord.stubs is not None
        stubs = coord.stubs
        w1, w2 = formed(stubs)
        r1, r2 = w1.heartbeat().lifecycle_revision, w2.heartbeat().lifecycle_revision
        epoch = epoch_of(stubs)

        paused = pause(stubs, "A")
        assert paused.error_code == 0, paused.error_message
        assert (paused.changed, paused.rebalance_triggered, paused.holders_told) == (True, False, 1)
        assert paused.previous_target_state == common_pb2.TARGET_STARTED
        assert epoch_of(stubs) == epoch  # no bump
        assert w1.heartbeat().lifecycle_revision == r1 + 1  # A's holder
        assert w2.heartbeat().lifecycle_revision == r2  # not B's
        assert w1.owned == parse("A", "A-0") and w2.owned == parse("B", "B-0")  # nothing moved
        (held,) = configs(w1).connectors
        assert held.target_state == common_pb2.TARGET_PAUSED

        again = pause(stubs, "A")
        assert (again.error_code, again.changed, again.holders_told) == (0, False, 0)
        assert w1.heartbeat().lifecycle_revision == r1 + 1  # a repeat writes nothing

        resumed = resume(stubs, "A")
        assert (resumed.changed, resumed.rebalance_triggered) == (True, False)
        assert resumed.previous_target_state == common_pb2.TARGET_PAUSED
        assert configs(w1).connectors[0].target_state == common_pb2.TARGET_STARTED
        assert epoch_of(stubs) == epoch
        changes = events(coord, "CONNECTOR_TARGET_STATE_CHANGED")
        assert [
            (e["payload"]["previous_target_state"], e["payload"]["target_state"]) for e in changes
        ] == [
            ("STARTED", "PAUSED"),
            ("PAUSED", "STARTED"),
        ]
        assert all(e["payload"]["caller"].startswith("ipv") for e in changes)  # who asked


def test_stop_bumps_the_epoch_its_tasks_leave_and_resume_brings_them_back(
    database_url: str,
) -> None:
    with InProcessCoordinator(database_url) as coord:
        assert coord.stubs is not None
        stubs = coord.stubs
        w1, w2 = formed(stubs)
        put(stubs, "A", 3, password="x")  # A now has 3 tasks (a bump, not yet installed)
        epoch = epoch_of(stubs)

        stopped = stop(stubs, "A")
        assert (stopped.changed, stopped.rebalance_triggered) == (True, True)
        assert epoch_of(stubs) == epoch + 1  # entering STOPPED
        w1.heartbeat()
        prepared = w1.prepare()
        counts = {c.name: c.task_count for c in prepared.catalogue}
        assert counts == {"A": 0, "B": 1}  # effective task counts
        described = stubs.admin.DescribeGroups(
            admin_pb2.DescribeGroupsRequest(group_ids=[GROUP]), timeout=10
        ).groups[0]
        shown = {c.name: (c.task_count, c.target_state) for c in described.catalogue}
        assert shown["A"] == (3, common_pb2.TARGET_STOPPED)  # kept for resume

        put(stubs, "A", 4, password="x")  # a task count change while STOPPED: no bump
        assert epoch_of(stubs) == epoch + 1
        assert restart(stubs, "A").error_code == common_pb2.INVALID_REQUEST  # nothing runs

        installed = w1.install(prepared.group_epoch, {"w1": parse("A"), "w2": parse("B", "B-0")})
        assert installed.error_code == 0, installed.error_message
        for _ in range(3):
            w1.heartbeat()
            w2.heartbeat()
        assert w1.owned == parse("A")  # the connector stays assigned, its task left

        resumed = resume(stubs, "A")
        assert (resumed.changed, resumed.rebalance_triggered) == (True, True)
        assert epoch_of(stubs) == epoch + 2  # leaving STOPPED
        w1.heartbeat()
        assert {c.name: c.task_count for c in w1.prepare().catalogue} == {"A": 4, "B": 1}


def test_restart_selects_as_connect_and_its_counts_survive_a_takeover(database_url: str) -> None:
    with InProcessCoordinator(database_url) as coord:
        assert coord.stubs is not None
        stubs = coord.stubs
        put(stubs, "A", 3, password="x")
        put(stubs, "B", 1, topic="b")
        w1 = ScriptedWorker(stubs, GROUP, "w1")
        w1.join()
        w1.heartbeat()
        prepared = w1.prepare()
        everything = parse("A", "A-0", "A-1", "A-2", "B", "B-0")
        assert w1.install(prepared.group_epoch, {"w1": everything}).error_code == 0
        for _ in range(3):
            w1.heartbeat()
        t = tokens(w1)
        reported = report(
            w1,
            entry("A", t["A"], common_pb2.RUNNING),
            entry("A", t[("A", 0)], common_pb2.RUNNING, task=0),
            entry("A", t[("A", 1)], common_pb2.FAILED, task=1, trace="boom"),
            entry("A", t[("A", 2)], common_pb2.RUNNING, task=2),
        )
        assert [r.error_code for r in reported.results] == [0, 0, 0, 0]
        revision = w1.heartbeat().lifecycle_revision

        only_failed = restart(stubs, "A", include_tasks=True, only_failed=True)
        assert only_failed.error_code == 0, only_failed.error_message
        assert [
            (p.connector, p.task, p.restart_count, p.worker_id) for p in only_failed.restarts
        ] == [("A", 1, 1, "w1")]
        assert w1.heartbeat().lifecycle_revision == revision + 1
        view = statuses(stubs)
        assert view[("A", 1)].state == common_pb2.RESTARTING
        assert view[("A", 0)].state == common_pb2.RUNNING  # not selected
        assert dict(_restart_counts(configs(w1))) == {("A", 1): 1}

        connector_only = restart(stubs, "A")
        assert [(p.connector, p.HasField("task")) for p in connector_only.restarts] == [
            ("A", False)
        ]
        with_tasks = restart(stubs, "A", include_tasks=True)
        assert [p.task if p.HasField("task") else None for p in with_tasks.restarts] == [
            None,
            0,
            1,
            2,
        ]
        one = restart(stubs, "B", task=0)
        assert [(p.connector, p.task, p.restart_count) for p in one.restarts] == [("B", 0, 1)]
        nothing = restart(stubs, "B", include_tasks=True, only_failed=True)
        assert (nothing.error_code, list(nothing.restarts)) == (0, [])
        for bad in (
            restart(stubs, "Z"),
            restart(stubs, "A", task=3),
            restart(stubs, "A", task=-1),
        ):
            assert bad.error_code == common_pb2.INVALID_REQUEST, bad
        counts = dict(_restart_counts(configs(w1)))
        assert counts == {"A": 2, ("A", 0): 1, ("A", 1): 2, ("A", 2): 1, ("B", 0): 1}
        requested = events(coord, "CONNECTOR_RESTART_REQUESTED")
        assert [e["payload"]["reason"] for e in requested] == ["manual"] * 4
        epoch, revision = w1.epoch, w1.heartbeat().lifecycle_revision
    with InProcessCoordinator(database_url) as second:
        assert second.stubs is not None
        w1 = ScriptedWorker(second.stubs, GROUP, "w1")
        w1.epoch, w1.owned = epoch, everything
        assert w1.heartbeat().lifecycle_revision == revision  # a resend repeats nothing
        assert dict(_restart_counts(configs(w1))) == counts
        assert statuses(second.stubs)[("A", 1)].restart_count == 2


def _restart_counts(answer: Any) -> list[tuple[Any, int]]:
    return [
        ((c.connector, c.task) if c.HasField("task") else c.connector, c.restart_count)
        for c in answer.restart_counts
    ]


def test_automatic_restarts_back_off_give_up_and_a_pause_cancels_them(database_url: str) -> None:
    with InProcessCoordinator(database_url) as coord:
        assert coord.stubs is not None
        stubs = coord.stubs
        alter(stubs, restart_failed_backoff_ms="300", restart_failed_max_attempts="2")
        w1, _w2 = formed(stubs)
        t = tokens(w1)
        task = ("A", 0)

        def fail() -> float:
            """Report A-0 FAILED; the time just before the report (the coordinator arms the
            restart when it handles it, before its answer is back here)."""
            before = time.monotonic()
            answer = report(w1, entry("A", t[task], common_pb2.FAILED, task=0, trace="x"))
            assert answer.results[0].error_code == 0
            return before

        def restarted(count: int, within_s: float = 5.0) -> float:
            end = time.monotonic() + within_s
            while time.monotonic() < end:
                if statuses(stubs)[task].restart_count == count:
                    return time.monotonic()
                time.sleep(0.02)
            raise AssertionError(f"no restart {count} within {within_s} s")

        failed_at = fail()
        view = statuses(stubs)[task]
        assert view.HasField("next_restart_at_ms") and view.auto_restart_attempts == 0
        first = restarted(1) - failed_at
        assert statuses(stubs)[task].state == common_pb2.RESTARTING
        failed_at = fail()  # the restarted task fails again: the next wait doubles
        second = restarted(2) - failed_at
        # At least the backoff, then twice it (less a millisecond: the deadlines are in ms).
        assert first >= 0.299 and second >= 0.599, (first, second)
        fail()  # a third failure: the attempts are spent
        view = statuses(stubs)[task]
        assert (view.auto_restart_attempts, view.auto_restarts_exhausted) == (2, True)
        assert not view.HasField("next_restart_at_ms")
        time.sleep(0.8)
        assert statuses(stubs)[task].restart_count == 2  # it stays FAILED
        auto = [
            e["payload"]
            for e in events(coord, "CONNECTOR_RESTART_REQUESTED")
            if e["payload"]["reason"] == "auto"
        ]
        assert [a["attempt"] for a in auto] == [1, 2]

        # Another task fails; pausing its connector cancels the pending restart.
        t1 = report(w1, entry("A", t["A"], common_pb2.FAILED, trace="connector down"))
        assert t1.results[0].error_code == 0
        assert statuses(stubs)["A"].HasField("next_restart_at_ms")
        assert pause(stubs, "A").error_code == 0
        assert not statuses(stubs)["A"].HasField("next_restart_at_ms")
        time.sleep(0.5)
        assert statuses(stubs)["A"].restart_count == 0
        (changed,) = events(coord, "CONNECTOR_TARGET_STATE_CHANGED")
        assert changed["payload"]["auto_restarts_cancelled"] == 1


def test_the_cli_pauses_stops_resumes_and_restarts_and_status_shows_it(database_url: str) -> None:
    # Sessions of 30 s: the workers send nothing while the commands run (each one a process
    # of its own, up to a second to start), and none of this is about expiry.
    defaults = dataclasses.replace(FAST_DEFAULTS, session_timeout_ms=30_000)
    with InProcessCoordinator(database_url, defaults=defaults) as coord:
        assert coord.stubs is not None
        stubs = coord.stubs
        alter(stubs, restart_failed_backoff_ms="60000", restart_failed_max_attempts="1")
        w1, _w2 = formed(stubs)
        t = tokens(w1)
        address = ("--coordinator", coord.address)

        paused = run_cli("pause", GROUP, "A", *address)
        assert paused.returncode == 0, paused.stderr
        assert "connector A paused (was STARTED); 1 worker(s) told" in paused.stdout
        again = run_cli("pause", GROUP, "A", *address)
        assert "already PAUSED; nothing changed" in again.stdout
        described = run_cli("describe", GROUP, *address)
        assert "A (1 tasks, PAUSED)" in described.stdout
        assert run_cli("resume", GROUP, "A", *address).returncode == 0

        report(w1, entry("A", t[("A", 0)], common_pb2.FAILED, task=0, trace="boom"))
        shown = run_cli("status", GROUP, *address)
        assert "task A-0  FAILED  worker w1" in shown.stdout
        assert re.search(r"automatic restart 1 in (59\.\d|60\.0) s", shown.stdout)  # 60 s
        planned = run_cli("restart", GROUP, "A", "--include-tasks", "--only-failed", *address)
        assert planned.returncode == 0, planned.stderr
        assert planned.stdout.strip() == "A-0: restart 1 requested; worker w1"
        assert (
            "task A-0  RESTARTING  worker w1  restarts 1"
            in run_cli("status", GROUP, *address).stdout
        )
        report(w1, entry("A", t[("A", 0)], common_pb2.FAILED, task=0, trace="boom again"))
        exhausted = run_cli("status", GROUP, *address).stdout
        assert "automatic restarts exhausted (1)" not in exhausted  # the manual one was not auto
        refused = run_cli("restart", GROUP, "nope", *address)
        assert refused.returncode == 1 and "not in the catalogue" in refused.stderr

        stopped = run_cli("stop", GROUP, "B", *address)
        assert "(rebalance triggered)" in stopped.stdout
        shown = run_cli("status", GROUP, *address).stdout
        assert "connector B  UNASSIGNED  (target STOPPED)  worker w2" in shown
