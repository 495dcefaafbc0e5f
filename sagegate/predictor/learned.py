"""What the predictor's shipped parts learned from: the digests of every prompt the ranking priors
were fitted on and the encoder's length tune was trained or selected on.

Why one place: replays that judge the predictor (the demo, ``bench_value.py``, the study's text
source, ``sagegate predictor eval``) leave these prompts out, or say they scored them, so that no figure
scores a shipped part on what it learned from. Each shipped file lists its own under ``trained_on``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np


@lru_cache(maxsize=4)
def trained_on(path: Path) -> frozenset[int]:
    """The ``trained_on`` digests a shipped ``.npz`` lists (empty when it is absent or lists none)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return frozenset(int(x) for x in f["trained_on"])
    except (OSError, KeyError, ValueError):
        return frozenset()


@lru_cache(maxsize=1)
def learned_prompts() -> frozenset[int]:
    """The :func:`core.request.prompt_digest` of every prompt any shipped part learned from."""
    from sagegate.predictor.encoders import ENCODERS
    from sagegate.predictor.ranker_prior import MPNET_PRIOR_PATH, PRIOR_PATH, TUNED_PRIOR_PATH

    out = trained_on(PRIOR_PATH) | trained_on(TUNED_PRIOR_PATH) | trained_on(MPNET_PRIOR_PATH)
    for spec in ENCODERS.values():
        out |= trained_on(spec.tune)
        if spec.projection is not None:
            out |= trained_on(spec.projection)
    return out
