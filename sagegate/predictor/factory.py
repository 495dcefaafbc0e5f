"""The one way to build an output-length predictor by name, with typed options.

Every predictor comes out behind the one interface (:class:`core.predictor.LengthPredictor`) that the
gateway and the simulator both call. Oracles read outcomes, so they are built only from an
explicit answer key (``truth=``, see :func:`core.request.answer_key`), and no other predictor may be
handed one: a predictor never learns an outcome through its query.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sagegate.core.distribution import LengthDistribution
from sagegate.core.predictor import InlinePredictor, LengthPredictor
from sagegate.predictor.baselines import (
    GlobalPredictor,
    LengthBucketPredictor,
    NoisyOraclePredictor,
    OraclePredictor,
)
from sagegate.predictor.embedder import DEFAULT_QUANTIZE, DEFAULT_WINDOW
from sagegate.predictor.encoder_tune import DEFAULT_TUNED
from sagegate.predictor.encoders import DEFAULT_ENCODER, ENCODERS
from sagegate.predictor.history import WindowBounds

if TYPE_CHECKING:
    from sagegate.predictor.embedder import TextEmbedder
    from sagegate.predictor.semantic import SemanticConfig, SemanticPredictor


@dataclass(frozen=True, slots=True)
class NoisyOracleOptions:
    """``NoisyOraclePredictor``'s shape (its error and seed are :func:`make_predictor`'s own keywords)."""

    points: int = 16
    point: bool = False


BASELINE_BOUNDS = WindowBounds(max_entries=20_000)
"""A shared baseline history's stream: the baselines' windows hold 2,000 outcomes by default (500 per
prompt-length bucket), and a starting replica loads what the stream keeps (24 h at most)."""

HISTORY_PREFIX = "sagegate:history"
"""Redis key prefix of the shared histories: ``{prefix}:{embedding version}`` for the semantic
predictor, ``{prefix}:{predictor}`` for a history baseline."""


@dataclass(frozen=True, slots=True)
class GlobalOptions:
    """``redis_url``: learn from every replica's completions too (:mod:`predictor.shared_history`)."""

    window: int = 2000
    max_points: int = 32
    min_samples: int = 1
    refresh_every: int = 32
    prior: LengthDistribution | None = None
    redis_url: str | None = None
    redis_prefix: str = HISTORY_PREFIX


@dataclass(frozen=True, slots=True)
class LengthBucketOptions:
    """``redis_url``: learn from every replica's completions too (:mod:`predictor.shared_history`)."""

    window_per_bucket: int = 500
    buckets: tuple[int, ...] | None = None
    min_samples: int = 8
    max_points: int = 32
    global_window: int = 2000
    refresh_every: int = 32
    prior: LengthDistribution | None = None
    redis_url: str | None = None
    redis_prefix: str = HISTORY_PREFIX


@dataclass(frozen=True, slots=True)
class PrefixOptions:
    """The ``prefix`` predictor (:mod:`predictor.prefix_key`). ``redis_url``: learn from every
    replica's completions too (:mod:`predictor.shared_history`)."""

    key_chars: int = 1024
    per_key: int = 64
    shrink: float = 4.0
    max_keys: int = 20000
    window: int = 2000
    max_points: int = 32
    refresh_every: int = 32
    prior: LengthDistribution | None = None
    redis_url: str | None = None
    redis_prefix: str = HISTORY_PREFIX


EMBED_RUNTIMES = ("onnx", "torch")
ONNX_MISSING = ("export", "torch", "error")


@dataclass(frozen=True, slots=True)
class EmbedderOptions:
    """The MiniLM embedder's threads, window (word pieces), int8 layers and runtime; the defaults are
    the fast, light configuration. ``window=256, quantize=False`` is the first, slower one (its own
    history: the Redis stream is keyed by embedding version).

    ``runtime="onnx"`` loads onnxruntime and the ONNX file at ``onnx_path`` (unset: the cache, see
    :func:`predictor.embedder_onnx.default_onnx_path`) and never imports torch. When the file is
    missing, ``onnx_missing`` says what happens: ``export`` it once from the shipped package in a child
    process, fall back to the ``torch`` runtime, or raise an ``error``. ``tuned``: the shipped length
    tune merged into the encoder (:mod:`predictor.encoder_tune`; its own embedding version).
    ``model``: the encoder (:mod:`predictor.encoders`); any but MiniLM runs on ONNX only."""

    threads: int = 1
    window: int = DEFAULT_WINDOW
    quantize: bool = DEFAULT_QUANTIZE
    tuned: bool = DEFAULT_TUNED
    runtime: str = "onnx"
    onnx_path: str | None = None
    onnx_missing: str = "export"
    model: str = DEFAULT_ENCODER


