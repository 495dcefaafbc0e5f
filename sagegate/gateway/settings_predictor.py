"""``predictor_options``: the typed options of the gateway's predictor (``gateway.settings`` holds the
rest of the one settings object and re-exports these)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

from sagegate.predictor.embedder import DEFAULT_QUANTIZE, DEFAULT_WINDOW, WINDOWS
from sagegate.predictor.encoder_tune import DEFAULT_TUNED
from sagegate.predictor.encoders import DEFAULT_ENCODER, encoder
from sagegate.predictor.factory import (
    HISTORY_PREFIX,
    LIVE_PREDICTORS,
    EmbedderOptions,
    GlobalOptions,
    LengthBucketOptions,
    PrefixOptions,
    SemanticOptions,
)

PREDICTORS = ("none", *LIVE_PREDICTORS)

DEFAULT_BUDGET_S = 0.05
"""How long a request waits for the semantic predictor's embedding before the prior answers."""


_SEMANTIC = SemanticOptions()
_GLOBAL = GlobalOptions()
_BUCKET = LengthBucketOptions()
_PREFIX = PrefixOptions()


class _Options(BaseModel):
    """One predictor's options: an option another predictor takes is refused, as is an unknown one."""

    model_config = ConfigDict(extra="forbid")


class NoPredictorSettings(_Options):
    """``predictor: none``: no prediction, no options."""

    predictor: Literal["none"] = "none"

    def factory_options(self, redis_url: str | None = None) -> None:
        return None


class GlobalSettings(_Options):
    """``predictor: global``: the last outputs' distribution, whatever the prompt."""

    predictor: Literal["global"] = "global"
    window: int = Field(default=_GLOBAL.window, ge=1)
    """Outputs remembered."""
    min_samples: int = Field(default=_GLOBAL.min_samples, ge=1)
    max_points: int = Field(default=_GLOBAL.max_points, ge=1)
    refresh_every: int = Field(default=_GLOBAL.refresh_every, ge=1)
    redis_prefix: str = HISTORY_PREFIX
    """Key prefix of the shared history (``redis_url``): the stream is ``{prefix}:global``."""

    def factory_options(self, redis_url: str | None = None) -> GlobalOptions:
        return GlobalOptions(
            self.window,
            self.max_points,
            self.min_samples,
            self.refresh_every,
            redis_url=redis_url,
            redis_prefix=self.redis_prefix,
        )


class PrefixSettings(_Options):
    """``predictor: prefix``: output-length history per prompt prefix (the task a system prompt or a
    conversation's opening names), shrunk toward the global histogram (``predictor.prefix_key``)."""

    predictor: Literal["prefix"] = "prefix"
    key_chars: int = Field(default=_PREFIX.key_chars, ge=1)
    """Characters of the prompt's start that name its task (a chat's system and first user turns)."""
    per_key: int = Field(default=_PREFIX.per_key, ge=1)
    """Outcomes remembered per key."""
    shrink: float = Field(default=_PREFIX.shrink, ge=0.0)
    """Pseudo-count of the global histogram in a key's prediction: after n outcomes the key weighs
    n / (n + shrink)."""
    max_keys: int = Field(default=_PREFIX.max_keys, ge=1)
    """Keys remembered (least recently seen out first; ~1 KB each)."""
    window: int = Field(default=_PREFIX.window, ge=1)
    """Outputs in the global histogram."""
    max_points: int = Field(default=_PREFIX.max_points, ge=1)
    refresh_every: int = Field(default=_PREFIX.refresh_every, ge=1)
    redis_prefix: str = HISTORY_PREFIX
    """Key prefix of the shared history (``redis_url``): the stream is ``{prefix}:prefix``."""

    def factory_options(self, redis_url: str | None = None) -> PrefixOptions:
        return PrefixOptions(
            self.key_chars,
            self.per_key,
            self.shrink,
            self.max_keys,
            self.window,
            self.max_points,
            self.refresh_every,
            redis_url=redis_url,
            redis_prefix=self.redis_prefix,
        )


