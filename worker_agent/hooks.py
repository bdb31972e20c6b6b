"""Out-of-process listeners (DESIGN 2.3): the exec hook and the webhook.

Both receive one `RebalanceEvent.to_json()` object per call, plus `"release"`: the hook's release
mode. The exec hook reads it on standard input and succeeds by exiting 0; the webhook receives it
as a POST body and succeeds by answering 2xx. Anything else raises `ListenerFailed`, which
`call_with_retry` retries and logs.

Configs (DESIGN 3.20): the exec hook gets the config values of `assigned` and `reconfigured`
events on its standard input; a webhook gets them only when its URL is https or a loopback
address (else its events carry the configs' digests only, and the agent says so once, at start,
with a warning). A hook's output goes into log lines and status traces with those values masked.

Release modes, for `revoked` events (`assigned` events are the same in both):

- ``batch`` (the default, DESIGN 2.3 as it always was): the whole event is released when the
  call succeeds.
- ``per-resource`` (DESIGN 3.11, partial release): each resource is released as soon as it has
  stopped, so its next owner may start it while the rest are still stopping.

  * Exec hook: one call per event, as in batch mode; the hook writes one line per stopped
    resource (or group of them) to standard output, ``{"released": {"connectors": [...],
    "tasks": [{"connector", "task"}]}}`` (either key may be absent), and the agent releases
    those as the lines arrive (it reads them every `OUTPUT_POLL_S`). Exit 0 releases the rest;
    a failure releases only what the hook had reported, and the retry is called with the
    remainder. Other output lines are ignored; a line naming resources the event does not
    revoke is logged and those are ignored.
  * Webhook: one POST per resource (each a `revoked` event naming just that resource, with its
    token), up to `concurrency` at a time; each 2xx releases its resource. If any call fails,
    the others still complete (and release), then `ListenerFailed` is raised and the retry
    covers only the failed ones.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from http.client import HTTPException, HTTPMessage
from typing import IO

from connect_protocol.resources import ResourceSet, TaskId
from connect_protocol.tls import is_loopback
from worker_agent.lifecycle import mask_values
from worker_agent.listener import RELEASE_MODES, ListenerFailed, RebalanceEvent, ReleaseMode

__all__ = [
    "DEFAULT_WEBHOOK_CONCURRENCY",
    "OUTPUT_POLL_S",
    "ExecHookListener",
    "WebhookListener",
    "event_body",
    "parse_release_line",
    "webhook_gets_config_values",
]

_log = logging.getLogger(__name__)

_TAIL_BYTES = 2000
#: How often a per-resource exec hook's standard output is read for release lines.
OUTPUT_POLL_S = 0.01
#: A release line longer than this is not one: it is skipped.
_MAX_LINE_BYTES = 1 << 20
DEFAULT_WEBHOOK_CONCURRENCY = 8


def _check_release_mode(release: str) -> None:
    if release not in RELEASE_MODES:
        raise ValueError(f"release must be one of {RELEASE_MODES}, not {release!r}")


def event_body(
    event: RebalanceEvent, release: ReleaseMode = "batch", *, config_values: bool = True
) -> bytes:
    """The bytes a hook receives: the event's JSON object, with the hook's `release` mode, on one
    line, then a newline; `config_values` False: configs as digests only."""
    body = {**event.to_json(config_values=config_values), "release": release}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def webhook_gets_config_values(url: str) -> bool:
    """Whether a webhook at `url` may receive config values (DESIGN 3.20): https, or a
    loopback address (the worker beside the agent)."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "https" or is_loopback(parts.hostname or "")


def parse_release_line(line: bytes | str) -> ResourceSet | None:
    """The resources a per-resource exec hook's output line releases, or None when the line is
    not a release line (any other output). ``{"released": {"connectors": [name, ...], "tasks":
    [{"connector": name, "task": n}, ...]}}``, either key optional.

    Raises:
        ValueError: a ``{"released": ...}`` object that is malformed.
    """
    text = line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or "released" not in obj:
        return None
    released = obj["released"]
    if not isinstance(released, dict):
        raise ValueError('"released" must be an object with "connectors" and/or "tasks"')
    connectors = released.get("connectors", [])
    tasks = released.get("tasks", [])
    if not isinstance(connectors, list) or not all(isinstance(c, str) for c in connectors):
        raise ValueError('"released"."connectors" must be a list of connector names')
    if not isinstance(tasks, list):
        raise ValueError('"released"."tasks" must be a list of {"connector", "task"}')
    task_ids: list[TaskId] = []
    for t in tasks:
        if (
            not isinstance(t, dict)
            or not isinstance(t.get("connector"), str)
            or not isinstance(t.get("task"), int)
            or isinstance(t.get("task"), bool)
        ):
            raise ValueError(f'a released task must be {{"connector": name, "task": n}}, not {t!r}')
        task_ids.append(TaskId(t["connector"], t["task"]))
    return ResourceSet.of(connectors, task_ids)


