"""The agent's configs and statuses without a coordinator (issue 28, DESIGN 2.3, 3.20): the
listener payload's `configs` and `target_states`, what the config cache makes of answers, the
status book's changes-only reports, the checks of a worker's report, the exec hook and the
webhook (values only at https or loopback), and the status endpoint's same-pod rule for config
values (a cross-site request and a rebinding Host get digests only) and POST /status."""

from __future__ import annotations

import http.client
import json
import logging
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from connect_protocol.errors import ErrorCode
from connect_protocol.lifecycle_messages import (
    ConfigsResponse,
    EntryResult,
    HeldConnector,
    ReportedState,
    TargetState,
)
from connect_protocol.resources import ResourceSet, TaskId
from connect_protocol.tokens import FencingTokens
from worker_agent.hooks import ExecHookListener, WebhookListener, webhook_gets_config_values
from worker_agent.lifecycle import (
    ConfigCache,
    ConnectorConfig,
    StatusBook,
    parse_status_report,
    reported_state_for,
)
from worker_agent.listener import CallbackListener, ListenerFailed, RebalanceEvent, dispatch
from worker_agent.status import StatusServer, refusal_of_state_change

SECRET = "pa55word-which-must-not-leak"
A = ConnectorConfig("d-a1", {"topic": "orders", "password": SECRET})
B = ConnectorConfig("d-b1", {"topic": "b"}, TargetState.PAUSED)
HELD = ResourceSet.of(["a"], [("a", 0), ("b", 1)])
TOKENS = FencingTokens({"a": 3, TaskId("a", 0): 3, TaskId("b", 1): 4})


def event(kind: str = "assigned", resources: ResourceSet = HELD) -> RebalanceEvent:
    return RebalanceEvent.from_resources(
        kind,  # type: ignore[arg-type]
        resources,
        group_id="g",
        member_id="w1",
        member_epoch=7,
        fencing_tokens=TOKENS,
        configs={"a": A, "b": B, "c": ConnectorConfig("d-c", {"x": "y"})},
    )


# --- the payload ------------------------------------------------------------------------------


def test_assigned_carries_the_configs_and_target_states_of_its_connectors_only() -> None:
    data = event().to_json()
    assert data["configs"] == {
        "a": {"digest": "d-a1", "config": {"password": SECRET, "topic": "orders"}},
        "b": {"digest": "d-b1", "config": {"topic": "b"}},
    }  # never c: none of its resources is in the event
    assert data["target_states"] == {"a": "STARTED", "b": "PAUSED"}
    digests = event().to_json(config_values=False)["configs"]
    assert digests == {"a": {"digest": "d-a1"}, "b": {"digest": "d-b1"}}
    assert SECRET not in repr(event()) and SECRET not in repr(A)  # repr shows digests


def test_reconfigured_has_the_same_shape_and_revoked_carries_no_configs() -> None:
    assert event("reconfigured").to_json()["configs"] == event().to_json()["configs"]
    revoked = event("revoked").to_json()
    assert "configs" not in revoked and "target_states" not in revoked
    only = event().only(ResourceSet.of([], [("b", 1)]))
    assert set(only.configs) == {"b"}


def test_a_listener_without_on_reconfigured_is_not_called_for_it() -> None:
    class Old:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def on_revoked(self, e: RebalanceEvent) -> None:
            self.calls.append(e.event)

        def on_assigned(self, e: RebalanceEvent) -> None:
            self.calls.append(e.event)

    old = Old()
    dispatch(old, event("reconfigured"))
    assert old.calls == []
    got: list[RebalanceEvent] = []
    dispatch(CallbackListener(on_reconfigured=got.append), event("reconfigured"))
    assert [e.event for e in got] == ["reconfigured"]


# --- the config cache ---------------------------------------------------------------------------


def answer(revision: int, *held: HeldConnector) -> ConfigsResponse:
    return ConfigsResponse(lifecycle_revision=revision, connectors=held)


def test_the_cache_takes_values_once_and_tells_what_changed() -> None:
    cache = ConfigCache()
    first = cache.apply(
        answer(1, HeldConnector("a", "d1", {"k": "v"}), HeldConnector("b", "e1", {"k": "w"}))
    )
    assert first.added == {"a", "b"} and not first.reconfigured
    assert cache.known_digests() == {"a": "d1", "b": "e1"}
    # Known digests come back without values; a new digest with them; b moved away.
    second = cache.apply(
        answer(2, HeldConnector("a", "d1", None), HeldConnector("c", "f1", {"k": "x"}))
    )
    assert second.confirmed == {"a", "c"} and second.dropped == {"b"} and second.added == {"c"}
    assert cache.get("a") == ConnectorConfig("d1", {"k": "v"})
    third = cache.apply(answer(3, HeldConnector("a", "d2", {"k": "v2"})), keep={"c"})
    assert third.reconfigured == {"a"} and third.confirmed == {"a"} and "c" in cache
    assert cache.revision == 3
    # Values withheld for a digest the cache does not have: asked again without it.
    fourth = cache.apply(answer(4, HeldConnector("z", "q1", None)))
    assert fourth.missing == {"z"} and "z" not in cache.known_digests()