@dataclass(frozen=True, slots=True)
class SemanticOptions:
    """The semantic predictor. ``embedder`` (tests, benchmarks) replaces the MiniLM one ``embed``
    describes; ``redis_url`` shares the history under ``{redis_prefix}:{embedding version}``.
    ``budget_s``: None computes a prompt's features on the calling thread (a replay); a number
    embeds on the worker thread and waits that long at most (the gateway; see
    :mod:`predictor.semantic_face`)."""

    embed: EmbedderOptions = field(default_factory=EmbedderOptions)
    embedder: TextEmbedder | None = None
    config: SemanticConfig | None = None
    default_model: str = "default"
    batch_window_s: float = 0.0
    max_batch: int = 32
    redis_url: str | None = None
    redis_prefix: str = HISTORY_PREFIX
    budget_s: float | None = None


PredictorOptions = NoisyOracleOptions | GlobalOptions | PrefixOptions | LengthBucketOptions | SemanticOptions

OPTIONS: dict[str, type[PredictorOptions] | None] = {
    "oracle": None,
    "noisy-oracle": NoisyOracleOptions,
    "global": GlobalOptions,
    "prefix": PrefixOptions,
    "length-bucket": LengthBucketOptions,
    "semantic": SemanticOptions,
}
"""Every predictor's name and the type of its options (None: it takes none)."""

ORACLES = frozenset({"oracle", "noisy-oracle"})
"""The predictors that must be handed an answer key (``truth=``): simulation only."""

LIVE_PREDICTORS = tuple(name for name in OPTIONS if name not in ORACLES)
"""The predictors a live gateway can run (it knows no outcome ahead)."""


def make_predictor(
    name: str,
    options: PredictorOptions | None = None,
    *,
    relative_error: float = 0.2,
    seed: int = 0,
    truth: Mapping[int, int] | None = None,
) -> LengthPredictor:
    """The predictor ``name`` with ``options`` (None: its defaults). ``relative_error`` and ``seed``
    are the noisy oracle's; ``truth`` is the answer key an oracle must be handed and no other may."""
    if name not in OPTIONS:
        raise ValueError(f"unknown predictor {name!r}; valid predictors: {', '.join(sorted(OPTIONS))}")
    wanted = OPTIONS[name]
    if options is not None and (wanted is None or not isinstance(options, wanted)):
        takes = "no options" if wanted is None else wanted.__name__
        raise ValueError(f"predictor {name!r} takes {takes}, not {type(options).__name__}")
    if (name in ORACLES) != (truth is not None):
        need = "needs an answer key (truth=)" if truth is None else "must not be handed an answer key"
        raise ValueError(f"predictor {name!r} {need}")
    if truth is not None:
        if name == "oracle":
            return OraclePredictor(truth)
        noisy = options if isinstance(options, NoisyOracleOptions) else NoisyOracleOptions()
        return NoisyOraclePredictor(relative_error, seed, truth=truth, points=noisy.points, point=noisy.point)
    if name == "global":
        g = options if isinstance(options, GlobalOptions) else GlobalOptions()
        inline = GlobalPredictor(
            g.window, g.max_points, g.prior, min_samples=g.min_samples, refresh_every=g.refresh_every
        )
        return shared(inline, g.redis_url, g.redis_prefix)
    if name == "prefix":
        from sagegate.predictor.prefix_key import PrefixKeyPredictor

        k = options if isinstance(options, PrefixOptions) else PrefixOptions()
        keyed = PrefixKeyPredictor(
            k.key_chars,
            k.per_key,
            k.shrink,
            k.max_keys,
            window=k.window,
            max_points=k.max_points,
            prior=k.prior,
            refresh_every=k.refresh_every,
        )
        return shared(keyed, k.redis_url, k.redis_prefix)
    if name == "length-bucket":
        b = options if isinstance(options, LengthBucketOptions) else LengthBucketOptions()
        bucketed = LengthBucketPredictor(
            b.window_per_bucket,
            b.buckets,
            b.min_samples,
            b.max_points,
            global_window=b.global_window,
            prior=b.prior,
            refresh_every=b.refresh_every,
        )
        return shared(bucketed, b.redis_url, b.redis_prefix)
    from sagegate.predictor.semantic_face import SemanticLengthPredictor  # loads the embedding stack

    opts = options if isinstance(options, SemanticOptions) else SemanticOptions()
    return SemanticLengthPredictor(semantic_core(opts), opts.budget_s)


