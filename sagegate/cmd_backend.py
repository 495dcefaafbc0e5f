"""``sagegate backend``: the simulated vLLM-compatible server (sim/server.py) under uvicorn."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Annotated

import typer

from sagegate import engine_flags as ef
from sagegate.harness.procs import free_port, spawned

__all__ = ["backend", "free_port", "spawned_backend"]


def backend(
    model: ef.Model = "llama-3.1-8b",
    gpu: ef.Gpu = "h100",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8001,
    time_scale: Annotated[
        float, typer.Option("--time-scale", help="Engine seconds per wall second (10 = ten times faster).")
    ] = 1.0,
    scheduling_policy: Annotated[
        str, typer.Option("--scheduling-policy", help="vLLM's --scheduling-policy: fcfs or priority.")
    ] = "fcfs",
    served_model_name: Annotated[
        str | None, typer.Option("--served-model-name", help="Model name clients use (default: --model).")
    ] = None,
    max_num_seqs: ef.MaxNumSeqs = 256,
    max_num_batched_tokens: ef.MaxBatched = 8192,
    block_size: ef.BlockSize = 16,
    gpu_memory_utilization: ef.GpuUtil = 0.9,
    num_gpu_blocks_override: ef.BlocksOverride = None,
    enable_prefix_caching: ef.PrefixCaching = True,
    tensor_parallel_size: ef.TensorParallel = 1,
    variant: ef.Variant = "v1",
    scheduler_reserve_full_isl: ef.ReserveFullIsl = False,
    kv_events_config: Annotated[
        str | None,
        typer.Option(
            "--kv-events-config",
            help="vLLM's --kv-events-config JSON: publish KV-cache events, e.g. "
            '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}\'.',
        ),
    ] = None,
    enable_prompt_tokens_details: Annotated[
        bool,
        typer.Option(
            "--enable-prompt-tokens-details",
            help="vLLM's flag: usage reports prompt_tokens_details.cached_tokens.",
        ),
    ] = False,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", help="vLLM's --api-key: the /v1 routes want Authorization: Bearer KEY."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
) -> None:
    """Serve the simulated engine over an OpenAI-compatible HTTP API with vLLM's /metrics."""
    params = dict(locals())  # the options by name, before any local of the body
    import uvicorn

    from sagegate.sim.kv_events import KVEventsConfig
    from sagegate.sim.server import BackendSettings, create_app

    try:
        cfg, _ = ef.EngineFlags.pick(params).build()
        settings = BackendSettings(
            engine=cfg,
            served_model_name=served_model_name,
            time_scale=time_scale,
            scheduling_policy=scheduling_policy,
            kv_events=KVEventsConfig.parse(kv_events_config) if kv_events_config else None,
            prompt_tokens_details=enable_prompt_tokens_details,
            api_key=api_key,
        )
        app = create_app(settings)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    eng = app.state.backend.engine
    typer.echo(
        f"sagegate backend: {settings.model_name} ({cfg.model} on {cfg.gpu} x{cfg.tensor_parallel_size}, "
        f"{eng.pool.num_blocks} KV blocks of {eng.pool.block_size}, time scale {time_scale:g}) "
        f"at http://{host}:{port}",
        err=True,
    )
    if settings.kv_events is not None and settings.kv_events.active:
        typer.echo(f"sagegate backend: KV events on {settings.kv_events.endpoint}", err=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)


@contextlib.contextmanager
def spawned_backend(args: Sequence[str] = (), *, startup_timeout_s: float = 30.0) -> Iterator[str]:
    """Run ``sagegate backend [args]`` in a child process on a free loopback port and yield its base
    URL once ``/health`` answers; stop it on exit. For tests and demos; needs no installed entry point."""
    with spawned("sagegate.cmd_backend", args, startup_timeout_s=startup_timeout_s) as url:
        yield url


if __name__ == "__main__":  # pragma: no cover - `python -m sagegate.cmd_backend` (tests, no install needed)
    typer.run(backend)
