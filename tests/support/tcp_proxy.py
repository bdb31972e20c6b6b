"""A small threaded TCP proxy on 127.0.0.1 that a test controls, to cut a worker off its
coordinator.

    with TcpProxy("127.0.0.1:9093") as proxy:   # listens on proxy.address
        ...                                      # forwards both ways
        proxy.cut("refuse")      # close every connection; new connections are refused
        proxy.cut("blackhole")   # close every connection; new ones are accepted, never answered
        proxy.cut("freeze")      # nothing moves any more on open or new connections (a
                                 # partition: bytes wait, as TCP would retransmit them)
        proxy.cut("drop")        # requests still reach the upstream, its answers are thrown
                                 # away (lost responses); `dropped_bytes` counts them
        proxy.restore()          # forward again (frozen bytes are delivered; connections
                                 # that lost answers are closed, their streams being torn)

Every thread is a daemon; `close()` ends them all.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from types import TracebackType
from typing import Literal

__all__ = ["CutMode", "TcpProxy"]

CutMode = Literal["refuse", "blackhole", "freeze", "drop"]

_CHUNK = 65536
_POLL_S = 0.05


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


class _Link:
    """One client connection and its upstream connection, pumped by two threads."""

    def __init__(self, proxy: TcpProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.closed = threading.Event()
        self.tainted = False  # it lost answers ("drop"): its stream is torn

    def start(self) -> None:
        for src, dst, name in (
            (self.client, self.upstream, "up"),
            (self.upstream, self.client, "down"),
        ):
            threading.Thread(
                target=self._pump, args=(src, dst), name=f"tcp-proxy-{name}", daemon=True
            ).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self.closed.is_set():
                if not self.proxy.forwarding.wait(_POLL_S):
                    continue  # frozen: leave the bytes where they are
                try:
                    readable, _, _ = select.select([src], [], [], _POLL_S)
                except (OSError, ValueError):
                    break
                if not readable:
                    continue
                if not self.proxy.forwarding.is_set():
                    continue
                data = src.recv(_CHUNK)
                if not data:
                    break
                if src is self.upstream and self.proxy.mode == "drop":
                    self.tainted = True
                    self.proxy._dropped(len(data))
                    continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self.close()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        self.proxy._forget(self)


class TcpProxy:
    """Forwards connections made to `address` (127.0.0.1, a free port unless `port` is given)
    to `upstream` ("host:port")."""

    def __init__(self, upstream: str, port: int = 0) -> None:
        self.upstream = _split(upstream)
        self.forwarding = threading.Event()  # cleared while frozen
        self.forwarding.set()
        self.mode: CutMode | None = None
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._held: list[socket.socket] = []  # blackholed connections
        self._closed = threading.Event()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self.connections_accepted = 0
        self.dropped_bytes = 0
        self.port = self._listen(port)
        self.address = f"127.0.0.1:{self.port}"

    # --- control ---------------------------------------------------------------------------

    def cut(self, mode: CutMode = "refuse") -> None:
        """Stop forwarding (see the module docstring for the modes)."""
        with self._lock:
            self.mode = mode
            if mode == "freeze":
                self.forwarding.clear()
                return
            if mode == "drop":
                return
            links = list(self._links)
        for link in links:
            link.close()
        if mode == "refuse":
            self._stop_listening()

    def restore(self) -> None:
        """Forward again: new connections are proxied, frozen ones resume, held ones close."""
        with self._lock:
            mode, self.mode = self.mode, None
            held, self._held = self._held, []
            torn = [link for link in self._links if link.tainted]
        for link in torn:
            link.close()
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()
        if mode == "refuse":
            self._listen(self.port)
        self.forwarding.set()

    def close(self) -> None:
        self._closed.set()
        self.forwarding.set()
        self._stop_listening()
        with self._lock:
            links = list(self._links)
            held, self._held = self._held, []
        for link in links:
            link.close()
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._links)

    # --- internals -------------------------------------------------------------------------

    def _listen(self, port: int) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(64)
        sock.settimeout(_POLL_S)
        self._listener = sock
        thread = threading.Thread(
            target=self._accept_loop, args=(sock,), name="tcp-proxy-accept", daemon=True
        )
        self._accept_thread = thread
        thread.start()
        bound: int = sock.getsockname()[1]
        return bound

    def _stop_listening(self) -> None:
        sock, self._listener = self._listener, None
        thread, self._accept_thread = self._accept_thread, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._closed.is_set() and self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            with self._lock:
                self.connections_accepted += 1
                if self.mode == "blackhole":
                    self._held.append(client)
                    continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                with contextlib.suppress(OSError):
                    client.close()
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(self, client, upstream)
            with self._lock:
                self._links.add(link)
            link.start()

    def _dropped(self, size: int) -> None:
        with self._lock:
            self.dropped_bytes += size

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)
