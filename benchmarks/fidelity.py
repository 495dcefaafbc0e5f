"""How far the engine model is from real vLLM: replay public H100 runs and print the error table.

The runs are BLIS's (inference-sim/training, see benchmarks/fidelity_data.py): Llama-2-70B TP4,
Mixtral-8x7B TP2 and CodeLlama-34B TP2, each under four workloads, vLLM 0.15.1, 128 sequences,
2,048-token budget. Each run's own arrivals, prompt and output lengths are replayed through the
simulator (its KV pool set to the run's measured block count) and compared per load stage with the
measured E2E, TTFT and ITL (a request's mean inter-token time, ``(E2E − TTFT) / (output − 1)``).
The sustainable rate (highest arrival rate whose mean E2E stays under 2× its light-load value) is
found by rescaling a run's arrivals; the real one is bracketed by the measured stages and, where a
run overloaded vLLM, by the completion rate it reached.

The fit (``--fit``) searches the H100 profile's free terms on the training runs only; the table's
held-out rows were not seen by it (docs/fidelity.md).

    .venv/bin/python -m benchmarks fidelity [--data /work/.mirror/inference-sim+training/repo]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.fidelity_data import DEFAULT_SOURCE, Run, load_runs
from sagegate.core.request import TraceRequest
from sagegate.sim.config import EngineConfig
from sagegate.sim.des import SimSetup, client_view, simulate
from sagegate.sim.hardware import GPUSpec, get_gpu, get_model
from sagegate.sim.perf import PerfModel

# Held out from the fit: one workload of every model, and one whole model's runs are not needed
# for this split since each model keeps three workloads in training (see docs/fidelity.md).
HELD_OUT = ("codellama-34b-tp2-roleplay", "llama-2-70b-hf-tp4-codegen", "mixtral-8x7b-v0-1-tp2-general")
OVERLOAD_FAILURES = 0.10  # a run whose client timed out more than this share is an overload run


@dataclass(frozen=True)
class StageStats:
    n: int
    e2e_mean: float
    ttft_mean: float
    itl_mean: float
    itl_p90: float
    e2e_p90: float


def _p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def _stats(e2e: list[float], ttft: list[float], out: list[int]) -> StageStats:
    itl = [(e - t) / (o - 1) for e, t, o in zip(e2e, ttft, out, strict=True) if o >= 50]
    return StageStats(
        n=len(e2e),
        e2e_mean=statistics.fmean(e2e),
        ttft_mean=statistics.fmean(ttft),
        itl_mean=statistics.fmean(itl),
        itl_p90=_p90(itl),
        e2e_p90=_p90(e2e),
    )


def perf_for(run: Run, gpu: GPUSpec | None = None) -> PerfModel:
    return PerfModel(get_model(run.model), gpu or get_gpu("h100"), tp=run.tp)


def prompt_ids(prompt_tokens: int) -> tuple[int, ...]:
    """Prefix-cache identity of a prompt. inference-perf's shared-prefix workload draws every request
    from 100 fixed prompts (10 system prompts × 10 questions, results/config.yaml), so vLLM's prefix
    cache serves all but a prompt's last partial block once each prompt has been seen. The replay does
    not name the prompt; equal token counts stand for equal prompts (one id per 512 tokens)."""
    return tuple(hash((prompt_tokens, k)) for k in range(-(-prompt_tokens // 512)))


def in_window(run: Run, arrival_s: float, window_s: float | None) -> bool:
    """Whether an arrival falls in the first ``window_s`` seconds of its stage (None: always)."""
    if window_s is None:
        return True
    stage = stage_of(run, arrival_s)
    start = run.stage_ends_s[stage - 1] if stage else 0.0
    return arrival_s - start < window_s


def engine_for(run: Run, perf: PerfModel) -> EngineConfig:
    """The engine a BLIS run used (vLLM's flags as the run records them; prefix caching on, vLLM's default)."""
    return EngineConfig(
        model=run.model,
        gpu=perf.gpu.name,
        max_num_seqs=run.max_num_seqs,
        max_num_batched_tokens=run.max_num_batched_tokens,
        num_gpu_blocks_override=run.kv_blocks,
        tensor_parallel_size=run.tp,
        enable_prefix_caching=True,
    )


def simulate_run(
    run: Run, perf: PerfModel, *, rate_scale: float = 1.0, window_s: float | None = None
) -> list[tuple[float, float] | None]:
    """Simulated (E2E, TTFT) per request of ``run`` (None when it did not finish or was not replayed)."""
    trace = [
        TraceRequest(
            arrival_s=r.arrival_s / rate_scale,
            prompt_tokens=r.prompt_tokens,
            output_tokens=r.output_tokens,
            rid=i,
            hash_ids=prompt_ids(r.prompt_tokens),
        )
        for i, r in enumerate(run.requests)
        if in_window(run, r.arrival_s, window_s)
    ]
    cfg = engine_for(run, perf)
    res = simulate(trace, SimSetup(perf=perf, engine=cfg))
    client_view(res, perf.frontend_s)
    out: list[tuple[float, float] | None] = [None] * len(run.requests)
    for rec in res.records:
        if rec.ttlt is not None and rec.ttft is not None:
            out[rec.rid] = (rec.ttlt, rec.ttft)
    return out


def stage_of(run: Run, arrival_s: float) -> int:
    for i, end in enumerate(run.stage_ends_s):
        if arrival_s < end:
            return i
    return len(run.stage_ends_s) - 1


def compare(run: Run, sim: Sequence[tuple[float, float] | None]) -> list[tuple[StageStats, StageStats]]:
    """(real, simulated) statistics per stage, over the requests that finished in both."""
    rows = []
    for stage in range(len(run.stage_ends_s)):
        re2e, rttft, se2e, sttft, outs = [], [], [], [], []
        for r, s in zip(run.requests, sim, strict=True):
            if r.e2e_s is None or r.ttft_s is None or s is None or stage_of(run, r.arrival_s) != stage:
                continue
            re2e.append(r.e2e_s)
            rttft.append(r.ttft_s)
            se2e.append(s[0])
            sttft.append(s[1])
            outs.append(r.output_tokens)
        if len(re2e) > 10:
            rows.append((_stats(re2e, rttft, outs), _stats(se2e, sttft, outs)))
    return rows


def poisson_trace(run: Run, rate: float, duration_s: float, seed: int = 7) -> list[TraceRequest]:
    """Open-loop Poisson arrivals at ``rate`` with the lengths of ``run``'s first stage, in order."""
    rng = random.Random(seed)
    lengths = [r for r in run.requests if r.arrival_s < run.stage_ends_s[0] and r.e2e_s is not None]
    out, t, i = [], 0.0, 0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        r = lengths[i % len(lengths)]
        out.append(
            TraceRequest(
                arrival_s=t,
                prompt_tokens=r.prompt_tokens,
                output_tokens=r.output_tokens,
                rid=i,
                hash_ids=prompt_ids(r.prompt_tokens),
            )
        )
        i += 1


