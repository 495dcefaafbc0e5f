"""Hostile input at the gateway's edge, over real loopback HTTP and raw sockets: bodies nested past
the depth limit, ``NaN``/``Infinity``, bad query parameters, wrong methods, uploads cut short. Each
answer is OpenAI's error shape (or, for a client that left, nothing and no traceback)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import httpx
import pytest

from sagegate.gateway.app import create_app
from sagegate.gateway.jsonbody import depth
from tests.gateway_support import FakeBackend, ServerThread, settings_for, wait_until

pytestmark = pytest.mark.heavy  # a live gateway and backends on loopback


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[ServerThread, FakeBackend]]:
    fake = FakeBackend(tokens=3)
    with ServerThread(fake.app) as be, ServerThread(create_app(settings_for([be.url]))) as gw:
        yield gw, fake


@pytest.fixture(scope="module")
def stack(gateway: tuple[ServerThread, FakeBackend]) -> tuple[str, FakeBackend]:
    gw, fake = gateway
    return gw.url, fake


def _openai_error(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return dict(err)


def test_depth_ignores_brackets_inside_strings() -> None:
    assert depth(b'{"a": [1, {"b": "[[[[{{"}], "c": "\\"]]"}') == 3
    assert depth(b"[" * 1000 + b"]" * 1000) == 1000
    assert depth(b'"just a string"') == 0


@pytest.mark.parametrize("levels", [65, 1000, 100_000])
def test_deeply_nested_body_is_400_not_500(stack: tuple[str, FakeBackend], levels: int) -> None:
    url, fake = stack
    before = fake.state.requests
    raw = (
        b'{"model":"fake","messages":[{"role":"user","content":"hi"}],"x":'
        + b"[" * levels
        + b"]" * levels
        + b"}"
    )
    r = httpx.post(url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    err = _openai_error(r, 400)
    assert "nests deeper than 64" in str(err["message"])
    assert fake.state.requests == before


def test_nesting_within_the_limit_is_forwarded(stack: tuple[str, FakeBackend]) -> None:
    url, fake = stack
    raw = b'{"model":"fake","messages":[{"role":"user","content":"[[[["}],"max_tokens":3,"x":'
    raw += b"[" * 60 + b"]" * 60 + b"}"
    r = httpx.post(url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    forwarded = fake.state.bodies[-1]["x"]
    levels = 0
    while isinstance(forwarded, list):
        levels += 1
        forwarded = forwarded[0] if forwarded else None
    assert levels == 60


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e400", "-2.5E+999"])
def test_nan_and_infinity_are_refused(stack: tuple[str, FakeBackend], constant: str) -> None:
    """Also numbers that overflow to infinity when parsed (``1e400`` was forwarded as ``inf``)."""
    url, fake = stack
    before = fake.state.requests
    raw = f'{{"model":"fake","messages":[{{"role":"user","content":"hi"}}],"temperature":{constant}}}'
    r = httpx.post(url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    err = _openai_error(r, 400)
    assert constant in str(err["message"]) and err["code"] == "invalid_request"
    assert fake.state.requests == before


def test_large_finite_numbers_still_pass(stack: tuple[str, FakeBackend]) -> None:
    url, fake = stack
    raw = '{"model":"fake","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"x":1e300,"y":1e-400}'
    r = httpx.post(url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert fake.state.bodies[-1]["x"] == 1e300 and fake.state.bodies[-1]["y"] == 0.0


def test_bad_query_parameter_is_openai_shaped(stack: tuple[str, FakeBackend]) -> None:
    url, _ = stack
    r = httpx.get(url + "/admin/queue?limit=abc", headers={"authorization": "Bearer admin-secret"})
    err = _openai_error(r, 400)
    assert err["param"] == "limit" and "detail" not in r.json()


def test_wrong_method_is_405_with_allow(stack: tuple[str, FakeBackend]) -> None:
    url, _ = stack
    r = httpx.get(url + "/v1/chat/completions")
    _openai_error(r, 405)
    assert r.headers.get("allow") == "POST"


def _metric(url: str, line_start: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_aborted_uploads_are_quiet_cancellations(
    gateway: tuple[ServerThread, FakeBackend], caplog: pytest.LogCaptureFixture
) -> None:
    gw, fake = gateway
    url, port = gw.url, gw.port
    handlers = gw.server.server_state.tasks  # uvicorn's: one per request being handled
    before = fake.state.requests
    caplog.set_level(logging.INFO)
    for _ in range(5):
        known = set(handlers)
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b'content-length: 10000\r\n\r\n{"model":"fake","messages":'
            )
            # the gateway is reading the body when the client goes
            wait_until(lambda: bool(handlers - known), what="the request handled")  # noqa: B023
    key = 'sagegate_cancellations_total{stage="upload"}'
    wait_until(lambda: _metric(url, key) >= 5, timeout=10, what="five upload cancellations")
    # every handler has ended: whatever one would log (a traceback), it has logged
    wait_until(lambda: not handlers, what="the handlers ended")
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]
    assert fake.state.requests == before
    assert httpx.get(url + "/health").status_code == 200


# --- operators' conventions (issue 35) ---------------------------------------------------------------
def test_health_and_ready_answer_head_probes(stack: tuple[str, FakeBackend]) -> None:
    url, _ = stack
    for path in ("/health", "/ready"):
        r = httpx.head(url + path)
        assert r.status_code == 200 and r.content == b""


def test_without_cors_origins_no_cors_headers_are_sent(stack: tuple[str, FakeBackend]) -> None:
    url, _ = stack
    r = httpx.get(url + "/health", headers={"origin": "https://app.example"})
    assert "access-control-allow-origin" not in r.headers


def test_cors_origins_answer_preflights_and_tag_answers() -> None:
    fake = FakeBackend(tokens=3)
    with ServerThread(fake.app) as be:
        settings = settings_for([be.url], cors_origins=["https://app.example"])
        with ServerThread(create_app(settings)) as gw:
            pre = httpx.options(
                gw.url + "/v1/chat/completions",
                headers={
                    "origin": "https://app.example",
                    "access-control-request-method": "POST",
                    "access-control-request-headers": "authorization, content-type",
                },
            )
            assert pre.status_code == 200
            assert pre.headers["access-control-allow-origin"] == "https://app.example"
            r = httpx.post(
                gw.url + "/v1/chat/completions",
                json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]},
                headers={"origin": "https://app.example"},
            )
            assert r.status_code == 200
            assert r.headers["access-control-allow-origin"] == "https://app.example"
            other = httpx.options(
                gw.url + "/v1/chat/completions",
                headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
            )
            assert other.headers.get("access-control-allow-origin") != "https://evil.example"


@pytest.mark.parametrize(
    ("open_endpoints", "closed"),
    [
        (["metrics", "models", "openapi"], []),  # the default
        ([], ["/metrics", "/v1/models", "/openapi.json"]),
        (["metrics"], ["/v1/models", "/openapi.json"]),
    ],
)
def test_which_read_only_endpoints_need_a_key_is_a_setting(
    open_endpoints: list[str], closed: list[str]
) -> None:
    fake = FakeBackend(tokens=3)
    with ServerThread(fake.app) as be:
        settings = settings_for([be.url], api_keys={"k-1": "team"}, open_endpoints=open_endpoints)
        with ServerThread(create_app(settings)) as gw:
            for path in ("/metrics", "/v1/models", "/openapi.json"):
                anon = httpx.get(gw.url + path)
                if path in closed:
                    assert _openai_error(anon, 401)["code"] == "unauthorized"
                    for key in ("k-1", "admin-secret"):  # a client's key or the admin's
                        auth = {"authorization": f"Bearer {key}"}
                        assert httpx.get(gw.url + path, headers=auth).status_code == 200
                else:
                    assert anon.status_code == 200
            for path in ("/health", "/ready"):  # load balancers' probes never need a key
                assert httpx.get(gw.url + path).status_code == 200


def test_token_id_prompts_are_predicted_from_the_prior_without_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The semantic predictor on prompts with no text (token ids) answers from the length prior,
    says so in the path metric, and logs no error (it logged ~30 traceback lines per request)."""
    fake = FakeBackend(tokens=3)
    with ServerThread(fake.app) as be:
        settings = settings_for([be.url], predictor="semantic", policy="sagesched")
        with caplog.at_level(logging.WARNING), ServerThread(create_app(settings)) as gw:
            prompts: list[object] = [[1, 2, 3, 4], [[5, 6, 7]], ["a text prompt in a list"], "plain"]
            for prompt in prompts:
                r = httpx.post(
                    gw.url + "/v1/completions", json={"model": "fake", "prompt": prompt}, timeout=30
                )
                assert r.status_code == 200, r.text
            assert _metric(gw.url, 'sagegate_predictor_path_total{path="no_text"}') == 2
            assert _metric(gw.url, 'sagegate_predictor_path_total{path="error"}') == 0
            # the outcomes are recorded in the background: until none is left to record
            recorder = gw.app.state.gateway.recorder
            wait_until(lambda: recorder.pending == 0, what="the outcomes recorded")
    # the predictor's own failures (other tests' servers, still stopping in their threads, may log too)
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name.startswith(("sagegate.gateway", "sagegate.predictor"))
    ]
    assert not [m for m in errors if "predict" in m or "record" in m], errors
