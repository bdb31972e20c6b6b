"""The fencing demonstration (DESIGN 3.18, with 3.13): a downstream store that keeps the highest
fencing token per task refuses the writes of a zombie worker, and loses nothing the new owner
wrote.

Real processes: `coordinator-svc serve` on PostgreSQL (FAST_DEFAULTS: session 3000 ms, heartbeat
200 ms; here scheduled.rebalance.max.delay.ms 0, so lost work moves as soon as the session
expires), and two `tests.support.fencing_worker` processes, each one in-process `Agent` whose
listener runs one writer thread per task: every 50 ms it writes (task, its token) to
`tests.support.fenced_store.FencedStore`, an SQLite file that accepts a write only with a token
not below the highest it has accepted for that task.

The scenario: connector A with tasks A-0 and A-1. W1 joins alone and writes both tasks; W2 joins
and gets A-1 (an orderly hand-over: W1 stops writing before W2 starts). W1 is paused (SIGSTOP)
for longer than the session timeout; the coordinator expires it and grants its task to W2 with a
greater token; W2 writes. W1 is resumed: its writer, asleep when paused, writes once more under
the old token before anything can stop it (the zombie write), then the agent notices its session
is gone, fences itself (its listener stops the writers), and rejoins.

Checked on the store's log (every attempt, in commit order): W2's token for the task is greater
than W1's; W1 attempted at least one write after it resumed and every one was refused; no write
under W1's old token was accepted after W2's first accepted write; every write W2 attempted was
accepted (and each worker's own count of attempts matches the store's rows); the accepted tokens
of each task never decrease in commit order. And the control: the same attempts replayed, in the
same order, into a naive store (no fence) break those checks (the zombie write is accepted and
overwrites the new owner's data), so the checks can fail.

Run with `-s` (or `-rP`) to see the report.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import Fleet, catalogue_resources, wait_for
from tests.support.coordinator import FAST_DEFAULTS
from tests.support.fenced_store import FencedStore, WriteRow
from tests.support.fencing_worker import FencingWorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

CONNECTOR = "A"
TASKS = 2
MAX_DELAY = "scheduled.rebalance.max.delay.ms"
SESSION_S = FAST_DEFAULTS.session_timeout_ms / 1000
#: Generous bounds for each step; they only bound a failing run.
STEP_TIMEOUT_S = 20.0


# --- DescribeGroups -------------------------------------------------------------------------------


def member_tokens(member: Any) -> dict[str, int]:
    """resource ("A", "A-0") -> token, from a DescribedMember's fencing_tokens."""
    out: dict[str, int] = {}
    for entry in member.fencing_tokens:
        name = f"{entry.connector}-{entry.task}" if entry.HasField("task") else entry.connector
        out[name] = int(entry.token)
    return out


def member_task_tokens(member: Any) -> dict[str, int]:
    """task -> token for every task of the member's current assignment (KeyError: no token)."""
    tokens = member_tokens(member)
    tasks = [f"{t.connector}-{t.task}" for t in member.current_assignment.tasks]
    missing = [t for t in tasks if t not in tokens]
    assert not missing, f"{member.member_id} holds {missing} without a fencing token: {member}"
    return {t: tokens[t] for t in tasks}


def resources(cat: Any) -> set[str]:
    """The names ("A", "A-0") in a ConnectorsAndTasks."""
    return set(cat.connectors) | {f"{t.connector}-{t.task}" for t in cat.tasks}


def members_of(group: Any) -> dict[str, Any]:
    return {m.member_id: m for m in group.members}


# --- the workers ----------------------------------------------------------------------------------


class Workers:
    def __init__(self, fleet: Fleet, store: Path, workdir: Path) -> None:
        self.fleet = fleet
        self.store = store
        self.workdir = workdir
        self.procs: dict[str, FencingWorkerProcess] = {}

    def start(self, member_id: str) -> FencingWorkerProcess:
        proc = FencingWorkerProcess(
            member_id, self.fleet.coordinator, self.fleet.group, self.store, self.workdir
        )
        self.procs[member_id] = proc
        return proc.start()

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()

    def diagnostics(self) -> str:
        group = self.fleet.try_describe()
        parts = [f"DescribeGroups: {group}"]
        for proc in self.procs.values():
            parts.append(f"{proc.member_id} runs (by its event log): {proc.running()}")
            parts.append(proc.agent_log_tail())
        return "\n".join(parts)


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    path = tmp_path / "fenced-store.sqlite"
    FencedStore(path).close()  # the schema, before any worker opens it
    return path


