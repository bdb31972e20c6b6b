"""WebhookListener against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from connect_protocol.resources import ResourceSet
from worker_agent.hooks import WebhookListener
from worker_agent.listener import ListenerFailed, RebalanceEvent

EVENT = RebalanceEvent.from_resources(
    "assigned",
    ResourceSet.of(["a", "b"], [("a", 0), ("b", 0), ("b", 1)]),
    group_id="g",
    member_id="w2",
    member_epoch=5,
)


@dataclass
class Receiver:
    """A webhook receiver: records requests, answers `status` (after `delay_s`)."""

    url: str
    status: int = 200
    delay_s: float = 0.0
    requests: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state: Receiver

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            state.requests.append((self.command, self.path, dict(self.headers), body))
            if state.delay_s:
                state.release.wait(state.delay_s)
            payload = b"receiver says no" if state.status >= 300 else b""
            self.send_response(state.status)
            if 300 <= state.status < 400:
                self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_POST = _handle
        do_GET = _handle

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    state = Receiver(url=f"http://127.0.0.1:{httpd.server_address[1]}/hooks/rebalance")
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_posts_the_event_json_and_succeeds_on_200(receiver: Receiver) -> None:
    WebhookListener(receiver.url, headers={"Authorization": "Bearer t0ken"}).on_assigned(EVENT)
    [(method, path, headers, body)] = receiver.requests
    assert (method, path) == ("POST", "/hooks/rebalance")
    assert headers["Content-Type"] == "application/json"
    assert headers["Authorization"] == "Bearer t0ken"
    assert json.loads(body) == {**EVENT.to_json(), "release": "batch"}


@pytest.mark.parametrize("status", [201, 202, 204])
def test_any_2xx_is_success(receiver: Receiver, status: int) -> None:
    receiver.status = status
    WebhookListener(receiver.url).on_revoked(EVENT)
    assert len(receiver.requests) == 1


def test_500_raises_naming_the_status(receiver: Receiver) -> None:
    receiver.status = 500
    hook = WebhookListener(receiver.url, headers={"Authorization": "Bearer t0ken"})
    with pytest.raises(ListenerFailed) as failed:
        hook.on_revoked(EVENT)
    assert failed.value.status == 500
    assert "answered 500" in str(failed.value)
    assert "receiver says no" in str(failed.value)
    assert "t0ken" not in str(failed.value)


def test_a_redirect_is_a_failure_not_followed(receiver: Receiver) -> None:
    receiver.status = 302
    with pytest.raises(ListenerFailed, match="answered 302") as failed:
        WebhookListener(receiver.url).on_revoked(EVENT)
    assert failed.value.status == 302
    assert [r[0] for r in receiver.requests] == ["POST"]  # no GET to /elsewhere


def test_connection_refused_raises() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on `port` now.
    with pytest.raises(ListenerFailed, match="refused") as failed:
        WebhookListener(f"http://127.0.0.1:{port}/x", timeout_s=2.0).on_assigned(EVENT)
    assert failed.value.status is None


def test_no_answer_within_the_timeout_raises(receiver: Receiver) -> None:
    receiver.delay_s = 10.0
    started = time.monotonic()
    with pytest.raises(ListenerFailed) as failed:
        WebhookListener(receiver.url, timeout_s=0.3).on_revoked(EVENT)
    assert time.monotonic() - started < 3.0
    assert failed.value.timed_out
    assert failed.value.status is None


def test_credentials_in_the_url_stay_out_of_messages() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    hook = WebhookListener(f"http://user:s3cret@127.0.0.1:{port}/x", timeout_s=2.0)
    assert "s3cret" not in repr(hook)
    with pytest.raises(ListenerFailed) as failed:
        hook.on_revoked(EVENT)
    assert "s3cret" not in str(failed.value)
    assert f"127.0.0.1:{port}" in str(failed.value)


def test_webhook_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        WebhookListener("ftp://example/x")
    with pytest.raises(ValueError):
        WebhookListener("http://127.0.0.1/x", timeout_s=0)
