"""Counting the calls a piece of code makes (Python functions and builtins, all nested calls
included), for cost tests that must not depend on time: set arithmetic inside C counts one."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any


def calls(call: Callable[[], object]) -> int:
    """How many calls `call()` makes."""
    count = 0

    def profile(_frame: FrameType, event: str, _arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(previous)
    return count
