"""The import rules (pyproject.toml, [tool.importlinter]) hold for the tree, and each of them
fails on a deliberately wrong import: a copy of the packages with one bad import per rule."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
ROOTS = (
    "connect_protocol",
    "coordinator_svc",
    "worker_agent",
    "audit_export",
    "examples",
    "bench",
    "tests",
)

#: One wrong import per contract id: (file to write, the import, the contract's name as reported).
PROBES = {
    "protocol": (
        "connect_protocol/_probe.py",
        "import coordinator_svc.store",
        "connect_protocol imports only the standard library",
    ),
    "protocol-pure": (
        "connect_protocol/env.py",  # appended to a module that must stay free of protobuf
        "import google.protobuf",
        "connect_protocol outside wire imports no protobuf",
    ),
    "core": (
        "coordinator_svc/core/_probe.py",
        "import sqlalchemy",
        "the coordinator's core imports only the standard library",
    ),
    "agent": (
        "worker_agent/_probe.py",
        "import coordinator_svc.grpc_api.convert",
        "the agent never imports the coordinator",
    ),
    "audit": (
        "audit_export/_probe.py",
        "import worker_agent.runtime",
        "the audit export imports neither the coordinator nor the agent",
    ),
    "product": (
        "coordinator_svc/_probe.py",
        "import tests.support.coordinator",
        "the product imports neither the tests, the benchmarks nor the examples",
    ),
    "bench": ("tests/_probe.py", "import bench.hotpath", "nothing imports the benchmarks"),
    "bench-tests": (
        "bench/_probe.py",
        "import tests.core.harness",
        "the benchmarks use tests.support, no other test module",
    ),
    "runtime-port": (
        "coordinator_svc/runtime/group_stats.py",
        "import coordinator_svc.store.sql_store",
        "the runtime's group jobs use the store port",
    ),
    "lease-commit": (
        "coordinator_svc/runtime/ownership.py",
        "import coordinator_svc.runtime.group_commit",
        "lease ownership and group commit are independent",
    ),
}


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} missing: ./scripts/test installs import-linter"
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def broken_contracts(output: str) -> set[str]:
    """The contract names reported BROKEN (a name may be wrapped over two lines)."""
    flat = re.sub(r"\s*\n\s*", " ", output.split("Broken contracts")[0])
    return {
        name
        for _, _, name in PROBES.values()
        if re.search(re.escape(name) + r"[^\n]*?BROKEN", flat) is not None
    }


def test_the_tree_keeps_every_import_contract() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(PROBES)} kept, 0 broken." in result.stdout


def test_each_contract_fails_on_a_wrong_import(tmp_path: Path) -> None:
    for root in ROOTS:
        shutil.copytree(
            REPO / root, tmp_path / root, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    assert broken_contracts(lint_imports(tmp_path).stdout) == set()  # the copy is clean
    for path, line, _name in PROBES.values():
        with (tmp_path / path).open("a") as out:
            out.write(f"\n{line}  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert f"Contracts: 0 kept, {len(PROBES)} broken." in result.stdout, result.stdout
    assert broken_contracts(result.stdout) == {name for _, _, name in PROBES.values()}
