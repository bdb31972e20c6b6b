"""What a real `coordinator-svc` says about its database: no secret of the database URL in any of
its output (a password in the URL's userinfo or in its query string), and no host, port or driver
text in what clients are told when the database is unreachable (the log keeps the detail).

The database is cut off by a TCP proxy in front of the test's PostgreSQL
(`tests/support/tcp_proxy.py`); trust authentication ignores the passwords, so the URLs connect."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from connect.group.v1 import admin_pb2, coordinator_pb2
from sqlalchemy.engine import make_url

from tests.support.client import ScriptedWorker, put_connector
from tests.support.coordinator import CoordinatorProcess, Stubs, run_cli
from tests.support.tcp_proxy import TcpProxy

SECRETS = ("userinfo-Secret-1", "query-Secret-2", "query-Secret-3")
COORDINATOR_NOT_AVAILABLE = 15
#: Driver text that must never reach a client.
DRIVER_TEXT = ("psycopg", "OperationalError", "connection to server", "sqlalchemy", "sqlite3")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)


def with_secrets(url: str, port: int | None = None) -> str:
    """`url` with a userinfo password and two secret query parameters (ignored by trust
    authentication), through `port` if given."""
    parsed = make_url(url).set(
        password=SECRETS[0],
        query={"password": SECRETS[1], "sslpassword": SECRETS[2], "application_name": "t"},
    )
    if port is not None:
        parsed = parsed.set(host="127.0.0.1", port=port)
    return parsed.render_as_string(hide_password=False)


def no_secret_in(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def test_no_secret_of_the_database_url_reaches_any_output(
    database_url: str, tmp_path: Path
) -> None:
    url = with_secrets(database_url)
    migrated = cli("migrate", "--database-url", url)
    assert migrated.returncode == 0, migrated.stderr
    acls = cli("acl", "list", "--database-url", url)
    assert acls.returncode == 0, acls.stderr
    log_path = tmp_path / "serve.log"
    proc = CoordinatorProcess(url, log_path=log_path).start()
    try:
        stubs = Stubs(proc.address)
        assert put_connector(stubs, "g", "A", 1).error_code == 0
        stubs.close()
        assert proc.terminate() == 0
    finally:
        proc.close()
    served = log_path.read_text()
    outputs = migrated.stdout + migrated.stderr + acls.stdout + acls.stderr + served
    assert no_secret_in(outputs) == []
    # The URL is still logged, masked, so that operators see which database it is.
    logged = [json.loads(line) for line in served.splitlines() if line.startswith("{")]
    databases = [entry["database"] for entry in logged if entry.get("event") == "serving"]
    assert len(databases) == 1
    assert "password=***" in databases[0] and "sslpassword=***" in databases[0]
    assert ":***@127.0.0.1:" in databases[0] and "application_name=t" in databases[0]
    assert "password=***" in migrated.stderr


def _answers(stubs: Stubs) -> list[tuple[str, int, str]]:
    """One call of each kind that needs the database, and what each was answered."""
    got: list[tuple[str, int, str]] = []

    def keep(what: str, resp: Any) -> None:
        got.append((what, resp.error_code, resp.error_message))

    keep("PutConnector on a held group (commit)", put_connector(stubs, "held", "B", 1))
    keep("PutConnector on a new group", put_connector(stubs, "new-1", "A", 1))
    keep("join", ScriptedWorker(stubs, "new-2", "w1").join())
    described = stubs.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=["new-3"]), timeout=10
    )
    keep("DescribeGroups", described.groups[0])
    keep("ListGroups", stubs.admin.ListGroups(admin_pb2.ListGroupsRequest(), timeout=10))
    keep("ListAcls", stubs.admin.ListAcls(admin_pb2.ListAclsRequest(), timeout=10))
    keep(
        "FindCoordinator",
        stubs.admin.FindCoordinator(admin_pb2.FindCoordinatorRequest(group_id="new-4"), timeout=10),
    )
    prepared = stubs.coordinator.ConnectGroupPrepareAssignment(
        coordinator_pb2.ConnectGroupPrepareAssignmentRequest(
            group_id="new-5", member_id="m", member_epoch=1
        ),
        timeout=10,
    )
    keep("PrepareAssignment", prepared)
    return got


def test_database_failures_reach_clients_without_host_port_or_driver_text(
    database_url: str, tmp_path: Path
) -> None:
    parsed = make_url(database_url)
    upstream = f"{parsed.host or '127.0.0.1'}:{parsed.port or 5432}"
    log_path = tmp_path / "serve.log"
    with TcpProxy(upstream) as proxy:
        url = with_secrets(database_url, proxy.port)
        assert cli("migrate", "--database-url", url).returncode == 0
        proc = CoordinatorProcess(url, log_path=log_path).start()
        stubs = Stubs(proc.address)
        try:
            assert put_connector(stubs, "held", "A", 1).error_code == 0
            proxy.cut("refuse")
            answers = _answers(stubs)
            listed = cli("list-groups", "--coordinator", proc.address)
            described = cli("describe", "new-6", "--coordinator", proc.address)
        finally:
            stubs.close()
            proc.close()
    failed = [(what, code, message) for what, code, message in answers if code != 0]
    assert len(failed) == len(answers), answers
    unavailable = [a for a in answers if a[1] == COORDINATOR_NOT_AVAILABLE]
    assert len(unavailable) >= 6, answers
    assert all("the database is unavailable" in m for _, _, m in unavailable), unavailable
    forbidden = ("127.0.0.1", str(proxy.port), str(parsed.port), *DRIVER_TEXT)
    shown = [m for _, _, m in answers] + [
        listed.stdout + listed.stderr,
        described.stdout + described.stderr,
    ]
    leaks = [(text, word) for text in shown for word in forbidden if word in text]
    assert leaks == []
    assert listed.returncode != 0 and described.returncode != 0
    # The log keeps the detail (where the database was), and no secret.
    log = log_path.read_text()
    assert f'\\"127.0.0.1\\", port {proxy.port}' in log or f"port {proxy.port}" in log
    assert no_secret_in(log) == []
