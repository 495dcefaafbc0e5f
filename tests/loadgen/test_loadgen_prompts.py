"""Prompt synthesis: exact-length filler, Mooncake shared prefixes, ShareGPT pairing by length bucket."""

from __future__ import annotations

import pytest
from conftest import data_path
from hypothesis import given, settings
from hypothesis import strategies as st

from sagegate.core.request import TraceRequest
from sagegate.core.tokens import count_tokens, encode
from sagegate.loadgen.prompts import (
    BLOCK_TOKENS,
    SharegptPool,
    attach_prompts,
    bucket_of,
    filler_text,
    mooncake_prompt,
)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 16, 100, 511, 512, 513, 1000, 4096, 20_000])
def test_filler_has_exactly_the_asked_token_count(n: int) -> None:
    assert count_tokens(filler_text(n, seed=n)) == n


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**31))
def test_filler_token_count_property(n: int, seed: int) -> None:
    assert count_tokens(filler_text(n, seed=seed)) == n


def test_filler_is_deterministic_and_differs_by_seed_from_the_first_token() -> None:
    assert filler_text(200, seed=5) == filler_text(200, seed=5)
    firsts = {encode(filler_text(200, seed=s))[:4].__repr__() for s in range(50)}
    assert len(firsts) > 45  # distinct requests share no prefix (no accidental prefix-cache hits)


def test_mooncake_equal_hash_ids_give_identical_prefixes() -> None:
    a = mooncake_prompt([11, 12, 13], 1400, seed=0, rid=1)
    b = mooncake_prompt([11, 12, 99, 100], 1900, seed=0, rid=2)
    c = mooncake_prompt([7, 12, 13], 1400, seed=0, rid=3)
    assert count_tokens(a) == 1400 and count_tokens(b) == 1900 and count_tokens(c) == 1400
    ta, tb, tc = encode(a), encode(b), encode(c)
    shared = 2 * BLOCK_TOKENS
    assert ta[:shared] == tb[:shared]
    assert ta[shared : shared + 16] != tb[shared : shared + 16]
    assert ta[:16] != tc[:16]  # different first block: nothing shared, although later ids are equal


def test_mooncake_prompt_pads_past_its_blocks_and_cuts_the_last_one() -> None:
    longer = mooncake_prompt([1], 700, seed=0, rid=4)
    cut = mooncake_prompt([1, 2], 600, seed=0, rid=4)
    assert count_tokens(longer) == 700 and count_tokens(cut) == 600
    assert encode(longer)[:BLOCK_TOKENS] == encode(cut)[:BLOCK_TOKENS]


def test_attach_prompts_modes() -> None:
    reqs = [
        TraceRequest(0.0, 300, 10, rid=0),
        TraceRequest(0.1, 1000, 10, rid=1, hash_ids=(5, 6)),
        TraceRequest(0.2, 5, 10, rid=2, prompt="hello there"),
    ]
    auto = attach_prompts(reqs, "auto", seed=3)
    assert [count_tokens(r.prompt or "") for r in auto[:2]] == [300, 1000]
    assert auto[2].prompt == "hello there"
    filler = attach_prompts(reqs, "filler", seed=3)
    assert filler[2].prompt != "hello there" and count_tokens(filler[2].prompt or "") == 5
    assert attach_prompts(reqs, "none") == reqs
    with pytest.raises(ValueError, match="no prompt text"):
        attach_prompts(reqs, "trace")
    with pytest.raises(ValueError, match="unknown prompt mode"):
        attach_prompts(reqs, "bogus")


def test_sharegpt_pool_draws_from_the_right_bucket_without_early_repeats() -> None:
    prompts = [(f"p{n}-{k}", n) for n in (10, 50, 51, 52, 400, 2000) for k in range(3)]
    pool = SharegptPool(prompts, seed=1)
    drawn = [pool.draw(50) for _ in range(9)]
    assert {n for _, n in drawn} <= {50, 51, 52}
    assert len({t for t, _ in drawn}) == 9  # the whole bucket before any repeat
    assert pool.draw(9)[1] == 10
    assert pool.draw(100_000)[1] == 2000  # beyond every bucket: the nearest one
    again = SharegptPool(prompts, seed=1)
    assert [again.draw(50) for _ in range(9)] == drawn


def test_sharegpt_pairing_on_the_real_pairs() -> None:
    path = data_path("sharegpt", "sharegpt_v3_first_turn_pairs.jsonl.gz")
    targets = [8, 30, 120, 500, 900, 2000]
    reqs = [TraceRequest(float(i), t, 20, rid=i) for i, t in enumerate(targets * 5)]
    out = attach_prompts(reqs, "sharegpt", seed=0, sharegpt=path)
    for want, got in zip(reqs, out, strict=True):
        assert got.prompt is not None and count_tokens(got.prompt) == got.prompt_tokens
        assert bucket_of(got.prompt_tokens) == bucket_of(want.prompt_tokens)
        assert got.output_tokens == want.output_tokens
    assert len({r.prompt for r in out}) == len(out)
    print(
        "targets -> drawn prompt lengths:",
        [(w.prompt_tokens, g.prompt_tokens) for w, g in zip(reqs, out, strict=True)][:6],
    )
