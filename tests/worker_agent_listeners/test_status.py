"""StatusServer over real HTTP on 127.0.0.1, including the /watch event stream."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator

import pytest

from connect_protocol.resources import ResourceSet
from worker_agent.status import StatusServer

ASSIGNMENT = ResourceSet.of(["b", "a"], [("b", 0), ("a", 1), ("a", 0)])


@pytest.fixture
def server() -> Iterator[StatusServer]:
    status = StatusServer("demo", "worker-1", keepalive_s=0.2)
    status.start()
    try:
        yield status
    finally:
        status.close()


def get(server: StatusServer, path: str) -> tuple[int, str, str]:
    """(status, content type, body) of GET `path`."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read().decode()
    finally:
        conn.close()


def get_json(server: StatusServer, path: str) -> tuple[int, object]:
    code, content_type, body = get(server, path)
    assert content_type == "application/json"
    return code, json.loads(body)


class Watch:
    """A /watch client: reads server-sent events off a real connection."""

    def __init__(self, server: StatusServer) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        self.conn.request("GET", "/watch")
        self.response = self.conn.getresponse()

    def next_block(self) -> list[str]:
        """The lines of the next event or comment; [] at the end of the stream."""
        lines: list[str] = []
        while True:
            raw = self.response.fp.readline()
            if not raw:
                return lines
            line = raw.decode().rstrip("\n")
            if line == "":
                if lines:
                    return lines
                continue
            lines.append(line)

    def next_event(self) -> tuple[str, dict[str, object]]:
        """The next event (skipping keepalive comments) as (event name, parsed data)."""
        while True:
            block = self.next_block()
            assert block, "stream ended"
            if all(line.startswith(":") for line in block):
                continue
            fields = dict(line.split(": ", 1) for line in block)
            return fields["event"], json.loads(fields["data"])

    def close(self) -> None:
        self.conn.close()


def test_before_the_first_update_it_is_alive_but_not_ready(server: StatusServer) -> None:
    assert get(server, "/healthz")[0] == 200
    code, content_type, body = get(server, "/ready")
    assert code == 503
    assert content_type.startswith("text/plain")
    assert "no assignment" in body
    assert get(server, "/readyz")[0] == 503
    assert get_json(server, "/assignment") == (
        200,
        {
            "group_id": "demo",
            "member_id": "worker-1",
            "member_epoch": 0,
            "connectors": [],
            "tasks": [],
            "fencing_tokens": {"connectors": {}, "tasks": []},
            "configs": {},
            "target_states": {},
            "ready": False,
        },
    )


def test_the_first_update_even_empty_makes_it_ready(server: StatusServer) -> None:
    server.update(1, ResourceSet())
    code, _, body = get(server, "/ready")
    assert (code, body) == (200, "ready\n")
    assert get(server, "/readyz")[0] == 200
    code, data = get_json(server, "/assignment")
    assert code == 200
    assert data == {
        "group_id": "demo",
        "member_id": "worker-1",
        "member_epoch": 1,
        "connectors": [],
        "tasks": [],
        "fencing_tokens": {"connectors": {}, "tasks": []},
        "configs": {},
        "target_states": {},
        "ready": True,
    }


def test_assignment_is_served_in_the_contract_shape_sorted(server: StatusServer) -> None:
    server.update(4, ASSIGNMENT)
    assert get_json(server, "/assignment") == (
        200,
        {
            "group_id": "demo",
            "member_id": "worker-1",
            "member_epoch": 4,
            "connectors": ["a", "b"],
            "tasks": [
                {"connector": "a", "task": 0},
                {"connector": "a", "task": 1},
                {"connector": "b", "task": 0},
            ],
            "fencing_tokens": {"connectors": {}, "tasks": []},
            "configs": {},
            "target_states": {},
            "ready": True,
        },
    )


