"""An engine's speed learned from its own counters: from a prior that is another engine's, the fit
comes to the engine's own prefill and decode times; nothing learned from idle or empty intervals."""

from __future__ import annotations

import random

from sagegate.policies.engine_speed import EngineSpeed, SpeedFit

BIGGER = EngineSpeed(prefill_s=1.1e-4, step_s=0.024, per_seq_s=0.00038)
"""A Qwen3-32B-like engine, against the prior's Llama-3.1-8B."""


def intervals(
    speed: EngineSpeed, n: int, seed: int = 0, noise: float = 0.1
) -> list[tuple[float, float, float, float]]:
    """Busy scrape intervals of ``speed``: (seconds, prefilled, generated, batch), ±``noise``."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        batch, steps = rng.randint(1, 60), rng.randint(2, 10)
        prefilled = rng.choice([0, 0, 0, 1024, 7000])
        generated = steps * batch
        t = speed.prefill_s * prefilled + speed.step_s * steps + speed.per_seq_s * generated
        out.append((t * rng.uniform(1 - noise, 1 + noise), prefilled, generated, batch))
    return out


def test_the_fit_comes_to_the_engines_own_speed() -> None:
    fit = SpeedFit(EngineSpeed())
    assert fit.speed == EngineSpeed()  # nothing seen: the prior
    for interval in intervals(BIGGER, 200):
        fit.observe(*interval)
    got = fit.speed
    assert abs(got.prefill_s / BIGGER.prefill_s - 1) < 0.05
    for batch in (8, 30, 60):  # what the forecast reads: a step at the batch it joins
        want = BIGGER.step_s + BIGGER.per_seq_s * batch
        assert abs((got.step_s + got.per_seq_s * batch) / want - 1) < 0.08, batch
    assert fit.intervals == 200


def test_nothing_is_learned_from_an_empty_interval_and_a_fit_never_makes_an_engine_free() -> None:
    fit = SpeedFit(EngineSpeed())
    for args in ((0.0, 100, 100, 4), (0.1, 0, 0, 4), (0.1, 100, 100, 0)):
        fit.observe(*args)
    assert fit.intervals == 0 and fit.speed == EngineSpeed()
    for _ in range(50):
        fit.observe(1e-9, 5000, 500, 50)  # counters that say "free": clamped, not zero or negative
    s = fit.speed
    assert s.prefill_s > 0 and s.step_s > 0 and s.per_seq_s >= 0
