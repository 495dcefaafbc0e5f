"""Server-sent events as they pass through: whole events only, token events counted, usage lifted out.

The count of token events (one per generated token from vLLM, bar the chat role chunk) corrects the
KV charge as a stream goes; the final usage event, which the gateway asks for even when the client did
not, gives the exact output length and is dropped again for a client that did not ask for it.
"""

from __future__ import annotations

import json


def _has_usage(data: bytes) -> bool:
    return b'"usage":{' in data or b'"usage": {' in data


class SseScanner:
    __slots__ = ("carry", "done", "events", "strip_usage", "usage")

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.carry = b""
        self.events = 0
        """Data events that carried choices (≈ tokens generated)."""
        self.usage: int | None = None
        """``usage.completion_tokens`` once the usage event has passed."""
        self.done = False
        """``data: [DONE]`` has passed."""

    def feed(self, chunk: bytes) -> bytes:
        """The whole events completed by ``chunk``, ready to forward (possibly empty)."""
        data = self.carry + chunk if self.carry else chunk
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self.carry = data
            return b""
        cut += 2
        out = data[:cut]
        self.carry = data[cut:]
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
        rest, self.carry = self.carry, b""
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
