"""Gateway-level pause with transparent resume (issue 17, part 2): real simulated backends over
loopback, the official ``openai`` client, pauses asked through ``POST /admin/requests/{id}/pause``.

The simulated model writes a deterministic text (``sim.server_api.filler_word``) and continues a
prompt that ends in its own text from where it stopped, as a greedy vLLM would; so a paused answer
must equal the unpaused one token for token.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from sagegate.core.distribution import LengthDistribution
from sagegate.core.request import FORCED_OUTPUT_FIELD
from sagegate.gateway.app import create_app
from sagegate.gateway.continuation import Transcript, pausable
from sagegate.policies.admission import AdmissionConfig, Charge
from sagegate.sim.config import EngineConfig
from sagegate.sim.engine import Engine
from sagegate.sim.engine_request import EngineRequest
from sagegate.sim.hardware import get_gpu, get_model
from sagegate.sim.perf import PerfModel
from sagegate.sim.server import BackendSettings
from sagegate.sim.server import create_app as backend_app
from sagegate.sim.server_api import filler_word, written_before
from tests.gateway_support import FakeBackend, ServerThread, admin, idle, settings_for, wait_until

ADMIN = {"authorization": "Bearer admin-secret"}
PERF = PerfModel(get_model("llama-3.1-8b"), get_gpu("h100"))
PROMPT = "Tell me a story about a gateway."
MESSAGES = [{"role": "user", "content": PROMPT}]


def sim_backend(time_scale: float = 1.0) -> ServerThread:
    cfg = EngineConfig()
    return ServerThread(
        backend_app(BackendSettings(engine=cfg, served_model_name="sim", time_scale=time_scale))
    )


def gateway(urls: list[str], **kw: Any) -> ServerThread:
    kw.setdefault("pause", {"enabled": True, "max_pauses": 2})
    return ServerThread(create_app(settings_for(urls, **kw)))


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def pause(url: str, rid: str) -> httpx.Response:
    return httpx.post(f"{url}/admin/requests/{rid}/pause", headers=ADMIN, timeout=10)


def pauses(url: str, event: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(f'sagegate_pauses_total{{event="{event}"}}'):
            return float(line.split()[-1])
    return 0.0


def settled(gw: ServerThread) -> bool:
    """Nothing queued, in flight or reserved, no request alive in the gateway, and every backend's
    held prompt and generated tokens back to zero (each try's accounted and released once)."""
    state = gw.app.state.gateway
    held = [(b.held_prompt, b.held_generated) for b in state.pool.backends]
    return idle(gw.url) and not state.director.lifecycles and all(h == (0, 0) for h in held)


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[ServerThread, list[ServerThread]]]:
    with sim_backend() as b1, sim_backend() as b2, gateway([b1.url, b2.url]) as gw:
        wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="gateway ready")
        yield gw, [b1, b2]


def running_rid(gw: ServerThread) -> str:
    """The id of the one request being streamed from a backend (as ``/admin/queue`` lists it)."""
    wait_until(lambda: len(admin(gw.url)["pausable"]) == 1, what="a running request")
    return str(admin(gw.url)["pausable"][0]["id"])


def stream_with_pauses(
    gw: ServerThread, chat: bool, at: tuple[int, ...], max_tokens: int, usage: bool = True
) -> tuple[list[Any], list[int]]:
    """Stream one request, pausing it once its client has read each count of chunks in ``at``."""
    c = client(gw.url)
    args: dict[str, Any] = {"model": "sim", "max_tokens": max_tokens, "stream": True}
    if usage:
        args["stream_options"] = {"include_usage": True}
    if chat:
        raw = c.chat.completions.with_raw_response.create(messages=MESSAGES, **args)  # type: ignore[call-overload]
    else:
        raw = c.completions.with_raw_response.create(prompt=PROMPT, **args)  # type: ignore[call-overload]
    rid = raw.headers["x-sagegate-request-id"]
    chunks: list[Any] = []
    statuses: list[int] = []
    for chunk in raw.parse():
        chunks.append(chunk)
        if len(chunks) in at:
            # a resumed try first: chunks read ahead of a pause reach the client while it is paused
            wait_until(lambda: rid in gw.app.state.gateway.dispatcher.pausable or settled(gw), what="resumed")
            statuses.append(pause(gw.url, rid).status_code)
    return chunks, statuses


