"""``predictor_options``: the typed options of the gateway's predictor (``gateway.settings`` holds the
rest of the one settings object and re-exports these)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from predictor.embedder import DEFAULT_QUANTIZE, DEFAULT_WINDOW, WINDOWS
from predictor.encoder_tune import DEFAULT_TUNED
from predictor.encoders import DEFAULT_ENCODER, encoder
from predictor.factory import (
    LIVE_PREDICTORS,
    EmbedderOptions,
    GlobalOptions,
    LengthBucketOptions,
    PredictorOptions,
    SemanticOptions,
)

PREDICTORS = ("none", *LIVE_PREDICTORS)

DEFAULT_BUDGET_S = 0.05
"""How long a request waits for the semantic predictor's embedding before the prior answers."""


_SEMANTIC = SemanticOptions()

_OPTIONS_OF: dict[str, frozenset[str]] = {
    "none": frozenset(),
    "global": frozenset({"window", "max_points", "min_samples", "refresh_every", "redis_prefix"}),
    "length-bucket": frozenset(
        {
            "window_per_bucket",
            "buckets",
            "min_samples",
            "max_points",
            "global_window",
            "refresh_every",
            "redis_prefix",
        }
    ),
    "semantic": frozenset(
        {
            "predict_budget_s",
            "embed_threads",
            "embed_window",
            "embed_quantize",
            "embed_tuned",
            "embed_model",
            "embed_runtime",
            "onnx_file",
            "onnx_missing",
            "default_model",
            "batch_window_s",
            "max_batch",
            "redis_prefix",
        }
    ),
}
"""Which options each gateway predictor takes; setting another one is an error."""


