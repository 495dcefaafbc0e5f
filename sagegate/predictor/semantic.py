"""The semantic output-length predictor: similar past prompts → a distribution of output length.

For a prompt it gathers candidates from two views of the live window of its model — the nearest
MiniLM embeddings (hnswlib) and the best TF-IDF word matches (an inverted index) — and ranks them by a
blend of both cosines. The best ``k`` above a similarity floor vote with weight
``exp((s − s_max)/T) · exp(−|ln I − ln I_n| / ℓ)``: sharpened relative to the best match, and favouring
neighbours of similar prompt length. Their lengths form a discrete distribution, optionally moved in log
space toward a linear probe's estimate (``probe_weight``; see :mod:`predictor.probe`) and toward the
ranking head's score (``head_weight``; :mod:`predictor.ranker`, trained in the background from the
shipped prior), then shrunk toward the prompt-length-bucket prior (then the global one), itself moved by
the head, by ``c / (c + n_eff)``; with too few neighbours above the floor the moved prior answers alone,
and with no history at all the shipped prior's log-normal. Opt-in (``calibrate``), the result's spread
is stretched so that its 10–90% interval covers ~80% of recent outcomes (:mod:`predictor.calibration`).
Every answer says which path it took: ``semantic``, ``bucket``, ``global`` or ``cold``. Defaults were
chosen on ShareGPT's validation span (:class:`SemanticConfig`).

The request path only reads local state: a replica's index is fed by its own completions at once and by
other replicas' through the history store's background consumer.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from sagegate.core.distribution import DEFAULT_PRIOR, LengthDistribution, mixture
from sagegate.predictor.cues import cue_features
from sagegate.predictor.embed_queue import BatchingEmbedder
from sagegate.predictor.embedder import MiniLMEmbedder, PromptLike, TextEmbedder, flatten_prompt
from sagegate.predictor.history import Completion, HistoryStore, WindowBounds, wall_clock
from sagegate.predictor.index import IndexConfig
from sagegate.predictor.lexical import DocFreq, extract_terms
from sagegate.predictor.memory_store import MemoryStore
from sagegate.predictor.ranker import features as head_features
from sagegate.predictor.ranker import log_mean, lognormal_points
from sagegate.predictor.ranker_prior import shipped_prior
from sagegate.predictor.repeats import toward_repeats
from sagegate.predictor.semantic_shard import ModelShard

log = logging.getLogger(__name__)

PATHS = ("semantic", "bucket", "global", "cold")


@dataclass(frozen=True)
class SemanticConfig:
    """Hyperparameters. ``dense_weight``, ``temperature``, ``prior_weight`` and ``head_weight`` were
    re-chosen for the shipped encoder's vectors (length-tuned MiniLM, ONNX int8) on ShareGPT's
    validation span by ``benchmarks/select_semantic.py``; the rest were tuned earlier on the stock
    encoder's replay (``sagegate predictor eval``) and held on validation."""

    k: int = 100
    k_dense: int = 100
    k_lexical: int = 100
    dense_weight: float = 0.5
    """The embedding's share of the neighbours' similarity (the rest: TF-IDF cosine). 0.2 on the stock
    encoder; the length-tuned embedding carries more of what predicts length."""
    temperature: float = 0.05
    length_scale: float = 1.0
    floor: float = 0.05
    min_neighbours: int = 3
    prior_weight: float = 0.25
    max_points: int = 32
    bucket_min_samples: int = 8
    probe_weight: float = 0.3
    probe_refit_every: int = 500
    probe_alpha: float = 3.0
    head_weight: float = 0.1
    head_blend_learned: bool = False
    head_prior_weight: float = 1.0
    head_lambda: float = 300.0
    head_refit_every: int = 500
    head_max_rows: int = 20000
    head_pairwise_steps: int = 60
    repeat_weight: float = 0.75
    """How far an answer moves toward a verbatim repeat's outcomes (:mod:`predictor.repeats`)."""
    repeat_cosine: float = 0.9999
    shipped_prior: bool = True
    calibrate: bool = False
    """Conformal spread correction (:mod:`predictor.calibration`). Off: on a biased location (multi-turn
    chat, 1.65x low) it collapsed the served median to a few tokens, which admission charged."""
    calibration_rate: float = 0.05
    coverage_target: float = 0.8
    bounds: WindowBounds = field(default_factory=WindowBounds)
    index: IndexConfig = field(default_factory=IndexConfig)


KNN_ONLY = SemanticConfig(
    head_weight=0.0, head_prior_weight=0.0, shipped_prior=False, calibrate=False, repeat_weight=0.0
)
"""The predictor from neighbours and the ridge probe alone (no ranking head, no shipped prior, no
spread correction): what the benchmarks compare the default against."""

