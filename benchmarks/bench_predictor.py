"""Latency and memory of the semantic predictor on this machine.

Prints: embedding and end-to-end ``apredict`` latency (p50/p99) for a ~200-token prompt, the same under
concurrency (micro-batching), the hnswlib query and the full hybrid search at ``--entries`` history
entries (random unit vectors, Zipf-distributed hashed terms of ShareGPT-like counts), the resident memory
those entries add beyond the model, and optionally the replica-to-replica propagation delay through Redis.

    .venv/bin/python -m benchmarks bench_predictor [--entries 100000] [--redis redis://127.0.0.1:6379/0]
        [--window 64] [--quantize/--no-quantize] [--compare 256:fp32,128:int8]

``--compare`` also times each listed embedder configuration (``window:fp32|int8``) on the same index,
interleaved round by round so that a noisy, shared machine weighs on every configuration alike; it
prints wall-clock and thread-CPU time of one embedding and wall-clock of ``apredict``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import math
import statistics
import time
import uuid
from collections.abc import Callable

import numpy as np

from sagegate.core.request import PredictionQuery
from sagegate.predictor.embed_queue import BatchingEmbedder
from sagegate.predictor.embedder import DEFAULT_QUANTIZE, DEFAULT_WINDOW, MiniLMEmbedder
from sagegate.predictor.history import Completion, WindowBounds
from sagegate.predictor.index import IndexConfig
from sagegate.predictor.lexical import extract_terms
from sagegate.predictor.memory_store import MemoryStore
from sagegate.predictor.semantic import SemanticConfig, SemanticPredictor
from sagegate.predictor.semantic_face import SemanticLengthPredictor

PROMPT = (
    "I am preparing a short training session for new support engineers at a company that sells "
    "accounting software to small businesses. The session should explain how to triage incoming tickets, "
    "how to reproduce a customer's problem on a test account, when to escalate to the product team, and "
    "how to write a clear reply that a non-technical customer can follow. Please write an outline for a "
    "ninety-minute session with timings for each part, two hands-on exercises based on realistic tickets "
    "(one about a failed bank import and one about a wrong tax rate on invoices), and a checklist the "
    "engineers can keep next to their screen. Keep the tone friendly and practical, avoid jargon where "
    "possible, and suggest how to measure whether the session worked after a month, for example with "
    "ticket reopen rates or customer satisfaction scores."
)


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def trim_heap() -> None:
    """Give freed heap pages back to the OS (glibc), so RSS shows live data, not allocator slack."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def memory_parts(pred: SemanticPredictor) -> dict[str, float]:
    """The big live structures, in MB (Python object overhead not included)."""
    mb = 1 / 2**20
    out: dict[str, float] = {}
    for model, shard in pred._shards.items():
        idx = shard.index
        lex = idx.lexical
        blk = lex.block
        out[f"{model}: hnswlib graph + vectors"] = idx._hnsw.index_file_size() * mb
        out[f"{model}: int8 vectors + row metadata"] = mb * sum(
            a.nbytes for a in (idx.q8, idx.q8_scale, idx.out_tokens, idx.prompt_tokens, idx.ts)
        )
        out[f"{model}: lexical postings"] = mb * sum(
            a.nbytes for a in (blk.terms, blk.ptr, blk.rows, blk.weights, lex.in_block, lex.version)
        )
    out["document frequencies (shared)"] = mb * (pred._docfreq.df.nbytes + pred._docfreq.at.nbytes)
    return out


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q))


def timed(fn: Callable[[], object], n: int, warm: int = 3) -> list[float]:
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(1000 * (time.perf_counter() - t))
    return out


def line(name: str, ms: list[float]) -> None:
    print(f"{name:<44} p50 {pct(ms, 50):8.3f} ms   p99 {pct(ms, 99):8.3f} ms   (n={len(ms)})")


