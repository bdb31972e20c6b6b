"""`worker-agent` behind a start gate, so that several agent processes join a group at once.

    python -m tests.support.gated_agent GATE READY [worker-agent arguments, e.g. run ...]

Imports the agent (the slow part of its start-up: gRPC, protobuf), creates the file READY, waits
until the file GATE exists (at most `GATE_TIMEOUT_S`; exit 3 if it never appears), then runs
`worker_agent.cli.main` with the remaining arguments, exactly as `python -m worker_agent.cli`
would. A test starts several of these, waits for their READY files and creates GATE: the agents'
joins then land within milliseconds of each other instead of a process start-up apart.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from worker_agent.cli import main as agent_main

GATE_TIMEOUT_S = 120.0
POLL_S = 0.005


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: gated_agent.py GATE READY [worker-agent args...]", file=sys.stderr)
        return 2
    gate, ready, rest = Path(argv[1]), Path(argv[2]), argv[3:]
    ready.touch()
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not gate.exists():
        if time.monotonic() > deadline:
            print(f"gated_agent: {gate} never appeared", file=sys.stderr)
            return 3
        time.sleep(POLL_S)
    return agent_main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