def text_of(chunks: list[Any], chat: bool) -> str:
    if chat:
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return "".join(c.choices[0].text for c in chunks if c.choices)


@pytest.mark.heavy
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("at", [(3,), (3, 12)], ids=["one-pause", "two-pauses"])
def test_a_paused_stream_is_the_unpaused_one(
    stack: tuple[ServerThread, list[ServerThread]], chat: bool, at: tuple[int, ...]
) -> None:
    gw, _ = stack
    ref, _ = stream_with_pauses(gw, chat, (), 200)
    before = pauses(gw.url, "resumed")
    got, statuses = stream_with_pauses(gw, chat, at, 200)
    assert statuses == [200] * len(at)
    assert pauses(gw.url, "resumed") - before == len(at)
    assert text_of(got, chat) == text_of(ref, chat) and len(text_of(got, chat).split()) == 200
    assert len({c.id for c in got}) == 1 and len({c.created for c in got}) == 1
    assert {c.model for c in got} == {"sim"}
    used = [c.usage for c in got if c.usage is not None]
    ref_usage = next(c.usage for c in ref if c.usage is not None)
    assert len(used) == 1
    assert used[0].completion_tokens == 200 and used[0].prompt_tokens == ref_usage.prompt_tokens
    assert used[0].total_tokens == ref_usage.total_tokens
    finishes = [c.choices[0].finish_reason for c in got if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    if chat:  # one opening role chunk, as unpaused
        roles = [c for c in got if c.choices and c.choices[0].delta.role]
        assert len(roles) == 1
    wait_until(lambda: settled(gw), what="every reservation released")


@pytest.mark.heavy
def test_without_usage_asked_no_usage_reaches_the_client(
    stack: tuple[ServerThread, list[ServerThread]],
) -> None:
    gw, _ = stack
    got, statuses = stream_with_pauses(gw, True, (4,), 150, usage=False)
    assert statuses == [200]
    assert all(c.usage is None for c in got)
    assert len(text_of(got, True).split()) == 150
    wait_until(lambda: settled(gw), what="every reservation released")


@pytest.mark.heavy
def test_the_forced_length_counts_from_the_response_start(
    stack: tuple[ServerThread, list[ServerThread]],
) -> None:
    """A replay's true length (sent to the simulated backend only) is the whole answer's: a resumed
    request ends where the unpaused one would, though the gateway never reads the field."""
    gw, _ = stack
    c = client(gw.url)
    raw = c.completions.with_raw_response.create(
        model="sim", prompt=PROMPT, max_tokens=400, stream=True, extra_body={FORCED_OUTPUT_FIELD: 120}
    )
    rid = raw.headers["x-sagegate-request-id"]
    chunks = []
    for chunk in raw.parse():
        chunks.append(chunk)
        if len(chunks) == 5:
            assert pause(gw.url, rid).status_code == 200
    assert len(text_of(chunks, False).split()) == 120


@pytest.mark.heavy
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_a_paused_whole_answer_is_the_unpaused_one(
    stack: tuple[ServerThread, list[ServerThread]], chat: bool
) -> None:
    gw, _ = stack
    c = client(gw.url)

    def ask() -> Any:
        if chat:
            return c.chat.completions.create(model="sim", messages=MESSAGES, max_tokens=60)  # type: ignore[arg-type]
        return c.completions.create(model="sim", prompt=PROMPT, max_tokens=60)

    ref = ask()
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(ask()), daemon=True)
    t.start()
    rid = running_rid(gw)
    time.sleep(0.05)
    assert pause(gw.url, rid).status_code == 200
    t.join(30)
    got = out[0]

    def text(r: Any) -> str:
        return str(r.choices[0].message.content if chat else r.choices[0].text)

    assert text(got) == text(ref)
    assert got.usage.completion_tokens == 60 and got.usage.prompt_tokens == ref.usage.prompt_tokens
    assert got.choices[0].finish_reason == "length"
    assert pauses(gw.url, "resumed") >= 1
    wait_until(lambda: settled(gw), what="every reservation released")


