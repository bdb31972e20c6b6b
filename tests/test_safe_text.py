"""`connect_protocol.safe_text`: database URLs with their secrets masked, and server strings with
their control characters escaped."""

from __future__ import annotations

import pytest

from connect_protocol.safe_text import mask_url, mask_urls_in, printable


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://u:pw@h:5432/db", "postgresql+psycopg://u:***@h:5432/db"),
        ("postgresql://u:p@w@h/db", "postgresql://u:***@h/db"),  # an unencoded "@" in it
        (
            "postgresql://h/db?password=pw&sslmode=require",
            "postgresql://h/db?password=***&sslmode=require",
        ),
        (
            "postgresql://u@h/db?sslpassword=a&passfile=/p&api_token=t&sslkey=k&application_name=x",
            "postgresql://u@h/db?sslpassword=***&passfile=***&api_token=***&sslkey=***&application_name=x",
        ),
        ("postgresql://h/db?PASS%57ORD=pw", "postgresql://h/db?PASS%57ORD=***"),
        ("jdbc:postgresql://h/db?user=a&password=pw", "jdbc:postgresql://h/db?user=a&password=***"),
        ("sqlite:///coordinator.db", "sqlite:///coordinator.db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
    ],
)
def test_mask_url(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_mask_urls_in_text() -> None:
    text = "cannot reach postgresql://u:pw1@h/db?password=pw2 (host=h password=pw3 sslkey='a b')"
    masked = mask_urls_in(text)
    assert not {"pw1", "pw2", "pw3", "a b"} & set(
        masked.replace("(", " ").replace("'", " ").split()
    )
    assert "pw" not in masked and "postgresql://u:***@h/db" in masked


def test_printable_escapes_every_control_character_visibly() -> None:
    assert (
        printable("a\x1b[31mb\x07\x7f\x9b\u202e\n\t\r")
        == "a\\x1b[31mb\\x07\\x7f\\x9b\\u202e\\n\\t\\r"
    )
    assert printable("plain ünïcode, 日本") == "plain ünïcode, 日本"
