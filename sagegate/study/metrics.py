"""Per-cell metrics (the list of docs/design/study.md plus mean TTLT), computed from the per-request records.

A latency metric is undefined (NaN) when no request finished; it is never imputed. Jain's index is
undefined with fewer than two tenants.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sagegate.core.record import RequestRecord
from sagegate.core.request import TraceRequest


@dataclass(frozen=True)
class Metric:
    name: str
    higher_is_better: bool
    label: str


METRICS: tuple[Metric, ...] = (
    Metric("anwg", True, "ANWG (weighted goodput / arrivals)"),
    Metric("completion", True, "completion fraction"),
    Metric("violation", False, "deadline-violation rate"),
    Metric("ttlt_mean", False, "mean TTLT (s)"),
    Metric("ttlt_p50", False, "p50 TTLT (s)"),
    Metric("ttlt_p95", False, "p95 TTLT (s)"),
    Metric("ttlt_p99", False, "p99 TTLT (s)"),
    Metric("ttft_mean", False, "mean TTFT (s)"),
    Metric("ttft_p95", False, "p95 TTFT (s)"),
    Metric("tpot_mean", False, "mean TPOT (s)"),
    Metric("throughput_req", True, "request throughput (req/s)"),
    Metric("throughput_tok", True, "output-token throughput (tok/s)"),
    Metric("preemptions", False, "preemptions"),
    Metric("jain", True, "Jain's fairness over tenants"),
)
METRIC_NAMES: tuple[str, ...] = tuple(m.name for m in METRICS)
HIGHER_IS_BETTER: dict[str, bool] = {m.name: m.higher_is_better for m in METRICS}
LABELS: dict[str, str] = {m.name: m.label for m in METRICS}


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index ``(Σx)² / (n·Σx²)``: 1 when all equal, 1/n when one takes all.

    NaN with fewer than two values; 1 when every value is zero (nobody is favoured).
    """
    if len(values) < 2:
        return math.nan
    arr = np.asarray(values, dtype=float)
    sq = float((arr * arr).sum())
    if sq == 0.0:
        return 1.0
    return float(arr.sum() ** 2 / (len(arr) * sq))


def _met(rec: RequestRecord) -> bool:
    return rec.finish_s is not None and rec.deadline_s is not None and rec.finish_s <= rec.deadline_s


def cell_metrics(
    workload: Sequence[TraceRequest], records: Sequence[RequestRecord], preemptions: int
) -> dict[str, float]:
    """Every metric of one run; ``records`` are in the workload's order (the simulator's output).

    * ANWG: priority weight of requests finished by their deadline / weight of all arrivals.
    * violation: share of requests with a deadline that finished late or never.
    * throughput: completed requests (output tokens) / time from first arrival to last completion.
    * jain: over tenants, of each tenant's goodput share (its requests finished by the deadline / its
      requests), so a policy that meets one tenant's deadlines at another's expense scores low.
    """
    weight = {r.rid: float(r.priority) for r in workload}
    total_w = sum(weight.values())
    done = [r for r in records if r.status == "ok" and r.finish_s is not None]
    met_w = sum(weight[r.rid] for r in records if _met(r))
    with_deadline = [r for r in records if r.deadline_s is not None]
    out: dict[str, float] = {
        "anwg": met_w / total_w if total_w > 0 else math.nan,
        "completion": len(done) / len(records) if records else math.nan,
        "violation": (
            sum(not _met(r) for r in with_deadline) / len(with_deadline) if with_deadline else math.nan
        ),
    }
    ttlt = [r.finish_s - r.arrival_s for r in done if r.finish_s is not None]
    ttft = [r.first_token_s - r.arrival_s for r in done if r.first_token_s is not None]
    tpot = [t for t in (r.tpot for r in done) if t is not None]
    out.update(_quantiles("ttlt", ttlt, (50, 95, 99)))
    out.update(_quantiles("ttft", ttft, (95,)))
    out["tpot_mean"] = float(np.mean(tpot)) if tpot else math.nan
    if done:
        start = min(r.arrival_s for r in records)
        span = max(max(ttl for ttl in (r.finish_s for r in done) if ttl is not None) - start, 1e-9)
        out["throughput_req"] = len(done) / span
        out["throughput_tok"] = sum(r.output_tokens for r in done) / span
    else:
        out["throughput_req"] = out["throughput_tok"] = 0.0
    out["preemptions"] = float(preemptions)
    out["jain"] = jain_index(_tenant_goodput(records))
    return {name: out[name] for name in METRIC_NAMES}


def _quantiles(prefix: str, values: Sequence[float], qs: Sequence[int]) -> dict[str, float]:
    if not values:
        return {f"{prefix}_mean": math.nan, **{f"{prefix}_p{q}": math.nan for q in qs}}
    arr = np.asarray(values, dtype=float)
    out = {f"{prefix}_mean": float(arr.mean())}
    for q in qs:
        out[f"{prefix}_p{q}"] = float(np.percentile(arr, q))
    return out


def _tenant_goodput(records: Sequence[RequestRecord]) -> list[float]:
    count: dict[str, int] = defaultdict(int)
    met: dict[str, int] = defaultdict(int)
    for r in records:
        count[r.tenant] += 1
        met[r.tenant] += _met(r)
    return [met[t] / count[t] for t in sorted(count)]
