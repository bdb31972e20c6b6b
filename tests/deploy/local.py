"""The deployment's topology without Kubernetes, for the local rehearsal: pods as groups of
processes started from their rendered containers (command, args, environment), a Service as a
round-robin TCP proxy on 127.0.0.1, and the kubelet's probes run against the processes.

A pod starts and stops its containers as the kubelet (1.29+) does: native sidecars (init
containers with `restartPolicy: Always`) first, each waited for until started (its startup
probe), then the main containers; on deletion, each main container's preStop hook, then its
SIGTERM, then, once every main container has exited, the sidecars' SIGTERM in reverse order, and
SIGKILL for whatever is left when the grace period ends.

Only addresses and ports are changed from the manifests (the caller decides which); everything
else (commands, flags, environment variables, timeouts) is what the manifests say.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.deploy.k8s import Obj, argv

BIN = Path(sys.executable).parent
T = TypeVar("T")


def local_argv(container: Obj) -> list[str]:
    """The container's command line, run from this environment (the image's /opt/venv/bin)."""
    args = argv(container)
    assert args, f"container {container['name']} has no command"
    if args[0] == "python":
        return [sys.executable, *args[1:]]
    exe = BIN / args[0]
    assert exe.exists(), f"{args[0]} is not installed in {BIN} (the image installs it)"
    return [str(exe), *args[1:]]


def image_env(home: Path) -> dict[str, str]:
    """What the Dockerfile's ENV gives every container (besides PATH)."""
    return {
        "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8",
    }


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout_s: float,
    diagnostics: Callable[[], str] | None = None,
    interval_s: float = 0.1,
) -> T:
    """Poll `probe` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = diagnostics() if diagnostics else ""
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}\n{extra}")
        time.sleep(interval_s)


@dataclass
class LocalContainer:
    """One container of a local pod: its command line and environment; whether it is a native
    sidecar, and its preStop exec hook (run with its environment, as the kubelet runs it in the
    container)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    spec: Obj
    sidecar: bool = False
    pre_stop: list[str] | None = None


@dataclass
class LocalPod:
    """A pod as processes: `start` runs its containers, sidecars first (each waited for with
    `started`, its startup probe); `terminate` does what the kubelet does on deletion (the main
    containers' preStop hooks, their SIGTERM, then the sidecars', SIGKILL after the grace
    period), writing down when each step happened in `timeline`."""

    name: str
    containers: list[LocalContainer]
    log_dir: Path
    grace_s: float
    started: Callable[[LocalContainer], bool] | None = None
    incarnation: int = 0
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    timeline: list[tuple[float, str]] = field(default_factory=list)
    hook_codes: dict[str, int | None] = field(default_factory=dict)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def start(self) -> None:
        assert not self.alive(), f"{self.name} is running"
        self.incarnation += 1
        self.procs = {}
        self.timeline = []
        self.hook_codes = {}
        sidecars = [c for c in self.containers if c.sidecar]
        for c in sidecars + [c for c in self.containers if not c.sidecar]:
            log = open(self.log_path(c.name), "wb")  # noqa: SIM115 - closed in close()
            self._logs.append(log)
            self.procs[c.name] = subprocess.Popen(
                c.argv, env=c.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.log_dir
            )
            self._note(f"started {c.name}")
            if c.sidecar and self.started is not None:
                wait_for(
                    f"{self.name}: sidecar {c.name} to start",
                    functools.partial(self.started, c),
                    timeout_s=30,
                    diagnostics=self.tail,
                )
                self._note(f"{c.name} started")

    def _note(self, what: str) -> None:
        self.timeline.append((time.monotonic(), what))

    def when(self, what: str) -> float:
        """When `what` happened (the first time), on time.monotonic()."""
        for at, done in self.timeline:
            if done == what:
                return at
        raise AssertionError(f"{self.name}: {what!r} never happened: {self.timeline}")

    def log_path(self, container: str, incarnation: int | None = None) -> Path:
        n = self.incarnation if incarnation is None else incarnation
        return self.log_dir / f"{self.name}.{container}.{n}.log"

    def log_lines(self, container: str, incarnation: int | None = None) -> list[str]:
        path = self.log_path(container, incarnation)
        return path.read_text(errors="replace").splitlines() if path.exists() else []

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs.values())

    def exited(self) -> dict[str, int | None]:
        return {name: p.poll() for name, p in self.procs.items()}

    def terminate(self) -> dict[str, int]:
        """What the kubelet does when the pod is deleted: for every main container at once, its
        preStop hook (if any) and then SIGTERM; once every main container has exited, SIGTERM
        to each sidecar in reverse order, waiting for each; SIGKILL to whatever still runs when
        the grace period ends. Returns the exit codes (-9 for a container that had to be
        killed); `timeline` has each step, `hook_codes` each hook's exit code."""
        deadline = time.monotonic() + self.grace_s
        self._note("deleted")
        mains = [c for c in self.containers if not c.sidecar]
        threads = [
            threading.Thread(target=self._stop_main, args=(c, deadline), daemon=True) for c in mains
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()) + 5)
        codes: dict[str, int] = {}
        for c in mains:
            codes[c.name] = self._wait_or_kill(c.name, deadline)
        for c in reversed([c for c in self.containers if c.sidecar]):
            p = self.procs[c.name]
            if p.poll() is None:
                self._note(f"SIGTERM {c.name}")
                p.send_signal(signal.SIGTERM)
            codes[c.name] = self._wait_or_kill(c.name, deadline)
        return codes

    def _stop_main(self, c: LocalContainer, deadline: float) -> None:
        p = self.procs[c.name]
        if c.pre_stop and p.poll() is None:
            self._note(f"preStop {c.name}")
            with open(
                self.log_dir / f"{self.name}.{c.name}.preStop.{self.incarnation}.log", "wb"
            ) as out:
                hook = subprocess.Popen(
                    c.pre_stop, env=c.env, stdout=out, stderr=subprocess.STDOUT, cwd=self.log_dir
                )
                try:
                    self.hook_codes[c.name] = hook.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    hook.kill()
                    self.hook_codes[c.name] = hook.wait(10)
            self._note(f"preStop {c.name} done")
        if p.poll() is None:
            self._note(f"SIGTERM {c.name}")
            p.send_signal(signal.SIGTERM)

    def _wait_or_kill(self, name: str, deadline: float) -> int:
        p = self.procs[name]
        try:
            code = p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            code = p.wait(10)
            self._note(f"SIGKILL {name}")
        self._note(f"exited {name}")
        return code

    def kill(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)

    def close(self) -> None:
        self.kill()
        for log in self._logs:
            log.close()

    def tail(self, lines: int = 15) -> str:
        out = []
        for c in self.containers:
            out.append(f"--- {self.name}/{c.name} (incarnation {self.incarnation}) ---")
            out.extend(self.log_lines(c.name)[-lines:])
        return "\n".join(out)


