"""Rates per principal: joins (epoch-0 heartbeats) and group creations, each a token bucket
(`rate` per second, up to `burst` at once; rate 0 turns it off). A caller over its rate is
refused with THROTTLING_QUOTA_EXCEEDED, naming how long to wait. The buckets of principals not
seen for a while are forgotten, so a flood of principals costs bounded memory."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from connect_protocol.errors import ThrottlingQuotaExceeded

#: Buckets kept before the idle ones are dropped.
MAX_BUCKETS = 50_000


@dataclass
class _Bucket:
    tokens: float
    at_s: float


class TokenBuckets:
    """One token bucket per key."""

    def __init__(
        self,
        what: str,
        flag: str,
        rate: float,
        burst: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.flag = flag
        self.rate = rate
        self.burst = max(burst, 1.0)
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> None:
        """Take a token for `key`, or raise ThrottlingQuotaExceeded."""
        if self.rate <= 0:
            return
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= MAX_BUCKETS:
                    self._forget_full(now)
                bucket = self._buckets[key] = _Bucket(self.burst, now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at_s) * self.rate)
            bucket.at_s = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return
            wait_ms = int((1.0 - bucket.tokens) / self.rate * 1000) + 1
        raise ThrottlingQuotaExceeded(
            f"{key} is over its rate of {self.what} ({self.rate:g}/s, {self.flag}); retry in "
            f"{wait_ms} ms.",
            wait_ms,
        )

    def _forget_full(self, now: float) -> None:
        """Drop the buckets that have refilled (their keys would start full again anyway)."""
        self._buckets = {
            k: b
            for k, b in self._buckets.items()
            if b.tokens + (now - b.at_s) * self.rate < self.burst
        }
        if len(self._buckets) >= MAX_BUCKETS:
            self._buckets.clear()


class PrincipalQuotas:
    def __init__(
        self,
        join_rate: float = 0.0,
        join_burst: float = 0.0,
        creation_rate: float = 0.0,
        creation_burst: float = 0.0,
        member_call_rate: float = 0.0,
        member_call_burst: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.joins = TokenBuckets(
            "joins", "--max-joins-per-s", join_rate, join_burst or join_rate * 5, clock
        )
        self.creations = TokenBuckets(
            "group creations",
            "--max-group-creations-per-s",
            creation_rate,
            creation_burst or creation_rate * 5,
            clock,
        )
        #: ConnectGroupConfigs and ConnectGroupReportStatus together (DESIGN 3.20).
        self.member_calls = TokenBuckets(
            "member calls (ConnectGroupConfigs, ConnectGroupReportStatus)",
            "--max-member-calls-per-s",
            member_call_rate,
            member_call_burst or member_call_rate * 5,
            clock,
        )
