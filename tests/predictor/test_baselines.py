"""Text-free length predictors (predictor/baselines.py)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from sagegate.core.distribution import DEFAULT_PRIOR, LengthDistribution
from sagegate.core.predictor import LengthPredictor
from sagegate.core.request import PredictionQuery, TraceRequest, answer_key
from sagegate.predictor.baselines import (
    GlobalPredictor,
    LengthBucketPredictor,
    NoisyOraclePredictor,
    OraclePredictor,
    PrecomputedPredictor,
)
from sagegate.predictor.factory import (
    OPTIONS,
    GlobalOptions,
    LengthBucketOptions,
    NoisyOracleOptions,
    make_predictor,
)


def req(rid: int, output: int = 100, prompt: int = 50) -> TraceRequest:
    return TraceRequest(arrival_s=float(rid), prompt_tokens=prompt, output_tokens=output, rid=rid)


def assert_valid(d: LengthDistribution) -> None:
    assert math.isclose(math.fsum(d.probs), 1.0, rel_tol=1e-9)
    assert all(p > 0 for p in d.probs)
    assert all(a < b for a, b in zip(d.support, d.support[1:], strict=False))
    assert d.support[0] >= 1
    qs = [d.quantile(q / 20) for q in range(21)]
    assert qs == sorted(qs)


def ask(r: TraceRequest) -> PredictionQuery:
    return PredictionQuery.of(r)


def test_oracle_is_a_point_at_the_truth_from_its_answer_key() -> None:
    r = req(3, output=417)
    d = OraclePredictor(answer_key([r])).predict_inline(ask(r))
    assert d.support == (417,) and d.probs == (1.0,)


def test_a_query_carries_no_outcome_and_an_oracle_knows_only_its_key() -> None:
    r = req(3, output=417)
    assert not hasattr(ask(r), "output_tokens")
    with pytest.raises(KeyError, match="request 4"):
        OraclePredictor(answer_key([r])).predict_inline(ask(req(4)))
    with pytest.raises(ValueError, match="rid 3"):
        answer_key([r, req(3, output=5)])


# --- noisy oracle -------------------------------------------------------------------------------
@pytest.mark.parametrize("r", [0.1, 0.2, 0.5])
def test_noisy_oracle_relative_error_on_a_large_sample(r: float) -> None:
    true = 1_000_000  # large, so rounding to whole tokens is negligible
    reqs = [req(i, output=true) for i in range(20_000)]
    pred = NoisyOraclePredictor(relative_error=r, seed=7, point=True, truth=answer_key(reqs))
    ratios = [pred.predict_inline(ask(x)).mean / true for x in reqs]
    assert statistics.fmean(ratios) == pytest.approx(1.0, abs=0.02 * r + 0.002)
    assert statistics.pstdev(ratios) == pytest.approx(r, rel=0.05)


def test_noisy_oracle_distribution_is_centred_on_the_noisy_value_with_the_same_spread() -> None:
    true = 1_000_000
    reqs = [req(i, output=true) for i in range(50)]
    pred = NoisyOraclePredictor(relative_error=0.2, seed=1, truth=answer_key(reqs))
    for x in reqs:
        r = ask(x)
        d = pred.predict_inline(r)
        assert_valid(d)
        assert len(d.support) == 16
        assert d.mean == pytest.approx(pred.noisy_value(r), rel=1e-4)
        sd = math.sqrt(math.fsum(p * (o - d.mean) ** 2 for o, p in zip(d.support, d.probs, strict=True)))
        assert sd / d.mean == pytest.approx(0.2, rel=0.05)


def test_noisy_oracle_is_deterministic_per_seed_and_rid_whatever_the_call_order() -> None:
    work = [req(i, output=50 + 7 * i) for i in range(200)]
    key = answer_key(work)
    reqs = [ask(x) for x in work]
    a = NoisyOraclePredictor(seed=3, truth=key)
    b = NoisyOraclePredictor(seed=3, truth=key)
    forward = {r.rid: a.predict_inline(r).to_json() for r in reqs}
    shuffled = list(reqs)
    random.Random(0).shuffle(shuffled)
    backward = {r.rid: b.predict_inline(r).to_json() for r in shuffled}
    assert forward == backward
    assert {r.rid: a.predict_inline(r).to_json() for r in reqs} == forward  # asking twice changes nothing
    other = NoisyOraclePredictor(seed=4, truth=key)
    assert sum(other.predict_inline(r).to_json() != forward[r.rid] for r in reqs) > 150


def test_noisy_oracle_edge_cases() -> None:
    one, long = req(1, output=1), req(2, output=321)
    key = answer_key([one, long])
    tiny = NoisyOraclePredictor(relative_error=0.5, truth=key).predict_inline(ask(one))
    assert_valid(tiny)  # rounding collapses points, still a distribution
    exact = NoisyOraclePredictor(relative_error=0.0, truth=key).predict_inline(ask(long))
    assert exact.support == (321,)
    with pytest.raises(ValueError):
        NoisyOraclePredictor(relative_error=-0.1, truth=key)


# --- global -------------------------------------------------------------------------------------
def test_global_cold_start_answers_the_prior() -> None:
    assert GlobalPredictor().predict_inline(req(0)) is DEFAULT_PRIOR
    prior = LengthDistribution((10, 1000), (0.5, 0.5))
    g = GlobalPredictor(prior=prior, min_samples=3)
    g.observe_inline(req(0), 5)
    g.observe_inline(req(1), 5)
    assert g.predict_inline(req(2)) is prior
    g.observe_inline(req(2), 5)
    assert g.predict_inline(req(3)).support == (5,)


def test_global_window_is_bounded() -> None:
    g = GlobalPredictor(window=100, max_points=8, refresh_every=1)
    for i in range(1, 5001):
        g.observe_inline(req(i), i)
    assert len(g.window.samples) == 100
    d = g.predict_inline(req(0))
    assert_valid(d)
    assert len(d.support) <= 8
    assert min(d.support) >= 4901 and max(d.support) <= 5000


def test_global_with_refresh_every_one_is_always_fresh() -> None:
    g = GlobalPredictor(window=50, max_points=16, refresh_every=1)
    rnd = random.Random(5)
    seen: list[int] = []
    for i in range(300):
        o = rnd.randint(1, 2000)
        g.observe_inline(req(i), o)
        seen.append(o)
        want = LengthDistribution.from_samples(seen[-50:], max_points=16)
        assert g.predict_inline(req(i)).to_json() == want.to_json()


def test_global_cache_lags_at_most_a_sixteenth_of_the_window() -> None:
    g = GlobalPredictor(window=320, max_points=64)
    for i in range(320):
        g.observe_inline(req(i), 10)
    g.predict_inline(req(0))
    for i in range(320):
        g.observe_inline(req(i), 1000)
        d = g.predict_inline(req(i))
        share_new = d.cdf(10**6) - d.cdf(10)
        assert share_new >= (i + 1 - 320 // 16) / 320 - 1e-9


# --- length buckets -----------------------------------------------------------------------------
def test_bucket_falls_back_to_global_while_sparse() -> None:
    p = LengthBucketPredictor(min_samples=8)
    for i in range(20):
        p.observe_inline(req(i, prompt=100), 50)
    for i in range(3):
        p.observe_inline(req(100 + i, prompt=5000), 900)
    assert p.predict_inline(req(0, prompt=100)).support == (50,)  # own bucket
    sparse = p.predict_inline(req(0, prompt=5000))  # 3 < 8 samples: the global mix
    assert sparse.support == (50, 900)
    assert sparse.probs[1] == pytest.approx(3 / 23)
    for i in range(5):
        p.observe_inline(req(200 + i, prompt=5000), 900)
    assert p.predict_inline(req(0, prompt=5000)).support == (900,)
    assert p.predict_inline(req(0, prompt=1)).support == (50, 900)  # an empty bucket: the global mix


def test_bucket_cold_start_is_the_prior() -> None:
    assert LengthBucketPredictor().predict_inline(req(0)) is DEFAULT_PRIOR


def test_buckets_are_powers_of_two_or_given_edges() -> None:
    p = LengthBucketPredictor()
    assert p.bucket_of(64) == p.bucket_of(127) != p.bucket_of(128)
    q = LengthBucketPredictor(buckets=[100, 1000])
    assert [q.bucket_of(x) for x in (5, 99, 100, 999, 1000, 10**6)] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError):
        LengthBucketPredictor(buckets=[100, 50])


def test_bucket_windows_are_bounded() -> None:
    p = LengthBucketPredictor(window_per_bucket=30, global_window=70)
    for i in range(1000):
        p.observe_inline(req(i, prompt=10 + (i % 3) * 1000), i)
    assert all(len(w) == 30 for w in p.windows.values())
    assert len(p.fallback.window.samples) == 70


# --- precomputed and the factory ----------------------------------------------------------------
def test_precomputed_by_rid_then_fallback() -> None:
    d = LengthDistribution((7, 70), (0.25, 0.75))
    fb = GlobalPredictor()
    p = PrecomputedPredictor({5: d}, fallback=fb)
    assert p.predict_inline(req(5)) is d
    assert p.predict_inline(req(6)) is DEFAULT_PRIOR
    p.observe_inline(req(6), 42)
    assert p.predict_inline(req(6)).support == (42,)
    with pytest.raises(KeyError):
        PrecomputedPredictor({5: d}).predict_inline(req(6))


def test_all_predictors_emit_valid_distributions() -> None:
    rnd = random.Random(11)
    work = [req(i, output=rnd.randint(1, 4000), prompt=rnd.randint(1, 8000)) for i in range(300)]
    for name in ("oracle", "noisy-oracle", "global", "length-bucket"):
        keyed = {"truth": answer_key(work)} if "oracle" in name else {}
        p: LengthPredictor = make_predictor(name, seed=2, **keyed)
        assert p.name == name
        for r in work:
            assert_valid(p.predict_inline(ask(r)))
            p.observe_inline(ask(r), r.output_tokens)


def test_make_predictor_passes_options_and_rejects_unknown_names() -> None:
    p = make_predictor("noisy-oracle", NoisyOracleOptions(point=True), relative_error=0.3, seed=9, truth={})
    assert isinstance(p, NoisyOraclePredictor) and p.relative_error == 0.3 and p.seed == 9 and p.point
    g = make_predictor("global", GlobalOptions(window=10))
    assert isinstance(g, GlobalPredictor) and g.window.samples.maxlen == 10
    b = make_predictor("length-bucket", LengthBucketOptions(buckets=(10, 100), min_samples=2))
    assert isinstance(b, LengthBucketPredictor) and b.edges == (10, 100) and b.min_samples == 2
    with pytest.raises(ValueError) as err:
        make_predictor("psychic")
    for valid in OPTIONS:
        assert valid in str(err.value)


def test_options_must_be_the_named_predictors_own() -> None:
    with pytest.raises(ValueError, match="'global' takes GlobalOptions, not LengthBucketOptions"):
        make_predictor("global", LengthBucketOptions())
    with pytest.raises(ValueError, match="'oracle' takes no options"):
        make_predictor("oracle", GlobalOptions(), truth={})


def test_only_an_oracle_is_handed_the_answer_key_and_it_must_be() -> None:
    for oracle in ("oracle", "noisy-oracle"):
        with pytest.raises(ValueError, match="needs an answer key"):
            make_predictor(oracle)
    for name in ("global", "length-bucket", "semantic"):
        with pytest.raises(ValueError, match="must not be handed an answer key"):
            make_predictor(name, truth={0: 5})
