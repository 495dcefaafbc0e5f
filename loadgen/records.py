"""The canonical request record every reader produces and every driver (simulator, replay client) consumes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

DEFAULT_CLIENT_MAX_TOKENS = 4096
"""The ``max_tokens`` a replay sends for a request whose trace records no cap of its own: a realistic
chat client's cap, never the request's true output length (which would hand a scheduler the answer)."""

FORCED_OUTPUT_FIELD = "sim_output_tokens"
"""The body field that tells a *simulated* backend exactly how many tokens to generate (a trace's true
output length). Only ``sagegate backend`` reads it; the gateway forwards it untouched and never reads
it; a real vLLM ignores it, so its outputs are the model's own."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload, as a trace describes it.

    ``arrival_s`` is seconds from the start of the workload. ``output_tokens`` is the true output length:
    a replay sends it only in :data:`FORCED_OUTPUT_FIELD`, which no scheduler reads. ``max_tokens`` is
    the client's cap, what a replay sends as ``max_tokens`` (None: the trace records none; see
    :func:`with_client_cap`). ``hash_ids`` names the prompt's prefix blocks (Mooncake: one id per 512
    tokens; equal ids mean equal content).
    """

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    rid: int = 0
    prompt: str | None = None
    tenant: str = "default"
    priority: int = 1
    deadline_s: float | None = None
    hash_ids: tuple[int, ...] | None = None
    extra: dict[str, object] = field(default_factory=dict, compare=False, hash=False)
    max_tokens: int | None = None

    def with_arrival(self, arrival_s: float) -> TraceRequest:
        return replace(self, arrival_s=arrival_s)


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
