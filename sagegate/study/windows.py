"""The corpus: per source, non-overlapping windows of contiguous requests, each an independent episode.

The sampler is outcome-blind: it sees only how many valid rows a source has, never a simulated
result. Fields a trace lacks are synthesised by a fixed rule (docs/design/study.md): predicted output = true ×
log-normal noise of the given relative error (seeded per window), deadline = arrival +
multiplier × (prefill s/token · prompt + decode s/token · predicted output), priority 1.

The deadline's noise uses the same per-window seed and per-request draw as the ``noisy-oracle``
predictor the policies get (``predictor.baselines.NoisyOraclePredictor(error, seed=window.seed)``), so
at the main error the point prediction a policy sees is the one the deadline was built from, as in
LSSP's traces, where the synthesised predicted-output field served both.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from sagegate.core.request import TraceRequest
from sagegate.loadgen.records import rebase
from sagegate.predictor.baselines import lognormal_sigma, unit_normal
from sagegate.study.config import SourceSpec, StudyConfig


@dataclass(frozen=True)
class Window:
    """One episode: ``requests`` rebased to start at 0 (rids 0..n-1), with deadlines and priority."""

    source: str
    index: int
    start_row: int
    seed: int
    requests: tuple[TraceRequest, ...]

    @property
    def id(self) -> str:
        return window_id(self.source, self.index)

    @property
    def has_text(self) -> bool:
        return all(r.prompt for r in self.requests)


def window_id(source: str, index: int) -> str:
    return f"{source}/w{index:02d}"


_SAMPLER = 0xFFFFFFFF


def window_seed(study_seed: int, source: str, index: int) -> int:
    """A 63-bit seed that depends only on the study seed, the source's name and the window's index."""
    if index < 0 or index >= _SAMPLER:
        raise ValueError(f"window index out of range: {index}")
    state = np.random.SeedSequence([study_seed, zlib.crc32(source.encode()), index]).generate_state(2)
    return int((int(state[0]) << 32 | int(state[1])) & ((1 << 63) - 1))


def sampler_seed(study_seed: int, source: str) -> int:
    """The seed of a source's window sampler (distinct from every window's own seed)."""
    return int(
        np.random.SeedSequence([study_seed, zlib.crc32(source.encode()), _SAMPLER]).generate_state(1)[0]
    )


def sample_starts(n_rows: int, count: int, size: int, seed: int) -> list[int]:
    """``count`` sorted start rows of non-overlapping blocks of ``size`` rows in ``[0, n_rows)``.

    Uniform over all non-overlapping placements: draw ``count`` distinct sorted values ``c_i`` from
    ``range(n_rows − count·(size − 1))`` and shift the ``i``-th by ``i·(size − 1)``.
    """
    if count < 0 or size < 1:
        raise ValueError("count must be >= 0 and size >= 1")
    free = n_rows - count * (size - 1)
    if count > free:
        raise ValueError(f"{n_rows} rows cannot hold {count} non-overlapping windows of {size}")
    rng = np.random.default_rng(seed)
    picks = np.sort(rng.choice(free, size=count, replace=False))
    return [int(c) + i * (size - 1) for i, c in enumerate(picks)]


def predicted_outputs(requests: Sequence[TraceRequest], seed: int, relative_error: float) -> list[float]:
    """True output × mean-one log-normal noise, ``z`` drawn per ``(seed, rid)`` like ``noisy-oracle``."""
    sigma = lognormal_sigma(relative_error)
    shift = 0.5 * sigma * sigma
    return [r.output_tokens * math.exp(sigma * unit_normal(seed, r.rid) - shift) for r in requests]


def with_deadlines(requests: Sequence[TraceRequest], seed: int, cfg: StudyConfig) -> list[TraceRequest]:
    """Deadlines by the study's rule from noisy predicted outputs; priority set to ``cfg.priority``."""
    preds = predicted_outputs(requests, seed, cfg.deadline_error)
    m, a, b = cfg.deadline_multiplier, cfg.prefill_s_per_token, cfg.decode_s_per_token
    return [
        replace(r, deadline_s=r.arrival_s + m * (a * r.prompt_tokens + b * p), priority=cfg.priority)
        for r, p in zip(requests, preds, strict=True)
    ]


def valid_rows(rows: Sequence[TraceRequest], max_tokens: int | None) -> list[TraceRequest]:
    """Rows a single reference engine can serve: positive lengths, prompt + output within its KV pool."""
    return [
        r
        for r in rows
        if r.prompt_tokens > 0
        and r.output_tokens > 0
        and (max_tokens is None or r.prompt_tokens + r.output_tokens <= max_tokens)
    ]


def make_windows(
    rows: Sequence[TraceRequest], source: str, cfg: StudyConfig, max_tokens: int | None
) -> list[Window]:
    """The source's ``cfg.windows`` windows of ``cfg.window_size`` contiguous valid rows."""
    valid = valid_rows(sorted(rows, key=lambda r: r.arrival_s), max_tokens)
    starts = sample_starts(len(valid), cfg.windows, cfg.window_size, sampler_seed(cfg.seed, source))
    out = []
    for index, start in enumerate(starts):
        seed = window_seed(cfg.seed, source, index)
        block = rebase(list(valid[start : start + cfg.window_size]))
        out.append(Window(source, index, start, seed, tuple(with_deadlines(block, seed, cfg))))
    return out


def load_rows(spec: SourceSpec, seed: int) -> list[TraceRequest]:
    """Read a source's rows (the only I/O here): a trace via ``loadgen.readers``, a trace paired with
    ShareGPT text (``study.textsource``) or a synthetic set."""
    opts = spec.opts()
    if spec.fmt == "synthetic":
        from sagegate.loadgen.synthetic import synthetic_workload

        n = int(opts.pop("requests", 1000))
        rate = float(opts.pop("rate", 5.0))
        return synthetic_workload(n, rate=rate, seed=seed, **opts)
    from sagegate.loadgen.readers import read_trace

    if not Path(spec.path).exists():
        raise FileNotFoundError(f"source {spec.name!r}: no such file or folder {spec.path}")
    if spec.fmt == "paired-sharegpt":
        from sagegate.study.textsource import load_paired

        return load_paired(spec.path, spec.name, opts, seed)
    return read_trace(spec.path, spec.fmt, seed=seed, **opts)


def max_tokens_for(cfg: StudyConfig) -> int:
    """KV capacity in tokens of the reference engine (one request larger than it can never run)."""
    from sagegate.sim.config import EngineConfig
    from sagegate.sim.hardware import get_gpu, get_model
    from sagegate.sim.perf import PerfModel

    ecfg = EngineConfig(model=cfg.model, gpu=cfg.gpu)
    perf = PerfModel(get_model(cfg.model), get_gpu(cfg.gpu))
    return perf.num_gpu_blocks(ecfg.block_size, ecfg.gpu_memory_utilization) * ecfg.block_size


def build_corpus(cfg: StudyConfig) -> dict[str, list[Window]]:
    """Every source's windows, in the order of ``cfg.sources``."""
    cap = max_tokens_for(cfg)
    return {s.name: make_windows(load_rows(s, cfg.seed), s.name, cfg, cap) for s in cfg.sources}
