"""``sagegate demo``: the main job. What does the scheduling gateway buy on a real trace?

Two simulated backends (time-scaled) are started; a slice of the Azure 2023 conversation trace, with
real ShareGPT prompts paired by length, is replayed straight to them (vLLM alone behind a round-robin
balancer) and then through the gateway (the chosen policy, embedded history store); the two runs are
set side by side. Every child process is stopped at the end, whatever happens.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer


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
    from sagegate.live import azure_workload, backends, gateway, replay_config, round_robin

    if quick:
        minutes, predictor = min(minutes, 1 / 3), "length-bucket"
    work = azure_workload(minutes, rate_scale, seed)
    typer.echo(
        f"demo: {len(work)} requests ({minutes:g} minutes of arrivals, trace × {rate_scale:g}), "
        f"two simulated {model} backends on {gpu} at {time_scale:g}× real time; "
        f"policy {policy}, predictor {predictor}"
    )
    with backends(2, model, gpu, time_scale) as urls:
        typer.echo(f"backends up: {' '.join(urls)}; run A: vLLM alone (round robin)…")
        alone = asyncio.run(round_robin(work, urls, time_scale))
        with gateway(urls, policy, predictor) as gw:
            typer.echo(f"gateway up: {gw}; run B: through the gateway…")
            through = replay(work, replay_config(gw, time_scale, metrics=True))
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
