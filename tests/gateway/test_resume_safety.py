"""A resume never corrupts an answer: a broken stream goes on elsewhere only when everything the
client was sent can be carried in text; otherwise it ends with an explicit error event."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from sagegate.gateway.continuation import Transcript, unresumable
from sagegate.gateway.openai_schema import Route
from tests.gateway.test_pause_resume import MESSAGES, client, gateway, pauses, settled, sim_backend
from tests.gateway_support import FakeBackend, ServerThread, fleet, wait_until

PLAIN = {"model": "m", "messages": MESSAGES}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({}, None),
        ({"tools": [TOOL]}, "tools"),
        ({"tools": [TOOL], "tool_choice": "none"}, None),
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": False}, None),
        ({"top_logprobs": 3}, "logprobs"),
        ({"n": 2}, "several choices (n > 1)"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "constrained output"),
        ({"response_format": {"type": "text"}}, None),
        ({"guided_json": {"type": "object"}}, "constrained output"),
        ({"return_token_ids": True}, "token ids"),
    ],
)
def test_what_a_text_continuation_cannot_carry_is_never_resumed(
    extra: dict[str, Any], why: str | None
) -> None:
    assert unresumable(Route.CHAT, {**PLAIN, **extra}) == why


def test_completions_whose_prompt_text_cannot_be_extended() -> None:
    route = Route.COMPLETIONS
    assert unresumable(route, {"model": "m", "prompt": "hi"}) is None
    assert unresumable(route, {"model": "m", "prompt": ["hi"]}) is None
    assert unresumable(route, {"model": "m", "prompt": "hi", "echo": True}) == "echo"
    assert unresumable(route, {"model": "m", "prompt": [1, 2, 3]}) == "a token-id prompt"
    assert unresumable(route, {"model": "m", "prompt": "hi", "logprobs": 0}) == "logprobs"


def _event(delta: dict[str, Any], logprobs: Any = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": None}
    return b"data: " + json.dumps({"id": "c", "choices": [choice]}).encode() + b"\n\n"


@pytest.mark.parametrize(
    ("event", "kept"),
    [
        (_event({"content": " more"}), None),
        (_event({"reasoning_content": "let me think"}), "reasoning"),
        (_event({"reasoning": "let me think"}), "reasoning"),
        (_event({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}), "a tool call"),
        (_event({"content": " x"}, {"content": [{"token": " x", "logprob": -0.1}]}), "logprobs"),
    ],
)
def test_a_transcript_knows_when_the_client_was_sent_more_than_text(event: bytes, kept: str | None) -> None:
    t = Transcript(Route.CHAT, dict(PLAIN))
    t.relay(_event({"role": "assistant", "content": ""}) + _event({"content": "Hello"}))
    t.relay(event)
    assert t.carried() is (kept is None)
    assert t.uncarried == kept


@pytest.mark.heavy
@pytest.mark.parametrize("kind", ["reasoning", "tools"])
def test_a_broken_stream_that_cannot_be_carried_ends_with_an_explicit_error(kind: str) -> None:
    """Its backend dies after the client was sent reasoning (seen in the stream) or while tools were
    offered (known from the body): the client gets what was sent and an error event naming why, and
    no other backend is asked to make up the rest."""
    first = {"reasoning_content": "thinking"} if kind == "reasoning" else {}
    fake = FakeBackend(
        mode="midstream", tokens=60, die_after=10, delay_s=0.03, model="sim", first_delta=first
    )
    with ServerThread(fake.app) as dying, sim_backend() as good:
        backends = [{"url": dying.url, "capacity_tokens": 10**6}, {"url": good.url, "capacity_tokens": 10**4}]
        with gateway([], backends=backends, pause={"enabled": False}) as gw:
            wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="gateway ready")
            extra: dict[str, Any] = {"tools": [TOOL]} if kind == "tools" else {}
            stream = client(gw.url).chat.completions.create(
                model="sim",
                messages=MESSAGES,
                max_tokens=60,
                stream=True,
                **extra,  # type: ignore[arg-type]
            )
            chunks: list[Any] = []
            match = "cannot be resumed" if kind == "reasoning" else "failed mid-stream"
            with pytest.raises(openai.APIError, match=match):
                chunks.extend(stream)
            assert 0 < len(chunks) <= 10
            assert pauses(gw.url, "recovered") == 0
            wait_until(lambda: settled(gw), what="every reservation released")


def test_a_stream_that_may_be_continued_asks_for_the_running_usage_unless_told_not_to() -> None:
    """``upstream.running_usage`` (on): a resumable stream asks its backend for the running usage;
    off (a backend that refuses the field), the body goes as the client sent it."""
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    for on in (True, False):
        with fleet({}, upstream={"running_usage": on}) as (fakes, url):
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
                text = b"".join(r.iter_bytes())
            sent = fakes[0].state.bodies[-1].get("stream_options") or {}
            assert sent.get("continuous_usage_stats", False) is on
            assert b"usage" not in text  # the client asked for none
