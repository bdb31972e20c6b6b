"""End to end: one heavy connector among light ones, a scale-out from 3 to 6 workers (seed 002,
Design III: "If you have an heavy connector with a lot of buffered data and a light connector with
little, the light connector tasks get stuck doing nothing while waiting for the heavy connector
tasks to finish").

A real coordinator (`coordinator-svc serve` on PostgreSQL, FAST_DEFAULTS: heartbeat 200 ms) and
real worker agents (`python -m worker_agent.cli run`, sessioned), each with the per-resource
recording exec hook (`tests/support/resource_hook.py`): a call starts or stops its resources
concurrently, the heavy connector's tasks taking 3 s to stop and everything else 10 ms (starting
takes 10 ms), and records when each resource's stop or start began and ended. With
`--release per-resource` the hook reports each resource released the moment it has stopped.

Catalogue: `slow` (the heavy connector, 6 tasks) and `light-a`, `light-b`, `light-c` (16 tasks
each): 54 tasks and 4 connectors. W1-W3 join the empty group and the connectors are put then, so
each worker runs 18 tasks, 2 of them heavy; W4-W6 are started behind a gate and released at once
(they join within milliseconds of each other, so one target moves everything). Each old worker
gives up 9 tasks, the highest names first (DESIGN 3.8's assignor), so its 2 heavy tasks and 7
light ones leave it together: 21 light and 6 heavy moved tasks per run (and one connector).

Runs, each in a fresh group on one coordinator:

  (a) the reference without the heavy connector: `slow`'s tasks stop in 10 ms too; batch release;
  (b) today: heavy connector, batch release, no waves;
  (c) heavy connector, per-resource release (DESIGN 3.11);
  (d) heavy connector, per-resource release and paced waves (DESIGN 3.18,
      rebalance.wave.max.resources = 4, rebalance.wave.pause.ms = 200).

Per moved task, its time not running is from the start of the revoked call that stops it on the
old worker to the end of the assigned call that starts it on the new one. The table (median, p95,
max, light and heavy tasks apart, per run, with the light p95 against run (a)'s) is printed to the
test output. Performance is not asserted (benchmarks show it: `./bench/run-rebalance --scenarios
heavy`); the assertions are ordering facts that hold by construction:

- every run: no resource ever ran on two workers at once, the group converged with every resource
  on exactly one worker, balanced (`Fleet.wait_quiet`), and every revoked resource was started
  again on another worker;
- (b): a light task revoked in the same call as a heavy one was started nowhere until that heavy
  task had stopped (it waited for the heavy stop: the failure the other runs must not show), and
  more than N resources were in motion at once;
- (c), (d): every light task revoked in the same call as heavy tasks was started on its new owner
  before those heavy tasks had finished stopping;
- (d): never more than N resources in motion for balancing at once, by the DescribeGroups polls
  and by the hook records, while (c), without waves, shows more.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.agents import Quiet
from tests.support.coordinator import CoordinatorProcess
from tests.support.pgcluster import create_database, drop_database
from tests.support.resource_records import (
    Distribution,
    HookCosts,
    InMotionPoller,
    Move,
    ResourceCall,
    ResourceFleet,
    add_agents,
    connector_of,
    distribution,
    is_task,
    moves,
    open_gate,
    peak_in_motion,
    resource_calls,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

HEAVY = "slow"
LIGHT = ("light-a", "light-b", "light-c")
CATALOGUE = {**dict.fromkeys(LIGHT, 16), HEAVY: 6}
MOVED_TASKS = sum(CATALOGUE.values()) // 2  # each old worker gives up half its tasks
OLD = ("W1", "W2", "W3")
NEW = ("W4", "W5", "W6")
HEAVY_STOP_S = 3.0
LIGHT_S = 0.01
WAVE_MAX = "rebalance.wave.max.resources"
WAVE_PAUSE = "rebalance.wave.pause.ms"
WAVE_N = 4
WAVE_PAUSE_MS = 200


@dataclass(frozen=True)
class Spec:
    key: str
    title: str
    heavy: bool
    release: str
    waves: bool = False


SPECS = {
    s.key: s
    for s in (
        Spec("a", "(a) no heavy connector, batch", heavy=False, release="batch"),
        Spec("b", "(b) heavy, batch release (today)", heavy=True, release="batch"),
        Spec("c", "(c) heavy, per-resource release", heavy=True, release="per-resource"),
        Spec(
            "d",
            f"(d) heavy, per-resource + waves N={WAVE_N}",
            heavy=True,
            release="per-resource",
            waves=True,
        ),
    )
}


@dataclass
class Outcome:
    spec: Spec
    error: str = ""
    opened_at: float = 0.0
    quiet: Quiet | None = None
    calls: list[ResourceCall] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    poll_peak: int = 0
    polls: int = 0

    def ok(self) -> Outcome:
        """This outcome, if the run itself went through (else fail the test with its error)."""
        assert not self.error, f"run {self.spec.title} failed:\n{self.error}"
        return self

    @property
    def converge_s(self) -> float:
        return self.quiet.at - self.opened_at if self.quiet is not None else float("nan")

    def tasks(self, heavy: bool) -> list[Move]:
        return [
            m
            for m in self.moves
            if is_task(m.resource) and (connector_of(m.resource) == HEAVY) == heavy
        ]

    def not_running(self, heavy: bool) -> Distribution:
        return distribution(m.not_running_s for m in self.tasks(heavy))

    @property
    def record_peak(self) -> int:
        return peak_in_motion(self.moves)

    def mixed_batches(self) -> list[tuple[list[Move], list[Move]]]:
        """Per revoked call that stopped heavy and light tasks together: (light, heavy) moves."""
        by_call: dict[int, tuple[list[Move], list[Move]]] = {}
        for m in self.moves:
            if not is_task(m.resource):
                continue
            light, heavy = by_call.setdefault(id(m.stop), ([], []))
            (heavy if connector_of(m.resource) == HEAVY else light).append(m)
        return [(light, heavy) for light, heavy in by_call.values() if light and heavy]

    def first_start(self, resource: str, after: float) -> float:
        """When `resource` next began to start on any worker after `after` (inf: never)."""
        return min(
            (
                c.spans[resource][0]
                for c in self.calls
                if c.event == "assigned" and resource in c.spans and c.t_start >= after
            ),
            default=float("inf"),
        )


# --- the runs -----------------------------------------------------------------------------------


def scale_out(coordinator: CoordinatorProcess, workdir: Path, spec: Spec) -> Outcome:
    """One run: 3 workers, the catalogue, then 3 more at once; wait until quiet and collect."""
    out = Outcome(spec)
    group = f"heavy-{spec.key}-{uuid.uuid4().hex[:6]}"
    fleet = ResourceFleet(coordinator.address, group, workdir / spec.key, coordinator.log_path)
    try:
        if spec.waves:
            fleet.alter_configs({WAVE_MAX: WAVE_N, WAVE_PAUSE: WAVE_PAUSE_MS})
        costs = HookCosts(
            stop_s=LIGHT_S,
            start_s=LIGHT_S,
            task_stop_s={HEAVY: HEAVY_STOP_S} if spec.heavy else {},
        )
        gate = fleet.workdir / "gate"
        add_agents(fleet, OLD, costs, spec.release)
        new = add_agents(fleet, NEW, costs, spec.release, gate=gate)
        fleet.start(*OLD)
        fleet.wait_quiet(set(OLD))
        for name, tasks in CATALOGUE.items():
            fleet.put_connector(name, tasks)
        fleet.wait_quiet(set(OLD))
        fleet.start(*NEW)
        with InMotionPoller(fleet) as poller:
            out.opened_at = open_gate(new, gate)
            out.quiet = fleet.wait_quiet(set(OLD) | set(NEW), timeout_s=60)
        out.poll_peak, out.polls = poller.peak, len(poller.samples)
        fleet.check_no_overlap()
        out.calls = resource_calls(fleet)
        out.moves, out.unmatched = moves(out.calls, out.opened_at)
    except Exception as error:  # reported by the tests of this run
        out.error = f"{type(error).__name__}: {error}"
    finally:
        fleet.close()
    return out


@pytest.fixture(scope="module")
def outcomes(
    postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Outcome]]:
    """All four runs, one after the other, on one coordinator (each in a fresh group)."""
    workdir = tmp_path_factory.mktemp("heavy")
    name = f"t_{uuid.uuid4().hex}"
    url = create_database(postgres_admin_url, name)
    coordinator = CoordinatorProcess(url, log_path=workdir / "coordinator.log")
    try:
        coordinator.start()
        yield {key: scale_out(coordinator, workdir, spec) for key, spec in SPECS.items()}
    finally:
        coordinator.close()
        drop_database(postgres_admin_url, name)


def table(results: dict[str, Outcome]) -> str:
    """Time not running per moved task (s), light and heavy apart, per run."""
    base = results["a"].not_running(heavy=False).p95 if not results["a"].error else 0.0
    header = [
        "run",
        "light n",
        "median",
        "p95",
        "max",
        "heavy n",
        "median",
        "p95",
        "max",
        "light p95 / (a)",
        "light with heavy",
        "converge s",
        "in motion: polls / records",
    ]
    rows = []
    for o in results.values():
        if o.error:
            rows.append([o.spec.title, "FAILED", *[""] * (len(header) - 2)])
            continue
        light, heavy = o.not_running(heavy=False), o.not_running(heavy=True)
        rows.append(
            [
                o.spec.title,
                *light.cells(),
                *heavy.cells(),
                f"{light.p95 / base:.2f}x" if base > 0 else "-",
                str(sum(len(lt) for lt, _ in o.mixed_batches())),
                f"{o.converge_s:.2f}",
                f"{o.poll_peak} / {o.record_peak}",
            ]
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def show(cells: list[str]) -> str:
        return " | ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    lines = [
        "Scale-out 3 -> 6 workers: time not running per moved task, seconds (from the start of the "
        "revoked call on the old worker to the end of the assigned call on the new one).",
        f"heavy = {HEAVY}'s tasks ({HEAVY_STOP_S:g} s to stop; 10 ms in (a)), light = the tasks "
        f"of {', '.join(LIGHT)} (10 ms); p95 by nearest rank; light with heavy = light tasks "
        "revoked in the same call as heavy ones; in motion = most resources moving at once "
        f"(waves: rebalance.wave.max.resources={WAVE_N}, rebalance.wave.pause.ms={WAVE_PAUSE_MS})",
        show(header),
        "-+-".join("-" * w for w in widths),
        *(show(r) for r in rows),
    ]
    return "\n".join(lines)


# --- the tests ----------------------------------------------------------------------------------


def test_report_time_not_running(
    outcomes: dict[str, Outcome], capsys: pytest.CaptureFixture[str]
) -> None:
    """Prints the distribution table (also when the output is captured)."""
    text = table(outcomes)
    with capsys.disabled():
        print("\n" + text)
    failed = [o.spec.title for o in outcomes.values() if o.error]
    assert not failed, f"runs failed: {failed}\n{text}"


def assert_moved_everything(o: Outcome) -> None:
    """Every revoked resource was started again elsewhere, once; only the old workers gave
    anything up, only to the new ones, half their tasks."""
    assert not o.unmatched, o.unmatched
    assert {m.source for m in o.moves} <= set(OLD), {m.source for m in o.moves}
    assert {m.target for m in o.moves} <= set(NEW), {m.target for m in o.moves}
    tasks = [m for m in o.moves if is_task(m.resource)]
    assert len(tasks) == MOVED_TASKS, sorted(m.resource for m in tasks)
    assert len({m.resource for m in o.moves}) == len(o.moves), "a resource moved twice"


def test_baseline_scale_out_moves_tasks_once_without_overlap(outcomes: dict[str, Outcome]) -> None:
    """(a) The reference: converged balanced with no overlap (checked in the run), every old
    worker's surplus moved once to the new workers."""
    assert_moved_everything(outcomes["a"].ok())


