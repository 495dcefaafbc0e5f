"""``sagegate demo``: the main job. What does the scheduling gateway buy on multi-turn traffic, against
vLLM behind round robin and against the cache-aware router a user would otherwise run?

Multi-turn ShareGPT conversations (real text; each turn re-sends its history, so prefixes repeat) start
on the Azure 2023 conversation trace's arrivals. Each draw (its own part of the trace, its own
conversations) is replayed live through three set-ups on fresh simulated backends
(``sagegate.demo_setups``), at a load stated as utilisation of vLLM-behind-round-robin's capacity on
the mix, and through the simulator beside them. The replay sends a realistic client cap as
``max_tokens``; the true length travels only in the field the simulated backend honours, which no
front reads. Every child process is stopped at the end, whatever happens.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from sagegate.core.summary import Slo
    from sagegate.demo_setups import SetupRun


def demo(
    minutes: Annotated[float, typer.Option(help="Minutes of arrivals per draw (engine time).")] = 0.75,
    draws: Annotated[
        int, typer.Option(min=1, help="Draws: each its own trace window and conversations.")
    ] = 2,
    utilisation: Annotated[
        float, typer.Option(help="Offered load as a share of vLLM-behind-round-robin's capacity on the mix.")
    ] = 1.2,
    time_scale: Annotated[
        float, typer.Option(help="Backends run this many times faster than real time.")
    ] = 1.0,
    model: Annotated[str, typer.Option(help="Model the simulated backends serve.")] = "qwen3-32b",
    gpu: Annotated[str, typer.Option(help="GPU the simulated backends model.")] = "h100",
    policy: Annotated[str, typer.Option(help="The gateway's policy.")] = "sagesched",
    predictor: Annotated[str, typer.Option(help="The gateway's predictor (its default: prefix).")] = "prefix",
    embed_model: Annotated[
        str,
        typer.Option(
            help="The semantic predictor's encoder: minilm (shipped) or mpnet (opt-in: `sagegate predictor "
            "fetch-encoder mpnet` first; 7x the CPU per prompt)."
        ),
    ] = "minilm",
    slo_ttft_s: Annotated[float, typer.Option(help="Goodput's SLO: time to first token (s).")] = 2.0,
    slo_tpot_ms: Annotated[float, typer.Option(help="Goodput's SLO: time per output token (ms).")] = 100.0,
    router: Annotated[bool, typer.Option(help="Run the cache-aware router baseline (vllm-router).")] = True,
    out: Annotated[Path, typer.Option(help="Results and plots go here.")] = Path("out/demo"),
    quick: Annotated[bool, typer.Option(help="A short run (CI): 10 s a draw, no semantic model.")] = False,
    seed: Annotated[int, typer.Option(help="The first draw (draws are seed, seed+1, …).")] = 0,
    progress: Annotated[bool, typer.Option(help="Progress bars while the runs go.")] = True,
    live: Annotated[
        bool,
        typer.Option(
            help="Run the set-ups live (--no-live: only the simulated twin, round robin against the "
            "gateway, seconds a draw: many draws show the spread a live run's two cannot)."
        ),
    ] = True,
) -> None:
    """Replay multi-turn conversations through vLLM behind round robin, behind a cache-aware router,
    and behind the gateway, draw by draw, and print the headline table."""
    from sagegate.core.summary import Slo
    from sagegate.demo_setups import GATEWAY, ROUND_ROBIN, ROUTER, DemoSetup, router_check, setup_names
    from sagegate.harness.live import data_sources, demo_draw
    from sagegate.harness.procs import exit_on_sigterm
    from sagegate.loadgen.headline import render_headline, run_figures

    exit_on_sigterm()
    if embed_model not in ("minilm", "mpnet"):
        raise typer.BadParameter("choose minilm or mpnet", param_hint="--embed-model")
    if quick:
        minutes, predictor = min(minutes, 1 / 6), "length-bucket"
    if not live:
        router = False
    binary, note = router_check() if router else (None, "the cache-aware router is left out")
    typer.echo(note)
    env = {"SAGEGATE_PREDICTOR_OPTIONS__EMBED_MODEL": embed_model} if predictor == "semantic" else {}
    setup = DemoSetup(model, gpu, time_scale, policy, predictor, env, progress, binary)
    slo = Slo(ttft_s=slo_ttft_s, tpot_s=slo_tpot_ms / 1000.0)
    names = setup_names(setup)
    typer.echo(f"data: {data_sources()}")
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names} if live else {}
    sim: dict[str, list[dict[str, float]]] = {ROUND_ROBIN: [], GATEWAY: []}
    draws_info: list[dict[str, Any]] = []
    first: dict[str, SetupRun] = {}
    out.mkdir(parents=True, exist_ok=True)
    for draw in range(seed, seed + draws):
        work, info = demo_draw(draw, minutes, utilisation, model, gpu)
        draws_info.append(info)
        typer.echo(
            f"\ndraw {draw}: {len(work)} requests: {info['description']}; two simulated {model} "
            f"backends on {gpu} at {time_scale:g}× real time; load {info['utilisation']:.2f}× vLLM "
            f"behind round robin's capacity on this mix ({info['capacity_req_s']:.2f} req/s)"
        )
        for name in names if live else []:
            run = _run_setup(name, work, setup)
            runs[name].append(run_figures(run.records, run.counters, slo))
            _write_records(run, out / f"draw{draw}_{name.replace(' ', '_')}.jsonl")
            first.setdefault(name, run)
        typer.echo("simulating the same draw…")
        for name, records in _simulated(work, setup, draw, embed_model).items():
            sim[name].append(run_figures(records, None, slo))
    shown = runs or sim  # the twin's when nothing runs live
    offered = _mean(d["utilisation"] for d in draws_info)
    title = (
        f"{'' if live else 'Simulated: '}Multi-turn chat at {offered:.2f}× round robin's capacity, "
        f"{draws} draw{'s' if draws > 1 else ''} (mean, and the range over draws); "
        f"SLO TTFT ≤ {slo_ttft_s:g} s, TPOT ≤ {slo_tpot_ms:g} ms; engine seconds; ÷: the gateway's ratio"
    )
    baselines = [n for n in (ROUND_ROBIN, ROUTER) if n in shown]
    render_headline(shown, GATEWAY, baselines, title)
    lines = _twin_lines(runs, sim) if live else []
    lines += _prediction_lines(first.get(GATEWAY), first.get(ROUND_ROBIN))
    for line in lines:
        typer.echo(line)
    _write_summary(out, runs, sim, draws_info, baselines, slo, lines)
    plots = _plots(first, out / "plots") if first else []
    typer.echo(f"results in {out}/" + (f", plots: {', '.join(str(p) for p in plots)}" if plots else ""))


def _run_setup(name: str, work: Any, setup: Any) -> SetupRun:
    from sagegate.demo_setups import run_setup

    typer.echo(f"  {name}…")
    return run_setup(name, work, setup, lambda msg: typer.echo(f"    {msg}"))


def _simulated(work: Any, setup: Any, draw: int, embed_model: str) -> dict[str, list[Any]]:
    """Round robin and the gateway in the simulator, with the live gateway's settings."""
    from sagegate.demo_setups import GATEWAY, ROUND_ROBIN
    from sagegate.gateway.settings_predictor import predictor_options
    from sagegate.harness.simtwin import simulate_run

    options = (
        predictor_options("semantic", embed_model=embed_model) if setup.predictor == "semantic" else None
    )
    alone = simulate_run(work, None, model=setup.model, gpu=setup.gpu)
    gw = simulate_run(
        work,
        setup.policy,
        model=setup.model,
        gpu=setup.gpu,
        predictor=setup.predictor,
        seed=draw,
        max_wait_s=60.0 * setup.time_scale,  # the live gateway's queue timeout (60 s wall)
        predictor_options=options,
    )
    return {ROUND_ROBIN: alone.records, GATEWAY: gw.records}


