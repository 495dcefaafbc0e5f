"""The offline replay (``sagegate predictor eval``): loading, scoring, and the command's JSON."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sagegate.cmd_predictor import predictor_app
from sagegate.predictor.embedder import EMBED_VERSION
from sagegate.predictor.evaluate import default_history, evaluate, load_items, score
from tests.conftest import data_path
from tests.semantic_support import LONG_TASKS, SHORT_TASKS, TOPICS, family, real_embedder


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def clustered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two task families of equal prompt length but very different output length, shuffled in time."""
    monkeypatch.setenv("SAGEGATE_CACHE", str(tmp_path / "cache"))
    rng = random.Random(7)
    rows: list[dict[str, object]] = []
    for text in family(SHORT_TASKS, TOPICS):
        rows.append({"prompt": text, "output_tokens": rng.randint(5, 40), "prompt_tokens": 20})
    for text in family(LONG_TASKS, TOPICS):
        rows.append({"prompt": text, "output_tokens": rng.randint(600, 1500), "prompt_tokens": 20})
    rng.shuffle(rows)
    for i, r in enumerate(rows):
        r["arrival_s"] = float(i)
    return write_jsonl(tmp_path / "clustered.jsonl", rows)


def test_loader_orders_by_arrival_and_reads_chat_messages(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "second", "output_tokens": 5, "arrival_s": 2.0},
            {
                "prompt": [{"role": "user", "content": "first prompt here"}],
                "output_tokens": 7,
                "arrival_s": 1.0,
            },
        ],
    )
    items = load_items(path)
    assert [it.output_tokens for it in items] == [7, 5]
    assert all(it.prompt_tokens >= 1 for it in items)  # estimated when absent
    with pytest.raises(ValueError, match="output_tokens"):
        load_items(write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "x"}]))


def test_loader_reads_the_sharegpt_pairs() -> None:
    path = data_path("sharegpt", "sharegpt_v3_first_turn_pairs.jsonl.gz")
    items = load_items(path, limit=20)
    with gzip.open(path, "rt") as fh:
        first = json.loads(fh.readline())
    assert len(items) == 20
    assert (items[0].prompt, items[0].prompt_tokens, items[0].output_tokens) == (
        first["prompt"],
        first["prompt_tokens_cl100k"],
        first["response_tokens_cl100k"],
    )


def test_scores_are_perfect_for_a_perfect_predictor() -> None:
    truth = np.array([10.0, 100.0, 1000.0, 50.0])
    quants = np.stack([truth, truth, truth], axis=1)
    s = score(truth, quants, truth)
    assert s["kendall_tau"] == pytest.approx(1.0) and s["spearman"] == pytest.approx(1.0)
    assert s["mae_log"] == 0.0 and s["coverage_10_90"] == 1.0
    assert s["pinball_10"] == s["pinball_50"] == s["pinball_90"] == 0.0


@pytest.mark.heavy
def test_semantic_replay_beats_length_buckets_when_meaning_decides_length(clustered: Path) -> None:
    items = load_items(clustered)
    report = evaluate(items, history=40, embedder=real_embedder())
    assert report["n"] == len(items) - 40
    assert report["kendall_tau"] > report["baseline_length_bucket_tau"] + 0.3
    assert report["mae_log"] < report["baseline_length_bucket_mae_log"]
    assert sum(report["paths"].values()) == pytest.approx(1.0)
    assert 0.0 <= report["coverage_10_90"] <= 1.0
    # A second run reads the embeddings back from the cache and gives the same figures.
    again = evaluate(items, history=40, embedder=_Refuse())
    assert again["kendall_tau"] == report["kendall_tau"]


class _Refuse:
    dim = 384

    def embed(self, texts: object) -> np.ndarray:
        raise AssertionError("should have read the cache")


def test_cli_prints_one_json_object(clustered: Path) -> None:
    result = CliRunner().invoke(
        predictor_app,
        [
            "eval",
            "--data",
            str(clustered),
            "--history",
            "40",
            "--limit",
            "80",
            "--json",
            "--runtime",
            "torch",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for key in ("kendall_tau", "spearman", "coverage_10_90", "baseline_length_bucket_tau", "n"):
        assert key in report
    assert report["n"] == 40
    assert report["embed_version"] == EMBED_VERSION
    bad = CliRunner().invoke(predictor_app, ["eval", "--data", str(clustered), "--history", "500"])
    assert bad.exit_code != 0
    odd = CliRunner().invoke(predictor_app, ["eval", "--data", str(clustered), "--window", "100"])
    assert odd.exit_code != 0
    alien = CliRunner().invoke(predictor_app, ["eval", "--data", str(clustered), "--runtime", "tf"])
    assert alien.exit_code != 0 and "onnx, torch or static" in alien.output


def test_cli_history_defaults_to_what_fits_the_data(clustered: Path) -> None:
    """96 items: the default warms on 86 (90%) and scores 10, and says so (not '6000 leaves nothing')."""
    result = CliRunner().invoke(
        predictor_app, ["eval", "--data", str(clustered), "--json", "--runtime", "torch"]
    )
    assert result.exit_code == 0, result.output
    assert "history: the first 86 of 96 items" in result.stderr
    report = json.loads(result.stdout)
    assert report["history"] == 86 and report["n"] == 10


def test_default_history_is_ninety_percent_capped() -> None:
    assert [default_history(n) for n in (1, 10, 96, 6000, 6667, 11128)] == [0, 9, 86, 5400, 6000, 6000]


def test_eval_judges_an_embedder_with_its_own_encoders_prior_and_says_what_is_in_sample(
    clustered: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stock encoder's vectors get the stock prior (not the tuned one the default version names),
    and a score over prompts a shipped part learned from says so."""
    import sagegate.predictor.semantic as semantic
    from sagegate.core.request import prompt_digest
    from sagegate.predictor.embedder import embed_version, flatten_prompt
    from sagegate.predictor.evaluate import format_report

    asked: list[str] = []
    real = semantic.shipped_prior

    def spy(version: str) -> object:
        asked.append(version)
        return real(version)

    monkeypatch.setattr(semantic, "shipped_prior", spy)

    class Stock:
        dim = 384
        version = embed_version(tuned=False)

        def embed(self, texts: list[str]) -> np.ndarray:
            rows = np.random.default_rng(len(texts)).normal(size=(len(texts), 384)).astype(np.float32)
            return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    items = load_items(clustered)
    learned = frozenset({prompt_digest(flatten_prompt(items[-1].prompt))})
    monkeypatch.setattr("sagegate.predictor.learned.learned_prompts", lambda: learned)
    report = evaluate(items, 10, Stock(), use_cache=False)
    assert asked and set(asked) == {Stock.version}
    assert report["scored_learned"] == 1 and "1 of the" in format_report(report)
