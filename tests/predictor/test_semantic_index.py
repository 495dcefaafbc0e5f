"""The window index (hnswlib + lexical), the record wire format and the in-process store, on synthetic
vectors: no model needed."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sagegate.core.distribution import DEFAULT_PRIOR, LengthDistribution
from sagegate.predictor.history import Completion, WindowBounds
from sagegate.predictor.index import IndexConfig, WindowIndex
from sagegate.predictor.lexical import MAX_DELTA_ROWS, DocFreq, LexicalIndex, extract_terms
from sagegate.predictor.memory_store import MemoryStore
from sagegate.predictor.priors import WindowPriors

DIM = 384


def unit(rng: np.random.Generator, n: int = 1) -> np.ndarray:
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def rec(
    i: int, vec: np.ndarray, out: int = 100, ts: float = 0.0, model: str = "m", text: str = ""
) -> Completion:
    terms, counts = extract_terms(text or f"prompt number {i}")
    return Completion(f"r{i}", model, vec, 10 + i % 50, out, ts, terms=terms, counts=counts)


def weights_of(c: Completion, df: DocFreq) -> np.ndarray:
    df.add(c.terms)
    return df.weigh(c.terms, c.counts)


def test_completion_round_trips_through_stream_fields() -> None:
    rng = np.random.default_rng(0)
    c = rec(7, unit(rng)[0], out=321, ts=12.5, text="Write a poem about the sea, the sea!")
    raw = {k.encode(): (v if isinstance(v, bytes) else str(v).encode()) for k, v in c.to_fields().items()}
    back = Completion.from_fields(raw)
    assert (back.id, back.model, back.prompt_tokens, back.output_tokens, back.ts) == (
        c.id,
        c.model,
        c.prompt_tokens,
        c.output_tokens,
        c.ts,
    )
    assert np.array_equal(back.embedding, c.embedding)
    assert np.array_equal(back.terms, c.terms) and np.array_equal(back.counts, c.counts)


def test_index_finds_exact_vectors_and_grows_past_its_capacity() -> None:
    rng = np.random.default_rng(1)
    cfg = IndexConfig(initial_capacity=64, background=False)
    idx = WindowIndex(WindowBounds(10_000, math.inf), cfg)
    df = DocFreq()
    vecs = unit(rng, 300)
    for i, v in enumerate(vecs):
        c = rec(i, v)
        assert idx.add(c, weights_of(c, df), now=0.0)
    assert len(idx) == 300 and idx.capacity >= 300
    for i in (0, 150, 299):
        rows, sims = idx.dense(vecs[i], 1)
        assert sims[0] > 0.999
        assert idx.out_tokens[rows[0]] == 100


def test_duplicate_ids_are_indexed_once() -> None:
    rng = np.random.default_rng(2)
    idx = WindowIndex(WindowBounds(100, math.inf), IndexConfig(background=False))
    df = DocFreq()
    c = rec(1, unit(rng)[0])
    assert idx.add(c, weights_of(c, df), 0.0)
    assert not idx.add(c, weights_of(c, df), 0.0)
    assert len(idx) == 1


def test_count_bound_expires_oldest_and_reuses_rows() -> None:
    rng = np.random.default_rng(3)
    idx = WindowIndex(WindowBounds(50, math.inf), IndexConfig(initial_capacity=64, background=False))
    df = DocFreq()
    vecs = unit(rng, 200)
    for i, v in enumerate(vecs):
        c = rec(i, v, out=1 + i)
        idx.add(c, weights_of(c, df), 0.0)
    assert len(idx) == 50
    assert "r149" not in idx and "r150" in idx
    assert idx.capacity <= 128  # rows were reused, memory follows the window
    rows, _ = idx.dense(vecs[10], 50)
    assert set(idx.out_tokens[rows].tolist()) <= set(range(151, 201))


def test_age_bound_and_graph_rebuild_after_mass_expiry() -> None:
    rng = np.random.default_rng(4)
    cfg = IndexConfig(initial_capacity=64, rebuild_min_deleted=16, background=False)
    idx = WindowIndex(WindowBounds(10_000, 100.0), cfg)
    df = DocFreq()
    old = unit(rng, 120)
    for i, v in enumerate(old):
        c = rec(i, v, out=5, ts=0.0)
        idx.add(c, weights_of(c, df), now=0.0)
    assert idx.expire(now=150.0) == 120
    assert len(idx) == 0 and idx.rebuilds >= 1
    new = unit(rng, 30)
    for i, v in enumerate(new):
        c = rec(1000 + i, v, out=77, ts=150.0)
        idx.add(c, weights_of(c, df), now=150.0)
    for v in new[:5]:
        rows, sims = idx.dense(v, 5)
        assert sims[0] > 0.999 and set(idx.out_tokens[rows].tolist()) == {77}
    # A record already older than the window is not indexed at all.
    stale = rec(5000, unit(rng)[0], ts=10.0)
    assert not idx.add(stale, weights_of(stale, df), now=150.0)


def test_background_graph_rebuild_keeps_concurrent_changes() -> None:
    rng = np.random.default_rng(5)
    cfg = IndexConfig(initial_capacity=64, rebuild_min_deleted=32, background=True)
    idx = WindowIndex(WindowBounds(40, math.inf), cfg)
    df = DocFreq()
    vecs = unit(rng, 400)
    for i, v in enumerate(vecs):
        c = rec(i, v, out=i + 1)
        idx.add(c, weights_of(c, df), 0.0)
    idx.wait_rebuilds()
    assert len(idx) == 40
    for i in range(360, 400):
        rows, sims = idx.dense(vecs[i], 1)
        assert sims[0] > 0.999 and idx.out_tokens[rows[0]] == i + 1


def test_lexical_matches_survive_rebuilds_removals_and_row_reuse() -> None:
    docs = [
        "translate this sentence into french please",
        "write a long essay about the history of france",
        "what is the capital of france",
        "write python code to sort a list",
        "sort this list of numbers in python",
    ] * 3
    df = DocFreq()
    lex = LexicalIndex()
    for row, text in enumerate(docs):
        t, c = extract_terms(text)
        df.add(t)
        lex.add(row, t, df.weigh(t, c))
    qt, qc = extract_terms("please translate into french")
    qw = df.weigh(qt, qc)
    _, scores_a = lex.query(qt, qw, 5)
    lex.rebuild()
    assert not lex.delta and len(lex) == len(docs)
    rows_b, scores_b = lex.query(qt, qw, 5)
    assert np.allclose(np.sort(scores_a), np.sort(scores_b), atol=1e-3)  # float16 postings
    best = int(rows_b[0])
    assert docs[best].startswith("translate")
    lex.remove(best)
    assert best not in lex.query(qt, qw, 20)[0].tolist()
    t, c = extract_terms("sort numbers")  # the row is reused for an unrelated prompt
    lex.add(best, t, df.weigh(t, c))
    assert best not in lex.query(qt, qw, 20)[0].tolist()
    lex.rebuild()
    assert best not in lex.query(qt, qw, 20)[0].tolist() and len(lex) == len(docs)


def test_the_brute_force_delta_stays_bounded_however_large_the_window() -> None:
    """Every query scans the delta: it is rebuilt at a fixed size, not at a share of the window
    (a tenth of a 100k window cost each query several milliseconds)."""
    df = DocFreq()
    lex = LexicalIndex()
    largest = 0
    for row in range(3 * MAX_DELTA_ROWS * 10):
        t, c = extract_terms(f"prompt number {row} about topic {row % 97} and {row % 13}")
        df.add(t)
        lex.add(row, t, df.weigh(t, c))
        largest = max(largest, len(lex.delta))
        if lex.needs_rebuild():
            lex.rebuild()
    assert len(lex) == 3 * MAX_DELTA_ROWS * 10
    assert largest == MAX_DELTA_ROWS + 1


def test_install_keeps_changes_made_after_the_snapshot() -> None:
    df = DocFreq()
    lex = LexicalIndex()
    texts = [f"alpha beta gamma number{i}" for i in range(10)]
    for row, text in enumerate(texts):
        t, c = extract_terms(text)
        df.add(t)
        lex.add(row, t, df.weigh(t, c))
    snap = lex.snapshot()
    block = LexicalIndex.build(snap)
    lex.remove(3)  # changes while the block is being built
    t, c = extract_terms("delta epsilon")
    lex.add(4, t, df.weigh(t, c))
    lex.install(snap, block)
    qt, qc = extract_terms("alpha beta")
    rows = lex.query(qt, qc.astype(np.float32), 20)[0].tolist()
    assert 3 not in rows and 4 not in rows and len(rows) == 8
    qt, qc = extract_terms("delta epsilon")
    assert lex.query(qt, qc.astype(np.float32), 20)[0].tolist() == [4]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.text(alphabet="abcde fgh", min_size=0, max_size=40), min_size=1, max_size=25),
    st.integers(0, 30),
)
def test_lexical_query_equals_brute_force_cosine(texts: list[str], rebuild_at: int) -> None:
    df = DocFreq()
    lex = LexicalIndex()
    vecs = []
    for row, text in enumerate(texts):
        t, c = extract_terms(text)
        df.add(t)
        w = df.weigh(t, c)
        lex.add(row, t, w)
        vecs.append(dict(zip(t.tolist(), w.tolist(), strict=True)))
        if row == rebuild_at:
            lex.rebuild()
    qt, qc = extract_terms(texts[0] + " abc")
    qw = df.weigh(qt, qc)
    q = dict(zip(qt.tolist(), qw.tolist(), strict=True))
    rows, scores = lex.match(qt, qw)
    got = dict(zip(rows.tolist(), scores.tolist(), strict=True))
    for row, v in enumerate(vecs):
        expect = sum(q[t] * w for t, w in v.items() if t in q)
        assert math.isclose(got.get(row, 0.0), expect, rel_tol=2e-3, abs_tol=2e-3)


def test_memory_store_keeps_the_window_per_model() -> None:
    rng = np.random.default_rng(6)
    now = [1000.0]
    store = MemoryStore(WindowBounds(3, 100.0), clock=lambda: now[0])
    for i in range(5):
        store.append(rec(i, unit(rng)[0], ts=1000.0, model="a"))
    store.append(rec(9, unit(rng)[0], ts=950.0, model="b"))
    assert len(store) == 4
    assert [r.id for r in store.start(lambda recs: None) if r.model == "a"] == ["r2", "r3", "r4"]
    now[0] = 1060.0
    assert {r.model for r in store.start(lambda recs: None)} == {"a"}


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 5000), st.integers(1, 3000)), min_size=0, max_size=300),
    st.integers(1, 120),
    st.integers(1, 5000),
)
def test_window_priors_match_a_brute_force_window(
    events: list[tuple[int, int]], max_entries: int, query_tokens: int
) -> None:
    bounds = WindowBounds(max_entries, max_age_s=50.0)
    priors = WindowPriors(bounds, per_bucket=20, global_window=40, min_samples=4)
    log: list[tuple[float, int, int]] = []
    for t, (pt, ot) in enumerate(events):
        priors.add(float(t), pt, ot, now=float(t))
        log.append((float(t), pt, ot))
    now = float(len(events))
    priors.expire(now)
    live = [e for e in log[-max_entries:] if e[0] >= now - 50.0]
    assert len(priors) == len(live)
    bucket = [ot for _, pt, ot in live if pt.bit_length() == query_tokens.bit_length()][-20:]
    dist, path = priors.prior(query_tokens)
    if len(bucket) >= 4:
        expect, want = LengthDistribution.from_samples(bucket, max_points=32), "bucket"
    elif len(live) >= 4:
        expect, want = LengthDistribution.from_samples([ot for *_, ot in live][-40:], max_points=32), "global"
    else:
        expect, want = DEFAULT_PRIOR, "cold"
    assert path == want and dist.support == expect.support
    assert np.allclose(dist.probs, expect.probs)
