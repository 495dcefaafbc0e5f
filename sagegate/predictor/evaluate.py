"""Online, time-ordered replay of a prompt/length dataset through a length predictor.

The first ``history`` items only become history; every later item is predicted from the items before it
and then added. Scores: Kendall's tau-b and Spearman's rho between predicted mean and true length, the
mean absolute error of log length (log of the predicted mean), pinball loss at the 10th/50th/90th
percentiles, coverage of the 10–90% interval, and the share of each path taken. The ``global`` and
``length-bucket`` baselines run over the same replay.

Embeddings of a dataset are cached under ``~/.cache/sagegate`` (``SAGEGATE_CACHE``), keyed by a hash of
the embedder version and the texts: embedding ShareGPT's 11k prompts takes minutes on two cores.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from sagegate.core.predictor import InlinePredictor
from sagegate.core.request import PredictionQuery
from sagegate.predictor.baselines import GlobalPredictor, LengthBucketPredictor
from sagegate.predictor.embedder import EMBED_VERSION, PromptLike, TextEmbedder, flatten_prompt
from sagegate.predictor.history import WindowBounds
from sagegate.predictor.memory_store import MemoryStore
from sagegate.predictor.semantic import SemanticConfig, SemanticPredictor, inline_config

QUANTILES = (0.1, 0.5, 0.9)


@dataclass(frozen=True, slots=True)
class EvalItem:
    prompt: PromptLike
    prompt_tokens: int
    output_tokens: int
    arrival_s: float


def load_items(path: str | Path, limit: int | None = None) -> list[EvalItem]:
    """JSONL (optionally gzip) of ``{prompt, output_tokens[, prompt_tokens, arrival_s]}``; the ShareGPT
    pairs' ``prompt_tokens_cl100k``/``response_tokens_cl100k`` are understood too. Sorted by arrival
    (stable: file order when there is none)."""
    opener: Callable[..., Any] = gzip.open if str(path).endswith(".gz") else open
    items: list[EvalItem] = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for line_no, line in enumerate(fh):
            if not line.strip():
                continue
            row = json.loads(line)
            prompt = row.get("prompt", row.get("messages"))
            out = row.get("output_tokens", row.get("response_tokens_cl100k"))
            if prompt is None or out is None:
                raise ValueError(f"{path}:{line_no + 1}: needs 'prompt' and 'output_tokens'")
            pt = row.get("prompt_tokens", row.get("prompt_tokens_cl100k"))
            if pt is None:
                pt = estimate_tokens(flatten_prompt(prompt))
            items.append(
                EvalItem(prompt, max(1, int(pt)), max(1, int(out)), float(row.get("arrival_s", line_no)))
            )
            if limit is not None and len(items) >= limit:
                break
    items.sort(key=lambda it: it.arrival_s)
    return items


MAX_DEFAULT_HISTORY = 6000
DEFAULT_HISTORY_SHARE = 0.9


def default_history(n: int) -> int:
    """The warm-history length when none is given: 90% of the items, at most 6,000, so a small file
    still leaves a tenth of itself to score and the full ShareGPT pairs keep their usual 6,000."""
    return min(MAX_DEFAULT_HISTORY, int(DEFAULT_HISTORY_SHARE * n))


def estimate_tokens(text: str) -> int:
    """About four characters per token (English, cl100k); only when a dataset gives no count."""
    return max(1, round(len(text) / 4))


# --- embeddings ---------------------------------------------------------------------------------
def cache_dir() -> Path:
    return Path(os.environ.get("SAGEGATE_CACHE", Path.home() / ".cache" / "sagegate"))


def embed_cached(texts: Sequence[str], embedder: TextEmbedder, use_cache: bool = True) -> np.ndarray:
    digest = hashlib.sha256(getattr(embedder, "version", EMBED_VERSION).encode())
    for t in texts:
        digest.update(hashlib.sha256(t.encode("utf-8", "surrogatepass")).digest())
    path = cache_dir() / f"embeddings-{digest.hexdigest()[:20]}.npy"
    if use_cache and path.exists():
        vecs = np.load(path)
        if vecs.shape == (len(texts), embedder.dim):
            return vecs
    vecs = embedder.embed(list(texts))
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, vecs)
        tmp.replace(path)
    return vecs


# --- scoring ------------------------------------------------------------------------------------
def score(means: np.ndarray, quants: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """``quants``: one row per item, the predicted 10th/50th/90th percentiles."""
    tau = stats.kendalltau(means, truth, variant="b").statistic
    rho = stats.spearmanr(means, truth).statistic
    out = {
        "kendall_tau": _finite(tau),
        "spearman": _finite(rho),
        "mae_log": float(np.mean(np.abs(np.log(np.maximum(means, 1.0)) - np.log(truth)))),
        "coverage_10_90": float(np.mean((quants[:, 0] <= truth) & (truth <= quants[:, 2]))),
    }
    for j, q in enumerate(QUANTILES):
        diff = truth - quants[:, j]
        out[f"pinball_{round(q * 100)}"] = float(np.mean(np.maximum(q * diff, (q - 1) * diff)))
    return out


def _finite(x: float) -> float:
    return float(x) if x is not None and math.isfinite(x) else 0.0


@dataclass(frozen=True)
class ReplayResult:
    means: np.ndarray
    quants: np.ndarray
    paths: Counter[str]


def replay_semantic(
    items: Sequence[EvalItem],
    vecs: np.ndarray,
    history: int,
    config: SemanticConfig | None = None,
    embed_version: str = EMBED_VERSION,
) -> ReplayResult:
    """Replay through a fresh in-process :class:`SemanticPredictor` on a simulated clock;
    ``embed_version`` names the encoder that made ``vecs`` (it picks the shipped prior)."""
    cfg = replace(
        inline_config(config), bounds=WindowBounds(max_entries=max(len(items), 1), max_age_s=math.inf)
    )
    now = [0.0]
    pred = SemanticPredictor(
        embedder=_NoEmbedder(embed_version),
        store=MemoryStore(cfg.bounds, retain=False),
        config=cfg,
        clock=lambda: now[0],
    )
    texts = [flatten_prompt(it.prompt) for it in items]
    means, quants, paths = [], [], Counter[str]()
    for i, it in enumerate(items):
        now[0] = it.arrival_s
        feats = pred.features_from(vecs[i], texts[i])
        if i >= history:
            p = pred.predict_features(feats, it.prompt_tokens)
            means.append(p.mean)
            quants.append([p.distribution.quantile(q) for q in QUANTILES])
            paths[p.path] += 1
        pred.record_features(feats, it.prompt_tokens, it.output_tokens, ts=it.arrival_s, rid=str(i))
    return ReplayResult(np.array(means), np.array(quants, dtype=float).reshape(-1, 3), paths)


def replay_baseline(items: Sequence[EvalItem], history: int, predictor: InlinePredictor) -> ReplayResult:
    means, quants = [], []
    for i, it in enumerate(items):
        req = PredictionQuery(rid=i, prompt_tokens=it.prompt_tokens)
        if i >= history:
            d = predictor.predict_inline(req)
            means.append(d.mean)
            quants.append([d.quantile(q) for q in QUANTILES])
        predictor.observe_inline(req, it.output_tokens)
    return ReplayResult(np.array(means), np.array(quants, dtype=float).reshape(-1, 3), Counter())


def evaluate(
    items: Sequence[EvalItem],
    history: int,
    embedder: TextEmbedder,
    config: SemanticConfig | None = None,
    use_cache: bool = True,
) -> dict[str, Any]:
    """The full report as one flat dict (what ``--json`` prints)."""
    if history >= len(items):
        raise ValueError(f"history ({history}) leaves nothing to score among {len(items)} items")
    truth = np.array([it.output_tokens for it in items[history:]], dtype=float)
    t0 = time.perf_counter()
    vecs = embed_cached([flatten_prompt(it.prompt) for it in items], embedder, use_cache)
    t1 = time.perf_counter()
    version = getattr(embedder, "version", EMBED_VERSION)
    sem = replay_semantic(items, vecs, history, config, embed_version=version)
    t2 = time.perf_counter()
    report: dict[str, Any] = {"n": int(truth.size), "history": history}
    report["scored_learned"] = learned_among(items[history:])
    report.update(score(sem.means, sem.quants, truth))
    n = max(1, sum(sem.paths.values()))
    report["paths"] = {p: sem.paths.get(p, 0) / n for p in ("semantic", "bucket", "global", "cold")}
    for name, base in (("global", GlobalPredictor()), ("length_bucket", LengthBucketPredictor())):
        res = replay_baseline(items, history, base)
        for key, value in score(res.means, res.quants, truth).items():
            report[f"baseline_{name}_{'tau' if key == 'kendall_tau' else key}"] = value
    report["embed_seconds"] = round(t1 - t0, 2)
    report["replay_ms_per_item"] = round(1000 * (t2 - t1) / len(items), 3)
    return report


def learned_among(items: Sequence[EvalItem]) -> int:
    """How many of ``items`` a shipped part of the predictor learned from (a score over them is
    in-sample; the ShareGPT file's first 6,000 pairs are)."""
    from sagegate.core.request import prompt_digest
    from sagegate.predictor.learned import learned_prompts

    learned = learned_prompts()
    return sum(prompt_digest(flatten_prompt(it.prompt)) in learned for it in items)


class _NoEmbedder:
    """Stands in for the model during replays: every vector is precomputed."""

    dim = 384

    def __init__(self, version: str = EMBED_VERSION) -> None:
        self.version = version

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise RuntimeError("replays use precomputed embeddings")


def format_report(r: dict[str, Any]) -> str:
    rows = [("semantic", ""), ("global", "baseline_global_"), ("length-bucket", "baseline_length_bucket_")]
    keys = ("kendall_tau", "spearman", "mae_log", "pinball_10", "pinball_50", "pinball_90", "coverage_10_90")
    lines = [
        f"n={r['n']} scored after {r['history']} warm; embeddings {r['embed_seconds']} s, "
        f"replay {r['replay_ms_per_item']} ms/item"
        + (f"; embedder {r['embed_version']}" if "embed_version" in r else "")
    ]
    lines.append(f"{'predictor':<14}" + "".join(f"{k:>16}" for k in keys))
    for label, prefix in rows:
        vals = []
        for k in keys:
            key = f"{prefix}tau" if prefix and k == "kendall_tau" else f"{prefix}{k}"
            vals.append(f"{r[key]:>16.4f}")
        lines.append(f"{label:<14}" + "".join(vals))
    lines.append("paths: " + ", ".join(f"{p} {share:.1%}" for p, share in r["paths"].items()))
    if r.get("scored_learned"):
        lines.append(
            f"note: {r['scored_learned']} of the {r['n']} scored prompts were learned by a shipped part of"
            " the predictor (the encoder tune, the priors): that part of the score is in-sample"
        )
    return "\n".join(lines)
