"""The engine flags (vLLM's own names) shared by ``simulate`` and ``backend``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from sagegate.sim.config import EngineConfig
    from sagegate.sim.perf import PerfModel

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
ReserveFullIsl = Annotated[
    bool,
    typer.Option(
        "--scheduler-reserve-full-isl/--no-scheduler-reserve-full-isl",
        help="vLLM 0.32's admission: start a waiting request only when its whole sequence fits (vLLM's "
        "default there; off here, as the calibrated figures ran).",
    ),
]


@dataclass(frozen=True)
class EngineFlags:
    """The eleven engine flags, picked by name from a command's parameters so each command lists them
    only in its signature (typer needs them there)."""

    model: str
    gpu: str
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    gpu_memory_utilization: float
    num_gpu_blocks_override: int | None
    enable_prefix_caching: bool
    tensor_parallel_size: int
    variant: str
    scheduler_reserve_full_isl: bool

    @classmethod
    def pick(cls, params: Mapping[str, Any]) -> EngineFlags:
        """The flags among ``params`` (a command's ``locals()``); other names are ignored."""
        return cls(**{f.name: params[f.name] for f in fields(cls)})

    def build(self) -> tuple[EngineConfig, PerfModel]:
        """The engine's config and performance model (raises ValueError for a bad value)."""
        from sagegate.sim.config import EngineConfig
        from sagegate.sim.hardware import get_gpu, get_model
        from sagegate.sim.perf import PerfModel

        cfg = EngineConfig(**asdict(self))
        perf = PerfModel(get_model(self.model), get_gpu(self.gpu), tp=self.tensor_parallel_size)
        return cfg, perf
