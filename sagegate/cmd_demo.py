"""``sagegate demo``: the main job. What does the scheduling gateway buy on a real trace?

Two simulated backends (time-scaled) are started; a slice of the Azure 2023 conversation trace, each
request a real ShareGPT prompt with its own response's length, is replayed straight to them (vLLM alone
behind a round-robin balancer) and then through the gateway (the chosen policy, embedded history
store). The replay sends a realistic client cap as ``max_tokens``; the true length travels only in the
field the simulated backend honours, which the gateway never reads. The load is stated as utilisation
of vLLM alone's capacity on this mix; the same two runs go through the simulator beside the live ones.
Every child process is stopped at the end, whatever happens.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
from pathlib import Path
from typing import Annotated, Any

import typer


def demo(
    minutes: Annotated[float, typer.Option(help="Minutes of arrivals to replay (engine time).")] = 0.5,
    utilisation: Annotated[
        float, typer.Option(help="Offered load as a share of vLLM alone's capacity on the mix.")
    ] = 1.2,
    rate_scale: Annotated[
        float | None, typer.Option(help="Arrivals this many times denser than the trace (overrides).")
    ] = None,
    time_scale: Annotated[
        float,
        typer.Option(
            help="Backends run this many times faster than real time (0.5: half speed, so the gateway, "
            "the backends and the client, each relaying one SSE chunk per token, fit on 2 cores)."
        ),
    ] = 0.5,
    model: Annotated[str, typer.Option(help="Model the simulated backends serve.")] = "qwen3-32b",
    gpu: Annotated[str, typer.Option(help="GPU the simulated backends model.")] = "h100",
    policy: Annotated[str, typer.Option(help="The gateway's policy.")] = "sagesched",
    predictor: Annotated[str, typer.Option(help="The gateway's predictor.")] = "semantic",
    embed_model: Annotated[
        str,
        typer.Option(
            help="The semantic predictor's encoder: minilm (shipped) or mpnet (opt-in: `sagegate predictor "
            "fetch-encoder mpnet` first; 7x the CPU per prompt)."
        ),
    ] = "minilm",
    out: Annotated[Path, typer.Option(help="Results and plots go here.")] = Path("out/demo"),
    quick: Annotated[bool, typer.Option(help="A short run (CI): 10 s of trace, no semantic model.")] = False,
    seed: Annotated[int, typer.Option(help="Seed for prompts and sampling.")] = 0,
    progress: Annotated[bool, typer.Option(help="Progress bars while the runs go.")] = True,
) -> None:
    """Replay a real trace slice to two simulated backends, alone and behind the gateway."""
    from gateway.settings import PredictorSettings
    from loadgen.compare import compare_records, render_table
    from loadgen.plots import plot_backends, plot_runs, prediction_accuracy
    from loadgen.results import write_results
    from sagegate.live import azure_workload
    from sagegate.simtwin import capacity, scale_for, simulate_run
    from sagegate.simtwin import utilisation as util_of

    if embed_model not in ("minilm", "mpnet"):
        raise typer.BadParameter("choose minilm or mpnet", param_hint="--embed-model")
    options = PredictorSettings(embed_model=embed_model)  # type: ignore[arg-type]
    if quick:
        minutes, predictor = min(minutes, 1 / 6), "length-bucket"
    if rate_scale is None:
        mix = azure_workload(max(minutes, 2.0), 4.0, seed, quiet=True).requests  # the same mix, larger
        rate_scale, cap = scale_for(
            lambda s: azure_workload(minutes, s, seed, quiet=True).requests,
            utilisation,
            mix,
            model=model,
            gpu=gpu,
        )
        work = azure_workload(minutes, rate_scale, seed)
    else:
        work = azure_workload(minutes, rate_scale, seed)
        cap = capacity(work.requests, model=model, gpu=gpu)
    if not work.real_text and predictor == "semantic":
        predictor = "length-bucket"
        typer.echo("note: no real prompt text, so the gateway runs the length-only predictor (length-bucket)")
    util = util_of(work.requests, cap)
    typer.echo(
        f"demo: {len(work.requests)} requests: {work.description}; two simulated {model} backends on {gpu} "
        f"at {time_scale:g}× real time; load {util:.2f}× vLLM alone's capacity on this mix "
        f"({cap['req_s']:.2f} req/s; arrivals {rate_scale:.2f}× the trace's); "
        f"gateway policy {policy}, predictor {predictor}"
        + (f" ({embed_model} encoder)" if predictor == "semantic" else "")
    )
    env = {"SAGEGATE_PREDICTOR_OPTIONS__EMBED_MODEL": embed_model} if predictor == "semantic" else {}
    live = _live_runs(work.requests, model, gpu, time_scale, policy, predictor, progress, env)
    alone_name, gw_name = "vLLM alone", f"gateway {policy}"
    typer.echo("simulating the same two runs…")
    sim_alone = simulate_run(work.requests, None, model=model, gpu=gpu)
    # the live gateway's queue timeout (60 s wall) in engine seconds
    sim_gw = simulate_run(
        work.requests,
        policy,
        model=model,
        gpu=gpu,
        predictor=predictor,
        seed=seed,
        max_wait_s=60.0 * time_scale,
        predictor_options=options if predictor == "semantic" else None,
    )
    out.mkdir(parents=True, exist_ok=True)
    runs = {alone_name: live["alone"], gw_name: live["gateway"]}
    for name, records in runs.items():
        write_results(records, out / f"{name.replace(' ', '_')}.jsonl")
    rows = compare_records(live["alone"], live["gateway"])
    _with_preemptions(rows, live["preemptions"])
    render_table(
        rows, alone_name, gw_name, title="What the scheduler bought, live (latencies in ms of engine time)"
    )
    sim_rows = {r.metric: r.ratio for r in compare_records(sim_alone.records, sim_gw.records)}
    live_rows = {r.metric: r.ratio for r in rows}
    acc = prediction_accuracy(live["gateway"])
    summary = _summary(util, live_rows, sim_rows, acc, work.description)
    summary["predictor_paths"] = live.get("paths", {})
    summary["simulated_prediction"] = prediction_accuracy(sim_gw.records)
    if summary["predictor_paths"]:
        paths = ", ".join(f"{k} {v:.0f}" for k, v in sorted(summary["predictor_paths"].items()))
        summary["lines"].append(f"  prediction paths at the gateway: {paths}")
    sim_acc = summary["simulated_prediction"]
    if sim_acc is not None:
        summary["lines"].append(
            f"  the same predictor in the simulator: Kendall tau {sim_acc['kendall_tau']:.2f}, "
            f"median error {sim_acc['median_rel_error']:.0%}"
        )
    for line in summary["lines"]:
        typer.echo(line)
    (out / "summary.json").write_text(
        json.dumps({k: v for k, v in summary.items() if k != "lines"}, indent=1)
    )
    plots = plot_runs(runs, out / "plots", {gw_name: live["queue"]})
    for name, series in live["backends"].items():
        slug = name.replace(" ", "_")
        queue = live["queue"] if name == gw_name else None
        plots.append(plot_backends(series, out / "plots" / f"backends_{slug}.png", queue, title=name))
    typer.echo(f"results in {out}/, plots: {', '.join(str(p) for p in plots)}")


def _live_runs(
    work: Any,
    model: str,
    gpu: str,
    time_scale: float,
    policy: str,
    predictor: str,
    progress: bool,
    env: dict[str, str],
) -> dict[str, Any]:
    """vLLM alone, then the gateway, on the same two fresh backends; KV and queues sampled as they go."""
    from loadgen.client import replay
    from sagegate.live import BackendSampler, backends, gateway, replay_config, round_robin

    out: dict[str, Any] = {"backends": {}, "preemptions": {}}
    with backends(2, model, gpu, time_scale) as urls:
        typer.echo(f"backends up: {' '.join(urls)}; run A: vLLM alone (round robin)…")
        names = {u: f"backend-{i}" for i, u in enumerate(urls)}
        before = _preemptions(urls)
        with BackendSampler(urls, time_scale) as sampler:
            out["alone"] = asyncio.run(round_robin(work, urls, time_scale, progress=progress))
        mid = _preemptions(urls)
        out["backends"]["vLLM alone"] = {names[u]: s for u, s in sampler.series.items()}
        key = secrets.token_urlsafe(12)  # this run's admin key: the dashboard needs one
        with gateway(urls, policy, predictor, env={**env, "SAGEGATE_ADMIN_KEY": key}) as gw:
            typer.echo(f"gateway up: {gw}; run B: through the gateway… (watch it: {gw}/dashboard?key={key})")
            cfg = replay_config(gw, time_scale, metrics=True)
            cfg.progress = progress
            with BackendSampler(urls, time_scale) as sampler:
                through = replay(work, cfg)
            out["paths"] = _predictor_paths(gw)
        out["backends"][f"gateway {policy}"] = {names[u]: s for u, s in sampler.series.items()}
        after = _preemptions(urls)
    out["gateway"], out["queue"] = through.records, through.queue_samples
    out["preemptions"] = {"alone": _diff(mid, before), "gateway": _diff(after, mid)}
    return out


def _predictor_paths(url: str) -> dict[str, float]:
    """How the gateway's predictions were made (``semantic``, ``late`` past the embedding budget,
    ``bucket``/``global``/``cold`` priors), from its ``/metrics``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(url + "/metrics", timeout=10.0, trust_env=False).text
    except httpx.HTTPError:
        return {}
    return {
        s.labels.get("path", "?"): s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == "sagegate_predictor_path"
        for s in fam.samples
        if s.name.endswith("_total")
    }