@pytest.mark.heavy
def test_a_resumed_streams_usage_is_an_unbroken_ones(stack: tuple[ServerThread, list[ServerThread]]) -> None:
    """The usage a resumed stream reports is the backend's count of the client's prompt and every
    token sent, whatever the gateway's own count (a long prompt's is an estimate) makes of it."""
    gw, _ = stack
    c = client(gw.url)
    words = " ".join(f"item{i * 7919 % 10007}: {'ok' if i % 3 else 'no'}" for i in range(2_500))
    messages = [{"role": "user", "content": "Summarise this log. " + words}]  # ~30k characters

    def ask(pause_after: int | None) -> Any:
        raw = c.chat.completions.with_raw_response.create(
            model="sim", messages=messages, max_tokens=40, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
        )  # fmt: skip
        usage = None
        for i, chunk in enumerate(raw.parse()):
            if i == pause_after:
                assert pause(gw.url, raw.headers["x-sagegate-request-id"]).status_code == 200
            usage = chunk.usage or usage
        return usage

    ref = ask(None)
    got = ask(3)
    assert pauses(gw.url, "resumed") >= 1
    assert (got.prompt_tokens, got.completion_tokens) == (ref.prompt_tokens, 40)
    wait_until(lambda: settled(gw), what="every reservation released")


@pytest.mark.heavy
@pytest.mark.parametrize("paused", [False, True], ids=["streaming", "paused-first"])
def test_a_backend_that_dies_mid_stream_loses_no_request(paused: bool) -> None:
    """Its backend dies mid-stream (perhaps after it was paused and resumed there): it goes on on the
    other backend as a pause would, and the client gets the whole answer, one stream, once."""
    fake = FakeBackend(mode="midstream", tokens=60, die_after=10, delay_s=0.03, model="sim")
    with ServerThread(fake.app) as dying, sim_backend() as good:
        backends = [{"url": dying.url, "capacity_tokens": 10**6}, {"url": good.url, "capacity_tokens": 10**4}]
        with gateway([], backends=backends) as gw:
            wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="gateway ready")
            raw = client(gw.url).chat.completions.with_raw_response.create(
                model="sim", messages=MESSAGES, max_tokens=60, stream=True,  # type: ignore[arg-type]
                stream_options={"include_usage": True},
            )  # fmt: skip
            rid = raw.headers["x-sagegate-request-id"]
            chunks = []
            for chunk in raw.parse():
                chunks.append(chunk)
                if paused and len(chunks) == 3:
                    assert pause(gw.url, rid).status_code == 200
            assert len(text_of(chunks, True).split()) == 60
            assert len({c.id for c in chunks}) == 1
            assert [c.usage.completion_tokens for c in chunks if c.usage] == [60]
            assert pauses(gw.url, "recovered") == 1
            if paused:  # the resume went back to the backend with most room, as a continuation
                last = fake.state.bodies[-1]
                assert last["messages"][-1]["role"] == "assistant" and last["continue_final_message"] is True
            wait_until(lambda: settled(gw), what="every reservation released")


