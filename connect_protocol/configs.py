"""Group configurations: their keys, Kafka Connect's defaults, the bounds a value must keep, and
how a value is read. One place for both sides: the coordinator validates and applies them, the
agent's assignors read them from the PrepareAssignment answer."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

SESSION_TIMEOUT_MS = "session.timeout.ms"
HEARTBEAT_INTERVAL_MS = "heartbeat.interval.ms"
REBALANCE_TIMEOUT_MS = "rebalance.timeout.ms"
SCHEDULED_REBALANCE_MAX_DELAY_MS = "scheduled.rebalance.max.delay.ms"

CONFIG_KEYS = (
    SESSION_TIMEOUT_MS,
    HEARTBEAT_INTERVAL_MS,
    REBALANCE_TIMEOUT_MS,
    SCHEDULED_REBALANCE_MAX_DELAY_MS,
)

DEFAULT_SESSION_TIMEOUT_MS = 10_000
DEFAULT_HEARTBEAT_INTERVAL_MS = 3_000
DEFAULT_REBALANCE_TIMEOUT_MS = 60_000
DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS = 300_000

#: Every value is milliseconds in an int32; only the delay may be 0 (no delay).
MAX_CONFIG_VALUE = 2**31 - 1


def minimum_value(key: str) -> int:
    """The smallest value `key` may take."""
    return 0 if key == SCHEDULED_REBALANCE_MAX_DELAY_MS else 1


def config_int(configs: Mapping[str, str], key: str, default: int) -> int:
    """A configuration's value as an integer (milliseconds): `default` when absent or not an
    integer (the coordinator refuses such values; a client reading an answer stays tolerant)."""
    raw = configs.get(key)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        return default


#: What DescribeGroups shows for a config value the caller may not see.
HIDDEN_VALUE = "[hidden]"


def config_digest(config: Mapping[str, str]) -> str:
    """ "sha256:<hex>" of a connector config as canonical JSON (keys sorted, no spaces, UTF-8):
    equal digests mean equal configs, and no value can be read back from it."""
    canonical = json.dumps(dict(config), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
