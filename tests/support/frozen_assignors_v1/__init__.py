"""A verbatim copy of `worker_agent.assignors` (eager, incremental, balance, state) as it was
before the linear-time rewrite: the reference for the differential test and the benchmark's
baseline. Do not change it."""

from __future__ import annotations

from .eager import EagerAssignor
from .incremental import DEFAULT_MAX_DELAY_MS, IncrementalCooperativeAssignor

__all__ = ["DEFAULT_MAX_DELAY_MS", "EagerAssignor", "IncrementalCooperativeAssignor"]
