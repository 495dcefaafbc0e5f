"""The one way to build an output-length predictor by name, with typed options.

Every predictor comes out on the simulator's face (:class:`core.predictor.LengthPredictor`); the
gateway wraps what it gets in its async adapter. Oracles read outcomes, so they are built only from an
explicit answer key (``truth=``, see :func:`core.request.answer_key`), and no other predictor may be
handed one: a predictor never learns an outcome through its query.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.distribution import LengthDistribution
from core.predictor import LengthPredictor
from predictor.baselines import GlobalPredictor, LengthBucketPredictor, NoisyOraclePredictor, OraclePredictor
from predictor.embedder import DEFAULT_QUANTIZE, DEFAULT_WINDOW

if TYPE_CHECKING:
    from predictor.embedder import TextEmbedder
    from predictor.semantic import SemanticConfig, SemanticPredictor


@dataclass(frozen=True, slots=True)
class NoisyOracleOptions:
    """``NoisyOraclePredictor``'s shape (its error and seed are :func:`make_predictor`'s own keywords)."""

    points: int = 16
    point: bool = False


@dataclass(frozen=True, slots=True)
class GlobalOptions:
    window: int = 2000
    max_points: int = 32
    min_samples: int = 1
    refresh_every: int = 32
    prior: LengthDistribution | None = None


@dataclass(frozen=True, slots=True)
class LengthBucketOptions:
    window_per_bucket: int = 500
    buckets: tuple[int, ...] | None = None
    min_samples: int = 8
    max_points: int = 32
    global_window: int = 2000
    refresh_every: int = 32
    prior: LengthDistribution | None = None


@dataclass(frozen=True, slots=True)
class EmbedderOptions:
    """The MiniLM embedder's torch threads, window (word pieces) and int8 layers; the defaults are the
    fast configuration. ``window=256, quantize=False`` is the first, slower one (its own history: the
    Redis stream is keyed by embedding version)."""

    threads: int = 1
    window: int = DEFAULT_WINDOW
    quantize: bool = DEFAULT_QUANTIZE


@dataclass(frozen=True, slots=True)
class SemanticOptions:
    """The semantic predictor. ``embedder`` (tests, benchmarks) replaces the MiniLM one ``embed``
    describes; ``redis_url`` shares the history under ``{redis_prefix}:{embedding version}``."""

    embed: EmbedderOptions = field(default_factory=EmbedderOptions)
    embedder: TextEmbedder | None = None
    config: SemanticConfig | None = None
    default_model: str = "default"
    batch_window_s: float = 0.0
    max_batch: int = 32
    redis_url: str | None = None
    redis_prefix: str = "sagegate:history"


PredictorOptions = NoisyOracleOptions | GlobalOptions | LengthBucketOptions | SemanticOptions

OPTIONS: dict[str, type[PredictorOptions] | None] = {
    "oracle": None,
    "noisy-oracle": NoisyOracleOptions,
    "global": GlobalOptions,
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
        return GlobalPredictor(
            g.window, g.max_points, g.prior, min_samples=g.min_samples, refresh_every=g.refresh_every
        )
    if name == "length-bucket":
        b = options if isinstance(options, LengthBucketOptions) else LengthBucketOptions()
        return LengthBucketPredictor(
            b.window_per_bucket,
            b.buckets,
            b.min_samples,
            b.max_points,
            global_window=b.global_window,
            prior=b.prior,
            refresh_every=b.refresh_every,
        )
    from predictor.semantic_sim import SemanticLengthPredictor  # loads the embedding stack

    return SemanticLengthPredictor(semantic_core(options if isinstance(options, SemanticOptions) else None))


def semantic_core(options: SemanticOptions | None = None) -> SemanticPredictor:
    """The semantic predictor's core (what its async and simulator faces wrap); its history is in
    process, or in Redis under one stream per embedding version when ``redis_url`` is set."""
    from predictor.embedder import MiniLMEmbedder
    from predictor.semantic import SemanticConfig, SemanticPredictor

    opts = options or SemanticOptions()
    embedder = opts.embedder
    if embedder is None:
        embedder = MiniLMEmbedder(
            threads=opts.embed.threads, window=opts.embed.window, quantize=opts.embed.quantize
        )
    store = None
    if opts.redis_url:
        from predictor.embedder import EMBED_VERSION
        from predictor.redis_store import RedisStore

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