NAMED_CONFIGS: dict[str, SemanticConfig] = {"default": SemanticConfig(), "knn-only": KNN_ONLY}
"""The configurations a command line can name (``sagegate study --semantic-config``)."""


def inline_config(cfg: SemanticConfig | None = None) -> SemanticConfig:
    """``cfg`` (default: the default) with every refit inline: the index rebuilds, the probe's and
    the ranking head's fits, all of which otherwise run on threads. A replay (evaluation, the
    simulated twin, the study) must be the same run every time."""
    cfg = cfg or SemanticConfig()
    return replace(cfg, index=replace(cfg.index, background=False))


@dataclass(frozen=True, slots=True)
class PromptFeatures:
    """What the predictor keeps of a prompt: its embedding, hashed lexical terms and length cues."""

    embedding: np.ndarray
    terms: np.ndarray
    counts: np.ndarray
    cues: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))


@dataclass(frozen=True, slots=True)
class NeighbourAnswer:
    distribution: LengthDistribution
    path: str
    neighbours: int = 0
    max_similarity: float = 0.0
    features: PromptFeatures | None = None

    @property
    def mean(self) -> float:
        return self.distribution.mean

    @property
    def p10(self) -> int:
        return self.distribution.quantile(0.1)

    @property
    def p50(self) -> int:
        return self.distribution.quantile(0.5)

    @property
    def p90(self) -> int:
        return self.distribution.quantile(0.9)


@dataclass
class PredictorStats:
    """Plain counters; ``errors`` counts failures swallowed to keep the request path alive."""

    paths: Counter[str] = field(default_factory=Counter)
    recorded: int = 0
    received: int = 0
    errors: int = 0


