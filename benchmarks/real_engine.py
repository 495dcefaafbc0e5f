"""The engine model against a real vLLM: step-time terms fitted on lone requests, then the same loaded
traces through one real engine and through the simulator, side by side.

    .venv/bin/python -m benchmarks real_engine [--requests 100] [--loads 0.6,0.9] [--out results/real_engine.json]

Needs ``make vllm``. One engine (vLLM's CPU build serving the tiny model of ``harness.vllm``) alone on
core 1; this client and vLLM's API server (HTTP, detokenisation, streaming) on core 0 (``--no-pin``:
the API server left unbound, where the machine's scheduler puts it).

1. **Two fits, on probes only.** ``lone``: prompts of 64 to 6,144 tokens asking one token (prefill),
   three asking 128 (decode at short and long context), one finding most of its prompt cached; each
   sent alone. A least-squares fit in log space of the roofline's free terms (``sim.perf``: compute,
   weight-read, attention and KV-read efficiencies against a nominal core, a step's fixed cost, the
   front end) to their TTFT and inter-token time. One sequence a step cannot tell the per-sequence
   cost ``t_seq`` from the fixed cost: it stays at the default. ``probes``: the same, and 4, 16 and 32
   short requests at once and 8 decoding when a 4,096-token prompt arrives (a mixed step), with
   ``t_seq`` free. Each probe twice, the prefix cache reset between rounds; medians.
2. **Held back, under load**: nothing below was seen by the fit. ``mooncake``: a window of Mooncake's
   synthetic trace (its times; prompts an eighth as long, keeping their leading block ids, so what
   they share they share whole); ``azure``: Azure's 2023 conversation trace (its times and
   lengths) with one of six shared 1,024-token system prompts in each prompt. Each first as a burst (all
   at once: capacity is its completions per second), then at each load × that capacity, through the
   real engine (token-id prompts, ``ignore_eos``, ``max_tokens`` the trace's output) and through the
   simulator with the fitted terms and the engine's own limits (block size 128, its block count, batch
   limits, vLLM 0.32's whole-prompt admission). The KV cache is small on purpose: memory pressure and
   preemption.
3. **Contention**: the probes again with a busy process on the client's core.

Compared: TTFT and TTLT (mean, p50, p90), vLLM's preemption counter against the simulator's, vLLM's
prefix-cache hit rate against the simulator's. Nothing here predicts: every request asks its length.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import numpy as np

from sagegate.core.record import RequestRecord
from sagegate.core.request import TraceRequest
from sagegate.harness.vllm import reset_prefix_cache
from sagegate.loadgen.data import data_file
from sagegate.loadgen.readers import read_trace
from sagegate.loadgen.scrape import scrape_counters
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimSetup, client_view, simulate
from sagegate.sim.hardware import DEFAULT_TERMS, GiB, GPUSpec, ModelSpec
from sagegate.sim.perf import PerfModel
from sagegate.sim.prefix import MOONCAKE_BLOCK

ENGINE_CORE, CLIENT_CORE = "1", 0
BLOCKS, MAX_LEN, MAX_SEQS, BATCH_TOKENS, BLOCK = 96, 8192, 32, 2048, 128
NOMINAL = GPUSpec("cpu-core", flops=4e12, bandwidth=4e11, memory_bytes=24 * GiB)
"""A nominal core: the fitted efficiencies scale its peaks to what the engine reaches."""
LONE_FREE = ("eta_c", "eta_m", "eta_a", "eta_kv", "t_fix", "frontend_s")
"""What lone requests can tell apart (one sequence a step: ``t_seq`` folds into ``t_fix``)."""
START = {
    "eta_c": 0.05,
    "eta_m": 0.05,
    "eta_a": 0.1,
    "eta_kv": 0.05,
    "t_fix": 1e-3,
    "t_seq": 1e-4,
    "frontend_s": 0.01,
}
BOUNDS = {"eta_c": (1e-4, 1.0), "eta_m": (1e-4, 1.0), "eta_a": (1e-5, 1.0), "eta_kv": (1e-4, 1.0)}
FULL_ISL = True
"""vLLM 0.32 admits a waiting request only when its whole sequence fits (``--scheduler-reserve-full-isl``)."""
COUNTERS = ("vllm:num_preemptions", "vllm:prefix_cache_hits", "vllm:prefix_cache_queries")
VOCAB_USED = 100_000  # below the tokenizer's special tokens
UNIQUE = 1 << 40  # hash ids from here on are private to one request


# --- prompts: one 512-token segment per hash id, the same tokens wherever the id appears -------------
@functools.lru_cache(maxsize=4096)
def segment(h: int) -> list[int]:
    return np.random.default_rng(h).integers(0, VOCAB_USED, MOONCAKE_BLOCK).tolist()


def token_ids(req: TraceRequest) -> list[int]:
    ids: list[int] = []
    for h in req.hash_ids or ():
        ids += segment(h)
    return ids[: req.prompt_tokens]


def private_ids(rid: int, tokens: int, start: int = 0) -> tuple[int, ...]:
    return tuple(UNIQUE + rid * 1000 + k for k in range(start, -(-tokens // MOONCAKE_BLOCK)))


# --- the workloads ------------------------------------------------------------------------------------
GROUP_S = 60.0
"""Probe groups start this far apart (in the simulator; live, each group runs alone in turn)."""


def probes(batches: bool) -> list[TraceRequest]:
    """Prefill points (one token out), one mostly cached, decode points (128 out), each alone; with
    ``batches``, also 4, 16 and 32 short requests at once, and 8 decoding when a 4,096-token prompt
    arrives (a mixed step: a prefill chunk beside decodes)."""
    groups: list[list[tuple[int, int, float]]] = [[(p, 1, 0.0)] for p in (64, 256, 1024, 2048, 4096)]
    groups += [[(4096, 1, 0.0)], [(6144, 1, 0.0)], [(64, 128, 0.0)], [(2048, 128, 0.0)], [(6000, 128, 0.0)]]
    if batches:
        groups += [[(64, 128, 0.0)] * n for n in (4, 16, 32)]
        groups += [[(64, 256, 0.0)] * 8 + [(4096, 16, 0.5)]]
    out: list[TraceRequest] = []
    for g, shapes in enumerate(groups):
        for p, o, at in shapes:
            out.append(TraceRequest(GROUP_S * g + at, p, o, rid=len(out), hash_ids=private_ids(len(out), p)))
    seen = out[4]  # the second 4,096-token prompt: the first's first 3,584 tokens and a new segment
    out[5] = dataclasses.replace(out[5], hash_ids=(*(seen.hash_ids or ())[:-1], UNIQUE - 1))
    return out


def mooncake(n: int, offset: int = 2000) -> list[TraceRequest]:
    """Mooncake's synthetic trace from ``offset``: prompts ÷ 8 with their leading block ids, output ≤ 400."""
    rows = read_trace(data_file("mooncake", "synthetic_trace.jsonl"))[offset : offset + n]
    t0 = rows[0].arrival_s
    out = []
    for i, r in enumerate(rows):
        prompt = max(16, min(MAX_LEN - 512, r.prompt_tokens // 8))
        out.append(TraceRequest(r.arrival_s - t0, prompt, max(1, min(400, r.output_tokens)), rid=i,
                                hash_ids=(r.hash_ids or ())[: -(-prompt // MOONCAKE_BLOCK)]))  # fmt: skip
    return out


def azure(n: int, seed: int = 7, groups: int = 6) -> list[TraceRequest]:
    """Azure's conversation trace (times, lengths), each prompt opening with one of ``groups`` shared
    1,024-token system prompts."""
    rows = read_trace(data_file("azure2023", "AzureLLMInferenceTrace_conv.csv"), limit=n)
    rng = np.random.default_rng(seed)
    out = []
    for i, r in enumerate(rows):
        g = int(rng.integers(groups))
        prompt = min(MAX_LEN - 512, r.prompt_tokens + 1024)
        ids = (2 * g + 1, 2 * g + 2, *private_ids(i, prompt, start=2))
        out.append(TraceRequest(r.arrival_s, prompt, max(1, min(400, r.output_tokens)), rid=i, hash_ids=ids))
    return out


WORKLOADS: dict[str, Callable[[int], list[TraceRequest]]] = {"mooncake": mooncake, "azure": azure}


def at_rate(reqs: Sequence[TraceRequest], rate: float | None) -> list[TraceRequest]:
    """The trace's arrivals rescaled to a mean ``rate`` per second (None: all at once)."""
    span = max(r.arrival_s for r in reqs) or 1.0
    scale = 0.0 if rate is None else (len(reqs) - 1) / span / rate
    return [r.with_arrival(r.arrival_s * scale) for r in reqs]


# --- the real engine ----------------------------------------------------------------------------------
async def send(client: httpx.AsyncClient, url: str, req: TraceRequest, t0: float) -> RequestRecord:
    await asyncio.sleep(max(0.0, t0 + req.arrival_s - time.perf_counter()))
    rec = RequestRecord(req.rid, req.arrival_s, req.prompt_tokens, 0)
    body = {
        "model": "tiny", "prompt": token_ids(req), "max_tokens": req.output_tokens, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            rec.status, rec.reason = "error", (await r.aread()).decode()[:200]
            return rec
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and rec.first_token_s is None:
                rec.first_token_s = time.perf_counter() - t0
            usage = chunk.get("usage") or {}
            rec.output_tokens = usage.get("completion_tokens", rec.output_tokens)
    rec.finish_s = time.perf_counter() - t0
    return rec


def replay(url: str, reqs: Sequence[TraceRequest]) -> tuple[list[RequestRecord], dict[str, float]]:
    """``reqs`` at their times through the engine, and its counters' growth."""
    before = scrape_counters([url + "/metrics"], COUNTERS)

    async def go() -> list[RequestRecord]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=1800, limits=limits, trust_env=False) as client:
            t0 = time.perf_counter() + 0.2
            return await asyncio.gather(*(send(client, url, r, t0) for r in reqs))

    records = asyncio.run(go())
    after = scrape_counters([url + "/metrics"], COUNTERS)
    return records, {k: (after[k] or 0.0) - (before[k] or 0.0) for k in COUNTERS}


def probe(url: str, reqs: Sequence[TraceRequest], rounds: int = 2) -> list[RequestRecord]:
    """Each group of ``reqs`` (``GROUP_S`` apart) sent alone, in order, ``rounds`` times (the prefix
    cache reset before each round); the median of each request's times."""
    groups: dict[int, list[TraceRequest]] = {}
    for r in reqs:
        groups.setdefault(int(r.arrival_s // GROUP_S), []).append(r)
    runs = []
    for _ in range(rounds):
        reset_prefix_cache(url)
        runs.append(
            [rec for g, rs in groups.items() for rec in replay(url, [r.with_arrival(r.arrival_s - GROUP_S * g) for r in rs])[0]]
        )  # fmt: skip
    merged = []
    for req, recs in zip(reqs, zip(*runs, strict=True), strict=True):
        start = GROUP_S * (req.arrival_s // GROUP_S)
        rec = dataclasses.replace(recs[0], arrival_s=req.arrival_s)
        rec.first_token_s = start + statistics.median(r.first_token_s or math.nan for r in recs)
        rec.finish_s = start + statistics.median(r.finish_s or math.nan for r in recs)
        merged.append(rec)
    return merged


@contextlib.contextmanager
def busy(core: int) -> Iterator[None]:
    """A process spinning on ``core``."""
    spin = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile 1: pass"]
    )
    try:
        yield
    finally:
        spin.kill()
        spin.wait()


# --- the simulator ------------------------------------------------------------------------------------
def perf_for(model: ModelSpec, x: dict[str, float]) -> PerfModel:
    terms = dataclasses.replace(DEFAULT_TERMS, **{k: v for k, v in x.items() if k != "eta_c"})
    return PerfModel(model, dataclasses.replace(NOMINAL, eta_c=x["eta_c"], terms=terms))


def simulated(perf: PerfModel, reqs: Sequence[TraceRequest]) -> tuple[list[RequestRecord], dict[str, float]]:
    cfg = EngineConfig(
        max_num_seqs=MAX_SEQS, max_num_batched_tokens=BATCH_TOKENS, block_size=BLOCK,
        num_gpu_blocks_override=BLOCKS, enable_prefix_caching=True, scheduler_reserve_full_isl=FULL_ISL,
    )  # fmt: skip
    res = simulate(reqs, SimSetup(perf=perf, engine=cfg))
    client_view(res, perf.frontend_s)
    cached = sum(r.cached_tokens for r in res.records)
    counters = {
        "vllm:num_preemptions": float(sum(res.engine_preemptions)),
        "vllm:prefix_cache_hits": float(cached),
        "vllm:prefix_cache_queries": float(sum(r.prompt_tokens for r in res.records)),
    }
    return res.records, counters


def itl(r: RequestRecord) -> float:
    return ((r.finish_s or 0.0) - (r.first_token_s or 0.0)) / max(1, r.output_tokens - 1)


def fit(
    model: ModelSpec, real: Sequence[RequestRecord], reqs: Sequence[TraceRequest], free: Sequence[str]
) -> dict[str, float]:
    """The ``free`` terms that best match the probes' TTFT and inter-token times: log errors, a
    group's mean each (a batch weighs as much as a lone request)."""
    from scipy.optimize import least_squares

    def residuals(z: np.ndarray) -> list[float]:
        sim, _ = simulated(perf_for(model, dict(zip(free, np.exp(z), strict=True))), reqs)
        groups: dict[int, list[tuple[float, float | None]]] = {}
        for s, r in zip(sim, real, strict=True):
            ttft = math.log((s.ttft or 1e-9) / (r.ttft or 1e-9))
            groups.setdefault(int(r.arrival_s // GROUP_S), []).append(
                (ttft, math.log(itl(s) / itl(r)) if r.output_tokens > 1 else None)
            )
        out = []
        for errs in groups.values():
            out.append(statistics.fmean(e for e, _ in errs))
            decode = [e for _, e in errs if e is not None]
            if decode:
                out.append(statistics.fmean(decode))
        return out

    lo = [math.log(BOUNDS.get(k, (1e-7, 1.0))[0]) for k in free]
    hi = [math.log(BOUNDS.get(k, (1e-7, 1.0))[1]) for k in free]
    z = least_squares(residuals, [math.log(START[k]) for k in free], bounds=(lo, hi), diff_step=0.05).x
    return dict(zip(free, (float(v) for v in np.exp(z)), strict=True))


# --- the comparison -----------------------------------------------------------------------------------
def stats(records: Sequence[RequestRecord]) -> dict[str, float]:
    ok = [r for r in records if r.ttlt is not None and r.ttft is not None]
    out: dict[str, float] = {"n": len(ok)}
    for name, values in (("ttft", [r.ttft for r in ok]), ("ttlt", [r.ttlt for r in ok])):
        xs = np.array(values, dtype=float)
        out |= {f"{name}_mean": float(xs.mean()), f"{name}_p50": float(np.percentile(xs, 50)),
                f"{name}_p90": float(np.percentile(xs, 90))}  # fmt: skip
    return out


def row(
    label: str,
    real: tuple[list[RequestRecord], dict[str, float]],
    sim: tuple[list[RequestRecord], dict[str, float]],
) -> dict[str, object]:
    r, s = stats(real[0]), stats(sim[0])

    def hit(c: dict[str, float]) -> float:
        return c["vllm:prefix_cache_hits"] / max(1.0, c["vllm:prefix_cache_queries"])

    line = " | ".join(
        f"{k} {r[k]:.2f}/{s[k]:.2f} ({s[k] / r[k]:.2f})"
        for k in ("ttft_mean", "ttft_p90", "ttlt_mean", "ttlt_p90")
    )
    pre = (real[1]["vllm:num_preemptions"], sim[1]["vllm:num_preemptions"])
    print(f"{label:24} n {r['n']:.0f}/{s['n']:.0f} | {line} | preempt {pre[0]:.0f}/{pre[1]:.0f}"
          f" | hit {hit(real[1]):.2f}/{hit(sim[1]):.2f}", flush=True)  # fmt: skip
    return {"label": label, "real": r | real[1], "sim": s | sim[1]}


def main(argv: list[str] | None = None) -> int:
    from sagegate.harness.vllm import tiny_model, vllm_engine

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--loads", default="0.6,0.9", help="shares of the burst's completion rate")
    ap.add_argument("--workloads", default="mooncake,azure")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="leave vLLM's API server unbound (default: on the client's core, the engine alone on its own)",
    )
    args = ap.parse_args(argv)
    os.sched_setaffinity(0, {CLIENT_CORE})
    model = ModelSpec.from_hf_config(tiny_model())
    rows: list[dict[str, object]] = []
    fitted: dict[str, dict[str, float]] = {}
    with vllm_engine(blocks=BLOCKS, max_model_len=MAX_LEN, cpus=ENGINE_CORE, dev_mode=True,
                     max_num_seqs=MAX_SEQS, max_num_batched_tokens=BATCH_TOKENS) as engine:  # fmt: skip
        replay(
            engine.url,
            [TraceRequest(0.0, 512, 16, rid=900 + i, hash_ids=private_ids(900 + i, 512)) for i in range(4)],
        )
        if args.pin:
            engine.pin({CLIENT_CORE}, {int(ENGINE_CORE)})
        fits: dict[str, PerfModel] = {}
        for label, batches, free in (
            ("lone", False, LONE_FREE),
            ("probes", True, (*LONE_FREE, "t_seq")),
        ):
            reqs = probes(batches)
            measured = probe(engine.url, reqs)
            x = fit(model, measured, reqs, free)
            fits[label] = perf = perf_for(model, x)
            print(f"fitted on {label}:", {k: f"{v:.4g}" for k, v in x.items()}, flush=True)
            fitted[label] = x
            rows.append(
                row(f"{label} (fitted on)", (measured, dict.fromkeys(COUNTERS, 0.0)), simulated(perf, reqs))
            )
            for req, r, s in zip(reqs, measured, simulated(perf, reqs)[0], strict=True):
                print(f"  prompt {req.prompt_tokens:5} out {req.output_tokens:3}: TTFT {r.ttft:.4f}/{s.ttft:.4f}"
                      f" ITL {itl(r):.4f}/{itl(s):.4f}")  # fmt: skip
        with busy(CLIENT_CORE):
            loaded = probe(engine.url, reqs, rounds=1)
        ratio = [b.ttlt / a.ttlt for a, b in zip(measured, loaded, strict=True) if a.ttlt and b.ttlt]
        print(f"contention: probes' TTLT with the client's core busy ÷ idle: mean {statistics.fmean(ratio):.2f},"
              f" range {min(ratio):.2f}–{max(ratio):.2f}", flush=True)  # fmt: skip
        for name in args.workloads.split(","):
            base = WORKLOADS[name](args.requests)
            burst = at_rate(base, None)
            reset_prefix_cache(engine.url)
            real = replay(engine.url, burst)
            ends = [r.finish_s for r in real[0] if r.finish_s is not None]
            capacity = len(ends) / max(ends)
            for label, perf in fits.items():
                rows.append(row(f"{name} burst ({capacity:.2f}/s) {label}", real, simulated(perf, burst)))
            for load in (float(v) for v in args.loads.split(",")):
                reqs = at_rate(base, load * capacity)
                reset_prefix_cache(engine.url)
                real = replay(engine.url, reqs)
                for label, perf in fits.items():
                    rows.append(row(f"{name} {load:.1f}x {label}", real, simulated(perf, reqs)))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"fitted": fitted, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
