"""The ranking head, measured: ShareGPT's tail with a warm history, and curves on an unseen source.

    HF_HUB_OFFLINE=1 SAGEGATE_CACHE=/work/data-ext/cache .venv/bin/python -m benchmarks bench_ranker \
        [--sharegpt FILE] [--unseen /work/data-ext/codealpaca/pairs.jsonl ...] [--test 1500]

ShareGPT: the online replay of :func:`predictor.evaluate.replay_semantic` (every scored item predicted
from all before it, then added), warm on the first 6,000 (the usual protocol of
docs/journal/BENCHMARKS.md) and on the first 90% (the LTR protocol), for the previous default (kNN +
probe) and the new one (head, shipped prior, conformal spread). Unseen source (a JSONL that
``load_items`` reads; skipped when absent): the predictor after the first N ∈ {0, 100, 500, 2,000}
completions of that source, from an empty history, scores the same last ``--test`` items (frozen: no
recording while scoring); and online from an empty history (each item predicted, then recorded), the
500 predictions after the first N. Kendall tau-b (``scipy.stats.kendalltau``) of the predicted mean
against the true length, and 10–90% coverage.
``--encoder stock tuned`` (the default) runs each row over the stock all-MiniLM-L6-v2 and over the
encoder with the shipped length tune merged (``predictor.encoder_tune``), side by side in one run;
``tuned-onnx`` and ``mpnet`` add the served runtime and the opt-in encoder (:data:`ENCODERS`).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy import stats

from sagegate.predictor.embedder import flatten_prompt
from sagegate.predictor.evaluate import QUANTILES, EvalItem, _NoEmbedder, load_items, replay_semantic
from sagegate.predictor.evaluate import score as score_replay
from sagegate.predictor.history import WindowBounds
from sagegate.predictor.memory_store import MemoryStore
from sagegate.predictor.semantic import KNN_ONLY, SemanticConfig, SemanticPredictor
from tools.vectors import ENCODERS, encoder_vectors

REPO = Path(__file__).resolve().parents[1]

SHAREGPT = REPO.parent / "shared" / "data" / "sharegpt" / "sharegpt_v3_first_turn_pairs.jsonl.gz"
OLD = KNN_ONLY
NEW = SemanticConfig()
VARIANTS = {
    "previous default (kNN + probe)": OLD,
    "head, no shipped prior": replace(NEW, shipped_prior=False),
    "head + shipped prior, no repeat pull": replace(NEW, repeat_weight=0.0),
    "head + shipped prior (new default)": NEW,
    "default + conformal spread (the default until session 24)": replace(NEW, calibrate=True),
}
CURVE = (0, 100, 500, 2000)
ONLINE_SPAN = 500


def frozen_after(
    items: list[EvalItem], vecs: np.ndarray, n: int, test: int, cfg: SemanticConfig, version: str
) -> dict[str, float]:
    """Record the first ``n`` items, then score the last ``test`` without recording them."""
    cfg = replace(
        cfg,
        bounds=WindowBounds(max_entries=max(len(items), 1), max_age_s=math.inf),
        index=replace(cfg.index, background=False),
    )
    now = [0.0]
    store = MemoryStore(cfg.bounds, retain=False)
    pred = SemanticPredictor(_NoEmbedder(version), store, cfg, clock=lambda: now[0])
    texts = [flatten_prompt(it.prompt) for it in items]
    for i in range(n):
        now[0] = items[i].arrival_s
        feats = pred.features_from(vecs[i], texts[i])
        if cfg.calibrate:  # the calibrator learns from predictions it made, as in service
            pred.predict_features(feats, items[i].prompt_tokens)
        pred.record_features(
            feats, items[i].prompt_tokens, items[i].output_tokens, ts=items[i].arrival_s, rid=str(i)
        )
    means, quants = [], []
    for i in range(len(items) - test, len(items)):
        p = pred.predict_features(pred.features_from(vecs[i], texts[i]), items[i].prompt_tokens)
        means.append(p.mean)
        quants.append([p.distribution.quantile(q) for q in QUANTILES])
    truth = np.array([it.output_tokens for it in items[-test:]], dtype=float)
    q = np.array(quants, dtype=float)
    return {
        "tau": float(stats.kendalltau(means, truth, variant="b").statistic),
        "coverage": float(np.mean((q[:, 0] <= truth) & (truth <= q[:, 2]))),
    }


def sharegpt(path: Path, histories: list[float], variants: list[str], encoders: list[str]) -> None:
    items = load_items(path)
    for encoder in encoders:
        vecs, version = encoder_vectors(items, encoder)
        for h in histories:
            history = int(h * len(items)) if h < 1 else int(h)
            truth = np.array([it.output_tokens for it in items[history:]], dtype=float)
            for label, cfg in VARIANTS.items():
                if variants and not any(v in label for v in variants):
                    continue
                res = replay_semantic(items, vecs, history, cfg, embed_version=version)
                r = score_replay(res.means, res.quants, truth)
                print(
                    f"sharegpt {encoder:<10} warm {history:>5} scored {truth.size:>5} | {label:<36} "
                    f"tau-b {r['kendall_tau']:.3f}  coverage {r['coverage_10_90']:.3f}  mae_log {r['mae_log']:.3f}",
                    flush=True,
                )


def unseen(path: Path, test: int, variants: list[str], encoders: list[str]) -> None:
    if not path.exists():
        print(f"unseen source {path}: absent, skipped")
        return
    items = load_items(path)
    for encoder in encoders:
        unseen_rows(items, *encoder_vectors(items, encoder), f"{path} ({encoder} encoder)", test, variants)


def unseen_rows(
    items: list[EvalItem], vecs: np.ndarray, version: str, name: str, test: int, variants: list[str]
) -> None:
    test = min(test, len(items) - max(CURVE))
    print(f"unseen source {name}: {len(items)} items, scoring the last {test}")
    chosen = {k: v for k, v in VARIANTS.items() if not variants or any(x in k for x in variants)}
    for label, cfg in chosen.items():
        cells = [frozen_after(items, vecs, n, test, cfg, version) for n in CURVE]
        row = "  ".join(
            f"{n:>5}: {c['tau']:.3f} ({c['coverage']:.2f})" for n, c in zip(CURVE, cells, strict=True)
        )
        print(f"  {label:<36} tau-b (coverage) after  {row}", flush=True)
    print(f"  online from an empty history, tau-b (coverage) of the {ONLINE_SPAN} predictions after N:")
    truth = np.array([it.output_tokens for it in items], dtype=float)
    for label, cfg in chosen.items():
        res = replay_semantic(items, vecs, 0, cfg, embed_version=version)
        cells = []
        for n in CURVE:
            sl = slice(n, n + ONLINE_SPAN)
            r = score_replay(res.means[sl], res.quants[sl], truth[sl])
            cells.append(f"{n:>5}: {r['kendall_tau']:.3f} ({r['coverage_10_90']:.2f})")
        whole = score_replay(res.means, res.quants, truth)
        print(
            f"  {label:<36} {'  '.join(cells)}  all {len(items)}: {whole['kendall_tau']:.3f} "
            f"({whole['coverage_10_90']:.2f})",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sharegpt", type=Path, default=SHAREGPT)
    ap.add_argument("--unseen", type=Path, nargs="*", default=[Path("/work/data-ext/codealpaca/pairs.jsonl")])
    ap.add_argument("--test", type=int, default=1500)
    ap.add_argument("--skip-sharegpt", action="store_true")
    ap.add_argument("--skip-unseen", action="store_true")
    ap.add_argument("--history", type=float, nargs="*", default=[6000, 0.9], help="counts, or shares below 1")
    ap.add_argument("--variants", nargs="*", default=[], help="substrings of the variants to run (all)")
    ap.add_argument("--encoder", nargs="*", choices=ENCODERS, default=["stock", "tuned"])
    args = ap.parse_args()
    for p in [] if args.skip_unseen else args.unseen:
        unseen(p, args.test, args.variants, args.encoder)
    if not args.skip_sharegpt:
        if args.sharegpt.exists():
            sharegpt(args.sharegpt, args.history, args.variants, args.encoder)
        else:
            print(f"{args.sharegpt} absent: ShareGPT skipped")


if __name__ == "__main__":
    main()
