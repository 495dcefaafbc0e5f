"""The study's configuration: sources, corpus, calibration, panel and statistics, with every seed.

One frozen :class:`StudyConfig` describes a run completely; it is written next to the report
(``config.json``) so a second run with the same file reproduces every number. The defaults follow
docs/design/study.md (40 windows of 200 requests, the 20× deadline rule, bisection over log10(factor) in
[−2, 4] in 30 steps, regions 0.5 … 1.5 × λ_ref, 2,000 bootstrap resamples, BH at q = 0.05).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

REGIONS: tuple[tuple[str, float], ...] = (
    ("LOW", 0.5),
    ("PRE_KNEE", 0.8),
    ("KNEE", 1.0),
    ("POST_KNEE", 1.1),
    ("OVERLOAD", 1.2),
    ("HIGH_PRESSURE", 1.5),
)
"""Operating regions as multiples of each window's λ_ref (docs/design/study.md): LSSP's set."""


class RegionAnchor(StrEnum):
    """What a region's number multiplies: ``violation``, each window's knee ``λ_ref`` (LSSP's regions,
    for comparison with the paper); ``utilisation``, the reference engine's saturated rate on the
    window's own mix (so one region name is the same load on every source)."""

    VIOLATION = "violation"
    UTILISATION = "utilisation"


UTILISATION_REGIONS: tuple[tuple[str, float], ...] = (("U50", 0.5), ("U90", 0.9), ("U110", 1.1))
"""Operating regions as offered rate / the reference engine's saturated rate on the window's mix."""

ROBUSTNESS_ENTRIES: tuple[str, ...] = (
    "sagesched@gateway",
    "sagesched@engine",
    "ssjf@gateway",
    "trail@gateway",
    "fastserve@gateway",
    "fcfs@gateway",
    "edf@gateway",
)
"""Entries re-run at the larger prediction errors: SageSched at both levels and, at the gateway, the
baselines its paper compares against plus EDF. Every gateway entry reads the prediction (the
admission charge does), so each needs its own re-run; engine entries that read no prediction (vLLM,
Sarathi, FastServe, EDF, …) are the same cells at every error and join the comparison for free. The
engine-level re-runs of SSJF and TRAIL are left out to fit the 30-minute budget (they cost three
times a gateway re-run)."""