def sim_mean_e2e(run: Run, perf: PerfModel, rate: float, duration_s: float = 240.0) -> float:
    cfg = engine_for(run, perf)
    res = simulate(poisson_trace(run, rate, duration_s), SimSetup(perf=perf, engine=cfg))
    client_view(res, perf.frontend_s)
    return statistics.fmean(r.ttlt for r in res.records if r.ttlt is not None)


def sustainable_rate(run: Run, perf: PerfModel, hi: float = 64.0, tol: float = 0.02) -> float:
    """Highest Poisson rate whose simulated mean E2E stays under 2× the light-load (0.2 req/s) value."""
    limit = 2.0 * sim_mean_e2e(run, perf, 0.2, duration_s=600.0)
    lo = 0.2
    while hi / lo > 1.0 + tol:
        mid = math.sqrt(lo * hi)
        if sim_mean_e2e(run, perf, mid) < limit:
            lo = mid
        else:
            hi = mid
    return lo


def completion_rate(finishes: list[float], start_s: float, end_s: float) -> float:
    """Requests finished per second within ``[start_s, end_s)``: an overloaded engine's capacity."""
    return sum(start_s <= f < end_s for f in finishes) / (end_s - start_s)


def capacity(
    run: Run, sim: Sequence[tuple[float, float] | None], start_s: float = 300.0
) -> tuple[float, float]:
    """(real, simulated) completion rates in a saturated run, after its queue has built up."""
    end = run.stage_ends_s[-1]
    real = [r.arrival_s + r.e2e_s for r in run.requests if r.e2e_s is not None]
    simf = [r.arrival_s + s[0] for r, s in zip(run.requests, sim, strict=True) if s is not None]
    return completion_rate(real, start_s, end), completion_rate(simf, start_s, end)


