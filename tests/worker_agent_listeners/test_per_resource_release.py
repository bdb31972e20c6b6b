"""Per-resource release at the listener level (DESIGN 3.11 "Partial release") and fencing tokens in
the listener's events (DESIGN 3.18):

- `RebalanceEvent.release` and the JSON's `fencing_tokens`; `CompositeListener` lets only its
  last listener release early.
- The exec hook in `per-resource` mode (real subprocesses): `{"released": ...}` lines on its
  standard output release those resources while it still runs; a failure keeps what it had
  reported released and nothing else; other output is ignored; `batch` mode ignores such lines.
- The webhook in `per-resource` mode (a real HTTP server): one POST per resource, at most
  `concurrency` at a time, each released on its 2xx; a failing one fails the call after the
  others completed.
- The CLI's `--release` and `--webhook-concurrency`.

What the agent does with releases (acknowledging them to the coordinator) is tested in
tests/worker_agent_membership.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from connect_protocol.tokens import FencingTokens
from worker_agent import cli
from worker_agent.hooks import ExecHookListener, WebhookListener, event_body, parse_release_line
from worker_agent.listener import (
    CallbackListener,
    CompositeListener,
    ListenerFailed,
    RebalanceEvent,
)

RESOURCES = ResourceSet.of(["orders"], [("orders", 0), ("orders", 1)])
TOKENS = FencingTokens({"orders": 41, TaskId("orders", 0): 42, TaskId("orders", 1): 43})


@dataclass
class Releases:
    """A releaser that records what it was given and when (time.monotonic())."""

    calls: list[tuple[float, ResourceSet]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, resources: ResourceSet) -> None:
        with self.lock:
            self.calls.append((time.monotonic(), resources))

    @property
    def released(self) -> ResourceSet:
        out = EMPTY
        for _, r in self.calls:
            out = out | r
        return out

    def sets(self) -> list[ResourceSet]:
        return [r for _, r in self.calls]


def revoked(releases: Releases | None = None, resources: ResourceSet = RESOURCES) -> RebalanceEvent:
    return RebalanceEvent.from_resources(
        "revoked",
        resources,
        group_id="demo",
        member_id="worker-1",
        member_epoch=12,
        fencing_tokens=TOKENS,
        releaser=releases,
    )


# --- the event ------------------------------------------------------------------------------


def test_release_hands_the_resources_to_the_releaser_in_any_form() -> None:
    releases = Releases()
    event = revoked(releases)
    event.release("orders")
    event.release(TaskId("orders", 1))
    event.release(ResourceSet.of((), [("orders", 0)]), "orders")
    assert releases.sets() == [
        ResourceSet.of(["orders"]),
        ResourceSet.of((), [("orders", 1)]),
        RESOURCES - ResourceSet.of((), [("orders", 1)]),
    ]
    event.release()  # nothing: no call
    assert len(releases.calls) == 3


def test_release_refuses_what_the_event_does_not_revoke_and_assigned_events() -> None:
    releases = Releases()
    event = revoked(releases)
    with pytest.raises(ValueError, match="does not revoke"):
        event.release("payments", "orders")
    with pytest.raises(TypeError):
        event.release(("orders", 0))  # type: ignore[arg-type]
    assigned = RebalanceEvent.from_resources(
        "assigned", RESOURCES, group_id="g", member_id="m", member_epoch=1
    )
    with pytest.raises(ValueError, match="revoked events only"):
        assigned.release("orders")
    assert releases.calls == []


def test_release_without_a_releaser_only_checks() -> None:
    revoked().release("orders")
    with pytest.raises(ValueError):
        revoked().release("nope")


def test_the_releaser_is_not_part_of_the_events_value() -> None:
    assert revoked(Releases()) == revoked()
    assert "releaser" not in repr(revoked(Releases()))
    assert revoked(Releases()).without_releaser().releaser is None


def test_event_json_carries_the_tokens_of_its_resources_only() -> None:
    event = RebalanceEvent.from_resources(
        "assigned",
        ResourceSet.of(["orders"], [("orders", 1)]),
        group_id="g",
        member_id="m",
        member_epoch=3,
        fencing_tokens=TOKENS,
    )
    data = event.to_json()
    assert data["fencing_tokens"] == {
        "connectors": {"orders": 41},
        "tasks": [{"connector": "orders", "task": 1, "token": 43}],
    }
    assert list(data)[:6] == [
        "event",
        "group_id",
        "member_id",
        "member_epoch",
        "connectors",
        "tasks",
    ]


def test_only_narrows_resources_and_tokens_and_keeps_the_releaser() -> None:
    releases = Releases()
    one = revoked(releases).only(ResourceSet.of((), [("orders", 0)]))
    assert one.resources == ResourceSet.of((), [("orders", 0)])
    assert one.fencing_tokens == FencingTokens({TaskId("orders", 0): 42})
    one.release(TaskId("orders", 0))
    assert releases.sets() == [ResourceSet.of((), [("orders", 0)])]
    with pytest.raises(ValueError):
        one.release("orders")  # not this narrowed event's


def test_a_callback_listener_can_release_one_by_one() -> None:
    releases = Releases()

    def stop(event: RebalanceEvent) -> None:
        for connector in event.connectors:
            event.release(connector)
        for task in event.tasks:
            event.release(task)

    CallbackListener(on_revoked=stop).on_revoked(revoked(releases))
    assert releases.sets() == [
        ResourceSet.of(["orders"]),
        ResourceSet.of((), [("orders", 0)]),
        ResourceSet.of((), [("orders", 1)]),
    ]


def test_composite_lets_only_its_last_listener_release_early() -> None:
    releases = Releases()
    seen: list[str] = []

    def first(event: RebalanceEvent) -> None:
        seen.append("first")
        event.release(event.resources)  # the second has not stopped them yet: ignored

    def last(event: RebalanceEvent) -> None:
        seen.append("last")
        event.release("orders")

    CompositeListener(
        [CallbackListener(on_revoked=first), CallbackListener(on_revoked=last)]
    ).on_revoked(revoked(releases))
    assert seen == ["first", "last"]
    assert releases.sets() == [ResourceSet.of(["orders"])]


# --- release lines ----------------------------------------------------------------------------


def test_parse_release_line() -> None:
    assert parse_release_line(b'{"released": {"connectors": ["a"]}}\n') == ResourceSet.of(["a"])
    assert parse_release_line('{"released": {"tasks": [{"connector": "a", "task": 2}]}}') == (
        ResourceSet.of((), [("a", 2)])
    )
    assert parse_release_line(b'{"released": {}}') == EMPTY
    for other in (b"stopping a...", b"", b"{not json", b'{"level": "info"}', b"[1, 2]"):
        assert parse_release_line(other) is None
    for bad in (
        b'{"released": ["a"]}',
        b'{"released": {"connectors": "a"}}',
        b'{"released": {"connectors": [1]}}',
        b'{"released": {"tasks": [{"connector": "a"}]}}',
        b'{"released": {"tasks": [{"connector": "a", "task": "0"}]}}',
        b'{"released": {"tasks": [{"connector": "a", "task": true}]}}',
    ):
        with pytest.raises(ValueError):
            parse_release_line(bad)


# --- the exec hook ------------------------------------------------------------------------------

#: argv: OUT PAUSE_S EXIT_CODE HOW_MANY [EXTRA_LINE]. Records the event, then reports HOW_MANY of
#: its resources released, one line each, PAUSE_S apart; prints EXTRA_LINE (if any) first;
#: exits EXIT_CODE.
PER_RESOURCE_HOOK = r"""
import json, sys, time
out, pause, code, how_many = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
event = json.loads(sys.stdin.read())
with open(out, "w") as f:
    json.dump(event, f)