class PredictorSettings(BaseModel):
    """``predictor_options``: the options of the predictor ``predictor`` names (an option another
    predictor takes is refused, as is an unknown one). The history baselines' options left unset keep
    that predictor's own default."""

    model_config = ConfigDict(extra="forbid")

    # --- semantic
    predict_budget_s: float = Field(default=DEFAULT_BUDGET_S, gt=0.0)
    """Longest wait for the embedding; past it the request is ranked from the prior (path ``late``)."""
    embed_threads: int = Field(default=1, ge=1)
    """torch threads. One: on a busy CPU more oversubscribe it (measured: 800 ms per embedding with
    the default on a loaded 2-core machine, 38 ms with one)."""
    embed_window: int = DEFAULT_WINDOW
    """Word pieces embedded (one of ``predictor.embedder.WINDOWS``); with ``embed_quantize`` it names
    the embedding version, and so the history replicas share. ``embed_window: 256, embed_quantize:
    false`` is the first, slower configuration."""
    embed_quantize: bool = DEFAULT_QUANTIZE
    """int8 linear layers (the fast default)."""
    embed_tuned: bool = DEFAULT_TUNED
    """The shipped length tune merged into the encoder (``predictor.encoder_tune``; ShareGPT tail
    tau-b in RESULTS.md, *The semantic predictor*). ``false``: the stock all-MiniLM-L6-v2, with its own
    history."""
    embed_model: Literal["minilm", "mpnet"] = DEFAULT_ENCODER
    """The encoder (``predictor.encoders``): ``minilm`` ships; ``mpnet`` (all-mpnet-base-v2: ShareGPT
    tail tau-b 0.502 against 0.481 at 7x the CPU per prompt, over the budget on a busy 2-core box;
    RESULTS.md, *The semantic predictor*) needs ``sagegate predictor fetch-encoder mpnet`` once and the
    onnx runtime."""
    embed_runtime: Literal["onnx", "torch"] = "onnx"
    """``onnx``: ONNX Runtime and a file exported from the shipped model, no torch in the gateway
    (measured: 271 against 655 MB, ready in ~4.6 against ~16.5 s); ``torch``: the model through torch.
    int8 ONNX vectors are their own (their own history); float32 ones are torch's."""
    onnx_file: str | None = None
    """The ONNX model (unset: ``$SAGEGATE_CACHE/onnx/``, where ``sagegate predictor export-onnx``
    writes)."""
    onnx_missing: Literal["export", "torch", "error"] = "export"
    """When the ONNX file is missing: ``export`` it once at start-up (a child process loads torch,
    ~20 s), fall back to ``torch``, or refuse to start (``error``)."""
    default_model: str = _SEMANTIC.default_model
    """The history a request that names no model joins."""
    batch_window_s: float = Field(default=_SEMANTIC.batch_window_s, ge=0.0)
    """How long the embedder waits for more prompts to batch with a first one."""
    max_batch: int = Field(default=_SEMANTIC.max_batch, ge=1)
    redis_prefix: str = _SEMANTIC.redis_prefix
    """Key prefix of the shared history in Redis (``redis_url``): the semantic predictor's stream is
    ``{prefix}:{embedding version}``, a history baseline's ``{prefix}:{predictor}``."""
    # --- global and length-bucket (unset: the predictor's own default)
    window: int | None = Field(default=None, ge=1)
    """``global``: outputs remembered."""
    window_per_bucket: int | None = Field(default=None, ge=1)
    buckets: tuple[int, ...] | None = None
    """``length-bucket``: ascending prompt-length edges (unset: powers of two)."""
    global_window: int | None = Field(default=None, ge=1)
    min_samples: int | None = Field(default=None, ge=1)
    max_points: int | None = Field(default=None, ge=1)
    refresh_every: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _encoder_usable(self) -> PredictorSettings:
        spec = encoder(self.embed_model)
        if self.embed_tuned and not spec.tune.is_file():
            raise ValueError(
                f"embed_tuned: the length tune {spec.tune} is missing from this install;"
                " reinstall sagegate, or set predictor_options.embed_tuned: false"
            )
        if self.embed_model != DEFAULT_ENCODER and self.embed_runtime != "onnx":
            raise ValueError(f"embed_model: {self.embed_model} runs on embed_runtime: onnx only")
        if self.embed_model != DEFAULT_ENCODER and self.onnx_missing == "torch":
            raise ValueError(f"onnx_missing: torch cannot stand in for embed_model: {self.embed_model}")
        return self

    @field_validator("embed_window")
    @classmethod
    def _known_window(cls, v: int) -> int:
        if v not in WINDOWS:
            raise ValueError(f"embed_window must be one of {sorted(WINDOWS)}, not {v}")
        return v

    def check_for(self, predictor: str) -> None:
        """Raise ``ValueError`` if an option set here is not one ``predictor`` takes."""
        stray = sorted(self.model_fields_set - _OPTIONS_OF[predictor])
        if stray:
            takes = ", ".join(sorted(_OPTIONS_OF[predictor])) or "none"
            given = ", ".join(stray)
            raise ValueError(f"predictor_options {given}: not options of predictor {predictor!r} ({takes})")

    def for_predictor(self, predictor: str, redis_url: str | None = None) -> PredictorOptions | None:
        """The factory's options for ``predictor`` (None for ``none``)."""
        self.check_for(predictor)
        if predictor == "semantic":
            return SemanticOptions(
                embed=EmbedderOptions(
                    self.embed_threads,
                    self.embed_window,
                    self.embed_quantize,
                    tuned=self.embed_tuned,
                    runtime=self.embed_runtime,
                    model=self.embed_model,
                    onnx_path=self.onnx_file,
                    onnx_missing=self.onnx_missing,
                ),
                default_model=self.default_model,
                batch_window_s=self.batch_window_s,
                max_batch=self.max_batch,
                redis_url=redis_url,
                redis_prefix=self.redis_prefix,
            )
        given = {
            k: v
            for k, v in self.model_dump(include=set(self.model_fields_set) - {"redis_prefix"}).items()
            if v is not None
        }
        if predictor == "global":
            return GlobalOptions(**given)
        if predictor == "length-bucket":
            return LengthBucketOptions(**given)
        return None
