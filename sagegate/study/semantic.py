"""The ``semantic`` predictor for sources with prompt text, precomputed outside the simulation loop.

Embedding prompts is far slower than simulating them, so each window's distributions are computed
once in the driver (batched, each distinct prompt embedded once) and handed to every cell of that
window as a ``PrecomputedPredictor``; they are also logged per (window, request) so a resumed run
embeds nothing it has already predicted.

The predictor is warmed, before any window is predicted, with completed requests that lie in no
window: for a paired source (``study.textsource``) its held-out ShareGPT pairs (a seeded split
disjoint from every window's pairs), else the source's rows outside every window (those nearest the
end of the trace). It never learns from a window, so no request's own outcome is in its history, and
every window sees the same history. The predictor's synchronous core (``features_many`` /
``record_features`` / ``predict_features``) is used directly, with a fixed clock, so the answers
depend neither on wall time nor on request ids shared between windows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sagegate.core.request import TraceRequest
from sagegate.study.config import SourceSpec, StudyConfig
from sagegate.study.windows import Window, predicted_outputs

if TYPE_CHECKING:
    from sagegate.core.distribution import LengthDistribution

Dists = Mapping[int, "LengthDistribution"]


def history_rows(rows: Sequence[TraceRequest], windows: Sequence[Window], history: int) -> list[TraceRequest]:
    """Valid rows with text outside every window, at most ``history`` of them, in trace order."""
    inside: set[int] = set()
    for w in windows:
        inside.update(range(w.start_row, w.start_row + len(w.requests)))
    free = [r for i, r in enumerate(rows) if i not in inside and r.prompt]
    return free[-history:] if history and len(free) > history else free


def history_for(
    spec: SourceSpec, rows: Sequence[TraceRequest], windows: Sequence[Window], cfg: StudyConfig
) -> list[TraceRequest]:
    """The requests that warm the predictor for ``spec``'s windows (see the module docstring)."""
    if spec.fmt == "paired-sharegpt":
        from sagegate.study.textsource import held_out

        return held_out(spec.name, spec.opts(), cfg.seed)[: cfg.semantic_history]
    return history_rows(rows, windows, cfg.semantic_history)


def history_note(spec: SourceSpec, cfg: StudyConfig) -> str:
    """One sentence saying what warmed the predictor for ``spec`` (for the report)."""
    if spec.fmt == "paired-sharegpt":
        return (
            f"`{spec.name}`: {cfg.semantic_history} of the ShareGPT pairs held out by the source's seeded "
            "split (disjoint from every pair a window can draw)"
        )
    return (
        f"`{spec.name}`: the last {cfg.semantic_history} rows with text outside every window (fewer if "
        "the source has fewer)"
    )


def semantic_distributions(
    history: Sequence[TraceRequest],
    windows: Sequence[Window],
    *,
    embedder: Any = None,
    config: str = "default",
) -> dict[str, dict[int, LengthDistribution]]:
    """Window id → (rid → predicted distribution) for the windows with prompt text, the predictor warmed
    with ``history`` (completed requests with text). ``embedder`` (a ``TextEmbedder``) defaults to the
    predictor's MiniLM model (loaded here, offline); ``config`` names its hyperparameters
    (``predictor.semantic.NAMED_CONFIGS``)."""
    todo = [w for w in windows if w.has_text]
    if not todo:
        return {}
    try:
        from sagegate.predictor.semantic import NAMED_CONFIGS, SemanticPredictor, inline_config
    except ImportError as exc:  # pragma: no cover - depends on the optional predictor
        raise RuntimeError(f"the semantic predictor is not available: {exc}") from exc

    cfg = inline_config(NAMED_CONFIGS[config])  # refits inline: every run predicts the same
    pred = SemanticPredictor(embedder=embedder, config=cfg, clock=lambda: 0.0)
    try:
        past = [r for r in history if r.prompt]
        feats = _features(pred, [r.prompt or "" for r in past])
        for i, (r, f) in enumerate(zip(past, feats, strict=True)):
            pred.record_features(
                f, r.prompt_tokens, r.output_tokens, tenant=r.tenant, rid=f"hist-{i}", ts=0.0
            )
        wf = _features(pred, [r.prompt or "" for w in todo for r in w.requests])
        out: dict[str, dict[int, LengthDistribution]] = {}
        at = 0
        for w in todo:
            out[w.id] = {
                r.rid: pred.predict_features(f, r.prompt_tokens).distribution
                for r, f in zip(w.requests, wf[at : at + len(w.requests)], strict=True)
            }
            at += len(w.requests)
        return out
    finally:
        pred.close()


def _features(pred: Any, texts: Sequence[str]) -> list[Any]:
    """Features of ``texts``, each distinct text embedded once (a paired source repeats prompts)."""
    distinct = list(dict.fromkeys(texts))
    feats = dict(zip(distinct, pred.features_many(distinct), strict=True))
    return [feats[t] for t in texts]


# --- the per-(window, request) log -----------------------------------------------------------------
class PredictionLog:
    """``OUT/semantic.jsonl``: one line per window with each request's predicted distribution, its true
    output and the noisy oracle's point prediction at the main error (for the report's error table)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, dict[int, LengthDistribution]]:
        from sagegate.core.distribution import LengthDistribution

        out: dict[str, dict[int, LengthDistribution]] = {}
        for rec in self.records():
            out[rec["window"]] = {
                int(rid): LengthDistribution(tuple(int(x) for x in s), tuple(float(p) for p in q))
                for rid, s, q in zip(rec["rids"], rec["support"], rec["probs"], strict=True)
            }
        return out

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def append(self, windows: Iterable[Window], dists: Mapping[str, Dists], error: float) -> None:
        with self.path.open("a") as fh:
            for w in windows:
                if w.id not in dists:
                    continue
                d = dists[w.id]
                rec = {
                    "window": w.id,
                    "rids": [r.rid for r in w.requests],
                    "support": [list(d[r.rid].support) for r in w.requests],
                    "probs": [list(d[r.rid].probs) for r in w.requests],
                    "true": [r.output_tokens for r in w.requests],
                    "noisy": predicted_outputs(w.requests, w.seed, error),
                }
                fh.write(json.dumps(rec) + "\n")
            fh.flush()


def prediction_quality(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per source: median |predicted mean − true| / true, the share within a factor of 2, and Spearman's
    rho between predicted and true length, for the semantic means and the noisy oracle's points."""
    import numpy as np

    from sagegate.study.stats import spearman_rho

    by_src: dict[str, dict[str, list[float]]] = {}
    for rec in records:
        src = str(rec["window"]).rpartition("/")[0]
        acc = by_src.setdefault(src, {"true": [], "semantic": [], "noisy": []})
        acc["true"] += [float(x) for x in rec["true"]]
        acc["noisy"] += [float(x) for x in rec["noisy"]]
        acc["semantic"] += [
            math.fsum(o * p for o, p in zip(s, q, strict=True))
            for s, q in zip(rec["support"], rec["probs"], strict=True)
        ]
    out: dict[str, dict[str, float]] = {}
    for src, acc in by_src.items():
        true = np.asarray(acc["true"])
        row: dict[str, float] = {"requests": float(true.size)}
        for name in ("semantic", "noisy"):
            est = np.asarray(acc[name])
            ratio = est / true
            row[f"{name}_mare"] = float(np.median(np.abs(est - true) / true))
            row[f"{name}_within2"] = float(np.mean((ratio >= 0.5) & (ratio <= 2.0)))
            row[f"{name}_rho"] = spearman_rho(est, true)
        out[src] = row
    return out