# --- statuses -------------------------------------------------------------------------------------


def test_the_status_book_sends_changes_only_one_report_at_a_time() -> None:
    book = StatusBook()
    assert book.set("a", ReportedState.RUNNING, "", 3)
    assert book.set(TaskId("a", 0), ReportedState.FAILED, "boom", 3)
    sent = book.take()
    assert [(e.resource, e.state, e.token) for e in sent] == [
        ("a", ReportedState.RUNNING, 3),
        (TaskId("a", 0), ReportedState.FAILED, 3),
    ]
    assert book.take() == () and not book.pending()  # one in flight
    book.set(TaskId("a", 0), ReportedState.RUNNING, "", 3)  # changed meanwhile
    refused = book.answered(
        [EntryResult("a", ErrorCode.NOT_RESOURCE_OWNER, "moved"), EntryResult(TaskId("a", 0))]
    )
    assert [r.resource for r in refused] == ["a"]
    # a is dropped, not retried; A-0's newer state is still to send.
    assert [(e.resource, e.state) for e in book.take()] == [(TaskId("a", 0), ReportedState.RUNNING)]
    book.answered([EntryResult(TaskId("a", 0))])
    assert not book.set(TaskId("a", 0), ReportedState.RUNNING, "", 3)  # no change
    book.retoken(FencingTokens({TaskId("a", 0): 9}))  # granted again: report again
    assert [e.token for e in book.take()] == [9]
    book.failed()  # no answer: sent again later
    assert book.pending()
    book.forget(ResourceSet.of([], [("a", 0)]))  # stopped: nothing more to say
    assert not book.pending()


