"""The maximum age of a client connection (`serve --max-connection-age-ms`): gRPC closes a
connection that old (GOAWAY), so that what is checked only at the TLS handshake (the client CA
bundle, a certificate's expiry) is checked again, letting its calls in flight finish within a
grace. Standard library only, so that the command line can validate the flags without grpc.

Parked classic calls (DESIGN 3.19 "Long polls hold no thread") wait at most their park limit
(`park_limit_ms`): the member's rebalance timeout + 5 s (Kafka's client deadline), and, when
connections age, one second less than the grace, so a parked call is always answered
(REBALANCE_IN_PROGRESS: its member asks again, on a new connection) before gRPC would end it
with UNAVAILABLE. A grace of at least the largest rebalance timeout + 5 s avoids those re-asks.
"""

from __future__ import annotations

#: --max-connection-age-grace-ms: at least the longest a call may wait on the server. The server
#: never ends a call that waits for its group's lock (`runtime.groups`: it checks every
#: CANCEL_POLL_S whether its caller gave up), so a call lasts until its caller's deadline; the
#: longest default deadline of this project's clients is the operator commands' --timeout, 10 s
#: (the agent's and the Node client's are 5 s), and a database statement waits for a lock at most
#: 5 s (`store.engine.MAX_LOCK_WAIT_MS`).
MIN_MAX_CONNECTION_AGE_GRACE_MS = 10_000
DEFAULT_MAX_CONNECTION_AGE_GRACE_MS = 30_000
#: --max-connection-age-ms: the default (a connection opened before a client CA was removed, or a
#: certificate expired, lasts at most about this long) and the shortest allowed (0: off).
DEFAULT_MAX_CONNECTION_AGE_MS = 3_600_000
MIN_MAX_CONNECTION_AGE_MS = 1_000
#: gRPC's channel arguments are C ints.
MAX_CHANNEL_ARG = 2**31 - 1


#: Kafka's JOIN_GROUP_TIMEOUT_LAPSE: a classic client waits this much longer than its rebalance
#: timeout for a JoinGroup or SyncGroup answer (AbstractCoordinator `sendJoinGroupRequest`).
CLASSIC_CALL_LAPSE_MS = 5_000
#: A parked call is answered this long before its connection's grace runs out.
PARK_GRACE_MARGIN_MS = 1_000


def park_limit_ms(rebalance_timeout_ms: int, age_ms: int, grace_ms: int) -> int:
    """How long a classic call may stay parked: its member's rebalance timeout + 5 s, and, with
    connections closed at `age_ms` (> 0), at most `grace_ms` - 1 s (never below 1 ms)."""
    limit = max(rebalance_timeout_ms, 0) + CLASSIC_CALL_LAPSE_MS
    if age_ms > 0:
        limit = min(limit, grace_ms - PARK_GRACE_MARGIN_MS)
    return max(limit, 1)


def connection_age_options(age_ms: int, grace_ms: int) -> list[tuple[str, int]]:
    """gRPC's server options that close a connection `age_ms` after it opened (GOAWAY, about
    +-10 % jitter: new calls go to a new connection, with a new handshake), letting its calls in
    flight finish for `grace_ms`; none when `age_ms` is 0."""
    if age_ms <= 0:
        return []
    return [
        ("grpc.max_connection_age_ms", age_ms),
        ("grpc.max_connection_age_grace_ms", grace_ms),
    ]
