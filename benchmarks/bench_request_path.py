"""What a request's length costs on the gateway's path: token counting, prediction, added TTFT.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_request_path.py [--lengths 100,1000,10000,30000]
        [--reps 30] [--pairs 40] [--predictors none,semantic] [--no-gateway] [--load-rate 0]

Prompts are real text: ShareGPT first turns (``loadgen/shipped``) concatenated in a seeded order, each
prompt cut from a random place of that text to the requested length, so no two prompts share a prefix
(nothing is cached by the tokenizer, the predictor or the backend's prefix cache). For each length:

* **count ms**: ``gateway.tokens.count_prompt`` on a chat message (the gateway's count phase), median;
* **predict ms**: ``AsyncSemantic.predict`` of the semantic predictor (real MiniLM, the shipped default
  window, a history warmed with 400 ShareGPT completions), one at a time, median and p90;
* **added TTFT ms**: median TTFT through the gateway minus direct to one simulated backend (real
  processes on loopback, time scale 20, one request at a time, the order alternating within pairs),
  for each ``--predictors`` entry; with ``semantic`` also how many predictions took the ``late`` path.

``--load-rate R`` also sends an open-loop Poisson stream of 13k-token prompts at ``R`` req/s through
the semantic gateway (two backends) and prints the share of ``late`` predictions. The code measured
is the checkout the script sits in; figures are printed, nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_gateway import _warm_embedder, backend, gateway  # noqa: E402

from core.tokens import count_tokens  # noqa: E402

SHAREGPT = REPO / "loadgen" / "shipped" / "sharegpt" / "sharegpt_v3_first_turn_pairs_4000.jsonl.gz"


def sharegpt_rows() -> list[dict[str, object]]:
    with gzip.open(SHAREGPT, "rt") as fh:
        return [json.loads(line) for line in fh]


class PromptSource:
    """Prompts of about ``n`` tokens cut from random places of the concatenated ShareGPT text."""

    def __init__(self, seed: int = 0) -> None:
        texts = [str(r["prompt"]) for r in sharegpt_rows()]
        random.Random(seed).shuffle(texts)
        self.text = "\n\n".join(texts)
        self.rng = random.Random(seed + 1)
        sample = self.text[:400_000]
        self.chars_per_token = len(sample) / count_tokens(sample)

    def prompt(self, n_tokens: int) -> str:
        chars = int(n_tokens * self.chars_per_token)
        start = self.rng.randrange(0, len(self.text) - chars)
        return self.text[start : start + chars]

    def prompts(self, n_tokens: int, k: int) -> list[str]:
        return [self.prompt(n_tokens) for _ in range(k)]


def median_ms(xs: Sequence[float]) -> float:
    return statistics.median(xs) * 1000


def pct_ms(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


# --- in-process ----------------------------------------------------------------------------------
def time_counting(src: PromptSource, lengths: Sequence[int], reps: int) -> dict[int, float]:
    from gateway.tokens import count_prompt

    count_prompt([{"role": "user", "content": "warm up"}])
    out = {}
    for n in lengths:
        times = []
        for text in src.prompts(n, reps):
            msgs = [{"role": "user", "content": text}]
            t0 = time.perf_counter()
            count_prompt(msgs)
            times.append(time.perf_counter() - t0)
        out[n] = median_ms(times)
    return out


def time_prediction(src: PromptSource, lengths: Sequence[int], reps: int) -> dict[int, tuple[float, float]]:
    from predictor.factory import semantic_core
    from predictor.semantic_async import AsyncSemantic

    core = semantic_core()
    face = AsyncSemantic(core)
    rows = sharegpt_rows()[:400]

    async def run() -> dict[int, tuple[float, float]]:
        await face.start()
        feats = core.features_many([str(r["prompt"]) for r in rows])
        for f, r in zip(feats, rows, strict=True):
            core.record(f, int(str(r["prompt_tokens_cl100k"])), int(str(r["response_tokens_cl100k"])))
        out = {}
        for n in lengths:
            times = []
            for text in src.prompts(n, reps):
                msgs = [{"role": "user", "content": text}]
                t0 = time.perf_counter()
                await face.predict(msgs, n)
                times.append(time.perf_counter() - t0)
            out[n] = (median_ms(times), pct_ms(times, 0.9))
        await face.close()
        return out

    return asyncio.run(run())


# --- real processes ------------------------------------------------------------------------------
def chat_body(text: str) -> dict[str, object]:
    return {"model": "sim", "messages": [{"role": "user", "content": text}], "max_tokens": 2, "stream": True}


async def ttft(client: httpx.AsyncClient, url: str, text: str) -> float:
    t0 = time.perf_counter()
    async with client.stream("POST", url + "/v1/chat/completions", json=chat_body(text)) as r:
        r.raise_for_status()
        async for _ in r.aiter_raw():
            return time.perf_counter() - t0
    raise RuntimeError("empty response")


async def added_ttft(direct: str, gw: str, src: PromptSource, n: int, pairs: int) -> tuple[float, float]:
    """Median gateway TTFT minus median direct TTFT (ms) and the p90 of the paired differences."""
    d_t, g_t = [], []
    async with httpx.AsyncClient(timeout=120) as c:
        for text in src.prompts(n, 4):  # warm both paths
            await ttft(c, direct, text)
            await ttft(c, gw, text)
        for i in range(pairs):
            a, b = src.prompts(n, 2)
            first, second = (direct, gw) if i % 2 == 0 else (gw, direct)
            for url, text in ((first, a), (second, b)):
                (d_t if url == direct else g_t).append(await ttft(c, url, text))
    diffs = [g - d for d, g in zip(d_t, g_t, strict=True)]
    return median_ms(g_t) - median_ms(d_t), pct_ms(diffs, 0.9)


def _late(url: str) -> tuple[float, float]:
    late = total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("sagegate_predictor_path_total{"):
            v = float(line.rsplit(" ", 1)[1])
            total += v
            late += v if 'path="late"' in line else 0.0
    return late, total


def time_gateway(
    src: PromptSource, lengths: Sequence[int], pairs: int, predictors: Sequence[str]
) -> dict[tuple[str, int], tuple[float, float, str]]:
    out: dict[tuple[str, int], tuple[float, float, str]] = {}
    with backend(20.0) as be:
        for pred in predictors:
            with gateway([be], predictor=pred, policy="sagesched") as gw:
                if pred == "semantic":
                    _warm_embedder(gw)
                for n in lengths:
                    late0, tot0 = _late(gw)
                    med, p90 = asyncio.run(added_ttft(be, gw, src, n, pairs))
                    late1, tot1 = _late(gw)
                    late = f"{late1 - late0:.0f}/{tot1 - tot0:.0f}" if pred == "semantic" else "-"
                    out[(pred, n)] = (med, p90, late)
                    print(f"   {pred} {n}: added {med:.1f} ms (p90 {p90:.1f}), late {late}", flush=True)
    return out


async def _open_loop(url: str, texts: Sequence[str], rate: float, seed: int) -> int:
    rng = random.Random(seed)
    ok = 0
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=1000)) as c:

        async def one(text: str) -> None:
            nonlocal ok
            body = chat_body(text) | {"max_tokens": 64}
            r = await c.post(url + "/v1/chat/completions", json=body)
            ok += r.status_code == 200
            await r.aread()

        tasks = []
        for text in texts:
            tasks.append(asyncio.create_task(one(text)))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks, return_exceptions=True)
    return ok


def time_load(src: PromptSource, rate: float, n: int) -> None:
    print(f"\n## Under load: {n} chat requests of ~13k tokens, Poisson at {rate:g} req/s, semantic gateway")
    with backend(1.5) as b1, backend(1.5) as b2, gateway([b1, b2], predictor="semantic") as gw:
        _warm_embedder(gw)
        late0, tot0 = _late(gw)
        ok = asyncio.run(_open_loop(gw, src.prompts(13_000, n), rate, 7))
        late1, tot1 = _late(gw)
    late, tot = late1 - late0, tot1 - tot0
    print(f"completed {ok}/{n}; late {late:.0f} of {tot:.0f} predictions ({100 * late / max(1, tot):.1f}%)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="100,1000,10000,30000")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--predictors", default="none,semantic")
    ap.add_argument("--no-gateway", action="store_true")
    ap.add_argument("--no-predict", action="store_true")
    ap.add_argument("--load-rate", type=float, default=0.0)
    ap.add_argument("--load-requests", type=int, default=200)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    preds = [p for p in args.predictors.split(",") if p]
    src = PromptSource()
    print(f"# request path, code at {REPO} (load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores)")
    counts = time_counting(src, lengths, args.reps)
    predicts = {} if args.no_predict else time_prediction(src, lengths, args.reps)
    gw = {} if args.no_gateway else time_gateway(src, lengths, args.pairs, preds)
    head = "| prompt tokens | count ms | predict ms p50 / p90 |"
    head += "".join(f" added TTFT {p} ms p50 / p90 |" for p in preds if not args.no_gateway)
    if "semantic" in preds and not args.no_gateway:
        head += " late |"
    print("\n" + head)
    print("|" + "---|" * (head.count("|") - 1))
    for n in lengths:
        p = predicts.get(n)
        row = f"| {n:,} | {counts[n]:.2f} | " + (f"{p[0]:.1f} / {p[1]:.1f} |" if p else "- |")
        for pred in preds if not args.no_gateway else ():
            med, p90, _ = gw[(pred, n)]
            row += f" {med:.1f} / {p90:.1f} |"
        if "semantic" in preds and not args.no_gateway:
            row += f" {gw[('semantic', n)][2]} |"
        print(row)
    print(f"(load average at the end {os.getloadavg()[0]:.1f})")
    if args.load_rate > 0:
        time_load(src, args.load_rate, args.load_requests)


if __name__ == "__main__":
    main()
