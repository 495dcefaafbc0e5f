"""The parts of the shared prefix index (``gateway.shared_prefixes``): the message replicas exchange,
the batch that waits to be published, and the counters.

One message is one replica's batch: per backend (named by its URL: replicas may list the fleet in
different orders), the block keys touched there, each once, in the order of its last touch (applied
in that order, they leave an LRU index as the sender's touches did); and sessions whose last turn
went to one of those backends. Binary, little-endian, 4 bytes a key (keys are 32-bit CRCs,
``core.prefix``)::

    head     "SGPI" version:u8 replica:8s block_tokens:u16 backends:u8 sessions:u16
    backend  name_len:u16 keys:u32 name:utf-8 keys × u32
    session  backend:u8 prompt_tokens:u32 id_len:u8 id:utf-8

A message that does not parse to its last byte is malformed (:class:`Malformed`).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

MAGIC = b"SGPI"
VERSION = 1
REPLICA_BYTES = 8
MAX_BACKENDS = 255
MAX_NAME_BYTES = 2048
MAX_SESSION_BYTES = 255
MAX_MESSAGE_SESSIONS = 256
MAX_PENDING_SESSIONS = 4096

Touches = list[tuple[int, list[int]]]
"""(backend index, keys in touch order), as a batch is taken for a message."""
Sessions = list[tuple[str, int, int]]
"""(session id, index into the touches, prompt tokens)."""

_HEAD = struct.Struct(f"<4sB{REPLICA_BYTES}sHBH")
_BACKEND = struct.Struct("<HI")
_SESSION = struct.Struct("<BIB")
_U32 = next(code for code in "IL" if array(code).itemsize == 4)
_SWAP = sys.byteorder == "big"


class Malformed(ValueError):
    """A message that is not a well-formed batch."""


@dataclass(frozen=True, slots=True)
class Batch:
    replica: bytes
    block_tokens: int
    touches: list[tuple[str, Sequence[int]]]
    """(backend URL, keys in touch order), one entry a backend."""
    sessions: list[tuple[str, int, int]]
    """(session id, index into ``touches``, its last turn's prompt tokens)."""


def encode(
    replica: bytes,
    block_tokens: int,
    touches: Sequence[tuple[str, Sequence[int]]],
    sessions: Sequence[tuple[str, int, int]] = (),
) -> bytes:
    """One message (see the module docstring); raises ``ValueError`` (or ``OverflowError``) on what
    the format cannot carry."""
    if len(touches) > MAX_BACKENDS or len(sessions) > 0xFFFF:
        raise ValueError("too many backends or sessions for one message")
    out = [_HEAD.pack(MAGIC, VERSION, replica, block_tokens, len(touches), len(sessions))]
    for name, keys in touches:
        raw = name.encode()
        if len(raw) > MAX_NAME_BYTES:
            raise ValueError("backend name too long")
        packed = array(_U32, keys)
        if _SWAP:
            packed.byteswap()
        out += [_BACKEND.pack(len(raw), len(packed)), raw, packed.tobytes()]
    for sid, backend, tokens in sessions:
        raw = sid.encode()
        if len(raw) > MAX_SESSION_BYTES or not 0 <= backend < len(touches):
            raise ValueError("session id too long, or no such backend")
        out += [_SESSION.pack(backend, min(tokens, 0xFFFFFFFF), len(raw)), raw]
    return b"".join(out)


def sender(data: bytes) -> bytes | None:
    """The replica that sent ``data`` (None: not a message of this format), read from its head alone."""
    if len(data) < _HEAD.size or data[:4] != MAGIC:
        return None
    return data[5 : 5 + REPLICA_BYTES]


def decode(data: bytes) -> Batch:
    """The batch ``data`` carries; raises :class:`Malformed` unless it parses to its last byte."""
    try:
        magic, version, replica, block_tokens, n_backends, n_sessions = _HEAD.unpack_from(data, 0)
        if magic != MAGIC or version != VERSION:
            raise Malformed("not a prefix batch of this version")
        off = _HEAD.size
        touches: list[tuple[str, Sequence[int]]] = []
        for _ in range(n_backends):
            name_len, n_keys = _BACKEND.unpack_from(data, off)
            off += _BACKEND.size
            name = data[off : off + name_len].decode()
            off += name_len
            end = off + 4 * n_keys
            if name_len > MAX_NAME_BYTES or end > len(data):
                raise Malformed("truncated")
            keys = array(_U32, data[off:end])
            if _SWAP:
                keys.byteswap()
            touches.append((name, keys))
            off = end
        sessions: list[tuple[str, int, int]] = []
        for _ in range(n_sessions):
            backend, tokens, sid_len = _SESSION.unpack_from(data, off)
            off += _SESSION.size
            if backend >= n_backends or off + sid_len > len(data):
                raise Malformed("bad session")
            sessions.append((data[off : off + sid_len].decode(), backend, tokens))
            off += sid_len
    except (struct.error, UnicodeDecodeError) as exc:
        raise Malformed(str(exc)) from exc
    if off != len(data):
        raise Malformed("trailing bytes")
    return Batch(replica, block_tokens, touches, sessions)


class Batching:
    """What one replica has touched and not yet published: per backend, each key once, oldest touch
    first (a key touched again moves to the end), at most ``max_blocks`` in all (the oldest dropped);
    and sessions (``MAX_PENDING_SESSIONS`` at most). True while anything waits."""

    def __init__(self, backends: int, max_blocks: int) -> None:
        self.keys: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(backends)]
        self.sessions: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self.total = 0
        self.max_blocks = max_blocks

    def __bool__(self) -> bool:
        return bool(self.total or self.sessions)

    def touch(self, backend: int, keys: Sequence[int], session: str | None, prompt_tokens: int) -> int:
        """Add a touch; returns how many keys were dropped to stay within the bound."""
        pending = self.keys[backend]
        before = len(pending)
        for k in keys:
            if k in pending:
                pending.move_to_end(k)
            else:
                pending[k] = None
        self.total += len(pending) - before
        if session is not None and len(session.encode()) <= MAX_SESSION_BYTES:
            self.sessions[session] = (backend, prompt_tokens)
            self.sessions.move_to_end(session)
            if len(self.sessions) > MAX_PENDING_SESSIONS:
                self.sessions.popitem(last=False)
        return self._shed(backend)

    def take(self, max_keys: int) -> tuple[Touches, Sessions]:
        """The next message's contents, oldest first: at most ``max_keys`` keys, ``MAX_BACKENDS``
        backends and ``MAX_MESSAGE_SESSIONS`` sessions (the rest wait for the next)."""
        budget = max_keys
        touches: Touches = []
        slot: dict[int, int] = {}
        for i, pending in enumerate(self.keys):
            if not pending or budget <= 0 or len(touches) == MAX_BACKENDS:
                continue
            if len(pending) <= budget:
                keys = list(pending)
                pending.clear()
            else:
                keys = [pending.popitem(last=False)[0] for _ in range(budget)]
            budget -= len(keys)
            self.total -= len(keys)
            slot[i] = len(touches)
            touches.append((i, keys))
        sessions: Sessions = []
        while self.sessions and len(sessions) < MAX_MESSAGE_SESSIONS:
            i = next(iter(self.sessions.values()))[0]
            if i not in slot:
                if len(touches) == MAX_BACKENDS:
                    break
                slot[i] = len(touches)
                touches.append((i, []))
            sid, (_, tokens) = self.sessions.popitem(last=False)
            sessions.append((sid, slot[i], tokens))
        return touches, sessions

    def put_back(self, touches: Touches, sessions: Sessions) -> int:
        """A publish failed: its contents wait again, before anything touched since; returns how
        many keys were dropped to stay within the bound."""
        for i, keys in touches:
            pending = self.keys[i]
            for k in reversed(keys):
                if k not in pending:
                    pending[k] = None
                    pending.move_to_end(k, last=False)
                    self.total += 1
        for sid, at, tokens in reversed(sessions):
            if sid not in self.sessions and len(self.sessions) < MAX_PENDING_SESSIONS:
                self.sessions[sid] = (touches[at][0], tokens)
                self.sessions.move_to_end(sid, last=False)
        return self._shed(touches[0][0] if touches else 0)

    def _shed(self, first: int) -> int:
        """Past ``max_blocks``: drop the oldest keys, ``first``'s backend's first."""
        over = self.total - self.max_blocks
        if over <= 0:
            return 0
        self.total -= over
        left = over
        for pending in (self.keys[first], *self.keys):
            while left > 0 and pending:
                pending.popitem(last=False)
                left -= 1
        return over