def test_batch_release_makes_light_tasks_wait_for_the_heavy_stop(
    outcomes: dict[str, Outcome],
) -> None:
    """(b) Today: a light task revoked together with a heavy task starts nowhere until that
    heavy task has stopped, and every moving resource is in motion at once."""
    o = outcomes["b"].ok()
    assert_moved_everything(o)
    mixed = o.mixed_batches()
    assert mixed, "no revoked call stopped heavy and light tasks together: the catalogue is wrong"
    waited = [
        (lt.resource, ht.resource)
        for light, heavy in mixed
        for lt in light
        for ht in heavy
        if o.first_start(lt.resource, lt.stop.t_start) > ht.stop_ended
    ]
    assert waited, "no light task waited for a heavy one revoked with it"
    assert o.poll_peak > WAVE_N and o.record_peak > WAVE_N, (o.poll_peak, o.record_peak)


def assert_light_tasks_did_not_wait(o: Outcome) -> int:
    """Every light task revoked in the same call as heavy tasks was started on its new owner
    before any of those heavy tasks had finished stopping. Returns how many such light tasks."""
    late = []
    count = 0
    for light, heavy in o.mixed_batches():
        first_heavy_stopped = min(h.stop_ended for h in heavy)
        for lt in light:
            count += 1
            if lt.start_ended >= first_heavy_stopped:
                late.append(
                    f"{lt.resource} ({lt.source} -> {lt.target}) started at "
                    f"{lt.start_ended - lt.stop_began:.3f} s, the heavy "
                    f"{sorted(h.resource for h in heavy)} stopped at "
                    f"{first_heavy_stopped - lt.stop_began:.3f} s after the call began"
                )
    assert not late, "light tasks waited for heavy ones revoked with them:\n" + "\n".join(late)
    return count