def test_not_ready_until_the_next_update(server: StatusServer) -> None:
    server.update(4, ASSIGNMENT)
    server.set_not_ready("fenced: no heartbeat answer for 9000 ms")
    code, _, body = get(server, "/ready")
    assert code == 503
    assert "fenced: no heartbeat answer for 9000 ms" in body
    assert get(server, "/healthz")[0] == 200
    code, data = get_json(server, "/assignment")
    assert data["ready"] is False  # type: ignore[index]
    assert data["member_epoch"] == 4  # type: ignore[index]
    server.update(1, ResourceSet())
    assert get(server, "/ready")[0] == 200


def test_unknown_paths_are_404_json(server: StatusServer) -> None:
    assert get_json(server, "/nope?x=1") == (404, {"error": "not found", "path": "/nope"})


def test_watch_sends_the_current_state_then_each_change(server: StatusServer) -> None:
    server.update(2, ASSIGNMENT)
    watch = Watch(server)
    try:
        assert watch.response.status == 200
        assert watch.response.getheader("Content-Type", "").startswith("text/event-stream")
        name, data = watch.next_event()
        assert name == "assignment"
        assert data["member_epoch"] == 2
        assert data["connectors"] == ["a", "b"]
        server.update(3, ResourceSet.of(["a"]))
        name, data = watch.next_event()
        assert (name, data["member_epoch"], data["connectors"], data["tasks"]) == (
            "assignment",
            3,
            ["a"],
            [],
        )
        server.set_not_ready("leaving the group")
        _, data = watch.next_event()
        assert data["ready"] is False
    finally:
        watch.close()


def test_watch_sends_nothing_for_an_update_that_changes_nothing(server: StatusServer) -> None:
    server.update(2, ASSIGNMENT)
    watch = Watch(server)
    try:
        watch.next_event()
        server.update(2, ASSIGNMENT)
        server.update(5, ASSIGNMENT)
        _, data = watch.next_event()
        assert data["member_epoch"] == 5
    finally:
        watch.close()


def test_watch_sends_keepalive_comments_when_idle(server: StatusServer) -> None:
    watch = Watch(server)
    try:
        assert watch.next_block()[0].startswith("event: assignment")
        assert watch.next_block() == [": keepalive"]  # keepalive_s is 0.2 here
    finally:
        watch.close()


def test_several_watchers_each_get_the_change(server: StatusServer) -> None:
    watches = [Watch(server) for _ in range(3)]
    try:
        for watch in watches:
            watch.next_event()
        server.update(7, ASSIGNMENT)
        for watch in watches:
            assert watch.next_event()[1]["member_epoch"] == 7
    finally:
        for watch in watches:
            watch.close()


def test_close_ends_open_streams_promptly() -> None:
    server = StatusServer("demo", "worker-1", keepalive_s=30.0)
    server.start()
    watch = Watch(server)
    try:
        watch.next_event()
        started = time.monotonic()
        server.close()
        assert watch.next_block() == []  # end of stream, not a keepalive 30 s later
        assert time.monotonic() - started < 2.0
    finally:
        watch.close()
        server.close()


def test_close_releases_the_port() -> None:
    server = StatusServer("g", "m")
    server.start()
    port = server.port
    server.close()
    with pytest.raises(OSError):
        http.client.HTTPConnection("127.0.0.1", port, timeout=2).request("GET", "/healthz")


def test_updates_from_many_threads_leave_a_consistent_state(server: StatusServer) -> None:
    def worker(n: int) -> None:
        for epoch in range(1, 51):
            server.update(epoch, ResourceSet.of([f"c{n}"], [(f"c{n}", epoch)]))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _, data = get_json(server, "/assignment")
    assert data["member_epoch"] == 50  # type: ignore[index]
    [connector] = data["connectors"]  # type: ignore[index]
    assert data["tasks"] == [{"connector": connector, "task": 50}]  # type: ignore[index]


def test_port_is_unknown_before_start_and_start_is_once() -> None:
    server = StatusServer("g", "m")
    with pytest.raises(RuntimeError):
        _ = server.port
    with server:
        assert server.port > 0
        with pytest.raises(RuntimeError):
            server.start()
