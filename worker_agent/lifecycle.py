"""The agent's side of the connector lifecycle (DESIGN 3.20), the pure pieces: what it knows of
the configs of what it holds (`ConfigCache`), the listener payload's `configs` and
`target_states` (`configs_json`), the statuses it owes the coordinator (`StatusBook`), what it
did about target states and restarts (`WorkLedger`), which connectors wait for a fetch sent
after their latest grant (`StartGate`), and the checks of a status a worker reports
(`parse_status_report`). No I/O, no clock, no threads: the runtime (`worker_agent.control`)
drives them.

Config values never reach a log line: `ConnectorConfig`'s repr shows the digest only, and every
log line of the agent names digests, never values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from connect_protocol.errors import ErrorCode
from connect_protocol.lifecycle_messages import (
    ConfigsResponse,
    EntryResult,
    ReportedState,
    StatusEntry,
    TargetState,
)
from connect_protocol.resources import ResourceSet, TaskId
from connect_protocol.tokens import FencingTokens, Resource

__all__ = [
    "MAX_TRACE_CHARS",
    "ConfigCache",
    "ConfigChanges",
    "ConnectorConfig",
    "ResourceNotHeld",
    "StartGate",
    "StatusBook",
    "WorkLedger",
    "configs_json",
    "connectors_of",
    "mask_values",
    "parse_status_report",
    "reported_state_for",
    "resource_name",
]

#: The longest trace the agent sends (the coordinator keeps --status-trace-max-bytes of it).
MAX_TRACE_CHARS = 16_384


def _frozen(values: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(values))


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    """One connector's config as its holder received it: its digest (equal digests, equal
    configs) and its values, which `repr` leaves out (a value may be a secret)."""

    digest: str
    values: Mapping[str, str] = field(default_factory=lambda: _frozen({}), repr=False)
    target_state: TargetState = TargetState.STARTED

    def to_json(self, *, values: bool) -> dict[str, object]:
        """`{"digest", "config"}`, or `{"digest"}` alone when values are withheld."""
        if values:
            return {"digest": self.digest, "config": dict(sorted(self.values.items()))}
        return {"digest": self.digest}


def configs_json(
    configs: Mapping[str, ConnectorConfig], *, values: bool
) -> dict[str, dict[str, object]]:
    """The listener payload's `configs` (DESIGN 2.3, 3.20): {connector: {"digest", "config"}},
    by connector name; with `values` False, the digests only."""
    return {name: configs[name].to_json(values=values) for name in sorted(configs)}


def target_states_json(configs: Mapping[str, ConnectorConfig]) -> dict[str, str]:
    """The listener payload's `target_states`: {connector: "STARTED"|"PAUSED"|"STOPPED"}."""
    return {name: configs[name].target_state.value for name in sorted(configs)}


def connectors_of(resources: ResourceSet) -> frozenset[str]:
    """The connectors whose config these resources run with (a task's is its connector's)."""
    return resources.connectors | {t.connector for t in resources.tasks}


def resource_name(resource: Resource) -> str:
    """`A` for a connector, `A-0` for a task."""
    return resource if isinstance(resource, str) else str(resource)


def _connector_of(resource: Resource) -> str:
    return resource if isinstance(resource, str) else resource.connector


def _resources(resources: ResourceSet) -> Iterable[Resource]:
    yield from resources.connectors
    yield from resources.tasks


@dataclass(frozen=True, slots=True)
class ConfigChanges:
    """What a ConnectGroupConfigs answer changed in a `ConfigCache`."""

    #: Connectors the answer names (the member holds them now), by name.
    confirmed: frozenset[str]
    #: Connectors known before whose digest the answer changed.
    reconfigured: frozenset[str]
    #: Connectors the answer names that were not known before.
    added: frozenset[str]
    #: Connectors dropped from the cache (not answered, and not kept).
    dropped: frozenset[str]
    #: Connectors the answer named without values the cache did not have (asked again).
    missing: frozenset[str] = frozenset()


