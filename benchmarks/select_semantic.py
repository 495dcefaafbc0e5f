"""Re-choose the semantic predictor's hyperparameters for the served vectors, on validation only.

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks select_semantic [--encoder tuned-onnx] \
        [--from previous|default] [--rounds 2] [--params floor dense_weight ...] [--jobs 2]

The defaults of :class:`predictor.semantic.SemanticConfig` were tuned on the stock encoder's vectors; the
shipped encoder tune changes what a cosine means (e.g. lower cosines between unrelated prompts). This
replays ShareGPT through the predictor as in ``bench_ranker.py`` and moves one field at a time over a
small grid (coordinate ascent, ``--rounds`` passes), keeping a move when it raises Kendall tau-b on the
**validation span**: warm on the first 6,000 pairs (those a shipped part learned from), scored from
6,000 to 90% of the file; the replay stops at 90%, so the tail is never read while choosing. Then each
changed field goes back to its starting value where that costs less than ``--keep-gain`` on validation
(a change worth noise is not worth shipping). Only then is the tail (first 90% warm, the last 10%
scored, the LTR protocol) replayed, for the starting point and the chosen configuration side by side,
with a paired bootstrap, and ``--young`` windows of 1,000 pairs each replayed from an empty history
(the demo's regime, which the choice never saw). ``--from previous`` starts from the defaults before
the re-choice and reproduces the shipped values (docs/journal/BENCHMARKS.md, *The predictor re-tuned
for the shipped vectors*). Deterministic (every refit inline).
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from benchmarks.bench_ranker import SHAREGPT
from sagegate.predictor.evaluate import EvalItem, load_items, replay_semantic
from sagegate.predictor.evaluate import score as score_replay
from sagegate.predictor.semantic import SemanticConfig
from sagegate.study.stats import bootstrap_indices
from tools.vectors import encoder_vectors

GRID: dict[str, tuple[Any, ...]] = {
    "floor": (0.0, 0.02, 0.05, 0.1, 0.15),
    "dense_weight": (0.1, 0.2, 0.3, 0.5, 0.7),
    "temperature": (0.05, 0.07, 0.1, 0.15, 0.2),
    "length_scale": (0.5, 1.0, 2.0, 0.0),
    "k": (30, 50, 100, 200),
    "min_neighbours": (1, 3, 5),
    "prior_weight": (0.25, 0.5, 1.0, 2.0),
    "probe_weight": (0.0, 0.15, 0.3, 0.45),
    "head_weight": (0.0, 0.1, 0.15, 0.25, 0.35),
    "repeat_weight": (0.5, 0.75, 0.9),
}
"""Each field's candidates (the current default is among them)."""

PREVIOUS = SemanticConfig(dense_weight=0.2, temperature=0.1, prior_weight=0.5, head_weight=0.15)
"""The defaults before this re-choice (tuned on the stock encoder): ``--from previous`` starts there."""

WARM = 6000
SPLIT = 0.9
YOUNG = 1000

_ITEMS: list[EvalItem] = []
_VECS = np.zeros((0, 384), dtype=np.float32)
_VERSION = ""


def _init(items: list[EvalItem], vecs: np.ndarray, version: str) -> None:
    global _ITEMS, _VECS, _VERSION
    _ITEMS, _VECS, _VERSION = items, vecs, version


Span = tuple[SemanticConfig, int, int, int]
"""``(config, first, warm, stop)``: replay items ``[first, stop)`` from an empty history and score
those from ``warm`` on (``first == warm``: a young window, every prediction scored)."""


def _replay(span: Span) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Predicted means, 10/50/90% quantiles and true lengths of the scored items of ``span``."""
    cfg, first, warm, stop = span
    items = _ITEMS[first:stop]
    res = replay_semantic(items, _VECS[first:stop], warm - first, cfg, embed_version=_VERSION)
    return res.means, res.quants, np.array([it.output_tokens for it in items[warm - first :]], dtype=float)


def _tau(span: Span) -> tuple[float, float]:
    """Tau-b and 10–90% coverage of the scored items of ``span``."""
    r = score_replay(*_replay(span))
    return r["kendall_tau"], r["coverage_10_90"]


def paired_bootstrap(
    a: np.ndarray, b: np.ndarray, truth: np.ndarray, resamples: int = 1000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Tau-b of ``a`` and of ``b`` against ``truth`` on the same resamples of the items."""
    idx = bootstrap_indices(truth.size, resamples, seed)
    ta = np.array([stats.kendalltau(a[i], truth[i], variant="b").statistic for i in idx])
    tb = np.array([stats.kendalltau(b[i], truth[i], variant="b").statistic for i in idx])
    return ta, tb


