"""What a request's length costs on the gateway's path: token counting, prediction, added TTFT.

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks bench_request_path [--lengths 100,1000,10000,30000]
        [--reps 30] [--rounds 40] [--predictors none,semantic] [--baseline ../main-checkout]
        [--no-gateway] [--no-predict] [--load-rate 0 --load-requests 200]

Prompts are real text: ShareGPT first turns (``loadgen/shipped``) concatenated in a seeded order, each
prompt cut from a random place of that text to the requested length, so no two prompts share a prefix
(nothing is cached by the tokenizer, the predictor or the backend's prefix cache). For each length:

* **count ms**: ``gateway.tokens.count_prompt`` on a chat message (the gateway's count phase), median;
* **predict ms**: ``predict`` of the semantic predictor as the gateway builds it (real MiniLM, the shipped default
  window, a history warmed with 400 ShareGPT completions), one at a time, median and p90;
* **added TTFT ms**: median TTFT through the gateway minus direct to one simulated backend (real
  processes on loopback, time scale 20, one request at a time, every path in a rotating order), for
  each ``--predictors`` entry; with ``semantic`` also how many predictions took the ``late`` path.

``--baseline DIR`` runs a second checkout's gateway (e.g. ``git archive main`` unpacked in DIR) beside
this one's, measured in the same rounds, so both see the same machine. ``--load-rate R`` also sends an
open-loop Poisson stream of 13k-token prompts at ``R`` req/s to each checkout's semantic gateway (two
backends each, every request to all gateways at once) and prints the share of ``late`` predictions
and the gateway's CPU per request. Figures are printed, nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from benchmarks.load import warm_embedder
from benchmarks.servers import PIDS, backend, cpu_seconds, stop_server, wait_ready
from sagegate.core.tokens import count_tokens
from sagegate.harness.procs import free_port

REPO = Path(__file__).resolve().parents[1]

SHAREGPT = (
    REPO / "sagegate" / "loadgen" / "shipped" / "sharegpt" / "sharegpt_v3_first_turn_pairs_4000.jsonl.gz"
)


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
    from sagegate.gateway.tokens import count_prompt

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
    from sagegate.gateway.predict import query_of
    from sagegate.predictor.factory import semantic_core
    from sagegate.predictor.semantic_face import SemanticLengthPredictor

    core = semantic_core()
    face = SemanticLengthPredictor(core, budget_s=10.0)  # the gateway's path, never late here
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
                await face.predict(query_of(0, msgs, n, "default", "default"))
                times.append(time.perf_counter() - t0)
            out[n] = (median_ms(times), pct_ms(times, 0.9))
        await face.close()
        return out

    return asyncio.run(run())


# --- real processes ------------------------------------------------------------------------------
@contextlib.contextmanager
def gateway(root: Path, backends: Sequence[str], **settings: object) -> Iterator[str]:
    """A gateway process running the code of checkout ``root`` (this one, or ``--baseline``)."""
    port = free_port()
    cfg = {"backends": list(backends), "port": port, "log_level": "warning", "policy": "sagesched"}
    cfg.update(settings)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)  # JSON is YAML
    env = dict(os.environ, PYTHONPATH=str(root))
    cmd = [sys.executable, "-m", "sagegate.cmd_serve", "--config", f.name]
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    PIDS[url] = proc.pid
    try:
        wait_ready(url, "/ready", proc, timeout=240)
        if settings.get("predictor") == "semantic":
            warm_embedder(url)
        yield url
    finally:
        stop_server(proc)
        os.unlink(f.name)


def chat_body(text: str) -> dict[str, object]:
    return {"model": "sim", "messages": [{"role": "user", "content": text}], "max_tokens": 2, "stream": True}


async def ttft(client: httpx.AsyncClient, url: str, text: str) -> float:
    t0 = time.perf_counter()
    async with client.stream("POST", url + "/v1/chat/completions", json=chat_body(text)) as r:
        r.raise_for_status()
        async for _ in r.aiter_raw():
            return time.perf_counter() - t0
    raise RuntimeError("empty response")


async def added_ttft(
    direct: str, gws: Sequence[str], src: PromptSource, n: int, rounds: int
) -> list[tuple[float, float]]:
    """Per gateway: median TTFT through it minus direct (ms), and the p90 of the per-round differences.
    Each round sends one fresh prompt to direct and to every gateway, in an order that rotates."""
    urls = [direct, *gws]
    got: dict[str, list[float]] = {u: [] for u in urls}
    async with httpx.AsyncClient(timeout=30) as c:
        for text in src.prompts(n, 3):  # warm every path
            for u in urls:
                await ttft(c, u, text)
        for i in range(rounds):
            order = urls[i % len(urls) :] + urls[: i % len(urls)]
            try:
                row = {
                    u: await ttft(c, u, text)
                    for u, text in zip(order, src.prompts(n, len(urls)), strict=True)
                }
            except httpx.TimeoutException as exc:  # a round with a stuck request is left out, and said
                print(f"   (round {i} at {n} tokens left out: {type(exc).__name__})", flush=True)
                continue
            for u, t in row.items():
                got[u].append(t)
    out = []
    for g in gws:
        diffs = [b - a for a, b in zip(got[direct], got[g], strict=True)]
        out.append((median_ms(got[g]) - median_ms(got[direct]), pct_ms(diffs, 0.9)))
    return out


def _late_outcomes(url: str) -> dict[str, float]:
    """``sagegate_late_predictions_total`` by outcome (reranked, dispatched, failed)."""
    from sagegate.loadgen.scrape import counter_by_label

    text = httpx.get(url + "/metrics", timeout=10).text
    return counter_by_label(text, "sagegate_late_predictions", "outcome")


def _late(url: str) -> tuple[float, float]:
    """Predictions that took the ``late`` path, and all predictions."""
    from sagegate.loadgen.scrape import counter_by_label

    paths = counter_by_label(httpx.get(url + "/metrics", timeout=10).text, "sagegate_predictor_path", "path")
    return paths.get("late", 0.0), sum(paths.values())


Cell = tuple[float, float, str]


def time_gateway(
    src: PromptSource, lengths: Sequence[int], rounds: int, predictors: Sequence[str], roots: dict[str, Path]
) -> dict[tuple[str, str, int], Cell]:
    """``(checkout, predictor, length)`` → (added median ms, p90 ms, late/total for semantic)."""
    out: dict[tuple[str, str, int], Cell] = {}
    with backend(20.0) as be:
        for pred in predictors:
            with contextlib.ExitStack() as stack:
                gws = {
                    name: stack.enter_context(gateway(root, [be], predictor=pred))
                    for name, root in roots.items()
                }
                for n in lengths:
                    before = {name: _late(u) for name, u in gws.items()}
                    cells = asyncio.run(added_ttft(be, list(gws.values()), src, n, rounds))
                    for (name, u), (med, p90) in zip(gws.items(), cells, strict=True):
                        late = "-"
                        if pred == "semantic":
                            (l0, t0), (l1, t1) = before[name], _late(u)
                            late = f"{l1 - l0:.0f}/{t1 - t0:.0f}"
                        out[(name, pred, n)] = (med, p90, late)
                        print(
                            f"   {name} {pred} {n}: added {med:.1f} ms (p90 {p90:.1f}), late {late}",
                            flush=True,
                        )
    return out


async def _open_loop(urls: Sequence[str], texts: Sequence[str], rate: float, seed: int) -> list[int]:
    """Poisson arrivals at ``rate``; each request goes to every url at once (same conditions for all)."""
    rng = random.Random(seed)
    ok = [0] * len(urls)
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=1000)) as c:

        async def one(i: int, text: str) -> None:
            r = await c.post(urls[i] + "/v1/chat/completions", json=chat_body(text) | {"max_tokens": 64})
            ok[i] += r.status_code == 200

        tasks = []
        for text in texts:
            tasks += [asyncio.create_task(one(i, text)) for i in range(len(urls))]
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks, return_exceptions=True)
    return ok


def time_load(src: PromptSource, rate: float, n: int, roots: dict[str, Path]) -> None:
    """Every checkout's semantic gateway (two backends each) at once, each request sent to all."""
    print(
        f"\n## Under load: {n} chat requests of ~13k tokens, Poisson at {rate:g} req/s, semantic, 2 backends"
    )
    print(f"   each checkout's gateway has its own backends; every request goes to all {len(roots)} at once")
    texts = src.prompts(13_000, n)
    with contextlib.ExitStack() as stack:
        gws = {}
        for name, root in roots.items():
            b1, b2 = stack.enter_context(backend(1.5)), stack.enter_context(backend(1.5))
            gws[name] = stack.enter_context(gateway(root, [b1, b2], predictor="semantic"))
        before = {name: _late(u) for name, u in gws.items()}
        cpu0 = {name: cpu_seconds(PIDS[u]) for name, u in gws.items()}
        ok = asyncio.run(_open_loop(list(gws.values()), texts, rate, 7))
        time.sleep(1.0)  # the last late predictions come and are counted
        for (name, u), done in zip(gws.items(), ok, strict=True):
            (l0, t0), (l1, t1) = before[name], _late(u)
            late, tot = l1 - l0, t1 - t0
            cpu = (cpu_seconds(PIDS[u]) - cpu0[name]) / max(1, done) * 1000
            outcomes = _late_outcomes(u)  # (a baseline checkout before the re-rank has none)
            then = ", ".join(f"{k} {v:.0f}" for k, v in sorted(outcomes.items())) or "not counted"
            ran_on_prior = outcomes.get("dispatched", late) + outcomes.get("failed", 0.0)
            print(
                f"{name}: completed {done}/{n}; late {late:.0f} of {tot:.0f} predictions "
                f"({100 * late / max(1, tot):.1f}%; when they came: {then}; ran on the prior's rank "
                f"{100 * ran_on_prior / max(1, tot):.1f}%); gateway CPU {cpu:.1f} ms per request"
            )
    print(f"(load average at the end {os.getloadavg()[0]:.1f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="100,1000,10000,30000")
    ap.add_argument("--reps", type=int, default=30, help="prompts per length for count and predict")
    ap.add_argument(
        "--rounds", type=int, default=40, help="requests per path and length through the gateways"
    )
    ap.add_argument("--predictors", default="none,semantic")
    ap.add_argument("--baseline", type=Path, help="another checkout (e.g. main) whose gateway runs beside")
    ap.add_argument("--no-gateway", action="store_true")
    ap.add_argument("--no-predict", action="store_true")
    ap.add_argument("--load-rate", type=float, default=0.0)
    ap.add_argument("--load-requests", type=int, default=200)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    preds = [p for p in args.predictors.split(",") if p] if not args.no_gateway else []
    roots = {"this": REPO} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    src = PromptSource()
    print(f"# request path, code at {REPO} (load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores)")
    counts = time_counting(src, lengths, args.reps)
    predicts = {} if args.no_predict else time_prediction(src, lengths, args.reps)
    gw = time_gateway(src, lengths, args.rounds, preds, roots) if preds else {}
    cols = [(name, p) for p in preds for name in roots]
    head = "| prompt tokens | count ms | predict ms p50 / p90 |"
    head += "".join(f" added TTFT {p} ({name}) ms p50 / p90 |" for name, p in cols)
    head += "".join(f" late ({name}) |" for name in roots if "semantic" in preds)
    print("\n" + head)
    print("|" + "---|" * (head.count("|") - 1))
    for n in lengths:
        p = predicts.get(n)
        row = f"| {n:,} | {counts[n]:.2f} | " + (f"{p[0]:.1f} / {p[1]:.1f} |" if p else "- |")
        row += "".join(f" {gw[(name, pr, n)][0]:.1f} / {gw[(name, pr, n)][1]:.1f} |" for name, pr in cols)
        row += "".join(f" {gw[(name, 'semantic', n)][2]} |" for name in roots if "semantic" in preds)
        print(row)
    print(f"(load average at the end {os.getloadavg()[0]:.1f})")
    if args.load_rate > 0:
        time_load(src, args.load_rate, args.load_requests, roots)


if __name__ == "__main__":
    main()
