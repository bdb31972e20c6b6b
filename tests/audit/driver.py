"""A test driver that plays a group's workers and its assignor member against a real coordinator
(ScriptedWorker over gRPC) and keeps its own record of what it did and saw: every rebalance it
caused (with its own clock before and after), the targets it installed, which worker it saw
running which resource, and what was lost when a worker left. The audit export's findings are
checked against this record."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from connect.group.v1 import admin_pb2

from tests.support.client import ScriptedWorker, describe, names, parse

COMPUTE = 10001


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Rebalance:
    """One rebalance as the driver saw it: the group epoch its target was computed for, and the
    driver's wall clock before the action that caused it and after every member had reached the
    target."""

    epoch: int
    reason: str
    trigger: str | None
    t_before_ms: int
    t_after_ms: int
    moved: set[str]
    newly_assigned: set[str]
    left_unassigned: set[str]
    revoked: set[str]
    delay_ms: int = 0


@dataclass
class Lost:
    resource: str
    member: str
    t_before_ms: int
    restarted_on: str | None = None
    t_restarted_after_ms: int | None = None


@dataclass
class Driver:
    stubs: Any
    group: str
    workers: dict[str, ScriptedWorker] = field(default_factory=dict)
    target: dict[str, set[str]] = field(default_factory=dict)
    rebalances: list[Rebalance] = field(default_factory=list)
    history: dict[str, list[str]] = field(default_factory=dict)
    lost: list[Lost] = field(default_factory=list)
    target_moves: list[str] = field(default_factory=list)

    # --- observing ---

    def owned(self, member: str) -> set[str]:
        return set(names(self.workers[member].owned))

    def observe(self) -> None:
        """Record who runs what now; a resource that shows up on another worker than the one
        that ran it last has moved."""
        for member, worker in self.workers.items():
            for resource in names(worker.owned):
                runs = self.history.setdefault(resource, [])
                if not runs or runs[-1] != member:
                    runs.append(member)
                    for lost in self.lost:
                        if lost.resource == resource and lost.restarted_on is None:
                            lost.restarted_on = member
                            lost.t_restarted_after_ms = now_ms()

    def heartbeat_all(self) -> None:
        for worker in self.workers.values():
            resp = worker.heartbeat()
            assert resp.error_code in (0, COMPUTE), (worker.member_id, resp)
        self.observe()

    def until(self, condition: Callable[[], Any], timeout_s: float = 15.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.heartbeat_all()
            value = condition()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"not reached in {timeout_s}s: {describe(self.stubs, self.group)}")

    def settled(self, epoch: int) -> bool:
        group = describe(self.stubs, self.group)
        return bool(group.members) and all(
            m.member_epoch == epoch
            and m.state == "STABLE"
            and not m.pending_revocation.tasks
            and not m.pending_revocation.connectors
            for m in group.members
        )

    # --- acting ---

    def configure(self, **configs: str) -> None:
        resp = self.stubs.admin.AlterGroupConfigs(
            admin_pb2.AlterGroupConfigsRequest(group_id=self.group, set=configs), timeout=10
        )
        assert resp.error_code == 0, resp

    def rebalance(
        self,
        action: Callable[[], None],
        reason: str,
        trigger: str | None,
        targets: dict[str, Iterable[str]],
        *,
        assignor: str = "W1",
        delay_ms: int = 0,
        t_before_ms: int | None = None,
    ) -> Rebalance:
        """Do `action` (which bumps the group epoch), play the assignor member: install
        `targets`, then heartbeat every worker until each is STABLE at the new epoch."""
        t0 = now_ms() if t_before_ms is None else t_before_ms
        action()
        self.observe()
        chosen = self.workers[assignor]
        others = [w for m, w in self.workers.items() if m != assignor]
        deadline = time.monotonic() + 15
        while chosen.heartbeat().error_code != COMPUTE:
            assert time.monotonic() < deadline, "the assignor member was never asked to compute"
            for w in others:
                w.heartbeat()
            time.sleep(0.05)
        prepared = chosen.prepare()
        assert prepared.error_code == 0, prepared
        epoch = prepared.group_epoch
        new = {m: set(rs) for m, rs in targets.items()}
        before = {r: m for m, rs in self.target.items() for r in rs}
        after = {r: m for m, rs in new.items() for r in rs}
        revoked = {r for m in self.workers for r in self.owned(m) if after.get(r) != m}
        record = Rebalance(
            epoch=epoch,
            reason=reason,
            trigger=trigger,
            t_before_ms=t0,
            t_after_ms=0,
            moved={r for r in before.keys() & after.keys() if before[r] != after[r]},
            newly_assigned=set(after) - set(before),
            left_unassigned=set(before) - set(after),
            revoked=revoked,
            delay_ms=delay_ms,
        )
        self.target_moves += sorted(record.moved)
        resp = chosen.install(epoch, {m: parse(*rs) for m, rs in new.items()}, delay_ms=delay_ms)
        assert resp.error_code == 0, resp
        self.target = new
        self.until(lambda: self.settled(epoch))
        record.t_after_ms = now_ms()
        self.rebalances.append(record)
        return record

    def join(self, member: str) -> Callable[[], None]:
        def act() -> None:
            self.workers[member] = ScriptedWorker(self.stubs, self.group, member)
            assert self.workers[member].join().error_code in (0, COMPUTE)

        return act

    def leave(self, member: str) -> Callable[[], None]:
        def act() -> None:
            t0 = now_ms()
            worker = self.workers.pop(member)
            for resource in names(worker.owned):
                self.lost.append(Lost(resource, member, t0))
            assert worker.leave().error_code == 0

        return act

    def wait_for_epoch(self, epoch: int, timeout_s: float = 15.0) -> Callable[[], None]:
        def act() -> None:
            self.until(lambda: describe(self.stubs, self.group).group_epoch >= epoch, timeout_s)

        return act

    def retry_until_served(self, timeout_s: float = 20.0) -> None:
        """After a coordinator restart: heartbeat until the new one serves the group."""
        deadline = time.monotonic() + timeout_s
        for worker in self.workers.values():
            worker.stubs = self.stubs
        while True:
            codes = [w.heartbeat().error_code for w in self.workers.values()]
            if all(c in (0, COMPUTE) for c in codes):
                return
            assert time.monotonic() < deadline, codes
            time.sleep(0.2)


def runtime_moves(history: dict[str, list[str]]) -> dict[str, tuple[int, int, int]]:
    """Per connector, from the driver's record: (task moves, tasks moved, connector moves)."""
    out: dict[str, tuple[int, int, int]] = {}
    for resource, owners in history.items():
        connectors, tasks = parse(resource)
        moves = len(owners) - 1
        if tasks:
            ((connector, _),) = tasks
            t, n, c = out.get(connector, (0, 0, 0))
            out[connector] = (t + moves, n + (moves > 0), c)
        else:
            (connector,) = connectors
            t, n, c = out.get(connector, (0, 0, 0))
            out[connector] = (t, n, c + moves)
    return out


def target_task_moves(moved: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for resource in moved:
        _, tasks = parse(resource)
        for connector, _task in tasks:
            out[connector] = out.get(connector, 0) + 1
    return out
