"""The engine flags (vLLM's own names) shared by ``simulate`` and ``backend``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from sim.config import EngineConfig
    from sim.perf import PerfModel

Model = Annotated[str, typer.Option(help="Model name from the catalogue, or a path to a HF config.json.")]
Gpu = Annotated[str, typer.Option(help="GPU: a100-80gb, a100-40gb, h100, h200.")]
MaxNumSeqs = Annotated[int, typer.Option("--max-num-seqs", help="vLLM --max-num-seqs.")]
MaxBatched = Annotated[int, typer.Option("--max-num-batched-tokens", help="vLLM --max-num-batched-tokens.")]
BlockSize = Annotated[int, typer.Option("--block-size", help="KV block size in tokens.")]
GpuUtil = Annotated[float, typer.Option("--gpu-memory-utilization", help="Share of GPU memory vLLM may use.")]
BlocksOverride = Annotated[
    int | None, typer.Option("--num-gpu-blocks-override", help="Force the KV pool size in blocks.")
]
PrefixCaching = Annotated[
    bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching", help="Prefix caching.")
]
TensorParallel = Annotated[int, typer.Option("--tensor-parallel-size", help="GPUs per engine.")]
Variant = Annotated[str, typer.Option(help="Engine scheduler: v1 (default), v0, sarathi.")]


def engine_config(
    model: str,
    gpu: str,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    block_size: int,
    gpu_memory_utilization: float,
    num_gpu_blocks_override: int | None,
    enable_prefix_caching: bool,
    tensor_parallel_size: int,
    variant: str,
) -> tuple[EngineConfig, PerfModel]:
    """Build the engine's config and performance model from the flags (raises ValueError)."""
    from sim.config import EngineConfig
    from sim.hardware import get_gpu, get_model
    from sim.perf import PerfModel

    cfg = EngineConfig(
        model=model,
        gpu=gpu,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        gpu_memory_utilization=gpu_memory_utilization,
        num_gpu_blocks_override=num_gpu_blocks_override,
        enable_prefix_caching=enable_prefix_caching,
        tensor_parallel_size=tensor_parallel_size,
        variant=variant,
    )
    perf = PerfModel(get_model(model), get_gpu(gpu), tp=tensor_parallel_size)
    return cfg, perf
