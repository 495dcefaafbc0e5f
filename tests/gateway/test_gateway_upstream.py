"""The sharded upstream client: requests spread over small pools, every slot freed when its response
closes (read to the end, closed early, or failed), against a real server on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest

from gateway.upstream import UpstreamClients
from loadgen.fakeserver import FakeServer


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