def test_a_successful_start_reports_the_target_state() -> None:
    assert reported_state_for(TargetState.STARTED, "a") is ReportedState.RUNNING
    assert reported_state_for(TargetState.PAUSED, TaskId("a", 0)) is ReportedState.PAUSED
    assert reported_state_for(TargetState.STOPPED, "a") is ReportedState.STOPPED
    assert reported_state_for(TargetState.STOPPED, TaskId("a", 0)) is ReportedState.PAUSED


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "must be a JSON object"),
        ({"state": "RUNNING"}, '"connector" must be'),
        ({"connector": "a", "state": "DONE"}, '"state" must be one of'),
        ({"connector": "a", "task": -1, "state": "RUNNING"}, '"task" must be'),
        ({"connector": "a", "task": True, "state": "RUNNING"}, '"task" must be'),
        ({"connector": "a", "task": 0, "state": "STOPPED"}, "connector's state only"),
        ({"connector": "a", "state": "FAILED", "trace": 7}, '"trace" must be'),
        ({"connector": "a", "state": "FAILED", "extra": 1}, "unknown keys"),
    ],
)
def test_a_bad_status_report_says_what_is_wrong(body: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_status_report(body)


def test_a_good_status_report_is_read() -> None:
    parsed = parse_status_report({"connector": "a", "task": 2, "state": "failed", "trace": "t"})
    assert parsed == (TaskId("a", 2), ReportedState.FAILED, "t")


# --- hooks ----------------------------------------------------------------------------------------


def test_the_exec_hook_gets_the_values_on_stdin_and_never_echoes_them_into_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "stdin.json"
    script = "import sys; open(sys.argv[1], 'w').write(sys.stdin.read())"
    ExecHookListener([sys.executable, "-c", script, str(out)]).on_assigned(event())
    assert json.loads(out.read_text())["configs"]["a"]["config"]["password"] == SECRET
    echo = "import sys; data = sys.stdin.read(); print(data); print(data, file=sys.stderr)"
    caplog.set_level(logging.DEBUG)
    ExecHookListener([sys.executable, "-c", echo]).on_reconfigured(event("reconfigured"))
    failing = echo + "; sys.exit(3)"
    with pytest.raises(ListenerFailed) as failed:
        ExecHookListener([sys.executable, "-c", failing]).on_assigned(event())
    assert SECRET not in str(failed.value) and "***" in failed.value.stderr_tail
    assert "succeeded; stdout:" in caplog.text and SECRET not in caplog.text


def test_webhooks_get_values_at_https_or_loopback_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for url in ("https://w.example/hook", "http://127.0.0.1:8/h", "http://localhost/h"):
        assert webhook_gets_config_values(url), url
    assert webhook_gets_config_values("http://[::1]:8/h")
    for url in ("http://worker.example/h", "http://10.0.0.7:8080/h"):
        assert not webhook_gets_config_values(url), url
    caplog.set_level(logging.WARNING)
    remote = WebhookListener("http://worker.example/h")
    assert not remote.config_values
    assert "neither https nor a loopback address" in caplog.text
    caplog.clear()
    assert WebhookListener("https://worker.example/h").config_values
    assert not caplog.text


def test_a_loopback_webhook_receives_the_values() -> None:
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            size = int(self.headers["Content-Length"])
            bodies.append(json.loads(self.rfile.read(size)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        WebhookListener(f"http://127.0.0.1:{httpd.server_address[1]}/h").on_assigned(event())
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert bodies[0]["configs"]["a"]["config"]["password"] == SECRET


# --- the status endpoint ------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[StatusServer]:
    status = StatusServer("g", "w1", keepalive_s=0.2)
    status.start()
    status.update(7, HELD, TOKENS, configs={"a": A, "b": B, "c": A})
    try:
        yield status
    finally:
        status.close()


def request(
    server: StatusServer, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, path, body=body or None, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def own(server: StatusServer, endpoint: str) -> dict[str, str]:
    return {"Host": f"127.0.0.1:{server.port}", "X-Worker-Agent": endpoint}


def test_assignment_shows_config_values_to_the_worker_in_the_pod_only(
    server: StatusServer,
) -> None:
    code, mine = request(server, "GET", "/assignment", own(server, "assignment"))
    assert code == 200 and mine["configs"]["a"]["config"]["password"] == SECRET
    assert set(mine["configs"]) == {"a", "b"} and "configs_withheld" not in mine
    assert mine["target_states"] == {"a": "STARTED", "b": "PAUSED"}
    rebinding = {"Host": f"attacker.example:{server.port}", "X-Worker-Agent": "assignment"}
    cross_site = {**own(server, "assignment"), "Origin": "http://attacker.example"}
    fetch_site = {**own(server, "assignment"), "Sec-Fetch-Site": "cross-site"}
    for headers, rule in (
        (rebinding, "host"),
        (cross_site, "cross-site"),
        (fetch_site, "cross-site"),
        ({"Host": f"127.0.0.1:{server.port}"}, "header"),
    ):
        code, seen = request(server, "GET", "/assignment", headers)
        assert code == 200 and seen["configs_withheld"]["rule"] == rule, (headers, seen)
        assert seen["configs"] == {"a": {"digest": "d-a1"}, "b": {"digest": "d-b1"}}
        assert SECRET not in json.dumps(seen)
    assert SECRET not in json.dumps(server.snapshot())
    values: Any = server.snapshot(config_values=True)["configs"]
    assert values["a"]["config"]["password"] == SECRET


def test_the_same_pod_rule_is_leave_s_rule() -> None:
    headers = {"Host": "10.0.0.5:8084", "X-Worker-Agent": "assignment"}
    assert refusal_of_state_change("10.0.0.5", "10.0.0.5", "/assignment", headers, "GET") is None
    refused = refusal_of_state_change("10.0.0.9", "10.0.0.5", "/assignment", headers, "GET")
    assert refused is not None and refused[0] == "same-pod-address"


def watch_first(server: StatusServer, headers: dict[str, str]) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request("GET", "/watch", headers=headers)
        resp = conn.getresponse()
        while True:
            line = resp.fp.readline().decode()
            if line.startswith("data: "):
                data: dict[str, Any] = json.loads(line[len("data: ") :])
                return data
    finally:
        conn.close()


def test_watch_follows_the_same_rule_and_sends_a_changed_config(server: StatusServer) -> None:
    assert watch_first(server, own(server, "watch"))["configs"]["a"]["config"]["password"] == (
        SECRET
    )
    rebinding = {"Host": "attacker.example", "X-Worker-Agent": "watch"}
    seen = watch_first(server, rebinding)
    assert seen["configs_withheld"]["rule"] == "host" and SECRET not in json.dumps(seen)
    before = server._version
    server.set_configs({"a": ConnectorConfig("d-a2", {"password": "new"}), "b": B})
    assert server._version == before + 1
    assert watch_first(server, own(server, "watch"))["configs"]["a"]["digest"] == "d-a2"


def test_post_status_checks_its_body_and_the_gate(server: StatusServer) -> None:
    got: list[object] = []

    def handler(body: object) -> tuple[int, dict[str, object]]:
        got.append(body)
        return 202, {"accepted": True}

    good = json.dumps({"connector": "a", "state": "FAILED", "trace": "t"}).encode()
    code, body = request(server, "POST", "/status", own(server, "status"), good)
    assert code == 404 and "no status reports" in body["error"]  # no handler yet
    server.set_report_handler(handler)
    code, body = request(server, "POST", "/status", own(server, "leave"), good)
    assert code == 403 and body["rule"] == "header"
    code, body = request(server, "POST", "/status", own(server, "status"), b"{not json")
    assert code == 400 and "must be JSON" in body["error"]
    code, body = request(server, "POST", "/status", own(server, "status"), good)
    assert code == 202 and got == [{"connector": "a", "state": "FAILED", "trace": "t"}]