def _parse(kv: str) -> tuple[str, Any]:
    name, _, value = kv.partition("=")
    if name not in GRID:
        raise SystemExit(f"--start: {name!r} is not one of {', '.join(GRID)}")
    return name, type(getattr(SemanticConfig(), name))(value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sharegpt", type=Path, default=SHAREGPT)
    ap.add_argument("--encoder", default="tuned-onnx")
    ap.add_argument("--params", nargs="*", default=list(GRID), choices=list(GRID))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep-gain", type=float, default=0.0005, help="a change kept must be worth this much")
    ap.add_argument("--from", dest="origin", choices=("default", "previous"), default="default")
    ap.add_argument(
        "--young",
        type=int,
        nargs="*",
        default=[6000, 8000],
        help="also replay 1,000 pairs from here, from empty",
    )
    ap.add_argument("--start", nargs="*", default=[], metavar="FIELD=VALUE", help="start from these values")
    args = ap.parse_args()

    items = load_items(args.sharegpt)
    vecs, version = encoder_vectors(items, args.encoder)
    split = int(SPLIT * len(items))
    print(
        f"{len(items)} items, encoder {args.encoder} ({version}); validation [{WARM}, {split}), tail [{split}, end)"
    )
    with ProcessPoolExecutor(args.jobs, initializer=_init, initargs=(items, vecs, version)) as pool:
        origin = PREVIOUS if args.origin == "previous" else SemanticConfig()
        best = replace(origin, **dict(_parse(kv) for kv in args.start))
        best_tau, _ = pool.submit(_tau, (best, 0, WARM, split)).result()
        print(f"start: validation tau-b {best_tau:.4f}", flush=True)
        for rnd in range(args.rounds):
            moved = False
            for name in args.params:
                cands = [v for v in GRID[name] if v != getattr(best, name)]
                cfgs = [replace(best, **{name: v}) for v in cands]
                results = list(pool.map(_tau, [(c, 0, WARM, split) for c in cfgs]))
                line = "  ".join(f"{v}: {t:.4f}" for v, (t, _) in zip(cands, results, strict=True))
                print(
                    f"round {rnd + 1} {name:<14} (now {getattr(best, name)}: {best_tau:.4f})  {line}",
                    flush=True,
                )
                i = int(np.argmax([t for t, _ in results]))
                if results[i][0] > best_tau:
                    best, best_tau, moved = cfgs[i], results[i][0], True
                    print(f"  -> {name} = {cands[i]}", flush=True)
            if not moved:
                break
        for name in [n for n in GRID if getattr(best, n) != getattr(origin, n)]:
            back = replace(best, **{name: getattr(origin, name)})
            tau, _ = pool.submit(_tau, (back, 0, WARM, split)).result()
            kept = tau < best_tau - args.keep_gain
            print(
                f"prune {name:<14} back to {getattr(back, name)}: {tau:.4f} ({'kept' if kept else 'reverted'})"
            )
            if not kept:
                best, best_tau = back, tau
        changed = {n: getattr(best, n) for n in GRID if getattr(best, n) != getattr(origin, n)}
        print(f"chosen on validation: {changed or 'the starting point'} (validation tau-b {best_tau:.4f})")
        rows = [(args.origin, origin), ("chosen", best)]
        tails = list(pool.map(_replay, [(c, 0, split, len(items)) for _, c in rows]))
        young = {a: list(pool.map(_tau, [(c, a, a, a + YOUNG) for _, c in rows])) for a in args.young}
    for (label, _), tail in zip(rows, tails, strict=True):
        r = score_replay(*tail)
        print(
            f"tail (first 90% warm, {len(items) - split} scored) {label:<8} tau-b {r['kendall_tau']:.4f}"
            f"  coverage {r['coverage_10_90']:.3f}"
        )
    for a, cells in young.items():
        row = "  ".join(f"{label} {t:.4f} ({c:.3f})" for (label, _), (t, c) in zip(rows, cells, strict=True))
        print(f"young history: pairs {a}..{a + YOUNG} from an empty history, tau-b (coverage)  {row}")
    ta, tb = paired_bootstrap(tails[0][0], tails[1][0], tails[0][2])
    print(
        f"tail bootstrap (1,000 resamples): {args.origin} sd {ta.std():.4f}, chosen sd {tb.std():.4f}; "
        f"chosen - {args.origin} {np.mean(tb - ta):+.4f} (sd {np.std(tb - ta):.4f}, positive in "
        f"{np.mean(tb > ta):.0%}); chosen >= 0.48 in {np.mean(tb >= 0.48):.0%}"
    )


if __name__ == "__main__":
    main()