@pytest.mark.heavy
@pytest.mark.parametrize("resume", [True, False], ids=["default", "resume_broken-off"])
def test_a_broken_stream_resumes_by_default_with_pausing_off(resume: bool) -> None:
    """With pausing off (the default) a stream its backend broke still goes on elsewhere
    (``pause.resume_broken``, on by default); turned off, the client gets the tokens sent so far and an
    OpenAI-style error event, and nothing is left reserved either way."""
    fake = FakeBackend(mode="midstream", tokens=60, die_after=10, delay_s=0.03, model="sim")
    with ServerThread(fake.app) as dying, sim_backend() as good:
        backends = [{"url": dying.url, "capacity_tokens": 10**6}, {"url": good.url, "capacity_tokens": 10**4}]
        pause_settings = {"enabled": False} if resume else {"enabled": False, "resume_broken": False}
        with gateway([], backends=backends, pause=pause_settings) as gw:
            wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="gateway ready")
            assert pause(gw.url, "any").status_code == 409  # pausing itself stays off
            stream = client(gw.url).chat.completions.create(
                model="sim", messages=MESSAGES, max_tokens=60, stream=True,  # type: ignore[arg-type]
                stream_options={"include_usage": True},
            )  # fmt: skip
            chunks: list[Any] = []
            if resume:
                chunks.extend(stream)
                assert len(text_of(chunks, True).split()) == 60
                assert [c.usage.completion_tokens for c in chunks if c.usage] == [60]
                assert pauses(gw.url, "recovered") == 1
            else:
                with pytest.raises(openai.APIError, match="failed mid-stream"):
                    chunks.extend(stream)
                assert 0 < len(text_of(chunks, True).split()) < 60
                assert pauses(gw.url, "recovered") == 0
            wait_until(lambda: settled(gw), what="every reservation released")


@pytest.mark.heavy
def test_a_resume_that_fails_everywhere_ends_at_once_with_an_error_event() -> None:
    """The resume runs the gateway's one retry loop: when the only other backend refuses the
    continuation, no backend is left to try, and the client hears it now (not at the queue's
    timeout), with what failed; nothing stays reserved."""
    dying = FakeBackend(mode="midstream", tokens=60, die_after=10, delay_s=0.03, model="sim")
    refusing = FakeBackend(mode="fail500", model="sim")
    with ServerThread(dying.app) as a, ServerThread(refusing.app) as b:
        backends = [{"url": a.url, "capacity_tokens": 10**6}, {"url": b.url, "capacity_tokens": 10**4}]
        with gateway([], backends=backends, queue={"max_wait_s": 60}) as gw:
            wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="gateway ready")
            stream = client(gw.url).chat.completions.create(
                model="sim",
                messages=MESSAGES,
                max_tokens=60,
                stream=True,  # type: ignore[arg-type]
            )
            chunks: list[Any] = []
            with pytest.raises(openai.APIError, match=r"could not resume: .*HTTP 500"):
                chunks.extend(stream)
            assert 0 < len(text_of(chunks, True).split()) < 60
            assert pauses(gw.url, "recovered") == 1 and pauses(gw.url, "failed") == 1
            assert len(refusing.state.bodies) == 1  # tried once: the dying backend was excluded
            wait_until(lambda: settled(gw), what="every reservation released")


def _blocked(**kw: Any) -> tuple[ServerThread, ServerThread]:
    """One backend, one request at a time, earliest deadline first: a paused request waits in the
    queue while a request with a deadline runs."""
    be = sim_backend(time_scale=0.5)
    gw = gateway(
        [],
        backends=[{"url": be.url, "capacity_tokens": 700}],
        policy="edf",
        admission={"rule": "sum", "target": 1.0, "unknown_output": 400},
        **kw,
    )
    return be, gw