class ConfigCache:
    """The configs (digest, values, target state) of the connectors the member holds, as its
    last ConnectGroupConfigs answers gave them, and which of them the last answer confirmed.

    The answer lists every connector whose connector or tasks the member holds (pending
    revocation excluded), values only for digests the request did not name
    (`known_digests`). Connectors it no longer names are forgotten, except those `keep` names
    (still running while they are revoked: their `revoked` call and the status endpoint may
    still need them)."""

    def __init__(self) -> None:
        self._configs: dict[str, ConnectorConfig] = {}
        self.confirmed: frozenset[str] = frozenset()
        #: The revision of the last answer applied (None: none yet).
        self.revision: int | None = None
        #: restart counts of the last answer (issue 29 acts on them).
        self.restart_counts: Mapping[Resource, int] = MappingProxyType({})

    def known_digests(self) -> dict[str, str]:
        """What a ConnectGroupConfigs request sends: connector -> digest of every config
        held."""
        return {name: c.digest for name, c in self._configs.items()}

    def get(self, connector: str) -> ConnectorConfig | None:
        return self._configs.get(connector)

    def __contains__(self, connector: object) -> bool:
        return connector in self._configs

    def __len__(self) -> int:
        return len(self._configs)

    def digest_of(self, resource: Resource) -> str | None:
        held = self._configs.get(_connector_of(resource))
        return held.digest if held is not None else None

    def for_resources(self, resources: ResourceSet) -> dict[str, ConnectorConfig]:
        """The configs of these resources' connectors that are known."""
        out = {}
        for name in connectors_of(resources):
            held = self._configs.get(name)
            if held is not None:
                out[name] = held
        return out

    def apply(self, answer: ConfigsResponse, keep: Iterable[str] = ()) -> ConfigChanges:
        """Take a successful answer (error_code NONE)."""
        named: dict[str, ConnectorConfig] = {}
        reconfigured: set[str] = set()
        added: set[str] = set()
        missing: set[str] = set()
        for held in answer.connectors:
            before = self._configs.get(held.connector)
            if held.config is not None:
                values = _frozen(held.config)
                config = ConnectorConfig(held.config_digest, values, held.target_state)
            elif before is not None and before.digest == held.config_digest:
                config = ConnectorConfig(held.config_digest, before.values, held.target_state)
            else:
                missing.add(held.connector)  # values withheld for a digest we no longer have
                continue
            named[held.connector] = config
            if before is None:
                added.add(held.connector)
            elif before.digest != config.digest:
                reconfigured.add(held.connector)
        kept = set(keep)
        dropped = {n for n in self._configs if n not in named and n not in kept | missing}
        for name in dropped:
            del self._configs[name]
        for name in missing:
            self._configs.pop(name, None)
        self._configs.update(named)
        self.confirmed = frozenset(named)
        self.revision = answer.lifecycle_revision
        self.restart_counts = MappingProxyType(dict(answer.restart_counts))
        return ConfigChanges(
            confirmed=self.confirmed,
            reconfigured=frozenset(reconfigured),
            added=frozenset(added),
            dropped=frozenset(dropped),
            missing=frozenset(missing),
        )

    def describe(self, names: Iterable[str] | None = None, limit: int = 20) -> str:
        """Connectors and digests for a log line (never values): the first `limit`, then how
        many in all."""
        chosen = [n for n in sorted(self._configs if names is None else names) if n in self]
        parts = [f"{n} ({self._configs[n].digest[:19]})" for n in chosen[:limit]]
        if len(chosen) > limit:
            parts.append(f"... {len(chosen)} in all")
        return ", ".join(parts) or "nothing"


#: Config values shorter than this are not masked in free text (masking "1" or "true" everywhere
#: would garble it); secrets are longer.
MIN_MASKED_VALUE = 4


