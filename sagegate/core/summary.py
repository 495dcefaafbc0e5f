"""Headline figures over a run's records (counts, latency percentiles, throughput, goodput).

Pure statistics shared by the simulator, the replay client and the benchmarks.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from sagegate.core.record import RequestRecord


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency objectives a request must all meet to count towards goodput (None = no objective)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    ttlt_s: float | None = None

    @property
    def empty(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None and self.ttlt_s is None

    def met(self, r: RequestRecord) -> bool:
        if r.status != "ok" or r.finish_s is None:
            return False
        checks = ((self.ttft_s, r.ttft), (self.tpot_s, r.tpot), (self.ttlt_s, r.ttlt))
        return all(limit is None or value is None or value <= limit for limit, value in checks)


def _stats(values: Sequence[float], prefix: str, quantiles: Iterable[int] = (50, 90, 99)) -> dict[str, float]:
    if not values:
        out = {f"{prefix}_mean_s": math.nan}
        out.update({f"{prefix}_p{q}_s": math.nan for q in quantiles})
        return out
    arr = np.asarray(values, dtype=float)
    out = {f"{prefix}_mean_s": float(arr.mean())}
    qs = list(quantiles)
    # One call for every quantile: numpy's overhead is per call.
    for q, v in zip(qs, np.percentile(arr, qs).tolist(), strict=True):
        out[f"{prefix}_p{q}_s"] = v
    return out


def measured(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The records that count: warm-up requests left out."""
    return [r for r in records if not r.warmup]


def mark_warmup(records: Iterable[RequestRecord], warmup_s: float) -> None:
    """Flag the requests that arrived in the first ``warmup_s`` seconds."""
    for r in records:
        r.warmup = r.arrival_s < warmup_s


def loaded_throughput(records: Sequence[RequestRecord]) -> float:
    """Output tokens a second between the 10th and the 90th percentile of completions: the loaded
    window, without the ramp and the drain (how ``harness.simtwin.capacity`` reads capacity). The
    makespan figure beside it (``throughput_tok_s``) is set by the last few requests of a finite run."""
    done = sorted((r for r in records if r.status == "ok" and r.finish_s is not None), key=_finish)
    if len(done) < 10:
        return math.nan
    lo, hi = int(0.1 * len(done)), int(0.9 * len(done))
    span = _finish(done[hi]) - _finish(done[lo])
    return sum(r.output_tokens for r in done[lo + 1 : hi + 1]) / max(span, 1e-9)


def _finish(r: RequestRecord) -> float:
    return r.finish_s if r.finish_s is not None else math.inf


def summarize(records: Sequence[RequestRecord], slo: Slo | None = None) -> dict[str, float]:
    """Headline figures over the measured (non-warm-up) records: counts, TTFT/TPOT/TTLT mean and
    percentiles, ITL when chunk times were recorded, throughput, preemptions, goodput under ``slo``,
    and the replay client's own send lateness when send times were recorded."""
    records = measured(records)
    done = [r for r in records if r.status == "ok" and r.finish_s is not None]
    out: dict[str, float] = {
        "requests": float(len(records)),
        "completed": float(len(done)),
        "rejected": float(sum(r.status == "rejected" for r in records)),
        "errors": float(sum(r.status == "error" for r in records)),
    }
    out.update(_stats([r.ttft for r in done if r.ttft is not None], "ttft"))
    out.update(_stats([r.tpot for r in done if r.tpot is not None], "tpot"))
    if any(r.chunk_times for r in done):
        out.update(_stats([g for r in done for g in r.itls()], "itl"))
    out.update(_stats([r.ttlt for r in done if r.ttlt is not None], "ttlt"))
    out.update(_stats([r.queue_s for r in done if r.queue_s is not None], "queue", (50, 99)))
    span = 0.0
    if done:
        start = min(r.arrival_s for r in records)
        end = max(r.finish_s for r in done if r.finish_s is not None)
        span = max(end - start, 1e-9)
        tokens = sum(r.output_tokens for r in done)
        out["throughput_tok_s"] = tokens / span
        out["loaded_tok_s"] = loaded_throughput(done)
        out["throughput_req_s"] = len(done) / span
        out["makespan_s"] = span
    else:
        out["throughput_tok_s"] = out["throughput_req_s"] = out["makespan_s"] = 0.0
        out["loaded_tok_s"] = math.nan
    if slo is not None and not slo.empty:
        good = [r for r in done if slo.met(r)]
        out["slo_attainment"] = len(good) / len(records) if records else math.nan
        out["goodput_req_s"] = len(good) / span if span else 0.0
        out["goodput_tok_s"] = sum(r.output_tokens for r in good) / span if span else 0.0
    out["preemptions"] = float(sum(r.preemptions for r in records))
    if any(r.cached_tokens for r in done):  # the simulator knows its engines' prefix hits
        out["prefix_hit_rate"] = sum(r.cached_tokens for r in done) / max(
            1, sum(r.prompt_tokens for r in done)
        )
    with_deadline = [r for r in records if r.deadline_s is not None]
    if with_deadline:
        late = sum(1 for r in with_deadline if r.finish_s is None or r.finish_s > (r.deadline_s or 0.0))
        out["deadline_violation_rate"] = late / len(with_deadline)
    lateness = [r.lateness for r in records if r.lateness is not None]
    if lateness:
        arr = np.asarray(lateness, dtype=float)
        out["send_lateness_p50_s"] = float(np.percentile(arr, 50))
        out["send_lateness_p99_s"] = float(np.percentile(arr, 99))
        out["send_lateness_max_s"] = float(arr.max())
    return out


def errors_by_kind(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Failed and rejected measured requests by kind: ``error_kind``, else ``reason``, else status."""
    kinds = Counter(
        r.error_kind or r.reason or r.status for r in measured(records) if r.status not in ("ok",)
    )
    return dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
