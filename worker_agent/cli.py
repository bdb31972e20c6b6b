"""`worker-agent` entry point (the agent itself is the next piece of work)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    print(
        "worker-agent: not implemented yet; the coordinator (coordinator-svc) is usable with "
        "any client of protos/connect/group/v1.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
