"""Fit an opt-in encoder's shipped projection to 384 dimensions (``predictor/data/projection_mpnet.npz``).

    HF_HUB_OFFLINE=1 .venv/bin/python -m tools.make_projection --vectors tuned.npy [--first 6000]
        [--pairs FILE] [--out PATH]

``--vectors``: the ShareGPT pairs' unit vectors from the tuned encoder, in file order (at least the
first ``--first``), as ``python -m tools.make_encoder_tune --model-dir DIR --vectors-out`` writes them. A PCA fitted on the *first*
``--first`` only (the pairs the tune and the ranking prior learned from; the replays behind RESULTS.md
and docs/journal/BENCHMARKS.md score none of them): the mean and the leading 384 components, float32,
and the digests of the prompts it was fitted on (``trained_on``). Costs 0.002–0.005 of tau-b in the
ridge probe (docs/journal/BENCHMARKS.md, *A second encoder*), so that the index, the online head and
the history take the wider encoder unchanged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from sagegate.core.request import prompt_digest
from sagegate.predictor.embedder import flatten_prompt
from sagegate.predictor.encoders import DIM, MPNET
from sagegate.predictor.evaluate import load_items

REPO = Path(__file__).resolve().parents[1]

SHAREGPT = REPO.parent / "shared" / "data" / "sharegpt" / "sharegpt_v3_first_turn_pairs.jsonl.gz"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vectors", type=Path, required=True)
    ap.add_argument("--pairs", type=Path, default=SHAREGPT)
    ap.add_argument("--first", type=int, default=6000)
    ap.add_argument("--out", type=Path, default=MPNET.projection)
    args = ap.parse_args()
    vecs = np.load(args.vectors)
    items = load_items(args.pairs)
    if len(vecs) < args.first:
        sys.exit(f"{args.vectors} holds {len(vecs)} vectors, fewer than --first {args.first}")
    fit = vecs[: args.first].astype(np.float64)
    mean = fit.mean(0)
    _, sv, vt = np.linalg.svd(fit - mean, full_matrices=False)
    kept = float((sv[:DIM] ** 2).sum() / (sv**2).sum())
    np.savez_compressed(
        args.out,
        mean=mean.astype(np.float32),
        components=vt[:DIM].T.astype(np.float32),
        trained_on=np.array(
            sorted({prompt_digest(flatten_prompt(it.prompt)) for it in items[: args.first]}), dtype=np.uint64
        ),
        source=np.str_(f"ShareGPT V3 first-turn pairs, first {args.first} in file order"),
    )
    print(f"wrote {args.out}: {vecs.shape[1]} -> {DIM}, {kept:.3f} of the variance kept")


if __name__ == "__main__":
    main()
