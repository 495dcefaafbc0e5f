"""The analyses on constructed result rows: a planted reversal is found, a stable pair is not, and the
vectorised pair bootstrap agrees with the scalar one in ``study.stats``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sagegate.study import analysis, stats
from sagegate.study.config import SourceSpec, StudyConfig
from sagegate.study.metrics import METRIC_NAMES

ENTRIES = ("fcfs@gateway", "edf@gateway", "vllm-v1@engine", "sjf-oracle@engine")


def make_rows(values: dict[tuple[str, str], list[float]], cfg: StudyConfig) -> list[dict[str, object]]:
    """Rows whose every metric equals the given per-window value (source, entry) → windows."""
    rows = []
    for (source, entry), per_window in values.items():
        policy, level = entry.split("@")
        for w, v in enumerate(per_window):
            row: dict[str, object] = {
                "cell": f"{source}/w{w:02d}/KNEE/{entry}/noisy-oracle:0.2",
                "source": source,
                "window": w,
                "region": "KNEE",
                "factor": 1.0,
                "utilisation": 0.5,
                "policy": policy,
                "level": level,
                "entry": entry,
                "predictor": "noisy-oracle",
                "error": 0.2,
            }
            row.update({m: v for m in METRIC_NAMES})
            rows.append(row)
    return rows


@pytest.fixture
def ds() -> analysis.Dataset:
    cfg = replace(
        StudyConfig(),
        sources=(SourceSpec("s1", "-"), SourceSpec("s2", "-")),
        windows=20,
        regions=(("KNEE", 1.0),),
        errors=(0.2,),
        bootstrap=1000,
    )
    rng = np.random.default_rng(5)
    noise = lambda: list(rng.normal(0, 0.01, 20))  # noqa: E731
    vals = {
        # fcfs vs edf: edf ahead by ~50% on s1, fcfs ahead by ~50% on s2 (a planted reversal)
        ("s1", "fcfs@gateway"): [0.4 + x for x in noise()],
        ("s1", "edf@gateway"): [0.8 + x for x in noise()],
        ("s2", "fcfs@gateway"): [0.8 + x for x in noise()],
        ("s2", "edf@gateway"): [0.4 + x for x in noise()],
        # vLLM alone: in between everywhere, with a tiny flip against nothing
        ("s1", "vllm-v1@engine"): [0.6 + x for x in noise()],
        ("s2", "vllm-v1@engine"): [0.6 + x for x in noise()],
        # the oracle is left out of the statistics
        ("s1", "sjf-oracle@engine"): [0.99] * 20,
        ("s2", "sjf-oracle@engine"): [0.99] * 20,
    }
    return analysis.load(make_rows(vals, cfg), cfg)


def test_oracles_are_out_of_the_rankings(ds: analysis.Dataset) -> None:
    assert "sjf-oracle@engine" in ds.entries
    assert "sjf-oracle@engine" not in ds.means("s1", "KNEE", "anwg")
    assert "sjf-oracle@engine" in ds.means("s1", "KNEE", "anwg", oracles=True)


def test_planted_reversal_is_supported_and_others_are_not(ds: analysis.Dataset) -> None:
    recs = [r for r in analysis.reversals(ds, ["anwg"])]
    by_pair = {frozenset((r.p1, r.p2)): r.cls for r in recs}
    assert by_pair[frozenset(("edf@gateway", "fcfs@gateway"))] == stats.SUPPORTED
    # each of them against vLLM alone also flips (0.4 < 0.6 < 0.8 swaps sides) with a > 10% lead
    assert by_pair[frozenset(("fcfs@gateway", "vllm-v1@engine"))] == stats.SUPPORTED
    assert len(recs) == 3  # three deployable entries, one source pair, one region
    (agree,) = analysis.cross_source(ds, "anwg")
    assert agree.agreement.tau_b == pytest.approx(-1.0)  # edf > vllm > fcfs, then the reverse
    assert agree.agreement.top1 == 0.0


def test_vectorised_pair_evidence_matches_paired_diff(ds: analysis.Dataset) -> None:
    ev = analysis._pair_evidence(ds, "s1", "KNEE", "anwg", None)
    pw = ds.per_window("s1", "KNEE", "anwg")
    idx = analysis._indices(ds, "s1", "KNEE")
    for (a, b), d in ev.items():
        ref = stats.paired_diff(pw[a], pw[b], idx)
        assert d.diff == pytest.approx(ref.diff)
        assert (d.lo, d.hi, d.p) == pytest.approx((ref.lo, ref.hi, ref.p))


def test_standing_and_gateway_comparison(ds: analysis.Dataset) -> None:
    st = {(s.source): s for s in analysis.standing(ds, "edf@gateway", "anwg")}
    assert st["s1"].top and st["s1"].lead > 0.2
    assert not st["s2"].top and st["s2"].rank == 3
    worse = {(r.source, r.entry) for r in analysis.gateway_vs_vllm(ds, ["anwg"]) if r.significant}
    assert worse == {("s1", "fcfs@gateway"), ("s2", "edf@gateway")}