class _Lines:
    """Complete lines appended to a file since the last read (a reader of its own: the child's
    writes and our reads do not share a file offset)."""

    def __init__(self, reader: IO[bytes]) -> None:
        self._reader = reader
        self._partial = b""

    def read(self, *, final: bool) -> list[bytes]:
        """The complete lines written since the last call; with `final` (the writer has
        exited) also an unterminated last line."""
        data = self._reader.read()
        if data:
            self._partial += data
        *lines, self._partial = self._partial.split(b"\n")
        if final and self._partial:
            lines.append(self._partial)
            self._partial = b""
        if len(self._partial) > _MAX_LINE_BYTES:
            self._partial = b""  # not a release line; keep memory bounded
        return [line for line in lines if len(line) <= _MAX_LINE_BYTES]


@contextlib.contextmanager
def _separate_reader() -> Iterator[tuple[IO[bytes], IO[bytes]]]:
    """An unlinked temporary file opened twice: (what the child writes to, our reader)."""
    fd, path = tempfile.mkstemp(prefix="worker-agent-hook-")
    try:
        reader = open(path, "rb", buffering=0)  # noqa: SIM115 - closed below
    finally:
        os.unlink(path)
    with os.fdopen(fd, "w+b") as writer, reader:
        yield writer, reader


def _redacted_output(text: str, event: RebalanceEvent) -> str:
    """A hook's output with the config values its event carried masked (`mask_values`)."""
    return mask_values(text, event.configs)


def _tail(stream: IO[bytes]) -> str:
    stream.seek(0, os.SEEK_END)
    size = stream.tell()
    stream.seek(max(0, size - _TAIL_BYTES))
    text = stream.read().decode("utf-8", errors="replace").strip()
    return ("..." + text) if size > _TAIL_BYTES else text


