"""``sagegate demo``: the main job. What does the scheduling gateway buy on a real trace?

Two simulated backends (time-scaled) are started; a slice of the Azure 2023 conversation trace, with
real ShareGPT prompts paired by length, is replayed straight to them (vLLM alone behind a round-robin
balancer) and then through the gateway (the chosen policy, embedded history store); the two runs are
set side by side. Every child process is stopped at the end, whatever happens.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from loadgen.client import ReplayConfig
    from loadgen.records import TraceRequest
    from loadgen.results import RequestRecord


def demo(
    minutes: Annotated[float, typer.Option(help="Minutes of arrivals to replay (engine time).")] = 2.0,
    rate_scale: Annotated[float, typer.Option(help="Arrivals this many times denser than the trace.")] = 1.5,
    time_scale: Annotated[
        float, typer.Option(help="Backends run this many times faster than real time.")
    ] = 2.0,
    model: Annotated[str, typer.Option(help="Model the simulated backends serve.")] = "qwen3-32b",
    gpu: Annotated[str, typer.Option(help="GPU the simulated backends model.")] = "h100",
    policy: Annotated[str, typer.Option(help="The gateway's policy.")] = "sagesched",
    predictor: Annotated[str, typer.Option(help="The gateway's predictor.")] = "semantic",
    out: Annotated[Path, typer.Option(help="Results and plots go here.")] = Path("out/demo"),
    quick: Annotated[bool, typer.Option(help="A short run (CI): 20 s of trace, no semantic model.")] = False,
    seed: Annotated[int, typer.Option(help="Seed for prompts and sampling.")] = 0,
) -> None:
    """Replay a real trace slice to two simulated backends, alone and behind the gateway."""
    from loadgen.client import replay
    from loadgen.compare import compare_records, render_table
    from loadgen.plots import plot_runs
    from loadgen.results import write_results
    from sagegate.procs import spawned

    if quick:
        minutes, predictor = min(minutes, 1 / 3), "length-bucket"
    work = _workload(minutes, rate_scale, seed)
    typer.echo(
        f"demo: {len(work)} requests ({minutes:g} minutes of arrivals, trace × {rate_scale:g}), "
        f"two simulated {model} backends on {gpu} at {time_scale:g}× real time; "
        f"policy {policy}, predictor {predictor}"
    )
    backend_args = ["--model", model, "--gpu", gpu, "--time-scale", str(time_scale)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with (
        spawned("sagegate.cmd_backend", backend_args) as b1,
        spawned("sagegate.cmd_backend", backend_args) as b2,
    ):
        typer.echo(f"backends up: {b1} {b2}; run A: vLLM alone (round robin)…")
        alone = asyncio.run(_round_robin(work, [b1, b2], time_scale))
        gateway_args = [
            "serve",
            "--backend",
            b1,
            "--backend",
            b2,
            "--policy",
            policy,
            "--predictor",
            predictor,
        ]
        with spawned("sagegate.cli", gateway_args, ready_path="/ready", startup_timeout_s=120, env=env) as gw:
            typer.echo(f"gateway up: {gw}; run B: through the gateway…")
            through = replay(work, _config(gw, time_scale, metrics=True))
    runs = {"vLLM alone": alone, f"gateway {policy}": through.records}
    out.mkdir(parents=True, exist_ok=True)
    for name, records in runs.items():
        write_results(records, out / f"{name.replace(' ', '_')}.jsonl")
    render_table(
        compare_records(alone, through.records),
        "vLLM alone",
        f"gateway {policy}",
        title="What the scheduler bought (latencies in ms of engine time)",
    )
    plots = plot_runs(runs, out / "plots", {f"gateway {policy}": through.queue_samples})
    typer.echo(f"results in {out}/, plots: {', '.join(str(p) for p in plots)}")


def _workload(minutes: float, rate_scale: float, seed: int) -> list[TraceRequest]:
    """The Azure conversation trace's first ``minutes`` with ShareGPT prompts paired by length; a
    synthetic workload with filler prompts when the shared data is absent."""
    from loadgen.data import AZURE_CONV, SHAREGPT, data_file
    from loadgen.schedule import prepare_workload

    trace, pairs = data_file(*AZURE_CONV), data_file(*SHAREGPT)
    if trace.exists() and pairs.exists():
        work = prepare_workload(
            trace, duration=minutes * 60, rate_scale=rate_scale, prompts="sharegpt", sharegpt=pairs, seed=seed
        )
    else:
        typer.echo(f"note: {trace} or {pairs} is absent: a synthetic workload with filler prompts", err=True)
        work = prepare_workload(
            "synthetic",
            rate=5.0 * rate_scale,
            requests=int(minutes * 300 * rate_scale),
            prompts="filler",
            seed=seed,
        )
    return work.requests


def _config(url: str, time_scale: float, *, metrics: bool = False) -> ReplayConfig:
    from loadgen.client import ReplayConfig

    return ReplayConfig(
        url=url, time_scale=time_scale, queue_metric="sagegate_queue_depth" if metrics else None
    )


async def _round_robin(
    work: Sequence[TraceRequest], urls: Sequence[str], time_scale: float
) -> list[RequestRecord]:
    """vLLM alone: a plain balancer sends request i to backend i mod n."""
    from loadgen.client import replay_async

    parts = [list(work[i :: len(urls)]) for i in range(len(urls))]
    results = await asyncio.gather(
        *(replay_async(p, _config(u, time_scale)) for p, u in zip(parts, urls, strict=True))
    )
    return sorted((r for res in results for r in res.records), key=lambda r: r.rid)
