"""What the fuzz tests share: a coordinator process under fuzz (`FuzzTarget`) and hypothesis
strategies over the generators of `tests.support.hostile`."""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import Message
from hypothesis import event, note
from hypothesis import strategies as st

from tests.support import hostile
from tests.support.coordinator import CoordinatorProcess

T = TypeVar("T")

#: The server's message size limit under fuzz: small, so that oversized bodies are cheap to send.
LIMIT = 1024 * 1024


@functools.lru_cache(maxsize=4096)
def _integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


@functools.lru_cache(maxsize=64)
def _binary(max_size: int) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=max_size)


@functools.lru_cache(maxsize=64)
def _text(max_size: int) -> st.SearchStrategy[str]:
    return st.text(max_size=max_size)


class HypothesisSource:
    """A `hostile.Source` drawing through hypothesis (so failures shrink)."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        value: int = self.draw(_integers(lo, hi))
        return value

    def pick(self, options: Sequence[T]) -> T:
        if len(options) == 1:
            return options[0]
        index: int = self.draw(_integers(0, len(options) - 1))
        return options[index]

    def blob(self, max_size: int) -> bytes:
        value: bytes = self.draw(_binary(max_size))
        return value

    def chars(self, max_size: int) -> str:
        value: str = self.draw(_text(max_size))
        return value


@dataclass
class Call:
    """One request of a batch: its RPC, the body sent, and the message it encodes (None for a raw
    body)."""

    rpc: str
    body: bytes
    message: Message | None

    def __repr__(self) -> str:
        shown = hostile.show(self.message if self.message is not None else self.body, 300)
        return f"{self.rpc}: {shown}"


class Batch(list[Call]):
    """Requests sent at once (concurrently) in one example."""

    def __repr__(self) -> str:
        return f"Batch({len(self)} calls: {', '.join(repr(c) for c in self)})"


def batches(
    world: hostile.World, rpcs: Sequence[str], kind: str, most: int = 8
) -> st.SearchStrategy[Batch]:
    """1..`most` requests, each of one of `rpcs`: well-formed hostile messages (`kind`
    "message") or raw bodies (`kind` "raw")."""

    @st.composite
    def build(draw: Any) -> Batch:
        src = HypothesisSource(draw)
        batch = Batch()
        for _ in range(src.integer(1, most)):
            rpc = src.pick(rpcs)
            if kind == "message":
                message = hostile.well_formed(src, world, rpc)
                batch.append(Call(rpc, message.SerializeToString(), message))
            else:
                batch.append(Call(rpc, hostile.raw_body(src, world, rpc, LIMIT), None))
        return batch

    strategy: st.SearchStrategy[Batch] = build()
    return strategy


class FuzzTarget:
    """A `coordinator-svc serve` process on its own PostgreSQL database, with a healthy group
    heartbeating beside, a raw client, the world the generators draw names from, and a watch on
    the server's log."""

    def __init__(
        self,
        coordinator: CoordinatorProcess,
        database_url: str,
        world: hostile.World,
        healthy: hostile.HealthyGroup,
    ) -> None:
        self.coordinator = coordinator
        self.database_url = database_url
        self.world = world
        self.healthy = healthy
        self.client = hostile.RawClient(coordinator.address)
        assert coordinator.log_path is not None
        self.log = hostile.LogWatch(coordinator.log_path)
        self.sent: Counter[str] = Counter()

    def exchange(self, batch: Batch) -> None:
        """Send the batch at once; every answer must be allowed, and the server's log must gain
        no traceback and no error line."""
        answers = self.client.send_many([(call.rpc, call.body) for call in batch])
        problems, labels = [], []
        for call, (status, details, answer) in zip(batch, answers, strict=True):
            self.sent[call.rpc] += 1
            verdict = hostile.judge(call.rpc, call.body, status, details, answer, LIMIT)
            event(f"{call.rpc} {verdict.label}")
            labels.append(verdict.label)
            if verdict.problems:
                note(f"request: {call.rpc} {hostile.show(call.message or call.body)}")
                note(f"answer: {status.name} {details} {hostile.show(verdict.response or b'')}")
                problems.extend(verdict.problems)
            elif call.message is not None and verdict.response is not None:
                self.world.learn(call.rpc, call.message, verdict.response)
            if hostile.may_have_lowered_group_version(call.rpc, verdict.response):
                self.client.send("UpdateFeatures", hostile.RESTORE_GROUP_VERSION)
        if any(v == "RESOURCE_EXHAUSTED/answer" for v in labels):
            # gRPC logs what it makes of an answer it could not send just after the status went
            # out: wait for it, so that it is found with the request that caused it.
            time.sleep(0.05)
        tracebacks, errors = hostile.log_findings(self.log.new_text())
        assert not problems, problems
        assert tracebacks == 0 and not errors, errors

    def begin(self) -> None:
        """Before a test's requests: what the log holds so far is earlier tests' business (a
        test that passed has waited for its last lines in `check_afterwards`)."""
        self.log.new_text()
        self.healthy.errors.clear()
        self.healthy.unavailable.clear()

    def check_afterwards(self) -> None:
        """After a test's requests: the healthy group was never refused nor left unanswered,
        the log gained nothing bad, and the database holds every invariant."""
        time.sleep(0.2)  # for lines logged just after the last answer went out
        tracebacks, errors = hostile.log_findings(self.log.new_text())
        assert tracebacks == 0 and not errors, errors
        assert not self.healthy.errors, self.healthy.errors[:10]
        assert not self.healthy.unavailable, self.healthy.unavailable[:10]
        assert self.healthy.stable() or self._settles(), "the healthy group is not stable"
        report = hostile.check_invariants(self.database_url)
        assert report.ok, report.describe()

    def _settles(self, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.healthy.stable():
                return True
            time.sleep(0.2)
        return False

    def close(self) -> None:
        self.client.close()
