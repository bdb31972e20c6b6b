"""Readiness: whether this process should receive new traffic, decided from when the database
last answered and whether its schema is the one this code expects.

Steady heartbeats need no database (DESIGN 3.16), so a short outage is not a reason to turn
clients away: readiness is lost only once the database has been silent for longer than the lease
(by then every lease this process held has lapsed, so it can serve nothing), or when the schema is
not this code's head (behind: not migrated yet; ahead: a newer release's migration ran). It comes
back by itself when both are right again. Liveness is not decided here: it never depends on the
database (`grpc_api.server`).

`decide` and `classify_schema` are the pure policy (no clock, no I/O: they take times and
revisions). `ReadinessMonitor` feeds them: a probe thread reads the schema's revision (one cheap
query that also proves the database answers), and an evaluation thread applies the policy on a
short tick and reports each change of the answer, logged once with its reason. A tick that comes
much later than meant is this process having been paused (SIGSTOP, a VM pause): that time is not
counted as the database's silence, and the pause is logged as such.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from connect_protocol.logs import fields

log = logging.getLogger("coordinator")

#: An evaluation tick that comes this much later than meant (at least) means a paused process.
MIN_PAUSE_S = 1.0


class SchemaStatus(enum.Enum):
    AT_HEAD = "at_head"
    BEHIND = "behind"  # not migrated, or an older revision this code knows
    AHEAD = "ahead"  # a revision this code does not know: a newer release's migration


@dataclass(frozen=True, slots=True)
class Schema:
    """The database's schema revision(s) compared with this code's head."""

    status: SchemaStatus
    current: tuple[str, ...]
    head: str

    def describe(self) -> str:
        at = ",".join(self.current) if self.current else "<none> (never migrated)"
        if self.status is SchemaStatus.AT_HEAD:
            return f"schema at {at} (this code's head)"
        if self.status is SchemaStatus.AHEAD:
            return (
                f"schema at {at}, code expects {self.head} (a newer release migrated the "
                "database; run that release, or roll it back)"
            )
        return f"schema at {at}, code expects {self.head} (run `coordinator-svc migrate`)"


def classify_schema(current: Sequence[str], head: str, known: Collection[str]) -> Schema:
    """Where the database's revisions (`current`, the rows of alembic_version) stand against this
    code's `head`, `known` being every revision this code's migrations define."""
    revisions = tuple(current)
    if revisions == (head,):
        status = SchemaStatus.AT_HEAD
    elif all(r in known for r in revisions):
        status = SchemaStatus.BEHIND  # includes no revision at all (never migrated)
    else:
        status = SchemaStatus.AHEAD
    return Schema(status, revisions, head)


@dataclass(frozen=True, slots=True)
class Readiness:
    """The policy's answer: `serving`, and why. `causes` names the reasons for NOT_SERVING
    ("database", "schema_behind", "schema_ahead"); a change of it is what gets logged."""

    serving: bool
    causes: tuple[str, ...]
    reason: str


def decide(
    now: float,
    last_answered: float,
    lease_s: float,
    schema: Schema,
    *,
    allow_newer_schema: bool = False,
) -> Readiness:
    """SERVING unless the database has not answered for longer than `lease_s` (times in seconds
    on one monotonic clock) or `schema` is not at head (a schema ahead is accepted with
    `allow_newer_schema`)."""
    causes: list[str] = []
    reasons: list[str] = []
    silent = now - last_answered
    if silent > lease_s:
        causes.append("database")
        reasons.append(f"database unreachable for {silent:.1f} s > lease {lease_s:g} s")
    if schema.status is SchemaStatus.BEHIND:
        causes.append("schema_behind")
        reasons.append(schema.describe())
    elif schema.status is SchemaStatus.AHEAD and not allow_newer_schema:
        causes.append("schema_ahead")
        reasons.append(schema.describe())
    if causes:
        return Readiness(False, tuple(causes), "; ".join(reasons))
    where = schema.describe()
    if schema.status is SchemaStatus.AHEAD:
        where = f"schema at {','.join(schema.current)}, newer than {schema.head} (accepted)"
    return Readiness(True, (), f"database answered {max(silent, 0.0):.1f} s ago, {where}")


#: The database probe: the rows of alembic_version (empty if never migrated); raises if the
#: database does not answer.
Probe = Callable[[], Sequence[str]]


class ReadinessMonitor:
    """Applies `decide` to what `probe` finds and reports each change through `on_change`
    (True: SERVING).

    The probe runs on a thread of its own every `probe_interval_s` (by default a third of the
    lease, like lease renewal; every `tick_s` while it fails). It may block for as long as the
    database lets it (a partition), which is why the policy is evaluated on another thread,
    every `tick_s`, from the time the database last answered a probe. `on_change` is called
    from that thread, and once by `start`, which also takes the schema found at start-up
    (`initial`, read just before) so that no first probe is needed."""

    def __init__(
        self,
        probe: Probe,
        *,
        head: str,
        known: Collection[str],
        lease_s: float,
        on_change: Callable[[bool], None],
        allow_newer_schema: bool = False,
        probe_interval_s: float | None = None,
        tick_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_tick: Callable[[Readiness, float], None] | None = None,
    ) -> None:
        self._probe = probe
        self._head = head
        self._known = frozenset(known)
        self.lease_s = lease_s
        self._on_change = on_change
        self._on_tick = on_tick
        self._allow_newer = allow_newer_schema
        self.probe_interval_s = probe_interval_s or max(0.05, lease_s / 3)
        self.tick_s = tick_s or max(0.05, min(1.0, lease_s / 10))
        self._clock = clock
        self._lock = threading.Lock()
        self._last_answered = clock()
        self._schema = classify_schema((), head, known)
        self._last_error: str | None = None
        self._current: Readiness | None = None
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._probe_loop, name="readiness-probe", daemon=True),
            threading.Thread(target=self._evaluate_loop, name="readiness", daemon=True),
        ]

    def start(self, initial: Sequence[str]) -> Readiness:
        """Take the revisions read at start-up (the database answered just now), report the
        first answer, and start probing."""
        with self._lock:
            self._last_answered = self._clock()
            self._schema = classify_schema(initial, self._head, self._known)
        answer = self.evaluate()
        for thread in self._threads:
            thread.start()
        return answer

    def stop(self) -> None:
        """Stop reporting (the evaluation thread is joined, so no report follows this call).
        A probe stuck on the database is not waited for: its thread is a daemon."""
        self._stop.set()
        evaluator = self._threads[1]
        if evaluator.is_alive():
            evaluator.join(timeout=2)

    @property
    def current(self) -> Readiness | None:
        return self._current

    def probe_once(self) -> bool:
        """One probe; True if the database answered."""
        try:
            revisions = self._probe()
        except Exception as error:
            message = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            with self._lock:
                first = self._last_error is None
                self._last_error = message
            if first:
                log.info(
                    "database probe failed: %s",
                    message,
                    extra=fields(event="database_probe_failed", error=message),
                )
            return False
        schema = classify_schema(revisions, self._head, self._known)
        answered = self._clock()
        with self._lock:
            silent = answered - self._last_answered
            failed, self._last_error = self._last_error, None
            self._last_answered = max(self._last_answered, answered)
            self._schema = schema
        if failed is not None:
            log.info(
                "database answers again (silent for %.1f s)",
                max(silent, 0.0),
                extra=fields(event="database_probe_recovered", silent_s=round(silent, 3)),
            )
        return True

    def evaluate(self) -> Readiness:
        """Apply the policy now; report and log a change of the answer or of its causes."""
        with self._lock:
            last_answered, schema = self._last_answered, self._schema
        now = self._clock()
        answer = decide(
            now, last_answered, self.lease_s, schema, allow_newer_schema=self._allow_newer
        )
        if self._on_tick is not None:
            self._on_tick(answer, now - last_answered)
        previous = self._current
        if previous is None or (previous.serving, previous.causes) != (
            answer.serving,
            answer.causes,
        ):
            self._report(previous, answer)
            self._current = answer  # after on_change succeeded: else the next tick tries again
        return answer

    def _report(self, previous: Readiness | None, answer: Readiness) -> None:
        state = "SERVING" if answer.serving else "NOT_SERVING"
        extra = fields(
            event="readiness",
            serving=answer.serving,
            causes=list(answer.causes),
            schema=list(self._schema.current),
            code_head=self._head,
        )
        if answer.serving:
            again = "" if previous is None else " again"
            log.info("%s: readiness %s%s", answer.reason, state, again, extra=extra)
        else:
            log.warning("%s: readiness %s", answer.reason, state, extra=extra)
        self._on_change(answer.serving)

    def _probe_loop(self) -> None:
        wait = self.probe_interval_s
        while not self._stop.wait(wait):
            # While the database does not answer, ask again sooner: readiness comes back as
            # soon as it does.
            wait = self.probe_interval_s if self.probe_once() else self.tick_s

    def notice_pause(self, late_s: float) -> None:
        """The evaluation woke `late_s` later than it meant to: from MIN_PAUSE_S on, this
        process was paused, and nothing (the probe neither) ran meanwhile; that time is taken
        out of the database's silence, and the pause logged."""
        if late_s < max(MIN_PAUSE_S, 2 * self.tick_s):
            return
        with self._lock:
            self._last_answered = min(self._last_answered + late_s, self._clock())
        log.warning(
            "this process was paused for %.1f s (not a database failure): the time it was "
            "stopped is not counted as the database's silence",
            late_s,
            extra=fields(event="process_paused", paused_s=round(late_s, 3)),
        )

    def _evaluate_loop(self) -> None:
        while True:
            meant = self._clock() + self.tick_s
            if self._stop.wait(self.tick_s):
                return
            self.notice_pause(self._clock() - meant)
            try:
                self.evaluate()
            except Exception:
                log.exception("readiness evaluation failed")
