"""Content keys of a request's KV blocks, for prefix caching.

A block's key stands for its tokens *and everything before them*, so keys chain. Three sources:
Mooncake ``hash_ids`` (one id per 512-token block: equal ids mean equal content), prompt text (no
token ids in the simulator, so ~4 characters stand for a token), or nothing (every block private to its
request, which still lets a preempted request find its own blocks again).
"""

from __future__ import annotations

from collections.abc import Hashable

from sagegate.core.prefix import CHARS_PER_TOKEN, text_block_keys

MOONCAKE_BLOCK = 512


class BlockKeys:
    """``keys(j)`` is the content key of block ``j`` of one request (blocks of ``block_size`` tokens)."""

    __slots__ = ("_content", "_keys", "_rid", "shared_blocks", "text")

    def __init__(self, rid: object, content: list[Hashable], text: str | None = None) -> None:
        self._rid = rid
        self.text = text
        """The text the content keys were made from (``block_keys``' ``prompt``), else None: what a
        KV event needs to name a stored block's tokens (``sim.kv_events``)."""
        self._content = content  # keys of the leading blocks whose content is shared-able
        self._keys = content  # ``first``'s list: content, then private keys as far as asked
        self.shared_blocks = len(content)

    def first(self, n: int) -> list[Hashable]:
        """A list whose first ``n`` items are ``self(0) … self(n-1)`` (it may be longer): the
        admission hot path scans it instead of calling once per block."""
        keys = self._keys
        have = len(keys)
        if have < n:
            if keys is self._content:
                keys = self._keys = list(keys)
            rid = self._rid
            keys.extend([(rid, j) for j in range(have, n)])
        return keys

    @property
    def content(self) -> list[Hashable]:
        """The keys of the blocks whose content is shareable (what another request can hit)."""
        return self._content

    def __call__(self, j: int) -> Hashable:
        if j < len(self._content):
            return self._content[j]
        return (self._rid, j)


def block_keys(
    rid: object,
    prompt_tokens: int,
    block_size: int,
    hash_ids: tuple[int, ...] | None = None,
    prompt: str | None = None,
    content_tokens: int | None = None,
) -> BlockKeys:
    """``content_tokens``: how many tokens ``prompt`` describes when it also holds the output's
    content (the simulated backend's, whose text it knows in advance): then the blocks the output
    fills get content keys too and stay cached after the request, as vLLM's do, so a continuation
    of prompt + output finds them."""
    full = max(prompt_tokens, content_tokens or 0) // block_size
    content: list[Hashable] = []
    if hash_ids:
        per = max(1, MOONCAKE_BLOCK // block_size)
        chain = 0
        for j in range(full):
            h, within = divmod(j, per)
            if h >= len(hash_ids):
                break
            if within == 0:
                chain = hash((chain, hash_ids[h]))
            content.append(("m", chain, within))
    elif prompt:
        keys = text_block_keys(prompt, block_size * CHARS_PER_TOKEN, full)
        content.extend(("t", chain, j) for j, chain in enumerate(keys))
        return BlockKeys(rid, content, prompt)
    return BlockKeys(rid, content)