def _preemptions(urls: list[str]) -> float | None:
    from loadgen.scrape import scrape_preemptions

    return scrape_preemptions([u + "/metrics" for u in urls])


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _with_preemptions(rows: list[Any], counts: dict[str, float | None]) -> None:
    """A client cannot see preemptions: the row shows the backends' own counters."""
    from loadgen.compare import Row

    for i, row in enumerate(rows):
        if row.metric == "preemptions":
            a, b = counts["alone"], counts["gateway"]
            rows[i] = Row("preemptions", math.nan if a is None else a, math.nan if b is None else b)


def _summary(
    util: float,
    live: dict[str, float | None],
    sim: dict[str, float | None],
    acc: dict[str, float] | None,
    description: str,
) -> dict[str, Any]:
    """The headline: the gateway's ratios against vLLM alone, live beside simulated, and how well the
    predictor ranked the outputs it could not see."""

    def fmt(x: float | None) -> str:
        return "—" if x is None else f"{x:.3f}"

    keys = ("ttlt_mean_s", "ttlt_p50_s", "ttlt_p99_s", "ttft_mean_s", "throughput_tok_s")
    lines = [f"at {util:.2f}× vLLM alone's capacity (gateway ÷ vLLM alone; below 1 is better for latency):"]
    for k in keys:
        lines.append(f"  {k:<18} live {fmt(live.get(k))}   simulated {fmt(sim.get(k))}")
    agree = None
    lm, sm = live.get("ttlt_mean_s"), sim.get("ttlt_mean_s")
    if lm is not None and sm is not None:
        agree = lm / sm
        lines.append(f"  live ÷ simulated mean-TTLT ratio: {agree:.3f}")
    if acc is not None:
        lines.append(
            f"  the predictor, judged on outputs it never saw: Kendall tau {acc['kendall_tau']:.2f}, "
            f"median error of its mean {acc['median_rel_error']:.0%}"
        )
    return {
        "workload": description,
        "utilisation": util,
        "live_ratios": live,
        "simulated_ratios": sim,
        "live_over_simulated_mean_ttlt": agree,
        "prediction": acc,
        "lines": lines,
    }