@pytest.fixture
def workers(fleet: Fleet, store_path: Path, tmp_path: Path) -> Iterator[Workers]:
    out = Workers(fleet, store_path, tmp_path)
    try:
        yield out
    finally:
        out.close()


def accepted_by(rows: list[WriteRow], writer: str, resource: str, token: int) -> list[WriteRow]:
    return [
        r
        for r in rows
        if r.accepted and r.writer == writer and r.resource == resource and r.token == token
    ]


def wait_settled(workers: Workers, store: FencedStore, expected: set[str]) -> Any:
    """Wait until the group is STABLE with exactly `expected`, every member at the assignment
    epoch with nothing pending and its current assignment its target, the catalogue covered,
    and every worker's writers (by its event log) exactly its current tasks under the tokens
    DescribeGroups shows, each with an accepted write in the store. Returns the group."""
    fleet = workers.fleet

    def probe() -> Any | None:
        group = fleet.try_describe()
        if group is None or group.state != "STABLE":
            return None
        if group.group_epoch != group.assignment_epoch:
            return None
        members = members_of(group)
        if set(members) != expected:
            return None
        held: set[str] = set()
        for m in members.values():
            if m.state != "STABLE" or m.member_epoch != group.assignment_epoch:
                return None
            if m.pending_revocation.connectors or m.pending_revocation.tasks:
                return None
            if resources(m.current_assignment) != resources(m.target_assignment):
                return None
            held |= resources(m.current_assignment)
        if held != catalogue_resources(group):
            return None
        rows = store.rows()
        for member_id, m in members.items():
            tokens = member_task_tokens(m)
            if workers.procs[member_id].running() != tokens:
                return None
            if any(not accepted_by(rows, member_id, t, tok) for t, tok in tokens.items()):
                return None
        return group

    return wait_for(
        f"the group settled with {sorted(expected)}, each writing its tasks",
        probe,
        timeout_s=STEP_TIMEOUT_S,
        diagnostics=workers.diagnostics,
    )


def pause_outside_a_write(worker: FencingWorkerProcess, store: FencedStore) -> float:
    """SIGSTOP `worker` at a moment it holds no write lock on the store (a worker paused inside
    a transaction would block every other writer until it resumes). Returns when it was paused."""
    for _ in range(20):
        paused_at = worker.pause()
        if not store.write_locked(wait_s=1.0):
            return paused_at
        worker.resume()  # paused inside a write: let it finish and try again
        time.sleep(0.02)
    raise AssertionError(f"could not pause {worker.member_id} outside a write in 20 tries")


# --- the checks -----------------------------------------------------------------------------------


def fencing_problems(
    rows: list[WriteRow],
    zombie: str,
    zombie_tokens: dict[str, int],
    new_owner: str,
    resumed_at: float,
) -> tuple[list[str], list[WriteRow]]:
    """What is wrong in a store's log of attempts (commit order), and the zombie attempts.

    The zombie attempts of a task are the writes of `zombie` under its old token
    (`zombie_tokens`) after the first accepted write of `new_owner` for that task."""
    problems: list[str] = []
    zombies: list[WriteRow] = []
    for resource, old_token in sorted(zombie_tokens.items()):
        of_resource = [r for r in rows if r.resource == resource]
        new_first = next((r for r in of_resource if r.writer == new_owner and r.accepted), None)
        if new_first is None:
            problems.append(f"{resource}: {new_owner} never had a write accepted")
            continue
        late = [
            r
            for r in of_resource
            if r.writer == zombie and r.token == old_token and r.id > new_first.id
        ]
        zombies += late
        problems += [
            f"{resource}: {zombie}'s write seq {r.seq} under token {r.token} was accepted after "
            f"{new_owner}'s write seq {new_first.seq} under token {new_first.token}"
            for r in late
            if r.accepted
        ]
        after_resume = [
            r
            for r in of_resource
            if r.writer == zombie and r.token == old_token and r.at >= resumed_at
        ]
        if not after_resume:
            problems.append(f"{resource}: {zombie} attempted no write after it resumed")
        problems += [
            f"{resource}: {zombie}'s write seq {r.seq} after its resume was accepted"
            for r in after_resume
            if r.accepted
        ]
    problems += [
        f"{r.resource}: {new_owner}'s write seq {r.seq} under token {r.token} was refused"
        for r in rows
        if r.writer == new_owner and not r.accepted
    ]
    highest: dict[str, WriteRow] = {}
    for r in rows:
        if not r.accepted:
            continue
        before = highest.get(r.resource)
        if before is not None and r.token < before.token:
            problems.append(
                f"{r.resource}: accepted token {r.token} ({r.writer} seq {r.seq}) after token "
                f"{before.token} ({before.writer} seq {before.seq})"
            )
        else:
            highest[r.resource] = r
    return problems, zombies


