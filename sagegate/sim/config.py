"""Engine settings, named after vLLM's own flags wherever vLLM has one."""

from __future__ import annotations

from dataclasses import dataclass, field

VARIANTS = ("v1", "v0", "sarathi")


@dataclass(frozen=True)
class EngineConfig:
    """One engine's settings. Field names are vLLM's flags with ``_`` for ``-``.

    ``variant``: ``v1`` (chunked prefill, running first — vLLM's default), ``v0`` (a step is
    prefill-only or decode-only, no chunking) or ``sarathi`` (decodes first, then prefill chunks up to
    ``chunk_size`` tokens a step).
    """

    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool = True
    tensor_parallel_size: int = 1
    variant: str = "v1"
    chunk_size: int = 512
    scheduler_reserve_full_isl: bool = False
    """Admit a waiting request only when its whole sequence (prompt and output so far, less its
    cached blocks) fits in the free blocks, not only its first chunk: vLLM 0.32's default
    (``--scheduler-reserve-full-isl``), which keeps chunked prefill from over-admitting and then
    preempting. Off here, as the vLLM the engine model was calibrated on (0.15) ran and as every
    simulated figure in RESULTS.md was taken; ``benchmarks/real_engine.py`` turns it on to match the
    real vLLM 0.32 it runs."""
    extra: dict[str, float] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown engine variant {self.variant!r}; valid: {', '.join(VARIANTS)}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "tensor_parallel_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
