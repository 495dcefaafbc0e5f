"""Issue 15, part 4: utilisation-anchored regions mean the same load on every source."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sagegate.core.request import TraceRequest
from sagegate.loadgen.records import scale_rate
from sagegate.loadgen.synthetic import synthetic_workload
from sagegate.study.calibrate import Calibration, arrival_rate, calibrate_window
from sagegate.study.config import (
    REGIONS,
    UTILISATION_REGIONS,
    RegionAnchor,
    StudyConfig,
    with_utilisation_regions,
)
from sagegate.study.report.reversals import load_ends
from sagegate.study.simrun import Entry, run_window
from sagegate.study.sweep import plan
from sagegate.study.windows import Window, make_windows

N = 60


def _window(name: str, prompt: float, output: float, rate: float, seed: int) -> tuple[Window, Calibration]:
    cfg = replace(StudyConfig(), windows=1, window_size=N)
    rows = synthetic_workload(N, rate=rate, prompt_mean=prompt, output_mean=output, seed=seed)
    (w,) = make_windows(rows, name, cfg, max_tokens=None)
    return w, calibrate_window(w, cfg)


@pytest.fixture(scope="module")
def two_sources() -> dict[str, tuple[Window, Calibration]]:
    """A decode-heavy and a prefill-heavy small source: their knees sit at different utilisations."""
    return {
        "chatty": _window("chatty", 800, 300, 2.0, 4),
        "codey": _window("codey", 2500, 25, 2.0, 5),
    }


def test_a_utilisation_region_offers_its_share_of_the_saturated_rate(
    two_sources: dict[str, tuple[Window, Calibration]],
) -> None:
    for w, cal in two_sources.values():
        for _, target in UTILISATION_REGIONS:
            work = scale_rate(list(w.requests), cal.factor(RegionAnchor.UTILISATION, target))
            assert arrival_rate(work) / cal.saturated_rate == pytest.approx(target, rel=0.02)


COPIES = 20


def _stream(w: Window) -> list[TraceRequest]:
    """``COPIES`` of the window back to back: a steady stream of its mix at its own rate."""
    gap = max(r.arrival_s for r in w.requests) + 1.0 / arrival_rate(w.requests)
    return [
        replace(r, rid=k * N + r.rid, arrival_s=r.arrival_s + k * gap, deadline_s=None)
        for k in range(COPIES)
        for r in w.requests
    ]


def _mean_ttft_s(w: Window, cal: Calibration, target: float) -> float:
    """The reference engine's mean time to first token at utilisation ``target`` of the stream."""
    res = run_window(
        _stream(w),
        cal.factor(RegionAnchor.UTILISATION, target),
        Entry("fcfs", "engine"),
        model="llama-3.1-8b",
        gpu="h100",
        seed=w.seed,
    )
    ttft = [r.first_token_s - r.arrival_s for r in res.records if r.first_token_s is not None]
    assert len(ttft) == len(res.records)
    return sum(ttft) / len(ttft)


def test_below_the_anchor_the_engine_keeps_up_and_above_it_falls_behind(
    two_sources: dict[str, tuple[Window, Calibration]],
) -> None:
    """On both sources, whatever their knees: at U50 requests wait about as little as at U10; at U150
    (past capacity) a queue builds over the stream and the first token waits many times longer."""
    for w, cal in two_sources.values():
        idle = _mean_ttft_s(w, cal, 0.1)
        assert _mean_ttft_s(w, cal, 0.5) < 3.0 * idle
        assert _mean_ttft_s(w, cal, 1.5) > 10.0 * idle


def test_plan_uses_the_configured_anchor(two_sources: dict[str, tuple[Window, Calibration]]) -> None:
    corpus = {name: [w] for name, (w, _) in two_sources.items()}
    cals = {w.id: cal for w, cal in two_sources.values()}
    entries = [Entry("fcfs", "engine")]
    by_util = plan(
        with_utilisation_regions(replace(StudyConfig(), errors=(0.2,), robustness=())), corpus, cals, entries
    )
    assert {b.region for b in by_util} == {name for name, _ in UTILISATION_REGIONS}
    for b in by_util:
        assert b.utilisation == pytest.approx(dict(UTILISATION_REGIONS)[b.region], rel=1e-9)
    lssp = plan(replace(StudyConfig(), errors=(0.2,), robustness=()), corpus, cals, entries)
    assert {b.region for b in lssp} == {name for name, _ in REGIONS}
    knee = {b.window.source: b.utilisation for b in lssp if b.region == "KNEE"}
    assert knee["chatty"] != pytest.approx(knee["codey"], rel=0.05)  # why the second set exists


def test_the_anchor_survives_the_config_file() -> None:
    cfg = with_utilisation_regions(StudyConfig())
    back = StudyConfig.from_dict(cfg.to_dict())
    assert back.region_anchor is RegionAnchor.UTILISATION and back.regions == UTILISATION_REGIONS
    old = StudyConfig().to_dict()
    del old["region_anchor"]  # a config.json written before the anchor existed
    assert StudyConfig.from_dict(old).region_anchor is RegionAnchor.VIOLATION


def test_lssp_load_checks_read_each_sets_own_light_and_heavy_ends() -> None:
    """On the utilisation set, LSSP's "none at LOW" check reads U50, not a region the run never had."""
    assert load_ends(REGIONS, [name for name, _ in REGIONS]) == ("LOW", ["OVERLOAD", "HIGH_PRESSURE"])
    assert load_ends(UTILISATION_REGIONS, ["U110", "U50", "U90"]) == ("U50", ["U90", "U110"])
    assert load_ends(REGIONS, ["KNEE", "LOW"]) == ("LOW", ["LOW", "KNEE"])
