"""Fit the ranking head's shipped priors (``predictor/data/ranker_prior.npz`` for the stock encoder,
``ranker_prior_tuned.npz`` for the one with the length tune) offline on ShareGPT pairs.

    HF_HUB_OFFLINE=1 .venv/bin/python -m tools.make_ranker_prior [--pairs FILE] [--first 6000]
        [--lam 300] [--pairwise-steps 60] [--encoder stock|tuned|mpnet] [--runtime onnx|torch] [--out PATH]

It reads the shared ShareGPT first-turn pairs (Apache-2.0 upstream card; ``../shared/data/sharegpt``),
embeds the prompts as the gateway serves them (int8 on ``--runtime``, ONNX by default; cached under
``SAGEGATE_CACHE``; ``mpnet``: the opt-in tuned all-mpnet-base-v2, ONNX only), and fits
:func:`predictor.ranker.fit_head` on the *first* ``--first`` pairs in file order only: the replays
behind RESULTS.md and docs/journal/BENCHMARKS.md warm on the first 6,000 and score what follows, so the
prior never saw a scored pair.
What ships is a weight vector (~1.7k numbers), not data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy import stats

from sagegate.core.request import prompt_digest
from sagegate.predictor.cues import cue_features
from sagegate.predictor.embedder import TextEmbedder, flatten_prompt
from sagegate.predictor.evaluate import EvalItem, embed_cached, load_items
from sagegate.predictor.factory import EmbedderOptions, make_embedder
from sagegate.predictor.ranker import N_FEATURES, features, fit_head
from sagegate.predictor.ranker_prior import MPNET_PRIOR_PATH, PRIOR_PATH, TUNED_PRIOR_PATH, save_prior

REPO = Path(__file__).resolve().parents[1]

SHAREGPT = REPO.parent / "shared" / "data" / "sharegpt" / "sharegpt_v3_first_turn_pairs.jsonl.gz"


def feature_matrix(items: list[EvalItem], vecs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    phi = np.zeros((len(items), N_FEATURES), dtype=np.float32)
    for i, it in enumerate(items):
        phi[i] = features(vecs[i], cue_features(flatten_prompt(it.prompt)), it.prompt_tokens)
    y = np.log(np.array([max(1, it.output_tokens) for it in items], dtype=np.float64))
    return phi, y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=Path, default=SHAREGPT)
    ap.add_argument("--first", type=int, default=6000)
    ap.add_argument("--lam", type=float, default=1000.0)
    ap.add_argument("--pairwise-steps", type=int, default=60)
    ap.add_argument("--encoder", choices=("stock", "tuned", "mpnet"), default="tuned")
    ap.add_argument("--runtime", choices=("onnx", "torch"), default="onnx")
    ap.add_argument("--out", type=Path, default=None, help="default: the shipped file of that encoder")
    args = ap.parse_args()
    out = (
        args.out or {"tuned": TUNED_PRIOR_PATH, "stock": PRIOR_PATH, "mpnet": MPNET_PRIOR_PATH}[args.encoder]
    )
    if not args.pairs.exists():
        sys.exit(f"{args.pairs} not found (the shared data folder)")
    items = load_items(args.pairs)
    embedder: TextEmbedder = make_embedder(
        EmbedderOptions(
            model="mpnet" if args.encoder == "mpnet" else "minilm",
            tuned=args.encoder != "stock",
            runtime=args.runtime,
        )
    )
    version = str(getattr(embedder, "version", "?"))
    vecs = embed_cached([flatten_prompt(it.prompt) for it in items], embedder)
    phi, y = feature_matrix(items, vecs)
    n = min(args.first, len(items))
    model = fit_head(phi[:n], y[:n], None, args.lam, args.pairwise_steps)
    tail = np.array([model.score(p) for p in phi[n:]])
    tau = stats.kendalltau(tail, y[n:], variant="b").statistic if tail.size else float("nan")
    print(
        f"fitted on {n} pairs; sigma {model.sigma:.3f}; head-alone tau-b on the {tail.size} after: {tau:.3f}"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    save_prior(
        model,
        out,
        version,
        f"ShareGPT V3 first-turn pairs, first {n} in file order",
        trained_on=[prompt_digest(flatten_prompt(it.prompt)) for it in items[:n]],
    )
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