def data_root() -> Path:
    """``$SAGEGATE_DATA`` if set, else ``<repo>/../shared/data`` (the shared, read-only data folder)."""
    env = os.environ.get("SAGEGATE_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


@dataclass(frozen=True)
class SourceSpec:
    """One workload source: a trace file or folder, its reader format and reader options.

    ``fmt="synthetic"`` builds a seeded synthetic workload instead (``options`` go to
    ``loadgen.synthetic.synthetic_workload``); the smoke study falls back to it without the data.
    """

    name: str
    path: str
    fmt: str = "auto"
    options: tuple[tuple[str, Any], ...] = ()
    note: str = ""

    def opts(self) -> dict[str, Any]:
        return dict(self.options)


def default_sources(root: Path | None = None) -> tuple[SourceSpec, ...]:
    """The four default sources.

    ServeGen slices are generated long enough for 40 × 200 requests with room to sample (about
    17,000 requests each) and scaled so one H100 running Llama-3.1-8B is a sensible target: Bailian
    ``m-small`` from 10:00 of day one (≈ 410 req/s over 38 clients) × 0.02 ≈ 8.6 req/s, close to the
    Azure conversation trace's 5.5 req/s; ``deepseek-r1`` from midnight (≈ 22 req/s, outputs of
    ≈ 1,300 tokens) × 0.1 ≈ 2.2 req/s. Only the arrival *shape* matters to the study, since every
    window is recalibrated to its own knee; the base rate just keeps the knee inside the bisection
    range.
    """
    r = data_root() if root is None else root
    return (
        SourceSpec("azure-conv", str(r / "azure2023" / "AzureLLMInferenceTrace_conv.csv"), "azure"),
        SourceSpec("azure-code", str(r / "azure2023" / "AzureLLMInferenceTrace_code.csv"), "azure"),
        SourceSpec(
            "bailian-m-small",
            str(r / "servegen" / "language" / "m-small"),
            "servegen",
            (("start_s", 36000.0), ("duration_s", 2000.0), ("rate_scale", 0.02)),
            "ServeGen Bailian m-small, day 1 10:00 + 2,000 s, rate × 0.02 (≈ 8.6 req/s, 17 active clients)",
        ),
        SourceSpec(
            "bailian-deepseek-r1",
            str(r / "servegen" / "reason" / "deepseek-r1"),
            "servegen",
            (("start_s", 0.0), ("duration_s", 8000.0), ("rate_scale", 0.1)),
            "ServeGen Bailian deepseek-r1, 00:00 + 8,000 s, rate × 0.1 (≈ 2.2 req/s, 26 active clients)",
        ),
    )


TEXT_SOURCE = "azure-conv-sharegpt"


def text_source(root: Path | None = None) -> SourceSpec:
    """The built-in source with prompt text: Azure 2023 conversation arrivals carrying ShareGPT pairs.

    Each request becomes a real ShareGPT pair from the length bucket of its Azure prompt (prompt text,
    prompt and response lengths of the pair); 3,000 pairs are held out, by a seeded split, to warm
    the semantic predictor's history only (``study.textsource``).
    """
    r = data_root() if root is None else root
    return SourceSpec(
        TEXT_SOURCE,
        str(r / "azure2023" / "AzureLLMInferenceTrace_conv.csv"),
        "paired-sharegpt",
        (
            ("sharegpt", str(r / "sharegpt" / "sharegpt_v3_first_turn_pairs.jsonl.gz")),
            ("arrivals", "azure"),
            ("reserve", 3000),
        ),
        "Azure 2023 conversation arrivals, each request a real ShareGPT first-turn pair (prompt text, "
        "prompt and response lengths) from its prompt's length bucket; 3,000 pairs held out (seeded) "
        "as the semantic predictor's history",
    )


def synthetic_sources() -> tuple[SourceSpec, ...]:
    """Two seeded synthetic sources (chat-like and code-like) for a smoke run without the data."""
    return (
        SourceSpec(
            "synthetic-chat",
            "synthetic",
            "synthetic",
            (
                ("requests", 1200),
                ("rate", 5.0),
                ("prompt_mean", 1000.0),
                ("output_mean", 200.0),
                ("tenants", 4),
            ),
        ),
        SourceSpec(
            "synthetic-code",
            "synthetic",
            "synthetic",
            (
                ("requests", 1200),
                ("rate", 3.0),
                ("prompt_mean", 2000.0),
                ("output_mean", 30.0),
                ("tenants", 1),
            ),
        ),
    )


def parse_source(text: str) -> SourceSpec:
    """``NAME=PATH[,format=FMT][,key=value…]`` → a source (values are numbers when they parse)."""
    name, eq, rest = text.partition("=")
    if not eq or not name.strip() or not rest.strip():
        raise ValueError(f"--source must be NAME=PATH[,format=FMT][,key=value…], got {text!r}")
    path, *parts = rest.split(",")
    fmt = "auto"
    options: list[tuple[str, Any]] = []
    for part in parts:
        key, eq, raw = part.partition("=")
        if not eq:
            raise ValueError(f"source option {part!r} must be key=value")
        key = key.strip()
        if key == "format":
            fmt = raw.strip()
        else:
            options.append((key, _number_or_text(raw.strip())))
    return SourceSpec(name.strip(), path.strip(), fmt, tuple(options), f"user file {path.strip()}")


def _number_or_text(raw: str) -> Any:
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


@dataclass(frozen=True)
class StudyConfig:
    """Everything that determines the study's numbers."""

    sources: tuple[SourceSpec, ...] = field(default_factory=default_sources)
    windows: int = 40
    window_size: int = 200
    seed: int = 2026
    # deadline rule (docs/design/study.md): arrival + multiplier × (prefill · I + decode · predicted O)
    deadline_multiplier: float = 20.0
    prefill_s_per_token: float = 0.0004
    decode_s_per_token: float = 0.02
    deadline_error: float = 0.2
    priority: int = 1
    # calibration on the reference engine: fcfs at engine level (vLLM alone)
    calibration_policy: str = "fcfs"
    target_violation: float = 0.005
    bisect_lo: float = -2.0
    bisect_hi: float = 4.0
    bisect_steps: int = 30
    regions: tuple[tuple[str, float], ...] = REGIONS
    region_anchor: RegionAnchor = RegionAnchor.VIOLATION
    """What ``regions`` multiply (``with_utilisation_regions`` switches to the utilisation set)."""
    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    # the panel
    policies: tuple[str, ...] | None = None
    """Policy names to run (None: every registered policy); each runs at every level it supports."""
    errors: tuple[float, ...] = (0.2, 0.5, 1.0)
    """Relative errors of the noisy-oracle predictor; the first is the main setting."""
    robustness: tuple[str, ...] = ROBUSTNESS_ENTRIES
    """Entries (``policy@level``) re-run at ``errors[1:]``; those not in the panel are skipped."""
    semantic: bool = False
    """Also run the ``semantic`` predictor on sources whose requests carry prompt text."""
    semantic_config: str = "default"
    """Which semantic predictor (``predictor.semantic.NAMED_CONFIGS``): ``default``, or ``knn-only``
    (without the ranking head, shipped prior and spread correction) to measure what they buy."""
    semantic_history: int = 3000
    """Completed requests that warm the semantic predictor before any window is predicted: a paired
    source's held-out pairs, else the source's rows outside every window (``study.semantic``)."""
    # statistics
    bootstrap: int = 2000
    confidence: float = 0.95
    margin: float = 0.10
    fdr_q: float = 0.05
    subsample_sizes: tuple[int, ...] = (5, 10, 20, 30, 40)
    subsample_draws: int = 500
    stats_seed: int = 7

    @property
    def main_error(self) -> float:
        return self.errors[0]

    def region_factor(self, region: str) -> float:
        return dict(self.regions)[region]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> StudyConfig:
        data = dict(raw)
        data["sources"] = tuple(
            SourceSpec(s["name"], s["path"], s["fmt"], tuple(tuple(o) for o in s["options"]), s["note"])
            for s in data["sources"]
        )
        for key in ("regions",):
            data[key] = tuple(tuple(x) for x in data[key])
        data["region_anchor"] = RegionAnchor(data.get("region_anchor", RegionAnchor.VIOLATION))
        for key in ("errors", "robustness", "subsample_sizes"):
            data[key] = tuple(data[key])
        if data.get("policies") is not None:
            data["policies"] = tuple(data["policies"])
        return StudyConfig(**data)


SMOKE_POLICIES: tuple[str, ...] = ("fcfs", "sagesched", "edf", "vllm-v1")


def smoke_config(root: Path | None = None) -> StudyConfig:
    """2 sources × 3 windows × 2 regions × 4 policies (both levels where they apply), for CI.

    Uses the two Azure 2023 traces when the data folder is present, synthetic sources otherwise.
    """
    sources = default_sources(root)[:2]
    if not all(Path(s.path).exists() for s in sources):
        sources = synthetic_sources()
    return StudyConfig(
        sources=sources,
        windows=3,
        regions=(("LOW", 0.5), ("OVERLOAD", 1.2)),
        policies=SMOKE_POLICIES,
        errors=(0.2, 1.0),
        robustness=("sagesched@gateway", "sagesched@engine", "fcfs@gateway"),
        subsample_sizes=(2, 3),
        subsample_draws=100,
    )


def with_utilisation_regions(
    cfg: StudyConfig, regions: tuple[tuple[str, float], ...] = UTILISATION_REGIONS
) -> StudyConfig:
    """``cfg`` with utilisation-anchored regions (U50/U90/U110 of each window's saturated rate)."""
    return replace(cfg, regions=regions, region_anchor=RegionAnchor.UTILISATION)


def with_overrides(cfg: StudyConfig, **changes: Any) -> StudyConfig:
    """``cfg`` with ``changes`` applied (None values are ignored)."""
    return replace(cfg, **{k: v for k, v in changes.items() if v is not None})
