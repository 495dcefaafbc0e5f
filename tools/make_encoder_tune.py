"""Train the encoder's shipped length tune (``predictor/data/encoder_tune.npz``) offline on ShareGPT pairs.

    HF_HUB_OFFLINE=1 .venv/bin/python -m tools.make_encoder_tune [--pairs FILE] [--train 5400]
        [--select 6000] [--epochs 4] [--lr 5e-4] [--rank 16] [--alpha 32] [--threads 2] [--out PATH]
        [--teacher mpnet --distill 100]

The shipped file: ``--teacher mpnet --distill 100`` (after ``sagegate predictor fetch-encoder mpnet``).

A rank-``--rank`` low-rank change (LoRA, written out here: no extra dependency) on the 36 linear
layers of the stock all-MiniLM-L6-v2, trained jointly with a linear head over the mean-pooled unit
embedding: squared error on the standardised log response length plus an in-batch pairwise
(RankNet) loss, on the *first* ``--train`` pairs in file order; the epoch kept is the best by Kendall
tau-b on pairs ``--train``..``--select`` (never on anything later). The model reads exactly what the
served embedder reads (its 64-piece head+tail window). The head is dropped: what ships is the change
to the encoder, which the kNN, the online head and the shipped prior then use as before.

``trained_on`` lists the digest of every prompt among the first ``--select`` (6,000: the same pairs
the shipped ranking prior was fitted on), so that replays judging the predictor leave them out and the
replays behind RESULTS.md and docs/journal/BENCHMARKS.md (warm on the first 6,000 or 90%, scored after)
score none of those pairs (later verbatim repeats of their prompts remain: 412 of the 5,128 after
6,000, 74 of the last 1,113).
With ``--teacher``, a third loss distils a larger encoder into MiniLM: the squared gap between the
batch's cosine similarities and the teacher's (the teacher as the gateway serves it, ONNX int8 and
projected; its vectors of the training pairs only), so MiniLM's neighbours move toward the ones the
larger encoder finds, at MiniLM's cost per prompt. About 100–200 s per epoch on two threads here. Then
refit the tuned prior:
``python -m tools.make_ranker_prior --encoder tuned``.

``--model-dir`` runs the same recipe on another mean-pooled encoder (BERT or MPNet layer names; an
experiment, written to ``--out``, never over the shipped file), reading the same window text through
its own tokenizer (``--pieces`` of them); ``--vectors-out`` writes every pair's vector from the kept
epoch, for ``python -m benchmarks bench_alt_embedder --vectors``. all-mpnet-base-v2
(docs/journal/BENCHMARKS.md, *A second encoder*): ``--model-dir DIR --pieces 80 --epochs 3``, ~10 min
per epoch on two threads.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from sagegate.core.request import prompt_digest
from sagegate.predictor.embedder import MiniLMEmbedder, flatten_prompt, model_dir
from sagegate.predictor.encoder_tune import TUNE_PATH
from sagegate.predictor.encoders import DEFAULT_ENCODER, ENCODERS
from sagegate.predictor.evaluate import load_items
from tools.vectors import encoder_vectors

REPO = Path(__file__).resolve().parents[1]

SHAREGPT = REPO.parent / "shared" / "data" / "sharegpt" / "sharegpt_v3_first_turn_pairs.jsonl.gz"
TARGETS = (
    "attention.self.query",  # BERT (MiniLM)
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "attention.attn.q",  # MPNet (--model-dir all-mpnet-base-v2)
    "attention.attn.k",
    "attention.attn.v",
    "attention.attn.o",
    "intermediate.dense",
    "output.dense",
)


def add_lora(model: Any, rank: int, alpha: float) -> dict[str, Any]:
    """Freeze ``model`` and wrap each target linear layer with a trainable low-rank change."""
    import torch

    class LoRALinear(torch.nn.Module):
        def __init__(self, base: torch.nn.Linear) -> None:
            super().__init__()
            self.base, self.scale = base, alpha / rank
            self.lora_A = torch.nn.Parameter(torch.empty(rank, base.in_features))
            torch.nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            self.lora_B = torch.nn.Parameter(
                torch.zeros(base.out_features, rank)
            )  # starts as the stock model

        def forward(self, x: Any) -> Any:
            return self.base(x) + self.scale * ((x @ self.lora_A.t()) @ self.lora_B.t())

    for p in model.parameters():
        p.requires_grad_(False)
    names = [
        n
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and n.startswith("encoder.layer.") and n.endswith(TARGETS)
    ]
    wrapped = {}
    for name in names:
        parent, child = name.rsplit(".", 1)
        layer = LoRALinear(getattr(model.get_submodule(parent), child))
        setattr(model.get_submodule(parent), child, layer)
        wrapped[name] = layer
    return wrapped


def batch_of(ids: list[np.ndarray]) -> tuple[Any, Any]:
    import torch

    width = max(len(i) for i in ids)
    out, mask = torch.zeros(len(ids), width, dtype=torch.long), torch.zeros(len(ids), width, dtype=torch.long)
    for row, i in enumerate(ids):
        out[row, : len(i)], mask[row, : len(i)] = torch.from_numpy(i.astype(np.int64)), 1
    return out, mask


def pooled(model: Any, ids: Any, mask: Any) -> Any:
    import torch

    hidden = model(input_ids=ids, attention_mask=mask)[0]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1).clamp(min=1), dim=1)


def vectors(model: Any, ids: list[np.ndarray], batch: int = 64) -> np.ndarray:
    import torch

    model.eval()
    out = np.empty((len(ids), model.config.hidden_size), dtype=np.float32)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    with torch.inference_mode():
        for at in range(0, len(order), batch):
            rows = order[at : at + batch]
            out[rows] = pooled(model, *batch_of([ids[i] for i in rows])).numpy()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=Path, default=SHAREGPT)
    ap.add_argument("--train", type=int, default=5400)
    ap.add_argument("--select", type=int, default=6000)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--head-lr", type=float, default=1e-3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=TUNE_PATH)
    ap.add_argument(
        "--model-dir",
        help="another mean-pooled encoder's folder (an experiment: only MiniLM's tune ships); needs --out",
    )
    ap.add_argument("--pieces", type=int, default=64, help="the encoder's word pieces (MiniLM's window: 64)")
    ap.add_argument("--vectors-out", type=Path, help="also write every pair's vector from the kept epoch")
    ap.add_argument(
        "--teacher",
        choices=sorted(set(ENCODERS) - {DEFAULT_ENCODER}),
        help="a larger encoder, as the gateway serves it (ONNX int8, projected; its weights fetched): adds "
        "a loss pulling the in-batch cosine similarities toward the teacher's, which is what the kNN reads",
    )
    ap.add_argument("--distill", type=float, default=0.0, help="the weight of --teacher's loss")
    args = ap.parse_args()
    if (args.teacher is None) != (args.distill == 0.0):
        ap.error("--teacher and --distill go together")
    if args.teacher and args.model_dir:
        ap.error("--teacher distils into MiniLM only")
    if args.model_dir and args.out == TUNE_PATH:
        ap.error("--model-dir needs --out: the shipped file is MiniLM's tune")
    import torch
    import transformers

    torch.manual_seed(args.seed)
    every = load_items(args.pairs)
    items = every[: args.select]
    ruler = MiniLMEmbedder(quantize=False, tuned=False)  # the served window (and MiniLM's tokenizer)
    tok = ruler.tokenizer
    path = args.model_dir or model_dir()
    if args.model_dir:
        tok = transformers.AutoTokenizer.from_pretrained(path)
    torch.set_num_threads(args.threads)  # after the ruler loads: it sets its own (one)
    ids = [
        np.array(
            tok([ruler.fit_text(flatten_prompt(it.prompt))], truncation=True, max_length=args.pieces)[
                "input_ids"
            ][0]
        )
        for it in (every if args.vectors_out else items)
    ]
    y = np.log(np.array([it.output_tokens for it in items], dtype=np.float64))
    train, pick = np.arange(args.train), np.arange(args.train, len(items))
    mu, sd = float(y[train].mean()), float(y[train].std())
    z = torch.tensor((y - mu) / sd, dtype=torch.float32)
    teacher, teacher_version = None, ""
    if args.teacher is not None:
        t_vecs, teacher_version = encoder_vectors(items[: args.train], args.teacher)  # as served, cached
        teacher = torch.nn.functional.normalize(torch.from_numpy(t_vecs.astype(np.float32)), dim=1)

    model = transformers.AutoModel.from_pretrained(path, local_files_only=True)
    wrapped = add_lora(model, args.rank, args.alpha)
    dim = model.config.hidden_size
    head = torch.nn.Linear(dim, 1)
    base = vectors(model, [ids[i] for i in train])  # the head starts as a ridge fit on the stock vectors
    centred = base - base.mean(0)
    w = np.linalg.solve(
        centred.T @ centred + 30.0 * np.eye(dim), centred.T @ (z.numpy()[train] - z[train].mean().item())
    )
    with torch.no_grad():
        head.weight.copy_(torch.tensor(w, dtype=torch.float32)[None])
        head.bias.fill_(float(z[train].mean() - base.mean(0) @ w))
    lora = [p for layer in wrapped.values() for p in (layer.lora_A, layer.lora_B)]
    opt = torch.optim.AdamW(
        [
            {"params": lora, "lr": args.lr, "weight_decay": 0.01},
            {"params": head.parameters(), "lr": args.head_lr, "weight_decay": 0.0},
        ]
    )
    steps = -(-args.train // args.batch) * args.epochs
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / (steps - warm)))
    )

    def pick_tau() -> float:
        with torch.no_grad():
            p = head(torch.from_numpy(vectors(model, [ids[i] for i in pick]))).squeeze(1).numpy()
        return float(stats.kendalltau(p, y[pick], variant="b").statistic)

    best: tuple[float, int, dict[str, np.ndarray]] = (pick_tau(), 0, {})
    print(json.dumps({"epoch": 0, "select_tau": round(best[0], 4)}), flush=True)
    gen = np.random.default_rng(args.seed)
    for epoch in range(1, args.epochs + 1):
        model.train()
        t0 = time.perf_counter()
        perm = gen.permutation(args.train)
        for at in range(0, args.train, args.batch):
            rows = perm[at : at + args.batch]
            v = pooled(model, *batch_of([ids[i] for i in rows]))
            p = head(v).squeeze(1)
            t = z[rows]
            pair = (t[:, None] - t[None, :]) > 0
            rank = torch.nn.functional.softplus(-(p[:, None] - p[None, :])[pair]).mean()
            loss = torch.mean((p - t) ** 2) + rank
            if teacher is not None:  # similarity-preserving: the neighbours' structure, not the axes
                tv = teacher[torch.from_numpy(rows)]
                off = ~torch.eye(len(rows), dtype=torch.bool)
                loss = loss + args.distill * torch.mean(((v @ v.t()) - (tv @ tv.t()))[off] ** 2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        tau = pick_tau()
        print(
            json.dumps(
                {"epoch": epoch, "select_tau": round(tau, 4), "train_s": round(time.perf_counter() - t0)}
            ),
            flush=True,
        )
        if tau > best[0]:
            state = {}
            for name, layer in wrapped.items():
                state[name + ".lora_A"] = layer.lora_A.detach().numpy().astype(np.float16)
                state[name + ".lora_B"] = layer.lora_B.detach().numpy().astype(np.float16)
            best = (tau, epoch, state)
    tau, epoch, state = best
    if not state:
        raise SystemExit("no epoch beat the stock encoder on the selection pairs: nothing written")
    np.savez(
        args.out,
        **state,
        scale=np.float32(args.alpha / args.rank),
        rank=np.int64(args.rank),
        window=np.int64(64),
        pieces=np.int64(args.pieces),
        epoch=np.int64(epoch),
        teacher=np.str_(teacher_version),
        distill=np.float32(args.distill),
        trained_on=np.array(
            sorted({prompt_digest(flatten_prompt(it.prompt)) for it in items}), dtype=np.uint64
        ),
    )
    print(f"wrote {args.out} (epoch {epoch}, selection tau-b {tau:.4f}, {args.out.stat().st_size} bytes)")
    if args.vectors_out:  # every pair through the kept epoch's change, as stored (float16)
        with torch.no_grad():
            for name, layer in wrapped.items():
                layer.lora_A.copy_(torch.from_numpy(state[name + ".lora_A"].astype(np.float32)))
                layer.lora_B.copy_(torch.from_numpy(state[name + ".lora_B"].astype(np.float32)))
        np.save(args.vectors_out, vectors(model, ids))
        print(f"wrote {args.vectors_out} ({len(ids)} vectors)")


if __name__ == "__main__":
    main()
