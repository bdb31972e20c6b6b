"""The Go worker client (clients/go) builds offline from Debian's packages, `go vet` is clean,
and its unit tests pass.

Nothing here skips: a machine without Go fails loudly (scripts/lib/setup.sh installs golang-go,
golang-google-grpc-dev, golang-google-protobuf-dev). Its behaviour against a real coordinator is
the conformance suite's (tests/clients/conformance/).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.coordinator import REPO

GO_DIR = REPO / "clients" / "go"
BUILD = GO_DIR / "build"
BINARY = GO_DIR / "bin" / "connect-group-worker"


def _build(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("go") is None:
        pytest.fail(
            "go is required by the Go client's tests; install golang-go, golang-google-grpc-dev "
            "and golang-google-protobuf-dev (scripts/lib/setup.sh does)",
            pytrace=False,
        )
    return subprocess.run(
        [str(BUILD), *args], capture_output=True, text=True, timeout=600, check=False
    )


def test_builds_vets_and_passes_its_unit_tests() -> None:
    proc = _build("--vet", "--test")
    assert proc.returncode == 0, (
        f"clients/go/build --vet --test failed:\n{proc.stdout}\n{proc.stderr}"
    )
    assert proc.stdout.strip().splitlines()[-1] == str(BINARY)
    assert os.access(BINARY, os.X_OK)
    assert "ok" in proc.stderr and "example.com/connectgroup/worker" in proc.stderr, proc.stderr


def test_build_is_idempotent_and_the_binary_runs() -> None:
    first = _build()
    assert first.returncode == 0, first.stderr
    before = BINARY.stat().st_mtime_ns
    again = _build()
    assert again.returncode == 0, again.stderr
    assert Path(again.stdout.strip()) == BINARY
    assert BINARY.stat().st_mtime_ns == before, "nothing changed, yet it was rebuilt"
    version = subprocess.run([str(BINARY), "--version"], capture_output=True, text=True, timeout=10)
    assert version.returncode == 0 and version.stdout.startswith("connect-group-worker ")
    bad = subprocess.run(
        [str(BINARY), "--no-such-flag"], capture_output=True, text=True, timeout=10
    )
    assert bad.returncode == 2
    plaintext = subprocess.run(
        [str(BINARY), "--coordinator", "10.0.0.1:9093", "--group", "g"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert plaintext.returncode == 2
    assert "not a loopback address" in plaintext.stderr
