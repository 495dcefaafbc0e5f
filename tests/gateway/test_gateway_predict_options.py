"""``predictor_options``: one typed model per predictor, set from YAML, JSON or nested environment
variables, refused when unknown or another predictor's; the gateway builds its predictor through the
one factory."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from sagegate.core.request import PredictionQuery
from sagegate.gateway.predict import NoPredictor, build_predictor
from sagegate.gateway.settings import DEFAULT_BUDGET_S, GatewaySettings, load_settings
from sagegate.gateway.settings_predictor import (
    GlobalSettings,
    LengthBucketSettings,
    SemanticSettings,
    predictor_options,
)
from sagegate.predictor.baselines import GlobalPredictor, LengthBucketPredictor
from sagegate.predictor.factory import EmbedderOptions, GlobalOptions, LengthBucketOptions, SemanticOptions


def test_the_documented_json_variable_still_sets_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGEGATE_PREDICTOR", "semantic")  # (the default is prefix)
    monkeypatch.setenv("SAGEGATE_PREDICTOR_OPTIONS", '{"predict_budget_s": 1.5, "embed_quantize": "false"}')
    opts = GatewaySettings().predictor_options
    assert isinstance(opts, SemanticSettings)
    assert opts.predict_budget_s == 1.5 and opts.embed_quantize is False
    monkeypatch.delenv("SAGEGATE_PREDICTOR_OPTIONS")
    monkeypatch.setenv("SAGEGATE_PREDICTOR_OPTIONS__EMBED_WINDOW", "256")
    nested = GatewaySettings().predictor_options
    assert isinstance(nested, SemanticSettings) and nested.embed_window == 256
    monkeypatch.setenv("SAGEGATE_PREDICTOR", "global")
    monkeypatch.setenv("SAGEGATE_PREDICTOR_OPTIONS__EMBED_WINDOW", "256")
    with pytest.raises(ValidationError, match="embed_window"):  # the predictor named by the environment
        GatewaySettings()
    monkeypatch.delenv("SAGEGATE_PREDICTOR_OPTIONS__EMBED_WINDOW")
    monkeypatch.setenv("SAGEGATE_PREDICTOR_OPTIONS__WINDOW", "7")
    chosen = GatewaySettings().predictor_options
    assert isinstance(chosen, GlobalSettings) and chosen.window == 7


def test_yaml_options_reach_the_factory_typed(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("predictor: semantic\nredis_url: redis://r:6379/0\npredictor_options: {embed_threads: 2}")
    s = load_settings(cfg)
    opts = s.predictor_options.factory_options(s.redis_url)
    expected = SemanticOptions(
        embed=EmbedderOptions(threads=2), redis_url="redis://r:6379/0", budget_s=DEFAULT_BUDGET_S
    )
    assert opts == expected


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
        GatewaySettings(predictor="semantic", predictor_options=options)


def test_an_option_of_another_predictor_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"predictor_options.semantic.window\n  Extra inputs"):
        GatewaySettings(predictor="semantic", predictor_options={"window": 100})
    with pytest.raises(ValidationError, match=r"predictor_options.global.predict_budget_s\n  Extra inputs"):
        GatewaySettings(predictor="global", predictor_options={"predict_budget_s": 1.0})
    with pytest.raises(ValidationError, match=r"predictor_options.none.embed_threads"):
        GatewaySettings(predictor="none", predictor_options={"embed_threads": 2})
    with pytest.raises(
        ValidationError, match="predictor_options are 'global''s, but predictor is 'semantic'"
    ):
        GatewaySettings(predictor="semantic", predictor_options=GlobalSettings())
    with pytest.raises(ValidationError, match="predictor_options are 'global''s"):
        GatewaySettings(predictor="semantic", predictor_options={"predictor": "global"})


def test_baseline_options_left_unset_keep_the_predictors_defaults() -> None:
    bucket = LengthBucketSettings(buckets=(10, 100), max_points=8)
    assert bucket.factory_options() == LengthBucketOptions(buckets=(10, 100), max_points=8)
    assert predictor_options("global").factory_options() == GlobalOptions()
    assert predictor_options("none").factory_options() is None


def test_the_gateway_builds_the_factorys_history_predictors() -> None:
    assert isinstance(build_predictor("none"), NoPredictor)
    g = build_predictor("global", options=GlobalSettings(window=3, min_samples=2))
    b = build_predictor("length-bucket")
    assert isinstance(g, GlobalPredictor) and isinstance(b, LengthBucketPredictor)
    assert g.window.samples.maxlen == 3 and g.min_samples == 2
    with pytest.raises(ValueError, match="options of predictor 'global' given for predictor 'semantic'"):
        build_predictor("semantic", options=GlobalSettings())

    async def learn() -> tuple[float | None, float | None]:
        query = PredictionQuery(0, 10, "hello", model="m")
        await g.observe(query, 40)
        one = await g.predict(query)  # below min_samples: the prior
        await g.observe(query, 40)
        two = await g.predict(query)
        assert two.path == "global"
        means = [None if p.distribution is None else p.distribution.mean for p in (one, two)]
        return means[0], means[1]

    one, two = asyncio.run(learn())
    assert one != 40 and two == 40


def test_asking_for_the_length_tune_when_this_install_lacks_it_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from dataclasses import replace

    import sagegate.predictor.encoders as encoders

    monkeypatch.setitem(encoders.ENCODERS, "minilm", replace(encoders.MINILM, tune=tmp_path / "absent.npz"))
    with pytest.raises(ValidationError, match="embed_tuned: false"):
        SemanticSettings(embed_tuned=True)
    assert SemanticSettings(embed_tuned=False).embed_tuned is False
