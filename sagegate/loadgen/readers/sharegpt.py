"""ShareGPT first-turn pairs: gzip JSON lines with ``prompt``, ``prompt_tokens_cl100k`` and
``response_tokens_cl100k`` (plus ``id``, char/word counts and ``n_turns``, kept in ``extra``).

The pairs carry real prompt text but no timestamps, so arrivals come from the caller: either
``arrivals_from`` (e.g. another trace's arrival times; pairs beyond its length are not read) or a
seeded arrival process at ``rate`` req/s (Poisson, or gamma with ``cv``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sagegate.core.request import TraceRequest
from sagegate.loadgen.readers.common import (
    ReadStats,
    attach_times,
    check_clock,
    collect_requests,
    iter_json_lines,
    json_tokens,
    require_keys,
)

REQUIRED = ("prompt", "prompt_tokens_cl100k", "response_tokens_cl100k")
_EXTRA = ("id", "n_turns", "prompt_chars", "response_chars", "response_words")


def _parse(obj: dict[str, object]) -> TraceRequest:
    """A pair as a request at time 0 (its arrival is attached once every pair is read)."""
    require_keys(obj, REQUIRED)
    prompt = obj["prompt"]
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
    return TraceRequest(
        arrival_s=0.0,
        prompt_tokens=json_tokens(obj["prompt_tokens_cl100k"], "prompt_tokens_cl100k"),
        output_tokens=json_tokens(obj["response_tokens_cl100k"], "response_tokens_cl100k"),
        prompt=prompt,
        extra={k: obj[k] for k in _EXTRA if k in obj},
    )


def read(
    path: Path,
    stats: ReadStats,
    *,
    limit: int | None = None,
    seed: int = 0,
    arrivals_from: Sequence[float] | None = None,
    rate: float | None = None,
    arrival: str = "poisson",
    cv: float = 1.0,
) -> list[TraceRequest]:
    """Pairs in file order with arrivals attached (first pair at the first arrival), not rebased."""
    check_clock(arrivals_from, rate, "sharegpt pairs")
    cap = limit
    if arrivals_from is not None:
        cap = len(arrivals_from) if cap is None else min(cap, len(arrivals_from))
    pairs = collect_requests(path, stats, iter_json_lines(path), _parse, limit=cap)
    import numpy as np

    rng = np.random.default_rng(seed)
    times = attach_times(len(pairs), arrivals_from=arrivals_from, rate=rate, arrival=arrival, cv=cv, rng=rng)
    return [pair.with_arrival(t) for t, pair in zip(times, pairs, strict=True)]
