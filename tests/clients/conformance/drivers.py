"""One small driver interface over every worker client (docs/plan-issue31-go-client.md §3), so
that each conformance scenario is written once:

- `PythonClient`: `python -m worker_agent.cli run ... --exec-hook HOOK`
- `NodeClient`: `node clients/node/worker.js ... --exec-hook HOOK`
- `GoClient`: `clients/go/bin/connect-group-worker ... --exec-hook HOOK` (built by
  `clients/go/build`, which prints the binary's path)

All three run the same recording hook (`tests/clients/exec_hook.py`), so what a client did is
read one way: from the hook's records. A resource may run from an `assigned` record's `t_start`
to a `revoked` record's `t_end` (`intervals`); what a client runs now is what its `assigned`
records gave and no `revoked` record took back (`running`). A `start_failed` record (the hook
refused to start, `--fail-file`) runs nothing.

The three command lines differ only in spelling (the agent's `--rpc-timeout-s` and
`--log-format`); the flags the scenarios use mean the same everywhere: `--coordinator`,
`--group`, `--member-id`, `--instance-id`, `--rebalance-timeout-ms`, `--exec-hook`,
`--hook-timeout-s`, `--tls-ca`, `--tls-cert`, `--tls-key`.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal as signals
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tests.clients.workers import HOOK, Interval, Resource, overlaps, resources_of
from tests.support.coordinator import REPO

__all__ = [
    "CLIENT_KINDS",
    "Client",
    "GoClient",
    "Interval",
    "NodeClient",
    "PythonClient",
    "Resource",
    "TlsFiles",
    "overlaps",
]

CLIENT_KINDS = ("python", "node", "go")
NODE_WORKER = REPO / "clients" / "node" / "worker.js"
#: Every client's rebalance timeout in the suite: a client that never acknowledges a revocation
#: holds a rebalance up this long.
REBALANCE_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class TlsFiles:
    """What a client presents over TLS: the CA that signed the coordinator's certificate, and
    (for mTLS) its own certificate and key."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    def flags(self) -> list[str]:
        out = ["--tls-ca", str(self.ca)]
        if self.cert is not None and self.key is not None:
            out += ["--tls-cert", str(self.cert), "--tls-key", str(self.key)]
        return out


class Client(Protocol):
    """A worker client as a child process, whatever its language."""

    name: str  # "python" | "node" | "go"
    member_id: str

    def start(
        self,
        *,
        instance_id: str | None = None,
        tls: TlsFiles | None = None,
        coordinator: str | None = None,
        extra: Sequence[str] = (),
        member_id: str | None = None,
        rpc_timeout_ms: int | None = None,
        hook_timeout_s: float | None = None,
    ) -> None: ...
    def terminate(self, timeout_s: float = 20.0) -> int: ...
    def kill(self) -> None: ...
    def signal(self, sig: int) -> None: ...
    def alive(self) -> bool: ...
    def wait(self, timeout_s: float) -> int: ...
    def records(self) -> list[dict[str, Any]]: ...
    def running(self) -> set[Resource]: ...
    def intervals(self) -> list[Interval]: ...
    def log_text(self) -> str: ...


