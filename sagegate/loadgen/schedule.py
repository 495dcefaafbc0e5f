"""When each request is sent: a trace's own timestamps (optionally compressed), or new arrivals at a
target rate, cut to a duration, with a warm-up to leave out of the figures.

:func:`prepare_workload` is the one path from command-line options to a workload, shared by
``sagegate replay`` (live) and ``sagegate simulate`` so both runs see the same requests at the same
times. It is a pure function of its arguments (and the files it reads).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagegate.core.request import TraceRequest
from sagegate.loadgen.readers import ReadStats, detect_format, read_trace_with_stats, retime
from sagegate.loadgen.records import scale_rate, with_client_cap

SYNTHETIC = "synthetic"
SHARED_PREFIX = "shared-prefix"
"""A generated workload of shared system prompts (``loadgen.synthetic.shared_prefix_workload``)."""
SYNTHETIC_RATE = 10.0  # req/s when a synthetic workload is asked for without --rate
SYNTHETIC_REQUESTS = 1000


@dataclass
class Workload:
    """Requests ready to send, arrivals in seconds from 0, and what built them."""

    requests: list[TraceRequest]
    warmup_s: float = 0.0
    """Requests arriving before this are sent but left out of the summary."""
    fmt: str = ""
    stats: ReadStats | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s if self.requests else 0.0

    @property
    def measured(self) -> int:
        return sum(r.arrival_s >= self.warmup_s for r in self.requests)


def prepare_workload(
    trace: str | Path,
    fmt: str = "auto",
    *,
    limit: int | None = None,
    duration: float | None = None,
    rate_scale: float = 1.0,
    rate: float | None = None,
    arrival: str = "poisson",
    cv: float = 1.0,
    warmup: float = 0.0,
    seed: int = 0,
    prompts: str = "none",
    sharegpt: str | Path | None = None,
    exclude_prompts: frozenset[int] = frozenset(),
    requests: int = SYNTHETIC_REQUESTS,
    reader_opts: Mapping[str, Any] | None = None,
    max_tokens: int | None = None,
) -> Workload:
    """Read ``trace`` (or generate ``"synthetic"`` or ``"shared-prefix"``), time it, cut it, and attach
    prompts.

    Timing: the trace's timestamps divided by ``rate_scale``, or, with ``rate``, new arrivals at
    ``rate`` req/s (``arrival`` ``poisson`` or ``gamma`` with ``cv``; the trace's order kept).
    ``limit`` keeps the first requests of the trace; ``duration`` keeps arrivals before it;
    ``warmup`` seconds at the start are marked for exclusion. ``prompts`` is a
    :data:`loadgen.prompts.PROMPT_MODES` value (``none`` for the simulator, which needs none).
    ``reader_opts`` go to the reader (or to ``synthetic_workload``, e.g. ``prompt_mean``).
    ``max_tokens`` is the client cap of requests whose trace records none (see
    :func:`loadgen.records.with_client_cap`; outputs beyond it are cut, and a note says how many).
    """
    _check(limit=limit, duration=duration, rate_scale=rate_scale, rate=rate, warmup=warmup)
    if rate is not None and rate_scale != 1.0:
        raise ValueError("give either rate (re-time) or rate_scale (compress the trace's times), not both")
    opts = dict(reader_opts or {})
    stats: ReadStats | None = None
    notes: list[str] = []
    if str(trace) == SYNTHETIC:
        from sagegate.loadgen.synthetic import synthetic_workload

        n = requests if limit is None else min(limit, requests)
        work = synthetic_workload(n, rate=rate or SYNTHETIC_RATE, arrival=arrival, cv=cv, seed=seed, **opts)
        name = SYNTHETIC
        rate = None  # already at the asked rate
    elif str(trace) == SHARED_PREFIX:
        from sagegate.loadgen.synthetic import shared_prefix_workload

        work = shared_prefix_workload(rate=rate or 1.0, arrival=arrival, cv=cv, seed=seed, **opts)
        work = work[:limit] if limit is not None else work
        name = SHARED_PREFIX
        rate = None
    else:
        name = detect_format(trace) if fmt == "auto" else fmt
        if name in ("sharegpt", "sharegpt-sessions") and "arrivals_from" not in opts:
            opts.update(rate=rate or 1.0, arrival=arrival, cv=cv)
            if rate is None:
                what = "sessions" if name == "sharegpt-sessions" else "pairs"
                notes.append(f"ShareGPT {what} have no timestamps: Poisson arrivals at 1/s (use --rate)")
            rate = None
        if name == "servegen":
            opts.setdefault("rate_scale", rate_scale)
            if duration is not None:
                opts.setdefault("duration_s", duration)
            rate_scale = 1.0
        work, stats = read_trace_with_stats(trace, name, limit=limit, seed=seed, **opts)
        if stats.dropped_zero_tokens:
            notes.append(f"dropped {stats.dropped_zero_tokens} zero-token rows of {stats.rows}")
    if rate is not None:
        work = retime(work, rate=rate, arrival=arrival, cv=cv, seed=seed)
    elif rate_scale != 1.0:
        work = scale_rate(work, rate_scale)
    if duration is not None:
        work = [r for r in work if r.arrival_s < duration]
    if not work:
        raise ValueError(f"the workload {str(trace)!r} holds no requests (check --limit/--duration)")
    if prompts != "none":
        from sagegate.loadgen.prompts import attach_prompts

        work = attach_prompts(work, prompts, seed=seed, sharegpt=sharegpt, exclude_prompts=exclude_prompts)
    if max_tokens is not None:
        cut = sum(r.max_tokens is None and r.output_tokens > max_tokens for r in work)
        work = with_client_cap(work, max_tokens)
        if cut:
            notes.append(f"{cut} of {len(work)} outputs cut to the client cap max_tokens={max_tokens}")
    if warmup >= work[-1].arrival_s and warmup > 0:
        raise ValueError(f"warm-up {warmup}s covers the whole workload ({work[-1].arrival_s:.1f}s)")
    return Workload(requests=work, warmup_s=warmup, fmt=name, stats=stats, notes=notes)


def _check(**values: float | int | None) -> None:
    for key, value in values.items():
        if value is None:
            continue
        strict = key in ("rate_scale", "rate", "limit", "duration")
        bad = not math.isfinite(value) or (value <= 0 if strict else value < 0)
        if bad:
            raise ValueError(f"{key} must be a positive number, got {value}")


def send_times(requests: list[TraceRequest], t0: float, time_scale: float = 1.0) -> list[float]:
    """Absolute clock times at which to send each request, for a backend running ``time_scale``× fast."""
    return [t0 + r.arrival_s / time_scale for r in requests]
