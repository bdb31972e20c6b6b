"""The assignment computation, run when the coordinator selects this agent to compute the group's
target: PrepareAssignment (the group as the coordinator sees it), the selected assignor's
`assign()`, InstallAssignment (the result).

A computation whose call fails with RESOURCE_EXHAUSTED (a message over a size limit) would fail
the same way if tried again at once: reporting it done would heartbeat, be asked to compute again
and loop. So it waits an exponentially growing, jittered time first (a stop ends the wait).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from connect_protocol import wire as protocol_wire

from . import wire
from .assignor import AssignmentResult, ConnectAssignor
from .transport import Backoff, Transport, TransportError

log = logging.getLogger("worker_agent")


class AssignmentComputation:
    """Prepare -> assign -> Install for one member of one group. `run()` is one computation;
    the caller reports it done to the membership machine afterwards.

    `member_epoch` reads the member's current epoch (each request carries it); calls go through
    `transport`, each with the deadline `rpc_timeout_s`."""

    def __init__(
        self,
        *,
        group_id: str,
        member_id: str,
        assignors: Sequence[ConnectAssignor],
        transport: Transport,
        member_epoch: Callable[[], int],
        rpc_timeout_s: float,
        too_large_backoff: Backoff,
        stop: threading.Event,
    ) -> None:
        self._group_id = group_id
        self._member_id = member_id
        self._assignors = tuple(assignors)
        self._transport = transport
        self._member_epoch = member_epoch
        self._rpc_timeout_s = rpc_timeout_s
        self._too_large_backoff = too_large_backoff
        self._stop = stop
        self._last_installed_epoch = -1

    def run(self) -> None:
        """One computation; failures are logged, never raised. After a RESOURCE_EXHAUSTED it
        returns only once the backoff has passed (or `stop` is set)."""
        try:
            self._prepare_assign_install()
            self._too_large_backoff.reset()
        except TransportError as error:
            if not error.too_large:
                log.exception("computing the assignment failed")
                return
            # Reporting done at once would heartbeat, be asked to compute again and fail the
            # same way, in a tight loop: wait first (a stop ends the wait).
            wait_s = self._too_large_backoff.next_wait_s()
            log.debug("computing the assignment again in %.2f s at the earliest", wait_s)
            self._stop.wait(wait_s)
        except Exception:
            log.exception("computing the assignment failed")

    def _prepare_assign_install(self) -> None:
        prepared = self._transport.prepare_assignment(
            wire.prepare_request(self._group_id, self._member_id, self._member_epoch()),
            self._rpc_timeout_s,
        )
        if prepared.error_code != 0:
            log.warning(
                "PrepareAssignment refused: %s %s",
                protocol_wire.error_code(prepared.error_code).name,
                prepared.error_message,
            )
            return
        if prepared.group_epoch == self._last_installed_epoch:
            return  # computed already; the group will move on
        group = wire.group_view(prepared)
        assignor = next((a for a in self._assignors if a.name == group.assignor_name), None)
        started = time.perf_counter()
        if assignor is None:
            result = AssignmentResult(
                error=1, error_message=f"this agent has no assignor {group.assignor_name!r}"
            )
        else:
            try:
                result = assignor.assign(group)
            except Exception as error:
                log.exception("assignor %s failed", assignor.name)
                result = AssignmentResult(error=1, error_message=f"{type(error).__name__}: {error}")
        elapsed_ms = (time.perf_counter() - started) * 1000
        answer = self._transport.install_assignment(
            wire.install_request(
                self._group_id,
                self._member_id,
                self._member_epoch(),
                group.group_epoch,
                result,
                group.assignor_version,
            ),
            self._rpc_timeout_s,
        )
        if answer.error_code != 0:
            log.warning(
                "InstallAssignment for group epoch %d refused: %s %s",
                group.group_epoch,
                protocol_wire.error_code(answer.error_code).name,
                answer.error_message,
            )
            return
        self._last_installed_epoch = group.group_epoch
        log.info(
            "installed the target of group epoch %d (%s v%d, %.1f ms, %d members%s)",
            group.group_epoch,
            group.assignor_name,
            group.assignor_version,
            elapsed_ms,
            len(group.members),
            f", rebalance in {result.scheduled_rebalance_delay_ms} ms"
            if result.scheduled_rebalance_delay_ms
            else "",
        )
