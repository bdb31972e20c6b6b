"""The agent's control-plane calls (DESIGN 3.20): it fetches the configs of what its worker holds
(ConnectGroupConfigs) and reports the worker's statuses (ConnectGroupReportStatus), on a thread
of its own (`lifecycle`), so that heartbeats and listener calls never wait for either.

- Fetch: after every join, and whenever a heartbeat, Heartbeat or SyncGroup answer carries a
  lifecycle revision other than the one the last ConnectGroupConfigs answer reflected. The
  request names the digests the agent has (`known_digests`), so an answer carries values only
  for configs that changed. The answer tells the agent (`ControlHost._configs_changed`), which
  starts the resources whose configs have come and tells the worker of changed configs.
- A grant waits for a fetch sent after it (`granted`, `lifecycle.StartGate`): resources newly
  granted start only with an answer that names them, so the restart counts their start records
  are as of the grant (a move satisfies an earlier restart; nothing is restarted twice).
- Reports: changes only (`lifecycle.StatusBook`), one call in flight, at most one per heartbeat
  interval, each entry under its resource's fencing token. An entry refused NOT_RESOURCE_OWNER
  is dropped (logged at INFO).
- THROTTLING_QUOTA_EXCEEDED: the next call of either kind waits at least the answer's
  throttle_time_ms. Other failures are retried with backoff (50 ms, doubling, up to 2 s); a
  fenced epoch waits for the next heartbeat answer, which brings the epoch to use.
- A coordinator without these calls (gRPC UNIMPLEMENTED: an older release) is logged once; the
  agent then starts work without configs and reports nothing, as before DESIGN 3.20.

Log lines name connectors, digests and states; never config values or traces.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import grpc

from connect_protocol import lifecycle_wire
from connect_protocol.errors import ErrorCode
from connect_protocol.lifecycle_messages import (
    ConfigsRequest,
    ReportedState,
    ReportStatusRequest,
    TargetState,
)
from connect_protocol.resources import EMPTY, ResourceSet
from connect_protocol.tokens import FencingTokens, Resource

from .lifecycle import (
    ConfigCache,
    ConfigChanges,
    ConnectorConfig,
    StartGate,
    StatusBook,
    WorkLedger,
    reported_state_for,
    resource_name,
)
from .transport import Backoff, Transport, TransportError

__all__ = ["CallIdentity", "ControlHost", "ControlPlane", "trace_digest"]

log = logging.getLogger("worker_agent")

#: Throttled with no throttle_time_ms (not expected): wait this long.
MIN_THROTTLE_S = 0.1
#: While the agent is not a member able to call: how often the thread looks again (an answer
#: wakes it sooner).
NOT_MEMBER_RECHECK_S = 0.5


@dataclass(frozen=True, slots=True)
class CallIdentity:
    """Who the agent calls as now: its member id, the epoch (classic: generation) to send,
    whether it is a member that may call, and its heartbeat interval (ms)."""

    member_id: str
    epoch: int
    ready: bool
    heartbeat_interval_ms: int


class ControlHost(Protocol):
    """What the control plane needs of its agent (`runtime.AgentBase`)."""

    def _lifecycle_identity(self) -> CallIdentity: ...

    def _lifecycle_keep(self) -> frozenset[str]:
        """Connectors whose configs must stay known though an answer omits them (running or
        being started: their listener calls may still need them)."""
        ...

    def _configs_changed(self, changes: ConfigChanges | None, current: bool) -> None:
        """An answer changed what the agent knows (`changes`; None: the coordinator does not
        serve configs, start everything without). `current`: no join happened since the
        request was sent (its `confirmed` may open the start gate)."""
        ...


def trace_digest(trace: str) -> str:
    """A short digest of a trace for log lines (traces may carry anything)."""
    return hashlib.sha256(trace.encode()).hexdigest()[:12]


class ControlPlane:
    """See the module docstring. Thread safe; `start` and `close` once."""

    def __init__(
        self,
        host: ControlHost,
        transport: Transport,
        group_id: str,
        rpc_timeout_s: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._host = host
        self._transport = transport
        self._group_id = group_id
        self._rpc_timeout_s = rpc_timeout_s
        self._clock = clock
        self._cond = threading.Condition()
        self.cache = ConfigCache()
        self.book = StatusBook()
        #: Restart counts acted on, target states applied, failed starts (DESIGN 3.20).
        self.ledger = WorkLedger()
        #: Connectors whose new grants wait for a fetch sent after them.
        self.gate = StartGate()
        # Guarded by _cond:
        self._sent = 0  # fetches sent (numbered 1, 2, ...: `StartGate`)
        self._joins = 0
        self._seen: int | None = None  # the revision of the latest answer
        self._seen_seq = 0  # how many revisions were seen (a fetch's answer must not undo one)
        self._fetched: tuple[int, int] | None = None  # (joins, revision) of the last fetch
        self._refetch = False
        self._fetch_not_before = 0.0
        self._report_not_before = 0.0
        self._await_member = False
        self._fetching = False
        self._unsupported = False
        self._closed = False
        #: resource -> the config digest the worker runs it with (its last assigned or
        #: reconfigured call).
        self._applied: dict[Resource, str] = {}
        self._backoff = Backoff(0.05, 2.0)
        self._thread: threading.Thread | None = None
        #: Calls made (tests and benchmarks read these).
        self.fetches = 0
        self.reports = 0
        self.throttled = 0

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lifecycle", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def supported(self) -> bool:
        """False once the coordinator has said it does not serve these calls."""
        with self._cond:
            return not self._unsupported

    # --- from the agent's answers ------------------------------------------------------------

    def saw_revision(self, revision: int) -> None:
        """A successful heartbeat, Heartbeat or SyncGroup answer carried this revision."""
        with self._cond:
            if self._seen != revision:
                self._seen = revision
                self._seen_seq += 1
            self._await_member = False
            self._cond.notify_all()

    def fetch_again(self) -> None:
        """Fetch once more even though the revision did not move (resources wait for configs
        the last answer did not bring). A fetch already due or in flight covers it."""
        with self._cond:
            if self._unsupported or self._fetch_due() or self._fetching:
                return
            self._refetch = True
            self._cond.notify_all()

    def granted(
        self, connectors: frozenset[str], ready: frozenset[str] | None
    ) -> frozenset[str] | None:
        """An answer granted resources of these `connectors` (DESIGN 3.20 "a grant records the
        count"): they start only once a fetch sent from now on is answered (one is made even if
        a fetch is in flight or the revision did not move). Returns `ready` (the machine's start
        gate) without them."""
        with self._cond:
            if self._unsupported or ready is None:
                return ready
            self.gate.granted(connectors, self._sent)
            self._refetch = True
            self._cond.notify_all()
            return self.gate.gated(ready)

    def gated(self, ready: frozenset[str] | None) -> frozenset[str] | None:
        """`ready` less the connectors whose grants wait for a fresher answer."""
        with self._cond:
            return self.gate.gated(ready)

    def joined(self) -> frozenset[str] | None:
        """The member (re)joined: fetch again before starting anything. Returns the start gate
        to set until that fetch is answered (None: no gate, the coordinator serves no
        configs)."""
        with self._cond:
            self._joins += 1
            self._await_member = False
            self._cond.notify_all()
            return None if self._unsupported else frozenset()

    # --- from the listener thread ------------------------------------------------------------

    def configs_for(self, resources: ResourceSet) -> dict[str, ConnectorConfig]:
        """The known configs of these resources' connectors."""
        with self._cond:
            return self.cache.for_resources(resources)

    def restart_counts_for(self, resources: ResourceSet) -> dict[Resource, int]:
        """The restart counts of these resources in the last answer (what a start acts on)."""
        with self._cond:
            counts = self.cache.restart_counts
            return {r: counts[r] for r in _each(resources) if r in counts}

    def started(
        self,
        resources: ResourceSet,
        configs: Mapping[str, ConnectorConfig],
        tokens: FencingTokens,
        counts: Mapping[Resource, int] | None = None,
    ) -> None:
        """The `assigned` call for these resources succeeded with `configs` and the restart
        `counts` read with them: they run with those digests, and report RUNNING (PAUSED,
        STOPPED as targeted)."""
        with self._cond:
            self._apply(resources, configs)
            self.ledger.started(resources, counts or {}, _targets(configs), ok=True)
            for resource in _each(resources):
                held = configs.get(_connector(resource))
                target = held.target_state if held is not None else TargetState.STARTED
                self._set(resource, reported_state_for(target, resource), "", tokens)
            self._cond.notify_all()

    def start_failed(
        self,
        resources: ResourceSet,
        tokens: FencingTokens,
        trace: str,
        counts: Mapping[Resource, int] | None = None,
        configs: Mapping[str, ConnectorConfig] | None = None,
    ) -> None:
        """The `assigned` call for these resources failed (made once: it runs again only on a
        restart): report FAILED with the hook's output."""
        with self._cond:
            self.ledger.started(resources, counts or {}, _targets(configs or {}), ok=False)
            for resource in _each(resources):
                self._set(resource, ReportedState.FAILED, trace, tokens)
            self._cond.notify_all()

    def restarting(self, resources: ResourceSet) -> None:
        """A restart of these resources begins: the coordinator reads them RESTARTING now, so
        whatever they report next is sent, even a state equal to the last one sent."""
        with self._cond:
            self.book.forget(resources)

    def stopped_in_place(self, resources: ResourceSet) -> None:
        """A restart stopped these and will not start them (see `WorkLedger`)."""
        with self._cond:
            self.ledger.stopped_in_place(resources)

    def not_started(self, resources: ResourceSet) -> ResourceSet:
        """Those of `resources` whose last start failed (they run nothing)."""
        with self._cond:
            return ResourceSet.of(
                [c for c in resources.connectors if self.ledger.failed(c)],
                [t for t in resources.tasks if self.ledger.failed(t)],
            )

    def due(self, running: ResourceSet) -> tuple[ResourceSet, dict[TargetState, ResourceSet]]:
        """What the last answer asks of `running`: the resources to restart, and the target
        state changes to apply (see `WorkLedger`)."""
        with self._cond:
            confirmed = self.cache.confirmed
            targets = {
                name: held.target_state
                for name in confirmed
                if (held := self.cache.get(name)) is not None
            }
            restarts = self.ledger.due_restarts(running, self.cache.restart_counts)
            return restarts, self.ledger.target_changes(running, targets)

    def target_applied(
        self, resources: ResourceSet, target: TargetState, tokens: FencingTokens
    ) -> None:
        """A `paused`, `resumed` or `stopped` call for these resources returned: report PAUSED,
        RUNNING or STOPPED."""
        with self._cond:
            self.ledger.applied(resources, target)
            for resource in _each(resources):
                self._set(resource, reported_state_for(target, resource), "", tokens)
            self._cond.notify_all()

    def reconfigured(self, resources: ResourceSet, configs: Mapping[str, ConnectorConfig]) -> None:
        """The `reconfigured` call for these resources succeeded with `configs`."""
        with self._cond:
            self._apply(resources, configs)

    def stale(self, running: ResourceSet) -> ResourceSet:
        """Those of `running` whose connector's config (as last answered) is not the one they
        run with: the `reconfigured` call to make."""
        with self._cond:
            confirmed = self.cache.confirmed
            failed = self.ledger.failed  # a failed start runs nothing to reconfigure
            connectors = [
                c
                for c in running.connectors
                if c in confirmed
                and self._applied.get(c) != self.cache.digest_of(c)
                and not failed(c)
            ]
            tasks = [
                t
                for t in running.tasks
                if t.connector in confirmed
                and self._applied.get(t) != self.cache.digest_of(t)
                and not failed(t)
            ]
        return ResourceSet.of(connectors, tasks) if connectors or tasks else EMPTY

    def stopped(self, resources: ResourceSet) -> None:
        """These resources stopped: no status to report about them any more."""
        with self._cond:
            for resource in _each(resources):
                self._applied.pop(resource, None)
            self.book.forget(resources)
            self.ledger.forget(resources)

    def report(self, resource: Resource, state: ReportedState, trace: str, token: int) -> None:
        """A worker's own report (POST /status, in-process): sent with the next report."""
        with self._cond:
            if self.book.set(resource, state, trace, token):
                self._cond.notify_all()

    def retoken(self, tokens: FencingTokens) -> None:
        """The current fencing tokens (a resource granted again is reported again)."""
        with self._cond:
            self.book.retoken(tokens)
            self._cond.notify_all()

    def cache_description(self, connectors: frozenset[str]) -> str:
        """These connectors and their digests, for a log line."""
        with self._cond:
            return self.cache.describe(connectors)

    def state_of(self, resource: Resource) -> ReportedState | None:
        """The state the agent last set for `resource` (None: none)."""
        with self._cond:
            return self.book.state_of(resource)

    # --- internals (with _cond held) -----------------------------------------------------------

    def _apply(self, resources: ResourceSet, configs: Mapping[str, ConnectorConfig]) -> None:
        for resource in _each(resources):
            held = configs.get(_connector(resource))
            if held is not None:
                self._applied[resource] = held.digest

    def _set(
        self, resource: Resource, state: ReportedState, trace: str, tokens: FencingTokens
    ) -> None:
        token = tokens.get(resource)
        if token is None:
            return  # no token (a coordinator that sends none): nothing can be reported
        self.book.set(resource, state, trace, token)

    def _fetch_due(self) -> bool:
        if self._unsupported or self._seen is None:
            return False
        return self._refetch or self._fetched != (self._joins, self._seen)

    def _next(self, now: float) -> tuple[str | None, float | None]:
        """What the thread should do now ("fetch", "report"), or how long to wait."""
        if self._closed:
            return "close", None
        if self._unsupported:
            return None, None
        if self._await_member:
            return None, NOT_MEMBER_RECHECK_S
        waits: list[float] = []
        if self._fetch_due():
            if now >= self._fetch_not_before:
                return "fetch", None
            waits.append(self._fetch_not_before - now)
        if self.book.pending():
            if now >= self._report_not_before:
                return "report", None
            waits.append(self._report_not_before - now)
        return None, (min(waits) if waits else None)

    # --- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    action, wait = self._next(self._clock())
                    if action is not None:
                        break
                    self._cond.wait(wait)
                    if self._await_member and wait == NOT_MEMBER_RECHECK_S:
                        self._await_member = False  # look again
            if action == "close":
                return
            try:
                if action == "fetch":
                    self._fetch()
                else:
                    self._report()
            except Exception:
                log.exception("the agent's %s call failed unexpectedly", action)
                with self._cond:
                    self.book.failed()
                    wait_s = self._backoff.next_wait_s()
                    self._fetch_not_before = self._clock() + wait_s
                    self._report_not_before = self._clock() + wait_s

    def _identity(self) -> CallIdentity | None:
        ident = self._host._lifecycle_identity()
        if ident.ready and ident.member_id:
            return ident
        with self._cond:
            self._await_member = True
        return None

    def _not_served(self, error: TransportError) -> bool:
        if error.code is not grpc.StatusCode.UNIMPLEMENTED:
            return False
        with self._cond:
            first = not self._unsupported
            self._unsupported = True
        if first:
            log.warning(
                "the coordinator does not serve %s (an older release): the worker starts its "
                "work without configs and its statuses are not reported",
                error.method,
            )
            self._host._configs_changed(None, True)
        return True

    def _throttled(self, throttle_time_ms: int, what: str) -> float:
        """When the next call may go after a THROTTLING_QUOTA_EXCEEDED answer."""
        self.throttled += 1
        wait_s = max(throttle_time_ms / 1000, 0.0) or MIN_THROTTLE_S
        log.info("%s throttled by the coordinator: waiting %.3f s", what, wait_s)
        return self._clock() + wait_s

    def _fetch(self) -> None:
        ident = self._identity()
        if ident is None:
            return
        with self._cond:
            joins, seq = self._joins, self._seen_seq
            request = ConfigsRequest(
                self._group_id, ident.member_id, ident.epoch, self.cache.known_digests()
            )
            self._refetch = False
            self._fetching = True
            self._sent += 1
            number = self._sent
        self.fetches += 1
        try:
            self._fetch_call(ident, request, joins, seq, number)
        finally:
            with self._cond:
                self._fetching = False

    def _fetch_call(
        self, ident: CallIdentity, request: ConfigsRequest, joins: int, seq: int, number: int
    ) -> None:
        try:
            answer = self._transport.configs(
                lifecycle_wire.configs_request_to(request), self._rpc_timeout_s()
            )
        except TransportError as error:
            if self._not_served(error):
                return
            wait_s = self._backoff.next_wait_s()
            log.warning("ConnectGroupConfigs failed: %s; retrying in %.2f s", error, wait_s)
            with self._cond:
                self._refetch = True
                self._fetch_not_before = self._clock() + wait_s
            return
        resp = lifecycle_wire.configs_response_from(answer)
        code = resp.error_code
        if code is ErrorCode.THROTTLING_QUOTA_EXCEEDED:
            at = self._throttled(resp.throttle_time_ms, "ConnectGroupConfigs")
            with self._cond:
                self._refetch = True
                self._fetch_not_before = max(at, self._fetch_not_before)
                self._report_not_before = max(at, self._report_not_before)
            return
        if code is not ErrorCode.NONE:
            wait_s = self._backoff.next_wait_s()
            level = logging.INFO if code in _EPOCH_MOVED else logging.WARNING
            log.log(
                level,
                "ConnectGroupConfigs refused, %s: %s; asking again in %.2f s",
                code.name,
                resp.error_message,
                wait_s,
            )
            with self._cond:
                self._refetch = True
                self._fetch_not_before = self._clock() + wait_s
            return
        keep = self._host._lifecycle_keep()
        with self._cond:
            changes = self.cache.apply(resp, keep)
            self.gate.answered(number)
            current = joins == self._joins
            self._fetched = (joins, resp.lifecycle_revision)
            if seq == self._seen_seq:
                self._seen = resp.lifecycle_revision
            if not changes.missing:
                self._backoff.reset()
            if changes.missing:
                # Values withheld for digests the cache has lost: ask again, without them
                # (after a backoff, in case the answer does not change).
                self._refetch = True
                self._fetch_not_before = self._clock() + self._backoff.next_wait_s()
            described = self.cache.describe(changes.confirmed)
        log.info(
            "configs at lifecycle revision %d (epoch %d): %s%s",
            resp.lifecycle_revision,
            ident.epoch,
            described,
            f"; changed: {', '.join(sorted(changes.reconfigured))}" if changes.reconfigured else "",
        )
        self._host._configs_changed(changes, current)

    def _report(self) -> None:
        ident = self._identity()
        if ident is None:
            return
        with self._cond:
            entries = self.book.take()
            if not entries:
                return
            self._report_not_before = self._clock() + ident.heartbeat_interval_ms / 1000
        request = ReportStatusRequest(self._group_id, ident.member_id, ident.epoch, entries)
        self.reports += 1
        what = ", ".join(
            f"{resource_name(e.resource)} {e.state.value}"
            + (f" (trace {trace_digest(e.trace)})" if e.trace else "")
            for e in entries[:20]
        ) + (f", ... {len(entries)} in all" if len(entries) > 20 else "")
        try:
            answer = self._transport.report_status(
                lifecycle_wire.report_request_to(request), self._rpc_timeout_s()
            )
        except TransportError as error:
            if self._not_served(error):
                with self._cond:
                    self.book.failed(drop=True)
                return
            wait_s = self._backoff.next_wait_s()
            log.warning("ConnectGroupReportStatus failed: %s; retrying in %.2f s", error, wait_s)
            with self._cond:
                self.book.failed()
                self._report_not_before = max(self._report_not_before, self._clock() + wait_s)
            return
        resp = lifecycle_wire.report_response_from(answer)
        code = resp.error_code
        if code is ErrorCode.THROTTLING_QUOTA_EXCEEDED:
            at = self._throttled(resp.throttle_time_ms, "ConnectGroupReportStatus")
            with self._cond:
                self.book.failed()
                self._report_not_before = max(at, self._report_not_before)
                self._fetch_not_before = max(at, self._fetch_not_before)
            return
        if code is ErrorCode.INVALID_REQUEST:
            log.error(
                "ConnectGroupReportStatus refused as invalid (%s); these statuses are dropped: %s",
                resp.error_message,
                what,
            )
            with self._cond:
                self.book.failed(drop=True)
            return
        if code is not ErrorCode.NONE:
            wait_s = self._backoff.next_wait_s()
            level = logging.INFO if code in _EPOCH_MOVED else logging.WARNING
            log.log(
                level,
                "ConnectGroupReportStatus refused, %s: %s; reporting again in %.2f s",
                code.name,
                resp.error_message,
                wait_s,
            )
            with self._cond:
                self.book.failed()
                self._report_not_before = max(self._report_not_before, self._clock() + wait_s)
            return
        self._backoff.reset()
        with self._cond:
            refused = self.book.answered(resp.results)
            self._cond.notify_all()
        log.info("statuses reported (epoch %d): %s", ident.epoch, what)
        for result in refused:
            log.info(
                "status of %s not counted (%s: %s); dropped",
                resource_name(result.resource),
                result.error_code.name,
                result.error_message,
            )


#: Refusals that mean the agent's epoch moved on: the next heartbeat answer brings the new one.
_EPOCH_MOVED = frozenset(
    {ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION}
)


def _targets(configs: Mapping[str, ConnectorConfig]) -> dict[str, TargetState]:
    return {name: c.target_state for name, c in configs.items()}


def _each(resources: ResourceSet) -> list[Resource]:
    return [*resources.connectors, *resources.tasks]


def _connector(resource: Resource) -> str:
    return resource if isinstance(resource, str) else resource.connector
