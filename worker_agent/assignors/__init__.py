"""The built-in client-side assignors (DESIGN 3.4, 3.15) and the lists each protocol advertises.

- `EagerAssignor` (`eager`, version 0): Kafka Connect's stop-the-world round-robin.
- `IncrementalCooperativeAssignor` (`incremental_cooperative`, versions 1-2): sticky, balanced,
  with KIP-415's delay for the work of departed workers.
"""

from __future__ import annotations

from ..assignor import ConnectAssignor
from .eager import EagerAssignor
from .incremental import DEFAULT_MAX_DELAY_MS, IncrementalCooperativeAssignor

__all__ = [
    "DEFAULT_MAX_DELAY_MS",
    "PROTOCOLS",
    "EagerAssignor",
    "IncrementalCooperativeAssignor",
    "assignors_for_protocol",
]

#: The values of `worker-agent run --protocol` (Kafka Connect's `connect.protocol`, plus
#: `sessioned`).
PROTOCOLS = ("eager", "compatible", "sessioned")


def assignors_for_protocol(protocol: str) -> list[ConnectAssignor]:
    """The assignors an agent advertises for `protocol`, most preferred first (DESIGN 3.15).

    `eager`: eager only. `compatible`: incremental_cooperative [1-1], then eager. `sessioned`:
    incremental_cooperative [1-2], then eager. So one eager-only worker downgrades a group to
    eager, and a mixed compatible/sessioned group runs version 1.
    """
    if protocol == "eager":
        return [EagerAssignor()]
    if protocol == "compatible":
        return [IncrementalCooperativeAssignor(maximum_version=1), EagerAssignor()]
    if protocol == "sessioned":
        return [IncrementalCooperativeAssignor(maximum_version=2), EagerAssignor()]
    raise ValueError(
        f"unknown connect protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}."
    )
