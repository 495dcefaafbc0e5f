"""Content keys of a prompt's leading blocks, for predicting what a backend's prefix cache holds.

A block's key stands for its text *and everything before it* (a chained CRC-32), so two prompts share
their first ``n`` keys exactly when they share their first ``n`` blocks of text: turn k+1 of a
conversation, re-sending turn k's history, extends turn k's keys block for block. The keys are stable
across processes (no ``hash()`` salt), so replicas can share them. About four characters stand for a
token (``CHARS_PER_TOKEN``), as in the simulated engine's own text keys.

Where token ids are known (an engine's KV events carry them, ``gateway.kv_events``), blocks are keyed
by their ids instead (:func:`token_block_keys`): a 64-bit chained BLAKE2b, the same for the blocks an
engine reports stored and for a request's prompt tokenised as the engine tokenises it.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Container, Hashable, Sequence

CHARS_PER_TOKEN = 4


def text_block_keys(text: str, block_chars: int, max_blocks: int | None = None) -> list[int]:
    """The chained CRC-32 of each whole ``block_chars`` span of ``text`` (a partial last span has no
    key: an engine caches only full blocks), at most ``max_blocks`` of them."""
    n = len(text) // block_chars
    if max_blocks is not None:
        n = min(n, max_blocks)
    keys: list[int] = []
    chain = 0
    data = text.encode("utf-8", "surrogatepass")
    if len(data) == len(text):  # ASCII: byte spans are character spans (the common case, sliced once)
        for j in range(n):
            chain = zlib.crc32(data[j * block_chars : (j + 1) * block_chars], chain)
            keys.append(chain)
        return keys
    for j in range(n):
        span = text[j * block_chars : (j + 1) * block_chars]
        chain = zlib.crc32(span.encode("utf-8", "surrogatepass"), chain)
        keys.append(chain)
    return keys


def token_block_keys(ids: Sequence[int], block_tokens: int, parent: int = 0) -> list[int]:
    """The chained 64-bit key of each whole ``block_tokens`` span of token ``ids`` (a partial last span
    has none), the chain starting from ``parent`` (0: the first block of a sequence). Raises
    ``struct.error`` for an id outside ``[0, 2**32)``."""
    n = len(ids) // block_tokens
    data = struct.pack(f"<{n * block_tokens}I", *ids[: n * block_tokens])
    width = 4 * block_tokens
    keys: list[int] = []
    chain = parent.to_bytes(8, "little")
    for j in range(n):
        chain = hashlib.blake2b(chain + data[j * width : (j + 1) * width], digest_size=8).digest()
        keys.append(int.from_bytes(chain, "little"))
    return keys


def held_prefix(keys: Sequence[Hashable], held: Container[Hashable]) -> int:
    """How many of ``keys``' leading blocks ``held`` holds, up to the first it does not: with chained
    keys a block's key names its whole prefix, so this is the prompt's cached prefix, in blocks."""
    n = 0
    for key in keys:
        if key not in held:
            break
        n += 1
    return n
