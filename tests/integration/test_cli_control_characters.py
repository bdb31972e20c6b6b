"""The operator commands escape control characters in everything they print from the server or the
database: a real coordinator holds a group, a connector, a member and an ACL whose ids carry
terminal control sequences (validation refuses only NUL), and `describe`, `list-groups` and
`acl list` (over gRPC and from the database) print none of those bytes raw."""

from __future__ import annotations

import subprocess

import pytest

from coordinator_svc.core.acls import AclEntry, Operation, ResourceType
from coordinator_svc.store.acl_store import AclStore
from coordinator_svc.store.engine import Database
from coordinator_svc.store.migrate import normalize_url
from tests.support.client import ScriptedWorker, put_connector
from tests.support.coordinator import InProcessCoordinator, run_cli

GROUP = "g\x1b[31mred\x07\x9b2J"
CONNECTOR = "c\x1b[2J\x7f"
MEMBER = "w\x1b]0;pwned\x07\u202e"
INSTANCE = "i\x1b[1m\r"
PRINCIPAL = "User:\x1b[5mblink\x08"
#: What must never reach the terminal raw: C0 (but the newlines the CLI prints), DEL, C1, bidi.
BIDI = {
    "\u061c",
    "\u200e",
    "\u200f",
    *map(chr, range(0x202A, 0x202F)),
    *map(chr, range(0x2066, 0x206A)),
}


def raw_controls(text: str) -> list[str]:
    return sorted(
        {
            repr(ch)
            for ch in text
            if (ord(ch) < 0x20 and ch != "\n") or 0x7F <= ord(ch) <= 0x9F or ch in BIDI
        }
    )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)


@pytest.fixture
def coordinator(database_url: str) -> InProcessCoordinator:
    # ACLs on (ListAcls needs them), every plaintext caller (User:ANONYMOUS) a super user.
    with InProcessCoordinator(
        database_url, authorization=True, super_users=["User:ANONYMOUS"]
    ) as coord:
        yield coord  # type: ignore[misc]


def test_the_cli_escapes_control_characters_in_what_it_prints(
    coordinator: InProcessCoordinator, database_url: str
) -> None:
    stubs = coordinator.stubs
    assert stubs is not None
    assert put_connector(stubs, GROUP, CONNECTOR, 1).error_code == 0
    worker = ScriptedWorker(stubs, GROUP, MEMBER, instance_id=INSTANCE)
    assert worker.join().error_code in (0, 10001)
    db = Database(normalize_url(database_url), 5_000)
    try:
        entry = AclEntry(PRINCIPAL, Operation.DESCRIBE, ResourceType.GROUP, GROUP)
        assert AclStore(db).add(entry)
    finally:
        db.dispose()
    address = coordinator.address
    runs = {
        "describe": cli("describe", GROUP, "--coordinator", address),
        "list-groups": cli("list-groups", "--coordinator", address),
        "acl list (gRPC)": cli("acl", "list", "--coordinator", address),
        "acl list (database)": cli("acl", "list", "--database-url", database_url),
        "describe (unknown group)": cli("describe", GROUP + "x", "--coordinator", address),
    }
    for name, run in runs.items():
        assert run.returncode == (1 if "unknown" in name else 0), (name, run)
    found = {name: raw_controls(run.stdout + run.stderr) for name, run in runs.items()}
    assert found == {name: [] for name in runs}
    # Shown, escaped, rather than dropped.
    described = runs["describe"].stdout
    assert "g\\x1b[31mred\\x07\\x9b2J" in described
    assert "w\\x1b]0;pwned\\x07\\u202e" in described and "c\\x1b[2J\\x7f" in described
    assert "i\\x1b[1m\\r" in described
    assert "g\\x1b[31mred\\x07\\x9b2J" in runs["list-groups"].stdout
    assert "User:\\x1b[5mblink\\x08" in runs["acl list (database)"].stdout
