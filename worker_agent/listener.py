"""The worker's rebalance listener (DESIGN 2.3): events, the protocol, in-process adapters, retries.

The membership loop tells the worker what to stop and what to start through a
`WorkerRebalanceListener`. A revocation is acknowledged to the coordinator only after
`on_revoked` has returned; raising (any `Exception`) means the worker did not manage it. The loop
calls a listener through `call_with_retry`, which retries with backoff and logs every failure
loudly, so a failing or hanging listener leaves the revocation unacknowledged and the
coordinator's rebalance timeout bounds it (DESIGN 3.13).

Per-resource release (DESIGN 3.11 "Partial release"): while `on_revoked` runs, the listener may
call `event.release(...)` for resources it has already stopped. The agent acknowledges each at once
(the owned list it reports shrinks resource by resource), so their next owner may start them
before the rest of the batch has stopped. Returning from `on_revoked` still releases whatever is
left, so a listener that never calls `release` behaves exactly as before (one acknowledgement per
batch). A retry after a failure is called with the unreleased remainder only.

Fencing tokens (DESIGN 3.18): every event carries `fencing_tokens`, the token of each of its
resources (on `assigned`, the tokens to pass with every write those resources make).

Configs (DESIGN 3.20): `assigned` events carry `configs` ({connector: `ConnectorConfig`} for the
connectors of their resources, a task's config being its connector's) and their target states;
the agent calls `assigned` for a resource only once it has its connector's config. When the
config of a connector the worker runs changes, the worker gets a `reconfigured` event of the same
shape for the resources of that connector it runs (a listener's optional `on_reconfigured`; one
without it is not called). `ConnectorConfig`'s repr leaves the values out: log digests only.

Target states and restarts (DESIGN 3.20): when a held connector is paused, resumed or stopped,
the worker gets a `paused`, `resumed` or `stopped` event of the same shape (optional
`on_paused`, `on_resumed`, `on_stopped`); a restart is a `revoked` then an `assigned` event of
the resources restarted, both with `reason` "restart" (the worker keeps them). A failed
`assigned` call is made once: the resources are reported FAILED and started again only on a
restart. Other calls are retried.

Adapters: `CallbackListener` (Python callables, in-process), `CompositeListener` (several in
order), and in `worker_agent.hooks` the exec hook and the webhook, which receive
`RebalanceEvent.to_json()` (plus the hook's `release` mode).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal, Protocol, runtime_checkable

from connect_protocol.resources import ResourceSet, TaskId
from connect_protocol.tokens import NO_TOKENS, FencingTokens, Resource

from .lifecycle import ConnectorConfig, configs_json, connectors_of, target_states_json

__all__ = [
    "CONFIG_EVENTS",
    "RELEASE_MODES",
    "RESTART",
    "TARGET_STATE_EVENTS",
    "CallbackListener",
    "CompositeListener",
    "EventKind",
    "ListenerFailed",
    "RebalanceEvent",
    "ReconfigurableListener",
    "ReleaseMode",
    "Releaser",
    "WorkerRebalanceListener",
    "call_with_retry",
    "dispatch",
]

EventKind = Literal["revoked", "assigned", "reconfigured", "paused", "resumed", "stopped"]
_EVENT_KINDS: tuple[EventKind, ...] = (
    "revoked",
    "assigned",
    "reconfigured",
    "paused",
    "resumed",
    "stopped",
)
#: The target-state events (DESIGN 3.20, KIP-875): a held connector was paused, resumed or
#: stopped; each is delivered only to listeners that have its `on_<event>` method.
TARGET_STATE_EVENTS: tuple[EventKind, ...] = ("paused", "resumed", "stopped")
#: The events that carry `configs` and `target_states` (DESIGN 3.20).
CONFIG_EVENTS: frozenset[str] = frozenset({"assigned", "reconfigured", *TARGET_STATE_EVENTS})
#: The `reason` of the `revoked` and `assigned` events of a restart (DESIGN 3.20, KIP-745).
RESTART = "restart"
_NO_CONFIGS: Mapping[str, ConnectorConfig] = MappingProxyType({})

#: How an out-of-process listener (exec hook, webhook) reports a revocation done: `batch`, the
#: whole event at once when it succeeds (the default, DESIGN 2.3), or `per-resource`, each
#: resource as soon as it has stopped (see `worker_agent.hooks`).
ReleaseMode = Literal["batch", "per-resource"]
RELEASE_MODES: tuple[ReleaseMode, ...] = ("batch", "per-resource")

#: What the agent gives a revoked event: called with resources of the event that have stopped.
Releaser = Callable[[ResourceSet], None]


def _as_resource_set(items: Iterable[Resource | ResourceSet]) -> ResourceSet:
    connectors: set[str] = set()
    tasks: set[TaskId] = set()
    for item in items:
        if isinstance(item, ResourceSet):
            connectors.update(item.connectors)
            tasks.update(item.tasks)
        elif isinstance(item, TaskId):
            tasks.add(item)
        elif isinstance(item, str):
            connectors.add(item)
        else:
            raise TypeError(
                f"release() takes connector names, TaskIds or ResourceSets, not {item!r}"
            )
    return ResourceSet(frozenset(connectors), frozenset(tasks))


@dataclass(frozen=True)
class RebalanceEvent:
    """One listener call: what the worker must stop (`revoked`), may start (`assigned`), or
    must run with a new config (`reconfigured`).

    Attributes:
        event: `"revoked"` (stop these, then return), `"assigned"` (start these) or
            `"reconfigured"` (the config of these resources' connectors changed: apply it).
        group_id: the group.
        member_id: this worker's member id.
        member_epoch: for `revoked`, the epoch the member holds while it gives them up; for
            `assigned`, the epoch at which it received them.
        connectors: the connectors concerned (sorted when built by `from_resources`).
        tasks: the tasks concerned (sorted when built by `from_resources`).
        fencing_tokens: the fencing token of each resource concerned (DESIGN 3.18): for
            `assigned`, the tokens to pass with every write these resources make to a system
            that checks them; for `revoked`, the tokens they ran under. Empty when the
            coordinator sent none.
        configs: on `assigned` and `reconfigured`, the config of each connector of the
            event's resources (DESIGN 3.20): its digest, values and target state. Empty on
            `revoked`.
        releaser: set by the agent on `revoked` events; `release` calls it. Not part of the
            event's value (ignored by `==` and `repr`).
        reason: why, when not the assignment: `"restart"` on the `revoked` and `assigned`
            events of a restart (DESIGN 3.20: the worker keeps the resources; it stops and starts
            them in place). Empty otherwise.
    """

    event: EventKind
    group_id: str
    member_id: str
    member_epoch: int
    connectors: tuple[str, ...] = ()
    tasks: tuple[TaskId, ...] = ()
    fencing_tokens: FencingTokens = NO_TOKENS
    configs: Mapping[str, ConnectorConfig] = field(default_factory=lambda: _NO_CONFIGS)
    releaser: Releaser | None = field(default=None, compare=False, repr=False)
    reason: str = ""

    def __post_init__(self) -> None:
        if self.event not in _EVENT_KINDS:
            raise ValueError(f"event must be one of {_EVENT_KINDS}, not {self.event!r}")

    @classmethod
    def from_resources(
        cls,
        event: EventKind,
        resources: ResourceSet,
        *,
        group_id: str,
        member_id: str,
        member_epoch: int,
        fencing_tokens: FencingTokens = NO_TOKENS,
        releaser: Releaser | None = None,
        configs: Mapping[str, ConnectorConfig] = _NO_CONFIGS,
        reason: str = "",
    ) -> RebalanceEvent:
        """The event for `resources`, connectors and tasks sorted, with the tokens of those
        resources among `fencing_tokens` and the configs of their connectors among `configs`
        (kept on `assigned` and `reconfigured` events only)."""
        return cls(
            event=event,
            group_id=group_id,
            member_id=member_id,
            member_epoch=member_epoch,
            connectors=tuple(resources.sorted_connectors()),
            tasks=tuple(resources.sorted_tasks()),
            fencing_tokens=fencing_tokens.restricted(resources) if fencing_tokens else NO_TOKENS,
            configs=_configs_of(event, resources, configs),
            releaser=releaser,
            reason=reason,
        )

    @property
    def resources(self) -> ResourceSet:
        """The connectors and tasks concerned, as a `ResourceSet`."""
        return ResourceSet.of(self.connectors, self.tasks)

    def release(self, *resources: Resource | ResourceSet) -> None:
        """On a `revoked` event: these of the event's resources have stopped, acknowledge them
        now rather than when `on_revoked` returns (DESIGN 3.11, partial release).

        Call it only once a resource has really stopped: the coordinator may give it to its
        next owner at once. Takes connector names, `TaskId`s and `ResourceSet`s; releasing a
        resource twice is harmless, and so is calling it from another thread while `on_revoked`
        runs. Calls after `on_revoked` has returned are ignored (the whole batch is released by
        then). On an event the agent did not build (e.g. in a test) it only checks its
        arguments.

        Raises:
            ValueError: on an `assigned` event, or for a resource this event does not revoke
                (acknowledging work the listener was not asked to stop would be a lie).
        """
        if self.event != "revoked":
            raise ValueError("release() is for revoked events only")
        released = _as_resource_set(resources)
        outside = released - self.resources
        if outside:
            raise ValueError(
                f"release() of resources this event does not revoke: {outside.describe()}"
            )
        if released and self.releaser is not None:
            self.releaser(released)

    def only(self, resources: ResourceSet) -> RebalanceEvent:
        """The same event for those of its resources in `resources` (tokens likewise), with the
        same releaser: e.g. one webhook call per resource."""
        kept = self.resources & resources
        return replace(
            self,
            connectors=tuple(kept.sorted_connectors()),
            tasks=tuple(kept.sorted_tasks()),
            fencing_tokens=self.fencing_tokens.restricted(kept)
            if self.fencing_tokens
            else NO_TOKENS,
            configs=_configs_of(self.event, kept, self.configs),
        )

    def without_releaser(self) -> RebalanceEvent:
        """The same event whose `release` acknowledges nothing early."""
        return self if self.releaser is None else replace(self, releaser=None)

    def to_json(self, *, config_values: bool = True) -> dict[str, object]:
        """DESIGN 2.3's object, what exec hooks and webhooks receive; lists sorted. Extended
        (never changed) by later decisions: `fencing_tokens` (DESIGN 3.18), shaped
        `{"connectors": {name: token}, "tasks": [{"connector", "task", "token"}]}`; on
        `assigned` and `reconfigured` events `configs` ({connector: {"digest", "config"}}) and
        `target_states` ({connector: "STARTED"|"PAUSED"|"STOPPED"}) (DESIGN 3.20). With
        `config_values` False the configs carry their digests only (a webhook that is neither
        loopback nor https, a log line)."""
        out: dict[str, object] = {
            "event": self.event,
            "group_id": self.group_id,
            "member_id": self.member_id,
            "member_epoch": self.member_epoch,
            "connectors": sorted(self.connectors),
            "tasks": [{"connector": t.connector, "task": t.task} for t in sorted(self.tasks)],
            "fencing_tokens": self.fencing_tokens.to_json(),
        }
        if self.event in CONFIG_EVENTS:
            out["configs"] = configs_json(self.configs, values=config_values)
            out["target_states"] = target_states_json(self.configs)
        if self.reason:
            out["reason"] = self.reason
        return out


def _configs_of(
    event: str, resources: ResourceSet, configs: Mapping[str, ConnectorConfig]
) -> Mapping[str, ConnectorConfig]:
    """The configs an event of kind `event` about `resources` carries."""
    if event not in CONFIG_EVENTS or not configs:
        return _NO_CONFIGS
    names = connectors_of(resources)
    return MappingProxyType({n: c for n, c in configs.items() if n in names})


@runtime_checkable
class WorkerRebalanceListener(Protocol):
    """What the worker does when its assignment changes. Raising means failure.

    Both methods may be called again with the same event after a failure (retries), so they
    must be idempotent: stopping something already stopped, or starting something already
    running, must succeed.
    """

    def on_revoked(self, event: RebalanceEvent) -> None:
        """Stop running `event`'s connectors and tasks; return only once they have stopped.

        May call `event.release(...)` for each resource as soon as it has stopped (optional).
        """

    def on_assigned(self, event: RebalanceEvent) -> None:
        """Start running `event`'s connectors and tasks, with `event.configs`."""


@runtime_checkable
class ReconfigurableListener(Protocol):
    """A listener that also applies config changes (DESIGN 3.20). Optional: the agent calls
    `on_reconfigured` only on listeners that have it."""

    def on_reconfigured(self, event: RebalanceEvent) -> None:
        """The config of `event`'s resources' connectors changed (`event.configs`): apply it.
        Called again with the same event after a failure, so it must be idempotent."""


class ListenerFailed(Exception):
    """A listener did not do what it was asked (the hook failed, the webhook answered non-2xx).

    Attributes:
        exit_code: the exec hook's exit status (negative: killed by that signal), if it exited.
        status: the webhook's HTTP status, if it answered.
        timed_out: the hook or webhook did not finish within its timeout.
        stderr_tail: the end of the exec hook's standard error.
    """

    def __init__(
        self,
        message: str,
        *,
        exit_code: int | None = None,
        status: int | None = None,
        timed_out: bool = False,
        stderr_tail: str = "",
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.status = status
        self.timed_out = timed_out
        self.stderr_tail = stderr_tail


def dispatch(listener: WorkerRebalanceListener, event: RebalanceEvent) -> None:
    """Call `listener.on_revoked`, `on_assigned`, or the optional `on_reconfigured`,
    `on_paused`, `on_resumed` or `on_stopped`, whichever `event.event` names (a listener
    without an optional method is not called for its event)."""
    if event.event == "revoked":
        listener.on_revoked(event)
    elif event.event == "assigned":
        listener.on_assigned(event)
    else:
        optional = getattr(listener, f"on_{event.event}", None)
        if optional is not None:
            optional(event)


EventCallback = Callable[[RebalanceEvent], None]


class CallbackListener:
    """The in-process adapter: calls the given Python callables (a missing one does nothing)."""

    def __init__(
        self,
        on_revoked: EventCallback | None = None,
        on_assigned: EventCallback | None = None,
        on_reconfigured: EventCallback | None = None,
        on_paused: EventCallback | None = None,
        on_resumed: EventCallback | None = None,
        on_stopped: EventCallback | None = None,
    ) -> None:
        self._on_revoked = on_revoked
        self._on_assigned = on_assigned
        self._on_reconfigured = on_reconfigured
        self._on_target = {"paused": on_paused, "resumed": on_resumed, "stopped": on_stopped}

    def _target(self, event: RebalanceEvent) -> None:
        callback = self._on_target.get(event.event)
        if callback is not None:
            callback(event)

    on_paused = on_resumed = on_stopped = _target

    def on_revoked(self, event: RebalanceEvent) -> None:
        if self._on_revoked is not None:
            self._on_revoked(event)

    def on_assigned(self, event: RebalanceEvent) -> None:
        if self._on_assigned is not None:
            self._on_assigned(event)

    def on_reconfigured(self, event: RebalanceEvent) -> None:
        if self._on_reconfigured is not None:
            self._on_reconfigured(event)


class CompositeListener:
    """Several listeners, called in the given order for both events.

    The first failure propagates and the rest are not called; a retry calls them all again from
    the first (they are idempotent, see `WorkerRebalanceListener`).

    A resource has stopped only once every listener has stopped it, so only the last listener's
    `event.release` calls take effect (every earlier one has returned by then); the others get
    the event without its releaser.
    """

    def __init__(self, listeners: Iterable[WorkerRebalanceListener]) -> None:
        self.listeners: tuple[WorkerRebalanceListener, ...] = tuple(listeners)

    def on_revoked(self, event: RebalanceEvent) -> None:
        last = len(self.listeners) - 1
        for i, listener in enumerate(self.listeners):
            listener.on_revoked(event if i == last else event.without_releaser())

    def on_assigned(self, event: RebalanceEvent) -> None:
        for listener in self.listeners:
            listener.on_assigned(event)

    def on_reconfigured(self, event: RebalanceEvent) -> None:
        for listener in self.listeners:
            dispatch(listener, event)

    on_paused = on_resumed = on_stopped = on_reconfigured


def call_with_retry(
    call: Callable[[], None],
    *,
    what: str,
    stop: threading.Event,
    initial_backoff_s: float = 0.1,
    max_backoff_s: float = 5.0,
    jitter: float = 0.0,
    log: logging.Logger | logging.LoggerAdapter[logging.Logger],
) -> bool:
    """Call `call` until it returns, waiting with exponential backoff between failures.

    The first attempt is always made; `stop` only ends the retrying, and a backoff wait ends as
    soon as it is set. Every failure (any `Exception`) is logged at ERROR with `what` and the
    attempt number; a success after failures at WARNING. Log records carry `what`, `attempt` and
    `retry_in_s` (None when not retrying) as attributes.

    Args:
        call: the action; raising means it failed.
        what: names the action in log lines, e.g. ``"on_revoked (epoch 7, 3 resources)"``.
        stop: when set, give up instead of retrying.
        initial_backoff_s: the wait after the first failure; doubled after each further one.
        max_backoff_s: the cap on the wait.
        jitter: a fraction in [0, 1]; each wait is shortened by a random part of it of up to
            that fraction (0, the default, is deterministic).
        log: where failures are reported.

    Returns:
        True once `call` has succeeded; False if `stop` was set before it did.
    """
    if initial_backoff_s <= 0 or max_backoff_s < initial_backoff_s:
        raise ValueError("need 0 < initial_backoff_s <= max_backoff_s")
    if not 0.0 <= jitter <= 1.0:
        raise ValueError("jitter must be in [0, 1]")
    backoff = initial_backoff_s
    attempt = 0
    while True:
        attempt += 1
        try:
            call()
        except Exception as exc:
            giving_up = stop.is_set()
            wait_s = None if giving_up else backoff * (1.0 - jitter * random.random())
            # A ListenerFailed says what went wrong; anything else is a bug in the listener,
            # so its traceback is worth the noise.
            exc_info = not isinstance(exc, ListenerFailed)
            extra = {"what": what, "attempt": attempt, "retry_in_s": wait_s}
            if wait_s is None:
                log.error(
                    "%s failed (attempt %d): %s; stop requested, giving up",
                    what,
                    attempt,
                    exc,
                    exc_info=exc_info,
                    extra=extra,
                )
                return False
            log.error(
                "%s failed (attempt %d): %s; retrying in %.2f s",
                what,
                attempt,
                exc,
                wait_s,
                exc_info=exc_info,
                extra=extra,
            )
            if stop.wait(wait_s):
                log.error(
                    "%s: stop requested after %d failed attempts, giving up",
                    what,
                    attempt,
                    extra={"what": what, "attempt": attempt, "retry_in_s": None},
                )
                return False
            backoff = min(backoff * 2, max_backoff_s)
            continue
        if attempt > 1:
            log.warning(
                "%s succeeded on attempt %d",
                what,
                attempt,
                extra={"what": what, "attempt": attempt, "retry_in_s": None},
            )
        return True
