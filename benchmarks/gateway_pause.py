"""Issue 17 part 3: gateway-level pause/resume in the simulator, against no pause and vLLM alone.

Three workloads, noisy-oracle predictions at 20% error (nothing the gateway reads holds the true
output length):

* ``sharegpt``: ShareGPT first-turn pairs timed by the Azure conversation arrivals, one H100 serving
  Llama-3.1-8B (compute-bound);
* ``azure-conv``: the Azure 2023 conversation trace in the memory-bound set-up (one H100 serving
  Qwen3-32B, ~37k KV tokens), requests 2000.. as in ``benchmarks/policy_experiments.py``;
* ``mooncake``: the Mooncake synthetic trace (long prompts, shared prefixes), two H100 engines
  serving Llama-3.1-8B, as in ``benchmarks/engine_preemption.py``.

Loads: utilisation 0.5 / 0.9 / 1.1 of vLLM alone's capacity (``harness.simtwin.capacity``). Runs:
``fcfs`` at engine level (vLLM alone, no gateway), gateway ``sagesched`` (non-preemptive: the
default), gateway ``sagesched`` with pausing (``policies.pause.PauseConfig(enabled=True)``, its
defaults otherwise), and a sensitivity row with the resume left unpriced (``hysteresis=0``,
``prefill_tokens_per_step=1e6``: pause whenever the rank and the exchange gain say so; not the default). Ratios to vLLM alone, from one run.

    .venv/bin/python -m benchmarks gateway_pause [--requests 800] [--workers 2] [--md out.md]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor

from benchmarks.engine_preemption import SETUPS_BY_NAME, Setup, at_loads, ratio
from sagegate.core.request import TraceRequest, answer_key

LOADS = (0.5, 0.9, 1.1)
UNPRICED = {"hysteresis": 0.0, "prefill_tokens_per_step": 1e6}
"""The pause rule with the resume left unpriced (the sensitivity run): pause whenever rank and gain say so."""
ERROR = 0.2
RUNS = ("vllm", "gateway", "gateway+pause", "gateway+pause:unpriced")
NAMES = {
    "gateway+pause:unpriced": "… + pause, resume unpriced (sensitivity)",
    "vllm": "vLLM alone (fcfs)",
    "gateway": "gateway sagesched",
    "gateway+pause": "gateway sagesched + pause",
}


SETUPS = {name: SETUPS_BY_NAME[name] for name in ("sharegpt", "azure-conv", "mooncake")}


def run_one(work: list[TraceRequest], setup: Setup, run: str) -> dict[str, float]:
    from sagegate.harness.simtwin import perf_and_engine
    from sagegate.policies.pause import PauseConfig
    from sagegate.policies.registry import parse_policy
    from sagegate.predictor.factory import make_predictor
    from sagegate.sim.des import SimSetup, client_view, simulate

    perf, engine = perf_and_engine(setup.model, setup.gpu)
    if run == "vllm":
        sim = SimSetup(perf, engine, engines=setup.engines, level="engine", policy=parse_policy("fcfs"))
    else:
        pred = make_predictor("noisy-oracle", relative_error=ERROR, seed=0, truth=answer_key(work))
        sim = SimSetup(
            perf,
            engine,
            engines=setup.engines,
            level="gateway",
            policy=parse_policy("sagesched"),
            predictor=pred,
            pause=PauseConfig(enabled=True, **UNPRICED)
            if run.endswith("unpriced")
            else PauseConfig(enabled=run == "gateway+pause"),
        )
    res = simulate(work, sim)
    client_view(res, perf.frontend_s)
    s = dict(res.summary)
    s["pauses"] = float(res.gateway_pauses)
    s["resumed_tokens"] = float(res.resumed_tokens)
    s["preemptions"] = float(sum(res.engine_preemptions))
    return s


def _job(args: tuple[str, float, str, list[TraceRequest]]) -> tuple[tuple[str, float, str], dict[str, float]]:
    wname, load, run, work = args
    return (wname, load, run), run_one(work, SETUPS[wname], run)


def render(results: dict[tuple[str, float, str], dict[str, float]], caps: dict[str, float], cmd: str) -> str:
    lines = [
        f"Command: `{cmd}`",
        "",
        "Simulated; noisy-oracle at 20% error; ratios to vLLM alone (engine `fcfs`, no gateway) on the same "
        "workload and load (mean TTLT, p99 TTLT, throughput); pauses, resumed (recomputed) tokens and "
        "engine preemptions are counts. Capacity of vLLM alone (req/s): "
        + ", ".join(f"{w} {c:.3f}" for w, c in caps.items()),
        "",
        "| workload | load | run | mean TTLT | p99 TTLT | throughput | pauses | resumed tokens | preemptions |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for wname in caps:
        for load in LOADS:
            base = results[(wname, load, "vllm")]
            for run in RUNS:
                r = results[(wname, load, run)]
                lines.append(
                    f"| {wname} | {load} | {NAMES[run]} | {ratio(r['ttlt_mean_s'], base['ttlt_mean_s']):.3f} | "
                    f"{ratio(r['ttlt_p99_s'], base['ttlt_p99_s']):.3f} | "
                    f"{ratio(r['throughput_tok_s'], base['throughput_tok_s']):.3f} | "
                    f"{r['pauses']:.0f} | {r['resumed_tokens']:.0f} | {r['preemptions']:.0f} |"
                )
    lines += ["", "Pause against no pause (gateway sagesched), same run:", ""]
    lines += [
        "| workload | load | mean TTLT | p99 TTLT | throughput | unpriced: mean | p99 | throughput |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for wname in caps:
        for load in LOADS:
            b = results[(wname, load, "gateway")]
            cells = []
            for run in ("gateway+pause", "gateway+pause:unpriced"):
                a = results[(wname, load, run)]
                cells += [
                    f"{ratio(a['ttlt_mean_s'], b['ttlt_mean_s']):.3f}",
                    f"{ratio(a['ttlt_p99_s'], b['ttlt_p99_s']):.3f}",
                    f"{ratio(a['throughput_tok_s'], b['throughput_tok_s']):.3f}",
                ]
            lines.append(f"| {wname} | {load} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=800)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workloads", default=",".join(SETUPS), help="comma-separated subset")
    ap.add_argument("--md", default=None, help="also write the tables to this file")
    args = ap.parse_args()
    t0 = time.perf_counter()
    loaded, caps = at_loads(args.workloads.split(","), args.requests, LOADS)
    jobs = [(wname, load, run, timed) for wname, load, timed in loaded for run in RUNS]
    results: dict[tuple[str, float, str], dict[str, float]] = {}
    with ProcessPoolExecutor(args.workers) as pool:
        for key, summary in pool.map(_job, jobs):
            results[key] = summary
            print(
                f"  {key}: mean TTLT {summary['ttlt_mean_s']:.2f} s, {summary['pauses']:.0f} pauses",
                flush=True,
            )
    cmd = f".venv/bin/python -m benchmarks gateway_pause --requests {args.requests}"
    text = render(results, caps, cmd)
    print(text)
    print(f"{len(jobs)} runs in {time.perf_counter() - t0:.0f} s wall")
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
