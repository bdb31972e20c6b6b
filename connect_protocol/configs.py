"""Group configurations as one typed table (issue 24, DESIGN 3.21): one row per key, with its
type, default, bounds, documentation, and (derived from its name) the `serve` flag and
environment variable that set the server's default. Everything else derives from the table: the
flags, every bounds check (AlterGroupConfigs and the flags), the one rule between keys (the
heartbeat interval below the session timeout), the defaults map and the typed reads. Kafka does
the same: `org.apache.kafka.coordinator.group.GroupConfig` defines each group configuration once
in a `ConfigDef` (name, type, default, validator, doc) and validates against it.

Adding a group configuration: a row here (and its field in `GroupConfigDefaults`, which a test
holds to the table), plus its use. One place for both sides: the coordinator validates and
applies them, the agent's assignors read them from the PrepareAssignment answer."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

#: Every integer configuration is an int32 (milliseconds, or a count).
MAX_CONFIG_VALUE = 2**31 - 1
#: An `assignor.principals` value lists at most this many principals ...
MAX_ASSIGNOR_PRINCIPALS = 64
#: ... of at most this many characters each (also the most of any principal the coordinator
#: stores, e.g. in an ACL).
MAX_PRINCIPAL_LENGTH = 1_024

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

#: The group types (DESIGN 3.19) a configuration can apply to: `connect` groups read every
#: configuration; `classic` groups only those whose row says so (their members choose their own
#: session and rebalance timeouts, and waves and assignment batching are the connect
#: protocol's). AlterGroupConfigs on a classic group refuses to set the others.
GROUP_TYPE_CONNECT = "connect"
GROUP_TYPE_CLASSIC = "classic"
CONNECT_ONLY: frozenset[str] = frozenset({GROUP_TYPE_CONNECT})
EVERY_GROUP_TYPE: frozenset[str] = frozenset({GROUP_TYPE_CONNECT, GROUP_TYPE_CLASSIC})


class _Key:
    """What every row derives from its name: the `serve` flag, its environment variable and the
    `GroupConfigDefaults` field that hold the server's default."""

    __slots__ = ()
    name: str

    @property
    def field(self) -> str:
        """`session.timeout.ms` -> `session_timeout_ms` (also argparse's dest of the flag)."""
        return self.name.replace(".", "_")

    @property
    def flag(self) -> str:
        """`session.timeout.ms` -> `--session-timeout-ms`."""
        return "--" + self.name.replace(".", "-")

    @property
    def env(self) -> str:
        """`session.timeout.ms` -> `SESSION_TIMEOUT_MS`."""
        return self.name.replace(".", "_").upper()


@dataclass(frozen=True, slots=True, kw_only=True)
class IntConfig(_Key):
    """An integer configuration in [minimum, maximum], written as plain decimal digits (what
    clients in any language parse back from DescribeGroups)."""

    name: str
    default: int
    minimum: int
    maximum: int = MAX_CONFIG_VALUE
    #: What the number counts, for messages ("an integer number of milliseconds").
    unit: str = "milliseconds"
    doc: str
    #: Whether a PrepareAssignment answer carries it to the assignor.
    to_assignor: bool = True
    #: The group types it applies to (see EVERY_GROUP_TYPE).
    group_types: frozenset[str] = CONNECT_ONLY

    #: The type, as documentation names it.
    type_name = "int32"

    def parse(self, raw: str) -> int:
        """The value of `raw`; ValueError if it is not an integer."""
        return int(raw)

    def problem(self, raw: str) -> str | None:
        """Why `raw` cannot be this configuration's value (AlterGroupConfigs), or None."""
        if re.fullmatch(r"-?[0-9]+", raw) is None:
            return f"{self.name} must be an integer number of {self.unit}, got {raw!r}."
        return self.value_problem(int(raw))

    def value_problem(self, value: int) -> str | None:
        if value < self.minimum:
            return f"{self.name} must be >= {self.minimum}, got {value}."
        if value > self.maximum:
            if self.maximum == MAX_CONFIG_VALUE:
                return f"{self.name} must fit an int32, got {value}."
            return f"{self.name} must be <= {self.maximum}, got {value}."
        return None

    def flag_problem(self, value: int) -> str | None:
        """Why `value` cannot be the server's default (the `serve` flag), or None."""
        if not self.minimum <= value <= self.maximum:
            return f"{self.flag} must be between {self.minimum} and {self.maximum}"
        return None