def _hold_paused(gw: ServerThread) -> tuple[Any, str, threading.Thread]:
    """A streams; B (with a deadline) waits; A is paused, B runs, A waits paused in the queue."""
    c = client(gw.url)
    raw = c.completions.with_raw_response.create(model="sim", prompt=PROMPT, max_tokens=400, stream=True)
    rid = raw.headers["x-sagegate-request-id"]
    stream = raw.parse()
    next(iter(stream))
    hold = threading.Thread(
        target=lambda: httpx.post(
            gw.url + "/v1/completions",
            json={"model": "sim", "prompt": "urgent", "max_tokens": 300},
            headers={"x-deadline-ms": "100"},
            timeout=60,
        ),
        daemon=True,
    )
    hold.start()
    wait_until(lambda: len(gw.app.state.gateway.queue) == 1, what="B queued")
    assert pause(gw.url, rid).status_code == 200
    state = gw.app.state.gateway
    wait_until(
        lambda: len(state.queue) == 1 and rid not in state.dispatcher.pausable, what="A paused, queued"
    )
    return stream, rid, hold


@pytest.mark.heavy
def test_a_client_that_leaves_while_paused_is_withdrawn() -> None:
    be, gw = _blocked()
    with be, gw:
        stream, rid, hold = _hold_paused(gw)
        engine = be.app.state.backend.engine
        wait_until(lambda: engine.num_running == 1, what="only B on the backend: A's KV is free")
        stream.close()  # A's client leaves while A waits paused
        wait_until(lambda: len(gw.app.state.gateway.queue) == 0, what="A withdrawn")
        hold.join(60)
        wait_until(lambda: settled(gw), what="every reservation released")
        assert pause(gw.url, rid).status_code == 404


