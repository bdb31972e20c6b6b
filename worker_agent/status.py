"""The agent's local status endpoint for the worker container beside it (DESIGN 2.2, 2.3).

A small threaded HTTP server (stdlib only). The agent calls `update` whenever what the worker may
run changes and `set_not_ready` when it stops being a member (fenced, leaving); the worker reads:

- ``GET /assignment``: 200, ``{"group_id", "member_id", "member_epoch", "connectors",
  "tasks": [{"connector", "task"}], "fencing_tokens", "configs", "target_states", "ready"}``
  (lists sorted; epoch 0 before the first update). ``fencing_tokens`` (DESIGN 3.18) is the
  token of each resource listed, ``{"connectors": {name: token}, "tasks": [{"connector",
  "task", "token"}]}`` (empty when the coordinator sent none). ``configs`` (DESIGN 3.20) is
  ``{connector: {"digest", "config"}}`` for the connectors of the resources listed, and
  ``target_states`` ``{connector: "STARTED"|"PAUSED"|"STOPPED"}``. Config values go only to a
  caller that passes the same gate as a state-changing request (below, with
  ``X-Worker-Agent: assignment``): any other caller gets the digests only, and
  ``"configs_withheld": {"rule", "reason"}`` saying why.
- ``GET /ready`` (or ``/readyz``): 200 ``ready`` after the first `update`, else 503 with the reason.
- ``GET /healthz``: 200 while the process serves.
- ``GET /watch``: server-sent events; the current state at once as ``event: assignment`` with the
  JSON above as data, then one such event per change (a watcher that falls behind gets the latest
  state, not every intermediate one; a changed config is a change), and a ``: keepalive``
  comment when idle. Config values as for ``/assignment`` (``X-Worker-Agent: watch``).
- ``POST /leave`` (``?timeout_s=S``, default `DEFAULT_LEAVE_TIMEOUT_S`): the same graceful stop
  as SIGTERM (revoke everything through the listener, then leave the group), answered once it
  has finished: 200 ``{"left": true, ...}``; 504 ``{"left": false, ...}`` if it has not within
  S seconds (it goes on). This is what a worker container's ``preStop`` hook calls
  (``worker-agent leave``), so that its work is revoked while the worker still runs, before
  either container gets SIGTERM. 404 when the agent installed no handler (`set_leave_handler`).
- ``POST /status``: the worker reports a status of a resource it runs (DESIGN 3.20), a JSON
  body ``{"connector": name, "task"?: n, "state": "RUNNING"|"PAUSED"|"FAILED"|"STOPPED",
  "trace"?: text}`` (STOPPED: connectors only); the agent sends it to the coordinator with its
  next status report. 202 ``{"accepted": true, ...}``; 400 ``{"error"}`` for a body that is not
  such an object (the message says what is wrong); 404 for a resource the worker does not hold,
  409 for one assigned but not started yet; 404 when the agent installed no handler.
- anything else: 404 with a JSON error.

Every request that changes state (every POST: ``/leave``, ``/status``, any later one too) must
pass `refusal_of_state_change`, else it is answered 403 ``{"error", "rule"}`` naming the rule
broken (a read of config values passes the same gate, else it gets digests only):

- ``same-pod-address``: the caller's address is a loopback one or the address it connected to
  (a container of the same pod dialling the pod's IP);
- ``host``: the Host header names a loopback address, ``localhost`` or the address connected
  to (a web page whose name was rebound to 127.0.0.1 sends its own name: DNS rebinding);
- ``cross-site``: no ``Origin`` but one naming the Host itself, no ``Sec-Fetch-Site`` but
  ``same-origin`` or ``none`` (a browser's request made by another site);
- ``header``: ``X-Worker-Agent`` names the endpoint (``X-Worker-Agent: leave``). A browser
  sends a custom header cross-site only after a CORS preflight (OPTIONS), which this server
  never approves, so a web page cannot make a local agent leave.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import logging
import math
import socket
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from connect_protocol.resources import EMPTY, ResourceSet
from connect_protocol.tokens import NO_TOKENS, FencingTokens

from .lifecycle import ConnectorConfig, configs_json, connectors_of, target_states_json

__all__ = [
    "DEFAULT_LEAVE_TIMEOUT_S",
    "STATE_CHANGE_HEADER",
    "LeaveHandler",
    "ReportHandler",
    "StatusServer",
    "refusal_of_state_change",
    "same_pod",
]

_log = logging.getLogger(__name__)

#: POST /leave without ?timeout_s=: how long the call waits for the agent to have left.
DEFAULT_LEAVE_TIMEOUT_S = 60.0
#: The longest ?timeout_s= accepted.
MAX_LEAVE_TIMEOUT_S = 3600.0
#: Leave and wait up to the given seconds; returns (left, what happened or what is left to do).
LeaveHandler = Callable[[float], tuple[bool, str]]
#: POST /status: the parsed JSON body -> (HTTP status, JSON answer).
ReportHandler = Callable[[object], tuple[int, dict[str, object]]]
#: The largest POST body read.
MAX_BODY_BYTES = 65536
#: The header every state-changing request carries, naming its endpoint (`X-Worker-Agent: leave`).
STATE_CHANGE_HEADER = "X-Worker-Agent"
#: Sec-Fetch-Site values of a request that no other site made.
_SAME_SITE_FETCHES = ("same-origin", "none")


class StatusServer:
    """Serves the agent's current assignment and readiness over HTTP. Thread safe.

    Attributes:
        group_id: the group, as reported.
        member_id: this worker's member id, as reported.
        host: the address to bind.
        keepalive_s: how long a /watch stream may stay silent before a keepalive comment.
    """

    def __init__(
        self,
        group_id: str,
        member_id: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        keepalive_s: float = 15.0,
    ) -> None:
        if keepalive_s <= 0:
            raise ValueError("keepalive_s must be positive")
        self.group_id = group_id
        self.member_id = member_id
        self.host = host
        self.keepalive_s = keepalive_s
        self._requested_port = port
        self._changed = threading.Condition()
        # Guarded by _changed:
        self._version = 0
        self._member_epoch = 0
        self._assignment: ResourceSet = EMPTY
        self._tokens: FencingTokens = NO_TOKENS
        self._configs: Mapping[str, ConnectorConfig] = {}
        self._ready = False
        self._not_ready_reason = "no assignment received from the coordinator yet"
        self._closed = False
        self._streams: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._leave_handler: LeaveHandler | None = None
        self._report_handler: ReportHandler | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Bind and serve on a daemon thread."""
        with self._changed:
            if self._httpd is not None or self._closed:
                raise RuntimeError("StatusServer can be started once")
            httpd = ThreadingHTTPServer((self.host, self._requested_port), _handler_for(self))
            httpd.daemon_threads = True
            self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"status-server:{self.port}",
            daemon=True,
        )
        self._thread.start()
        _log.info("status endpoint serving on http://%s:%d", self.host, self.port)

    @property
    def port(self) -> int:
        """The bound port (after `start`)."""
        if self._httpd is None:
            raise RuntimeError("StatusServer is not started")
        return int(self._httpd.server_address[1])

    def close(self) -> None:
        """Stop serving: end open /watch streams, stop accepting, release the port."""
        with self._changed:
            if self._closed:
                return
            self._closed = True
            streams = list(self._streams)
            self._changed.notify_all()
        for sock in streams:
            # Wakes a stream blocked writing to a client that does not read.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        httpd = self._httpd
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> StatusServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what the agent calls --------------------------------------------------------------

    def update(
        self,
        member_epoch: int,
        assignment: ResourceSet,
        fencing_tokens: FencingTokens = NO_TOKENS,
        *,
        configs: Mapping[str, ConnectorConfig] | None = None,
    ) -> None:
        """What the worker may run now, at `member_epoch`, with the fencing tokens of those
        resources (others in `fencing_tokens` are left out) and the configs of their
        connectors (None: those shown, kept for the connectors still listed); the server
        becomes ready."""
        tokens = fencing_tokens.restricted(assignment) if fencing_tokens else NO_TOKENS
        with self._changed:
            shown = _restricted(self._configs if configs is None else configs, assignment)
            if (
                self._ready
                and member_epoch == self._member_epoch
                and assignment == self._assignment
                and tokens == self._tokens
                and shown == self._configs
            ):
                return
            self._member_epoch = member_epoch
            self._assignment = assignment
            self._tokens = tokens
            self._configs = shown
            self._ready = True
            self._not_ready_reason = ""
            self._version += 1
            self._changed.notify_all()

    def set_configs(self, configs: Mapping[str, ConnectorConfig]) -> None:
        """The configs of the connectors of what is shown (a changed config); readiness and
        the assignment stay as they are."""
        with self._changed:
            shown = _restricted(configs, self._assignment)
            if shown == self._configs:
                return
            self._configs = shown
            self._version += 1
            self._changed.notify_all()

    def set_not_ready(self, reason: str) -> None:
        """Report not ready (e.g. fenced, leaving) until the next `update`.

        The assignment shown is left as it is: the agent calls `update` when the worker's work
        changes (e.g. with an empty assignment once it has stopped everything).
        """
        with self._changed:
            if not self._ready and reason == self._not_ready_reason:
                return
            self._ready = False
            self._not_ready_reason = reason
            self._version += 1
            self._changed.notify_all()

    def set_leave_handler(self, handler: LeaveHandler | None) -> None:
        """What POST /leave calls (None: POST /leave answers 404)."""
        with self._changed:
            self._leave_handler = handler

    def set_report_handler(self, handler: ReportHandler | None) -> None:
        """What POST /status calls with the parsed body (None: POST /status answers 404)."""
        with self._changed:
            self._report_handler = handler

    # --- what the handler reads ------------------------------------------------------------

    def _leave(self, timeout_s: float) -> tuple[int, dict[str, object]]:
        with self._changed:
            handler = self._leave_handler
        if handler is None:
            return 404, {"error": "this agent does not leave on request"}
        left, detail = handler(timeout_s)
        return (200 if left else 504), {"left": left, "detail": detail, **self.snapshot()}

    def _report(self, body: object) -> tuple[int, dict[str, object]]:
        with self._changed:
            handler = self._report_handler
        if handler is None:
            return 404, {"error": "this agent takes no status reports"}
        return handler(body)

    def _snapshot_locked(
        self, values: bool, withheld: tuple[str, str] | None = None
    ) -> dict[str, object]:
        out: dict[str, object] = {
            "group_id": self.group_id,
            "member_id": self.member_id,
            "member_epoch": self._member_epoch,
            **self._assignment.to_json(),
            "fencing_tokens": self._tokens.to_json(),
            "configs": configs_json(self._configs, values=values),
            "target_states": target_states_json(self._configs),
            "ready": self._ready,
        }
        if not values and withheld is not None and self._configs:
            out["configs_withheld"] = {"rule": withheld[0], "reason": withheld[1]}
        return out

    def snapshot(self, *, config_values: bool = False) -> dict[str, object]:
        """The /assignment object, as it is now: config values only with `config_values` (for
        a caller in the same pod)."""
        with self._changed:
            return self._snapshot_locked(config_values)

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason when not)."""
        with self._changed:
            return self._ready, self._not_ready_reason

    def _moved_on_locked(self, seen: int) -> bool:
        return self._closed or self._version != seen

    def _watch(self, handler: _StatusHandler, withheld: tuple[str, str] | None) -> None:
        """Serve one /watch stream until the client goes away or the server closes; config
        values unless `withheld` (the rule and why)."""
        sock = handler.connection
        with self._changed:
            if self._closed:
                return
            self._streams.add(sock)
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
            handler.send_header("Cache-Control", "no-cache")
            handler.send_header("X-Accel-Buffering", "no")
            handler.end_headers()
            seen = -1
            while True:
                with self._changed:
                    self._changed.wait_for(
                        functools.partial(self._moved_on_locked, seen), timeout=self.keepalive_s
                    )
                    if self._closed:
                        return
                    if self._version != seen:
                        seen = self._version
                        data = json.dumps(
                            self._snapshot_locked(withheld is None, withheld),
                            separators=(",", ":"),
                        )
                        chunk = f"event: assignment\nid: {seen}\ndata: {data}\n\n"
                    else:
                        chunk = ": keepalive\n\n"
                handler.wfile.write(chunk.encode())
                handler.wfile.flush()
        except OSError:
            return  # the client went away, or close() shut the socket
        finally:
            with self._changed:
                self._streams.discard(sock)


def same_pod(peer: str, local: str) -> bool:
    """Whether a caller at `peer` that reached us at `local` is in this pod: a loopback address,
    or the very address it dialled (the containers of a pod share its network namespace, so a
    call to the pod's IP from inside comes from that IP; the kubelet and other pods come from
    elsewhere)."""
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return True
    try:
        dialled = ipaddress.ip_address(local.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(dialled, ipaddress.IPv6Address) and dialled.ipv4_mapped is not None:
        dialled = dialled.ipv4_mapped
    return address == dialled


def _unmapped(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        parsed = ipaddress.ip_address(address.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return parsed.ipv4_mapped
    return parsed


def _host_is_local(host: str, local: str) -> bool:
    """Whether a Host header (`name[:port]`, `[v6]:port`) names this pod: a loopback address,
    `localhost`, or the address the request came in on."""
    name = host.strip()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else ""
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    name = name.rstrip(".").lower()
    if name == "localhost":
        return True
    address = _unmapped(name)
    if address is None:
        return False
    return address.is_loopback or address == _unmapped(local)


def refusal_of_state_change(
    peer: str, local: str, path: str, headers: Mapping[str, str], method: str = "POST"
) -> tuple[str, str] | None:
    """None if a request that changes state (`path`, e.g. /leave), or reads config values
    (`method` GET: /assignment, /watch), may run, else the rule it breaks and why:
    (`same-pod-address` | `host` | `cross-site` | `header`, sentence). The one gate of every
    state-changing endpoint and of config values; see the module docstring for the rules."""
    what = f"POST {path}" if method == "POST" else f"config values on GET {path}"
    verb = "is accepted" if method == "POST" else "are served"
    if not same_pod(peer, local):
        return "same-pod-address", f"{what} {verb} to the same pod only"
    host = headers.get("Host") or ""
    if not _host_is_local(host, local):
        return (
            "host",
            f"{what} need{'s' if method == 'POST' else ''} a Host header that is a loopback "
            f"address, localhost or the pod's own address, not {host!r}",
        )
    origin = headers.get("Origin")
    if origin is not None and origin.rstrip("/").lower() != f"http://{host}".lower():
        return "cross-site", f"{what}: refused to a request from another origin ({origin!r})"
    fetch_site = headers.get("Sec-Fetch-Site")
    if fetch_site is not None and fetch_site.lower() not in _SAME_SITE_FETCHES:
        return "cross-site", f"{what}: refused to a request made by another site ({fetch_site})"
    endpoint = path.strip("/")
    if (headers.get(STATE_CHANGE_HEADER) or "").strip().lower() != endpoint:
        return (
            "header",
            f"{what} need{'s' if method == 'POST' else ''} the header "
            f"'{STATE_CHANGE_HEADER}: {endpoint}'"
            + (" (worker-agent leave sends it)" if endpoint == "leave" else ""),
        )
    return None


def _restricted(
    configs: Mapping[str, ConnectorConfig], resources: ResourceSet
) -> Mapping[str, ConnectorConfig]:
    names = connectors_of(resources)
    return {n: c for n, c in configs.items() if n in names}


def _handler_for(server: StatusServer) -> type[_StatusHandler]:
    return type("StatusHandler", (_StatusHandler,), {"status": server})


class _StatusHandler(BaseHTTPRequestHandler):
    status: StatusServer
    server_version = "worker-agent-status"
    # Bounds a client that connects and sends nothing, or stops reading a stream.
    timeout = 30.0

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        if path == "/assignment":
            withheld = self._refusal_of_state_change(path, method="GET")
            with self.status._changed:
                body = self.status._snapshot_locked(withheld is None, withheld)
            self._send_json(200, body)
        elif path in ("/ready", "/readyz"):
            ready, reason = self.status.readiness()
            if ready:
                self._send_text(200, "ready")
            else:
                self._send_text(503, f"not ready: {reason}")
        elif path == "/healthz":
            self._send_text(200, "ok")
        elif path == "/watch":
            self.close_connection = True
            self.status._watch(self, self._refusal_of_state_change(path, method="GET"))
        else:
            self._send_json(404, {"error": "not found", "path": path})

    def do_POST(self) -> None:
        split = urllib.parse.urlsplit(self.path)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        body = b""
        if 0 < length <= MAX_BODY_BYTES:
            body = self.rfile.read(length)  # /status reads it; /leave ignores it
        elif length != 0:
            self.close_connection = True
        # Every POST changes state: each passes the same gate, before it is even routed.
        refusal = self._refusal_of_state_change(split.path)
        if refusal is not None:
            rule, why = refusal
            self._send_json(403, {"error": why, "rule": rule})
            return
        if split.path == "/status":
            self._post_status(body, length)
            return
        if split.path != "/leave":
            self._send_json(404, {"error": "not found", "path": split.path})
            return
        query = urllib.parse.parse_qs(split.query)
        try:
            timeout_s = float(query.get("timeout_s", [DEFAULT_LEAVE_TIMEOUT_S])[-1])
        except ValueError:
            timeout_s = math.nan
        if not 0 < timeout_s <= MAX_LEAVE_TIMEOUT_S:
            self._send_json(
                400, {"error": f"timeout_s must be in (0, {MAX_LEAVE_TIMEOUT_S:g}] seconds"}
            )
            return
        code, answer = self.status._leave(timeout_s)
        self._send_json(code, answer)

    def _post_status(self, body: bytes, length: int) -> None:
        if length < 0 or length > MAX_BODY_BYTES:
            self._send_json(
                400 if length < 0 else 413,
                {"error": f"the body must be a JSON object of at most {MAX_BODY_BYTES} bytes"},
            )
            return
        try:
            parsed: object = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            self._send_json(
                400,
                {
                    "error": 'the body must be JSON: {"connector": name, "task"?: n, "state": '
                    '"RUNNING"|"PAUSED"|"FAILED"|"STOPPED", "trace"?: text}'
                },
            )
            return
        code, answer = self.status._report(parsed)
        self._send_json(code, answer)

    def _refusal_of_state_change(self, path: str, method: str = "POST") -> tuple[str, str] | None:
        local = ""
        with contextlib.suppress(OSError):
            local = str(self.connection.getsockname()[0])
        headers = {
            name: value
            for name in ("Host", "Origin", "Sec-Fetch-Site", STATE_CHANGE_HEADER)
            if (value := self.headers.get(name)) is not None
        }
        return refusal_of_state_change(str(self.client_address[0]), local, path, headers, method)

    def _send_json(self, code: int, body: dict[str, Any]) -> None:
        self._send(code, "application/json", json.dumps(body).encode())

    def _send_text(self, code: int, text: str) -> None:
        self._send(code, "text/plain; charset=utf-8", (text + "\n").encode())

    def _send(self, code: int, content_type: str, payload: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("%s %s", self.address_string(), format % args)