def synthetic_history(n: int, seed: int = 0) -> list[Completion]:
    """Random unit vectors; prompts of Zipf-distributed words (the benchmark prompt's words among 20k
    made-up ones), with ShareGPT-like lengths (median ~40 words, long tail), hashed as real prompts are."""
    rng = np.random.default_rng(seed)
    vecs = rng.standard_normal((n, 384)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    vocab = np.array(sorted(set(PROMPT.lower().split())) + [f"w{i}" for i in range(20_000)])
    rng.shuffle(vocab)
    n_words = np.minimum(np.rint(np.exp(rng.normal(math.log(40), 1.1, n))), 1200).astype(int) + 1
    out = []
    for i in range(n):
        words = vocab[np.minimum(rng.zipf(1.2, n_words[i]) - 1, vocab.size - 1)]
        terms, counts = extract_terms(" ".join(words))
        out.append(
            Completion(
                f"s{seed}-{i}",
                "default",
                vecs[i],
                int(n_words[i] * 1.3),
                int(rng.lognormal(5.3, 1.0)) + 1,
                0.0,
                terms=terms,
                counts=counts,
            )
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--redis", default=None, help="measure propagation between two replicas via this URL")
    ap.add_argument(
        "--quantize",
        action=argparse.BooleanOptionalAction,
        default=DEFAULT_QUANTIZE,
        help="int8 dynamic quantisation of the model",
    )
    ap.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="word pieces the model reads")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--compare", default="", help="embedder configs to time side by side: 256:fp32,128:int8")
    args = ap.parse_args()

    emb = MiniLMEmbedder(quantize=args.quantize, threads=args.threads, window=args.window)
    t = time.perf_counter()
    emb.load()
    print(
        f"{emb.version}: model load {time.perf_counter() - t:.1f} s; prompt "
        f"{len(emb.tokenizer(PROMPT)['input_ids'])} word pieces, {len(emb.tokenizer(emb.fit_text(PROMPT))['input_ids'])} read"
    )
    line("embed one prompt (direct)", timed(lambda: emb.embed([PROMPT]), args.runs))

    gc.collect()
    base_rss = rss_mb()
    bounds = WindowBounds(max_entries=args.entries + 10, max_age_s=math.inf)
    # The probe is refitted once, timed, below (not every tenth of the window while filling).
    cfg = SemanticConfig(bounds=bounds, index=IndexConfig(background=False), probe_refit_every=10**9)
    pred = SemanticPredictor(emb, store=MemoryStore(bounds, retain=False), config=cfg, clock=lambda: 1.0)
    pred.start()
    t = time.perf_counter()
    chunk = 10_000
    for start in range(0, args.entries, chunk):
        pred.ingest(synthetic_history(min(chunk, args.entries - start), seed=start))
    build_s = time.perf_counter() - t
    shard = pred._shards["default"]
    shard.index.lexical.rebuild()
    gc.collect()
    trim_heap()
    print(
        f"indexed {pred.size()} entries in {build_s:.0f} s; resident memory added "
        f"{rss_mb() - base_rss:.0f} MB (model and runtime excluded)"
    )
    for part, mb in memory_parts(pred).items():
        print(f"  {part:<40} {mb:8.1f} MB")

    t = time.perf_counter()
    shard._refit()
    print(
        f"linear probe refit over {shard.probe.fitted_on} entries: {time.perf_counter() - t:.2f} s (background)"
    )

    rng = np.random.default_rng(1)
    queries = rng.standard_normal((args.runs + 3, 384)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    it = iter(range(10**9))
    line(
        f"hnswlib query k=100 at {pred.size()}",
        timed(lambda: shard.index.dense(queries[next(it) % len(queries)], 100), args.runs),
    )
    feats = pred.features(PROMPT)
    terms = feats.terms
    with pred._df_lock:
        qw = pred._docfreq.weigh(terms, feats.counts)
    line("lexical query k=100", timed(lambda: shard.index.lexical.query(terms, qw, 100), args.runs))
    line(
        "hybrid search (dense + lexical + scoring)",
        timed(lambda: shard.index.search(feats.embedding, terms, qw, 100, 100), args.runs),
    )
    line(
        "predict_features (search + distribution)",
        timed(lambda: pred.predict_features(feats, 200), args.runs),
    )

    face = SemanticLengthPredictor(pred, budget_s=10.0)  # the gateway's path, never late here

    async def sequential() -> list[float]:
        out = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            await face.predict(fresh_query())
            out.append(1000 * (time.perf_counter() - t0))
        return out

    line("apredict end to end, one at a time", asyncio.run(sequential())[3:])

    async def concurrent(c: int) -> tuple[list[float], float]:
        lat: list[float] = []

        async def one() -> None:
            t0 = time.perf_counter()
            await face.predict(fresh_query())
            lat.append(1000 * (time.perf_counter() - t0))

        t0 = time.perf_counter()
        for _ in range(max(1, args.runs // c)):
            await asyncio.gather(*(one() for _ in range(c)))
        return lat, len(lat) / (time.perf_counter() - t0)

    for c in (4, 16):
        b0, i0 = pred.embedder.batches, pred.embedder.items
        lat, rps = asyncio.run(concurrent(c))
        per_batch = (pred.embedder.items - i0) / max(1, pred.embedder.batches - b0)
        line(f"apredict, {c} concurrent ({rps:.0f}/s, {per_batch:.1f}/batch)", lat)
    if args.compare:
        compare(pred, [parse_config(c, args.threads) for c in args.compare.split(",")], args.runs)
    pred.close()

    if args.redis:
        propagation(args.redis, emb)


_asked = itertools.count()


def fresh_query() -> PredictionQuery:
    """``PROMPT`` made a new text each time: the predictor answers an exact repeat from the features it
    kept, which would time no embedding at all."""
    n = next(_asked)
    return PredictionQuery(n, 200, f"{PROMPT} (#{n})")


def parse_config(text: str, threads: int) -> MiniLMEmbedder:
    window, _, precision = text.strip().partition(":")
    if precision not in ("fp32", "int8"):
        raise SystemExit(f"--compare: {text!r} is not window:fp32 or window:int8")
    return MiniLMEmbedder(window=int(window), quantize=precision == "int8", threads=threads)


def compare(pred: SemanticPredictor, embedders: list[MiniLMEmbedder], runs: int, per_round: int = 5) -> None:
    """Embedding (wall and thread CPU) and ``apredict`` latency of each embedder on ``pred``'s index,
    ``per_round`` calls of each in turn until ``runs`` calls each."""
    wall: dict[str, list[float]] = {e.version: [] for e in embedders}
    cpu: dict[str, list[float]] = {e.version: [] for e in embedders}
    e2e: dict[str, list[float]] = {e.version: [] for e in embedders}
    batchers = {e.version: BatchingEmbedder(e.load()) for e in embedders}
    for e in embedders:
        timed(lambda e=e: e.embed([PROMPT]), 0, warm=5)

    face = SemanticLengthPredictor(pred, budget_s=10.0)  # the gateway's path, never late here

    async def apredict_ms() -> float:
        t0 = time.perf_counter()
        await face.predict(fresh_query())
        return 1000 * (time.perf_counter() - t0)

    own = pred.embedder
    try:
        for _ in range(max(1, runs // per_round)):
            for e in embedders:
                for _ in range(per_round):
                    t0, c0 = time.perf_counter(), time.thread_time()
                    e.embed([PROMPT])
                    cpu[e.version].append(1000 * (time.thread_time() - c0))
                    wall[e.version].append(1000 * (time.perf_counter() - t0))
                pred.embedder = batchers[e.version]
                asyncio.run(apredict_ms())  # the worker thread's first call sets its torch threads
                e2e[e.version] += [asyncio.run(apredict_ms()) for _ in range(per_round)]
    finally:
        pred.embedder = own
        for b in batchers.values():
            b.close()
    print(f"side by side, {per_round} calls of each in turn ({len(e2e[embedders[0].version])} each):")
    print(f"  {'embedder':<40} {'embed p50/p99 ms':>18} {'embed cpu p50':>14} {'apredict p50/p99 ms':>20}")
    for v in wall:
        print(
            f"  {v:<40} {pct(wall[v], 50):8.1f} /{pct(wall[v], 99):7.1f} {pct(cpu[v], 50):14.1f} "
            f"{pct(e2e[v], 50):10.1f} /{pct(e2e[v], 99):7.1f}"
        )


def propagation(url: str, emb: MiniLMEmbedder) -> None:
    from sagegate.predictor.redis_store import RedisStore

    prefix = f"sagegate-bench:{uuid.uuid4().hex}"
    cfg = SemanticConfig(index=IndexConfig(background=False))
    a = SemanticPredictor(emb, store=RedisStore(url, prefix=prefix), config=cfg).start()
    b = SemanticPredictor(emb, store=RedisStore(url, prefix=prefix), config=cfg).start()
    feats = a.features(PROMPT)
    delays = []
    for i in range(50):
        t0 = time.perf_counter()
        a.record_features(feats, 200, 100 + i)
        while b.size() < i + 1 and time.perf_counter() - t0 < 5:
            time.sleep(0.0005)
        delays.append(1000 * (time.perf_counter() - t0))
    line("replica-to-replica propagation via Redis", delays)
    print(f"  median {statistics.median(delays):.1f} ms")
    a.close()
    b.close()
    import redis

    r = redis.Redis.from_url(url)
    r.delete(f"{prefix}:stream", f"{prefix}:epoch")


if __name__ == "__main__":
    main()
