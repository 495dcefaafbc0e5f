"""The per-request result record: what a simulated run and a live replay both write.

Times are seconds from the start of the workload (a live replay's start; a request's ``arrival_s`` is
its scheduled send time). ``status`` takes the values of :class:`core.outcomes.Status`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields


@dataclass(slots=True)
class RequestRecord:
    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int  # tokens actually generated
    status: str = "ok"  # ok | rejected | error | cancelled
    reason: str = ""
    dispatch_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None  # the last token
    preemptions: int = 0
    backend: str = ""
    cached_tokens: int = 0
    predicted_mean: float | None = None
    tenant: str = "default"
    deadline_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # every token-bearing chunk (live replay)
    sent_s: float | None = None  # live: when the request actually left (arrival_s is when it should have)
    first_byte_s: float | None = None  # live: response headers received
    http_status: int | None = None
    error_kind: str = ""  # e.g. timeout, connect, http_500, incomplete (empty when ok)
    warmup: bool = False  # sent to warm the system, left out of the summary

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def ttlt(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot(self) -> float | None:
        if self.finish_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def queue_s(self) -> float | None:
        return None if self.dispatch_s is None else self.dispatch_s - self.arrival_s

    @property
    def lateness(self) -> float | None:
        """How late the request left against its schedule (live replay only)."""
        return None if self.sent_s is None else self.sent_s - self.arrival_s

    def itls(self) -> list[float]:
        """Gaps between consecutive token chunks."""
        c = self.chunk_times
        return [b - a for a, b in itertools.pairwise(c)]


_FIELDS = frozenset(f.name for f in fields(RequestRecord))


def record_from_dict(obj: dict[str, object]) -> RequestRecord:
    """A record from its dict form; keys this version does not know are ignored, missing ones default."""
    return RequestRecord(**{k: v for k, v in obj.items() if k in _FIELDS})  # type: ignore[arg-type]
