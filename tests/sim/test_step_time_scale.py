"""The step-time scale of issue 15's error bars: every step's GPU time scales, nothing else moves."""

from __future__ import annotations

import pytest

from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel

BATCHES = [
    ((), 1, 500),
    ((), 64, 64 * 900),
    (((512, 0),), 0, 0),
    (((2048, 1024), (100, 0)), 40, 40 * 700),
]


@pytest.mark.parametrize(("model", "tp"), [("llama-3.1-8b", 1), ("mixtral-8x7b", 2), ("llama-2-70b", 4)])
@pytest.mark.parametrize("scale", [0.85, 1.15])
def test_every_step_scales_by_the_factor(model: str, tp: int, scale: float) -> None:
    base = PerfModel(get_model(model), get_gpu("h100"), tp=tp)
    scaled = PerfModel(get_model(model), get_gpu("h100"), tp=tp, step_time_scale=scale)
    for prefill, n_decode, ctx in BATCHES:
        want = scale * base.step_time(prefill, n_decode, ctx)
        assert scaled.step_time(prefill, n_decode, ctx) == pytest.approx(want, rel=1e-12)
    assert scaled.decode_run_time(32, 32 * 400, 50) == pytest.approx(
        scale * base.decode_run_time(32, 32 * 400, 50)
    )
    assert scaled.frontend_s == base.frontend_s  # the front end is not a step
    assert scaled.num_gpu_blocks() == base.num_gpu_blocks()


def test_scale_one_is_bit_identical_and_the_gpu_can_carry_it() -> None:
    gpu = get_gpu("h100")
    base = PerfModel(get_model("qwen3-32b"), gpu)
    one = PerfModel(get_model("qwen3-32b"), gpu, step_time_scale=1.0)
    via_gpu = PerfModel(get_model("qwen3-32b"), gpu.with_step_time_scale(1.15))
    for prefill, n_decode, ctx in BATCHES:
        assert one.step_time(prefill, n_decode, ctx) == base.step_time(prefill, n_decode, ctx)
        assert via_gpu.step_time(prefill, n_decode, ctx) == pytest.approx(
            1.15 * base.step_time(prefill, n_decode, ctx)
        )
    assert gpu.terms is not None and gpu.terms.step_time_scale == 1.0  # the catalogue is untouched


def test_a_non_positive_scale_is_refused() -> None:
    with pytest.raises(ValueError, match="step_time_scale"):
        PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"), step_time_scale=0.0)
