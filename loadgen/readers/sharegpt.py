"""ShareGPT first-turn pairs: gzip JSON lines with ``prompt``, ``prompt_tokens_cl100k`` and
``response_tokens_cl100k`` (plus ``id``, char/word counts and ``n_turns``, kept in ``extra``).

The pairs carry real prompt text but no timestamps, so arrivals come from the caller: either
``arrivals_from`` (e.g. another trace's arrival times; pairs beyond its length are not read) or a
seeded arrival process at ``rate`` req/s (Poisson, or gamma with ``cv``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from core.request import TraceRequest
from loadgen.readers.common import ReadStats, TraceFormatError, iter_json_lines, json_tokens

REQUIRED = ("prompt", "prompt_tokens_cl100k", "response_tokens_cl100k")
_EXTRA = ("id", "n_turns", "prompt_chars", "response_chars", "response_words")


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
    if (arrivals_from is None) == (rate is None):
        raise ValueError("sharegpt pairs have no timestamps: pass exactly one of rate= or arrivals_from=")
    cap = limit
    if arrivals_from is not None:
        cap = len(arrivals_from) if cap is None else min(cap, len(arrivals_from))
    pairs: list[tuple[str, int, int, dict[str, object]]] = []
    for lineno, obj in iter_json_lines(path):
        if cap is not None and len(pairs) >= cap:
            break
        missing = [k for k in REQUIRED if k not in obj]
        if missing:
            raise TraceFormatError(path, lineno, f"missing key(s) {missing}")
        prompt = obj["prompt"]
        if not isinstance(prompt, str):
            raise TraceFormatError(path, lineno, f"prompt must be a string, got {type(prompt).__name__}")
        try:
            p = json_tokens(obj["prompt_tokens_cl100k"], "prompt_tokens_cl100k")
            o = json_tokens(obj["response_tokens_cl100k"], "response_tokens_cl100k")
        except ValueError as exc:
            raise TraceFormatError(path, lineno, str(exc)) from None
        stats.rows += 1
        if p == 0 or o == 0:
            stats.dropped_zero_tokens += 1
            continue
        pairs.append((prompt, p, o, {k: obj[k] for k in _EXTRA if k in obj}))
    if arrivals_from is not None:
        times = [float(t) for t in arrivals_from[: len(pairs)]]
        if not all(math.isfinite(t) for t in times):
            raise ValueError("arrivals_from holds a non-finite time")
    else:
        import numpy as np

        from loadgen.synthetic import arrival_times

        assert rate is not None
        rng = np.random.default_rng(seed)
        times = arrival_times(len(pairs), rate=rate, arrival=arrival, cv=cv, rng=rng).tolist()
    return [
        TraceRequest(arrival_s=t, prompt_tokens=p, output_tokens=o, prompt=text, extra=extra)
        for t, (text, p, o, extra) in zip(times, pairs, strict=True)
    ]
