"""The core's own error: a broken invariant of the group state. (The errors a request can be
answered with are the protocol's: `connect_protocol.errors`.)"""

from __future__ import annotations


class IllegalStateError(AssertionError):
    """An invariant of the group state is broken: a bug, never a client error."""
