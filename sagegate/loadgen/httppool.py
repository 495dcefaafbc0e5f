"""httpx clients for many concurrent streams: a pool of small pools."""

from __future__ import annotations

import asyncio

import httpx

KEEPALIVE_S = 2.0
"""Seconds an idle pooled connection is kept (below uvicorn's default 5 s keep-alive)."""


class ClientPool:
    """httpx clients sharded by load: each holds at most ``per_client`` requests at once.

    httpx's connection pool rescans all of its connections on every request start and end (a cost
    that grows with the square of the connections open), which caps one client at a few hundred
    streaming requests; many small pools keep that scan short. Concurrency itself is bounded by the
    replay's connection limit, not here.
    """

    def __init__(self, headers: dict[str, str], per_client: int = 8) -> None:
        import ssl

        self.headers = headers
        self.tls = ssl.create_default_context()  # shared: loading the CA bundle takes ~50 ms a client
        self.per_client = per_client
        self.clients: list[httpx.AsyncClient] = []
        self.load: list[int] = []

    def _new(self) -> int:
        # Idle connections are dropped before uvicorn's 5 s keep-alive closes them from its side:
        # reusing one the server is closing fails before the first byte (seen as ReadError).
        limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=self.per_client, keepalive_expiry=KEEPALIVE_S
        )
        timeout = httpx.Timeout(None)
        self.clients.append(
            httpx.AsyncClient(limits=limits, timeout=timeout, headers=self.headers, verify=self.tls)
        )
        self.load.append(0)
        return len(self.clients) - 1

    @property
    def first(self) -> httpx.AsyncClient:
        return self.clients[0] if self.clients else self.clients[self._new()]

    def acquire(self) -> int:
        load = self.load
        i = min(range(len(load)), key=load.__getitem__) if load else -1
        if i < 0 or load[i] >= self.per_client:
            i = self._new()
        load[i] += 1
        return i

    def release(self, i: int) -> None:
        self.load[i] -= 1

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients), return_exceptions=True)
