"""What one backend's prefix cache holds, exactly, as its KV-cache events tell it (precise placement).

A vLLM engine started with ``--kv-events-config`` publishes each step's cache changes (the wire format
is described in ``sim.kv_events``, which speaks it): :func:`decode_batch` reads one message's payload
in either of vLLM's layouts (events as tagged maps, vLLM since PR #42892; as tagged arrays, before) into
plain tuples, and :class:`ExactIndex` follows them.

The index keys a block by the gateway's own chain over its token ids (``core.prefix.token_block_keys``,
from the parent block's key and the ids ``BlockStored`` carries), so a request's prompt, tokenised as
the engine tokenises it, is matched block for block without knowing the engine's hash function. A
block whose hash input holds more than its tokens (a LoRA adapter, ``extra_keys``: a cache salt,
multimodal items) is keyed with that mixed in, and so is every block after it: a plain prompt never
matches it (a miss, never a false hit). Only the GPU tier and the main KV-cache group count (``medium``
None or ``"GPU"``, ``group_idx`` None or 0): an offloaded or sliding-window copy is not what a prefill
skips.

Invariants: ``match(keys)`` counts the leading keys held and changes nothing; a hash stored twice (vLLM
does not de-duplicate physical copies) is held until removed twice; at most ``capacity_blocks``
distinct hashes are held (the oldest stored dropped first: they can only be missed removals, since an
engine holds no more blocks than it has); ``clear()`` forgets everything.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import msgpack

from sagegate.core.prefix import held_prefix, token_block_keys

MAX_HASH_BYTES = 64


class Stored(NamedTuple):
    hashes: list[Hashable]
    parent: Hashable | None
    tokens: list[int]
    block_size: int
    salts: list[bytes | None] | None
    """Per block, what besides its tokens went into its hash (None: nothing)."""


class Removed(NamedTuple):
    hashes: list[Hashable]


class Cleared(NamedTuple):
    pass


Event = Stored | Removed | Cleared


class Malformed(ValueError):
    """A payload that is not a ``KVEventBatch`` (or an event in it that breaks its schema)."""


# Field order of the array layout (msgspec ``array_like``: every field, in declaration order).
_STORED_FIELDS = (
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
    "extra_keys", "group_idx",
)  # fmt: skip
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


def decode_batch(payload: bytes) -> tuple[list[Event], int]:
    """The events of one message we follow, and how many it held that we do not (another tier or
    group, an unknown type). Raises :class:`Malformed`."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several kinds (ExtraData, ValueError, UnicodeDecodeError…)
        raise Malformed(f"not msgpack: {exc}") from None
    if isinstance(batch, dict):  # an EventBatch encoded as a map (not how vLLM sends it, but cheap)
        raw_events = batch.get("events")
    elif isinstance(batch, list) and len(batch) >= 2:
        raw_events = batch[1]
    else:
        raise Malformed("not a KVEventBatch")
    if not isinstance(raw_events, list):
        raise Malformed("the batch's events are not a list")
    out: list[Event] = []
    skipped = 0
    for raw in raw_events:
        ev = _event(raw)
        if ev is None:
            skipped += 1
        else:
            out.append(ev)
    return out, skipped


def _fields(raw: Any, names: Sequence[str]) -> tuple[str, dict[str, Any]]:
    if isinstance(raw, dict):
        tag = raw.get("type")
        body = raw
    elif isinstance(raw, list) and raw:
        tag = raw[0]
        body = dict(zip(names, raw[1:], strict=False))
    else:
        raise Malformed("an event is neither a map nor an array")
    if not isinstance(tag, str):
        raise Malformed("an event has no tag")
    return tag, body


def _event(raw: Any) -> Event | None:
    """One event as we follow it; None for one we do not follow."""
    tag, body = _fields(raw, _STORED_FIELDS)
    if tag == "AllBlocksCleared":
        return Cleared()
    if tag == "BlockRemoved":
        if isinstance(raw, list):
            body = dict(zip(_REMOVED_FIELDS, raw[1:], strict=False))
        if not _main_tier(body):
            return None
        return Removed(_hashes(body.get("block_hashes")))
    if tag != "BlockStored":
        return None
    if not _main_tier(body):
        return None
    hashes = _hashes(body.get("block_hashes"))
    parent = body.get("parent_block_hash")
    if parent is not None:
        parent = _hashes([parent])[0]
    tokens = body.get("token_ids")
    size = body.get("block_size")
    if not isinstance(tokens, list) or not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise Malformed("BlockStored without token ids or a block size")
    if len(tokens) != len(hashes) * size:
        raise Malformed("BlockStored's token ids are not its blocks'")
    return Stored(hashes, parent, tokens, size, _salts(body, len(hashes)))


