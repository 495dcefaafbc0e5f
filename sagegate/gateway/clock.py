"""The gateway's clock: monotonic within a process, on the wall clock's scale across processes.

Rank keys carry times (a request's arrival, for ``fcfs`` and every tiebreak), and with
``ledger.order: threshold`` replicas compare each other's published heads. ``time.monotonic`` has an
arbitrary origin per host (boot), so keys from two hosts would not compare; ``time.time`` compares
but can step backwards. This clock is ``time.monotonic`` shifted once, at import, onto the wall
clock: it never steps within a process, and replicas agree to within their hosts' clock sync.
"""

from __future__ import annotations

import time

_OFFSET = time.time() - time.monotonic()


def fleet_clock() -> float:
    """Seconds on the wall clock's scale, monotonic within this process."""
    return time.monotonic() + _OFFSET
