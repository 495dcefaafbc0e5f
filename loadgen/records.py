"""The canonical request record every reader produces and every driver (simulator, replay client) consumes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload, as a trace describes it.

    ``arrival_s`` is seconds from the start of the workload. ``output_tokens`` is the true output length
    (what a replay sends as ``max_tokens`` with ``ignore_eos``). ``hash_ids`` names the prompt's prefix
    blocks (Mooncake: one id per 512 tokens; equal ids mean equal content).
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