def test_per_resource_release_starts_light_tasks_before_heavy_ones_stop(
    outcomes: dict[str, Outcome],
) -> None:
    """(c) Per-resource release: the light tasks of a batch reach their new owners while the
    heavy tasks of that batch are still stopping; without waves, more than N resources are in
    motion at once."""
    o = outcomes["c"].ok()
    assert_moved_everything(o)
    assert assert_light_tasks_did_not_wait(o) > 0, "no batch mixed heavy and light tasks"
    assert o.poll_peak > WAVE_N and o.record_peak > WAVE_N, (o.poll_peak, o.record_peak)


def test_paced_waves_keep_at_most_n_in_motion_and_converge_balanced(
    outcomes: dict[str, Outcome],
) -> None:
    """(d) Per-resource release with paced waves: never more than N resources in motion at once
    (by DescribeGroups and by the hook records), light tasks of a batch still do not wait for its
    heavy tasks, and the group converged balanced (checked in the run)."""
    o = outcomes["d"].ok()
    assert_moved_everything(o)
    assert len(o.moves) > WAVE_N
    assert o.polls > 0
    assert o.poll_peak <= WAVE_N, f"{o.poll_peak} resources in motion at once (DescribeGroups)"
    assert o.record_peak <= WAVE_N, f"{o.record_peak} resources in motion at once (hook records)"
    assert_light_tasks_did_not_wait(o)
