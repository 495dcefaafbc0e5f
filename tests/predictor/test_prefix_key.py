"""The ``prefix`` predictor: outcomes per prompt prefix, shrunk toward the global histogram."""

from __future__ import annotations

import pytest

from sagegate.core.request import PredictionQuery
from sagegate.predictor.baselines import GlobalPredictor
from sagegate.predictor.factory import PrefixOptions, make_predictor
from sagegate.predictor.prefix_key import PrefixKeyPredictor, prefix_key

SYSTEM_A = "system: you answer in one word. " * 40
SYSTEM_B = "system: you write long essays with many sections. " * 40


def q(rid: int, prompt: str | None) -> PredictionQuery:
    return PredictionQuery(rid=rid, prompt_tokens=100, prompt=prompt)


def test_an_unseen_prompt_is_answered_exactly_as_global() -> None:
    keyed, plain = PrefixKeyPredictor(), GlobalPredictor()
    for i, n in enumerate([10, 500, 40, 900, 70]):
        keyed.observe_inline(q(i, f"prompt {i}"), n)
        plain.observe_inline(q(i, f"prompt {i}"), n)
    for prompt in ("something never seen", None, ""):
        got, want = keyed.predict_inline(q(99, prompt)), plain.predict_inline(q(99, prompt))
        assert (got.support, got.probs) == (want.support, want.probs)


def test_a_task_named_by_its_prompt_start_predicts_its_own_lengths() -> None:
    p = PrefixKeyPredictor(key_chars=256, shrink=4.0)
    for i in range(40):
        p.observe_inline(q(i, SYSTEM_A + f"question {i}"), 3 + i % 3)
        p.observe_inline(q(i, SYSTEM_B + f"question {i}"), 1500 + 10 * (i % 5))
    short = p.predict_inline(q(100, SYSTEM_A + "a new question"))
    long = p.predict_inline(q(101, SYSTEM_B + "a new question"))
    assert short.quantile(0.5) <= 5
    assert long.quantile(0.5) >= 1500
    assert short.mean < long.mean / 5


def test_the_key_weighs_more_as_its_outcomes_accumulate() -> None:
    """After n outcomes the key weighs n / (n + shrink): one outcome moves the median little, many
    make the key's own lengths the prediction."""
    p = PrefixKeyPredictor(key_chars=64, shrink=4.0)
    for i in range(200):
        p.observe_inline(q(i, f"other traffic {i} " + "x" * 80), 1000)
    p.observe_inline(q(500, SYSTEM_A), 5)
    once = p.predict_inline(q(501, SYSTEM_A))
    assert once.cdf(5) == pytest.approx(1 / 5 + 4 / 5 * 1 / 201)  # the global window heard it too
    for i in range(15):
        p.observe_inline(q(502 + i, SYSTEM_A), 5)
    many = p.predict_inline(q(600, SYSTEM_A))
    assert many.cdf(5) == pytest.approx(16 / 20 + 4 / 20 * 16 / 216)


def test_keys_are_bounded_least_recently_seen_first_out() -> None:
    p = PrefixKeyPredictor(key_chars=32, max_keys=3)
    for i in range(5):
        p.observe_inline(q(i, f"task {i}".ljust(40, ".")), 7)
    assert len(p) == 3
    p.observe_inline(q(9, "task 2".ljust(40, ".")), 7)  # seen again: kept
    p.observe_inline(q(10, "task 5".ljust(40, ".")), 7)
    assert prefix_key("task 2".ljust(40, "."), 32) in p._keys
    assert prefix_key("task 3".ljust(40, "."), 32) not in p._keys


def test_the_factory_builds_it_and_refuses_bad_options() -> None:
    p = make_predictor("prefix", PrefixOptions(key_chars=128))
    assert isinstance(p, PrefixKeyPredictor) and p.key_chars == 128
    with pytest.raises(ValueError):
        PrefixKeyPredictor(key_chars=0)
    with pytest.raises(ValueError):
        PrefixKeyPredictor(shrink=-1)
