"""``predictor_options``: typed, set from YAML, JSON or nested environment variables, refused when
unknown or another predictor's; the gateway builds its predictor through the one factory."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.predict import BaselinePredictor, NoPredictor, PredictInput, build_predictor
from gateway.settings import GatewaySettings, PredictorSettings, load_settings
from predictor.baselines import GlobalPredictor, LengthBucketPredictor
from predictor.factory import EmbedderOptions, GlobalOptions, LengthBucketOptions, SemanticOptions


def test_the_documented_json_variable_still_sets_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGEGATE_PREDICTOR_OPTIONS", '{"predict_budget_s": 1.5, "embed_quantize": "false"}')
    opts = GatewaySettings().predictor_options
    assert opts.predict_budget_s == 1.5 and opts.embed_quantize is False
    monkeypatch.delenv("SAGEGATE_PREDICTOR_OPTIONS")
    monkeypatch.setenv("SAGEGATE_PREDICTOR_OPTIONS__EMBED_WINDOW", "256")
    assert GatewaySettings().predictor_options.embed_window == 256


def test_yaml_options_reach_the_factory_typed(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("predictor: semantic\nredis_url: redis://r:6379/0\npredictor_options: {embed_threads: 2}")
    s = load_settings(cfg)
    opts = s.predictor_options.for_predictor(s.predictor, s.redis_url)
    assert opts == SemanticOptions(embed=EmbedderOptions(threads=2), redis_url="redis://r:6379/0")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"embed_thread": 2}, "embed_thread"),  # a typo
        ({"embed_window": 100}, "embed_window must be one of"),
        ({"predict_budget_s": 0}, "predict_budget_s"),
        ({"embed_quantize": "maybe"}, "embed_quantize"),
    ],
)
def test_unknown_or_invalid_options_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        GatewaySettings(predictor_options=options)


def test_an_option_of_another_predictor_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"window: not options of predictor 'semantic'"):
        GatewaySettings(predictor="semantic", predictor_options={"window": 100})
    with pytest.raises(ValidationError, match=r"predict_budget_s: not options of predictor 'global'"):
        GatewaySettings(predictor="global", predictor_options={"predict_budget_s": 1.0})
    with pytest.raises(ValidationError, match="'none'"):
        GatewaySettings(predictor="none", predictor_options={"embed_threads": 2})


def test_baseline_options_left_unset_keep_the_predictors_defaults() -> None:
    bucket = PredictorSettings(buckets=[10, 100], max_points=8)  # type: ignore[arg-type]
    assert bucket.for_predictor("length-bucket") == LengthBucketOptions(buckets=(10, 100), max_points=8)
    assert PredictorSettings().for_predictor("global") == GlobalOptions()
    assert PredictorSettings().for_predictor("none") is None


def test_the_gateway_wraps_the_factorys_history_predictors() -> None:
    assert isinstance(build_predictor("none"), NoPredictor)
    g = build_predictor("global", options=PredictorSettings(window=3, min_samples=2))
    b = build_predictor("length-bucket")
    assert isinstance(g, BaselinePredictor) and isinstance(g.inner, GlobalPredictor)
    assert g.inner.window.samples.maxlen == 3 and g.inner.min_samples == 2
    assert isinstance(b, BaselinePredictor) and isinstance(b.inner, LengthBucketPredictor)

    async def learn() -> tuple[float | None, float | None]:
        inp = PredictInput("hello", 10, "m")
        await g.record(inp, 40)
        one, _ = await g.predict(inp)  # below min_samples: the prior
        await g.record(inp, 40)
        two, path = await g.predict(inp)
        assert path == "global"
        return (None if one is None else one.mean), (None if two is None else two.mean)

    one, two = asyncio.run(learn())
    assert one != 40 and two == 40


def test_asking_for_the_length_tune_when_this_install_lacks_it_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from dataclasses import replace

    import predictor.encoders as encoders

    monkeypatch.setitem(encoders.ENCODERS, "minilm", replace(encoders.MINILM, tune=tmp_path / "absent.npz"))
    with pytest.raises(ValidationError, match="embed_tuned: false"):
        PredictorSettings(embed_tuned=True)
    assert PredictorSettings(embed_tuned=False).embed_tuned is False