def err(sim: float, real: float) -> float:
    return sim / real - 1.0


def is_overload(run: Run) -> bool:
    """Runs where vLLM itself was past capacity: the reasoning runs (mean E2E of minutes; two of the
    three also timed out a third or more of their requests). Their latency measures the queue and
    the client's timeout, so they check capacity only."""
    return "reasoning" in run.name or run.failure_rate > OVERLOAD_FAILURES


def role(run: Run) -> str:
    return "held-out" if any(h in run.name for h in HELD_OUT) or is_overload(run) else "train"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--data", type=Path, default=DEFAULT_SOURCE, help="git mirror or checkout of inference-sim/training"
    )
    ap.add_argument("--window", type=float, default=None, help="replay only each stage's first seconds")
    ap.add_argument("--no-rate", action="store_true", help="skip the sustainable-rate search (slow)")
    args = ap.parse_args(argv)
    runs = load_runs(args.data)
    print(
        "| run | role | rate | E2E real s | E2E err | TTFT real ms | TTFT err | ITL real ms | ITL err | ITL p90 err |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    held: list[tuple[float, float]] = []
    caps: list[str] = []
    for run in runs:
        perf = perf_for(run)
        sim = simulate_run(run, perf, window_s=args.window)
        if is_overload(run):
            real_c, sim_c = capacity(run, sim)
            caps.append(
                f"| {run.name[16:]} | {run.stage_rates[0]:g} | {run.failure_rate:.0%} | {real_c:.3f} | "
                f"{sim_c:.3f} | {err(sim_c, real_c):+.1%} |"
            )
            continue
        for i, (real, s) in enumerate(compare(run, sim)):
            e_e2e, e_ttft = err(s.e2e_mean, real.e2e_mean), err(s.ttft_mean, real.ttft_mean)
            if role(run) == "held-out":
                held.append((e_e2e, e_ttft))
            print(
                f"| {run.name[16:]} | {role(run)} | {run.stage_rates[i]:g} | {real.e2e_mean:.3f} | {e_e2e:+.1%} | "
                f"{real.ttft_mean * 1e3:.1f} | {e_ttft:+.1%} | {real.itl_mean * 1e3:.2f} | "
                f"{err(s.itl_mean, real.itl_mean):+.1%} | {err(s.itl_p90, real.itl_p90):+.1%} |",
                flush=True,
            )
    if held:
        e2e = sorted(abs(e) for e, _ in held)
        print(
            f"\nheld-out stages: {len(held)}; median |E2E err| {statistics.median(e2e):.1%} (target 8%), "
            f"worst {e2e[-1]:.1%} (target 15%), worst |TTFT err| {max(abs(t) for _, t in held):.1%} (target 20%)"
        )
    print(
        "\ncapacity of the overloaded runs (requests completed per second once the queue has built, 300 s to end)"
    )
    print(
        "| run | offered req/s | client timeouts | real req/s | simulated req/s | err |\n|---|---|---|---|---|---|"
    )
    print("\n".join(caps))
    if args.no_rate:
        return
    print("\nsustainable rate (simulated: highest Poisson rate with mean E2E < 2x light load; real: bracket)")
    print(
        "| run | simulated req/s | real measured stages (rate: mean E2E s) | consistent |\n|---|---|---|---|"
    )
    for run in runs:
        if is_overload(run):
            continue
        sus = sustainable_rate(run, perf_for(run))
        stages = compare(
            run,
            [
                (r.e2e_s, r.ttft_s) if r.e2e_s is not None and r.ttft_s is not None else None
                for r in run.requests
            ],
        )
        real_txt = ", ".join(
            f"{run.stage_rates[i]:g}: {real.e2e_mean:.2f}" for i, (real, _) in enumerate(stages)
        )
        # Every measured stage stayed well under 2x its light load, so the real rate is at least the
        # highest one measured; the model must not saturate more than 10% below it.
        ok = sus >= 0.9 * max(run.stage_rates)
        print(f"| {run.name[16:]} | {sus:.1f} | {real_txt} | {'yes' if ok else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
