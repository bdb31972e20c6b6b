"""Environment variables as command-line defaults, by one rule for every program of the product:
a variable that is unset or empty leaves the flag's own default; a set one is passed on as the
string it is, so argparse converts it with the flag's `type=` and a bad value is reported as a
usage error naming the flag (not a traceback)."""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")


def env_default(name: str, default: T) -> str | T:
    """The default of a flag that environment variable `name` can set."""
    value = os.environ.get(name)
    return default if value is None or value == "" else value
