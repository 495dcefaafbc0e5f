"""Prompt token counting with an offline BPE (``bpe-openai``), kept off the event loop for long prompts.

The count feeds the policy (prompt length ``I``) and the KV charge; the backend's usage report corrects
nothing here, so an approximate count (another model's tokenizer) only shifts ranks slightly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from core.tokens import flatten_messages

INLINE_CHARS = 16_384
"""Prompts up to this many characters are counted on the event loop (tens of microseconds)."""


@lru_cache(maxsize=8)
def _counter(encoding: str) -> Callable[[str], int]:
    if encoding == "chars":
        return lambda text: max(1, len(text) // 4)
    import bpe_openai

    enc = bpe_openai.get_encoding(encoding)
    return lambda text: len(enc.encode_ordinary(text))


def count_text(text: str, encoding: str = "cl100k_base") -> int:
    return _counter(encoding)(text)


def prompt_chars(prompt: Any) -> int:
    """Rough size of a prompt (to decide whether counting may run inline)."""
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, Sequence):
        return sum(prompt_chars(p) if not isinstance(p, int) else 0 for p in prompt)
    if isinstance(prompt, dict):
        return prompt_chars(prompt.get("content"))
    return 0


def count_prompt(prompt: Any, encoding: str = "cl100k_base") -> int:
    """Tokens of a completion prompt (text or token ids) or of a chat message list (every turn as a
    ``role: content`` line, as ``core.tokens`` and the simulated backend count it)."""
    if isinstance(prompt, str):
        return count_text(prompt, encoding)
    if prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if prompt and isinstance(prompt[0], dict):
        return count_text(flatten_messages(prompt), encoding)
    if len(prompt) == 1:
        return count_prompt(prompt[0], encoding)
    return sum(count_prompt(p, encoding) for p in prompt)


async def acount_prompt(prompt: Any, encoding: str = "cl100k_base") -> int:
    """:func:`count_prompt`, in a worker thread when the prompt is long."""
    if prompt_chars(prompt) <= INLINE_CHARS:
        return count_prompt(prompt, encoding)
    return await asyncio.to_thread(count_prompt, prompt, encoding)
