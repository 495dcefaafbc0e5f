"""``sagegate simulate``: replay a workload through the discrete-event simulator."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sagegate import engine_flags as ef
from sagegate.core.request import DEFAULT_CLIENT_MAX_TOKENS, TraceRequest
from sagegate.workload_flags import ClientCap

if TYPE_CHECKING:
    from sagegate.core.predictor import LengthPredictor
    from sagegate.policies.base import Policy


def simulate(
    trace: Annotated[
        str, typer.Option(help="Trace file or folder, or 'synthetic' for a generated workload.")
    ] = "synthetic",
    fmt: Annotated[str, typer.Option("--format", help="Trace format, or auto.")] = "auto",
    policy: Annotated[
        str, typer.Option(help="Policy spec, e.g. sagesched or 'fastserve:base_quantum_ms=10'.")
    ] = "fcfs",
    level: Annotated[
        str, typer.Option(help="gateway (the gateway's queue) or engine (inside vLLM).")
    ] = "engine",
    predictor: Annotated[str | None, typer.Option(help="Output-length predictor for the policy.")] = None,
    prediction_error: Annotated[float, typer.Option(help="Relative error of noisy-oracle.")] = 0.2,
    engines: Annotated[int, typer.Option(help="Number of engines (backends).")] = 1,
    admission_rule: Annotated[
        str, typer.Option(help="Gateway admission: peak (projected peak KV) or sum (summed charges).")
    ] = "peak",
    rate_scale: Annotated[float, typer.Option(help="2 = arrivals twice as dense.")] = 1.0,
    limit: Annotated[int | None, typer.Option(help="Use the first N requests.")] = None,
    duration: Annotated[float | None, typer.Option(help="Keep arrivals before this many seconds.")] = None,
    requests: Annotated[int, typer.Option(help="Synthetic: number of requests.")] = 1000,
    rate: Annotated[
        float | None, typer.Option(help="Re-time arrivals to this rate, requests/s (synthetic: 10).")
    ] = None,
    arrival: Annotated[str, typer.Option(help="Re-timed arrivals: poisson or gamma.")] = "poisson",
    cv: Annotated[float, typer.Option(help="Gamma arrivals: coefficient of variation.")] = 1.0,
    warmup: Annotated[float, typer.Option(help="Seconds at the start left out of the summary.")] = 0.0,
    prompts: Annotated[
        str, typer.Option(help="Prompt text: none, filler, sharegpt (semantic predictor).")
    ] = "none",
    reader_opt: Annotated[
        list[str] | None, typer.Option("--reader-opt", help="Reader option name=value (repeatable).")
    ] = None,
    max_tokens: ClientCap = DEFAULT_CLIENT_MAX_TOKENS,
    queue_limits: Annotated[
        bool, typer.Option(help="Gateway level: the live gateway's queue bounds and timeout.")
    ] = True,
    max_wait_s: Annotated[float, typer.Option(help="Gateway level: queue timeout, engine seconds.")] = 60.0,
    placement: Annotated[
        str,
        typer.Option(help="Gateway level: cache_aware (weigh each engine's cached prefix) or least_loaded."),
    ] = "cache_aware",
    scorer: Annotated[
        list[str] | None,
        typer.Option(
            "--scorer",
            help="Gateway level: a placement scorer and its weight, name=weight (repeatable; "
            "docs/placement.md; a picker that weighs scorers). None given: the picker's own.",
        ),
    ] = None,
    picker: Annotated[
        str, typer.Option(help="Gateway level: the placement picker (forecast, incumbent, max_score).")
    ] = "forecast",
    slo_ttft_ms: Annotated[float | None, typer.Option(help="Goodput SLO on TTFT, ms.")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(help="Goodput SLO on TPOT, ms.")] = None,
    slo_ttlt_ms: Annotated[float | None, typer.Option(help="Goodput SLO on TTLT, ms.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for everything random.")] = 0,
    model: ef.Model = "llama-3.1-8b",
    gpu: ef.Gpu = "h100",
    max_num_seqs: ef.MaxNumSeqs = 256,
    max_num_batched_tokens: ef.MaxBatched = 8192,
    block_size: ef.BlockSize = 16,
    gpu_memory_utilization: ef.GpuUtil = 0.9,
    num_gpu_blocks_override: ef.BlocksOverride = None,
    enable_prefix_caching: ef.PrefixCaching = True,
    tensor_parallel_size: ef.TensorParallel = 1,
    variant: ef.Variant = "v1",
    scheduler_reserve_full_isl: ef.ReserveFullIsl = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    out: Annotated[
        Path | None, typer.Option(help="Write one record per request here (.jsonl, or .parquet).")
    ] = None,
) -> None:
    """Replay a workload through the gateway queue and N simulated engines; print the summary."""
    params = dict(locals())  # the options by name, before any local of the body
    from sagegate.core.summary import Slo, mark_warmup, summarize
    from sagegate.loadgen.results import write_results
    from sagegate.policies.admission import AdmissionConfig
    from sagegate.policies.placement import build_profile
    from sagegate.sim.des import QueueLimits, SimSetup, client_view
    from sagegate.sim.des import simulate as run
    from sagegate.workload_flags import WorkloadFlags

    try:
        cfg, perf = ef.EngineFlags.pick(params).build()
        work = WorkloadFlags.pick(params).load()
        workload = work.requests
        setup = SimSetup(
            perf=perf,
            engine=cfg,
            engines=engines,
            level=level,
            policy=make_policy(policy, seed),
            predictor=make_predictor(predictor, policy, level, prediction_error, seed, workload),
            admission=AdmissionConfig(rule=admission_rule),  # type: ignore[arg-type]  # checked inside
            queue_limits=QueueLimits(max_wait_s=max_wait_s) if queue_limits else None,
            placement=placement,
            profile=build_profile(_weights(scorer) if scorer else None, picker),
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    result = run(workload, setup)
    client_view(result, perf.frontend_s)
    mark_warmup(result.records, work.warmup_s)
    slo = Slo(*(None if v is None else v / 1000 for v in (slo_ttft_ms, slo_tpot_ms, slo_ttlt_ms)))
    summary = summarize(result.records, slo)
    summary["wall_s"] = result.wall_s
    summary["sim_requests_per_s"] = len(workload) / max(result.wall_s, 1e-9)
    for note in work.notes:
        typer.echo(f"note: {note}", err=True)
    if out is not None:
        write_results(result.records, out)
    if as_json:
        typer.echo(
            json.dumps(
                {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}
            )
        )
    else:
        print_summary(summary, f"{policy} @ {level}, {engines}× {model} on {gpu}")


def make_policy(spec: str, seed: int) -> Policy:
    from sagegate.policies.registry import parse_policy

    return parse_policy(spec)


def make_predictor(
    name: str | None, policy: str, level: str, error: float, seed: int, workload: Sequence[TraceRequest]
) -> LengthPredictor | None:
    """The named predictor; by default noisy-oracle when the policy or the gateway's admission needs one.
    An oracle is handed the workload's answer key (the simulator knows every outcome)."""
    from sagegate.core.request import answer_key
    from sagegate.policies.capabilities import Capability
    from sagegate.policies.registry import parse_policy
    from sagegate.predictor.factory import ORACLES
    from sagegate.predictor.factory import make_predictor as build

    if name is None:
        needs = level == "gateway" or Capability.USES_PREDICTION in parse_policy(policy).capabilities
        if not needs:
            return None
        name = "noisy-oracle"
    truth = answer_key(workload) if name in ORACLES else None
    return build(name, relative_error=error, seed=seed, truth=truth)


def print_summary(summary: dict[str, float], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(
            key, f"{value:,.4f}" if isinstance(value, float) and not value.is_integer() else f"{value:,.0f}"
        )
    Console().print(table)


def _weights(pairs: list[str]) -> dict[str, float]:
    """``name=weight`` pairs (``--scorer``) as a mapping; a ValueError names a malformed one."""
    out: dict[str, float] = {}
    for pair in pairs:
        name, sep, weight = pair.rpartition("=")
        try:
            out[name] = float(weight)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise ValueError(f"--scorer {pair!r}: expected name=weight, e.g. prefix_hit=2")
    return out