def mask_values(text: str, configs: Mapping[str, ConnectorConfig]) -> str:
    """`text` (a hook's output, an exception's trace) with the values of `configs` masked: such
    text goes into log lines and status traces, which never carry config values (DESIGN 3.20),
    and a hook that echoes its input, or an exception that quotes a value, would put them
    there."""
    if not text or not configs:
        return text
    values = {v for c in configs.values() for v in c.values.values()}
    for value in sorted(values, key=len, reverse=True):
        if len(value) >= MIN_MASKED_VALUE and value in text:
            text = text.replace(value, "***")
    return text


def reported_state_for(target: TargetState, resource: Resource) -> ReportedState:
    """The state a successful `assigned` call reports: RUNNING, or PAUSED / STOPPED when that is
    the connector's target state (STOPPED is a connector's only; a task of a stopped connector
    reads as PAUSED)."""
    if target is TargetState.PAUSED:
        return ReportedState.PAUSED
    if target is TargetState.STOPPED:
        return ReportedState.STOPPED if isinstance(resource, str) else ReportedState.PAUSED
    return ReportedState.RUNNING


class WorkLedger:
    """What the agent did last about each resource the worker holds (DESIGN 3.20 "Target
    states", "Restarts"): the restart count it acted on, the target state it applied, and
    whether its last start failed. Pure: the control plane asks it what is due after each
    ConnectGroupConfigs answer.

    A grant records the count of the answer its start used (a fresh start satisfies every
    earlier restart request: a move or a resent answer repeats nothing); a later answer with a
    higher count makes the resource due for a restart. A target state other than the one
    applied makes a running resource due for `paused`, `resumed` or `stopped` (STOPPED: the
    connector only; its tasks are revoked through the assignment). A resource whose start failed
    gets no target-state event: it stays FAILED until a restart starts it again."""

    def __init__(self) -> None:
        self._acted: dict[Resource, int] = {}
        self._applied: dict[Resource, TargetState] = {}
        self._failed: set[Resource] = set()

    def started(
        self,
        resources: ResourceSet,
        counts: Mapping[Resource, int],
        targets: Mapping[str, TargetState],
        ok: bool,
    ) -> None:
        """An `assigned` call (a grant's or a restart's) for `resources` returned (`ok`) or
        failed, made with the restart `counts` and the connectors' `targets` of its answer."""
        for resource in _resources(resources):
            self._acted[resource] = counts.get(resource, 0)
            self._applied[resource] = targets.get(_connector_of(resource), TargetState.STARTED)
            if ok:
                self._failed.discard(resource)
            else:
                self._failed.add(resource)

    def applied(self, resources: ResourceSet, target: TargetState) -> None:
        """A `paused`, `resumed` or `stopped` call for `resources` returned."""
        for resource in _resources(resources):
            if resource in self._applied:
                self._applied[resource] = target

    def stopped_in_place(self, resources: ResourceSet) -> None:
        """A restart stopped these and did not start them again (the membership was lost
        meanwhile): they run nothing, as after a failed start."""
        self._failed.update(_resources(resources))

    def forget(self, resources: ResourceSet) -> None:
        """These resources stopped (revoked): nothing is owed about them any more."""
        for resource in _resources(resources):
            self._acted.pop(resource, None)
            self._applied.pop(resource, None)
            self._failed.discard(resource)

    def failed(self, resource: Resource) -> bool:
        return resource in self._failed

    def due_restarts(self, running: ResourceSet, counts: Mapping[Resource, int]) -> ResourceSet:
        """Those of `running` whose restart count is above the one acted on."""
        due = [
            r for r in _resources(running) if r in self._acted and counts.get(r, 0) > self._acted[r]
        ]
        return _set_of(due)

    def target_changes(
        self, running: ResourceSet, targets: Mapping[str, TargetState]
    ) -> dict[TargetState, ResourceSet]:
        """Target state -> those of `running` (their start did not fail) whose connector's
        target state differs from the one applied; STOPPED names connectors only."""
        changed: dict[TargetState, list[Resource]] = {}
        for resource in _resources(running):
            target = targets.get(_connector_of(resource))
            before = self._applied.get(resource)
            if target is None or before is None or target is before or resource in self._failed:
                continue
            if target is TargetState.STOPPED and not isinstance(resource, str):
                continue  # a task of a stopped connector is revoked, not stopped in place
            changed.setdefault(target, []).append(resource)
        return {target: _set_of(resources) for target, resources in changed.items()}