def _twin_lines(live: dict[str, list[dict[str, float]]], sim: dict[str, list[dict[str, float]]]) -> list[str]:
    """Live beside the simulated twin: each set-up's mean TTLT, live ÷ simulated."""
    out = ["the simulated twin (the same draws in the simulator), mean TTLT live ÷ simulated:"]
    for name, runs in sim.items():
        pairs = [lv["ttlt_mean_s"] / sv["ttlt_mean_s"] for lv, sv in zip(live[name], runs, strict=True)]
        out.append(f"  {name}: " + ", ".join(f"{x:.2f}" for x in pairs))
    return out


def _prediction_lines(gw: SetupRun | None, rr: SetupRun | None) -> list[str]:
    """How well the predictor ranked outputs it never saw, and what the requests it under-predicted
    most cost against round robin (first draw)."""
    from sagegate.loadgen.headline import under_predicted
    from sagegate.loadgen.plots import prediction_accuracy

    if gw is None:
        return []
    out = []
    acc = prediction_accuracy(gw.records)
    if acc is not None:
        out.append(
            "the predictor, judged on outputs it never saw (first draw): "
            f"Kendall tau {acc['kendall_tau']:.2f}, median error of its mean {acc['median_rel_error']:.0%}"
        )
    if gw.paths:
        out.append("  prediction paths: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(gw.paths.items())))
    if rr is not None and (cost := under_predicted(gw.records, rr.records)) is not None:
        out.append(
            f"the {cost['n']:.0f} long requests predicted at under half their length (first draw): mean "
            f"TTLT {cost['ttlt_gateway_s']:.1f} s via the gateway, {cost['ttlt_baseline_s']:.1f} s behind "
            f"round robin; the slowest: first token after {cost['worst_ttft_gateway_s']:.1f} s "
            f"({cost['worst_ttft_baseline_s']:.1f} s), last after {cost['worst_ttlt_gateway_s']:.1f} s "
            f"({cost['worst_ttlt_baseline_s']:.1f} s)"
        )
    return out


def _write_records(run: SetupRun, path: Path) -> None:
    from sagegate.loadgen.results import write_results

    write_results(run.records, path)


def _write_summary(
    out: Path,
    live: dict[str, list[dict[str, float]]],
    sim: dict[str, list[dict[str, float]]],
    draws: list[dict[str, Any]],
    baselines: list[str],
    slo: Slo,
    lines: list[str],
) -> None:
    from dataclasses import asdict

    from sagegate.demo_setups import GATEWAY
    from sagegate.loadgen.headline import Spread, headline

    head = headline(live or sim, GATEWAY, baselines)  # the table shown: the twin's when nothing ran live

    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, Spread):
            return {k: (None if math.isnan(v) else v) for k, v in asdict(x).items()}
        return None if isinstance(x, float) and math.isnan(x) else x

    summary = {
        "draws": draws,
        "slo": asdict(slo),
        "live": {k: [plain(d) for d in v] for k, v in live.items()},
        "simulated": {k: [plain(d) for d in v] for k, v in sim.items()},
        "headline": plain(head),
        "lines": lines,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


def _plots(first: dict[str, SetupRun], out: Path) -> list[Path]:
    """The first draw's pictures: latency CDFs, timelines, predictions, each set-up's backends, and the
    engines' hit rate over time."""
    from sagegate.loadgen.plots import plot_backends, plot_hit_rate, plot_runs

    runs = {name: run.records for name, run in first.items()}
    queues = {name: run.queue for name, run in first.items() if run.queue}
    paths = plot_runs(runs, out, queues)
    for name, run in first.items():
        slug = name.replace(" ", "_").replace("-", "_")
        paths.append(plot_backends(run.samples, out / f"backends_{slug}.png", queues.get(name), title=name))
    paths.append(plot_hit_rate({name: run.samples for name, run in first.items()}, out / "hit_rate.png"))
    return paths


def _mean(values: Any) -> float:
    vals = list(values)
    return sum(vals) / len(vals) if vals else math.nan
