"""The findings as a fold over each group's events, carrying a small state from one export run
to the next (`group`: the fold; `state`: what is carried; `event`: the events it reads). Pure
Python, no I/O: `audit_export.incremental` runs it in Spark, one group at a time."""

from .event import Event, Move
from .group import GroupFold, OutOfOrder, Outputs, fold_group, split_name
from .state import GroupState

__all__ = [
    "Event",
    "GroupFold",
    "GroupState",
    "Move",
    "OutOfOrder",
    "Outputs",
    "fold_group",
    "split_name",
]