class StartGate:
    """Which connectors' new grants wait for a fresher ConnectGroupConfigs answer (DESIGN 3.20
    "a grant records the count"). Pure.

    A start records the restart counts of the last answer as acted on; an answer to a fetch
    sent before the grant does not name the granted resource (answers list what the member
    holds), so its count would read 0 and the next answer's persisted count (a restart done on
    the previous holder) would restart a resource that has just started fresh. So a connector
    granted something waits until a fetch sent after the grant's answer arrived has been
    answered. Fetches are numbered 1, 2, ... as they are sent (one at a time, so answers come
    in that order)."""

    def __init__(self) -> None:
        #: connector -> how many fetches had been sent when it was last granted something.
        self._waiting: dict[str, int] = {}

    def granted(self, connectors: Iterable[str], fetches_sent: int) -> None:
        """An answer granted resources of `connectors`, after `fetches_sent` fetches were
        sent."""
        for name in connectors:
            self._waiting[name] = fetches_sent

    def answered(self, fetch: int) -> None:
        """Fetch number `fetch` was answered: the grants made before it was sent are covered."""
        self._waiting = {name: sent for name, sent in self._waiting.items() if sent >= fetch}

    @property
    def waiting(self) -> frozenset[str]:
        return frozenset(self._waiting)

    def gated(self, ready: frozenset[str] | None) -> frozenset[str] | None:
        """`ready` (a machine's `ready_connectors`; None: no gate) less the waiting
        connectors."""
        if ready is None or not self._waiting:
            return ready
        return ready - self._waiting.keys()


def _set_of(resources: Iterable[Resource]) -> ResourceSet:
    items = list(resources)
    if not items:
        return ResourceSet.of((), ())
    return ResourceSet.of(
        [r for r in items if isinstance(r, str)], [r for r in items if not isinstance(r, str)]
    )


@dataclass(frozen=True, slots=True)
class _Status:
    state: ReportedState
    trace: str
    token: int


