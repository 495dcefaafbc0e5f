"""Server-sent events as the replay client reads them: split across reads, classified per event."""

from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from sagegate.loadgen.sse import DONE, ERROR, OTHER, TOKEN, USAGE, EventSplitter, classify


def _ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


STREAM = (
    _ev({"choices": [{"index": 0, "text": " a"}]})
    + _ev({"choices": [{"index": 0, "text": " b"}]})
    + _ev({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    + b"data: [DONE]\n\n"
)


@given(st.lists(st.integers(1, len(STREAM) - 1), unique=True, max_size=12))
def test_events_survive_any_split_of_the_byte_stream(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    splitter = EventSplitter()
    payloads = [p for a, b in itertools.pairwise(bounds) for p in splitter.feed(STREAM[a:b])]
    assert [classify(p, chat=False).kind for p in payloads] == [TOKEN, TOKEN, USAGE, DONE]


def test_crlf_and_comment_lines() -> None:
    payloads = EventSplitter().feed(b": keep-alive\r\n\r\ndata: [DONE]\r\n\r\n")
    assert payloads == [b"[DONE]"]


def test_classify() -> None:
    role = json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}).encode()
    assert classify(role, chat=True).kind == OTHER
    assert classify(role, chat=False).kind == TOKEN
    word = json.dumps({"choices": [{"index": 0, "delta": {"content": "hi"}}]}).encode()
    assert classify(word, chat=True).kind == TOKEN
    last = json.dumps({"choices": [{"index": 0, "text": "x"}], "usage": {"completion_tokens": 9}}).encode()
    ev = classify(last, chat=False)
    assert ev.kind == TOKEN and ev.usage == {"completion_tokens": 9}
    err = classify(json.dumps({"error": {"message": "overloaded"}}).encode(), chat=False)
    assert err.kind == ERROR and err.message == "overloaded"
    assert classify(b"not json", chat=False).kind == ERROR


@given(st.text(max_size=40), st.booleans())
def test_token_chunks_whatever_their_text(text: str, chat: bool) -> None:
    choice = {"index": 0, "delta": {"content": text or "x"}} if chat else {"index": 0, "text": text}
    compact = json.dumps({"choices": [choice]}, separators=(",", ":")).encode()
    spaced = json.dumps({"choices": [choice]}).encode()
    assert classify(compact, chat).kind == classify(spaced, chat).kind == TOKEN
