"""Prompt token counting with an offline BPE (``bpe-openai``), in time independent of the prompt's length.

The count feeds the policy (prompt length ``I``) and the KV charge. A prompt of up to
``core.tokens.EXACT_CHARS`` characters (about 2k tokens) is counted exactly; a longer one is counted
exactly over its head and estimated over the rest (:func:`core.tokens.count_bounded`), so counting
costs at most ~1 ms whatever the length (a 30k-token prompt took 9 ms to count exactly, on the event
loop's critical path). The estimate is unbiased (median error ~0 on ShareGPT text) and within
``core.tokens.ESTIMATE_ERROR`` of the estimated part; the charge uses it as it is, so a long prompt's
KV reservation can be off by that much either way (≤ 7.5% of the whole measured on ShareGPT cuts).
The engine's own preemption absorbs an under-charge, as it does an output longer than predicted.
The backend's usage report corrects nothing here, and an approximate count (another model's
tokenizer) only shifts ranks slightly.

Precise placement (``gateway.kv_events``) needs more: a prompt's token ids as the engine has them, to
key its blocks as the engine's events key theirs, once per request and only while some backend is
precise: with the BPE above, chat messages rendered as the simulated backend renders them
(:func:`exact_keys`, a long prompt in a worker thread), or from the backend's own ``/tokenize``
(:func:`backend_keys`: a real model's tokenizer and chat template).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sagegate.core.prefix import token_block_keys
from sagegate.core.tokens import EXACT_CHARS, TokenCount, count_bounded, encode, flatten_messages
from sagegate.gateway.upstream import Upstream


@lru_cache(maxsize=8)
def _counter(encoding: str) -> Callable[[str], int]:
    if encoding == "chars":
        return lambda text: max(1, len(text) // 4)
    import bpe_openai

    enc = bpe_openai.get_encoding(encoding)
    return lambda text: len(enc.encode_ordinary(text))


def count_text(text: str, encoding: str = "cl100k_base") -> int:
    """Exact tokens of ``text`` (whatever its length: warm-up, offline use)."""
    return _counter(encoding)(text)


def measure_text(text: str, encoding: str = "cl100k_base") -> TokenCount:
    """Tokens of ``text``: exact when short, else counted over the head and estimated over the rest."""
    return count_bounded(text, _counter(encoding))


def measure_prompt(prompt: Any, encoding: str = "cl100k_base") -> TokenCount:
    """Tokens of a completion prompt (text or token ids) or of a chat message list (every turn as a
    ``role: content`` line, as ``core.tokens`` and the simulated backend count it)."""
    if isinstance(prompt, str):
        return measure_text(prompt, encoding)
    if prompt and all(isinstance(t, int) for t in prompt):
        return TokenCount(len(prompt))
    if prompt and isinstance(prompt[0], dict):
        return measure_text(flatten_messages(prompt), encoding)  # a copy at memory speed, then bounded
    if len(prompt) == 1:
        return measure_prompt(prompt[0], encoding)
    return _sum(measure_prompt(p, encoding) for p in prompt)


def _sum(parts: Any) -> TokenCount:
    counts: Sequence[TokenCount] = list(parts)
    estimated = sum(c.estimated for c in counts)
    error = max((c.error for c in counts), default=0.0)
    exact = all(c.exact for c in counts)
    return TokenCount(sum(c.tokens for c in counts), exact, estimated, error)


def count_prompt(prompt: Any, encoding: str = "cl100k_base") -> int:
    """:func:`measure_prompt`'s token count (what the policy and the charge see)."""
    return measure_prompt(prompt, encoding).tokens


@dataclass(frozen=True, slots=True)
class ExactKeys:
    """A request's prompt as the engine caches it: its length in tokens and its block keys."""

    tokens: int
    keys: dict[int, list[int]]
    """Block size → the chained keys of the prompt's whole blocks."""


def prompt_ids(prompt: Any) -> list[int] | None:
    """The token ids the simulated backend (and so its events) gives ``prompt``: chat messages as
    ``role: content`` lines (``core.tokens.flatten_messages``), a text prompt as is, token ids as
    given; None for what no engine takes as one prompt (a batch)."""
    if isinstance(prompt, str):
        return encode(prompt)
    if not isinstance(prompt, list) or not prompt:
        return None
    if isinstance(prompt[0], dict):
        return encode(flatten_messages(prompt))
    if _all_ids(prompt):
        return list(prompt)
    return prompt_ids(prompt[0]) if len(prompt) == 1 else None


def _all_ids(prompt: list[Any]) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)


def keys_of(ids: Sequence[int], sizes: frozenset[int]) -> ExactKeys | None:
    try:
        return ExactKeys(len(ids), {bs: token_block_keys(ids, bs) for bs in sizes})
    except struct.error:  # an id outside [0, 2**32)
        return None


def _local_keys(prompt: Any, sizes: frozenset[int]) -> ExactKeys | None:
    try:
        ids = prompt_ids(prompt)
    except (ValueError, TypeError):  # a text the tokeniser refuses
        return None
    return None if ids is None else keys_of(ids, sizes)


async def exact_keys(prompt: Any, sizes: frozenset[int]) -> ExactKeys | None:
    """:func:`prompt_ids`' block keys for each block size in ``sizes``; a long prompt is tokenised in
    a worker thread (the event loop only ever pays for ~``EXACT_CHARS`` characters)."""
    if not sizes:
        return None
    if _length(prompt) <= EXACT_CHARS:
        return _local_keys(prompt, sizes)
    return await asyncio.to_thread(_local_keys, prompt, sizes)


async def backend_ids(
    client: Upstream, url: str, body: dict[str, Any], chat: bool, timeout_s: float
) -> list[int] | None:
    """The prompt's token ids as the backend itself tokenises it: vLLM's ``POST /tokenize`` (the
    model's tokenizer, and for chat its chat template with the request's template options), one round
    trip (none for a completion prompt given as ids); None when it fails."""
    prompt = body.get("messages") if chat else body.get("prompt")
    if not chat and isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and _all_ids(prompt) and not chat:
        return prompt
    ask = {k: body[k] for k in TOKENIZE_FIELDS if k in body}
    ask["messages" if chat else "prompt"] = prompt
    try:
        r = await client.send(client.build_request("POST", url + "/tokenize", json=ask, timeout=timeout_s))
        ids = r.json().get("tokens") if r.status_code == 200 else None
    except Exception:  # unreachable, slow, not JSON, not a mapping
        return None
    if not isinstance(ids, list) or not _all_ids(ids):
        return None
    return ids


async def backend_keys(
    client: Upstream,
    url: str,
    body: dict[str, Any],
    chat: bool,
    sizes: frozenset[int],
    timeout_s: float,
) -> ExactKeys | None:
    """The block keys of the prompt as the backend tokenises it (:func:`backend_ids`); None when that
    fails (the request is placed by the approximate index)."""
    ids = await backend_ids(client, url, body, chat, timeout_s)
    if ids is None:
        return None
    if len(ids) * 4 <= EXACT_CHARS:
        return keys_of(ids, sizes)
    return await asyncio.to_thread(keys_of, ids, sizes)


TOKENIZE_FIELDS = (
    "model", "add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template",
    "chat_template_kwargs", "tools", "documents", "mm_processor_kwargs",
)  # fmt: skip
"""The request's fields vLLM's ``/tokenize`` takes too (they shape the tokens its engine prefills)."""


def _length(prompt: Any) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(_length(p) if isinstance(p, str | list) else len(str(p)) for p in prompt)
    return len(str(prompt))