class ExecHookListener:
    """Runs a command for every event (no shell), the event's JSON on its standard input.

    With `release="per-resource"`, a `revoked` hook may report each resource stopped by writing
    a line ``{"released": {"connectors": [...], "tasks": [{"connector", "task"}]}}`` to its
    standard output; the agent releases those while the hook still runs (see the module's
    docstring).

    The child's environment is the agent's, plus `env`, plus `WORKER_AGENT_EVENT`
    (`revoked`|`assigned`), `WORKER_AGENT_GROUP_ID`, `WORKER_AGENT_MEMBER_ID` and
    `WORKER_AGENT_MEMBER_EPOCH`. It runs in a new session (its own process group). Exit 0 is
    success. A non-zero exit, or running past `timeout_s` (the whole process group is then
    killed and the hook reaped), raises `ListenerFailed` with the exit code and the end of
    its standard error.

    Standard input, output and error are temporary files rather than pipes: a hook that ignores
    its input never blocks the agent, and a hook that leaves a background process behind
    (`daemon &`) is done when it exits, whatever that process holds open.
    """

    def __init__(
        self,
        argv: Sequence[str],
        timeout_s: float = 30.0,
        env: Mapping[str, str] | None = None,
        release: ReleaseMode = "batch",
    ) -> None:
        if not argv:
            raise ValueError("an exec hook needs a command")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        _check_release_mode(release)
        self.argv: tuple[str, ...] = tuple(argv)
        self.timeout_s = timeout_s
        self.env: dict[str, str] = dict(env or {})
        self.release: ReleaseMode = release

    def __repr__(self) -> str:
        return (
            f"ExecHookListener({list(self.argv)!r}, timeout_s={self.timeout_s}, "
            f"release={self.release!r})"
        )

    def on_revoked(self, event: RebalanceEvent) -> None:
        self._run(event)

    def on_assigned(self, event: RebalanceEvent) -> None:
        self._run(event)

    def on_reconfigured(self, event: RebalanceEvent) -> None:
        self._run(event)

    on_paused = on_resumed = on_stopped = on_reconfigured

    def _child_env(self, event: RebalanceEvent) -> dict[str, str]:
        return {
            **os.environ,
            **self.env,
            "WORKER_AGENT_EVENT": event.event,
            "WORKER_AGENT_GROUP_ID": event.group_id,
            "WORKER_AGENT_MEMBER_ID": event.member_id,
            "WORKER_AGENT_MEMBER_EPOCH": str(event.member_epoch),
        }

    def _run(self, event: RebalanceEvent) -> None:
        per_resource = self.release == "per-resource" and event.event == "revoked"
        with contextlib.ExitStack() as files:
            stdin = files.enter_context(tempfile.TemporaryFile())
            stderr = files.enter_context(tempfile.TemporaryFile())
            if per_resource:
                stdout, reader = files.enter_context(_separate_reader())
                lines: _Lines | None = _Lines(reader)
            else:
                stdout = reader = files.enter_context(tempfile.TemporaryFile())
                lines = None
            self._run_with(event, stdin, stdout, stderr, reader, lines)

    def _run_with(
        self,
        event: RebalanceEvent,
        stdin: IO[bytes],
        stdout: IO[bytes],
        stderr: IO[bytes],
        reader: IO[bytes],
        lines: _Lines | None,
    ) -> None:
        command = " ".join(self.argv)
        stdin.write(event_body(event, self.release))
        stdin.flush()
        stdin.seek(0)
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                env=self._child_env(event),
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise ListenerFailed(f"exec hook {command!r} could not start: {exc}") from exc
        try:
            if lines is None:
                code = proc.wait(timeout=self.timeout_s)
            else:
                code = self._wait_releasing(proc, lines, event, command)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            if lines is not None:  # lines written before the kill were true when written
                self._release_lines(lines.read(final=False), event, command)
            err = _redacted_output(_tail(stderr), event)
            raise ListenerFailed(
                f"exec hook {command!r} ({event.event}) still running after "
                f"{self.timeout_s:g} s; killed its process group"
                + (f"; stderr: {err}" if err else ""),
                exit_code=proc.returncode,
                timed_out=True,
                stderr_tail=err,
            ) from None
        except BaseException:
            _kill_group(proc)  # interrupted while waiting: leave no orphan behind
            raise
        err = _redacted_output(_tail(stderr), event)
        if code != 0:
            how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
            raise ListenerFailed(
                f"exec hook {command!r} ({event.event}) {how}"
                + (f"; stderr: {err}" if err else ""),
                exit_code=code,
                stderr_tail=err,
            )
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug(
                "exec hook %r (%s) succeeded; stdout: %s; stderr: %s",
                command,
                event.event,
                _redacted_output(_tail(reader), event),
                err,
            )

    def _wait_releasing(
        self, proc: subprocess.Popen[bytes], lines: _Lines, event: RebalanceEvent, command: str
    ) -> int:
        """Wait for the hook, releasing what its output lines report as they arrive."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            code = proc.poll()
            self._release_lines(lines.read(final=code is not None), event, command)
            if code is not None:
                return code
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(list(self.argv), self.timeout_s)
            time.sleep(min(OUTPUT_POLL_S, left))

    @staticmethod
    def _release_lines(lines: list[bytes], event: RebalanceEvent, command: str) -> None:
        for line in lines:
            try:
                released = parse_release_line(line)
            except ValueError as exc:
                _log.warning("exec hook %r: ignoring a malformed release line: %s", command, exc)
                continue
            if released is None:
                continue
            unknown = released - event.resources
            if unknown:
                _log.warning(
                    "exec hook %r reported %s released, which this event does not revoke; ignored",
                    command,
                    unknown.describe(),
                )
            known = released & event.resources
            if known:
                event.release(known)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the hook's whole process group and reap the hook."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx is an answer, not a success: following it would turn the POST into a GET."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


def _redacted(url: str) -> str:
    """`url` without any user:password part, for messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class WebhookListener:
    """POSTs every event's JSON (`Content-Type: application/json`) to `url`; 2xx is success.

    Any other status (redirects are not followed), a connection error or no answer within
    `timeout_s` raises `ListenerFailed` naming the status or the error. `headers` are added to
    every request (e.g. an Authorization header); they never appear in messages.

    With `release="per-resource"`, a `revoked` event becomes one POST per resource, up to
    `concurrency` at a time, each released on its 2xx (see the module's docstring).

    Config values go only to an https or loopback URL (`webhook_gets_config_values`); to any
    other, `assigned` and `reconfigured` events carry the configs' digests only, and the
    constructor logs a warning saying so (once: the agent builds its listener once, at start).
    """

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        release: ReleaseMode = "batch",
        concurrency: int = DEFAULT_WEBHOOK_CONCURRENCY,
    ) -> None:
        scheme = urllib.parse.urlsplit(url).scheme
        if scheme not in ("http", "https"):
            raise ValueError(f"webhook url must be http or https, not {url!r}")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        _check_release_mode(release)
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.url = url
        self.timeout_s = timeout_s
        self.headers: dict[str, str] = dict(headers or {})
        self.release: ReleaseMode = release
        self.concurrency = concurrency
        #: Whether its events carry config values (else digests only).
        self.config_values = webhook_gets_config_values(url)
        self._opener = urllib.request.build_opener(_NoRedirects())
        if not self.config_values:
            _log.warning(
                "webhook %s is neither https nor a loopback address: its assigned and "
                "reconfigured events carry the configs' digests, not their values (a worker "
                "reads the values from the status endpoint's GET /assignment, from its own pod)",
                _redacted(url),
            )

    def __repr__(self) -> str:
        return (
            f"WebhookListener({_redacted(self.url)!r}, timeout_s={self.timeout_s}, "
            f"release={self.release!r})"
        )

    def on_revoked(self, event: RebalanceEvent) -> None:
        if self.release == "per-resource":
            self._post_each(event)
        else:
            self._post(event)

    def on_assigned(self, event: RebalanceEvent) -> None:
        self._post(event)

    def on_reconfigured(self, event: RebalanceEvent) -> None:
        self._post(event)

    on_paused = on_resumed = on_stopped = on_reconfigured

    def _post_each(self, event: RebalanceEvent) -> None:
        """One POST per resource, `concurrency` at a time; release each on its 2xx."""
        singles = [ResourceSet.of([c]) for c in event.connectors]
        singles += [ResourceSet.of((), [t]) for t in event.tasks]
        if len(singles) <= 1:
            self._post(event)
            event.release(event.resources)
            return
        failures: list[tuple[ResourceSet, Exception]] = []
        workers = min(self.concurrency, len(singles))
        with ThreadPoolExecutor(workers, thread_name_prefix="webhook") as pool:
            futures = {pool.submit(self._post, event.only(r)): r for r in singles}
            for future in as_completed(futures):
                resource = futures[future]
                try:
                    future.result()
                except Exception as exc:  # ListenerFailed, or a bug: reported below
                    failures.append((resource, exc))
                    continue
                event.release(resource)
        if failures:
            failed = ResourceSet.of(
                [c for r, _ in failures for c in r.connectors],
                [t for r, _ in failures for t in r.tasks],
            )
            first = failures[0][1]
            raise ListenerFailed(
                f"{len(failures)} of {len(singles)} per-resource revoked calls failed "
                f"({failed.describe()}); first: {first}",
                status=first.status if isinstance(first, ListenerFailed) else None,
                timed_out=all(isinstance(e, ListenerFailed) and e.timed_out for _, e in failures),
            ) from first

    def _post(self, event: RebalanceEvent) -> None:
        where = f"webhook POST {_redacted(self.url)} ({event.event})"
        if self.release == "per-resource" and event.event == "revoked":
            where = f"webhook POST {_redacted(self.url)} (revoked {event.resources.describe()})"
        request = urllib.request.Request(
            self.url,
            data=event_body(event, self.release, config_values=self.config_values),
            method="POST",
            headers={**self.headers, "Content-Type": "application/json"},
        )
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                status: int = response.status
                response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                body = exc.read(_TAIL_BYTES).decode("utf-8", errors="replace").strip()
            body = _redacted_output(body, event)
            raise ListenerFailed(
                f"{where} answered {exc.code} {exc.reason}" + (f": {body}" if body else ""),
                status=exc.code,
            ) from None
        except TimeoutError as exc:
            raise ListenerFailed(
                f"{where}: no answer within {self.timeout_s:g} s", timed_out=True
            ) from exc
        except urllib.error.URLError as exc:
            timed_out = isinstance(exc.reason, TimeoutError)
            raise ListenerFailed(f"{where} failed: {exc.reason}", timed_out=timed_out) from exc
        except (OSError, HTTPException) as exc:
            raise ListenerFailed(f"{where} failed: {exc!r}") from exc
        if not 200 <= status < 300:
            raise ListenerFailed(f"{where} answered {status}", status=status)
