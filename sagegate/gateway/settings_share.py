"""``placement.share``: replicas sharing the prefix index through Redis (``gateway.shared_prefixes``;
``gateway.settings`` holds the rest of the one settings object)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ShareSettings(BaseModel):
    """Each replica publishes the prompt blocks it places (and that leave) to the others, which touch
    them in their own per-backend index. On with ``redis_url`` and ``placement.mode: cache_aware``."""

    enabled: bool = True
    """Off: each replica predicts from what it sent alone (the index is its own)."""
    flush_s: float = Field(default=0.01, gt=0.0, le=1.0)
    """Blocks touched within this window go out in one message (at most one message per window)."""
    max_message_blocks: int = Field(default=4096, ge=1, le=65_536)
    """Blocks in one message at most (4 bytes each); more wait for the next window."""
    max_pending_blocks: int = Field(default=65_536, ge=1)
    """Blocks waiting to be published at most (Redis slow or away): the oldest are dropped beyond."""
    max_apply_blocks_per_s: float = Field(default=1_000_000.0, gt=0.0)
    """The others' blocks applied here per second at most (a burst of one second's worth): a message
    beyond is dropped, so a flood cannot take the event loop."""
    stream_maxlen: int = Field(default=1024, ge=1)
    """Messages Redis keeps (the stream is trimmed to about this many): a replica that lost its
    connection catches up from them, one that starts warms its index with them."""
    sessions: bool = True
    """Share sessions too (``x-session-id`` → the backend its last turn went to)."""
    timeout_s: float = Field(default=0.25, gt=0.0)
    """A Redis call slower than this counts as failed (then retried with backoff)."""
    max_backoff_s: float = Field(default=2.0, gt=0.0)
    """Longest wait between attempts to reach Redis again (doubling from ``flush_s``)."""
