"""Prompt text for traces that carry only lengths, so a replay sends what the trace describes.

Three sources, all deterministic for a seed:

* **filler** — space-led three-letter words that are each one token of the offline tokenizer
  (``core.tokens``: cl100k, or its 4-characters-per-token fallback), so ``n`` words are exactly ``n``
  tokens and distinct requests differ from their first token (no accidental prefix sharing);
* **Mooncake blocks** — a request with ``hash_ids`` gets one 512-token filler block per id, drawn
  from the id alone, so equal ids give equal text and shared prefixes survive into the prompt;
* **ShareGPT** — a real first-turn prompt whose length falls in the same length bucket as the
  trace's prompt. The request then carries the real prompt's token count but keeps the trace's output
  length, which has nothing to do with the text: a predictor reading the text cannot be judged on it;
* **paired** — the trace keeps only its arrival times (and tenants); each request becomes a real
  ShareGPT pair drawn in a seeded shuffle, *with its response's length* as the output, each pair once
  while the pool lasts: the text and the output it is judged against belong together, and the mix is
  ShareGPT's own at any load. Use this to measure a text-reading predictor.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from sagegate.core.request import TraceRequest, prompt_digest

BLOCK_TOKENS = 512  # Mooncake: one hash id per 512 prompt tokens
BUCKET_RATIO = 1.25  # ShareGPT buckets: prompt lengths within a factor 1.25
PROMPT_MODES = ("auto", "filler", "sharegpt", "paired", "trace", "none")
"""``auto``: the trace's text, else filler; ``filler``: always filler; ``sharegpt``: the trace's text,
else Mooncake blocks for requests with ``hash_ids``, else a ShareGPT prompt (the trace's output kept);
``paired``: every request a ShareGPT pair, prompt and output length (see :func:`pairs_on_arrivals`);
``trace``: the trace's text, an error when a request has none; ``none``: leave the requests as they
are."""

_WORDS = (
    "the and for you not are but can all one out day get has him his how man new now old see two way "
    "who boy did its let put say she too use act add age ago air arm art ask bad bag bed big bit box "
    "bus buy car cat cup cut dog dry ear eat egg end eye far fat few fit fly fun gas god gun guy hat "
    "hit hot ice job key kid lab law lay leg lie lot low map mix net oil own pay pen pet pop raw red "
    "rid row run sad sea set sit six sky son sun tax tea ten tie tip top toy try war wet win yes yet zoo"
)


@lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
    """The filler words (each with its leading space) that the offline tokenizer counts as one token."""
    from sagegate.core.tokens import count_tokens

    words = tuple(" " + w for w in _WORDS.split() if count_tokens(" " + w) == 1 and len(w) == 3)
    if len(words) < 16:  # pragma: no cover - a tokenizer that splits common words
        raise RuntimeError("the offline tokenizer splits the filler words; filler text is unavailable")
    return words


def _words(n: int, rng: np.random.Generator) -> str:
    vocab = vocabulary()
    return "".join(vocab[i] for i in rng.integers(0, len(vocab), n))


def filler_text(n_tokens: int, *, seed: int = 0) -> str:
    """Text of exactly ``n_tokens`` tokens (offline tokenizer); different seeds differ from the start."""
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    return _words(n_tokens, np.random.default_rng([seed, 0x5EED]))


@lru_cache(maxsize=4096)
def block_text(hash_id: int, *, seed: int = 0) -> str:
    """The 512-token block named by a Mooncake hash id: a function of the id (and seed) only."""
    return _words(BLOCK_TOKENS, np.random.default_rng([seed, 0xB10C, hash_id & 0xFFFFFFFFFFFF]))


def mooncake_prompt(hash_ids: Sequence[int], prompt_tokens: int, *, seed: int = 0, rid: int = 0) -> str:
    """Exactly ``prompt_tokens`` tokens: the blocks of ``hash_ids`` in order (the last one cut to fit),
    then per-request filler if the ids cover fewer tokens than the prompt has."""
    parts: list[str] = []
    left = prompt_tokens
    for h in hash_ids:
        if left <= 0:
            break
        text = block_text(int(h), seed=seed)
        if left < BLOCK_TOKENS:
            text = text[: 4 * left]  # every filler word is four characters and one token
        parts.append(text)
        left -= min(left, BLOCK_TOKENS)
    if left > 0:
        parts.append(filler_text(left, seed=_mix(seed, rid)))
    return "".join(parts)


def _mix(seed: int, rid: int) -> int:
    return (seed * 1_000_003 + rid) & 0x7FFFFFFFFFFFFFFF


def bucket_of(tokens: int) -> int:
    """Length bucket of a prompt: ``floor(log_1.25(tokens))`` (so a bucket spans a factor 1.25)."""
    return math.floor(math.log(max(tokens, 1)) / math.log(BUCKET_RATIO))


@dataclass
class SharegptPool:
    """Real prompts grouped by length bucket, handed out without replacement (each bucket cycles
    through a seeded shuffle), falling back to the nearest non-empty bucket."""

    prompts: list[tuple[str, int]]
    seed: int = 0
    _buckets: dict[int, deque[int]] = field(default_factory=dict, repr=False)
    _keys: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("the ShareGPT pool is empty")
        rng = np.random.default_rng([self.seed, 0x5A4E])
        groups: dict[int, list[int]] = {}
        for i, (_, n) in enumerate(self.prompts):
            groups.setdefault(bucket_of(n), []).append(i)
        for b in sorted(groups):
            idx = groups[b]
            self._buckets[b] = deque(idx[j] for j in rng.permutation(len(idx)))
        self._keys = np.array(sorted(self._buckets), dtype=np.int64)

    @classmethod
    def load(cls, path: str | Path, *, seed: int = 0) -> SharegptPool:
        return cls(list(_load_pairs(str(path))), seed=seed)

    def nearest_bucket(self, tokens: int) -> int:
        b = bucket_of(tokens)
        k = self._keys
        return int(k[np.argmin(np.abs(k - b) * 2 + (k < b))])  # ties go to the longer bucket

    def draw(self, tokens: int) -> tuple[str, int]:
        """A prompt (text, token count) from the bucket of ``tokens`` (or the nearest one)."""
        queue = self._buckets[self.nearest_bucket(tokens)]
        i = queue.popleft()
        queue.append(i)
        return self.prompts[i]


@lru_cache(maxsize=2)
def _load_pairs(path: str) -> tuple[tuple[str, int], ...]:
    from sagegate.loadgen.readers import read_trace

    reqs = read_trace(path, "sharegpt", rate=1.0)
    return tuple((r.prompt or "", r.prompt_tokens) for r in reqs)


@lru_cache(maxsize=2)
def unique_pairs(path: str, exclude: frozenset[int] = frozenset()) -> tuple[TraceRequest, ...]:
    """The pairs file's (prompt, response length) pairs, first occurrence of each prompt text only,
    leaving out prompts whose :func:`core.request.prompt_digest` is in ``exclude`` (those a shipped
    prior was fitted on: a replay must not judge a predictor on what it learned from)."""
    from sagegate.loadgen.readers import read_trace

    seen: set[str] = set()
    out = []
    for r in read_trace(path, "sharegpt", rate=1.0):
        text = r.prompt or ""
        if exclude and prompt_digest(text) in exclude:
            continue
        if text.strip() and text not in seen:
            seen.add(text)
            out.append(r)
    return tuple(out)


def pair_requests(
    rows: Sequence[TraceRequest], pool: Sequence[TraceRequest], seed: int
) -> list[TraceRequest]:
    """``rows`` (arrivals, tenants, ids kept) each carrying a pair from the bucket of its prompt length:
    the pair's prompt text, prompt length *and response length*, so the output a prediction is judged
    against is the one that answers that prompt.

    Each bucket hands its pairs out in a seeded shuffle and starts over when spent, so a pair can
    recur in a long trace (the study's text source; :func:`pairs_on_arrivals` uses each pair once).
    """
    # the pool hands out keys (indices as text), so the pair's response length comes along
    keys = SharegptPool([(str(i), p.prompt_tokens) for i, p in enumerate(pool)], seed=seed)
    out = []
    for r in rows:
        key, _ = keys.draw(r.prompt_tokens)
        p = pool[int(key)]
        out.append(
            replace(
                r,
                prompt=p.prompt,
                prompt_tokens=p.prompt_tokens,
                output_tokens=p.output_tokens,
                extra={"sharegpt_id": p.extra.get("id"), "trace_prompt_tokens": r.prompt_tokens},
            )
        )
    return out


def pairs_on_arrivals(
    rows: Sequence[TraceRequest], pool: Sequence[TraceRequest], seed: int
) -> list[TraceRequest]:
    """``rows``' arrivals (ids, tenants, deadlines kept), request ``i`` carrying pair ``i`` of a seeded
    shuffle of ``pool``: its prompt, prompt length and response length. No pair recurs until the pool
    is spent (then the shuffle starts over: ``extra["repeat"]`` counts the round)."""
    if not pool:
        raise ValueError("the pairs pool is empty")
    order = np.random.default_rng([seed, 0x9A17]).permutation(len(pool))
    out = []
    for i, r in enumerate(rows):
        p = pool[int(order[i % len(pool)])]
        out.append(
            replace(
                r,
                prompt=p.prompt,
                prompt_tokens=p.prompt_tokens,
                output_tokens=p.output_tokens,
                hash_ids=None,
                extra={"sharegpt_id": p.extra.get("id"), "repeat": i // len(pool)},
            )
        )
    return out


def default_sharegpt_path() -> Path:
    """The ShareGPT pairs under the shared data root (see ``loadgen.data``)."""
    from sagegate.loadgen.data import SHAREGPT, data_file

    return data_file(*SHAREGPT)


def attach_prompts(
    requests: Sequence[TraceRequest],
    mode: str = "auto",
    *,
    seed: int = 0,
    sharegpt: SharegptPool | str | Path | None = None,
    exclude_prompts: frozenset[int] = frozenset(),
) -> list[TraceRequest]:
    """``requests`` with prompt text (see :data:`PROMPT_MODES`); ``prompt_tokens`` follows the text.
    ``exclude_prompts``: prompt digests the ``paired`` mode leaves out (:func:`unique_pairs`).

    Filler and Mooncake prompts have exactly the trace's prompt length; a ShareGPT prompt brings its
    own length, from the trace's bucket. ``sharegpt`` is a pool or the pairs file (default: the
    shared data folder's).
    """
    if mode not in PROMPT_MODES:
        raise ValueError(f"unknown prompt mode {mode!r}; expected one of {PROMPT_MODES}")
    if mode == "none":
        return list(requests)
    if mode == "paired":
        path = Path(sharegpt) if isinstance(sharegpt, str | Path) else default_sharegpt_path()
        if not path.is_file():
            raise FileNotFoundError(f"ShareGPT pairs not found: {path} (pass --sharegpt PATH)")
        return pairs_on_arrivals(requests, unique_pairs(str(path), exclude_prompts), seed)
    pool: SharegptPool | None = None
    if mode == "sharegpt" and any(r.prompt is None and not r.hash_ids for r in requests):
        if isinstance(sharegpt, SharegptPool):
            pool = sharegpt
        else:
            path = Path(sharegpt) if sharegpt is not None else default_sharegpt_path()
            if not path.is_file():
                raise FileNotFoundError(f"ShareGPT pairs not found: {path} (pass --sharegpt PATH)")
            pool = SharegptPool.load(path, seed=seed)
    out = []
    for r in requests:
        if r.prompt is not None and mode != "filler":
            out.append(r)
        elif mode == "trace":
            raise ValueError(f"request {r.rid} has no prompt text in the trace (use --prompts auto)")
        elif r.hash_ids:
            text = mooncake_prompt(r.hash_ids, r.prompt_tokens, seed=seed, rid=r.rid)
            out.append(replace(r, prompt=text))
        elif pool is not None:
            text, n = pool.draw(r.prompt_tokens)
            out.append(replace(r, prompt=text, prompt_tokens=n))
        else:
            out.append(replace(r, prompt=filler_text(r.prompt_tokens, seed=_mix(seed, r.rid))))
    return out
