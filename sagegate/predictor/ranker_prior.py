"""The ranking head's prior that ships with the project: a weight vector learned offline on public
prompt–response pairs (``tools/make_ranker_prior.py``; source and licence in
``predictor/data/RANKER_PRIOR.md``).

Why: from an empty history the neighbours know nothing, yet "write a 1,000-word essay" is longer than
"answer yes or no" for any served model. The weights score a prompt in log-length units *relative to the
training set's mean* (the intercept is only a fallback), so what transfers to another model is the
ranking and the size of the shifts; each model's :class:`predictor.ranker.OnlineHead` re-fits its own
intercept and moves the weights as its completions arrive. The file is tied to the cue layout and the
embedder family it was fitted under (the model, and the length tune merged into it, if any; window and
precision may differ); a mismatch loads nothing (the head then starts from zero). One file ships per
encoder: ``ranker_prior.npz`` for the stock weights, ``ranker_prior_tuned.npz`` for the tuned ones,
``ranker_prior_mpnet.npz`` for the tuned all-mpnet-base-v2.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from sagegate.predictor.cues import CUE_NAMES
from sagegate.predictor.ranker import N_FEATURES, HeadModel

log = logging.getLogger(__name__)

PRIOR_PATH = Path(__file__).resolve().parent / "data" / "ranker_prior.npz"
TUNED_PRIOR_PATH = PRIOR_PATH.with_name("ranker_prior_tuned.npz")
MPNET_PRIOR_PATH = PRIOR_PATH.with_name("ranker_prior_mpnet.npz")
"""The tuned all-mpnet-base-v2's (``predictor_options.embed_model: mpnet``, :mod:`predictor.encoders`)."""


def encoder_family(embed_version: str) -> str:
    """The part of an embedding version a prior depends on: the model and its tune, not the window
    or the precision (``minilm-l6-v2/head32-tail27/v1/int8/tune-ab12cd34`` gives
    ``minilm-l6-v2/tune-ab12cd34``)."""
    parts = embed_version.split("/")
    return "/".join([parts[0], *(p for p in parts[1:] if p.startswith("tune-"))])


def prior_path(embed_version: str) -> Path:
    """The shipped prior for vectors of ``embed_version``'s encoder (one for each encoder's tuned
    weights; the stock MiniLM's too)."""
    if embed_version.startswith("mpnet-"):
        return MPNET_PRIOR_PATH
    return TUNED_PRIOR_PATH if "/tune-" in embed_version else PRIOR_PATH


def layout_digest() -> str:
    """What the weights are tied to: the cue names in order and the feature count."""
    return hashlib.sha256(("|".join(CUE_NAMES) + f"|{N_FEATURES}").encode()).hexdigest()[:16]


def save_prior(
    model: HeadModel, path: Path, embed_version: str, source: str, trained_on: Sequence[int] = ()
) -> None:
    """``trained_on``: the :func:`core.request.prompt_digest` of every prompt it was fitted on."""
    np.savez_compressed(
        path,
        trained_on=np.array(sorted(trained_on), dtype=np.uint64),
        coef_std=model.coef_std.astype(np.float32),
        intercept=np.float64(model.intercept),
        mu=model.mu.astype(np.float32),
        sd=model.sd.astype(np.float32),
        sigma=np.float64(model.sigma),
        fitted_on=np.int64(model.fitted_on),
        layout=np.str_(layout_digest()),
        embed_version=np.str_(embed_version),
        source=np.str_(source),
    )


def load_prior(path: Path = PRIOR_PATH, embed_version: str | None = None) -> HeadModel | None:
    """The prior at ``path``, or None when it is absent or fitted under another layout/embedder."""
    try:
        with np.load(path, allow_pickle=False) as f:
            if str(f["layout"]) != layout_digest():
                log.warning("ranker prior %s: fitted under another cue layout; not used", path)
                return None
            if embed_version is not None and encoder_family(str(f["embed_version"])) != encoder_family(
                embed_version
            ):
                log.warning("ranker prior %s: fitted for embedder %s; not used", path, f["embed_version"])
                return None
            return HeadModel(
                f["coef_std"].astype(np.float32),
                float(f["intercept"]),
                f["mu"].astype(np.float32),
                f["sd"].astype(np.float32),
                float(f["sigma"]),
                int(f["fitted_on"]),
            )
    except (OSError, KeyError, ValueError):
        log.warning("ranker prior %s could not be read; not used", path)
        return None


@lru_cache(maxsize=4)
def shipped_prior(embed_version: str) -> HeadModel | None:
    """The shipped prior for vectors of ``embed_version``, loaded once (offline: it is package data)."""
    return load_prior(prior_path(embed_version), embed_version)
