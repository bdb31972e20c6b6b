"""What a worker pod's deletion relies on besides the kubelet (test_rehearsal.py runs it whole):
the agent's `POST /leave`, which a worker container's preStop hook (`worker-agent leave`) calls
and which answers once the agent has revoked everything and left, only to callers in the pod;
and the sample worker's webhook, which answers a revocation once the work has stopped."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.local import json_events, wait_for
from tests.support.coordinator import free_port
from worker_agent.status import StatusServer, same_pod

BIN = Path(sys.executable).parent


def _post(
    url: str, body: bytes = b"", timeout_s: float = 10, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, object]]:
    """POST as the pod's own callers do (with the agent's header, unless `headers` say)."""
    sent = {"X-Worker-Agent": "leave"} if headers is None else headers
    request = urllib.request.Request(url, data=body, method="POST", headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize(
    ("peer", "local", "same"),
    [
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.1", "10.1.2.3", True),
        ("::1", "::1", True),
        ("::ffff:127.0.0.1", "::ffff:10.1.2.3", True),
        ("10.1.2.3", "10.1.2.3", True),  # a container of the pod, dialling the pod's IP
        ("::ffff:10.1.2.3", "10.1.2.3", True),
        ("fd00::7", "fd00::7", True),
        ("10.1.2.1", "10.1.2.3", False),  # the kubelet, from the node
        ("10.9.9.9", "10.1.2.3", False),  # another pod
        ("::ffff:10.1.2.1", "::ffff:10.1.2.3", False),
        ("fd00::8", "fd00::7", False),
        ("not an address", "10.1.2.3", False),
    ],
)
def test_leave_is_accepted_from_the_pod_itself_only(peer: str, local: str, same: bool) -> None:
    assert same_pod(peer, local) is same


@pytest.fixture
def status() -> Iterator[StatusServer]:
    server = StatusServer("g", "w-0", host="0.0.0.0")
    server.start()
    try:
        yield server
    finally:
        server.close()


def test_post_leave_answers_once_the_agent_has_left_or_504_after_the_timeout(
    status: StatusServer,
) -> None:
    url = f"http://127.0.0.1:{status.port}/leave"
    assert _post(url)[0] == 404  # no handler: this agent does not leave on request
    left = threading.Event()
    calls: list[float] = []

    def handler(timeout_s: float) -> tuple[bool, str]:
        calls.append(timeout_s)
        return left.wait(timeout_s), "left" if left.is_set() else "still stopping A-0"

    status.set_leave_handler(handler)
    started = time.monotonic()
    code, body = _post(f"{url}?timeout_s=0.3")
    assert code == 504 and body["left"] is False and body["detail"] == "still stopping A-0"
    assert time.monotonic() - started >= 0.3 and calls == [0.3]
    threading.Timer(0.2, left.set).start()
    code, body = _post(url)  # the default timeout; answered when the agent has left
    assert code == 200 and body["left"] is True and body["group_id"] == "g", body
    assert calls[-1] == 60.0
    for bad in ("0", "-1", "nan", "x", "3601"):
        assert _post(f"{url}?timeout_s={bad}")[0] == 400, bad
    assert (
        _post(f"http://127.0.0.1:{status.port}/elsewhere", headers={"X-Worker-Agent": ""})[0] == 403
    )  # every POST passes the same gate first
    code, body = _post(url, headers={})
    assert code == 403 and body["rule"] == "header", body
    # The read-only endpoints are as they were.
    with urllib.request.urlopen(f"http://127.0.0.1:{status.port}/healthz", timeout=5) as resp:
        assert resp.status == 200


def test_worker_agent_leave_exits_0_once_left_and_1_otherwise(status: StatusServer) -> None:
    def leave(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "worker-agent"), "leave", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    url = f"--status-url=http://127.0.0.1:{status.port}"
    status.set_leave_handler(lambda timeout_s: (timeout_s == 7, f"asked for {timeout_s:g} s"))
    done = leave(url, "--timeout-s=7")
    assert done.returncode == 0 and "asked for 7 s" in done.stdout, done
    done = leave(url, "--timeout-s=2")
    assert done.returncode == 1 and "HTTP 504" in done.stderr, done
    done = leave(f"--status-url=http://127.0.0.1:{free_port()}", "--timeout-s=1")
    assert done.returncode == 1 and "cannot reach" in done.stderr, done
    assert leave(url, "--timeout-s=0").returncode == 2


def _event(kind: str, member: str, epoch: int, *names: str) -> bytes:
    return json.dumps(
        {
            "event": kind,
            "group_id": "g",
            "member_id": member,
            "member_epoch": epoch,
            "connectors": [n for n in names if not n[-1].isdigit()],
            "tasks": [
                {"connector": n.rpartition("-")[0], "task": int(n.rpartition("-")[2])}
                for n in names
                if n[-1].isdigit()
            ],
            "fencing_tokens": {"connectors": {}, "tasks": []},
            "release": "batch",
        }
    ).encode()


def test_sample_worker_webhook_stops_before_answering_and_follows_the_agent_process(
    tmp_path: Path,
) -> None:
    """--mode webhook (the manifests'): a revocation is answered once the work has stopped; an
    event or a status from another member id (a new agent process) stops everything first;
    SIGTERM stops the rest and the webhook closes."""
    agent = StatusServer("g", "w-0")
    agent.start()
    listen = f"127.0.0.1:{free_port()}"
    hook = f"http://{listen}/events"
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "examples.sample_worker", "--poll-interval-s", "0.2"],
            env={
                "SAMPLE_WORKER_MODE": "webhook",
                "SAMPLE_WORKER_LISTEN": listen,
                "SAMPLE_WORKER_STATUS_URL": f"http://127.0.0.1:{agent.port}",
                "PATH": "",
            },
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def running() -> dict[str, object]:
            found = json_events(log.read_text().splitlines(), "worker_running")
            return found[-1] if found else {}

        def post(body: bytes) -> int:
            try:
                return _post(hook, body)[0]
            except OSError:
                return 0

        wait_for("the webhook", lambda: post(_event("assigned", "w-0", 3, "A", "A-0")), 10)
        assert running()["tasks"] == ["A-0"] and running()["connectors"] == ["A"]
        # A revocation's answer comes after the stop: the log says so before we hear back.
        assert post(_event("revoked", "w-0", 4, "A-0")) == 200
        assert running()["tasks"] == [] and running()["reason"] == "revoked"
        assert post(_event("revoked", "w-0", 4, "A-0")) == 200  # a retry: nothing to stop
        assert post(b"{not json") == 400
        assert post(json.dumps({"event": "other"}).encode()) == 400
        # A new agent process (another member id, on the status endpoint and in its events):
        # what the old one started stops first.
        agent.member_id = "w-1"
        assert post(_event("assigned", "w-1", 1, "B-0")) == 200
        lines = log.read_text().splitlines()
        replaced = [e for e in json_events(lines, "worker_stopped") if "replaced" in str(e)]
        assert replaced and replaced[-1]["connectors"] == ["A"], lines[-5:]
        assert running()["tasks"] == ["B-0"] and running()["connectors"] == []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        agent.close()
    lines = log.read_text().splitlines()
    assert json.loads(lines[-1])["event"] == "worker_exit"
    assert json_events(lines, "worker_running")[-1]["tasks"] == []
