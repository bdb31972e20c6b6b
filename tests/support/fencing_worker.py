"""A worker that writes to a fenced store with its fencing tokens (DESIGN 3.18), for the fencing
demonstration (tests/e2e/test_fencing_demo.py).

    python -m tests.support.fencing_worker --coordinator HOST:PORT --group G --member-id W1 \
        --store STORE.sqlite --log EVENTS.jsonl

(from the repository root, with the repository and `generated/` on PYTHONPATH, as
`FencingWorkerProcess` runs it). One in-process `worker_agent.runtime.Agent` (protocol
`sessioned`) with a `CallbackListener`:

- `on_assigned`: for every task of the event, a writer thread that loops
  ``sleep(interval); store.write(task, token, member_id, seq); if stopped: break``. The write comes
  before the check of the stop flag, on purpose: a writer that was sleeping when the process was
  paused (SIGSTOP) makes one write as soon as the process resumes, before anything else can stop
  it. That is the zombie write a fenced store must refuse.
- `on_revoked`: stops the writer threads of the event's tasks and joins them before returning
  (so the revocation is acknowledged only once they have stopped writing, DESIGN 2.3).

Connectors are only logged (they have tokens too, but nothing writes for them). SIGTERM or SIGINT:
the agent revokes everything (the writers stop) and leaves; exit 0.

The event log (`--log`) is JSON lines, one `os.write` each on an O_APPEND descriptor, every line
with `t` (time.time()) and `event`:

    started      member_id, pid
    assigned     member_epoch, tasks {task: token}, connectors {name: token}
    revoked      member_epoch, tasks {task: token}, connectors {name: token}
    refused      resource, token, seq               (a write the store refused)
    write_error  resource, token, seq, error        (a write that raised)
    writer_stopped  resource, token, attempts, accepted, refused, errors
    exited       code, fatal

The agent's own log (text) goes to standard error. `FencingWorkerProcess` is the test's handle on
one such process.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from connect_protocol import logs
from connect_protocol.resources import TaskId
from tests.support.fenced_store import FencedStore
from worker_agent.assignors import assignors_for_protocol
from worker_agent.listener import CallbackListener, RebalanceEvent
from worker_agent.runtime import Agent, AgentSettings

__all__ = ["EventLog", "FencingWorker", "FencingWorkerProcess", "main"]

REPO = Path(__file__).resolve().parents[2]
log = logging.getLogger("fencing_worker")


class EventLog:
    """Appends JSON lines to a file, whole lines only (one os.write, O_APPEND), from any thread."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "event": event, **fields}, separators=(",", ":"))
        os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


class Writer(threading.Thread):
    """Writes `resource` with `token` every `interval_s` until stopped."""

    def __init__(
        self,
        resource: str,
        token: int,
        member_id: str,
        store_path: Path,
        interval_s: float,
        next_seq: Callable[[], int],
        events: EventLog,
    ) -> None:
        super().__init__(name=f"writer-{resource}@{token}", daemon=True)
        self.resource = resource
        self.token = token
        self.member_id = member_id
        self.store_path = store_path
        self.interval_s = interval_s
        self._next_seq = next_seq
        self.events = events
        self._stop_flag = threading.Event()
        self.attempts = self.accepted = self.refused = self.errors = 0

    def stop(self) -> None:
        self._stop_flag.set()

    def run(self) -> None:
        store = FencedStore(self.store_path)
        try:
            while True:
                time.sleep(self.interval_s)
                seq = self._next_seq()
                # The write before the stop check: see the module's docstring (the zombie write).
                try:
                    ok = store.write(self.resource, self.token, self.member_id, seq)
                except Exception as exc:
                    self.errors += 1
                    self.events.emit(
                        "write_error",
                        resource=self.resource,
                        token=self.token,
                        seq=seq,
                        error=repr(exc),
                    )
                    log.exception("write %s@%d seq %d failed", self.resource, self.token, seq)
                else:
                    self.attempts += 1
                    if ok:
                        self.accepted += 1
                    else:
                        self.refused += 1
                        self.events.emit(
                            "refused", resource=self.resource, token=self.token, seq=seq
                        )
                if self._stop_flag.is_set():
                    break
        finally:
            store.close()
            self.events.emit(
                "writer_stopped",
                resource=self.resource,
                token=self.token,
                attempts=self.attempts,
                accepted=self.accepted,
                refused=self.refused,
                errors=self.errors,
            )


