"""Seeded synthetic workloads and arrival processes, for tests, sweeps and traces without timestamps.

Everything draws from one ``numpy.random.Generator`` built from ``seed``, so a workload is a pure
function of its arguments.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from sagegate.core.request import TraceRequest

ARRIVALS = ("poisson", "gamma")
LENGTH_DISTS = ("lognormal", "exponential", "constant")

# Nominal service time behind ``deadline_factor`` (the deadline rule of docs/design/study.md, here with
# the true output):
# deadline = arrival + factor × (PREFILL_S_PER_TOKEN · prompt + DECODE_S_PER_TOKEN · output).
PREFILL_S_PER_TOKEN = 0.0004
DECODE_S_PER_TOKEN = 0.02


def arrival_gaps(
    n: int, *, rate: float, arrival: str = "poisson", cv: float = 1.0, rng: np.random.Generator
) -> np.ndarray:
    """``n`` inter-arrival gaps with mean ``1/rate``: exponential (``poisson``) or gamma with the given
    coefficient of variation (``cv`` < 1 smoother than Poisson, > 1 burstier)."""
    if not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"rate must be a positive number of requests/s, got {rate}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if arrival == "poisson":
        return rng.exponential(1.0 / rate, n)
    if arrival == "gamma":
        if not cv > 0:
            raise ValueError(f"cv must be > 0, got {cv}")
        shape = 1.0 / (cv * cv)
        return rng.gamma(shape, 1.0 / (shape * rate), n)
    raise ValueError(f"unknown arrival process {arrival!r}; expected one of {ARRIVALS}")


def arrival_times(
    n: int, *, rate: float, arrival: str = "poisson", cv: float = 1.0, rng: np.random.Generator
) -> np.ndarray:
    """``n`` arrival times starting at 0, separated by :func:`arrival_gaps`."""
    gaps = arrival_gaps(max(n - 1, 0), rate=rate, arrival=arrival, cv=cv, rng=rng)
    return np.concatenate(([0.0], np.cumsum(gaps)))[:n]


def lengths(
    n: int, *, mean: float, dist: str = "lognormal", sigma: float = 1.0, rng: np.random.Generator
) -> np.ndarray:
    """``n`` token counts (≥ 1) with the given mean; ``sigma`` is the log-normal's shape."""
    if not mean >= 1:
        raise ValueError(f"mean length must be >= 1 token, got {mean}")
    if dist == "lognormal":
        if sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {sigma}")
        raw = rng.lognormal(math.log(mean) - sigma * sigma / 2.0, sigma, n)
    elif dist == "exponential":
        raw = rng.exponential(mean, n)
    elif dist == "constant":
        raw = np.full(n, float(mean))
    else:
        raise ValueError(f"unknown length distribution {dist!r}; expected one of {LENGTH_DISTS}")
    return np.maximum(1, np.rint(raw)).astype(np.int64)


def nominal_deadline(arrival_s: float, prompt_tokens: int, output_tokens: int, factor: float) -> float:
    """``arrival + factor × nominal service time`` (see :data:`PREFILL_S_PER_TOKEN`)."""
    return arrival_s + factor * (PREFILL_S_PER_TOKEN * prompt_tokens + DECODE_S_PER_TOKEN * output_tokens)


