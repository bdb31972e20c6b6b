"""The README's "run the product" command: `python -m examples.demo` (what `./scripts/run` runs),
end to end on the embedded SQLite default, at a fast pace. It must tell its story and end with
every connector and task running somewhere, balanced."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support.coordinator import REPO

pytestmark = pytest.mark.slow

ENV = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}"}


def test_the_demo_runs_its_story_and_ends_with_everything_running() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.demo",
            "--plain",
            "--pace",
            "0.5",
            "--delay-ms",
            "3000",
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    steps = [line for line in out.splitlines() if line.startswith("== ")]
    assert len(steps) == 8, out
    assert "worker-2 comes back" in out and "payments-sink" in out
    # The last table: four connectors' worth of work, all of it running, on three workers.
    last = out.rsplit("group demo:", 1)[1]
    rows = re.findall(r"^(worker-\d)\s+(\d+)\s+(\w+)\s+(\d+)\s+(.*)$", last, re.MULTILINE)
    assert [r[0] for r in rows] == ["worker-1", "worker-2", "worker-4"], last
    assert re.search(r"^\(nobody\)\s+0\s*$", last, re.MULTILINE), last
    running = [name for r in rows for name in r[4].split(", ") if name]
    assert len(running) == len(set(running)) == 4 + (4 + 3 + 2 + 3), last  # connectors + tasks
    counts = [int(r[3]) for r in rows]
    assert max(counts) - min(counts) <= 2, last  # connectors and tasks each within one
