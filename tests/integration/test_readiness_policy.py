"""The readiness policy (`coordinator_svc.runtime.readiness`): pure functions of times and schema
revisions, and the monitor that feeds them, driven by a fake clock and a scripted probe."""

from __future__ import annotations

import logging

import pytest

from coordinator_svc.runtime.readiness import (
    ReadinessMonitor,
    SchemaStatus,
    classify_schema,
    decide,
)
from coordinator_svc.store.migrate import code_revisions

HEAD = "0004"
KNOWN = frozenset({"0001", "0002", "0003", "0004"})
AT_HEAD = classify_schema(["0004"], HEAD, KNOWN)


def test_schema_is_classified_against_the_codes_revisions() -> None:
    assert classify_schema(["0004"], HEAD, KNOWN).status is SchemaStatus.AT_HEAD
    assert classify_schema([], HEAD, KNOWN).status is SchemaStatus.BEHIND  # never migrated
    assert classify_schema(["0002"], HEAD, KNOWN).status is SchemaStatus.BEHIND
    assert classify_schema(["0005"], HEAD, KNOWN).status is SchemaStatus.AHEAD  # unknown: newer
    # Two rows (branches): not the one head this code expects.
    assert classify_schema(["0003", "0004"], HEAD, KNOWN).status is SchemaStatus.BEHIND
    assert classify_schema(["0004", "0005"], HEAD, KNOWN).status is SchemaStatus.AHEAD


def test_the_codes_own_revisions_are_found() -> None:
    head, known = code_revisions()
    assert head in known and "0001" in known


def test_a_silence_up_to_the_lease_keeps_serving() -> None:
    for silent in (0.0, 3.0, 9.99, 10.0):
        answer = decide(100.0 + silent, 100.0, 10.0, AT_HEAD)
        assert answer.serving, silent
        assert answer.causes == ()


def test_a_silence_longer_than_the_lease_is_not_serving_and_says_so() -> None:
    answer = decide(112.0, 100.0, 10.0, AT_HEAD)
    assert not answer.serving
    assert answer.causes == ("database",)
    assert answer.reason == "database unreachable for 12.0 s > lease 10 s"


@pytest.mark.parametrize(
    ("revision", "cause", "words"),
    [
        ("0005", "schema_ahead", "schema at 0005, code expects 0004 (a newer release"),
        ("0003", "schema_behind", "schema at 0003, code expects 0004 (run `coordinator-svc"),
    ],
)
def test_a_schema_other_than_head_is_not_serving(revision: str, cause: str, words: str) -> None:
    answer = decide(100.0, 100.0, 10.0, classify_schema([revision], HEAD, KNOWN))
    assert not answer.serving
    assert answer.causes == (cause,)
    assert words in answer.reason


def test_never_migrated_is_not_serving() -> None:
    answer = decide(100.0, 100.0, 10.0, classify_schema([], HEAD, KNOWN))
    assert answer.causes == ("schema_behind",)
    assert "never migrated" in answer.reason


def test_a_newer_schema_can_be_accepted_a_behind_one_cannot() -> None:
    ahead = classify_schema(["0005"], HEAD, KNOWN)
    assert decide(100.0, 100.0, 10.0, ahead, allow_newer_schema=True).serving
    behind = classify_schema(["0003"], HEAD, KNOWN)
    assert not decide(100.0, 100.0, 10.0, behind, allow_newer_schema=True).serving


def test_both_causes_are_named() -> None:
    answer = decide(130.0, 100.0, 10.0, classify_schema(["0005"], HEAD, KNOWN))
    assert answer.causes == ("database", "schema_ahead")
    assert "database unreachable for 30.0 s" in answer.reason and "schema at 0005" in answer.reason


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ScriptedProbe:
    def __init__(self) -> None:
        self.revisions: list[str] = ["0004"]
        self.down = False
        self.calls = 0

    def __call__(self) -> list[str]:
        self.calls += 1
        if self.down:
            raise OSError("connection refused")
        return list(self.revisions)


def monitor(clock: FakeClock, probe: ScriptedProbe, changes: list[bool]) -> ReadinessMonitor:
    # Not started as threads: the test calls probe_once/evaluate itself.
    return ReadinessMonitor(
        probe, head=HEAD, known=KNOWN, lease_s=10.0, on_change=changes.append, clock=clock
    )


def test_the_monitor_reports_each_transition_once_and_logs_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, probe = FakeClock(), ScriptedProbe()
    changes: list[bool] = []
    m = monitor(clock, probe, changes)
    with caplog.at_level(logging.INFO, logger="coordinator"):
        assert m.probe_once()
        assert m.evaluate().serving
        assert changes == [True]
        # The database goes away: a silence shorter than the lease changes nothing.
        probe.down = True
        for _ in range(9):
            clock.now += 1.0
            assert not m.probe_once()
            m.evaluate()
        assert changes == [True]
        # Longer than the lease: NOT_SERVING, reported once however long it lasts.
        clock.now += 2.0
        m.probe_once()
        m.evaluate()
        clock.now += 5.0
        m.evaluate()
        assert changes == [True, False]
        # It answers again: SERVING by itself.
        probe.down = False
        assert m.probe_once()
        m.evaluate()
        assert changes == [True, False, True]
        # A newer migration: NOT_SERVING for the schema; and back.
        probe.revisions = ["0005"]
        m.probe_once()
        m.evaluate()
        probe.revisions = ["0004"]
        m.probe_once()
        m.evaluate()
        assert changes == [True, False, True, False, True]
    messages = [r.getMessage() for r in caplog.records if getattr(r, "fields", {}).get("event")]
    readiness = [msg for msg in messages if "readiness" in msg]
    assert readiness == [
        "database answered 0.0 s ago, schema at 0004 (this code's head): readiness SERVING",
        "database unreachable for 11.0 s > lease 10 s: readiness NOT_SERVING",
        "database answered 0.0 s ago, schema at 0004 (this code's head): readiness SERVING again",
        "schema at 0005, code expects 0004 (a newer release migrated the database; run that "
        "release, or roll it back): readiness NOT_SERVING",
        "database answered 0.0 s ago, schema at 0004 (this code's head): readiness SERVING again",
    ]
    # The failed probes are logged once, and the recovery once.
    assert sum("database probe failed" in msg for msg in messages) == 1
    assert sum("database answers again" in msg for msg in messages) == 1
    levels = {r.getMessage(): r.levelno for r in caplog.records}
    assert levels["database unreachable for 11.0 s > lease 10 s: readiness NOT_SERVING"] == (
        logging.WARNING
    )


def test_a_change_whose_report_failed_is_reported_again() -> None:
    clock, probe = FakeClock(), ScriptedProbe()
    calls: list[bool] = []

    def flaky(serving: bool) -> None:
        calls.append(serving)
        if len(calls) == 1:
            raise RuntimeError("event loop gone")

    m = ReadinessMonitor(probe, head=HEAD, known=KNOWN, lease_s=10.0, on_change=flaky, clock=clock)
    m.probe_once()
    with pytest.raises(RuntimeError):
        m.evaluate()
    m.evaluate()
    assert calls == [True, True]
    m.evaluate()
    assert calls == [True, True]