def synthetic_workload(
    n: int,
    *,
    rate: float,
    arrival: str = "poisson",
    cv: float = 1.0,
    prompt_mean: float = 512,
    output_mean: float = 256,
    length_dist: str = "lognormal",
    sigma: float = 1.0,
    seed: int = 0,
    tenants: int = 1,
    deadline_factor: float | None = None,
) -> list[TraceRequest]:
    """``n`` requests arriving at ``rate`` req/s from time 0, rids ``0..n-1``.

    Prompt and output lengths are independent draws from ``length_dist`` with the given means.
    With ``tenants > 1`` each request goes to a uniformly drawn ``tenant-<k>``; with one tenant it is
    ``"default"``. ``deadline_factor`` sets deadlines by :func:`nominal_deadline`.
    """
    if tenants < 1:
        raise ValueError(f"tenants must be >= 1, got {tenants}")
    if deadline_factor is not None and not deadline_factor > 0:
        raise ValueError(f"deadline_factor must be > 0, got {deadline_factor}")
    rng = np.random.default_rng(seed)
    times = arrival_times(n, rate=rate, arrival=arrival, cv=cv, rng=rng)
    prompts = lengths(n, mean=prompt_mean, dist=length_dist, sigma=sigma, rng=rng)
    outputs = lengths(n, mean=output_mean, dist=length_dist, sigma=sigma, rng=rng)
    names = ["default"] if tenants == 1 else [f"tenant-{k}" for k in range(tenants)]
    owner = rng.integers(0, tenants, n) if tenants > 1 else np.zeros(n, dtype=np.int64)
    out = []
    for i in range(n):
        t, p, o = float(times[i]), int(prompts[i]), int(outputs[i])
        out.append(
            TraceRequest(
                arrival_s=t,
                prompt_tokens=p,
                output_tokens=o,
                rid=i,
                tenant=names[int(owner[i])],
                deadline_s=None if deadline_factor is None else nominal_deadline(t, p, o, deadline_factor),
            )
        )
    return out


def shared_prefix_workload(
    *,
    rate: float,
    groups: int = 150,
    per_group: int = 5,
    system_tokens: int = 6000,
    question_tokens: int = 1200,
    output_tokens: int = 1000,
    arrival: str = "poisson",
    cv: float = 1.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """RAG- or agent-like traffic with shared system prompts, shaped like llm-d's precise-prefix
    benchmark: ``groups`` system prompts of ``system_tokens`` tokens, each sent ``per_group`` times
    with its own question of ``question_tokens``, ``output_tokens`` out; the requests in a seeded
    random order, arriving at ``rate`` req/s. Real text (``loadgen.prompts.filler_text``), so the
    shared prefix is in what a backend prefills."""
    from sagegate.loadgen.prompts import filler_text

    for name, value in (("groups", groups), ("per_group", per_group), ("output_tokens", output_tokens)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    rng = np.random.default_rng(seed)
    n = groups * per_group
    order = rng.permutation(n)
    times = arrival_times(n, rate=rate, arrival=arrival, cv=cv, rng=rng)
    systems = [filler_text(system_tokens, seed=seed * 1_000_003 + g) for g in range(groups)]
    out = []
    for i in range(n):
        k = int(order[i])
        g = k // per_group
        question = filler_text(question_tokens, seed=(seed + 1) * 7_919_000 + k)
        out.append(
            TraceRequest(
                arrival_s=float(times[i]),
                prompt_tokens=system_tokens + question_tokens,
                output_tokens=output_tokens,
                rid=i,
                prompt=systems[g] + question,
                extra={"group": g},
            )
        )
    return out


def task_outputs(
    work: list[TraceRequest], seed: int, low: int = 16, high: int = 1024, sigma: float = 0.5
) -> list[TraceRequest]:
    """``work`` (grouped by ``extra["group"]``, as :func:`shared_prefix_workload` makes it) with output
    lengths that follow the task: each group a typical length, log-uniform in ``low``-``high`` tokens,
    and each request a lognormal draw around its group's (``sigma``), at least one token. What a
    predictor keyed on the prompt's start can learn, and a router cannot use."""
    if not work:
        return work
    rng = np.random.default_rng(seed + 77)
    group = [int(r.extra["group"]) for r in work]  # type: ignore[call-overload]
    typical = np.exp(rng.uniform(math.log(low), math.log(high), 1 + max(group)))
    out = []
    for r, g in zip(work, group, strict=True):
        out.append(replace(r, output_tokens=int(max(1, round(typical[g] * rng.lognormal(0, sigma))))))
    return out
