"""``sagegate replay``: drive an OpenAI-compatible endpoint with a trace in open loop, and compare or
plot result files (live or simulated)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from sagegate.core.request import DEFAULT_CLIENT_MAX_TOKENS
from sagegate.workload_flags import ClientCap, WorkloadFlags, parse_reader_opts

__all__ = ["compare", "parse_headers", "parse_reader_opts", "plot", "replay", "replay_app"]

replay_app = typer.Typer(
    help="Replay a trace against an OpenAI-compatible endpoint in open loop; compare and plot results.",
    add_completion=False,
)

_SLO_TTFT = typer.Option("--slo-ttft-ms", help="Goodput SLO: time to first token, ms.")
_SLO_TPOT = typer.Option("--slo-tpot-ms", help="Goodput SLO: time per output token, ms.")
_SLO_TTLT = typer.Option("--slo-ttlt-ms", help="Goodput SLO: time to last token, ms.")


def _slo(ttft_ms: float | None, tpot_ms: float | None, ttlt_ms: float | None) -> Any:
    from sagegate.core.summary import Slo

    def s(ms: float | None) -> float | None:
        return None if ms is None else ms / 1000.0

    return Slo(ttft_s=s(ttft_ms), tpot_s=s(tpot_ms), ttlt_s=s(ttlt_ms))


def parse_headers(values: list[str] | None) -> dict[str, str]:
    """``["x-tenant: a", ...]`` as a dict; a value without a colon is an error."""
    out: dict[str, str] = {}
    for raw in values or []:
        name, sep, value = raw.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"--header must look like 'name: value', got {raw!r}")
        out[name.strip().lower()] = value.strip()
    return out


def _json_safe(d: dict[str, float]) -> dict[str, float | None]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


@replay_app.callback(invoke_without_command=True)
def replay(
    ctx: typer.Context,
    url: Annotated[str | None, typer.Option(help="Server base URL, e.g. http://127.0.0.1:8000.")] = None,
    trace: Annotated[str | None, typer.Option(help="Trace file or folder, or 'synthetic'.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="Trace format, or auto.")] = "auto",
    limit: Annotated[int | None, typer.Option(help="Use the first N requests of the trace.")] = None,
    duration: Annotated[float | None, typer.Option(help="Keep arrivals in the first S seconds.")] = None,
    rate_scale: Annotated[float, typer.Option(help="Compress the trace's times: 2 = twice as dense.")] = 1.0,
    rate: Annotated[float | None, typer.Option(help="Re-time to this many requests/s instead.")] = None,
    arrival: Annotated[str, typer.Option(help="Re-timing process: poisson or gamma.")] = "poisson",
    cv: Annotated[float, typer.Option(help="Gamma arrivals: coefficient of variation.")] = 1.0,
    warmup: Annotated[
        float, typer.Option(help="Seconds at the start sent but left out of the summary.")
    ] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed for re-timing and prompts.")] = 0,
    reader_opt: Annotated[
        list[str] | None,
        typer.Option(
            help="Reader option name=value (repeatable), e.g. start_s=3600 or clients=[1,2] (ServeGen)."
        ),
    ] = None,
    prompts: Annotated[
        str, typer.Option(help="Prompt text: auto (trace, else filler), filler, sharegpt, trace.")
    ] = "auto",
    sharegpt: Annotated[Path | None, typer.Option(help="ShareGPT pairs file for --prompts sharegpt.")] = None,
    api: Annotated[str, typer.Option(help="completions or chat.")] = "completions",
    model: Annotated[str | None, typer.Option(help="Model name (default: the server's first).")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="SAGEGATE_API_KEY", help="Bearer token.")] = None,
    header: Annotated[list[str] | None, typer.Option(help="Extra header 'name: value' (repeatable).")] = None,
    extra_body: Annotated[str | None, typer.Option(help="JSON object merged into every body.")] = None,
    max_tokens: ClientCap = DEFAULT_CLIENT_MAX_TOKENS,
    force_output: Annotated[
        bool,
        typer.Option(
            help="Send each request's true length in sim_output_tokens (only a simulated backend honours it)."
        ),
    ] = True,
    backend_metrics: Annotated[
        list[str] | None,
        typer.Option(help="Backend /metrics URL to read preemptions from (repeatable; default URL/metrics)."),
    ] = None,
    max_connections: Annotated[int, typer.Option(help="Connection limit (delays are reported).")] = 1000,
    timeout: Annotated[float, typer.Option(help="Per-request timeout, seconds.")] = 600.0,
    time_scale: Annotated[
        float, typer.Option(help="The backend runs this much faster than real time (simulated backends).")
    ] = 1.0,
    trace_headers: Annotated[
        bool,
        typer.Option(help="Send the trace's tenant/priority/deadline as x-tenant/x-priority/x-deadline-ms."),
    ] = True,
    queue_metric: Annotated[
        str, typer.Option(help="Prometheus gauge polled for queue depth ('' = none).")
    ] = "sagegate_queue_depth",
    metrics_url: Annotated[str | None, typer.Option(help="Metrics URL (default: URL/metrics).")] = None,
    metrics_interval: Annotated[float, typer.Option(help="Seconds between metric polls.")] = 0.5,
    slo_ttft_ms: Annotated[float | None, _SLO_TTFT] = None,
    slo_tpot_ms: Annotated[float | None, _SLO_TPOT] = None,
    slo_ttlt_ms: Annotated[float | None, _SLO_TTLT] = None,
    out: Annotated[
        Path | None, typer.Option(help="Results file: .jsonl, or .parquet (needs pyarrow).")
    ] = None,
    plots: Annotated[Path | None, typer.Option(help="Write PNG plots into this folder.")] = None,
    progress: Annotated[bool, typer.Option(help="Live progress bar (on stderr).")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Replay a trace against URL in open loop and print the summary."""
    if ctx.invoked_subcommand is not None:
        return
    if url is None or trace is None:
        typer.echo("error: --url and --trace are required (or use a subcommand: compare, plot)", err=True)
        raise typer.Exit(2)
    params = dict(locals())
    from sagegate.core.summary import errors_by_kind, mark_warmup, summarize
    from sagegate.loadgen.client import ReplayConfig
    from sagegate.loadgen.client import replay as run_replay
    from sagegate.loadgen.results import write_results

    try:
        work = WorkloadFlags.pick(params).load()
        body = json.loads(extra_body) if extra_body else {}
        if not isinstance(body, dict):
            raise ValueError("--extra-body must be a JSON object")
        cfg = ReplayConfig(
            url=url,
            api=api,
            model=model,
            api_key=api_key,
            headers=parse_headers(header),
            extra_body=body,
            force_output=force_output,
            backend_metrics=list(backend_metrics or []),
            max_connections=max_connections,
            timeout_s=timeout,
            time_scale=time_scale,
            trace_headers=trace_headers,
            queue_metric=queue_metric or None,
            metrics_url=metrics_url,
            metrics_interval_s=metrics_interval,
            progress=progress and not as_json,
        )
        slo = _slo(slo_ttft_ms, slo_tpot_ms, slo_ttlt_ms)
    except (ValueError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    for note in work.notes:
        typer.echo(f"note: {note}", err=True)
    result = run_replay(work.requests, cfg)
    mark_warmup(result.records, work.warmup_s)
    summary = summarize(result.records, slo)
    # A client sees no preemptions: the backends' counters say, or nobody does.
    summary["preemptions"] = math.nan if result.preemptions is None else result.preemptions
    errors = errors_by_kind(result.records)
    if out is not None:
        write_results(result.records, out)
        meta = {**result.meta(), "summary": _json_safe(summary), "errors_by_kind": errors, "trace": trace}
        Path(str(out) + ".meta.json").write_text(json.dumps(meta))
    plot_paths: list[Path] = []
    if plots is not None:
        from sagegate.loadgen.plots import plot_runs

        name = out.stem if out is not None else "replay"
        plot_paths = plot_runs({name: result.records}, plots, {name: result.queue_samples})
    limit_note = ""
    if result.delayed_sends:
        limit_note = (
            f"the connection limit ({cfg.max_connections}) delayed {result.delayed_sends} sends, "
            f"by up to {result.max_send_delay_s * 1000:.0f} ms"
        )
    failed_all = summary["completed"] == 0
    if as_json:
        payload = {
            "summary": _json_safe(summary),
            "outputs": result.outputs_note(),
            "errors_by_kind": errors,
            "delayed_sends": result.delayed_sends,
            "max_send_delay_s": result.max_send_delay_s,
            "queue_samples": len(result.queue_samples),
            "model": result.model,
            "out": None if out is None else str(out),
            "plots": [str(p) for p in plot_paths],
        }
        typer.echo(json.dumps(payload))
    else:
        title = f"replay of {trace} against {url} ({len(work.requests)} requests)"
        _print_summary(summary, errors, title)
        typer.echo(result.outputs_note())
        if limit_note:
            typer.echo(f"warning: {limit_note}", err=True)
        if out is not None:
            typer.echo(f"results: {out}")
        for p in plot_paths:
            typer.echo(f"plot: {p}")
    if failed_all:
        typer.echo(f"error: none of the {len(work.requests)} requests completed", err=True)
        raise typer.Exit(1)


def _print_summary(summary: dict[str, float], errors: dict[str, int], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("mean", justify="right")
    table.add_column("p50", justify="right")
    table.add_column("p90", justify="right")
    table.add_column("p99", justify="right")
    for metric in ("ttft", "tpot", "itl", "ttlt"):
        if f"{metric}_mean_s" not in summary:
            continue
        cells = [summary.get(f"{metric}_{s}_s", math.nan) for s in ("mean", "p50", "p90", "p99")]
        table.add_row(
            metric.upper() + " (ms)", *("—" if math.isnan(c) else f"{c * 1000:,.1f}" for c in cells)
        )
    console = Console()
    console.print(table)
    other = Table(show_header=False)
    other.add_column("figure")
    other.add_column("value", justify="right")
    for key in ("requests", "completed", "rejected", "errors", "throughput_req_s", "throughput_tok_s"):
        other.add_row(key, f"{summary[key]:,.2f}")
    pre = summary.get("preemptions", math.nan)
    other.add_row("preemptions (backends)", "unknown" if math.isnan(pre) else f"{pre:,.0f}")
    for key in (
        "slo_attainment",
        "goodput_req_s",
        "goodput_tok_s",
        "send_lateness_p50_s",
        "send_lateness_p99_s",
    ):
        if key in summary and not math.isnan(summary[key]):
            other.add_row(key, f"{summary[key]:,.4f}")
    for kind, n in errors.items():
        other.add_row(f"errors[{kind}]", str(n))
    console.print(other)


@replay_app.command("compare")
def compare(
    a: Annotated[Path, typer.Argument(help="Result file A (JSON lines or Parquet).")],
    b: Annotated[Path, typer.Argument(help="Result file B.")],
    slo_ttft_ms: Annotated[float | None, _SLO_TTFT] = None,
    slo_tpot_ms: Annotated[float | None, _SLO_TPOT] = None,
    slo_ttlt_ms: Annotated[float | None, _SLO_TTLT] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Two result files (live or simulated) side by side, with the ratio B/A."""
    from sagegate.loadgen.compare import compare_files, render_table, rows_to_json

    try:
        rows = compare_files(a, b, _slo(slo_ttft_ms, slo_tpot_ms, slo_ttlt_ms))
    except (OSError, ValueError, TypeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if as_json:
        typer.echo(json.dumps(rows_to_json(rows, str(a), str(b))))
    else:
        render_table(rows, a.name, b.name, title=f"{a.name} vs {b.name}")


@replay_app.command("plot")
def plot(
    files: Annotated[list[Path], typer.Argument(help="Result files; CDFs overlay them.")],
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Folder for the PNG files.")] = Path("plots"),
) -> None:
    """Latency CDFs of several runs, and per run TTFT and queue depth over time."""
    from sagegate.loadgen.plots import plot_runs, read_queue_samples
    from sagegate.loadgen.results import read_results

    runs = {f.stem: read_results(f) for f in files}
    queues = {f.stem: read_queue_samples(f) for f in files}
    for p in plot_runs(runs, out_dir, queues):
        typer.echo(str(p))
