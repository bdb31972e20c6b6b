"""Out-of-process listeners (DESIGN 2.3): the exec hook and the webhook.

Both receive one `RebalanceEvent.to_json()` object per call. The exec hook reads it on standard
input and succeeds by exiting 0; the webhook receives it as a POST body and succeeds by answering
2xx. Anything else raises `ListenerFailed`, which `call_with_retry` retries and logs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from http.client import HTTPException, HTTPMessage
from typing import IO

from worker_agent.listener import ListenerFailed, RebalanceEvent

__all__ = ["ExecHookListener", "WebhookListener", "event_body"]

_log = logging.getLogger(__name__)

_TAIL_BYTES = 2000


def event_body(event: RebalanceEvent) -> bytes:
    """The bytes a hook receives: the event's JSON object on one line, then a newline."""
    return json.dumps(event.to_json(), separators=(",", ":")).encode() + b"\n"


def _tail(stream: IO[bytes]) -> str:
    stream.seek(0, os.SEEK_END)
    size = stream.tell()
    stream.seek(max(0, size - _TAIL_BYTES))
    text = stream.read().decode("utf-8", errors="replace").strip()
    return ("..." + text) if size > _TAIL_BYTES else text


class ExecHookListener:
    """Runs a command for every event (no shell), the event's JSON on its standard input.

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
        self, argv: Sequence[str], timeout_s: float = 30.0, env: Mapping[str, str] | None = None
    ) -> None:
        if not argv:
            raise ValueError("an exec hook needs a command")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.argv: tuple[str, ...] = tuple(argv)
        self.timeout_s = timeout_s
        self.env: dict[str, str] = dict(env or {})

    def __repr__(self) -> str:
        return f"ExecHookListener({list(self.argv)!r}, timeout_s={self.timeout_s})"

    def on_revoked(self, event: RebalanceEvent) -> None:
        self._run(event)

    def on_assigned(self, event: RebalanceEvent) -> None:
        self._run(event)

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
        command = " ".join(self.argv)
        with (
            tempfile.TemporaryFile() as stdin,
            tempfile.TemporaryFile() as stdout,
            tempfile.TemporaryFile() as stderr,
        ):
            stdin.write(event_body(event))
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
                code = proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                err = _tail(stderr)
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
            err = _tail(stderr)
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
                    _tail(stdout),
                    err,
                )


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
    """

    def __init__(
        self, url: str, timeout_s: float = 10.0, headers: Mapping[str, str] | None = None
    ) -> None:
        scheme = urllib.parse.urlsplit(url).scheme
        if scheme not in ("http", "https"):
            raise ValueError(f"webhook url must be http or https, not {url!r}")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.url = url
        self.timeout_s = timeout_s
        self.headers: dict[str, str] = dict(headers or {})
        self._opener = urllib.request.build_opener(_NoRedirects())

    def __repr__(self) -> str:
        return f"WebhookListener({_redacted(self.url)!r}, timeout_s={self.timeout_s})"

    def on_revoked(self, event: RebalanceEvent) -> None:
        self._post(event)

    def on_assigned(self, event: RebalanceEvent) -> None:
        self._post(event)

    def _post(self, event: RebalanceEvent) -> None:
        where = f"webhook POST {_redacted(self.url)} ({event.event})"
        request = urllib.request.Request(
            self.url,
            data=event_body(event),
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