if len(sys.argv) > 5:
    print(sys.argv[5], flush=True)
singles = [{"connectors": [c]} for c in event["connectors"]]
singles += [{"tasks": [t]} for t in event["tasks"]]
for released in singles[:how_many]:
    time.sleep(pause)
    print(json.dumps({"released": released}), flush=True)
time.sleep(pause)
sys.exit(code)
"""


def per_resource_hook(
    *args: str, timeout_s: float = 10.0, release: str = "per-resource"
) -> ExecHookListener:
    return ExecHookListener(
        [sys.executable, "-c", PER_RESOURCE_HOOK, *args],
        timeout_s=timeout_s,
        release=release,  # type: ignore[arg-type]
    )


def test_exec_hook_releases_each_resource_as_its_line_arrives(tmp_path: Path) -> None:
    releases = Releases()
    out = tmp_path / "event.json"
    started = time.monotonic()
    per_resource_hook(str(out), "0.25", "0", "3").on_revoked(revoked(releases))
    returned = time.monotonic()
    assert releases.sets() == [
        ResourceSet.of(["orders"]),
        ResourceSet.of((), [("orders", 0)]),
        ResourceSet.of((), [("orders", 1)]),
    ]
    times = [t - started for t, _ in releases.calls]
    # Each line was acted on while the hook still ran (it sleeps 0.25 s between lines and
    # after the last), not when it exited.
    assert times[0] < returned - started - 0.4, times
    assert times[1] < returned - started - 0.15, times
    assert times[0] < times[1] < times[2] < returned - started
    event = json.loads(out.read_text())
    assert event["release"] == "per-resource"
    assert event["fencing_tokens"] == TOKENS.to_json()
    assert {k: v for k, v in event.items() if k not in ("release",)} == revoked().to_json()


def test_exec_hook_exit_0_after_reporting_some_leaves_the_rest_to_the_caller(
    tmp_path: Path,
) -> None:
    releases = Releases()
    per_resource_hook(str(tmp_path / "e"), "0.01", "0", "1").on_revoked(revoked(releases))
    # The hook reported one and exited 0: on_revoked returns, which releases the rest (the
    # agent's part: tests/worker_agent_membership/test_agent_partial_release.py).
    assert releases.released == ResourceSet.of(["orders"])


def test_a_failing_exec_hook_releases_only_what_it_reported(tmp_path: Path) -> None:
    releases = Releases()
    with pytest.raises(ListenerFailed) as failed:
        per_resource_hook(str(tmp_path / "e"), "0.01", "3", "2").on_revoked(revoked(releases))
    assert failed.value.exit_code == 3
    assert releases.released == ResourceSet.of(["orders"], [("orders", 0)])


def test_a_hanging_exec_hook_keeps_what_it_reported_before_it_was_killed() -> None:
    script = r"""
