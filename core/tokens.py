"""Prompt token counting for the simulated backend: how many tokens a prompt would cost a real engine.

The engine model only needs counts (and, for prefix caching, token content), so one offline BPE
(``cl100k_base`` from the ``bpe-openai`` package, tiktoken-compatible, no download) stands in for every
model's tokenizer: counts land within a few percent of Llama-3's on English text. When the package is
not installed the fallback estimates one token per 4 characters (the usual rule of thumb for English),
with pseudo token ids derived from each 4-character slice so equal text still gives equal ids.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

ENCODING = "cl100k_base"
CHARS_PER_TOKEN = 4
_FALLBACK_VOCAB = 100_000


@lru_cache(maxsize=1)
def _encoder() -> Any:
    """The BPE encoder, loaded once on first use (about 50 ms); None when the package is missing."""
    with warnings.catch_warnings():  # it reads its tables through a deprecated importlib API
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import bpe_openai  # loads the tables on import
        except ImportError:
            return None
        return bpe_openai.get_encoding(ENCODING)


def encode(text: str) -> list[int]:
    """Token ids of ``text``. Special-token strings such as ``<|endoftext|>`` count as plain text."""
    enc = _encoder()
    if enc is not None:
        return list(enc.encode_ordinary(text))
    return [
        zlib.crc32(text[i : i + CHARS_PER_TOKEN].encode()) % _FALLBACK_VOCAB
        for i in range(0, len(text), CHARS_PER_TOKEN)
    ]


def count_tokens(text: str) -> int:
    """Number of tokens in ``text``."""
    if _encoder() is None:
        return -(-len(text) // CHARS_PER_TOKEN)
    return len(encode(text))


def flatten_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """Chat messages as the ``role: content`` lines a chat template would put before the model.

    Every turn counts, the assistant's included (they are part of the prompt the engine prefills);
    this differs from ``predictor.embedder.flatten_prompt``, which keeps only what the user asked.
    """
    return "\n".join(f"{msg.get('role', 'user')}: {content_text(msg.get('content'))}" for msg in messages)


def content_text(content: Any) -> str:
    """OpenAI message content (a string, a list of parts, or None) as plain text: the text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                if part.get("type", "text") == "text":
                    parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        return " ".join(parts)
    return str(content)