def _main_tier(body: dict[str, Any]) -> bool:
    medium = body.get("medium")
    group = body.get("group_idx")
    return (medium is None or medium == "GPU") and (group is None or group == 0)


def _hashes(raw: Any) -> list[Hashable]:
    if not isinstance(raw, list):
        raise Malformed("block_hashes is not a list")
    for h in raw:
        if (
            isinstance(h, bool)
            or not isinstance(h, int | bytes)
            or (isinstance(h, bytes) and not 0 < len(h) <= MAX_HASH_BYTES)
        ):
            raise Malformed("a block hash is neither an integer nor bytes")
    return raw


def _salts(body: dict[str, Any], n: int) -> list[bytes | None] | None:
    """What each block's hash mixed in besides its tokens (None when nothing did)."""
    adapter = body.get("lora_name") or body.get("lora_id")
    extra = body.get("extra_keys")
    if adapter is None and not (isinstance(extra, list) and any(e is not None for e in extra)):
        return None
    per = extra if isinstance(extra, list) and len(extra) == n else [extra] * n
    return [repr((adapter, e)).encode() if adapter is not None or e is not None else None for e in per]


def salted(parent: int, salt: bytes) -> int:
    """A chain key with ``salt`` mixed in: what a salted block chains from instead of ``parent``."""
    digest = hashlib.blake2b(parent.to_bytes(8, "little") + b"salt" + salt, digest_size=8).digest()
    return int.from_bytes(digest, "little")


class ExactIndex:
    """The blocks one engine reports cached (see the module docstring for the invariants)."""

    __slots__ = ("_blocks", "_keys", "capacity_blocks", "dropped")

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = max(1, capacity_blocks)
        self._blocks: OrderedDict[Hashable, list[int]] = OrderedDict()
        """Engine hash → [our key, physical copies], oldest stored first."""
        self._keys: dict[int, int] = {}
        """Our key → how many held hashes carry it."""
        self.dropped = 0
        """Blocks dropped past the capacity (removals the index never heard of)."""

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, keys: Sequence[int]) -> int:
        """How many of ``keys``' leading blocks are held."""
        return held_prefix(keys, self._keys)

    def stored(self, ev: Stored) -> bool:
        """Follow one ``BlockStored``; False (nothing changes) when its parent is not held, so its
        blocks' keys cannot be known (nothing could hit them through us anyway)."""
        parent = 0
        if ev.parent is not None:
            entry = self._blocks.get(ev.parent)
            if entry is None:
                return False
            parent = entry[0]
        try:
            keys = self._keys_of(ev, parent)
        except struct.error:
            raise Malformed("a token id is not a 32-bit unsigned integer") from None
        blocks = self._blocks
        held = self._keys
        for h, key in zip(ev.hashes, keys, strict=True):
            entry = blocks.get(h)
            if entry is not None:
                entry[1] += 1
                continue
            blocks[h] = [key, 1]
            held[key] = held.get(key, 0) + 1
        self._bound()
        return True

    @staticmethod
    def _keys_of(ev: Stored, parent: int) -> list[int]:
        bs = ev.block_size
        if ev.salts is None:
            return token_block_keys(ev.tokens, bs, parent)
        keys = []
        for j, salt in enumerate(ev.salts):
            start = parent if salt is None else salted(parent, salt)
            parent = token_block_keys(ev.tokens[j * bs : (j + 1) * bs], bs, start)[0]
            keys.append(parent)
        return keys

    def removed(self, hashes: Sequence[Hashable]) -> None:
        """Follow one ``BlockRemoved`` (an unknown hash is ignored: stored before we listened)."""
        for h in hashes:
            entry = self._blocks.get(h)
            if entry is None:
                continue
            entry[1] -= 1
            if entry[1] <= 0:
                del self._blocks[h]
                self._forget(entry[0])

    def _forget(self, key: int) -> None:
        n = self._keys[key] - 1
        if n:
            self._keys[key] = n
        else:
            del self._keys[key]

    def resize(self, capacity_blocks: int) -> None:
        self.capacity_blocks = max(1, capacity_blocks)
        self._bound()

    def _bound(self) -> None:
        blocks = self._blocks
        while len(blocks) > self.capacity_blocks:
            _, (key, _copies) = blocks.popitem(last=False)
            self._forget(key)
            self.dropped += 1

    def clear(self) -> None:
        self._blocks.clear()
        self._keys.clear()
