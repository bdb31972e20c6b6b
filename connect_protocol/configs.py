"""Group configurations: their keys, Kafka Connect's defaults, the bounds a value must keep, and
how a value is read. One place for both sides: the coordinator validates and applies them, the
agent's assignors read them from the PrepareAssignment answer."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping

SESSION_TIMEOUT_MS = "session.timeout.ms"
HEARTBEAT_INTERVAL_MS = "heartbeat.interval.ms"
REBALANCE_TIMEOUT_MS = "rebalance.timeout.ms"
SCHEDULED_REBALANCE_MAX_DELAY_MS = "scheduled.rebalance.max.delay.ms"
#: Paced rebalancing (seed 002 Design III, DESIGN 3.18): at most this many resources in motion
#: for balancing at once (0: no limit, everything balance needs moves in one target) ...
REBALANCE_WAVE_MAX_RESOURCES = "rebalance.wave.max.resources"
#: ... and the pause between waves, from the delivery of the previous wave's last resource.
REBALANCE_WAVE_PAUSE_MS = "rebalance.wave.pause.ms"

#: Who may compute (DESIGN 3.4): the principals whose members may be chosen as the assignor
#: member, comma-separated ("User:alice,User:CN=bob,O=example"); empty: any principal. The one
#: configuration that is not an integer; the coordinator reads it, assignors are not sent it.
ASSIGNOR_PRINCIPALS = "assignor.principals"

#: The configurations whose values are int32 numbers (milliseconds, or a count) ...
INT_CONFIG_KEYS = (
    SESSION_TIMEOUT_MS,
    HEARTBEAT_INTERVAL_MS,
    REBALANCE_TIMEOUT_MS,
    SCHEDULED_REBALANCE_MAX_DELAY_MS,
    REBALANCE_WAVE_MAX_RESOURCES,
    REBALANCE_WAVE_PAUSE_MS,
)
#: ... and every configuration.
CONFIG_KEYS = (*INT_CONFIG_KEYS, ASSIGNOR_PRINCIPALS)
#: What a PrepareAssignment answer carries to the assignor: only what an assignor reads.
ASSIGNOR_CONFIG_KEYS = INT_CONFIG_KEYS

DEFAULT_SESSION_TIMEOUT_MS = 10_000
DEFAULT_HEARTBEAT_INTERVAL_MS = 3_000
DEFAULT_REBALANCE_TIMEOUT_MS = 60_000
DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS = 300_000
DEFAULT_REBALANCE_WAVE_MAX_RESOURCES = 0
DEFAULT_REBALANCE_WAVE_PAUSE_MS = 0

#: Every value of INT_CONFIG_KEYS is an int32 (milliseconds, or a count); only the delay and the
#: wave settings may be 0 (no delay, no limit, no pause).
MAX_CONFIG_VALUE = 2**31 - 1
_MAY_BE_ZERO = frozenset(
    (SCHEDULED_REBALANCE_MAX_DELAY_MS, REBALANCE_WAVE_MAX_RESOURCES, REBALANCE_WAVE_PAUSE_MS)
)


def minimum_value(key: str) -> int:
    """The smallest value `key` may take."""
    return 0 if key in _MAY_BE_ZERO else 1


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


#: A new entry of an `assignor.principals` list starts at a comma followed by "User:", so that a
#: principal named by a certificate subject keeps its own commas ("User:CN=a,O=b,User:CN=c").
_PRINCIPAL_SEPARATOR = re.compile(r"\s*,\s*(?=User:)")


def principal_list(value: str) -> tuple[str, ...]:
    """The principals of an `assignor.principals` value (empty: any principal)."""
    value = value.strip()
    return () if not value else tuple(_PRINCIPAL_SEPARATOR.split(value))


#: What DescribeGroups shows for a config value the caller may not see.
HIDDEN_VALUE = "[hidden]"


#: The prefix of a keyed digest (`config_digest` with a key) ...
KEYED_DIGEST_PREFIX = "hmac-sha256:"
#: ... and of an unkeyed one (before migration 0005; still in older events and exports).
UNKEYED_DIGEST_PREFIX = "sha256:"


def canonical_config(config: Mapping[str, str]) -> bytes:
    """A connector config as canonical JSON (keys sorted, no spaces, UTF-8)."""
    return json.dumps(
        dict(config), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()


def config_digest(config: Mapping[str, str], key: bytes | None = None) -> str:
    """The digest of a connector config: with `key` (the database's digest key, migration 0005)
    "hmac-sha256:<hex>", an HMAC of its canonical JSON, so that nobody without the key can
    confirm a guessed value offline; without one "sha256:<hex>" (what digests were before).
    Equal digests under one key mean equal configs, and no value can be read back from one."""
    canonical = canonical_config(config)
    if key is None:
        return UNKEYED_DIGEST_PREFIX + hashlib.sha256(canonical).hexdigest()
    return KEYED_DIGEST_PREFIX + hmac.new(key, canonical, hashlib.sha256).hexdigest()
