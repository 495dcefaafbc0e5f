"""PNG figures of replay and simulation results (matplotlib, Agg backend, no display needed).

* latency CDFs (TTFT, TPOT, ITL, TTLT), several runs overlaid;
* TTFT of each request against its arrival time, over the queue depth polled from ``/metrics``;
* predicted against actual output length, when records carry a prediction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sagegate.core.record import RequestRecord
from sagegate.core.summary import measured

QueueSamples = Sequence[tuple[float, float]]


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _done(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    return [r for r in measured(records) if r.status == "ok" and r.finish_s is not None]


def latency_values(records: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """TTFT, TPOT, ITL and TTLT samples of the completed measured requests (seconds)."""
    done = _done(records)
    return {
        "TTFT": [r.ttft for r in done if r.ttft is not None],
        "TPOT": [r.tpot for r in done if r.tpot is not None],
        "ITL": [g for r in done for g in r.itls()],
        "TTLT": [r.ttlt for r in done if r.ttlt is not None],
    }


def plot_latency_cdfs(runs: Mapping[str, Sequence[RequestRecord]], path: str | Path) -> Path:
    """One panel per latency (log-scale x), one line per run."""
    plt = _plt()
    values = {name: latency_values(recs) for name, recs in runs.items()}
    metrics = [m for m in ("TTFT", "TPOT", "ITL", "TTLT") if any(v[m] for v in values.values())]
    metrics = metrics or ["TTFT"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.6), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        for name, v in values.items():
            xs = np.sort(np.asarray(v[metric], dtype=float))
            if xs.size:
                ax.plot(xs, np.arange(1, xs.size + 1) / xs.size, label=name)
        ax.set_xscale("symlog", linthresh=1e-3)
        ax.set_xlabel(f"{metric} (s)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    return _save(fig, path)


def plot_timeline(
    records: Sequence[RequestRecord], path: str | Path, queue: QueueSamples | None = None, title: str = ""
) -> Path:
    """TTFT of each request at its arrival time (failures marked), and the queue depth below it."""
    plt = _plt()
    rows = 2 if queue else 1
    fig, axes = plt.subplots(rows, 1, figsize=(9, 3.2 * rows), sharex=True, squeeze=False)
    ax = axes[0][0]
    done = _done(records)
    ax.scatter([r.arrival_s for r in done], [r.ttft for r in done], s=6, label="TTFT")
    failed = [r for r in measured(records) if r.status != "ok"]
    if failed:
        ax.scatter(
            [r.arrival_s for r in failed], [0.0] * len(failed), s=10, marker="x", c="red", label="failed"
        )
    ax.set_ylabel("TTFT (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    if queue:
        qx = axes[1][0]
        ts, vs = zip(*queue, strict=True)
        qx.step(ts, vs, where="post")
        qx.set_ylabel("queue depth")
        qx.grid(alpha=0.3)
    axes[-1][0].set_xlabel("time since start (s)")
    fig.tight_layout()
    return _save(fig, path)


def prediction_accuracy(records: Sequence[RequestRecord]) -> dict[str, float] | None:
    """Kendall tau-b between predicted mean and generated length over completed requests, and the
    median relative error of the mean; None when nothing was predicted."""
    from scipy.stats import kendalltau

    pts = [(r.predicted_mean, r.output_tokens) for r in _done(records) if r.predicted_mean is not None]
    if len(pts) < 2:
        return None
    pred, actual = (np.asarray(v, dtype=float) for v in zip(*pts, strict=True))
    tau = float(kendalltau(pred, actual).statistic)
    rel = float(np.median(np.abs(pred - actual) / np.maximum(actual, 1.0)))
    return {"kendall_tau": tau, "median_rel_error": rel, "n": float(len(pts))}


def plot_predicted_vs_actual(records: Sequence[RequestRecord], path: str | Path) -> Path | None:
    """Scatter of predicted mean against generated length (log-log), titled with the rank correlation
    and median relative error; None when nothing was predicted."""
    pts = [(r.predicted_mean, r.output_tokens) for r in _done(records) if r.predicted_mean is not None]
    if not pts:
        return None
    plt = _plt()
    pred, actual = (np.asarray(v, dtype=float) for v in zip(*pts, strict=True))
    fig, ax = plt.subplots(figsize=(4.8, 4.5))
    acc = prediction_accuracy(records)
    if acc is not None:
        ax.set_title(
            f"Kendall tau {acc['kendall_tau']:.2f}, median error {acc['median_rel_error']:.0%} "
            f"(n={acc['n']:.0f})",
            fontsize="small",
        )
    ax.scatter(actual, pred, s=6, alpha=0.6)
    lo = max(1.0, float(min(pred.min(), actual.min())))
    hi = float(max(pred.max(), actual.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="perfect")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("actual output tokens")
    ax.set_ylabel("predicted mean output tokens")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def plot_backends(
    series: Mapping[str, Sequence[Any]], path: str | Path, queue: QueueSamples | None = None, title: str = ""
) -> Path:
    """Per backend, KV in use and waiting requests over time (samples with ``t``, ``kv``, ``waiting``),
    with the gateway's queue depth beside them when given."""
    plt = _plt()
    fig, axes = plt.subplots(2, 1, figsize=(8, 5), sharex=True, squeeze=False)
    kv_ax, wait_ax = axes[0][0], axes[1][0]
    for name, samples in series.items():
        if samples:
            kv_ax.plot([s.t for s in samples], [100 * s.kv for s in samples], lw=1, label=name)
            wait_ax.step([s.t for s in samples], [s.waiting for s in samples], where="post", lw=1, label=name)
    if queue:
        ts, vs = zip(*queue, strict=True)
        wait_ax.step(ts, vs, where="post", lw=1.2, color="black", label="gateway queue")
    kv_ax.set_ylabel("KV in use (%)")
    kv_ax.set_ylim(0, 105)
    wait_ax.set_ylabel("waiting requests")
    wait_ax.set_xlabel("time since start (s, engine time)")
    for ax in (kv_ax, wait_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    if title:
        kv_ax.set_title(title)
    fig.tight_layout()
    return _save(fig, path)


def read_queue_samples(results_path: str | Path) -> list[tuple[float, float]]:
    """The queue-depth samples from a results file's ``.meta.json`` sidecar (empty when absent)."""
    meta = Path(str(results_path) + ".meta.json")
    if not meta.is_file():
        return []
    data = json.loads(meta.read_text())
    return [(float(t), float(v)) for t, v in data.get("queue_samples") or []]


def plot_runs(
    runs: Mapping[str, Sequence[RequestRecord]],
    out_dir: str | Path,
    queues: Mapping[str, QueueSamples] | None = None,
) -> list[Path]:
    """Every figure for ``runs``: one CDF figure, and per run a timeline and (if any) a prediction scatter."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [plot_latency_cdfs(runs, out / "latency_cdf.png")]
    for name, recs in runs.items():
        slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        paths.append(plot_timeline(recs, out / f"timeline_{slug}.png", (queues or {}).get(name), title=name))
        scatter = plot_predicted_vs_actual(recs, out / f"predicted_{slug}.png")
        if scatter is not None:
            paths.append(scatter)
    return paths


def _save(fig: Any, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    _plt().close(fig)
    return p


def plot_hit_rate(runs: Mapping[str, Mapping[str, Sequence[Any]]], path: str | Path, window: int = 8) -> Path:
    """Per set-up, the engines' prefix-cache hit rate over time: hits over lookups, both backends
    together, over the last ``window`` samples (samples with ``t``, ``prefix_hits``, ``prefix_queries``,
    counters read by one sampler round for every backend)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for name, series in runs.items():
        rounds = list(zip(*series.values(), strict=False))  # one sample per backend a round
        ts = [min(s.t for s in r) for r in rounds]
        hits = [sum(s.prefix_hits for s in r) for r in rounds]
        asked = [sum(s.prefix_queries for s in r) for r in rounds]
        pts = [
            (ts[i], (hits[i] - hits[i - window]) / (asked[i] - asked[i - window]))
            for i in range(window, len(rounds))
            if asked[i] > asked[i - window]
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), lw=1.2, label=name)
    ax.set_ylabel("prefix hit rate")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("time since start (s, engine time)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(fig, path)