class _HookClient:
    """What every driver shares: the process, its log file, the hook's records."""

    name = "?"

    def __init__(
        self,
        coordinator: str,
        group: str,
        member_id: str,
        directory: Path,
        *,
        fail_file: Path | None = None,
        sleep_revoked_s: float | None = None,
        hang_file: Path | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.coordinator = coordinator
        self.group = group
        self.member_id = member_id
        self.log_path = directory / f"{member_id}.log"
        self.hook_path = directory / f"{member_id}.hook.jsonl"
        self.fail_file = fail_file
        self.sleep_revoked_s = sleep_revoked_s
        self.hang_file = hang_file
        self.proc: subprocess.Popen[bytes] | None = None
        #: When each earlier process of this client was SIGKILLed: what it ran stops counting
        #: then (its hooks were never told).
        self._killed_at: list[float] = []

    # --- what each language spells differently -------------------------------------------------

    def command(
        self, member_id: str, coordinator: str, hook: str, rpc_timeout_ms: int | None
    ) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str] | None:
        return None

    # --- the interface -------------------------------------------------------------------------

    def hook_command(self) -> str:
        words = [sys.executable, "-S", str(HOOK), str(self.hook_path)]
        if self.fail_file is not None:
            words += ["--fail-file", str(self.fail_file)]
        if self.sleep_revoked_s is not None:
            words += ["--sleep-revoked", str(self.sleep_revoked_s)]
        if self.hang_file is not None:
            words += ["--hang-file", str(self.hang_file)]
        return shlex.join(words)

    def start(
        self,
        *,
        instance_id: str | None = None,
        tls: TlsFiles | None = None,
        coordinator: str | None = None,
        extra: Sequence[str] = (),
        member_id: str | None = None,
        rpc_timeout_ms: int | None = None,
        hook_timeout_s: float | None = None,
    ) -> None:
        """Start a process of this client (again, after `terminate`): `member_id` replaces the
        client's (a new process, a new member id; DESIGN 3.2), `coordinator` the address it
        was made with (e.g. a TCP proxy's)."""
        assert not self.alive(), f"{self.member_id} is already running"
        if member_id is not None:
            self.member_id = member_id
        args = self.command(
            self.member_id, coordinator or self.coordinator, self.hook_command(), rpc_timeout_ms
        )
        if instance_id is not None:
            args += ["--instance-id", instance_id]
        if hook_timeout_s is not None:
            args += ["--hook-timeout-s", f"{hook_timeout_s:g}"]
        if tls is not None:
            args += tls.flags()
        args += list(extra)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args, cwd=REPO, env=self.env(), stdout=log, stderr=subprocess.STDOUT
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def terminate(self, timeout_s: float = 20.0) -> int:
        """SIGTERM (stop everything through the hook, leave the group), and the exit code."""
        self.signal(signals.SIGTERM)
        return self.wait(timeout_s)

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)
            self._killed_at.append(time.time())

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def records(self) -> list[dict[str, Any]]:
        if not self.hook_path.exists():
            return []
        lines = self.hook_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def running(self) -> set[Resource]:
        out: set[Resource] = set()
        for record in self.records():
            if record["event"] == "assigned":
                out |= resources_of(record)
            elif record["event"] == "revoked":
                out -= resources_of(record)
        return out

    def intervals(self) -> list[Interval]:
        """Per resource, from an `assigned` record's `t_start` to the `t_end` of the `revoked`
        record that stopped it (or a kill of the process, or inf: still running)."""
        opened: dict[Resource, float] = {}
        out: list[Interval] = []
        kills = sorted(self._killed_at)
        for record in sorted(self.records(), key=lambda r: r["t_start"]):
            while kills and kills[0] <= record["t_start"]:
                at = kills.pop(0)
                out.extend(Interval(self.member_id, r, t, at) for r, t in opened.items())
                opened.clear()
            if record["event"] == "assigned":
                for resource in resources_of(record):
                    assert resource not in opened, f"{self.member_id} started {resource} twice"
                    opened[resource] = record["t_start"]
            elif record["event"] == "revoked":
                for resource in resources_of(record):
                    if resource in opened:
                        out.append(
                            Interval(
                                self.member_id, resource, opened.pop(resource), record["t_end"]
                            )
                        )
        end = kills[0] if kills else math.inf
        out.extend(Interval(self.member_id, r, t, end) for r, t in opened.items())
        return out

    def __repr__(self) -> str:
        return f"<{self.name} client {self.member_id}>"


class PythonClient(_HookClient):
    name = "python"

    def command(
        self, member_id: str, coordinator: str, hook: str, rpc_timeout_ms: int | None
    ) -> list[str]:
        args = [sys.executable, "-m", "worker_agent.cli", "run", "--coordinator", coordinator]
        args += ["--group", self.group, "--member-id", member_id]
        args += ["--rebalance-timeout-ms", str(REBALANCE_TIMEOUT_MS), "--exec-hook", hook]
        args += ["--log-format", "text"]
        if rpc_timeout_ms is not None:
            args += ["--rpc-timeout-s", str(rpc_timeout_ms / 1000)]
        return args

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}"}


class NodeClient(_HookClient):
    name = "node"

    def __init__(self, node: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.node = node

    def command(
        self, member_id: str, coordinator: str, hook: str, rpc_timeout_ms: int | None
    ) -> list[str]:
        args = [self.node, str(NODE_WORKER), "--coordinator", coordinator]
        args += ["--group", self.group, "--member-id", member_id]
        args += ["--rebalance-timeout-ms", str(REBALANCE_TIMEOUT_MS), "--exec-hook", hook]
        if rpc_timeout_ms is not None:
            args += ["--rpc-timeout-ms", str(rpc_timeout_ms)]
        return args


class GoClient(_HookClient):
    """The Go worker (plan §2's command line), whose binary `clients/go/build` made."""

    name = "go"

    def __init__(self, binary: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.binary = binary

    def command(
        self, member_id: str, coordinator: str, hook: str, rpc_timeout_ms: int | None
    ) -> list[str]:
        args = [str(self.binary), "--coordinator", coordinator]
        args += ["--group", self.group, "--member-id", member_id]
        args += ["--rebalance-timeout-ms", str(REBALANCE_TIMEOUT_MS), "--exec-hook", hook]
        if rpc_timeout_ms is not None:
            args += ["--rpc-timeout-ms", str(rpc_timeout_ms)]
        return args


def all_intervals(clients: Iterable[Client]) -> list[Interval]:
    return [i for c in clients for i in c.intervals()]