def shared(inline: InlinePredictor, redis_url: str | None, prefix: str) -> InlinePredictor:
    """``inline`` alone, or learning from every replica's completions through Redis."""
    if redis_url is None:
        return inline
    from sagegate.predictor.redis_store import RedisStore
    from sagegate.predictor.shared_history import SharedHistory

    store = RedisStore(redis_url, f"{prefix}:{inline.name}", BASELINE_BOUNDS, embedded=False)
    return SharedHistory(inline, store)


def semantic_core(options: SemanticOptions | None = None) -> SemanticPredictor:
    """The semantic predictor's core (what :mod:`predictor.semantic_face` wraps); its history is in
    process, or in Redis under one stream per embedding version when ``redis_url`` is set."""
    from sagegate.predictor.semantic import SemanticConfig, SemanticPredictor

    opts = options or SemanticOptions()
    embedder = opts.embedder if opts.embedder is not None else make_embedder(opts.embed)
    store = None
    if opts.redis_url:
        from sagegate.predictor.embedder import EMBED_VERSION
        from sagegate.predictor.redis_store import RedisStore

        # Replicas (or a restart) on another model, window or precision never read vectors they
        # cannot compare with their own.
        version = getattr(embedder, "version", EMBED_VERSION)
        bounds = (opts.config or SemanticConfig()).bounds
        store = RedisStore(opts.redis_url, prefix=f"{opts.redis_prefix}:{version}", bounds=bounds)
    return SemanticPredictor(
        embedder,
        store=store,
        config=opts.config,
        default_model=opts.default_model,
        batch_window_s=opts.batch_window_s,
        max_batch=opts.max_batch,
    )


def make_embedder(opts: EmbedderOptions | None = None) -> TextEmbedder:
    """The MiniLM embedder ``opts`` describe, on its runtime (see :class:`EmbedderOptions`); raises
    ``OnnxModelMissing`` with what to do when the ONNX path cannot run and ``onnx_missing`` says
    ``error`` (or the export fails)."""
    import logging
    from pathlib import Path

    from sagegate.predictor.embedder import MiniLMEmbedder
    from sagegate.predictor.embedder_onnx import (
        OnnxEmbedder,
        OnnxModelMissing,
        default_onnx_path,
        onnx_runtime_missing,
    )

    o = opts or EmbedderOptions()
    if o.model not in ENCODERS:
        raise ValueError(f"embed model must be one of {', '.join(ENCODERS)}, not {o.model!r}")
    if o.runtime not in EMBED_RUNTIMES:
        raise ValueError(f"embedder runtime must be one of {', '.join(EMBED_RUNTIMES)}, not {o.runtime!r}")
    if o.onnx_missing not in ONNX_MISSING:
        raise ValueError(f"onnx_missing must be one of {', '.join(ONNX_MISSING)}, not {o.onnx_missing!r}")

    def torch_embedder() -> TextEmbedder:
        return MiniLMEmbedder(threads=o.threads, window=o.window, quantize=o.quantize, tuned=o.tuned)

    torch_ok = o.model == DEFAULT_ENCODER  # the torch embedder is MiniLM's
    if o.runtime == "torch":
        if not torch_ok:
            raise ValueError(f"the {o.model} encoder runs on the onnx runtime only")
        return torch_embedder()
    path = Path(o.onnx_path) if o.onnx_path else default_onnx_path(o.quantize, o.tuned, o.model)
    problem = onnx_runtime_missing()
    if problem is None and not path.is_file():
        problem = f"no ONNX model at {path}"
        if o.onnx_missing == "export":
            from sagegate.predictor.onnx_export import ExportFailed, export_in_subprocess

            logging.getLogger(__name__).warning("%s: exporting it once from the shipped package", problem)
            try:
                export_in_subprocess(path, quantize=o.quantize, tuned=o.tuned, model_name=o.model)
                problem = None
            except ExportFailed as exc:
                problem = f"{problem}, and {exc}"
    if problem is None:
        return OnnxEmbedder(
            path, threads=o.threads, quantize=o.quantize, window=o.window, tuned=o.tuned, model=o.model
        )
    if o.onnx_missing == "torch" and torch_ok:
        logging.getLogger(__name__).warning("%s: the embedder falls back to torch", problem)
        return torch_embedder()
    raise OnnxModelMissing(
        f"{problem}; run `sagegate predictor export-onnx`"
        + ("" if o.model == DEFAULT_ENCODER else f" --model {o.model}")
        + ("" if o.quantize else " --precision fp32")
        + " (needs the embed extra)"
        + (", or set predictor_options.embed_runtime: torch" if torch_ok else "")
    )