import json, sys, time
sys.stdin.read()
print(json.dumps({"released": {"connectors": ["orders"]}}), flush=True)
time.sleep(30)
"""
    releases = Releases()
    started = time.monotonic()
    with pytest.raises(ListenerFailed) as failed:
        ExecHookListener(
            [sys.executable, "-c", script], timeout_s=0.8, release="per-resource"
        ).on_revoked(revoked(releases))
    assert failed.value.timed_out
    assert time.monotonic() - started < 5
    assert releases.released == ResourceSet.of(["orders"])


def test_other_output_malformed_lines_and_unknown_resources_are_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    script = r"""
import json, sys
sys.stdin.read()
print("stopping orders ...")
print(json.dumps({"level": "info", "msg": "hi"}))
print(json.dumps({"released": {"connectors": "orders"}}))
print(json.dumps({"released": {"connectors": ["payments", "orders"]}}))
sys.stdout.write(json.dumps({"released": {"tasks": [{"connector": "orders", "task": 1}]}}))
"""
    releases = Releases()
    caplog.set_level(logging.WARNING, logger="worker_agent.hooks")
    ExecHookListener([sys.executable, "-c", script], release="per-resource").on_revoked(
        revoked(releases)
    )
    # The unterminated last line still counts: the hook had exited.
    assert releases.sets() == [ResourceSet.of(["orders"]), ResourceSet.of((), [("orders", 1)])]
    messages = " | ".join(r.getMessage() for r in caplog.records)
    assert "malformed release line" in messages
    assert "[payments]" in messages and "does not revoke" in messages


def test_batch_mode_ignores_release_lines(tmp_path: Path) -> None:
    releases = Releases()
    out = tmp_path / "event.json"
    per_resource_hook(str(out), "0.01", "0", "3", release="batch").on_revoked(revoked(releases))
    assert releases.calls == []
    assert json.loads(out.read_text())["release"] == "batch"


def test_assigned_events_in_per_resource_mode_are_one_plain_call(tmp_path: Path) -> None:
    out = tmp_path / "event.json"
    assigned = RebalanceEvent.from_resources(
        "assigned", RESOURCES, group_id="g", member_id="m", member_epoch=4, fencing_tokens=TOKENS
    )
    per_resource_hook(str(out), "0.01", "0", "0").on_assigned(assigned)
    event = json.loads(out.read_text())
    assert event["event"] == "assigned"
    assert event["release"] == "per-resource"
    assert event["fencing_tokens"]["tasks"] == [
        {"connector": "orders", "task": 0, "token": 42},
        {"connector": "orders", "task": 1, "token": 43},
    ]


def test_exec_hook_rejects_an_unknown_release_mode() -> None:
    with pytest.raises(ValueError, match="release"):
        ExecHookListener(["true"], release="sometimes")  # type: ignore[arg-type]


# --- the webhook --------------------------------------------------------------------------------


@dataclass
class Receiver:
    """Answers `status_for(resource names)` after `delay_for(resource names)` seconds, and counts
    how many requests it handles at once."""

    url: str
    bodies: list[dict[str, object]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    status_for: dict[str, int] = field(default_factory=dict)
    delay_for: dict[str, float] = field(default_factory=dict)
    default_delay_s: float = 0.0


def names(body: dict[str, object]) -> list[str]:
    connectors = list(body["connectors"])  # type: ignore[call-overload]
    tasks = [f"{t['connector']}-{t['task']}" for t in body["tasks"]]  # type: ignore[attr-defined]
    return connectors + tasks


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            key = ",".join(names(body))
            with state.lock:
                state.bodies.append(body)
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            time.sleep(state.delay_for.get(key, state.default_delay_s))
            with state.lock:
                state.in_flight -= 1
            status = state.status_for.get(key, 200)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    state = Receiver(url=f"http://127.0.0.1:{httpd.server_address[1]}/hook")
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


MANY = ResourceSet.of(["a", "b"], [("a", 0), ("a", 1), ("b", 0), ("b", 1)])
MANY_TOKENS = FencingTokens.granted(MANY, 5).with_grant(ResourceSet.of((), [("b", 1)]), 9)


def test_webhook_per_resource_posts_each_resource_concurrently_and_releases_each(
    receiver: Receiver,
) -> None:
    receiver.default_delay_s = 0.15
    receiver.delay_for["a"] = 0.6  # slow: the others are released before it answers
    releases = Releases()
    event = RebalanceEvent.from_resources(
        "revoked",
        MANY,
        group_id="g",
        member_id="w",
        member_epoch=4,
        fencing_tokens=MANY_TOKENS,
        releaser=releases,
    )
    WebhookListener(receiver.url, release="per-resource", concurrency=3).on_revoked(event)
    assert sorted(",".join(names(b)) for b in receiver.bodies) == sorted(MANY.names())
    assert receiver.max_in_flight == 3  # bounded, and used
    for body in receiver.bodies:
        assert body["event"] == "revoked"
        assert body["release"] == "per-resource"
        assert body["member_epoch"] == 4
        (name,) = names(body)
        token = 9 if name == "b-1" else 5
        if body["connectors"]:
            assert body["fencing_tokens"] == {"connectors": {name: token}, "tasks": []}
        else:
            (task,) = body["tasks"]  # type: ignore[misc]
            assert body["fencing_tokens"] == {"connectors": {}, "tasks": [{**task, "token": token}]}
    assert sorted(len(r) for r in releases.sets()) == [1] * 6
    assert releases.released == MANY
    assert releases.sets()[-1] == ResourceSet.of(["a"])  # released when its own answer came


def test_webhook_per_resource_failure_releases_the_others_then_fails(receiver: Receiver) -> None:
    receiver.status_for["a-1"] = 503
    releases = Releases()
    event = revoked(releases, MANY)
    hook = WebhookListener(receiver.url, release="per-resource", concurrency=2)
    with pytest.raises(ListenerFailed) as failed:
        hook.on_revoked(event)
    assert failed.value.status == 503
    assert "1 of 6" in str(failed.value) and "a-1" in str(failed.value)
    assert releases.released == MANY - ResourceSet.of((), [("a", 1)])
    # The retry (the agent calls it with the unreleased remainder) posts only that one.
    receiver.bodies.clear()
    receiver.status_for.clear()
    hook.on_revoked(event.only(ResourceSet.of((), [("a", 1)])))
    assert [names(b) for b in receiver.bodies] == [["a-1"]]
    assert releases.released == MANY


def test_webhook_batch_mode_is_one_post_for_the_whole_event(receiver: Receiver) -> None:
    releases = Releases()
    event = revoked(releases, MANY)
    WebhookListener(receiver.url).on_revoked(event)
    assert len(receiver.bodies) == 1
    assert receiver.bodies[0] == json.loads(event_body(event))
    assert receiver.bodies[0]["release"] == "batch"
    assert releases.calls == []


def test_webhook_per_resource_assigned_events_are_one_post(receiver: Receiver) -> None:
    assigned = RebalanceEvent.from_resources(
        "assigned", MANY, group_id="g", member_id="w", member_epoch=4, fencing_tokens=MANY_TOKENS
    )
    WebhookListener(receiver.url, release="per-resource").on_assigned(assigned)
    assert len(receiver.bodies) == 1
    assert receiver.bodies[0]["fencing_tokens"] == MANY_TOKENS.to_json()


def test_webhook_rejects_bad_release_settings() -> None:
    with pytest.raises(ValueError):
        WebhookListener("http://127.0.0.1/x", release="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        WebhookListener("http://127.0.0.1/x", release="per-resource", concurrency=0)


# --- the CLI ------------------------------------------------------------------------------------


def parse(*argv: str) -> object:
    return cli._parser().parse_args(["run", *argv])


def test_cli_release_flag_reaches_both_hooks() -> None:
    args = parse(
        "--exec-hook",
        "/bin/true",
        "--webhook",
        "http://127.0.0.1:1/x",
        "--release",
        "per-resource",
        "--webhook-concurrency",
        "3",
    )
    listener = cli.build_listener(args)  # type: ignore[arg-type]
    assert isinstance(listener, CompositeListener)
    hook, webhook = listener.listeners
    assert isinstance(hook, ExecHookListener) and hook.release == "per-resource"
    assert isinstance(webhook, WebhookListener)
    assert (webhook.release, webhook.concurrency) == ("per-resource", 3)


def test_cli_release_defaults_to_batch_and_reads_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hook = cli.build_listener(parse("--exec-hook", "/bin/true"))  # type: ignore[arg-type]
    assert isinstance(hook, ExecHookListener) and hook.release == "batch"
    monkeypatch.setenv("WORKER_AGENT_RELEASE", "per-resource")
    hook = cli.build_listener(parse("--exec-hook", "/bin/true"))  # type: ignore[arg-type]
    assert isinstance(hook, ExecHookListener) and hook.release == "per-resource"


def test_cli_refuses_an_unknown_release_mode_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORKER_AGENT_RELEASE", "sometimes")
    assert cli.main(["run", "--coordinator", "127.0.0.1:1", "--log-format", "text"]) == 2
    assert "WORKER_AGENT_RELEASE" in capsys.readouterr().err
