"""What the predictor's shipped parts learned from: the digests of every prompt the ranking priors
were fitted on and the encoder's length tune was trained or selected on.

Why one place: replays that judge the predictor (the demo, ``bench_value.py``, the study's text
source, ``sagegate predictor eval``) leave these prompts out, or say they scored them, so that no figure
scores a shipped part on what it learned from.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def learned_prompts() -> frozenset[int]:
    """The :func:`core.request.prompt_digest` of every prompt any shipped part learned from."""
    from predictor.encoder_tune import tune_training_prompts
    from predictor.ranker_prior import PRIOR_PATH, TUNED_PRIOR_PATH, prior_training_prompts

    return (
        prior_training_prompts(PRIOR_PATH)
        | prior_training_prompts(TUNED_PRIOR_PATH)
        | tune_training_prompts()
    )