class ShareStats:
    """The counters, in the gateway's registry (``sagegate_prefix_share_*``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = r = registry
        self.messages = Counter(
            "sagegate_prefix_share_messages", "Prefix sharing: messages published and applied.", ["what"],
            registry=r,
        )  # fmt: skip
        self.blocks = Counter(
            "sagegate_prefix_share_blocks",
            "Prefix sharing: block keys published, and applied to this replica's index.",
            ["what"],
            registry=r,
        )
        self.sessions = Counter(
            "sagegate_prefix_share_sessions", "Prefix sharing: sessions published and applied.", ["what"],
            registry=r,
        )  # fmt: skip
        self.dropped_messages = Counter(
            "sagegate_prefix_share_dropped_messages",
            "Prefix sharing: messages from other replicas dropped, by reason (malformed, too_large, "
            "block_size: keyed with another placement.block_tokens, rate: past max_apply_blocks_per_s).",
            ["reason"],
            registry=r,
        )
        self.dropped_blocks = Counter(
            "sagegate_prefix_share_dropped_blocks",
            "Prefix sharing: block keys dropped, by reason (overflow: past max_pending_blocks while "
            "Redis was slow or away; unknown_backend, unhealthy_backend: received for a backend this "
            "replica does not list, or holds down).",
            ["reason"],
            registry=r,
        )
        self.failures = Counter(
            "sagegate_prefix_share_failures", "Prefix sharing: Redis calls that failed or timed out.",
            ["side"], registry=r,
        )  # fmt: skip
        self.up = Gauge(
            "sagegate_prefix_share_up",
            "Prefix sharing: 1 while the side's last Redis call (publish, read) succeeded.",
            ["side"],
            registry=r,
        )
        self.pending = Gauge(
            "sagegate_prefix_share_pending_blocks", "Prefix sharing: block keys waiting to be published.",
            registry=r,
        )  # fmt: skip
