"""RebalanceEvent's JSON, the in-process adapters, and call_with_retry."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from connect_protocol.resources import ResourceSet, TaskId
from worker_agent.listener import (
    CallbackListener,
    CompositeListener,
    ListenerFailed,
    RebalanceEvent,
    WorkerRebalanceListener,
    call_with_retry,
    dispatch,
)

LOG = logging.getLogger("test.listener")


def make_event(kind: str = "revoked") -> RebalanceEvent:
    resources = ResourceSet.of(["b", "a"], [("b", 1), ("a", 10), ("a", 2), ("b", 0)])
    return RebalanceEvent.from_resources(
        kind,  # type: ignore[arg-type]
        resources,
        group_id="g1",
        member_id="w1",
        member_epoch=7,
    )


def test_event_json_is_exactly_the_contract_object_with_sorted_lists() -> None:
    assert make_event("revoked").to_json() == {
        "event": "revoked",
        "group_id": "g1",
        "member_id": "w1",
        "member_epoch": 7,
        "connectors": ["a", "b"],
        "tasks": [
            {"connector": "a", "task": 2},
            {"connector": "a", "task": 10},
            {"connector": "b", "task": 0},
            {"connector": "b", "task": 1},
        ],
        "fencing_tokens": {"connectors": {}, "tasks": []},
    }


def test_event_json_sorts_even_when_built_unsorted() -> None:
    event = RebalanceEvent(
        "assigned", "g", "m", 3, connectors=("z", "y"), tasks=(TaskId("z", 1), TaskId("y", 0))
    )
    data = event.to_json()
    assert list(data) == [
        "event",
        "group_id",
        "member_id",
        "member_epoch",
        "connectors",
        "tasks",
        "fencing_tokens",
        "configs",
        "target_states",
    ]
    assert data["connectors"] == ["y", "z"]
    assert data["tasks"] == [{"connector": "y", "task": 0}, {"connector": "z", "task": 1}]


def test_empty_event_has_empty_lists() -> None:
    event = RebalanceEvent.from_resources(
        "assigned", ResourceSet(), group_id="g", member_id="m", member_epoch=1
    )
    assert event.to_json()["connectors"] == []
    assert event.to_json()["tasks"] == []


def test_from_resources_round_trips_through_resources() -> None:
    resources = ResourceSet.of(["a"], [("a", 0), ("a", 1)])
    event = RebalanceEvent.from_resources(
        "assigned", resources, group_id="g", member_id="m", member_epoch=2
    )
    assert event.connectors == ("a",)
    assert event.tasks == (TaskId("a", 0), TaskId("a", 1))
    assert event.resources == resources


def test_event_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="event must be one of"):
        RebalanceEvent("halted", "g", "m", 1)  # type: ignore[arg-type]


def test_callback_listener_calls_the_matching_callback() -> None:
    seen: list[tuple[str, RebalanceEvent]] = []
    listener = CallbackListener(
        on_revoked=lambda e: seen.append(("revoked", e)),
        on_assigned=lambda e: seen.append(("assigned", e)),
    )
    assert isinstance(listener, WorkerRebalanceListener)
    revoked, assigned = make_event("revoked"), make_event("assigned")
    dispatch(listener, revoked)
    dispatch(listener, assigned)
    assert seen == [("revoked", revoked), ("assigned", assigned)]


def test_callback_listener_without_callbacks_does_nothing() -> None:
    listener = CallbackListener()
    listener.on_revoked(make_event("revoked"))
    listener.on_assigned(make_event("assigned"))


def test_composite_calls_in_order_and_stops_at_the_first_failure() -> None:
    calls: list[str] = []

    def failing(_: RebalanceEvent) -> None:
        calls.append("second")
        raise ListenerFailed("nope")

    composite = CompositeListener(
        [
            CallbackListener(on_revoked=lambda _: calls.append("first")),
            CallbackListener(on_revoked=failing, on_assigned=lambda _: calls.append("second")),
            CallbackListener(
                on_revoked=lambda _: calls.append("third"),
                on_assigned=lambda _: calls.append("third"),
            ),
        ]
    )
    with pytest.raises(ListenerFailed, match="nope"):
        composite.on_revoked(make_event("revoked"))
    assert calls == ["first", "second"]
    calls.clear()
    composite.on_assigned(make_event("assigned"))
    assert calls == ["second", "third"]


class Flaky:
    """Fails `failures` times, then succeeds; optionally sets `stop` on a given attempt."""

    def __init__(
        self, failures: int, *, stop: threading.Event | None = None, stop_on: int = 0
    ) -> None:
        self.failures = failures
        self.attempts = 0
        self.stop = stop
        self.stop_on = stop_on

    def __call__(self) -> None:
        self.attempts += 1
        if self.stop is not None and self.attempts == self.stop_on:
            self.stop.set()
        if self.attempts <= self.failures:
            raise ListenerFailed(f"failure {self.attempts}")


def retry_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOG.name]


def test_call_with_retry_retries_until_success_and_logs_each_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    call = Flaky(3)
    ok = call_with_retry(
        call,
        what="on_revoked hook",
        stop=threading.Event(),
        initial_backoff_s=0.001,
        max_backoff_s=0.01,
        log=LOG,
    )
    assert ok is True
    assert call.attempts == 4
    records = retry_records(caplog)
    failures = [r for r in records if r.levelno == logging.ERROR]
    assert [r.attempt for r in failures] == [1, 2, 3]  # type: ignore[attr-defined]
    for n, record in enumerate(failures, start=1):
        message = record.getMessage()
        assert "on_revoked hook" in message
        assert f"attempt {n}" in message
        assert f"failure {n}" in message
    assert records[-1].levelno == logging.WARNING
    assert "succeeded on attempt 4" in records[-1].getMessage()


def test_call_with_retry_doubles_the_backoff_up_to_the_cap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    ok = call_with_retry(
        Flaky(5),
        what="x",
        stop=threading.Event(),
        initial_backoff_s=0.001,
        max_backoff_s=0.004,
        log=LOG,
    )
    assert ok
    waits = [r.retry_in_s for r in retry_records(caplog) if r.levelno == logging.ERROR]  # type: ignore[attr-defined]
    assert waits == [0.001, 0.002, 0.004, 0.004, 0.004]


def test_call_with_retry_jitter_only_shortens_the_wait(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    call_with_retry(
        Flaky(4),
        what="x",
        stop=threading.Event(),
        initial_backoff_s=0.002,
        max_backoff_s=0.002,
        jitter=0.5,
        log=LOG,
    )
    waits = [r.retry_in_s for r in retry_records(caplog) if r.levelno == logging.ERROR]  # type: ignore[attr-defined]
    assert len(waits) == 4
    assert all(0.001 <= w <= 0.002 for w in waits)


def test_call_with_retry_first_success_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    assert call_with_retry(Flaky(0), what="x", stop=threading.Event(), log=LOG)
    assert retry_records(caplog) == []


def test_call_with_retry_gives_up_when_stop_is_set(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    stop = threading.Event()
    call = Flaky(100, stop=stop, stop_on=3)
    ok = call_with_retry(
        call, what="hook", stop=stop, initial_backoff_s=0.001, max_backoff_s=0.001, log=LOG
    )
    assert ok is False
    assert call.attempts == 3
    last = retry_records(caplog)[-1]
    assert last.levelno == logging.ERROR
    assert "giving up" in last.getMessage()


def test_call_with_retry_still_makes_the_first_attempt_when_stop_is_already_set() -> None:
    stop = threading.Event()
    stop.set()
    succeeding = Flaky(0)
    assert call_with_retry(succeeding, what="x", stop=stop, log=LOG) is True
    failing = Flaky(1)
    assert call_with_retry(failing, what="x", stop=stop, log=LOG) is False
    assert failing.attempts == 1


def test_call_with_retry_wakes_from_a_long_backoff_when_stop_is_set() -> None:
    stop = threading.Event()
    call = Flaky(100)
    timer = threading.Timer(0.1, stop.set)
    timer.start()
    started = time.monotonic()
    try:
        ok = call_with_retry(
            call, what="x", stop=stop, initial_backoff_s=30.0, max_backoff_s=30.0, log=LOG
        )
    finally:
        timer.cancel()
    assert ok is False
    assert call.attempts == 1
    assert time.monotonic() - started < 5.0


def test_call_with_retry_logs_a_traceback_for_unexpected_exceptions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    attempts = []

    def buggy() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise KeyError("missing")

    assert call_with_retry(
        buggy, what="callback", stop=threading.Event(), log=LOG, initial_backoff_s=0.001
    )
    failure = retry_records(caplog)[0]
    assert failure.exc_info is not None
    assert failure.exc_info[0] is KeyError


def test_call_with_retry_does_not_swallow_base_exceptions() -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        call_with_retry(interrupted, what="x", stop=threading.Event(), log=LOG)


@pytest.mark.parametrize(
    ("initial", "maximum", "jitter"), [(0.0, 1.0, 0.0), (2.0, 1.0, 0.0), (0.1, 1.0, 1.5)]
)
def test_call_with_retry_rejects_bad_settings(
    initial: float, maximum: float, jitter: float
) -> None:
    with pytest.raises(ValueError):
        call_with_retry(
            Flaky(0),
            what="x",
            stop=threading.Event(),
            initial_backoff_s=initial,
            max_backoff_s=maximum,
            jitter=jitter,
            log=LOG,
        )