#: A new entry of an `assignor.principals` list starts at a comma followed by "User:", so that a
#: principal named by a certificate subject keeps its own commas ("User:CN=a,O=b,User:CN=c").
_PRINCIPAL_SEPARATOR = re.compile(r"\s*,\s*(?=User:)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: A principal as the coordinator names callers (`principals.PrincipalMapper`): "User:" and a
#: name that neither starts nor ends with a space or a comma.
_PRINCIPAL = re.compile(r"User:[^\s,](?:.*[^\s,])?", re.DOTALL)


def principal_list(value: str) -> tuple[str, ...]:
    """The principals of an `assignor.principals` value (empty: any principal)."""
    value = value.strip()
    return () if not value else tuple(_PRINCIPAL_SEPARATOR.split(value))


@dataclass(frozen=True, slots=True, kw_only=True)
class PrincipalListConfig(_Key):
    """A list of principals, comma-separated ("User:alice,User:CN=bob,O=example"); a new
    entry starts at ",User:", so a subject's own commas stay in its principal. Empty: any."""

    name: str
    default: str = ""
    doc: str
    to_assignor: bool = False
    #: The group types it applies to (see EVERY_GROUP_TYPE).
    group_types: frozenset[str] = CONNECT_ONLY

    #: The type, as documentation names it.
    type_name = "principal list"

    def parse(self, raw: str) -> tuple[str, ...]:
        return principal_list(raw)

    def problem(self, raw: str) -> str | None:
        """Empty, or up to MAX_ASSIGNOR_PRINCIPALS distinct principals of at most
        MAX_PRINCIPAL_LENGTH characters each."""
        what = self.name
        if len(raw) > MAX_ASSIGNOR_PRINCIPALS * (MAX_PRINCIPAL_LENGTH + 2):
            return (
                f"{what} must list at most {MAX_ASSIGNOR_PRINCIPALS} principals of at most "
                f"{MAX_PRINCIPAL_LENGTH} characters each."
            )
        if _CONTROL.search(raw) is not None:
            return f"{what} must not contain control characters."
        principals = principal_list(raw)
        if len(principals) > MAX_ASSIGNOR_PRINCIPALS:
            return (
                f"{what} must list at most {MAX_ASSIGNOR_PRINCIPALS} principals, "
                f"got {len(principals)}."
            )
        for principal in principals:
            if len(principal) > MAX_PRINCIPAL_LENGTH:
                return (
                    f"each principal of {what} must be at most {MAX_PRINCIPAL_LENGTH} characters."
                )
            if _PRINCIPAL.fullmatch(principal) is None:
                return (
                    f"{what} must be comma-separated principals as the coordinator names "
                    "callers, 'User:<name>' (for example 'User:CN=worker,O=example'), got "
                    f"{principal!r}."
                )
        if len(set(principals)) != len(principals):
            return f"{what} lists a principal more than once."
        return None

    def flag_problem(self, value: str) -> str | None:
        problem = self.problem(value)
        return None if problem is None else f"{self.flag} ({self.env}): {problem}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ChoiceConfig(_Key):
    """One of a fixed set of lower-case words."""

    name: str
    default: str
    choices: tuple[str, ...]
    doc: str
    to_assignor: bool = False
    #: The group types it applies to (see EVERY_GROUP_TYPE).
    group_types: frozenset[str] = CONNECT_ONLY

    #: The type, as documentation names it.
    type_name = "choice"

    def parse(self, raw: str) -> str:
        if raw not in self.choices:
            raise ValueError(raw)
        return raw

    def problem(self, raw: str) -> str | None:
        if raw in self.choices:
            return None
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        return f"{self.name} must be one of {', '.join(self.choices)}, got {shown!r}."

    def flag_problem(self, value: str) -> str | None:
        problem = self.problem(value)
        return None if problem is None else f"{self.flag} ({self.env}): {problem}"


GroupConfig = IntConfig | PrincipalListConfig | ChoiceConfig


# --- the table ---------------------------------------------------------------------------------

SESSION_TIMEOUT = IntConfig(
    name="session.timeout.ms",
    default=10_000,
    minimum=1,
    doc="a member silent for longer is removed and its work released",
)
HEARTBEAT_INTERVAL = IntConfig(
    name="heartbeat.interval.ms",
    default=3_000,
    minimum=1,
    doc="how often members heartbeat; below session.timeout.ms",
)
REBALANCE_TIMEOUT = IntConfig(
    name="rebalance.timeout.ms",
    default=60_000,
    minimum=1,
    doc="how long a member may take to give work up, or the assignor member to install",
)
SCHEDULED_REBALANCE_MAX_DELAY = IntConfig(
    name="scheduled.rebalance.max.delay.ms",
    default=300_000,
    minimum=0,
    doc="longest the work of a departed member is held back for its return (0: none)",
    # A classic group's leader is handed it (Connect's scheduled.rebalance.max.delay.ms).
    group_types=EVERY_GROUP_TYPE,
)
#: Paced rebalancing (seed 002 Design III, DESIGN 3.18): at most this many resources in motion
#: for balancing at once (0: no limit, everything balance needs moves in one target) ...
REBALANCE_WAVE_MAX = IntConfig(
    name="rebalance.wave.max.resources",
    default=0,
    minimum=0,
    unit="resources",
    doc="at most this many running resources in motion for balancing at once, paced in waves "
    "(0: no limit, everything moves in one target)",
)
#: ... and the pause between waves, from the delivery of the previous wave's last resource.
REBALANCE_WAVE_PAUSE = IntConfig(
    name="rebalance.wave.pause.ms",
    default=0,
    minimum=0,
    doc="the pause between waves, from the delivery of the previous wave's last resource",
)
#: Who may compute (DESIGN 3.4): the principals whose members may be chosen as the assignor
#: member; empty: any principal. The coordinator reads it, assignors are not sent it.
ASSIGNOR_PRINCIPAL_LIST = PrincipalListConfig(
    name="assignor.principals",
    doc="principals whose members may compute assignments (e.g. "
    "'User:CN=connect-admin,O=example'); empty: any member",
    # In a classic group it chooses who may be the leader (DESIGN 3.4, 3.19).
    group_types=EVERY_GROUP_TYPE,
)
#: Assignment batching (DESIGN 3.21, Kafka's KIP-1263 `consumer.assignment.interval.ms`): a new
#: target computation is requested at most once per interval; epoch bumps meanwhile are folded
#: into the next request.
ASSIGNMENT_INTERVAL = IntConfig(
    name="assignment.interval.ms",
    default=1_000,
    minimum=0,
    maximum=3_600_000,
    doc="a new target computation is requested at most once per this interval; epoch bumps "
    "meanwhile are folded into it (0: at once)",
)
#: Automatic restarts of FAILED resources (DESIGN 3.20; beyond Connect, which never restarts a
#: failed task by itself): at most this many consecutive automatic restarts per resource ...
RESTART_FAILED_MAX_ATTEMPTS = IntConfig(
    name="restart.failed.max.attempts",
    default=10,
    minimum=0,
    maximum=1_000,
    unit="attempts",
    doc="consecutive automatic restarts of a resource reported FAILED (0: none); the count "
    "resets once it has run for restart.failed.backoff.ms",
    to_assignor=False,
    group_types=EVERY_GROUP_TYPE,
)
#: ... the first after this long, each next one after twice the previous wait (at most
#: RESTART_BACKOFF_CAP_MS).
RESTART_FAILED_BACKOFF = IntConfig(
    name="restart.failed.backoff.ms",
    default=10_000,
    minimum=0,
    maximum=1_800_000,
    doc="wait before the first automatic restart of a FAILED resource, doubling per attempt up "
    "to 1800000; also how long RUNNING must last to reset the attempts",
    to_assignor=False,
    group_types=EVERY_GROUP_TYPE,
)
#: The longest wait between two automatic restarts.
RESTART_BACKOFF_CAP_MS = 1_800_000

#: Online migration between the protocols (DESIGN 3.19 "Migration policy", Kafka's
#: group.consumer.migration.policy, here per group): which conversions of a non-empty group its
#: joins may make. An empty group takes its first joiner's protocol under every policy.
MIGRATION_BIDIRECTIONAL = "bidirectional"
MIGRATION_UPGRADE = "upgrade"
MIGRATION_DOWNGRADE = "downgrade"
MIGRATION_DISABLED = "disabled"
MIGRATION_POLICY = ChoiceConfig(
    name="group.protocol.migration.policy",
    default=MIGRATION_BIDIRECTIONAL,
    choices=(MIGRATION_BIDIRECTIONAL, MIGRATION_UPGRADE, MIGRATION_DOWNGRADE, MIGRATION_DISABLED),
    doc="which conversions of a non-empty group are allowed: bidirectional, upgrade "
    "(classic to connect), downgrade (connect to classic) or disabled (neither; classic "
    "workers may not join a non-empty connect group either)",
    group_types=EVERY_GROUP_TYPE,
)

#: Every group configuration, in the order `serve --help` and DescribeGroups show them.
GROUP_CONFIGS: tuple[GroupConfig, ...] = (
    SESSION_TIMEOUT,
    HEARTBEAT_INTERVAL,
    REBALANCE_TIMEOUT,
    SCHEDULED_REBALANCE_MAX_DELAY,
    REBALANCE_WAVE_MAX,
    REBALANCE_WAVE_PAUSE,
    ASSIGNMENT_INTERVAL,
    ASSIGNOR_PRINCIPAL_LIST,
    MIGRATION_POLICY,
    RESTART_FAILED_MAX_ATTEMPTS,
    RESTART_FAILED_BACKOFF,
)
BY_NAME: Mapping[str, GroupConfig] = {row.name: row for row in GROUP_CONFIGS}


def applies_to(row: GroupConfig, group_type: str) -> bool:
    """Whether configuration `row` applies to groups of `group_type`."""
    return group_type in row.group_types


def configs_of(group_type: str) -> tuple[GroupConfig, ...]:
    """The configurations that apply to groups of `group_type`, in table order."""
    return tuple(row for row in GROUP_CONFIGS if group_type in row.group_types)


# --- the one rule between keys ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SmallerThan:
    """`smaller` must stay below `larger`."""

    smaller: IntConfig
    larger: IntConfig

    def problem(
        self, values: Mapping[str, str], shown: Callable[[IntConfig, str], str] | None
    ) -> str | None:
        """Why `values` break the rule, or None (also when one of the keys is absent). Each key
        is named by `shown(row, value)`, or by its name alone when None."""
        small, large = values.get(self.smaller.name), values.get(self.larger.name)
        if small is None or large is None or int(small) < int(large):
            return None

        def name(row: IntConfig, value: str) -> str:
            return row.name if shown is None else shown(row, value)

        return f"{name(self.smaller, small)} must be smaller than {name(self.larger, large)}"


#: Rules between keys: a member must be able to heartbeat before its session expires.
CROSS_KEY_RULES = (SmallerThan(HEARTBEAT_INTERVAL, SESSION_TIMEOUT),)


def cross_key_problem(
    values: Mapping[str, str], shown: Callable[[IntConfig, str], str] | None = None
) -> str | None:
    """Why `values` (each already valid on its own) break a rule between keys, or None; a rule
    whose keys are not all in `values` is not checked."""
    for rule in CROSS_KEY_RULES:
        problem = rule.problem(values, shown)
        if problem is not None:
            return problem
    return None


# --- typed reads ---------------------------------------------------------------------------------


class Readable(Protocol[T_co]):
    @property
    def name(self) -> str: ...

    def parse(self, raw: str) -> T_co: ...


def read(row: Readable[T], configs: Mapping[str, str], default_raw: str) -> T:
    """The value of `row` in `configs`, else `default_raw` (the server's default, as text);
    a value that does not parse (the coordinator refuses such values; a client reading an
    answer stays tolerant) reads as the default."""
    raw = configs.get(row.name)
    if raw is not None:
        try:
            return row.parse(raw)
        except ValueError:
            pass
    return row.parse(default_raw)


def config_int(configs: Mapping[str, str], key: str, default: int) -> int:
    """A configuration's value as an integer: `default` when absent or not an integer (for
    clients, such as the agent's assignors, that read the PrepareAssignment answer)."""
    raw = configs.get(key)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        return default


# --- names kept for the code that imports them ---------------------------------------------------

SESSION_TIMEOUT_MS = SESSION_TIMEOUT.name
HEARTBEAT_INTERVAL_MS = HEARTBEAT_INTERVAL.name
REBALANCE_TIMEOUT_MS = REBALANCE_TIMEOUT.name
SCHEDULED_REBALANCE_MAX_DELAY_MS = SCHEDULED_REBALANCE_MAX_DELAY.name
REBALANCE_WAVE_MAX_RESOURCES = REBALANCE_WAVE_MAX.name
REBALANCE_WAVE_PAUSE_MS = REBALANCE_WAVE_PAUSE.name
ASSIGNOR_PRINCIPALS = ASSIGNOR_PRINCIPAL_LIST.name
ASSIGNMENT_INTERVAL_MS = ASSIGNMENT_INTERVAL.name

DEFAULT_SESSION_TIMEOUT_MS = SESSION_TIMEOUT.default
DEFAULT_HEARTBEAT_INTERVAL_MS = HEARTBEAT_INTERVAL.default
DEFAULT_REBALANCE_TIMEOUT_MS = REBALANCE_TIMEOUT.default
DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS = SCHEDULED_REBALANCE_MAX_DELAY.default
DEFAULT_REBALANCE_WAVE_MAX_RESOURCES = REBALANCE_WAVE_MAX.default
DEFAULT_REBALANCE_WAVE_PAUSE_MS = REBALANCE_WAVE_PAUSE.default

#: The configurations whose values are int32 numbers (milliseconds, or a count) ...
INT_CONFIG_KEYS = tuple(row.name for row in GROUP_CONFIGS if isinstance(row, IntConfig))
#: ... and every configuration.
CONFIG_KEYS = tuple(row.name for row in GROUP_CONFIGS)
#: What a PrepareAssignment answer carries to the assignor: only what an assignor reads.
ASSIGNOR_CONFIG_KEYS = tuple(row.name for row in GROUP_CONFIGS if row.to_assignor)


def int_config(key: str) -> IntConfig:
    """The row of the integer configuration `key` (KeyError if there is none)."""
    row = BY_NAME[key]
    if not isinstance(row, IntConfig):
        raise KeyError(f"{key} is not an integer configuration")
    return row


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
    return keyed_digest(canonical_config(config), key)


def keyed_digest(data: bytes, key: bytes | None) -> str:
    """ "hmac-sha256:<hex>" of `data` under `key`, or "sha256:<hex>" without one: the digest of
    config digests, and of anything else that may carry secrets (status traces, DESIGN 3.20)."""
    if key is None:
        return UNKEYED_DIGEST_PREFIX + hashlib.sha256(data).hexdigest()
    return KEYED_DIGEST_PREFIX + hmac.new(key, data, hashlib.sha256).hexdigest()
