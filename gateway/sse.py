"""Server-sent events as they pass through: whole events only, token events counted, usage lifted out.

The count of token events (one per generated token from vLLM, bar the chat role chunk) corrects the
KV charge as a stream goes; the final usage event, which the gateway asks for even when the client did
not, gives the exact output length and is dropped again for a client that did not ask for it.

Each chunk is scanned once: an unfinished event waits as a list of pieces, so a backend that sends one
endless event costs linear time, and past ``max_event_bytes`` the stream is given up
(:class:`EventTooLarge`) instead of buffered without bound.
"""

from __future__ import annotations

import json

USAGE_CAP = 1 << 20
"""Largest ``completion_tokens`` believed of a request without ``max_tokens`` (no served context is
longer); a backend's usage past it, or negative, is not recorded."""


class EventTooLarge(Exception):
    """The backend sent more than ``max_event_bytes`` without ending an event."""


def _has_usage(data: bytes) -> bool:
    return b'"usage":{' in data or b'"usage": {' in data


def plausible_usage(value: object, cap: int) -> int | None:
    """``value`` if it can be a request's true output length (an int in ``[0, cap]``), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= cap:
        return value
    return None


class SseScanner:
    __slots__ = ("carry", "carry_len", "done", "events", "max_event_bytes", "strip_usage", "usage")

    def __init__(self, strip_usage: bool, max_event_bytes: int = 1 << 20) -> None:
        self.strip_usage = strip_usage
        self.max_event_bytes = max_event_bytes
        self.carry: list[bytes] = []
        """The unfinished event, in the pieces it came in (joined once, when it ends)."""
        self.carry_len = 0
        self.events = 0
        """Data events that carried choices (≈ tokens generated)."""
        self.usage: int | None = None
        """``usage.completion_tokens`` as the backend sent it, once the usage event has passed
        (unchecked: see :func:`plausible_usage`)."""
        self.done = False
        """``data: [DONE]`` has passed."""

    def feed(self, chunk: bytes) -> bytes:
        """The whole events completed by ``chunk``, ready to forward (possibly empty)."""
        cut = chunk.rfind(b"\n\n")
        if cut >= 0:
            cut += 2
        elif self.carry and chunk[:1] == b"\n" and self.carry[-1][-1:] == b"\n":
            cut = 1  # the blank line straddles the two chunks
        else:
            if chunk:
                self.carry.append(chunk)
                self.carry_len += len(chunk)
                if self.carry_len > self.max_event_bytes:
                    raise EventTooLarge(f"an SSE event exceeds {self.max_event_bytes} bytes")
            return b""
        if self.carry:
            self.carry.append(chunk[:cut])
            out = b"".join(self.carry)
        else:
            out = chunk[:cut] if cut < len(chunk) else chunk
        rest = chunk[cut:]
        self.carry = [rest] if rest else []
        self.carry_len = len(rest)  # checked at the next chunk: the events before it go out first
        n = out.count(b"data:")
        if b"[DONE]" in out:
            n -= out.count(b"data: [DONE]")
            self.done = True
        if _has_usage(out):
            out, n = self._lift_usage(out, n)
        self.events += n
        return out

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream (an unterminated last event)."""
        rest = b"".join(self.carry)
        self.carry, self.carry_len = [], 0
        return rest

    def _lift_usage(self, out: bytes, n: int) -> tuple[bytes, int]:
        kept: list[bytes] = []
        for event in out.split(b"\n\n"):
            if not event:
                continue
            if _has_usage(event):
                at = event.find(b"data:")
                try:
                    obj = json.loads(event[at + 5 :]) if at >= 0 else None
                except ValueError:
                    obj = None
                if isinstance(obj, dict):
                    usage = obj.get("usage")
                    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                        self.usage = usage["completion_tokens"]
                    if not obj.get("choices"):
                        n -= 1
                        if self.strip_usage:
                            continue
            kept.append(event)
        return b"".join(e + b"\n\n" for e in kept), n
