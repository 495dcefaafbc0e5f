"""Server-sent events as they pass through: whole events only, token events counted, usage lifted out.

The count of token events (one per generated token from vLLM, bar the chat role chunk) corrects the
KV charge as a stream goes; the final usage event, which the gateway asks for even when the client did
not, gives the exact output length and is dropped again for a client that did not ask for it.

Events are framed and read by line (``core.sse``): text a model generates (``data:``, ``[DONE]``,
``"usage":{``) is inside a JSON string and never counts as a field. Each chunk is scanned once; an
unfinished event waits (``core.sse.Framer``), and past ``max_event_bytes`` the stream is given up
(:class:`EventTooLarge`) instead of buffered without bound.
"""

from __future__ import annotations

import json

from sagegate.core.sse import DONE, EventTooLarge, Framer, data, events

__all__ = ["USAGE_CAP", "EventTooLarge", "SseScanner", "plausible_usage"]

USAGE_CAP = 1 << 20
"""Largest ``completion_tokens`` believed of a request without ``max_tokens`` (no served context is
longer); a backend's usage past it, or negative, is not recorded."""


def _has_usage(data_: bytes) -> bool:
    return b'"usage":{' in data_ or b'"usage": {' in data_


def plausible_usage(value: object, cap: int) -> int | None:
    """``value`` if it can be a request's true output length (an int in ``[0, cap]``), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= cap:
        return value
    return None


class SseScanner:
    __slots__ = ("done", "events", "framer", "strip_usage", "usage")

    def __init__(self, strip_usage: bool, max_event_bytes: int = 1 << 20) -> None:
        self.strip_usage = strip_usage
        self.framer = Framer(max_event_bytes)
        self.events = 0
        """Data events that carried choices (≈ tokens generated)."""
        self.usage: int | None = None
        """``usage.completion_tokens`` as the backend sent it, once the usage event has passed
        (unchecked: see :func:`plausible_usage`)."""
        self.done = False
        """``data: [DONE]`` has passed."""

    def feed(self, chunk: bytes) -> bytes:
        """The whole events completed by ``chunk``, ready to forward (possibly empty)."""
        out = self.framer.feed(chunk)
        if not out:
            return out
        one_line = out[:7] == b"data: {" and out.find(b"\n") == len(out) - 2
        if one_line and not _has_usage(out):  # the usual read: one token event, counted without a split
            self.events += 1
            return out
        kept: list[bytes] | None = None  # the events to forward, once one is dropped (None: all)
        n = 0
        for i, event in enumerate(evs := events(out)):
            payload = data(event)
            drop = False
            if payload == DONE:
                self.done = True
            elif payload is not None:
                n += 1
                if _has_usage(payload) and not self._counts(payload):
                    n -= 1  # a usage-only event is not a token
                    drop = self.strip_usage
            if drop and kept is None:
                kept = evs[:i]
            elif not drop and kept is not None:
                kept.append(event)
        self.events += n
        if kept is None:
            return out
        return b"".join(e + b"\n\n" for e in kept)

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream (an unterminated last event)."""
        return self.framer.flush()

    def _counts(self, payload: bytes) -> bool:
        """Read the usage off an event that names one; whether the event also carries a token."""
        try:
            obj = json.loads(payload)
        except ValueError:
            return True
        if not isinstance(obj, dict):
            return True
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage = usage["completion_tokens"]
        return bool(obj.get("choices"))
