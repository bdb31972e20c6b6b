"""Text that is safe to log or to show on a terminal.

`mask_url` hides the secrets of a database URL (SQLAlchemy, libpq or JDBC form): the password of
its userinfo and every query parameter whose name looks secret (`password`, `sslpassword`,
`passfile`, anything matching pass/secret/token/key). `mask_urls_in` does the same for every URL
inside a free text (an error message). `printable` escapes control characters (C0, DEL, C1 and
the bidirectional overrides) of a server-provided string visibly, so that a hostile id, URL or
message cannot move the cursor, recolour or retitle the operator's terminal.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

MASK = "***"

#: A query parameter (or key=value option) whose value is a secret.
SECRET_NAME = re.compile(r"pass|secret|token|key", re.IGNORECASE)

# scheme://[user[:password]@]rest. The password runs to the last "@" (an unencoded "@" in it
# must not leave its tail visible; an "@" further on only hides more than needed).
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][\w+.\-:]*://)(?P<user>[^:/@?#]*):(?P<password>.*)@")
_URL_IN_TEXT = re.compile(r"[A-Za-z][\w+.\-]*(?::[A-Za-z][\w+.\-]*)?://[^\s'\"<>]+")
# libpq key=value form ("host=db password=secret"), quoted or not.
_KEYWORD_SECRET = re.compile(
    r"(?P<name>\b[\w.]*(?:pass|secret|token|key)[\w.]*)(?P<eq>\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'|[^\s&;,]+)",
    re.IGNORECASE,
)


def _mask_query(query: str) -> str:
    pairs = []
    for pair in query.split("&"):
        name, eq, value = pair.partition("=")
        if eq and value and SECRET_NAME.search(unquote_plus(name)):
            pair = f"{name}={MASK}"
        pairs.append(pair)
    return "&".join(pairs)


def mask_url(url: str) -> str:
    """`url` with its secrets replaced by `***`: the userinfo password and the value of every
    query parameter named like a secret. Anything else (scheme, user, host, port, database,
    other parameters) is kept as written, so the operator still sees which database it is."""
    masked = _USERINFO.sub(
        lambda m: f"{m['scheme']}{m['user']}:{MASK}@" if m["password"] else m[0], url, count=1
    )
    head, question, query = masked.partition("?")
    return f"{head}?{_mask_query(query)}" if question else masked


def mask_urls_in(text: str) -> str:
    """`text` with every URL in it masked (`mask_url`), and every `name=value` whose name looks
    secret (libpq's keyword form) masked too: for error messages that may echo a DSN."""
    text = _URL_IN_TEXT.sub(lambda m: mask_url(m[0]), text)
    return _KEYWORD_SECRET.sub(
        lambda m: m[0] if m["value"] == MASK else f"{m['name']}{m['eq']}{MASK}", text
    )


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    code = ord(char)
    short = _SHORT_ESCAPES.get(char)
    if short is not None:
        return short
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


#: C0 controls, DEL, C1 controls, and the bidirectional embeddings, overrides and isolates.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """`str(text)` with every control character written as a visible escape (`\\x1b`, `\\x07`,
    `\\n`, `\\u202e`), for printing a server-provided string on a terminal."""
    return _CONTROL.sub(lambda m: _escape(m[0]), str(text))
