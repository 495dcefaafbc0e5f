"""Re-time a trace to a target rate: the same requests, in the same order, with new arrival gaps.

Useful to replay a real trace's lengths (and prompts) at a load an engine can take, or to give it a
controlled burstiness. Deadlines keep their slack; rids are unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from sagegate.core.request import TraceRequest


def retime(
    requests: list[TraceRequest],
    *,
    rate: float,
    arrival: str = "poisson",
    cv: float = 1.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """``requests`` in arrival order (ties by rid) at new arrivals from 0 drawn at ``rate`` req/s."""
    import numpy as np

    from sagegate.loadgen.synthetic import arrival_times

    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.rid))
    times = arrival_times(len(ordered), rate=rate, arrival=arrival, cv=cv, rng=np.random.default_rng(seed))
    out = []
    for r, t in zip(ordered, times.tolist(), strict=True):
        deadline = None if r.deadline_s is None else t + (r.deadline_s - r.arrival_s)
        out.append(replace(r, arrival_s=t, deadline_s=deadline))
    return out