@pytest.mark.heavy
def test_a_pause_asked_while_the_client_leaves_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client leaves mid-stream and a pause arrives while its reader is still closing the
    upstream (the relay's stop yields there): the pause is refused, and nothing is left queued,
    reserved or running (a pause accepted there queued a continuation nobody read: once dispatched,
    its task raised ``LifecycleError``; else it sat in the queue until ``max_wait_s``)."""
    import sagegate.gateway.stream as stream_module
    from sagegate.gateway.resume import PauseVerdict

    real_close = stream_module.close_quietly
    verdicts: list[PauseVerdict] = []
    target: dict[str, Any] = {}

    async def close_then_pause(resp: httpx.Response) -> None:
        task = asyncio.current_task()
        if task is not None and task.cancelling() and "rid" in target and not verdicts:
            verdicts.append(target["state"].dispatcher.try_pause(target["rid"]))
        await real_close(resp)

    monkeypatch.setattr(stream_module, "close_quietly", close_then_pause)
    with sim_backend() as be, gateway([be.url]) as gw:
        state = gw.app.state.gateway
        raw = client(gw.url).completions.with_raw_response.create(
            model="sim", prompt=PROMPT, max_tokens=400, stream=True
        )
        stream = raw.parse()
        chunks = iter(stream)
        for _ in range(3):
            next(chunks)
        sse = next(iter(state.proxy.streams))
        assert sse.task is not None
        loop = sse.task.get_loop()
        target.update(state=state, rid=raw.headers["x-sagegate-request-id"])
        stream.close()  # the client leaves
        wait_until(lambda: bool(verdicts), what="a pause asked while the reader stops")
        assert verdicts[0] is not PauseVerdict.PAUSED, verdicts
        wait_until(lambda: settled(gw), what="every reservation released")

        async def resumers() -> list[str]:
            return [repr(t.get_coro()) for t in asyncio.all_tasks() if "_resume" in repr(t.get_coro())]

        assert asyncio.run_coroutine_threadsafe(resumers(), loop).result(5) == []
        assert pauses(gw.url, "paused") == 0


@pytest.mark.heavy
def test_a_paused_request_that_waits_too_long_ends_with_an_error_event() -> None:
    # The bound holds B too, queued until A's pause: 2 s leaves that wait room on a loaded machine
    # (0.5 s did not: B timed out, and A, alone, resumed), and B's 300 tokens take ~4 s at this scale.
    be, gw = _blocked(queue={"max_wait_s": 2.0})
    with be, gw:
        stream, _, hold = _hold_paused(gw)
        with pytest.raises(openai.APIError, match="waited too long"):
            for _ in stream:
                pass
        hold.join(60)
        wait_until(lambda: settled(gw), what="every reservation released")


@pytest.mark.heavy
def test_a_drain_ends_a_paused_request_cleanly() -> None:
    be, gw = _blocked()
    with be, gw:
        stream, _, hold = _hold_paused(gw)
        state = gw.app.state.gateway
        task = next(iter(state.proxy.streams)).task
        assert task is not None
        task.get_loop().call_soon_threadsafe(state.director.close_all)  # the drain deadline
        with pytest.raises(openai.APIError, match="shutting down"):
            for _ in stream:
                pass
        hold.join(60)
        assert not gw.app.state.gateway.director.lifecycles


@pytest.mark.heavy
def test_pause_bounds_and_bad_input(stack: tuple[ServerThread, list[ServerThread]]) -> None:
    gw, _ = stack
    assert pause(gw.url, "no-such-request").status_code == 404
    assert pause(gw.url, "no-such-request").json()["error"]["code"] == "not_found"
    r = httpx.post(gw.url + "/admin/requests/1/pause", timeout=5)
    assert r.status_code == 403
    # a third pause is refused (max_pauses 2): the request runs on to its end
    chunks, statuses = stream_with_pauses(gw, False, (3, 8, 14), 300)
    assert statuses == [200, 200, 409]
    assert len(text_of(chunks, False).split()) == 300
    # a finished request cannot be paused
    rid = client(gw.url).completions.with_raw_response.create(model="sim", prompt=PROMPT, max_tokens=3)
    assert pause(gw.url, rid.headers["x-sagegate-request-id"]).status_code == 404


@pytest.mark.heavy
def test_pausing_is_off_by_default() -> None:
    with sim_backend() as be, gateway([be.url], pause={}) as gw:
        c = client(gw.url)
        raw = c.completions.with_raw_response.create(model="sim", prompt=PROMPT, max_tokens=50, stream=True)
        rid = raw.headers["x-sagegate-request-id"]
        r = pause(gw.url, rid)
        assert r.status_code == 409 and r.json()["error"]["code"] == "pause_disabled"
        assert len(text_of(list(raw.parse()), False).split()) == 50


# --- the pieces on their own ------------------------------------------------------------------------
def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunks(rid: str, created: int, *deltas: dict[str, Any]) -> bytes:
    return b"".join(
        _sse({"id": rid, "created": created, "model": "m", "choices": [{"index": 0, "delta": d}]})
        for d in deltas
    )


def _usage_event(prompt: int, completion: int) -> bytes:
    """A resumed try's (``id`` y) final usage event."""
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return _sse({"id": "y", "created": 2, "model": "m", "choices": [], "usage": usage})


def test_a_continuation_carries_the_text_and_the_rest_of_the_caps() -> None:
    chat = Transcript(
        "chat", {"model": "m", "messages": MESSAGES, "max_completion_tokens": 50, "min_tokens": 3}
    )
    role = {"role": "assistant", "content": ""}
    chat.relay(_chunks("x", 1, role, {"content": " a"}, {"content": " b"}))
    chat.read()
    body = chat.continuation()
    assert body["messages"] == [*MESSAGES, {"role": "assistant", "content": " a b"}]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_completion_tokens"] == 48 and body["min_tokens"] == 1
    chat.resumed(4)
    again = chat.relay(_chunks("y", 2, role, {"content": " c"}) + _usage_event(12, 1) + b"data: [DONE]\n\n")
    assert again.count(b'"id":"x"') == 2 and b'"role"' not in again and b"[DONE]" in again
    assert chat.usage == {"prompt_tokens": 8, "completion_tokens": 3, "total_tokens": 11}
    done = Transcript("completions", {"model": "m", "prompt": ["p"]})
    done.relay(b'data: {"id":"x","choices":[{"index":0,"text":" a","finish_reason":null}]}\n\n')
    done.read()
    assert done.continuation()["prompt"] == "p a" and done.continuation()["max_tokens"] == 15
    assert not pausable("completions", {"prompt": [1, 2, 3]}) and not pausable(
        "chat", {"messages": [], "n": 1}
    )
    assert not pausable("completions", {"prompt": "p", "echo": True}) and not pausable(
        "chat", {"messages": MESSAGES, "n": 2}
    )


def test_tokens_an_engine_held_back_are_counted_by_its_own_running_usage() -> None:
    """An engine sends no chunk for a token whose text is not yet whole (a character split over two
    tokens): 2 chunks relayed, 3 tokens generated. Told the backend's running count, the
    continuation asks for 50 − 3 more and the usage the client sees counts every token of both
    tries, the second by its own backend's count."""
    chat = Transcript("chat", {"model": "m", "messages": MESSAGES, "max_tokens": 50})
    role = {"role": "assistant", "content": ""}
    chat.relay(_chunks("x", 1, role, {"content": " a"}, {"content": " éb"}))
    chat.read()
    assert chat.tokens == 2  # the chunks alone
    chat.counted(3)
    assert chat.continuation()["max_tokens"] == 47
    chat.resumed(4)
    chat.relay(_chunks("y", 2, role, {"content": " c"}, {"content": " d"}) + _usage_event(12, 5))
    assert chat.usage is not None and chat.usage["completion_tokens"] == 8  # 3 + the second's 5


def test_a_continuation_is_charged_as_the_request_it_continues() -> None:
    cfg = AdmissionConfig()
    dist = LengthDistribution.from_samples([10, 50, 200])
    original = Charge(20, dist, cfg)
    original.update(30)
    fresh = Charge(20, dist, cfg)
    fresh.update(30)  # what Dispatcher._charge builds for a continuation that has generated 30
    assert (fresh.value, fresh.held, fresh.remaining) == (original.value, original.held, original.remaining)
    assert fresh.held == 50 and fresh.remaining > 0


@pytest.mark.heavy
def test_the_simulated_backend_continues_its_own_text() -> None:
    text = "".join(filler_word(i) for i in range(13))
    assert written_before("a prompt" + text) == 13
    assert written_before("a prompt") == 0 and written_before("x ipsum dolor") == 0
    assert written_before(" lorem ipsum lorem ipsum dolor") == 3
    with sim_backend(time_scale=50.0) as be:
        r = httpx.post(be.url + "/v1/chat/completions", json={
            "messages": [*MESSAGES, {"role": "assistant", "content": text}], "max_tokens": 4,
            "continue_final_message": True, "add_generation_prompt": True,
        }, timeout=10)  # fmt: skip
        assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"
        r = httpx.post(be.url + "/v1/chat/completions", json={
            "messages": [*MESSAGES, {"role": "assistant", "content": text}], "max_tokens": 4,
            "continue_final_message": True, "add_generation_prompt": False, FORCED_OUTPUT_FIELD: 15,
        }, timeout=10)  # fmt: skip
        out = r.json()
        assert out["choices"][0]["message"]["content"] == "".join(filler_word(i) for i in range(13, 15))
        assert out["usage"]["completion_tokens"] == 2


def test_a_resumed_prompt_finds_the_paused_output_cached() -> None:
    """As in vLLM, the full blocks a request's output filled stay cached when it is aborted (the
    simulated backend keys them by the text it will write): the continuation prefills only the rest."""
    engine = Engine(PERF, EngineConfig())
    text = "".join(chr(65 + (i * 7) % 26) for i in range(128 * 4))  # 4 characters a token: 64 + 64
    paused = EngineRequest(0, 0.0, 64, 64, prompt=text)
    paused.keys = (None, text, 128)
    engine.add(paused, 0.0)
    now = 0.0
    while paused.generated < 40:
        step = engine.schedule(now, horizon=now + 0.005)  # a few decode steps at a time
        now += step.duration
        engine.complete(step, now)
    engine.abort(paused, now)
    held = 64 + paused.generated
    resumed = EngineRequest(1, now, held, 128 - held, prompt=text)
    resumed.keys = (None, text, 128)
    engine.add(resumed, now)
    engine.schedule(now)
    assert resumed.cached_tokens == (held - 1) // 16 * 16 > 64  # past the prompt's own blocks


@pytest.mark.heavy
def test_random_pauses_under_concurrency_lose_nothing_and_release_everything() -> None:
    """Twelve clients at once (both routes, streamed and not, some leaving early) while an operator
    pauses whatever is running: every finished answer is whole, and nothing is left held."""
    import random

    rng = random.Random(7)
    with (
        sim_backend() as b1,
        sim_backend() as b2,
        # every request shares one of two prompts: placed by room, both backends run some; placed by
        # cache, all stick to one backend, and fewer of the operator's pauses land (2 of 3 wanted, in
        # two of three runs): this test is about pausing, not placement
        gateway(
            [b1.url, b2.url], pause={"enabled": True, "max_pauses": 3}, placement={"mode": "least_loaded"}
        ) as gw,
    ):
        wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="gateway ready")
        results: list[tuple[int, int]] = []
        stop = threading.Event()

        def one(i: int) -> None:
            c, n = client(gw.url), 400 + 20 * i  # long enough for a slow operator to pause several
            chat, stream, leave = i % 2 == 0, i % 3 != 0, i % 5 == 4
            kw: dict[str, Any] = {"model": "sim", "max_tokens": n}
            if stream:
                make = c.chat.completions.create if chat else c.completions.create
                args = {"messages": MESSAGES} if chat else {"prompt": PROMPT}
                chunks = []
                for chunk in make(stream=True, **args, **kw):  # type: ignore[operator]
                    chunks.append(chunk)
                    if leave and len(chunks) == 10:
                        return  # the client goes away mid-answer
                results.append((n, len(text_of(chunks, chat).split())))
            elif chat:
                out = c.chat.completions.create(messages=MESSAGES, **kw)  # type: ignore[arg-type]
                results.append((n, len((out.choices[0].message.content or "").split())))
            else:
                done = c.completions.create(prompt=PROMPT, **kw)
                results.append((n, len(done.choices[0].text.split())))

        def operator() -> None:
            while not stop.is_set():
                running = admin(gw.url)["pausable"]
                if running:
                    pause(gw.url, str(rng.choice(running)["id"]))
                time.sleep(rng.uniform(0.01, 0.08))

        clients = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(12)]
        op = threading.Thread(target=operator, daemon=True)
        op.start()
        for t in clients:
            t.start()
        for t in clients:
            t.join(60)
        stop.set()
        op.join(5)
        left = sum(1 for i in range(12) if i % 5 == 4 and i % 3 != 0)  # streamed clients that leave
        assert len(results) == 12 - left and all(want == got for want, got in results), results
        events = {e: pauses(gw.url, e) for e in ("paused", "recovered", "resumed", "failed")}
        assert events["resumed"] >= 3 and events["failed"] == 0, events
        wait_until(lambda: settled(gw), what="every reservation released")


def test_a_long_first_try_is_folded_into_its_text_as_it_goes() -> None:
    t = Transcript("completions", {"model": "m", "prompt": "p", "max_tokens": 5000})
    event = _sse({"id": "x", "created": 1, "model": "m", "choices": [{"index": 0, "text": " w"}]})
    for _ in range(3000):  # ~270 kB of events
        t.relay(event)
    assert t.unread_bytes <= 64 * 1024
    t.read()
    assert t.tokens == 3000 and t.continuation() == {
        "model": "m",
        "prompt": "p" + " w" * 3000,
        "max_tokens": 2000,
    }
