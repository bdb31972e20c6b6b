"""In-process classic workers for tests and benchmarks (DESIGN 3.19, "Connect today"): real
`ClassicAgent`s on threads, talking gRPC to a real coordinator on 127.0.0.1, each with a
recording listener, and what the tests conclude from the records. For online migration
(DESIGN 3.19 "Upgrade", "Downgrade") a fleet also starts connect-protocol `Agent`s with the
same listener (`start(label, group_protocol="connect")`), so one group can change protocol
worker by worker.

- `KillableTransport`: the agent's real transport, which also logs every classic answer with its
  time (`answers`), and which `kill()` (or a `kill_when` predicate on an answer) turns into a dead
  worker: every later call fails UNAVAILABLE at once, as for a SIGKILLed process. The answer that
  triggers `kill_when` is never seen by the agent.
- `ClassicFleet`: a group, its workers (labels W1, W2, ...; classic member ids come from the
  coordinator, a connect worker's is its incarnation, e.g. `W1-5`), start / leave (graceful:
  revoke, then LeaveGroup or the leave heartbeat) / kill, the admin calls, and `wait_stable`
  (whichever type the group is now) and `wait_quiet` (stable for a while). A worker's records
  end at its kill (`tests.support.agents.intervals_of`'s `killed_at`): what it would have run
  afterwards died with it.
- Every fleet ends with `check_no_overlap(fleet.intervals())` (no resource on two workers).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from connect.group.v1 import admin_pb2

from connect_protocol import classic_wire
from connect_protocol.classic_messages import JoinGroupResponse, SyncGroupResponse
from connect_protocol.limits import DEFAULT_MAX_MESSAGE_BYTES
from connect_protocol.tls import ClientTls
from tests.support.agents import (
    HookRecord,
    Interval,
    catalogue_resources,
    check_no_overlap,
    intervals_of,
    wait_for,
)
from tests.support.client import describe
from tests.support.coordinator import CoordinatorProcess, Stubs
from tests.support.pgcluster import create_database, drop_database
from worker_agent.assignors import assignors_for_protocol
from worker_agent.classic.membership import ClassicPhase
from worker_agent.classic.runtime import ClassicAgent
from worker_agent.listener import CallbackListener, ListenerFailed, RebalanceEvent
from worker_agent.runtime import Agent, AgentSettings
from worker_agent.transport import Transport, TransportError

__all__ = [
    "Answer",
    "ClassicFleet",
    "ClassicWorker",
    "KillableTransport",
    "check_no_overlap",
    "classic_coordinator",
]


@dataclass(frozen=True)
class Answer:
    """A classic answer the transport received (before the agent saw it)."""

    at: float  # time.monotonic()
    kind: str  # "join" | "sync"
    message: JoinGroupResponse | SyncGroupResponse


class KillableTransport(Transport):
    """`Transport` that logs classic answers and can die (see the module docstring). Built from
    the same arguments as `Transport`, or from one (`KillableTransport(inner)`: the inner one's
    addresses and settings; it is closed)."""

    def __init__(
        self,
        addresses: Transport | Sequence[str],
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tls: ClientTls | None = None,
        allow_plaintext: bool = False,
    ) -> None:
        if isinstance(addresses, Transport):
            inner = addresses
            addresses = inner._addresses
            max_message_bytes = inner._max_message_bytes
            tls, allow_plaintext = inner._tls, inner._allow_plaintext
            inner.close()
        super().__init__(addresses, max_message_bytes, tls, allow_plaintext)
        self.answers: list[Answer] = []
        self.killed_at: float | None = None
        self._kill_when: Callable[[Answer], bool] | None = None
        self._guard = threading.Lock()

    def kill(self) -> float:
        """From now on every call fails at once. Returns the kill time (time.monotonic())."""
        with self._guard:
            if self.killed_at is None:
                self.killed_at = time.monotonic()
            return self.killed_at

    def kill_when(self, predicate: Callable[[Answer], bool]) -> None:
        """Die on receiving the first answer for which `predicate` holds (the agent never sees
        it)."""
        self._kill_when = predicate

    @property
    def dead(self) -> bool:
        return self.killed_at is not None

    def _dead_error(self, rpc: str) -> TransportError:
        return TransportError(rpc, grpc.StatusCode.UNAVAILABLE, "the worker was killed")

    def _call(
        self, rpc: str, method: Callable[[Any], Callable[..., Any]], request: Any, timeout_s: float
    ) -> Any:
        if self.dead:
            raise self._dead_error(rpc)
        answer = super()._call(rpc, method, request, timeout_s)
        decoded: JoinGroupResponse | SyncGroupResponse | None = None
        if rpc == "JoinGroup":
            decoded = classic_wire.join_response_from_wire(answer)
            kind = "join"
        elif rpc == "SyncGroup":
            decoded = classic_wire.sync_response_from_wire(answer)
            kind = "sync"
        if decoded is not None:
            seen = Answer(time.monotonic(), kind, decoded)
            with self._guard:
                self.answers.append(seen)
            predicate = self._kill_when
            if predicate is not None and predicate(seen):
                self.kill()
        if self.dead:
            raise self._dead_error(rpc)
        return answer

    def find_coordinator(
        self, group_id: str, reason: str, timeout_s: Callable[[], float]
    ) -> str | None:
        if self.dead:
            return None
        return super().find_coordinator(group_id, reason, timeout_s)

    def sync_answers(self) -> list[SyncGroupResponse]:
        with self._guard:
            return [a.message for a in self.answers if isinstance(a.message, SyncGroupResponse)]

    def join_answers(self) -> list[JoinGroupResponse]:
        with self._guard:
            return [a.message for a in self.answers if isinstance(a.message, JoinGroupResponse)]


def _names(event: RebalanceEvent) -> frozenset[str]:
    return frozenset(event.connectors) | {str(t) for t in event.tasks}


@dataclass(eq=False)
class ClassicWorker:
    """One incarnation of a worker: its agent (a `ClassicAgent`, or a connect-protocol `Agent`:
    `group_protocol`), thread, transport and listener records."""

    label: str
    incarnation: str
    agent: ClassicAgent | Agent
    transport: KillableTransport
    thread: threading.Thread
    records: list[HookRecord] = field(default_factory=list)
    #: Per-event extra time the listener takes (revoked, assigned), in seconds; `slow_once`:
    #: for the next such call only.
    slow: dict[str, float] = field(default_factory=dict)
    slow_once: dict[str, float] = field(default_factory=dict)
    #: Connector -> why: an `assigned` call with a resource of it fails (`ListenerFailed`, as a
    #: failing exec hook would, with the reason as its standard error) while it is listed.
    fail_start: dict[str, str] = field(default_factory=dict)

    @property
    def member_id(self) -> str:
        return self.agent.member_id

    @property
    def killed_at(self) -> float | None:
        return self.transport.killed_at

    @property
    def group_protocol(self) -> str:
        """The protocol this incarnation speaks: "classic" or "connect"."""
        return "classic" if isinstance(self.agent, ClassicAgent) else "connect"

    @property
    def epoch(self) -> int:
        """Its generation (classic) or member epoch (connect), as the agent knows it."""
        return self.agent.member_epoch

    def running(self) -> set[str]:
        return set(self.agent.running.names())

    def settled(self) -> bool:
        """Nothing pending, running exactly what it was assigned: classic, STABLE with no rejoin
        due and no leader's delay running; connect, a member whose last heartbeat was answered,
        running its assignment, nothing being started or stopped (an eager restart included)."""
        agent = self.agent
        if isinstance(agent, ClassicAgent):
            c = agent.machine
            with agent._lock:
                return (
                    c.phase is ClassicPhase.STABLE
                    and not c.rebalancing
                    and c.scheduled_rebalance_ms is None
                    and c.snapshot is not None
                    and c.running == c.snapshot
                )
        m = agent.machine
        with agent._lock:
            return (
                m.ready
                and m.running == m.assigned
                and m.owned == m.running
                # No public accessor; the rebalance benchmark reads it too.
                and not m._eager_restart
            )

    def intervals(self) -> tuple[list[Interval], list[str]]:
        return intervals_of(list(self.records), self.incarnation, self.label, self.killed_at)


class ClassicFleet:
    """A classic group on one coordinator and its in-process workers."""

    def __init__(
        self,
        coordinator: str,
        group: str,
        *,
        protocol: str = "sessioned",
        session_timeout_ms: int = 1_000,
        heartbeat_interval_ms: int = 100,
        rebalance_timeout_ms: int = 2_000,
        rpc_timeout_s: float = 5.0,
    ) -> None:
        self.coordinator = coordinator
        self.group = group
        self.protocol = protocol
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.rpc_timeout_s = rpc_timeout_s
        self.stubs = Stubs(coordinator)
        self.workers: list[ClassicWorker] = []  # every incarnation, in start order
        self._seq = itertools.count(1)
        self.t0 = time.monotonic()

    def close(self) -> None:
        """Stop every worker still running (revoke, then leave; killed if it takes long)."""
        for w in self.workers:
            w.agent.stop()
        for w in self.workers:
            w.thread.join(3)
        for w in self.workers:
            if w.thread.is_alive():
                w.transport.kill()
                w.agent.abandon()
                w.thread.join(10)
        self.stubs.close()

    def __enter__(self) -> ClassicFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- workers -----------------------------------------------------------------------------

    def start(
        self,
        label: str,
        group_protocol: str = "classic",
        coordinator: str | None = None,
        **overrides: Any,
    ) -> ClassicWorker:
        """Start a new incarnation of worker `label` (a new member: classic has no static
        membership, and a connect incarnation's member id is its own, e.g. `W1-5`).
        `group_protocol`: "classic" (a `ClassicAgent`) or "connect" (an `Agent` advertising
        `assignors_for_protocol(protocol)`, eager if the protocol is). `coordinator`: the
        address it calls (default the fleet's; e.g. a TCP proxy's). `overrides`: AgentSettings
        fields (e.g. protocol). Its listener records `reconfigured`, `paused`, `resumed` and
        `stopped` events too, with their configs, and each event's reason (DESIGN 3.20)."""
        n = next(self._seq)
        incarnation = f"{label}#{n}"
        protocol = overrides.pop("protocol", self.protocol)
        if group_protocol == "connect":
            member_id = f"{label}-{n}"
            assignors = tuple(assignors_for_protocol(protocol))
            overrides.setdefault("eager", protocol == "eager")
        elif group_protocol == "classic":
            member_id, assignors = label, ()
        else:
            raise ValueError(f"unknown group protocol {group_protocol!r}")
        address = coordinator or self.coordinator
        settings = AgentSettings(
            group_id=self.group,
            member_id=member_id,
            coordinators=(address,),
            assignors=assignors,
            group_protocol=group_protocol,
            protocol=protocol,
            session_timeout_ms=overrides.pop("session_timeout_ms", self.session_timeout_ms),
            heartbeat_interval_ms=overrides.pop(
                "heartbeat_interval_ms", self.heartbeat_interval_ms
            ),
            rebalance_timeout_ms=overrides.pop("rebalance_timeout_ms", self.rebalance_timeout_ms),
            rpc_timeout_s=self.rpc_timeout_s,
            url=f"http://{label.lower()}:8083",
            listener_initial_backoff_s=0.02,
            leave_timeout_s=2.0,
            **overrides,
        )
        transport = KillableTransport((address,), settings.max_message_bytes)
        holder: dict[str, ClassicWorker] = {}

        def record(kind: str) -> Callable[[RebalanceEvent], None]:
            def call(event: RebalanceEvent) -> None:
                worker = holder["w"]
                if worker.transport.dead:
                    return  # a killed process runs no listener: its records end at the kill
                t_start = time.monotonic()
                if kind == "assigned":
                    held = set(event.connectors) | {t.connector for t in event.tasks}
                    failing = sorted(held & set(worker.fail_start))
                    if failing:
                        why = "; ".join(
                            f"cannot start {c}: {worker.fail_start[c]}" for c in failing
                        )
                        raise ListenerFailed(
                            f"{label}'s start of {', '.join(failing)} failed; stderr: {why}",
                            exit_code=1,
                            stderr_tail=why,
                        )
                extra = worker.slow_once.pop(kind, 0.0) or worker.slow.get(kind, 0.0)
                if extra:
                    time.sleep(extra)
                worker.records.append(
                    HookRecord(
                        worker=label,
                        event=kind,
                        member_epoch=event.member_epoch,
                        resources=_names(event),
                        t_start=t_start,
                        t_end=time.monotonic(),
                        incarnation=incarnation,
                        configs=(
                            event.to_json()["configs"]  # type: ignore[arg-type]
                            if kind != "revoked"
                            else None
                        ),
                        reason=event.reason,
                    )
                )

            return call

        listener = CallbackListener(
            on_revoked=record("revoked"),
            on_assigned=record("assigned"),
            on_reconfigured=record("reconfigured"),
            on_paused=record("paused"),
            on_resumed=record("resumed"),
            on_stopped=record("stopped"),
        )
        kind = ClassicAgent if group_protocol == "classic" else Agent
        agent = kind(settings, listener, transport=transport)
        thread = threading.Thread(
            target=agent.run, name=f"{group_protocol}-{incarnation}", daemon=True
        )
        worker = ClassicWorker(label, incarnation, agent, transport, thread)
        holder["w"] = worker
        self.workers.append(worker)
        thread.start()
        return worker

    def live(self) -> list[ClassicWorker]:
        return [w for w in self.workers if not w.agent.left and not w.transport.dead]

    def worker(self, label: str) -> ClassicWorker:
        """The latest incarnation of `label`."""
        return [w for w in self.workers if w.label == label][-1]

    def leave(self, worker: ClassicWorker, timeout_s: float = 10.0) -> None:
        """Graceful stop: revoke everything, then LeaveGroup or the leave heartbeat (a worker's
        SIGTERM)."""
        assert worker.agent.leave(timeout_s), f"{worker.incarnation} did not leave in time"
        worker.thread.join(timeout_s)

    def kill(self, worker: ClassicWorker) -> float:
        """SIGKILL: no revocation, no leave; its records end now."""
        at = worker.transport.kill()
        worker.agent.abandon()
        return at

    # --- admin -------------------------------------------------------------------------------

    def put_connector(self, name: str, tasks: int, config: Mapping[str, str] | None = None) -> None:
        resp = self.stubs.admin.PutConnector(
            admin_pb2.PutConnectorRequest(
                group_id=self.group, connector=name, task_count=tasks, config=config or {}
            ),
            timeout=10,
        )
        assert resp.error_code == 0, resp

    def alter_configs(self, configs: Mapping[str, int | str]) -> None:
        resp = self.stubs.admin.AlterGroupConfigs(
            admin_pb2.AlterGroupConfigsRequest(
                group_id=self.group, set={k: str(v) for k, v in configs.items()}
            ),
            timeout=10,
        )
        assert resp.error_code == 0, resp

    def describe(self) -> Any:
        group = describe(self.stubs, self.group)
        assert group.error_code == 0, group
        return group

    def leader_id(self) -> str:
        return str(self.describe().classic.leader_id)

    def by_member_id(self, member_id: str) -> ClassicWorker:
        return next(w for w in self.live() if w.member_id == member_id)

    # --- checks ------------------------------------------------------------------------------

    def intervals(self) -> list[Interval]:
        out: list[Interval] = []
        problems: list[str] = []
        for w in self.workers:
            got, bad = w.intervals()
            out += got
            problems += bad
        assert not problems, "inconsistent listener records:\n" + "\n".join(problems)
        return out

    def assert_no_overlap(self) -> None:
        problems = check_no_overlap(self.intervals())
        assert not problems, "a resource ran on two workers at once:\n" + "\n".join(problems)

    def catalogue(self, group: Any | None = None) -> set[str]:
        return catalogue_resources(group if group is not None else self.describe())

    def stable(self) -> Any | None:
        """DescribeGroups if the group is quiet, else None. Classic: STABLE; connect: STABLE at
        the assignment epoch = the group epoch with no scheduled rebalance, every member at that
        epoch, STABLE, its current assignment its target. Both: every live worker a member,
        settled, at the epoch (generation) DescribeGroups shows for it, nothing pending
        revocation, running what DescribeGroups says it holds (a classic member of a classic
        group: synced at the group's generation; a member of a connect group: at the assignment
        epoch); every catalogue resource run by exactly one live worker."""
        group = self.describe()
        if group.group_type == "classic":
            if group.classic.state != "STABLE":
                return None
        elif (
            group.state != "STABLE"
            or group.group_epoch != group.assignment_epoch
            or group.HasField("scheduled_rebalance_at_ms")
        ):
            return None
        live = self.live()
        if not live or not all(w.settled() for w in live):
            return None
        members = {m.member_id: m for m in group.members}
        if set(members) != {w.member_id for w in live}:
            return None
        held: dict[str, str] = {}
        for w in live:
            m = members[w.member_id]
            pending = m.pending_revocation
            if pending.connectors or pending.tasks:
                return None
            if group.group_type == "classic":
                if not m.classic.synced or w.epoch != group.classic.generation_id:
                    return None
            elif (
                m.member_epoch != group.assignment_epoch
                or w.epoch != m.member_epoch
                or m.state != "STABLE"
            ):
                return None
            current = _described(m.current_assignment)
            if group.group_type != "classic" and current != _described(m.target_assignment):
                return None
            if current != w.running():
                return None
            for r in current:
                if r in held:
                    return None
                held[r] = w.label
        if set(held) != self.catalogue(group):
            return None
        return group

    def wait_stable(self, timeout_s: float = 15.0) -> Any:
        return wait_for(
            f"group {self.group} stable", self.stable, timeout_s, diagnostics=self.diagnostics
        )

    def wait_quiet(self, hold_s: float | None = None, timeout_s: float = 15.0) -> Any:
        """Wait until `stable()` has held for `hold_s` (default: a heartbeat interval) with the
        same group type, epoch (generation) and members throughout; the last DescribeGroups."""
        hold = self.heartbeat_interval_ms / 1000 if hold_s is None else hold_s
        since: list[Any] = []  # [first time seen, its signature]

        def probe() -> Any | None:
            group = self.stable()
            if group is None:
                since.clear()
                return None
            key = (
                group.group_type,
                group.group_epoch,
                group.classic.generation_id,
                frozenset(m.member_id for m in group.members),
            )
            now = time.monotonic()
            if not since or since[1] != key:
                since[:] = [now, key]
            return group if now - since[0] >= hold else None

        return wait_for(
            f"group {self.group} quiet for {hold:g} s",
            probe,
            timeout_s,
            interval_s=0.02,
            diagnostics=self.diagnostics,
        )

    def orphans(self) -> set[str]:
        """Resources a live worker runs that no member holds at the coordinator."""
        group = self.describe()
        held: set[str] = set()
        for m in group.members:
            held |= set(m.current_assignment.connectors)
            held |= {f"{t.connector}-{t.task}" for t in m.current_assignment.tasks}
        return set().union(*(w.running() for w in self.live())) - held

    def shares(self) -> dict[str, set[str]]:
        """label -> what its live incarnation runs."""
        return {w.label: w.running() for w in self.live()}

    def diagnostics(self) -> str:
        lines = []
        with contextlib.suppress(Exception):
            g = self.describe()
            if g.group_type == "classic":
                lines.append(
                    f"classic {g.classic.state} gen {g.classic.generation_id} "
                    f"leader {g.classic.leader_id} protocol {g.classic.protocol_name}"
                )
            else:
                lines.append(
                    f"connect {g.state} epoch {g.group_epoch} assignment epoch "
                    f"{g.assignment_epoch} assignor member {g.assignor_member_id!r} "
                    f"{g.assignor_unavailable_reason!r}"
                    + (
                        f" scheduled rebalance at {g.scheduled_rebalance_at_ms}"
                        f" (now {g.coordinator_time_ms})"
                        if g.HasField("scheduled_rebalance_at_ms")
                        else ""
                    )
                )
            for m in g.members:
                lines.append(
                    f"  {m.member_id} ({m.group_protocol}): epoch {m.member_epoch} {m.state} "
                    f"synced={m.classic.synced} "
                    f"current={_short(_described(m.current_assignment))} "
                    f"pending={_short(_described(m.pending_revocation))} "
                    f"target={_short(_described(m.target_assignment))}"
                )
        for w in self.workers:
            lines.append(
                f"{w.incarnation} ({w.member_id or '-'}, {w.group_protocol}): "
                f"{w.agent.phase.value} epoch {w.epoch} settled={w.settled()} "
                f"running {_short(w.running())} dead={w.transport.dead} left={w.agent.left}"
            )
        return "\n".join(lines)


def _described(resources: Any) -> set[str]:
    """A DescribeGroups `ConnectorsAndTasks` as resource names ("A", "A-0")."""
    return set(resources.connectors) | {f"{t.connector}-{t.task}" for t in resources.tasks}


def _short(resources: set[str], limit: int = 12) -> str:
    """Resource names for a diagnostic line: a count, and the first few."""
    names = sorted(resources)
    more = f" +{len(names) - limit}" if len(names) > limit else ""
    return f"{len(names)}{names[:limit]}{more}"


@contextlib.contextmanager
def classic_coordinator(
    postgres_admin_url: str, log_dir: Path, delay_ms: int, extra: Sequence[str] = ()
) -> Iterator[CoordinatorProcess]:
    """`coordinator-svc serve` on a database of its own, for classic workers with scaled-down
    timeouts: sessions down to 100 ms allowed, a 50 ms initial join-phase delay, and
    `scheduled.rebalance.max.delay.ms` = `delay_ms` for new groups; `extra`: more flags (later
    ones win, e.g. `--session-timeout-ms` for connect-protocol members)."""
    name = f"t_{uuid.uuid4().hex}"
    url = create_database(postgres_admin_url, name)
    flags = (
        "--classic-min-session-timeout-ms",
        "100",
        "--classic-initial-rebalance-delay-ms",
        "50",
        "--scheduled-rebalance-max-delay-ms",
        str(delay_ms),
        *extra,
    )
    proc = CoordinatorProcess(url, *flags, log_path=log_dir / "coordinator.log")
    try:
        proc.start()
        yield proc
    finally:
        proc.close()
        drop_database(postgres_admin_url, name)
