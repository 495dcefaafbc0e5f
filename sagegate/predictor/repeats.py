"""A verbatim repeat of a prompt is the best evidence of its output length there is.

Why: among a hundred similar prompts, the neighbours' vote dilutes the one that *is* this prompt (on
ShareGPT, 10% of the tail's prompts occur verbatim earlier, with near-equal answer lengths). A repeat
is a kept neighbour with the same prompt length whose embedding matches to ``cosine``; the answer's
log mean moves ``weight`` of the way to the repeats' mean log outcome.
"""

from __future__ import annotations

import math

import numpy as np

from sagegate.core.distribution import LengthDistribution
from sagegate.predictor.index import Candidates


def toward_repeats(
    dist: LengthDistribution,
    cand: Candidates,
    keep: np.ndarray,
    prompt_tokens: int,
    weight: float,
    cosine: float,
) -> LengthDistribution:
    """``dist`` scaled toward the repeats among ``cand.rows[keep]`` (itself when there is none)."""
    if weight <= 0:
        return dist
    rep = keep[(cand.dense[keep] >= cosine) & (cand.prompt_tokens[keep] == prompt_tokens)]
    if not rep.size:
        return dist
    target = float(np.mean(np.log(np.maximum(cand.output_tokens[rep], 1.0))))
    factor = math.exp(weight * (target - math.log(max(dist.mean, 1.0))))
    return LengthDistribution.from_samples(np.asarray(dist.support, dtype=float) * factor, dist.probs)
