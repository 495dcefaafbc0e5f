"""Catalogue of model shapes and GPUs that the step-time roofline (sim/perf.py) is built from.

Only the shapes that decide time and memory are kept: layer count, widths, head counts, vocabulary.
Parameter counts follow the Llama/Qwen decoder layout (q/k/v/o projections, a gated MLP, two RMS
norms per layer, an output head and an input embedding) and reproduce the published counts
(docs/design/engine_model.md; ``tests/sim/test_perf.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GiB = 1 << 30


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape; parameter and byte counts are derived from it."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tie_embeddings: bool = False
    dtype_bytes: int = 2
    experts: int = 1
    """Mixture of experts: MLP experts per layer (1: a dense model) and how many each token uses."""
    experts_per_token: int = 1

    @property
    def params_attention_layer(self) -> int:
        """q, o (hidden × heads·d), k, v (hidden × kv_heads·d) and the two norms of one layer."""
        attn = 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
        return attn + 2 * self.hidden

    @property
    def params_expert(self) -> int:
        """One gated MLP (three matrices)."""
        return 3 * self.hidden * self.ffn

    @property
    def params_per_layer(self) -> int:
        """Attention, every expert's gated MLP and, for a mixture of experts, the router."""
        router = self.hidden * self.experts if self.experts > 1 else 0
        return self.params_attention_layer + self.experts * self.params_expert + router

    @property
    def params_layers_active(self) -> int:
        """The layer parameters one token multiplies (a mixture of experts uses ``experts_per_token``)."""
        if self.experts <= 1:
            return self.params_layers
        active = self.params_attention_layer + self.experts_per_token * self.params_expert
        return self.layers * (active + self.hidden * self.experts)

    @property
    def params_layers(self) -> int:
        return self.layers * self.params_per_layer

    @property
    def params_head(self) -> int:
        """The output projection to the vocabulary (its matmul runs once per sequence per step)."""
        return self.hidden * self.vocab

    @property
    def params_embed(self) -> int:
        """Input embedding; shares the head's storage when tied, so it then adds nothing."""
        return 0 if self.tie_embeddings else self.hidden * self.vocab

    @property
    def params_total(self) -> int:
        """All parameters, including the final norm."""
        return self.params_layers + self.params_head + self.params_embed + self.hidden

    @property
    def weight_bytes(self) -> int:
        """What the weights occupy in GPU memory (vLLM's "model weights took … GB", in GiB)."""
        return self.params_total * self.dtype_bytes

    @property
    def weight_bytes_per_step(self) -> int:
        """What one forward pass streams from memory: the layers and the head (the embedding is a gather)."""
        return (self.params_layers + self.params_head) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer and KV head."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @classmethod
    def from_hf_config(cls, path: str | os.PathLike[str], *, dtype_bytes: int = 2) -> ModelSpec:
        """Read a Hugging Face ``config.json`` (or a folder holding one).

        Multimodal configs that nest the language model under ``text_config`` are accepted too.
        """
        file = Path(path)
        if file.is_dir():
            file = file / "config.json"
        try:
            raw = json.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValueError(f"cannot read model config {file}: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise ValueError(f"{file} is not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError(f"{file} does not hold a JSON object")
        cfg: Mapping[str, Any] = raw
        if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
            cfg = cfg["text_config"]

        def need(key: str) -> int:
            if key not in cfg or cfg[key] is None:
                raise ValueError(f"{file}: missing required key {key!r} in the model config")
            return int(cfg[key])

        layers = need("num_hidden_layers")
        hidden = need("hidden_size")
        heads = need("num_attention_heads")
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        name = str(raw.get("_name_or_path") or file.resolve().parent.name)
        experts = int(cfg.get("num_local_experts") or 1)
        return cls(
            name=name,
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            ffn=need("intermediate_size"),
            vocab=need("vocab_size"),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", raw.get("tie_word_embeddings", False))),
            dtype_bytes=dtype_bytes,
            experts=experts,
            experts_per_token=int(cfg.get("num_experts_per_tok") or 1) if experts > 1 else 1,
        )


@dataclass(frozen=True)
class StepTerms:
    """The step-time model's free terms (sim/perf.py): efficiencies and fixed costs.

    ``eta_m``: share of the bandwidth that weight reads reach; ``eta_kv``: the same for KV reads
    (attention's paged-KV kernel); ``eta_a``: share of peak FLOP/s in prefill attention; ``t_fix``:
    seconds of scheduler/CPU work and launches per step; ``t_seq``: seconds per scheduled sequence
    (input preparation, sampling); ``t_allreduce``: seconds of latency per tensor-parallel
    all-reduce (two a layer); ``overlap_p``: the exponent of the smooth max of the compute and
    weight-read bounds (2: their quadratic mean; larger: closer to the larger of the two).
    ``step_time_scale`` multiplies every step's GPU time (not the front end): 1.0 is the model as
    fitted; 0.85 / 1.15 are the ±15%-capacity error bars (benchmarks/error_bars.py).
    """

    eta_m: float = 0.75
    eta_kv: float = 0.86
    """Fitted on Vidur's decode-attention profile of Llama-2-7B on an A100-80GB (32 KV heads; 72 points,
    batch 1-128 x KV 64-4032, with a per-call and a per-sequence cost that ``t_fix``/``t_seq`` hold
    here): a share of peak bandwidth, taken to carry to other GPUs (one H100 point of a paged kernel,
    64 sequences x 512, read 0.79 of its peak where this profile reads ~0.80)."""
    eta_a: float = 0.45
    t_fix: float = 0.3e-3
    t_seq: float = 5e-6
    t_allreduce: float = 6e-6
    overlap_p: float = 2.0
    frontend_s: float = 0.010
    """What a client waits beyond the engine for its first token (HTTP, tokenisation, streaming) on an
    engine of one GPU."""
    frontend_multiproc_s: float = 0.0
    """What an engine on several GPUs adds to it (tensor parallel: vLLM runs its workers in other
    processes, so a request's first step is broadcast to them and its output gathered back)."""
    step_time_scale: float = 1.0


DEFAULT_TERMS = StepTerms()
"""The documented defaults of docs/design/engine_model.md (a GPU without a fitted profile uses them)."""


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's datasheet numbers.

    ``memory_bytes`` is in GiB units (an "80 GB" card = 80 GiB), the convention that reproduces the
    KV pool sizes of docs/design/engine_model.md. ``link_bandwidth`` is the per-direction NVLink
    bandwidth used by the tensor-parallel all-reduce term. ``eta_c`` is an optional calibrated compute
    efficiency that replaces the generic default of sim/perf.py (see ``H100_ETA_C``).
    """

    name: str
    flops: float
    bandwidth: float
    memory_bytes: int
    link_bandwidth: float = 300e9
    eta_c: float | None = None
    terms: StepTerms | None = None

    def with_step_time_scale(self, scale: float) -> GPUSpec:
        """This GPU with every step ``scale`` times as long (its other terms unchanged)."""
        terms = dataclasses.replace(self.terms or DEFAULT_TERMS, step_time_scale=scale)
        return dataclasses.replace(self, terms=terms)


# H100/H200 compute efficiency: Vidur's H100 GEMM profiles (Llama-2-7B and -70B, TP 1, 1 to 4k tokens)
# fit ηc = 0.61 to 0.63 with ηm held at the documented 0.75 (which the decode anchors pin); with the
# generic 0.65 the 7B profile misses by 10.5% MAPE. Dense bf16 GEMMs reach a smaller share of the
# H100's 989 TFLOP/s peak than of the A100's 312. H200 has the same compute die, so the same value.
H100_ETA_C = 0.61

H100_TERMS = StepTerms(
    eta_m=0.797,
    eta_kv=DEFAULT_TERMS.eta_kv,  # no run here separates it (an unconstrained fit drove it to 0.56)
    eta_a=0.45,
    t_fix=0.6234e-3,
    t_seq=7.7e-6,
    t_allreduce=12.4e-6,
    overlap_p=2.134,
    # One GPU: vLLM 0.21 serving Llama-3.1-8B alone on an H100 answers short chat prompts in 13.98 ms
    # (InferenceBench, concurrency 1, TTFT p50), 6.9 ms of which is the prefill step here.
    frontend_s=0.0070,
    # Several: the fitted 31 ms of the TP2 and TP4 runs (docs/fidelity.md) less the one-GPU part.
    frontend_multiproc_s=0.0240,
)
H100_FIT_ETA_C = H100_ETA_C

GPUS: dict[str, GPUSpec] = {
    "a100-80gb": GPUSpec("a100-80gb", flops=312e12, bandwidth=2.039e12, memory_bytes=80 * GiB),
    "a100-40gb": GPUSpec("a100-40gb", flops=312e12, bandwidth=1.555e12, memory_bytes=40 * GiB),
    "h100": GPUSpec(
        "h100",
        flops=989e12,
        bandwidth=3.35e12,
        memory_bytes=80 * GiB,
        link_bandwidth=450e9,
        eta_c=H100_FIT_ETA_C,
        terms=H100_TERMS,
    ),
    "h200": GPUSpec(
        "h200", flops=989e12, bandwidth=4.8e12, memory_bytes=141 * GiB, link_bandwidth=450e9, eta_c=H100_ETA_C
    ),
}

_GPU_ALIASES = {
    "a100": "a100-80gb",
    "a100-80g": "a100-80gb",
    "a100-sxm": "a100-80gb",
    "a100-sxm4": "a100-80gb",
    "a100-sxm4-80gb": "a100-80gb",
    "a100-sxm-80gb": "a100-80gb",
    "a100-40g": "a100-40gb",
    "a100-sxm4-40gb": "a100-40gb",
    "h100-sxm": "h100",
    "h100-sxm5": "h100",
    "h100-80gb": "h100",
    "h100-sxm-80gb": "h100",
    "h200-sxm": "h200",
    "h200-141gb": "h200",
}

MODELS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec(
        "llama-3.1-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256
    ),
    "llama-2-7b": ModelSpec(
        "llama-2-7b", layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, ffn=11008, vocab=32000
    ),
    "qwen3-32b": ModelSpec(
        "qwen3-32b", layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128, ffn=25600, vocab=151936
    ),
    # The models of the public H100 runs that calibrate the engine model (docs/fidelity.md).
    "llama-2-70b": ModelSpec(
        "llama-2-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672, vocab=32000
    ),
    "codellama-34b": ModelSpec(
        "codellama-34b", layers=48, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=22016, vocab=32000
    ),
    "mixtral-8x7b": ModelSpec(
        "mixtral-8x7b",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        head_dim=128,
        ffn=14336,
        vocab=32000,
        experts=8,
        experts_per_token=2,
    ),
}

# Llama-3-8B has Llama-3.1-8B's shapes (only the RoPE scaling and context differ).
_MODEL_ALIASES = {
    "llama3.1-8b": "llama-3.1-8b",
    "llama-3-8b": "llama-3.1-8b",
    "llama3-8b": "llama-3.1-8b",
    "llama2-7b": "llama-2-7b",
    "qwen-3-32b": "qwen3-32b",
    "llama2-70b": "llama-2-70b",
    "codellama-34b-instruct": "codellama-34b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mixtral-8x7b-v0-1": "mixtral-8x7b",
}


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def get_gpu(name: str) -> GPUSpec:
    """Look a GPU up by name (case-insensitive; "H100-SXM", "nvidia-a100" and the like work)."""
    key = _normalise(name).removeprefix("nvidia-")
    key = _GPU_ALIASES.get(key, key)
    if key not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(sorted(GPUS))}")
    return GPUS[key]


def get_model(name_or_path: str) -> ModelSpec:
    """Look a model up by catalogue name or HF id, or read a ``config.json`` (file or folder)."""
    path = Path(name_or_path).expanduser()
    if path.is_file() or (path.is_dir() and (path / "config.json").is_file()):
        return ModelSpec.from_hf_config(path)
    key = _normalise(name_or_path).rsplit("/", 1)[-1]
    for suffix in ("-hf", "-instruct", "-chat", "-base"):
        key = key.removesuffix(suffix)
    key = key.removeprefix("meta-")
    key = _MODEL_ALIASES.get(key, key)
    if key not in MODELS:
        raise ValueError(
            f"unknown model {name_or_path!r}; known: {', '.join(sorted(MODELS))} "
            "(or a path to a Hugging Face config.json)"
        )
    return MODELS[key]