class StatusBook:
    """The statuses the agent owes the coordinator (ConnectGroupReportStatus): what each
    resource's state is now (`set`), what the coordinator has counted, and so which entries
    are still to send (changes only). One report in flight at a time (`take` ... `answered` or
    `failed`).

    A resource stopped (revoked) is forgotten: the coordinator derives its status. A resource
    whose fencing token changes (granted again) is reported again under the new token. An
    entry the coordinator refuses (NOT_RESOURCE_OWNER) is dropped, not retried."""

    def __init__(self) -> None:
        self._now: dict[Resource, _Status] = {}
        self._counted: dict[Resource, _Status] = {}
        self._in_flight: dict[Resource, _Status] | None = None

    def set(self, resource: Resource, state: ReportedState, trace: str, token: int) -> bool:
        """The resource's state now; True if that is a change still to report."""
        status = _Status(state, trace[-MAX_TRACE_CHARS:] if trace else "", token)
        self._now[resource] = status
        return self._counted.get(resource) != status

    def state_of(self, resource: Resource) -> ReportedState | None:
        status = self._now.get(resource)
        return status.state if status is not None else None

    def forget(self, resources: ResourceSet) -> None:
        """These resources stopped: nothing more to report about them."""
        for resource in _resources(resources):
            self._now.pop(resource, None)
            self._counted.pop(resource, None)

    def retoken(self, tokens: FencingTokens) -> None:
        """The current fencing tokens: a resource granted again reports again, under its new
        token."""
        for resource, status in list(self._now.items()):
            token = tokens.get(resource)
            if token is not None and token != status.token:
                self._now[resource] = _Status(status.state, status.trace, token)

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def pending(self) -> bool:
        """Whether there is a change to report (and no report in flight)."""
        if self._in_flight is not None:
            return False
        return any(self._counted.get(r) != s for r, s in self._now.items())

    def take(self) -> tuple[StatusEntry, ...]:
        """The changes to report now (each resource once), marked in flight; () if none."""
        if self._in_flight is not None:
            return ()
        changed = {r: s for r, s in self._now.items() if self._counted.get(r) != s}
        if not changed:
            return ()
        self._in_flight = changed
        ordered = sorted(changed, key=_order)
        return tuple(
            StatusEntry(r, changed[r].token, changed[r].state, changed[r].trace) for r in ordered
        )

    def answered(self, results: Iterable[EntryResult]) -> list[EntryResult]:
        """The report was answered (NONE): count what was counted, drop what was refused.
        Returns the refused entries' results."""
        sent = self._in_flight or {}
        self._in_flight = None
        refused = []
        by_resource = {r.resource: r for r in results}
        for resource, status in sent.items():
            result = by_resource.get(resource)
            if result is None or result.error_code is ErrorCode.NONE:
                if resource in self._now:
                    self._counted[resource] = status
                continue
            refused.append(result)
            if self._now.get(resource) == status:
                del self._now[resource]  # refused: not retried (a newer state would be)
        return refused

    def failed(self, *, drop: bool = False) -> None:
        """The report got no answer or was refused as a whole: send it again later, or (`drop`,
        an answer that would not change) drop what was sent."""
        sent = self._in_flight or {}
        self._in_flight = None
        if drop:
            for resource, status in sent.items():
                if self._now.get(resource) == status:
                    del self._now[resource]


def _order(resource: Resource) -> tuple[str, int]:
    return (resource, -1) if isinstance(resource, str) else resource


class ResourceNotHeld(Exception):
    """A status reported for a resource the worker does not run. `status`: the HTTP status
    the status endpoint answers (404: not this worker's; 409: assigned but not started, or no
    fencing token yet)."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


def parse_status_report(body: object) -> tuple[Resource, ReportedState, str]:
    """A worker's status report (POST /status's JSON body, or the in-process call's
    arguments as one object): `{"connector": name, "task"?: n, "state": "RUNNING" | "PAUSED" |
    "FAILED" | "STOPPED", "trace"?: text}`. Raises ValueError saying what is wrong."""
    if not isinstance(body, dict):
        raise ValueError(
            'the body must be a JSON object: {"connector": name, "task"?: n, "state": '
            '"RUNNING"|"PAUSED"|"FAILED"|"STOPPED", "trace"?: text}'
        )
    unknown = set(body) - {"connector", "task", "state", "trace"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}: only connector, task, state, trace")
    connector = body.get("connector")
    if not isinstance(connector, str) or not connector:
        raise ValueError('"connector" must be a non-empty string')
    task = body.get("task")
    if task is not None and (not isinstance(task, int) or isinstance(task, bool) or task < 0):
        raise ValueError('"task" must be a whole number >= 0 (leave it out for the connector)')
    state_text = body.get("state")
    try:
        state = ReportedState(state_text.upper() if isinstance(state_text, str) else "")
    except ValueError:
        raise ValueError(
            f'"state" must be one of RUNNING, PAUSED, FAILED, STOPPED, not {state_text!r}'
        ) from None
    if state is ReportedState.STOPPED and task is not None:
        raise ValueError("STOPPED is a connector's state only, not a task's")
    trace = body.get("trace", "")
    if trace is None:
        trace = ""
    if not isinstance(trace, str):
        raise ValueError('"trace" must be a string')
    if len(trace) > MAX_TRACE_CHARS:
        trace = trace[-MAX_TRACE_CHARS:]
    resource: Resource = connector if task is None else TaskId(connector, task)
    return resource, state, trace