def json_events(lines: list[str], event: str) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("event") == event:
                out.append(entry)
    return out


# --- probes, as the kubelet runs them ----------------------------------------------------------


def grpc_probe(address: str, service: str = "", timeout_s: float = 1.0) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError:
            return False
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


def http_probe(url: str, timeout_s: float = 1.0) -> bool:
    """The kubelet's httpGet: success is a status from 200 to 399."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return 200 <= int(resp.status) < 400
    except (urllib.error.URLError, OSError):
        return False


def run_probe(probe: Obj, port_map: dict[int, int], named: dict[str | int, int]) -> bool:
    """Run a probe of the manifests against local processes: `named` resolves the probe's port
    (name or number) to the container port, `port_map` the container port to the local one."""
    if "grpc" in probe:
        port = port_map[named[probe["grpc"]["port"]]]
        return grpc_probe(f"127.0.0.1:{port}", probe["grpc"].get("service", ""))
    if "httpGet" in probe:
        get = probe["httpGet"]
        port = port_map[named[get["port"]]]
        return http_probe(f"http://127.0.0.1:{port}{get.get('path', '/')}")
    raise AssertionError(f"probe {probe} not emulated")


# --- a Service ---------------------------------------------------------------------------------


class ServiceProxy:
    """A Service's cluster IP on 127.0.0.1: every new connection goes to the next endpoint, round
    robin, as kube-proxy spreads connections over the ready pods. `set_endpoints` plays the
    Endpoints controller (a pod that is gone or not ready is taken out)."""

    def __init__(self, endpoints: list[str]) -> None:
        self._lock = threading.Lock()
        self._endpoints = list(endpoints)
        self._next = 0
        self._closed = False
        self._sockets: set[socket.socket] = set()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, name="service-proxy", daemon=True)
        self._thread.start()

    def set_endpoints(self, endpoints: list[str]) -> None:
        with self._lock:
            self._endpoints = list(endpoints)

    def _pick(self) -> list[str]:
        with self._lock:
            if not self._endpoints:
                return []
            start = self._next % len(self._endpoints)
            self._next += 1
            return self._endpoints[start:] + self._endpoints[:start]

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        for endpoint in self._pick():
            host, _, port = endpoint.rpartition(":")
            try:
                upstream = socket.create_connection((host, int(port)), timeout=1.0)
                break
            except OSError:
                continue
        if upstream is None:
            client.close()
            return
        upstream.settimeout(None)
        with self._lock:
            if self._closed:
                client.close()
                upstream.close()
                return
            self._sockets |= {client, upstream}
        threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()
        self._pump(client, upstream)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._sockets -= {src, dst}
            src.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(5)
