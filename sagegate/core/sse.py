"""Server-sent events read by line, as the specification says (WHATWG HTML, *server-sent events*).

An event is a block of lines ended by a blank line; a line ``data:`` (one space after the colon is
dropped; a bare ``data`` line adds an empty one) adds to its data, several joined by ``\\n``; other
fields (``event:``, ``id:``) and comments (``:``) carry no data. Lines end in ``\\n``, ``\\r\\n`` or
``\\r``: a block is read with ``\\r\\n`` and lone ``\\r`` made ``\\n`` first (:func:`normalize`).

Matching is on line starts only. A JSON string cannot hold a raw newline, so ``data:`` or
``[DONE]`` inside generated text never reads as a field here (a byte search over the event would).
Every reader of a stream in the project (the gateway's relay and continuation, the load generator)
frames and reads events with these functions.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"[DONE]"
"""OpenAI's end-of-stream data."""


def normalize(block: bytes) -> bytes:
    """``block`` with every line ending made ``\\n`` (cheap when it has no ``\\r``, the usual case)."""
    if b"\r" not in block:
        return block
    return block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def last_boundary(buf: bytes) -> int:
    """The index just past the last blank line of a normalized ``buf`` (the end of its last whole
    event), or -1 when no event ends in it."""
    cut = buf.rfind(b"\n\n")
    return cut + 2 if cut >= 0 else -1


def events(block: bytes) -> list[bytes]:
    """The events of a normalized ``block`` of whole events, each without its blank line (empty
    events, blank lines in a row, are dropped)."""
    return [e for e in block.split(b"\n\n") if e.strip(b"\n")]


def data(event: bytes) -> bytes | None:
    """An event's data (its ``data:`` lines joined by ``\\n``), or None when it has no data line."""
    if event.startswith(b"data:") and b"\n" not in event:  # the common case: one line
        value = event[5:]
        return value[1:] if value[:1] == b" " else value
    lines = [ln[5:] for ln in event.split(b"\n") if ln.startswith(b"data:") or ln == b"data"]
    if not lines:
        return None
    return b"\n".join(ln[1:] if ln[:1] == b" " else ln for ln in lines)


def frame(data_: bytes) -> bytes:
    """One event carrying ``data_`` (no newline in it: JSON's encoding has none)."""
    return b"data: " + data_ + b"\n\n"


def json_event(obj: Any) -> bytes:
    """One event carrying ``obj`` as compact JSON (as vLLM sends its chunks)."""
    return frame(json.dumps(obj, separators=(",", ":")).encode())


class Framer:
    """Whole events out of network reads: an unfinished event waits as a list of pieces (joined once,
    when it ends), so one endless event costs linear time; past ``max_event_bytes`` it is refused
    (:class:`EventTooLarge`) instead of buffered without bound."""

    __slots__ = ("carry", "carry_len", "cr", "max_event_bytes")

    def __init__(self, max_event_bytes: int = 1 << 20) -> None:
        self.max_event_bytes = max_event_bytes
        self.carry: list[bytes] = []
        self.carry_len = 0
        self.cr = False
        """The last read ended in ``\r``: a ``\n`` that starts the next ends the same line."""

    def feed(self, chunk: bytes) -> bytes:
        """The whole events ``chunk`` completes, normalized, ready to forward (possibly empty)."""
        if not chunk:
            return b""  # (a pending \r stays pending)
        if self.cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self.cr = chunk[-1:] == b"\r"
        chunk = normalize(chunk)
        cut = last_boundary(chunk)
        if cut < 0:
            if self.carry and chunk[:1] == b"\n" and self.carry[-1][-1:] == b"\n":
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
        return out

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream (an unterminated last event)."""
        rest = b"".join(self.carry)
        self.carry, self.carry_len = [], 0
        return rest


class EventTooLarge(Exception):
    """The stream sent more than ``max_event_bytes`` without ending an event."""
