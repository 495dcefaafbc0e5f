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
    __slots__ = ("done", "events", "framer", "running", "strip_running", "strip_usage", "usage")

    def __init__(
        self, strip_usage: bool, max_event_bytes: int = 1 << 20, strip_running: bool = False
    ) -> None:
        self.strip_usage = strip_usage
        self.strip_running = strip_running
        """Take the running usage off every token chunk (the gateway asked for it, the client did not)."""
        self.framer = Framer(max_event_bytes)
        self.events = 0
        """Data events that carried choices (≈ tokens generated)."""
        self.usage: int | None = None
        """``usage.completion_tokens`` as the backend last sent it: the whole answer's once the usage
        event has passed (unchecked: see :func:`plausible_usage`)."""
        self.running: int | None = None
        """The backend's own count of the tokens generated so far, from the running usage on the
        last token chunk relayed (``continuous_usage_stats``; None: not sent)."""
        self.done = False
        """``data: [DONE]`` has passed."""

    def feed(self, chunk: bytes) -> bytes:
        """The whole events completed by ``chunk``, ready to forward (possibly empty)."""
        out = self.framer.feed(chunk)
        if not out:
            return out
        one_line = out[:7] == b"data: {" and out.find(b"\n") == len(out) - 2
        if one_line:
            if not _has_usage(out):  # the usual read: one token event, counted without a split
                self.events += 1
                return out
            if b'"choices":[{' in out:  # a token event with the running usage (vLLM's compact JSON)
                kept, count = running_usage(out, self.strip_running)
                if count is not None:
                    self.events += 1
                    self.usage = self.running = count
                    return kept
        kept_events: list[bytes] | None = None  # the events to forward, once one is changed (None: all)
        n = 0
        for i, event in enumerate(evs := events(out)):
            payload = data(event)
            keep: bytes | None = event
            if payload == DONE:
                self.done = True
            elif payload is not None:
                n += 1
                if _has_usage(payload):
                    if not self._counts(payload):
                        n -= 1  # a usage-only event is not a token
                        keep = None if self.strip_usage else event
                    elif self.strip_running:
                        keep = running_usage(event, True)[0]
            if keep is not event and kept_events is None:
                kept_events = evs[:i]
            if kept_events is not None and keep is not None:
                kept_events.append(keep)
        self.events += n
        if kept_events is None:
            return out
        return b"".join(e + b"\n\n" for e in kept_events)

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
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        choices = bool(obj.get("choices"))
        if isinstance(tokens, int):
            self.usage = tokens
            if choices:
                self.running = tokens
        return choices


_USAGE_KEY = b'"usage":'
_COMPLETION_KEY = b'"completion_tokens":'


def running_usage(event: bytes, strip: bool) -> tuple[bytes, int | None]:
    """A token event's running ``usage.completion_tokens`` and the event without its ``usage``
    member (``strip``), by bytes (no JSON parse per token: the member is the event's last, as vLLM
    writes it; ``"usage":`` cannot occur in a JSON string unescaped). ``(event, None)`` if not found."""
    i = event.rfind(_USAGE_KEY)
    j = event.find(b"{", i) if i >= 0 else -1
    if j < 0:
        return event, None
    depth, k = 1, j + 1
    while depth:  # the member's closing brace (its details may nest one more object)
        close = event.find(b"}", k)
        if close < 0:
            return event, None
        depth += event.count(b"{", k, close) - 1
        k = close + 1
    c = event.find(_COMPLETION_KEY, j, k)
    count = None
    if c >= 0:
        digits = event[c + len(_COMPLETION_KEY) : k].lstrip()
        end = 0
        while end < len(digits) and 48 <= digits[end] <= 57:
            end += 1
        count = int(digits[:end]) if end else None
    if not strip or count is None:
        return event, count
    head = event[:i].rstrip()
    if not head.endswith(b","):
        return event, count  # not the last member after all: leave it
    return head[:-1] + event[k:], count
