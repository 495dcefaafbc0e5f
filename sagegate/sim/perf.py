"""Step time of a vLLM-like engine: a roofline with calibrated efficiencies (docs/design/engine_model.md).

One step is one forward pass over a mixed batch of prefill chunks ``(c_i new tokens, p_i cached)``
and ``n_decode`` decoding requests whose contexts sum to ``S``. With ``T = Σc_i + n_decode`` tokens
and ``N = #chunks + n_decode`` sequences::

    compute = (2·P·T + 2·P_head·N) / (ηc·F)
    weights = W / (ηm·BW)
    linear  = sqrt(compute² + weights²)
    attn    = Σ_i 4·L·H·d · c_i·(p_i + (c_i+1)/2) / (ηa·F)
    kv      = KVB · (S + Σ_i p_i + T) / (ηm·BW)
    step    = linear + attn + kv + t_fix + t_seq·N

The simulator calls this millions of times, so every coefficient is folded into a plain float at
construction and the hot methods are a handful of float operations (no numpy).

Tensor parallelism (``tp`` GPUs): each GPU computes 1/tp of the FLOPs and reads 1/tp of the weights
and of the KV cache (KV heads are replicated when there are fewer of them than GPUs). Each layer then
adds two ring all-reduces of the ``T × hidden`` activations: ``2·L·(t_allreduce + 2·(tp−1)/tp ·
T·hidden·dtype / link_bandwidth)``. This term is a rough estimate, not fitted to measurements.

Efficiencies: ``ηm = 0.75``, ``ηa = 0.45`` everywhere; ``ηc`` is the GPU's calibrated value when the
catalogue has one (H100 and H200: 0.61, fitted on Vidur's H100 GEMM profiles, see sim/hardware.py)
and the documented default 0.65 otherwise. Pass ``eta_c`` explicitly to override.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from sagegate.sim.hardware import DEFAULT_TERMS, GiB, GPUSpec, ModelSpec, StepTerms

DEFAULT_ETA_C = 0.65


def _derived() -> float:
    """A coefficient computed in ``__post_init__``: not an argument, not part of repr or equality."""
    return field(init=False, repr=False, compare=False, default=0.0)


@dataclass(frozen=True)
class PerfModel:
    """Per-step time of one engine (a model on ``tp`` GPUs of one kind)."""

    model: ModelSpec
    gpu: GPUSpec
    tp: int = 1
    eta_c: float | None = None
    eta_m: float | None = None
    eta_a: float | None = None
    t_fix: float | None = None
    t_seq: float | None = None
    frontend_s: float = -1.0
    """Seconds of front end on the first token; negative (the default): the GPU profile's value for
    this tensor-parallel size (``StepTerms.frontend_s``, plus ``frontend_multiproc_s`` when tp > 1)."""
    t_allreduce: float | None = None
    step_time_scale: float | None = None
    """Every step's GPU time × this (None: the GPU profile's, 1.0 by default); see ``StepTerms``."""

    # Derived coefficients, set in __post_init__ (plain floats for the hot path).
    compute_efficiency: float = field(init=False, default=0.0)
    terms: StepTerms = field(init=False, repr=False, compare=False, default=DEFAULT_TERMS)
    """The resolved step-time terms: the arguments given here, else the GPU profile's, else the defaults."""
    _t_seq: float = _derived()
    _p: float = _derived()
    _a_tok: float = _derived()
    _a_seq: float = _derived()
    _w: float = _derived()
    _w2: float = _derived()
    _a_att: float = _derived()
    _k_kv: float = _derived()
    _fixed: float = _derived()
    _per_tok: float = _derived()
    _lin_tok: float = _derived()
    _lin_w2: float = _derived()
    _kvb_gpu: int = field(init=False, repr=False, compare=False, default=0)
    _expert_w: float = _derived()
    _expert_miss: float = _derived()

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        base = self.gpu.terms or DEFAULT_TERMS
        given = {
            k: getattr(self, k)
            for k in ("eta_m", "eta_a", "t_fix", "t_seq", "t_allreduce", "step_time_scale")
        }
        if self.frontend_s >= 0.0:
            given["frontend_s"] = self.frontend_s
        terms = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
        object.__setattr__(self, "terms", terms)
        frontend = terms.frontend_s
        if self.frontend_s < 0.0 and self.tp > 1:
            frontend += terms.frontend_multiproc_s
        object.__setattr__(self, "frontend_s", frontend)
        eta_c = self.eta_c if self.eta_c is not None else (self.gpu.eta_c or DEFAULT_ETA_C)
        for label, eta in (("eta_c", eta_c), ("eta_m", terms.eta_m), ("eta_a", terms.eta_a)):
            if not 0.0 < eta <= 1.0:
                raise ValueError(f"{label} must be in (0, 1], got {eta}")
        m, g, tp = self.model, self.gpu, self.tp
        eta_m = terms.eta_m
        flops = tp * eta_c * g.flops  # the group's effective FLOP/s
        bw = tp * eta_m * g.bandwidth  # the group's effective bytes/s
        kv_heads_gpu = -(-m.kv_heads // tp)  # ceil: replicated when kv_heads < tp
        kvb_gpu = 2 * m.layers * kv_heads_gpu * m.head_dim * m.dtype_bytes
        weights = m.weight_bytes_per_step / bw
        lin_w = m.params_layers * m.dtype_bytes / bw
        if m.experts > 1:
            # A mixture of experts reads only the experts its tokens route to: with ``T`` tokens a layer
            # touches ``E·(1 − (1 − k/E)^T)`` experts on average (uniform routing), see ``_weights2``.
            expert_bytes = m.layers * m.params_expert * m.dtype_bytes
            weights -= m.experts * expert_bytes / bw
            lin_w -= m.experts * expert_bytes / bw
            object.__setattr__(self, "_expert_w", expert_bytes / bw)
            object.__setattr__(self, "_expert_miss", 1.0 - m.experts_per_token / m.experts)
        fixed = terms.t_fix
        per_tok_ar = 0.0
        if tp > 1:
            n_ar = 2 * m.layers
            fixed += n_ar * terms.t_allreduce
            per_tok_ar = n_ar * 2.0 * (tp - 1) / tp * m.hidden * m.dtype_bytes / g.link_bandwidth
        k_kv = kvb_gpu / (terms.eta_kv * g.bandwidth)
        # The scale is folded into every time coefficient (the smooth max is homogeneous), so the hot
        # path is unchanged and a scale of 1.0 gives bit-identical step times.
        s = terms.step_time_scale
        if not s > 0.0:
            raise ValueError(f"step_time_scale must be > 0, got {s}")
        weights *= s
        lin_w *= s
        flops /= s
        fixed *= s
        per_tok_ar *= s
        k_kv *= s
        if m.experts > 1:
            object.__setattr__(self, "_expert_w", self._expert_w * s)
        values = {
            "compute_efficiency": float(eta_c),
            "_a_tok": 2.0 * m.params_layers_active / flops,
            "_a_seq": 2.0 * m.params_head / flops,
            "_w": weights,
            "_w2": weights * weights,
            "_a_att": s * 4.0 * m.layers * m.heads * m.head_dim / (tp * terms.eta_a * g.flops),
            "_t_seq": s * terms.t_seq,
            "_p": terms.overlap_p,
            "_k_kv": k_kv,
            "_fixed": fixed,
            "_per_tok": k_kv + per_tok_ar,
            "_lin_tok": 2.0 * m.params_layers_active / flops,
            "_lin_w2": lin_w * lin_w,
            "_kvb_gpu": kvb_gpu,
        }
        for key, value in values.items():
            object.__setattr__(self, key, value)

    # ----------------------------------------------------------------------------------- memory

    @property
    def kv_bytes_per_token_per_gpu(self) -> int:
        return self._kvb_gpu

    def kv_pool_tokens(self, gpu_memory_utilization: float = 0.9, activation_gib: float = 2.0) -> int:
        """Tokens the KV pool holds: (memory·utilisation − weights − activations) / KV bytes, per GPU.

        Every GPU of the group holds 1/tp of the weights and its share of every token's KV.
        """
        free = (
            self.gpu.memory_bytes * gpu_memory_utilization
            - self.model.weight_bytes / self.tp
            - activation_gib * GiB
        )
        return max(0, int(free // self._kvb_gpu))

    def num_gpu_blocks(
        self, block_size: int = 16, gpu_memory_utilization: float = 0.9, activation_gib: float = 2.0
    ) -> int:
        """KV blocks of ``block_size`` tokens (what vLLM reports as ``num_gpu_blocks``)."""
        return self.kv_pool_tokens(gpu_memory_utilization, activation_gib) // block_size

    # ------------------------------------------------------------------------------------ time

    def step_time(self, prefill: Sequence[tuple[int, int]], n_decode: int, decode_context_sum: int) -> float:
        """Seconds of one step: prefill chunks ``(c_i, p_i)`` plus ``n_decode`` decodes of total context."""
        tokens = n_decode
        cached = 0
        attn = 0.0
        for c, p in prefill:
            tokens += c
            cached += p
            attn += c * (p + (c + 1) * 0.5)
        if tokens <= 0:
            return 0.0
        seqs = n_decode + len(prefill)
        comp = self._a_tok * tokens + self._a_seq * seqs
        return (
            self._linear(comp, self._w2 if self._expert_w == 0.0 else self._moe_w2(tokens))
            + self._a_att * attn
            + self._k_kv * (decode_context_sum + cached)
            + self._per_tok * tokens
            + self._fixed
            + self._t_seq * seqs
        )

    def decode_step_time(self, n_decode: int, context_sum: int) -> float:
        """``step_time((), n_decode, context_sum)`` without the chunk loop (same float operations)."""
        if n_decode <= 0:
            return 0.0
        comp = self._a_tok * n_decode + self._a_seq * n_decode
        return (
            self._linear(comp, self._w2 if self._expert_w == 0.0 else self._moe_w2(n_decode))
            + self._k_kv * context_sum
            + self._per_tok * n_decode
            + self._fixed
            + self._t_seq * n_decode
        )

    def _linear(self, comp: float, w2: float) -> float:
        """The smooth max ``(comp^p + w^p)^(1/p)`` of the compute and weight-read bounds (``w2 = w²``)."""
        p = self._p
        if p == 2.0:
            return math.sqrt(comp * comp + w2)
        return (comp**p + w2 ** (0.5 * p)) ** (1.0 / p)

    def _moe_w2(self, tokens: int) -> float:
        """Squared weight-read time of a mixture-of-experts step of ``tokens`` tokens."""
        w = self._w + self._expert_w * self.model.experts * (1.0 - self._expert_miss**tokens)
        return w * w

    def decode_run_time(self, n_decode: int, context_sum: int, k: int) -> float:
        """Total time of ``k`` decode-only steps of the same requests; each step adds ``n_decode`` to S."""
        if k <= 0 or n_decode <= 0:
            return 0.0
        return _run_time(self.decode_step_time(n_decode, context_sum), self._k_kv * n_decode, k)

    def decode_steps_within(self, n_decode: int, context_sum: int, budget_s: float) -> int:
        """The largest ``k >= 0`` with ``decode_run_time(n_decode, context_sum, k) <= budget_s``."""
        if n_decode <= 0:
            raise ValueError("decode_steps_within needs n_decode >= 1 (otherwise k is unbounded)")
        if budget_s <= 0.0:
            return 0
        first = self.decode_step_time(n_decode, context_sum)
        b = 0.5 * self._k_kv * n_decode  # run(k) = b·k² + (first − b)·k
        a = first - b
        if b > 0.0:
            k = int((-a + math.sqrt(a * a + 4.0 * b * budget_s)) / (2.0 * b))
        else:
            k = int(budget_s / first)
        k = max(k, 0)
        kv = self._k_kv * n_decode
        while _run_time(first, kv, k + 1) <= budget_s:
            k += 1
        while k > 0 and _run_time(first, kv, k) > budget_s:
            k -= 1
        return k

    def prefill_time(self, tokens: int, chunk: int = 8192) -> float:
        """GPU time to prefill one prompt alone, ``chunk`` tokens per step (no front-end cost)."""
        if chunk <= 0:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        total = 0.0
        done = 0
        while done < tokens:
            c = min(chunk, tokens - done)
            total += self.step_time(((c, done),), 0, 0)
            done += c
        return total

    def linear_layer_time(self, tokens: int) -> float:
        """The layers' linear part for ``tokens`` tokens (no head, attention or overheads)."""
        comp = self._lin_tok * tokens
        return self._linear(comp, self._lin_w2)

    @property
    def ridge_batch(self) -> float:
        """Decode batch size where the compute bound meets the weight-read bound."""
        return self._w / (self._a_tok + self._a_seq)


def _run_time(first: float, kv: float, k: int) -> float:
    """``k`` decode steps of a batch whose first step takes ``first``, each later one ``kv`` longer than
    the one before (a token more of KV read per request): :meth:`PerfModel.decode_run_time` once
    ``first`` is known."""
    return k * first + kv * (k * (k - 1) * 0.5)
