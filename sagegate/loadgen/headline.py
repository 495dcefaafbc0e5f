"""The demo's headline: per run, the figures a user of this field reads (goodput at a stated SLO, TTFT
p50/p90, TTLT mean/p50/p99/max, throughput over the loaded window and over the makespan, the engines'
prefix hit rate, preemptions); over several draws, each set-up's figures and one set-up's ratio to each
baseline, as a mean with its range. Pure: records and counters in, numbers and a table out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sagegate.core.record import RequestRecord
from sagegate.core.summary import Slo, measured, summarize


@dataclass(frozen=True, slots=True)
class Figure:
    key: str
    label: str
    higher_is_better: bool
    fmt: str = "{:.2f}"


FIGURES: tuple[Figure, ...] = (
    Figure("goodput_req_s", "goodput (req/s in SLO)", True),
    Figure("slo_attainment", "share in SLO", True),
    Figure("ttft_p50_s", "TTFT p50 (s)", False, "{:.3f}"),
    Figure("ttft_p90_s", "TTFT p90 (s)", False, "{:.3f}"),
    Figure("ttlt_mean_s", "TTLT mean (s)", False),
    Figure("ttlt_p50_s", "TTLT p50 (s)", False),
    Figure("ttlt_p99_s", "TTLT p99 (s)", False),
    Figure("ttlt_max_s", "TTLT max (s)", False),
    Figure("loaded_tok_s", "tok/s, loaded window", True, "{:.0f}"),
    Figure("throughput_tok_s", "tok/s, makespan", True, "{:.0f}"),
    Figure("prefix_hit_rate", "prefix hit rate", True, "{:.3f}"),
    Figure("preemptions", "preemptions", False, "{:.0f}"),
    Figure("completed", "completed", True, "{:.0f}"),
)
"""What the table shows, in order (the figures' keys in :func:`run_figures`)."""


def run_figures(
    records: Sequence[RequestRecord], counters: Mapping[str, float] | None, slo: Slo
) -> dict[str, float]:
    """One run's figures. Hit rate and preemptions are the engines' own counters over the run (a client
    cannot see either); without counters (the simulator) the records' own."""
    out = summarize(records, slo)
    done = [r.ttlt for r in measured(records) if r.status == "ok" and r.ttlt is not None]
    out["ttlt_max_s"] = max(done) if done else math.nan
    if counters is not None:
        queries = counters.get("prefix_queries", 0.0)
        out["prefix_hit_rate"] = counters.get("prefix_hits", 0.0) / queries if queries else math.nan
        out["preemptions"] = counters.get("preemptions", math.nan)
    out.setdefault("prefix_hit_rate", 0.0)
    return out


@dataclass(frozen=True, slots=True)
class Spread:
    """A figure over draws: its mean, lowest and highest."""

    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        vals = [v for v in values if not math.isnan(v)]
        if not vals:
            return cls(math.nan, math.nan, math.nan)
        return cls(sum(vals) / len(vals), min(vals), max(vals))

    def show(self, fmt: str) -> str:
        if math.isnan(self.mean):
            return "—"
        if fmt.format(self.low) == fmt.format(self.high):
            return fmt.format(self.mean)
        return f"{fmt.format(self.mean)} ({fmt.format(self.low)}–{fmt.format(self.high)})"


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def ratios(
    runs: Mapping[str, Sequence[Mapping[str, float]]], subject: str, baseline: str
) -> dict[str, Spread]:
    """``subject`` ÷ ``baseline`` per figure, draw by draw (the same requests), as a spread."""
    pairs = list(zip(runs[subject], runs[baseline], strict=True))
    return {f.key: Spread.of([ratio(s.get(f.key, math.nan), b.get(f.key, math.nan)) for s, b in pairs])
            for f in FIGURES}  # fmt: skip


def headline(
    runs: Mapping[str, Sequence[Mapping[str, float]]], subject: str, baselines: Sequence[str]
) -> dict[str, object]:
    """Every set-up's figures (spread over draws) and ``subject``'s ratios to each of ``baselines``."""
    return {
        "figures": {
            name: {f.key: Spread.of([d.get(f.key, math.nan) for d in draws]) for f in FIGURES}
            for name, draws in runs.items()
        },
        "ratios": {b: ratios(runs, subject, b) for b in baselines if b in runs},
    }


def render_headline(
    runs: Mapping[str, Sequence[Mapping[str, float]]], subject: str, baselines: Sequence[str], title: str
) -> None:
    """The table: one row per figure (↑ higher is better, ↓ lower), a column per set-up, then
    ``subject`` ÷ each baseline (headed ``÷ baseline``)."""
    from rich.console import Console
    from rich.table import Table

    head = headline(runs, subject, baselines)
    figs, rats = head["figures"], head["ratios"]
    assert isinstance(figs, dict) and isinstance(rats, dict)
    table = Table(title=title, title_justify="left")
    table.add_column("figure", no_wrap=True)
    for name in runs:
        table.add_column(name, justify="right")
    for b in rats:
        table.add_column(f"÷ {b}", justify="right")
    for f in FIGURES:
        cells = [figs[name][f.key].show(f.fmt) for name in runs]
        cells += [rats[b][f.key].show("{:.2f}") for b in rats]
        table.add_row(f.label + (" ↑" if f.higher_is_better else " ↓"), *cells)
    Console(width=160).print(table)


def under_predicted(
    subject: Sequence[RequestRecord], baseline: Sequence[RequestRecord]
) -> dict[str, float] | None:
    """What the requests a predictor under-estimated most cost: the long ones (output at or above the
    90th percentile) predicted at under half their length, their mean TTLT in ``subject`` and in
    ``baseline`` (the same requests, by ``rid``), and the slowest one's TTFT and TTLT in each.
    None when no request qualifies."""
    done = [r for r in measured(subject) if r.status == "ok" and r.ttlt is not None]
    if not done:
        return None
    lengths = sorted(r.output_tokens for r in done)
    long_from = lengths[int(0.9 * (len(lengths) - 1))]
    base = {r.rid: r for r in baseline if r.status == "ok" and r.ttlt is not None}
    missed = [
        r for r in done
        if r.output_tokens >= long_from and r.predicted_mean is not None
        and r.predicted_mean < r.output_tokens / 2 and r.rid in base
    ]  # fmt: skip
    if not missed:
        return None
    worst = max(missed, key=lambda r: r.ttlt or 0.0)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {
        "n": float(len(missed)),
        "ttlt_gateway_s": mean([r.ttlt or 0.0 for r in missed]),
        "ttlt_baseline_s": mean([base[r.rid].ttlt or 0.0 for r in missed]),
        "worst_ttft_gateway_s": worst.ttft if worst.ttft is not None else math.nan,
        "worst_ttft_baseline_s": base[worst.rid].ttft or math.nan,
        "worst_ttlt_gateway_s": worst.ttlt or 0.0,
        "worst_ttlt_baseline_s": base[worst.rid].ttlt or 0.0,
    }
