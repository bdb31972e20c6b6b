"""Structured (JSON lines) logging for the coordinator and the agent.

A log line names what happened; the event in the database (or the agent's listener event)
keeps the whole of it. So a long list in a line's fields is written as its length and first
`LOG_LIST_ITEMS` items: a 100,000-task assignment or move list was 5 MB per line, and
serialising it held the interpreter for 400 ms, delaying every group's heartbeats (issue 24).
Even 100 items made a 1,000-member group's "assignment delivered" lines 8 KB each (71 MB of log
while the group formed, a sixth of the time its changes spent committing); 10 name enough to
recognise a share.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from itertools import islice
from typing import Any

LOG_LIST_ITEMS = 10
"""Items of a list (or tuple, set) written in a log line; the rest only counted."""


_SCALARS = frozenset({str, int, float, bool, type(None)})
_SEQUENCES = (list, tuple, set, frozenset)


def brief(value: Any, depth: int = 0) -> Any:
    """`value` with every list, tuple or set longer than LOG_LIST_ITEMS written as
    {"count": n, "first": [its first LOG_LIST_ITEMS]}, in dicts and lists alike. O(what is
    written): a long list's items past the first are never visited, and a scalar (most of what
    a line holds) is taken as it is, without a call (every event of the coordinator is logged,
    so this runs for every change: issue 24 measured it at a sixth of the coordinator's time
    while 1,000 members joined). A value with a `log_brief()` method (an event's
    `resources.SetJson`) gives its own."""
    if type(value) in _SCALARS or depth > 8:
        return value
    if isinstance(value, dict):
        return {k: v if type(v) in _SCALARS else brief(v, depth + 1) for k, v in value.items()}
    if isinstance(value, _SEQUENCES):
        if len(value) > LOG_LIST_ITEMS:
            first = [
                v if type(v) in _SCALARS else brief(v, depth + 1)
                for v in islice(value, LOG_LIST_ITEMS)
            ]
            return clipped(first, len(value))
        if isinstance(value, (list, tuple)):
            return [v if type(v) in _SCALARS else brief(v, depth + 1) for v in value]
        return value
    short = getattr(value, "log_brief", None)  # a value that knows its own brief form
    if short is not None:
        return short()
    return value


def clipped(first: list[Any], count: int) -> Any:
    """A list of `count` items as a log line writes it, given its first LOG_LIST_ITEMS (or
    more) items: the list itself, or past LOG_LIST_ITEMS {"count", "first"}."""
    if count <= LOG_LIST_ITEMS:
        return first
    return {"count": count, "first": first[:LOG_LIST_ITEMS]}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(brief(fields))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


def configure(level: str = "INFO", json_lines: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def fields(**values: Any) -> dict[str, Any]:
    """`extra=` for a structured log line: log.info("msg", extra=fields(group=..., epoch=...))."""
    return {"fields": values}
