"""The sharded upstream client: requests spread over small pools, every slot freed when its response
closes (read to the end, closed early, or failed), against a real server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

import httpx
import pytest

from benchmarks.fakeserver import FakeServer
from sagegate.gateway.settings import UpstreamSettings
from sagegate.gateway.upstream import UpstreamClients, upstream_client


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer(interval_s=0.01).start()
    yield server
    server.stop()


def _body(n: int) -> bytes:
    return json.dumps({"model": "m", "prompt": "x", "max_tokens": n, "stream": True}).encode()


def test_streams_spread_over_small_pools_and_free_their_slots(fake: FakeServer) -> None:
    async def run() -> tuple[int, int, int, list[int]]:
        up = UpstreamClients(max_connections=64, keepalive_s=2.0, read_timeout_s=10.0, per_client=4)
        url = fake.url + "/v1/completions"
        try:
            opened = [
                await up.send(up.build_request("POST", url, content=_body(20)), stream=True)
                for _ in range(10)
            ]
            during, clients, peak = up.active, len(up.clients), max(up.load)
            for i, resp in enumerate(opened):
                if i % 2:
                    async for _ in resp.aiter_raw():  # read to the end
                        pass
                await resp.aclose()  # half of them closed early
            await opened[0].aclose()  # a second close frees nothing twice
            whole = await up.get(fake.url + "/v1/models")
            assert whole.status_code == 200
            return during, clients, peak, list(up.load)
        finally:
            await up.aclose()

    during, clients, peak, after = asyncio.run(run())
    assert during == 10 and clients == 3 and peak <= 4
    assert after == [0] * clients


def test_a_failed_send_frees_its_slot() -> None:
    async def run() -> int:
        up = UpstreamClients(max_connections=8, keepalive_s=2.0, read_timeout_s=1.0, per_client=2)
        try:
            with pytest.raises(httpx.ConnectError):
                await up.send(up.build_request("POST", "http://127.0.0.1:9/v1/completions"), stream=True)
            return up.active
        finally:
            await up.aclose()

    assert asyncio.run(run()) == 0


@pytest.mark.parametrize("kind", ["lean", "httpx"])
def test_a_cookie_a_backend_sets_is_never_sent_back(kind: str) -> None:
    """The gateway's client is shared by every tenant: what one backend answer sets must not ride on
    the next request (httpx's client keeps cookies by default)."""

    async def run() -> list[bool]:
        carried: list[bool] = []

        async def backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    carried.append(b"\r\ncookie:" in head.lower())
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nset-cookie: sid=tenant-a; Path=/\r\ncontent-length: 2\r\n\r\nok"
                    )
                    await writer.drain()

        server = await asyncio.start_server(backend, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/models"
        up = upstream_client(UpstreamSettings(client=kind))  # type: ignore[arg-type]
        try:
            for _ in range(3):
                assert (await up.get(url)).status_code == 200
        finally:
            await up.aclose()
            server.close()
        return carried

    assert asyncio.run(run()) == [False, False, False]


def test_a_backend_started_with_an_api_key_is_served_with_it_and_refused_without() -> None:
    """vLLM's ``--api-key`` guards its ``/v1`` routes (the simulated backend does as vLLM does): the
    gateway sends each backend its key on every request; without one the backend is not healthy
    (it could serve nothing) and the reason is logged, where it used to look ready with no models
    and pass vLLM's 401 to every client."""
    from sagegate.gateway.app import create_app
    from tests.gateway_support import ServerThread, admin, settings_for, sim_thread, wait_until

    with sim_thread("sim", api_key="k-123") as be:
        open_routes = [httpx.get(be.url + p, timeout=5).status_code for p in ("/health", "/metrics")]
        assert open_routes == [200, 200]
        r = httpx.get(be.url + "/v1/models", timeout=5)
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
        keyed = settings_for([], backends=[{"url": be.url, "api_key": "k-123"}])
        with ServerThread(create_app(keyed)) as gw:
            wait_until(lambda: admin(gw.url)["backends"][0]["healthy"], what="backend up")
            assert [m["id"] for m in httpx.get(gw.url + "/v1/models", timeout=5).json()["data"]] == ["sim"]
            body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer x"})
            assert r.status_code == 200, r.text
        with ServerThread(create_app(settings_for([be.url]))) as gw:
            # probes ran, and kept being refused: three in a row open the breaker
            wait_until(lambda: admin(gw.url)["backends"][0]["circuit_open"], what="the breaker open")
            assert not admin(gw.url)["backends"][0]["healthy"]
            assert httpx.get(gw.url + "/ready", timeout=5).status_code == 503


def test_each_backend_gets_its_own_headers_and_no_other_backends() -> None:
    """A backend's key (its own, else ``upstream.api_key``) and its extra headers ride on every request
    to it, matched by URL prefix; another backend's never leak to it, and the settings never print
    them."""
    from sagegate.gateway.settings import GatewaySettings
    from sagegate.gateway.upstream import BackendHeaders, backend_headers

    s = GatewaySettings(
        backends=[
            {"url": "http://a:8000", "api_key": "ka", "headers": {"x-team": "t1"}},
            {"url": "http://a:8000/v2"},
            {"url": "http://b:8000"},
        ],
        upstream={"api_key": "shared"},
    )
    auth = BackendHeaders(backend_headers(s))

    def sent(url: str) -> httpx.Headers:
        return next(auth.auth_flow(httpx.Request("GET", url))).headers

    a = sent("http://a:8000/v1/models")
    assert a["authorization"] == "Bearer ka" and a["x-team"] == "t1"
    v2 = sent("http://a:8000/v2/metrics")  # the longer URL is the other backend
    assert v2["authorization"] == "Bearer shared" and "x-team" not in v2
    assert sent("http://b:8000/health")["authorization"] == "Bearer shared"
    assert "authorization" not in sent("http://c:8000/health")
    assert "ka" not in repr(s) and "t1" not in repr(s) and "shared" not in repr(s)