def _token_map(event: RebalanceEvent) -> tuple[dict[str, int | None], dict[str, int | None]]:
    tokens = event.fencing_tokens
    return (
        {str(t): tokens.get(t) for t in event.tasks},
        {c: tokens.get(c) for c in event.connectors},
    )


class FencingWorker:
    """The listener's work: one writer thread per running task."""

    def __init__(
        self, member_id: str, store_path: Path, events: EventLog, interval_s: float
    ) -> None:
        self.member_id = member_id
        self.store_path = store_path
        self.events = events
        self.interval_s = interval_s
        self._seqs = itertools.count(1)  # one sequence per process, over all writers
        self._seq_lock = threading.Lock()
        self._lock = threading.Lock()
        self._writers: dict[TaskId, Writer] = {}

    def _next_seq(self) -> int:
        with self._seq_lock:
            return next(self._seqs)

    def on_assigned(self, event: RebalanceEvent) -> None:
        tasks, connectors = _token_map(event)
        self.events.emit(
            "assigned", member_epoch=event.member_epoch, tasks=tasks, connectors=connectors
        )
        missing = [name for name, token in {**tasks, **connectors}.items() if token is None]
        if missing:
            # Fail loudly (the agent retries and logs): a task must not run without its token.
            raise RuntimeError(f"assigned without a fencing token: {sorted(missing)}")
        with self._lock:
            for task in event.tasks:
                token = event.fencing_tokens[task]
                running = self._writers.get(task)
                if running is not None and running.is_alive():
                    if running.token == token:
                        continue  # a retried call: already running under this token
                    running.stop()
                    running.join()
                writer = Writer(
                    str(task),
                    token,
                    self.member_id,
                    self.store_path,
                    self.interval_s,
                    self._next_seq,
                    self.events,
                )
                self._writers[task] = writer
                writer.start()

    def on_revoked(self, event: RebalanceEvent) -> None:
        tasks, connectors = _token_map(event)
        self.events.emit(
            "revoked", member_epoch=event.member_epoch, tasks=tasks, connectors=connectors
        )
        with self._lock:
            stopping = [w for t in event.tasks if (w := self._writers.pop(t, None)) is not None]
        for writer in stopping:
            writer.stop()
        for writer in stopping:
            writer.join()

    def stop_all(self) -> None:
        with self._lock:
            stopping = list(self._writers.values())
            self._writers.clear()
        for writer in stopping:
            writer.stop()
        for writer in stopping:
            writer.join()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--coordinator", required=True, help="host:port of the coordinator")
    p.add_argument("--group", required=True)
    p.add_argument("--member-id", required=True)
    p.add_argument("--store", required=True, type=Path, help="the fenced store's SQLite file")
    p.add_argument("--log", required=True, type=Path, help="the JSON-lines event log")
    p.add_argument("--interval-ms", type=int, default=50, help="pause before each write")
    p.add_argument("--protocol", default="sessioned")
    p.add_argument("--rebalance-timeout-ms", type=int, default=10_000)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logs.configure("INFO", json_lines=False)
    events = EventLog(args.log)
    worker = FencingWorker(args.member_id, args.store, events, args.interval_ms / 1000)
    settings = AgentSettings(
        group_id=args.group,
        member_id=args.member_id,
        coordinators=(args.coordinator,),
        assignors=tuple(assignors_for_protocol(args.protocol)),
        rebalance_timeout_ms=args.rebalance_timeout_ms,
        eager=args.protocol == "eager",
    )
    agent = Agent(
        settings, CallbackListener(on_revoked=worker.on_revoked, on_assigned=worker.on_assigned)
    )

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: revoking all work, then leaving the group", signum)
        agent.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    events.emit("started", member_id=args.member_id, pid=os.getpid())
    try:
        agent.run()
    finally:
        worker.stop_all()
        events.emit("exited", code=0 if agent.fatal is None else 3, fatal=agent.fatal)
        events.close()
    return 0 if agent.fatal is None else 3


