"""Workload transforms: rebase, rate scaling and the client's cap, over :class:`core.request.TraceRequest`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sagegate.core.request import TraceRequest


def rebase(requests: list[TraceRequest]) -> list[TraceRequest]:
    """Sort by arrival, shift the first arrival to 0 and number the requests 0..n-1."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    if not ordered:
        return []
    t0 = ordered[0].arrival_s
    return [
        replace(
            r,
            rid=i,
            arrival_s=r.arrival_s - t0,
            deadline_s=None if r.deadline_s is None else r.deadline_s - t0,
        )
        for i, r in enumerate(ordered)
    ]


def scale_rate(requests: list[TraceRequest], rate_scale: float) -> list[TraceRequest]:
    """Compress arrival gaps by ``rate_scale`` (2.0 = twice as dense); deadlines keep their slack ratio."""
    if rate_scale <= 0:
        raise ValueError("rate_scale must be > 0")
    out = []
    for r in requests:
        arrival = r.arrival_s / rate_scale
        deadline = None
        if r.deadline_s is not None:
            deadline = arrival + (r.deadline_s - r.arrival_s) / rate_scale
        out.append(replace(r, arrival_s=arrival, deadline_s=deadline))
    return out


def with_client_cap(requests: Sequence[TraceRequest], cap: int | None) -> list[TraceRequest]:
    """Each request with the client cap a real client would send: its own (when the trace records one),
    else ``cap`` (None: no cap). An output longer than its cap is cut to it, as the client would see."""
    out = []
    for r in requests:
        limit = r.max_tokens if r.max_tokens is not None else cap
        if limit is None:
            out.append(r)
        else:
            out.append(replace(r, max_tokens=limit, output_tokens=min(r.output_tokens, limit)))
    return out