def overwritten(rows: list[WriteRow], new_owner: str, resources: set[str]) -> list[str]:
    """Resources whose latest accepted write, at some point after the new owner's first, was
    not the new owner's nor under a greater token: the new owner's data overwritten by a
    stale writer (what a naive store lets happen)."""
    out = []
    for resource in sorted(resources):
        accepted = [r for r in rows if r.resource == resource and r.accepted]
        first = next((r for r in accepted if r.writer == new_owner), None)
        if first is None:
            continue
        stale = [r for r in accepted if r.id > first.id and r.token < first.token]
        if stale:
            out.append(f"{resource} ({len(stale)} stale write(s) landed on {new_owner}'s data)")
    return out


def attempts_match(proc: FencingWorkerProcess, rows: list[WriteRow]) -> list[str]:
    """Each writer's own count (its writer_stopped line) against the store's rows for it."""
    problems = []
    for entry in proc.events("writer_stopped"):
        mine = [
            r
            for r in rows
            if r.writer == proc.member_id
            and r.resource == entry["resource"]
            and r.token == entry["token"]
        ]
        if entry["errors"]:
            problems.append(f"{proc.member_id}: {entry['errors']} write(s) raised: {entry}")
        if len(mine) != entry["attempts"]:
            problems.append(
                f"{proc.member_id}: {entry['attempts']} attempt(s) on {entry['resource']} under "
                f"token {entry['token']}, {len(mine)} in the store"
            )
        if sum(r.accepted for r in mine) != entry["accepted"]:
            problems.append(f"{proc.member_id}: accepted count differs from the store: {entry}")
    return problems


# --- the test -------------------------------------------------------------------------------------


