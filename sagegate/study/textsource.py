"""A source with prompt text: a trace's arrival times carrying real ShareGPT requests, paired by length.

The traces the study has (Azure 2023, Bailian) carry token counts only, so the ``semantic`` predictor
has nothing to read there. This source keeps a trace's arrival process and replaces each request by a
real ShareGPT first-turn pair drawn from the length bucket of the trace's prompt (the pairing rule of
``loadgen.prompts.SharegptPool``, as ``sagegate replay --prompts sharegpt`` uses): the pair's prompt
text, prompt length *and its real response length*, so the output a prediction is judged against is
the one that answers that prompt.

The pairs are deduplicated by prompt text and split by a seeded permutation into two disjoint parts:
``reserve`` held-out pairs that only ever warm the semantic predictor's history, and the rest, which
the trace's requests draw from. No window can therefore hold a prompt (or a response) the predictor
has seen. That includes what it learned before it ever ran: the pairs its shipped parts learned from
(``predictor.learned.learned_prompts``: the ranking priors and the encoder tune) are never drawn by a
window; they fill the held-out part first (they are fair history: completed requests), and whatever
of them does not fit there is left out.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sagegate.core.request import TraceRequest

FORMAT = "paired-sharegpt"
"""``SourceSpec.fmt`` of a paired source; options ``sharegpt`` (pairs file), ``arrivals`` (the trace's
reader format, default ``auto``) and ``reserve`` (pairs held out for the history, default 3000)."""

DEFAULT_RESERVE = 3000


def split_pairs(
    path: str | Path, reserve: int, seed: int, name: str, learned: frozenset[int] | None = None
) -> tuple[list[TraceRequest], list[TraceRequest]]:
    """(history pairs, pairing pool): a seeded, disjoint split of the file's unique pairs. Pairs whose
    prompt digest is in ``learned`` (default: what the shipped prior and encoder tune learned from) go
    to the history first and never to the pool."""
    from sagegate.core.request import prompt_digest
    from sagegate.loadgen.prompts import unique_pairs

    if learned is None:
        from sagegate.predictor.learned import learned_prompts

        learned = learned_prompts()
    pairs = unique_pairs(str(path))
    known = [p for p in pairs if prompt_digest(p.prompt or "") in learned]
    fresh = [p for p in pairs if prompt_digest(p.prompt or "") not in learned]
    take = max(0, reserve - len(known))  # fresh pairs the history still needs
    if reserve < 0 or take >= len(fresh):
        raise ValueError(f"reserve must be in [0, {len(known) + len(fresh)}), got {reserve}")
    rng = np.random.default_rng([seed, zlib.crc32(name.encode()), 0x7E47])
    order = rng.permutation(len(fresh))  # with nothing learned: the same split as ever
    known_order = rng.permutation(len(known))
    held = [known[int(i)] for i in known_order[:reserve]] + [fresh[int(i)] for i in order[:take]]
    pool = [fresh[int(i)] for i in order[take:]]
    return held, pool


def pair_requests(
    rows: Sequence[TraceRequest], pool: Sequence[TraceRequest], seed: int
) -> list[TraceRequest]:
    """``rows`` each carrying a pair from the bucket of its prompt length; a spent bucket starts over,
    so a pair can recur in a long trace, never in the held-out history (see
    :func:`loadgen.prompts.pair_requests`)."""
    from sagegate.loadgen.prompts import pair_requests as pair

    return pair(rows, pool, seed)


def _opts(options: dict[str, Any]) -> tuple[str, str, int]:
    from sagegate.loadgen.data import SHAREGPT, data_file

    sharegpt = str(options.get("sharegpt") or data_file(*SHAREGPT))
    return sharegpt, str(options.get("arrivals", "auto")), int(options.get("reserve", DEFAULT_RESERVE))


def load_paired(path: str, name: str, options: dict[str, Any], seed: int) -> list[TraceRequest]:
    """The paired source's rows: the trace at ``path`` with pairs from the non-reserved part."""
    from sagegate.loadgen.readers import read_trace

    sharegpt, arrivals, reserve = _opts(options)
    if not Path(sharegpt).is_file():
        raise FileNotFoundError(f"source {name!r}: ShareGPT pairs not found: {sharegpt}")
    _, pool = split_pairs(sharegpt, reserve, seed, name)
    return pair_requests(read_trace(path, arrivals, seed=seed), pool, seed)


def held_out(name: str, options: dict[str, Any], seed: int) -> list[TraceRequest]:
    """The paired source's reserved pairs: the semantic predictor's history, disjoint from its rows."""
    sharegpt, _, reserve = _opts(options)
    held, _ = split_pairs(sharegpt, reserve, seed, name)
    return held