class LengthBucketSettings(_Options):
    """``predictor: length-bucket``: output-length history per prompt-length bucket."""

    predictor: Literal["length-bucket"] = "length-bucket"
    window_per_bucket: int = Field(default=_BUCKET.window_per_bucket, ge=1)
    buckets: tuple[int, ...] | None = None
    """Ascending prompt-length edges (unset: powers of two)."""
    min_samples: int = Field(default=_BUCKET.min_samples, ge=1)
    max_points: int = Field(default=_BUCKET.max_points, ge=1)
    global_window: int = Field(default=_BUCKET.global_window, ge=1)
    refresh_every: int = Field(default=_BUCKET.refresh_every, ge=1)
    redis_prefix: str = HISTORY_PREFIX
    """Key prefix of the shared history (``redis_url``): the stream is ``{prefix}:length-bucket``."""

    def factory_options(self, redis_url: str | None = None) -> LengthBucketOptions:
        return LengthBucketOptions(
            self.window_per_bucket,
            self.buckets,
            self.min_samples,
            self.max_points,
            self.global_window,
            self.refresh_every,
            redis_url=redis_url,
            redis_prefix=self.redis_prefix,
        )


class SemanticSettings(_Options):
    """``predictor: semantic``: similar past prompts (the default)."""

    predictor: Literal["semantic"] = "semantic"
    predict_budget_s: float = Field(default=DEFAULT_BUDGET_S, gt=0.0)
    """Longest wait for the embedding; past it the request is ranked from the prior (path ``late``)."""
    embed_threads: int = Field(default=1, ge=1)
    """torch threads. One: on a busy CPU more oversubscribe it (measured: 800 ms per embedding with
    the default on a loaded 2-core machine, 38 ms with one)."""
    embed_window: int = DEFAULT_WINDOW
    """Word pieces embedded (one of ``predictor.embedder.WINDOWS``); with ``embed_quantize`` it names
    the embedding version, and so the history replicas share. ``embed_window: 256, embed_quantize:
    false`` is a slower configuration with a history of its own."""
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
    redis_prefix: str = HISTORY_PREFIX
    """Key prefix of the shared history in Redis (``redis_url``): the stream is
    ``{prefix}:{embedding version}``."""

    @model_validator(mode="after")
    def _encoder_usable(self) -> SemanticSettings:
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

    def factory_options(self, redis_url: str | None = None) -> SemanticOptions:
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
            budget_s=self.predict_budget_s,
        )


AnyPredictorSettings = (
    NoPredictorSettings | GlobalSettings | PrefixSettings | LengthBucketSettings | SemanticSettings
)
PredictorSettings = Annotated[AnyPredictorSettings, Field(discriminator="predictor")]
"""``predictor_options``: the options of the predictor ``predictor`` names, one model per predictor
(:class:`GatewaySettings` tells them apart by its ``predictor`` field)."""


_ADAPTER: TypeAdapter[AnyPredictorSettings] = TypeAdapter(PredictorSettings)


def predictor_options(predictor: str, **given: object) -> AnyPredictorSettings:
    """The options of the predictor ``predictor``: ``given``, the rest its defaults (raises
    ``pydantic.ValidationError`` for an option it does not take)."""
    return _ADAPTER.validate_python({**given, "predictor": predictor})


def tag_options(data: Any, default: str) -> Any:
    """The raw settings with ``predictor_options`` tagged by ``predictor`` (``default`` when unset):
    its models are told apart by their own ``predictor`` field, which a config file need not repeat."""
    if not isinstance(data, dict):
        return data
    name = data.get("predictor", default)
    options = data.get("predictor_options")
    if options is None:
        return {**data, "predictor_options": {"predictor": name}}
    if isinstance(options, dict) and isinstance(name, str):
        check_options(name, options)
        return {**data, "predictor_options": {**options, "predictor": name}}
    return data


def check_options(predictor: str, options: AnyPredictorSettings | dict[str, Any]) -> None:
    """Raise ``ValueError`` when ``options`` name another predictor than ``predictor``."""
    given = options.get("predictor", predictor) if isinstance(options, dict) else options.predictor
    if given != predictor:
        raise ValueError(f"predictor_options are {given!r}'s, but predictor is {predictor!r}")
