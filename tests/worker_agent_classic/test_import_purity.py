"""The classic ports import neither protobuf, grpc, the generated code nor the coordinator
(the agent's import contract in pyproject.toml; DESIGN 3.19's ports are pure)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_ports_loads_no_protobuf_grpc_or_coordinator() -> None:
    code = (
        "import sys, worker_agent.classic, worker_agent.classic.messages;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('google', 'grpc', 'connect', 'coordinator_svc')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
