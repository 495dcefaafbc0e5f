"""The gateway's HTTP client to its backends.

By default (``upstream.client: lean``) one httpx client over :class:`gateway.http1.Http1Transport`,
whose pool costs the same whatever it holds. With ``upstream.client: httpx``, httpx's own transport,
as many small connection pools instead of one large one (:class:`UpstreamClients`):

httpcore's pool walks every connection it holds on each request start and end (expiry, idleness,
assignment), so one client carrying a few hundred concurrent streams spends a large share of the event
loop on bookkeeping that grows with the square of the streams (py-spy on the demo's gateway run, ~300
streams: ~15% of the loop in ``_assign_requests_to_connections``, ``has_expired`` and ``is_idle``).
Here each request goes to the least-loaded of several clients, each holding at most ``per_client``
requests, and a client's slot is freed when its response closes. The total stays bounded by
``max_connections``.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import logging
from collections.abc import AsyncIterator, Callable, Generator, Mapping

import httpx

from sagegate.gateway.http1 import Http1Transport
from sagegate.gateway.settings import GatewaySettings, UpstreamSettings

log = logging.getLogger("sagegate.gateway")


class _ReleasingStream(httpx.AsyncByteStream):
    """A response body that frees its client's slot once, when it is closed."""

    def __init__(self, inner: httpx.AsyncByteStream, release: Callable[[], None]) -> None:
        self.inner = inner
        self.release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        finally:
            if self.release is not None:
                release, self.release = self.release, None
                release()


class UpstreamClients:
    """``send`` and ``get`` as on one ``httpx.AsyncClient``, over a set of small ones."""

    def __init__(
        self,
        *,
        max_connections: int,
        keepalive_s: float,
        read_timeout_s: float,
        per_client: int = 16,
        auth: httpx.Auth | None = None,
    ) -> None:
        self.auth = auth
        self.per_client = max(1, min(per_client, max_connections))
        self.max_clients = max(1, -(-max_connections // self.per_client))
        self.keepalive_s = keepalive_s
        self.timeout = httpx.Timeout(read_timeout_s)
        self.clients: list[httpx.AsyncClient] = []
        self.load: list[int] = []
        self._new()

    def _new(self) -> int:
        limits = httpx.Limits(
            max_connections=self.per_client,
            max_keepalive_connections=self.per_client,
            keepalive_expiry=self.keepalive_s,
        )
        self.clients.append(
            httpx.AsyncClient(limits=limits, timeout=self.timeout, cookies=no_cookies(), auth=self.auth)
        )
        self.load.append(0)
        return len(self.clients) - 1

    def _acquire(self) -> int:
        load = self.load
        i = min(range(len(load)), key=load.__getitem__)
        if load[i] >= self.per_client and len(self.clients) < self.max_clients:
            i = self._new()
        load[i] += 1
        return i

    def _releaser(self, i: int) -> Callable[[], None]:
        def release() -> None:
            self.load[i] -= 1

        return release

    @property
    def active(self) -> int:
        """Requests whose responses are open."""
        return sum(self.load)

    def build_request(self, method: str, url: str, **kw: object) -> httpx.Request:
        return self.clients[0].build_request(method, url, **kw)  # type: ignore[arg-type]

    async def send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        i = self._acquire()
        release = self._releaser(i)
        try:
            resp = await self.clients[i].send(request, stream=stream)
        except BaseException:
            release()
            raise
        if not stream:  # read and closed already
            release()
            return resp
        resp.stream = _ReleasingStream(resp.stream, release)  # type: ignore[arg-type]
        return resp

    async def get(self, url: str, **kw: object) -> httpx.Response:
        """A small whole-body request (probes, scrapes) on the least-loaded client."""
        return await self.send(self.build_request("GET", url, **kw))

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients), return_exceptions=True)


Upstream = UpstreamClients | httpx.AsyncClient
"""What the forwarder and the backend pool send through (tests may hand in a plain client)."""


def no_cookies() -> http.cookiejar.CookieJar:
    """A jar that keeps nothing: a cookie one backend sets for one tenant's request must not ride on
    the next tenant's (httpx's client would keep it and send it back)."""
    return http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


class BackendHeaders(httpx.Auth):
    """Each backend's own headers (its key, vLLM's ``--api-key``, as ``Authorization: Bearer``, and any
    others it names) on every request to it: generation, probes, scrapes, ``/tokenize``. A request's
    URL is matched to the backend whose URL starts it (the longest such)."""

    def __init__(self, headers: Mapping[str, Mapping[str, str]]) -> None:
        self.headers = sorted(((url + "/", h) for url, h in headers.items()), key=lambda kv: -len(kv[0]))

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        url = str(request.url)
        for prefix, headers in self.headers:
            if url.startswith(prefix):
                request.headers.update(headers)
                break
        yield request


def backend_headers(settings: GatewaySettings) -> dict[str, dict[str, str]]:
    """Backend URL → the headers to send it: its key (its own, else ``upstream.api_key``) and its own
    ``headers``; backends with neither are left out."""
    default = settings.upstream.api_key
    out: dict[str, dict[str, str]] = {}
    for b in settings.backends:
        headers = {name: value.get_secret_value() for name, value in b.headers.items()}
        key = b.api_key or default
        if key is not None:
            headers["authorization"] = f"Bearer {key.get_secret_value()}"
        if headers:
            out[b.url] = headers
    return out


def upstream_client(up: UpstreamSettings, headers: Mapping[str, Mapping[str, str]] | None = None) -> Upstream:
    """The client the gateway forwards and probes through, as ``up.client`` says; ``headers``: each
    backend's own (:func:`backend_headers`)."""
    auth = BackendHeaders(headers) if headers else None
    if up.client == "httpx":
        return UpstreamClients(
            max_connections=up.max_connections,
            keepalive_s=up.keepalive_s,
            read_timeout_s=up.read_timeout_s,
            auth=auth,
        )
    lean = Http1Transport(max_connections=up.max_connections, keepalive_s=up.keepalive_s)
    limits = httpx.Limits(max_connections=up.max_connections, keepalive_expiry=up.keepalive_s)
    timeout = httpx.Timeout(up.read_timeout_s)
    return httpx.AsyncClient(
        mounts={"http://": lean}, limits=limits, timeout=timeout, cookies=no_cookies(), auth=auth
    )


async def close_quietly(resp: httpx.Response) -> None:
    """Close an upstream response; a broken connection may raise anything, and it is closed anyway."""
    try:
        await resp.aclose()
    except Exception as exc:
        log.debug("closing an upstream response raised %s", type(exc).__name__)