# --- the test's handle ----------------------------------------------------------------------------


class FencingWorkerProcess:
    """One `fencing_worker` subprocess: start, SIGSTOP/SIGCONT, SIGTERM, kill; its event log."""

    def __init__(
        self, member_id: str, coordinator: str, group: str, store: Path, workdir: Path
    ) -> None:
        self.member_id = member_id
        self.coordinator = coordinator
        self.group = group
        self.store = store
        self.event_log = workdir / f"{member_id}.events.jsonl"
        self.agent_log = workdir / f"{member_id}.agent.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    def start(self) -> FencingWorkerProcess:
        assert self.proc is None, f"{self.member_id} already started"
        env = {
            **os.environ,
            "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}",
            "PYTHONUNBUFFERED": "1",
        }
        args = [
            sys.executable,
            "-m",
            "tests.support.fencing_worker",
            "--coordinator",
            self.coordinator,
            "--group",
            self.group,
            "--member-id",
            self.member_id,
            "--store",
            str(self.store),
            "--log",
            str(self.event_log),
        ]
        with open(self.agent_log, "ab") as out:
            self.proc = subprocess.Popen(
                args, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pause(self, timeout_s: float = 5.0) -> float:
        """SIGSTOP, and wait until the kernel shows the process stopped (Linux: state T in
        /proc/PID/stat); returns the time it was seen stopped."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True
        stat = Path(f"/proc/{self.proc.pid}/stat")
        deadline = time.monotonic() + timeout_s
        while stat.exists():
            # The state is the field after the command's parenthesised name.
            if stat.read_text().rpartition(")")[2].split()[0] in ("T", "t"):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.member_id} not stopped {timeout_s:g} s after SIGSTOP")
            time.sleep(0.001)
        return time.time()

    def resume(self) -> float:
        """SIGCONT; returns the time just *before* it was sent, so that whatever the process
        does once resumed is stamped at or after it."""
        assert self.proc is not None
        before = time.time()
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False
        return before

    def request_stop(self) -> None:
        """SIGTERM (the agent revokes everything and leaves); `wait_exit` for the exit code."""
        assert self.proc is not None
        if self.paused:
            self.resume()
        self.proc.send_signal(signal.SIGTERM)

    def terminate(self, timeout_s: float = 15.0) -> int:
        """SIGTERM and wait; the exit code."""
        self.request_stop()
        return self.wait_exit(timeout_s)

    def wait_exit(self, timeout_s: float = 15.0) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.member_id} did not exit within {timeout_s:g} s of SIGTERM; killed it\n"
                + self.agent_log_tail()
            ) from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        if not self.event_log.exists():
            return []
        out = []
        for line in self.event_log.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                if kind is None or entry["event"] == kind:
                    out.append(entry)
        return out

    def agent_log_tail(self, lines: int = 30) -> str:
        text = self.agent_log.read_text(errors="replace") if self.agent_log.exists() else ""
        tail = "\n".join(text.splitlines()[-lines:])
        return f"--- {self.member_id} agent log ({self.agent_log}) ---\n{tail}"

    def running(self) -> dict[str, int]:
        """task -> token of the writers it runs now, by its event log (assigned minus revoked)."""
        out: dict[str, int] = {}
        for entry in self.events():
            if entry["event"] == "assigned":
                out.update({t: int(tok) for t, tok in entry["tasks"].items() if tok is not None})
            elif entry["event"] == "revoked":
                for t in entry["tasks"]:
                    out.pop(t, None)
        return out


if __name__ == "__main__":
    sys.exit(main())