def test_a_resumed_zombie_is_refused_and_the_new_owner_loses_nothing(
    fleet: Fleet, workers: Workers, store_path: Path, tmp_path: Path
) -> None:
    began = time.monotonic()
    store = FencedStore(store_path)
    try:
        fleet.put_connector(CONNECTOR, TASKS)
        fleet.alter_configs({MAX_DELAY: 0})

        # W1 alone: both tasks; then W2 joins and takes one (an orderly hand-over).
        w1 = workers.start("W1")
        wait_settled(workers, store, {"W1"})
        w2 = workers.start("W2")
        group = wait_settled(workers, store, {"W1", "W2"})
        w1_tokens = member_task_tokens(members_of(group)["W1"])
        assert w1_tokens, f"W1 kept no task when W2 joined: {group}"
        assert w1.running() == w1_tokens  # the tokens its listener got are the coordinator's

        # W1 paused past its session: the coordinator expires it, its tasks go to W2.
        paused_at = pause_outside_a_write(w1, store)

        def moved() -> dict[str, int] | None:
            group = fleet.try_describe()
            if group is None:
                return None
            members = members_of(group)
            if "W1" in members or "W2" not in members:
                return None
            tokens = member_task_tokens(members["W2"])
            if not set(w1_tokens) <= set(tokens):
                return None
            rows = store.rows()
            if any(not accepted_by(rows, "W2", t, tokens[t]) for t in w1_tokens):
                return None
            return {t: tokens[t] for t in w1_tokens}

        w2_tokens = wait_for(
            f"W1's tasks {sorted(w1_tokens)} granted to W2, and W2 writing them",
            moved,
            timeout_s=SESSION_S + STEP_TIMEOUT_S,
            diagnostics=workers.diagnostics,
        )
        assert w1.alive and w1.paused
        moved_after_s = time.time() - paused_at
        # W1 left the group because its session expired (not for any other reason).
        expired = fleet.coordinator_events("member_session_expired", "W1")
        assert len(expired) == 1, expired

        # W1 resumed: the zombie write, then the self-fence (the writers stop), then a rejoin.
        resumed_at = w1.resume()

        def fenced() -> list[dict[str, Any]] | None:
            revoked = {
                t
                for e in w1.events("revoked")
                if e["t"] >= resumed_at
                for t, tok in e["tasks"].items()
                if w1_tokens.get(t) == tok
            }
            stopped = [
                e
                for e in w1.events("writer_stopped")
                if e["t"] >= resumed_at and w1_tokens.get(e["resource"]) == e["token"]
            ]
            if revoked != set(w1_tokens) or len(stopped) != len(w1_tokens):
                return None
            return stopped

        zombie_writers = wait_for(
            "W1 to stop its writers after it resumed",
            fenced,
            timeout_s=STEP_TIMEOUT_S,
            diagnostics=workers.diagnostics,
        )
        final = wait_settled(workers, store, {"W1", "W2"})
        final_tokens = {m.member_id: member_task_tokens(m) for m in members_of(final).values()}
        self_fenced = any("fencing itself" in line for line in w1.agent_log_tail(400).splitlines())

        w1.request_stop()
        w2.request_stop()
        assert w1.wait_exit() == 0, w1.agent_log_tail()
        assert w2.wait_exit() == 0, w2.agent_log_tail()
        rows = store.rows()
        fences = store.fences()
    finally:
        store.close()

    # The tokens: the new owner's is greater.
    for task, token in w1_tokens.items():
        assert w2_tokens[task] > token, (task, token, w2_tokens)

    # The fenced store: no problem at all, and at least one zombie attempt (all refused).
    problems, zombies = fencing_problems(rows, "W1", w1_tokens, "W2", resumed_at)
    assert not problems, "the fenced store let a zombie through:\n" + "\n".join(problems)
    assert zombies, "W1 attempted no write after W2's first: the demonstration proved nothing"
    assert not any(z.accepted for z in zombies)
    assert {z.resource for z in zombies} == set(w1_tokens), zombies
    assert sum(e["refused"] for e in zombie_writers) >= len(w1_tokens), zombie_writers

    # Nothing lost or miscounted: every attempt each worker made is in the store as it saw it.
    mismatches = attempts_match(w1, rows) + attempts_match(w2, rows)
    assert not mismatches, "\n".join(mismatches)
    w2_rows = [r for r in rows if r.writer == "W2"]
    assert w2_rows and all(r.accepted for r in w2_rows)
    for resource, token in fences.items():
        assert token == max(r.token for r in rows if r.resource == resource and r.accepted)

    # The control: the same attempts, in the same order, into a naive store.
    with FencedStore(tmp_path / "naive-store.sqlite", fenced=False) as naive:
        naive_rows = naive.replay(rows)
    naive_problems, naive_zombies = fencing_problems(naive_rows, "W1", w1_tokens, "W2", resumed_at)
    naive_accepted = [z for z in naive_zombies if z.accepted]
    assert len(naive_accepted) == len(zombies) >= 1, (naive_zombies, zombies)
    assert naive_problems, "the checks did not notice a naive store accepting zombie writes"
    naive_overwritten = overwritten(naive_rows, "W2", set(w1_tokens))
    assert naive_overwritten, "a naive store should have let W1 overwrite W2's data"
    assert not overwritten(rows, "W2", set(w1_tokens))

    took_s = time.monotonic() - began
    report = [
        "",
        "=== fencing demonstration ===",
        f"W1 paused {resumed_at - paused_at:.2f} s (session {SESSION_S:g} s); its tasks moved "
        f"to W2 after {moved_after_s:.2f} s; W1 {'fenced itself' if self_fenced else 'was fenced'}"
        f" and rejoined",
    ]
    for task in sorted(w1_tokens):
        z = [r for r in zombies if r.resource == task]
        report.append(
            f"{task}: W1 token {w1_tokens[task]} -> W2 token {w2_tokens[task]}; "
            f"W1 zombie writes after W2's first: {len(z)} attempted, "
            f"{sum(r.accepted for r in z)} accepted (seq {[r.seq for r in z]})"
        )
    report += [
        f"after the rejoin: {final_tokens}; final fences: {dict(sorted(fences.items()))}",
        f"writes: {len(rows)} attempted, {sum(r.accepted for r in rows)} accepted; "
        f"W2 {len(w2_rows)} attempted, all accepted",
        f"naive store on the same attempts: {len(naive_accepted)} zombie write(s) accepted, "
        f"overwriting W2's data on {', '.join(naive_overwritten)}; "
        f"{len(naive_problems)} problem(s) found by the same checks:",
        *(f"  {p}" for p in naive_problems),
        f"test took {took_s:.1f} s",
    ]
    print("\n".join(report))