class SemanticPredictor:
    """The semantic core: predict from a prompt's features, record an outcome under them.

    It has no I/O on the request path and no request type of its own: :mod:`predictor.semantic_face`
    puts it behind the one predictor interface the gateway and the simulator call.
    """

    name = "semantic"

    def __init__(
        self,
        embedder: TextEmbedder | None = None,
        store: HistoryStore | None = None,
        config: SemanticConfig | None = None,
        clock: Callable[[], float] = wall_clock,
        default_model: str = "default",
        batch_window_s: float = 0.0,
        max_batch: int = 32,
    ) -> None:
        self.config = config or SemanticConfig()
        base = embedder if embedder is not None else MiniLMEmbedder()
        self.embedder = BatchingEmbedder(base, window_s=batch_window_s, max_batch=max_batch)
        self.store: HistoryStore = (
            store if store is not None else MemoryStore(self.config.bounds, clock=clock)
        )
        self.clock = clock
        self.default_model = default_model
        self.counters = PredictorStats()
        self._docfreq = DocFreq(half_life=max(1000.0, self.config.bounds.max_entries / 2))
        self._df_lock = threading.Lock()
        self._shards: dict[str, ModelShard] = {}
        self._shards_lock = threading.Lock()
        self._started = False
        self._start_lock = threading.Lock()

    # --- life cycle ---------------------------------------------------------------------------
    def start(self) -> SemanticPredictor:
        """Load the live window from the store and start hearing other replicas (idempotent)."""
        with self._start_lock:
            if not self._started:
                self._started = True
                self.ingest(self.store.start(self._deliver))
        return self

    def warm_up(self) -> None:
        """Load the model and run a forward pass now (gateway start-up), not on the first request:
        loading MiniLM takes seconds, and a request that waits for it is ranked ``late``. The pass
        runs on the embedder's worker thread, the one that will serve requests."""
        self.embedder.submit("warm up").result()

    def close(self) -> None:
        self.store.close()
        self.embedder.close()

    def __enter__(self) -> SemanticPredictor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- features -----------------------------------------------------------------------------
    def features(self, prompt: PromptLike) -> PromptFeatures:
        return self.features_many([prompt])[0]

    def features_many(self, prompts: Sequence[PromptLike]) -> list[PromptFeatures]:
        """Batch path (evaluation, warm-up): one forward pass for all prompts."""
        texts = [flatten_prompt(p) for p in prompts]
        vecs = self.embedder.embed(texts)
        return [self.features_from(v, t) for v, t in zip(vecs, texts, strict=True)]

    @staticmethod
    def features_from(embedding: np.ndarray, text: str) -> PromptFeatures:
        terms, counts = extract_terms(text)
        return PromptFeatures(np.asarray(embedding, dtype=np.float32), terms, counts, cue_features(text))

    # --- prediction ---------------------------------------------------------------------------
    def predict_features(
        self, feats: PromptFeatures | None, prompt_tokens: int, model: str | None = None
    ) -> NeighbourAnswer:
        """The prediction from local state only (no I/O)."""
        if not self._started:
            self.start()
        shard = self._shards.get(model or self.default_model)
        cfg = self.config
        if shard is None:
            return self.tally(NeighbourAnswer(self._cold(feats, prompt_tokens), "cold", features=feats))
        with shard.index.lock:
            prior, prior_path = shard.prior_for(prompt_tokens, self.clock())
            if feats is None:
                return self.tally(NeighbourAnswer(prior, prior_path))
            h = self._head_score(shard, feats, prompt_tokens)
            prior = self._moved_prior(shard, prior, prior_path, h)
            with self._df_lock:
                q_w = self._docfreq.weigh(feats.terms, feats.counts)
            cand = shard.index.search(feats.embedding, feats.terms, q_w, cfg.k_dense, cfg.k_lexical)
        if not cand.rows.size:
            return self._answer(shard, NeighbourAnswer(prior, prior_path, features=feats))
        sim = cfg.dense_weight * cand.dense + (1.0 - cfg.dense_weight) * cand.lexical
        keep = np.flatnonzero(sim >= cfg.floor)
        best = float(sim.max())
        if keep.size < cfg.min_neighbours:
            return self._answer(shard, NeighbourAnswer(prior, prior_path, int(keep.size), best, feats))
        if keep.size > cfg.k:
            keep = keep[np.argpartition(-sim[keep], cfg.k)[: cfg.k]]
        s = sim[keep]
        w = np.exp((s - s.max()) / cfg.temperature)
        if cfg.length_scale > 0:
            gap = np.abs(np.log(max(1, prompt_tokens)) - np.log(cand.prompt_tokens[keep]))
            w = w * np.exp(-gap / cfg.length_scale)
        outs = cand.output_tokens[keep]
        if cfg.probe_weight > 0:
            est = shard.probe.predict(feats.terms, q_w)
            if est is not None:  # move the neighbours' lengths toward the probe, in log space
                shift = cfg.probe_weight * (est - math.log(float(w @ outs / w.sum())))
                outs = outs * math.exp(shift)
        if h is not None and cfg.head_weight > 0:  # and toward the ranking head's score
            a = log_mean(outs, w)
            outs = outs * math.exp(shard.blend.location(a, h, feats) - a)
        knn = LengthDistribution.from_samples(outs, w, max_points=cfg.max_points)
        dist = knn
        if cfg.prior_weight > 0:
            n_eff = float(w.sum() ** 2 / np.square(w).sum())
            lam = cfg.prior_weight / (cfg.prior_weight + n_eff)
            dist = mixture([(1.0 - lam, knn), (lam, prior)])
            if len(dist.support) > cfg.max_points:
                dist = LengthDistribution.from_samples(dist.support, dist.probs, max_points=cfg.max_points)
        dist = toward_repeats(dist, cand, keep, prompt_tokens, cfg.repeat_weight, cfg.repeat_cosine)
        return self._answer(shard, NeighbourAnswer(dist, "semantic", int(keep.size), best, feats))

    def _head_score(self, shard: ModelShard, feats: PromptFeatures, prompt_tokens: int) -> float | None:
        if self.config.head_weight <= 0 and self.config.head_prior_weight <= 0:
            return None
        return shard.head.score(head_features(feats.embedding, feats.cues, prompt_tokens))

    def _moved_prior(
        self, shard: ModelShard, prior: LengthDistribution, path: str, h: float | None
    ) -> LengthDistribution:
        """The length prior moved in log space toward the head's score (``head_prior_weight``); before
        any outcome of this model, the head's own log-normal."""
        beta = self.config.head_prior_weight
        if h is None or beta <= 0:
            return prior
        if path == "cold":
            return LengthDistribution.from_samples(*lognormal_points(h, shard.head.sigma))
        sup = np.asarray(prior.support, dtype=float)
        probs = np.asarray(prior.probs, dtype=float)
        return LengthDistribution.from_samples(sup * math.exp(beta * (h - log_mean(sup, probs))), probs)

    def _cold(self, feats: PromptFeatures | None, prompt_tokens: int) -> LengthDistribution:
        """No history for this model: the shipped prior's log-normal, else the default point."""
        model = shipped_prior(self.embedder.version) if self.config.shipped_prior else None
        if feats is None or model is None or self.config.head_prior_weight <= 0:
            return DEFAULT_PRIOR
        h = model.score(head_features(feats.embedding, feats.cues, prompt_tokens))
        return LengthDistribution.from_samples(*lognormal_points(h, model.sigma))

    def _answer(self, shard: ModelShard, p: NeighbourAnswer) -> NeighbourAnswer:
        """Stretch the spread by the shard's conformal factor and count the path."""
        if self.config.calibrate:
            p = replace(p, distribution=shard.calibrator.apply(p.distribution, p.features))
        return self.tally(p)

    def tally(self, p: NeighbourAnswer) -> NeighbourAnswer:
        """Count the path an answer took (``stats``) and return it."""
        self.counters.paths[p.path] += 1
        return p

    def failed(self, what: str) -> None:
        """A failure swallowed to keep the request path alive: counted and logged, never raised."""
        self.counters.errors += 1
        log.exception(what)

    def fallback(self, prompt_tokens: int, model: str | None = None) -> NeighbourAnswer:
        """Prior-only answer (used when the embedder fails)."""
        shard = self._shards.get(model or self.default_model)
        if shard is None:
            return NeighbourAnswer(DEFAULT_PRIOR, "cold")
        with shard.index.lock:
            dist, path = shard.prior_for(prompt_tokens, self.clock())
        return NeighbourAnswer(dist, path)

    # --- history ------------------------------------------------------------------------------
    def record_features(
        self,
        feats: PromptFeatures,
        prompt_tokens: int,
        output_tokens: int,
        model: str | None = None,
        tenant: str = "default",
        rid: str | None = None,
        ts: float | None = None,
    ) -> Completion:
        rec = Completion(
            id=rid or Completion.new_id(),
            model=model or self.default_model,
            embedding=feats.embedding,
            prompt_tokens=int(prompt_tokens),
            output_tokens=int(output_tokens),
            ts=self.clock() if ts is None else ts,
            tenant=tenant,
            terms=feats.terms,
            counts=feats.counts,
            cues=feats.cues,
        )
        if not self._started:
            self.start()
        shard = self._shards.get(rec.model)
        if shard is not None:
            shard.blend.observe(feats, math.log(max(1, output_tokens)))
            if self.config.calibrate:  # otherwise it served no interval to score
                shard.calibrator.observe(feats, output_tokens)
        if self._ingest_one(rec):
            self.counters.recorded += 1
            self.store.append(rec)
        return rec

    def record(
        self,
        prompt: PromptLike | PromptFeatures,
        prompt_tokens: int,
        output_tokens: int,
        model: str | None = None,
        tenant: str = "default",
        rid: str | None = None,
    ) -> bool:
        """A request completed: index it here and share it. Never raises (False on failure)."""
        try:
            feats = prompt if isinstance(prompt, PromptFeatures) else self.features(prompt)
            self.record_features(feats, prompt_tokens, output_tokens, model, tenant, rid)
            return True
        except Exception:
            self.failed("recording a completion failed")
            return False

    def record_length(self, prompt_tokens: int, output_tokens: int, model: str | None = None) -> None:
        """A request without prompt text completed: only its model's length priors learn from it."""
        self._shard(model or self.default_model).observe_length(prompt_tokens, output_tokens, self.clock())

    def ingest(self, records: Iterable[Completion]) -> int:
        return sum(self._ingest_one(r) for r in records)

    def _deliver(self, records: list[Completion]) -> None:
        try:
            self.counters.received += self.ingest(records)
        except Exception:
            self.failed("indexing delivered completions failed")

    def _ingest_one(self, rec: Completion) -> bool:
        shard = self._shard(rec.model)
        if rec.id in shard.index:
            return False
        with self._df_lock:
            self._docfreq.add(rec.terms)
            weights = self._docfreq.weigh(rec.terms, rec.counts)
        added = shard.index.add(rec, weights, self.clock())
        if added and self.config.probe_weight > 0:
            shard.maybe_refit()
        return added

    def _shard(self, model: str) -> ModelShard:
        shard = self._shards.get(model)
        if shard is None:
            with self._shards_lock:
                prior = shipped_prior(self.embedder.version) if self.config.shipped_prior else None
                shard = self._shards.setdefault(model, ModelShard(self.config, prior))
        return shard

    def expire(self) -> int:
        """Drop entries past the window bounds now (also done on every insertion)."""
        now = self.clock()
        n = 0
        for shard in list(self._shards.values()):
            n += shard.index.expire(now)
            with shard.index.lock:
                shard.priors.expire(now)
        return n

    def size(self, model: str | None = None) -> int:
        shard = self._shards.get(model or self.default_model)
        return 0 if shard is None else len(shard.index)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"path_{p}": self.counters.paths.get(p, 0) for p in PATHS}
        out.update(
            recorded=self.counters.recorded,
            received=self.counters.received,
            errors=self.counters.errors,
            embed_batches=self.embedder.batches,
            embed_items=self.embedder.items,
            entries={m: len(s.index) for m, s in self._shards.items()},
        )
        out.update({f"store_{k}": v for k, v in self.store.stats().as_dict().items()})
        return out
