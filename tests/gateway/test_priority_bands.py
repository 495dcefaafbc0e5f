"""Priority bands live: a higher band goes ahead of a lower one in the queue, and one that fits
nowhere pauses a lower band's stream (which resumes and ends whole), pausing otherwise off."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from sagegate.gateway.app import create_app
from sagegate.gateway.tenants import identify
from tests.gateway.test_pause_resume import client, pauses, settled, sim_backend
from tests.gateway_support import ServerThread, fleet, settings_for, wait_until

OPEN_BANDS = {"default": {"max_priority": 3}}
"""Rate limits that let any client claim bands up to 3 (the default allows the default band alone)."""


@contextlib.contextmanager
def one_backend(
    capacity: int, admission: dict[str, Any], pause: dict[str, Any], **kw: Any
) -> Iterator[ServerThread]:
    """A ready gateway (``sagesched``, the ``sum`` rule at 1.0 and ``admission``; ``kw``: more
    settings, bands up to 3 open to all unless told) before one simulated backend it charges
    ``capacity`` tokens."""
    kw.setdefault("rate_limits", OPEN_BANDS)
    with sim_backend(time_scale=0.5) as be:
        settings = settings_for(
            [],
            backends=[{"url": be.url, "capacity_tokens": capacity}],
            policy="sagesched",
            admission={"rule": "sum", "target": 1.0, **admission},
            pause=pause,
            **kw,
        )
        with ServerThread(create_app(settings)) as gw:
            wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="gateway ready")
            yield gw


def test_the_band_is_the_header_else_the_body_priority_as_vllm_reads_it() -> None:
    assert identify({}, {}, 0.0).priority == 1
    assert identify({"x-priority": "5"}, {}, 0.0, body_priority=-9).priority == 5  # the header wins
    assert identify({}, {}, 0.0, body_priority=-3).priority == 4  # vLLM: lower first
    assert identify({}, {}, 0.0, body_priority=0).priority == 1  # vLLM's default is the default band
    for bad in ("high", 1.5, True, -1_000_000, 1_000_001):
        with pytest.raises(Exception, match="priority"):
            identify({}, {}, 0.0, body_priority=bad)
    for header in ("+7", "1_000", " 7", "7 ", "0x10", "", "1e3", "٣", "-", "12345678901"):
        with pytest.raises(Exception, match="x-priority"):
            identify({"x-priority": header}, {}, 0.0)
    assert identify({"x-priority": "-3"}, {}, 0.0).priority == -3


def low_stream(url: str, key: str, out: dict[str, Any]) -> threading.Thread:
    """A long default-band stream sent with ``key``, running in a thread (its text lands in ``out``)."""

    def run() -> None:
        c = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)
        stream = c.completions.create(
            model="sim", prompt="Tell me a long story.", max_tokens=400, stream=True
        )
        out["text"] = "".join(ch.choices[0].text for ch in stream if ch.choices)
        out["ended"] = time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    return t


def urgent(url: str, **headers: str) -> tuple[httpx.Response, float]:
    r = httpx.post(
        url + "/v1/completions",
        json={"model": "sim", "prompt": "urgent", "max_tokens": 20},
        headers=headers,
        timeout=60,
    )
    return r, time.monotonic()


def streaming(gw: ServerThread) -> bool:
    return any(lc.state == "streaming" for lc in gw.app.state.gateway.director.lifecycles.values())


@pytest.mark.heavy
def test_a_client_claiming_a_band_it_may_not_neither_jumps_nor_pauses() -> None:
    """Defaults (no keys, so every client's highest band is the default one): ``x-priority:
    1000000`` from another tenant is served in the default band: it waits for the stream holding the
    room instead of pausing it. With ``priority_over: reject`` the same claim is ``403``."""
    with one_backend(700, {"unknown_output": 400}, {"bands": True}, rate_limits={}) as gw:
        low: dict[str, Any] = {}
        t = low_stream(gw.url, "unused", low)
        wait_until(lambda: streaming(gw), what="the low band streaming")
        high, high_ended = urgent(gw.url, **{"x-priority": "1000000", "x-tenant": "intruder"})
        t.join(60)
        assert high.status_code == 200
        assert pauses(gw.url, "paused") == 0
        assert low["ended"] < high_ended and len(low["text"].split()) == 400
    with one_backend(700, {}, {}, rate_limits={"priority_over": "reject"}) as gw:
        refused, _ = urgent(gw.url, **{"x-priority": "2"})
        assert refused.status_code == 403
        assert refused.json()["error"]["param"] == "priority"
        assert urgent(gw.url, **{"x-priority": "1"})[0].status_code == 200


@pytest.mark.heavy
def test_another_tenant_pauses_a_stream_only_from_a_band_its_owner_cannot_claim() -> None:
    """``ops`` and ``gold`` may claim band 3, ``low`` only the default. ``ops`` at band 3 does not
    pause ``gold``'s stream (gold may claim 3 itself) but does pause ``low``'s (which resumes whole)."""
    rl = {"tenants": {"gold": {"max_priority": 3}, "ops": {"max_priority": 3}}}
    keys = {"k-low": "low", "k-gold": "gold", "k-ops": "ops"}
    ops = {"authorization": "Bearer k-ops", "x-priority": "3"}

    def ops_behind(gw: ServerThread, key: str) -> tuple[dict[str, Any], float]:
        """``key``'s stream running, then ops' band-3 request: the stream's outcome, when ops' ended."""
        out: dict[str, Any] = {}
        t = low_stream(gw.url, key, out)
        wait_until(lambda: streaming(gw), what=f"{key}'s stream running")
        high, high_ended = urgent(gw.url, **ops)
        t.join(60)
        assert high.status_code == 200
        return out, high_ended

    with one_backend(700, {"unknown_output": 400}, {"bands": True}, rate_limits=rl, api_keys=keys) as gw:
        gold, high_ended = ops_behind(gw, "k-gold")
        assert pauses(gw.url, "paused") == 0 and gold["ended"] < high_ended
        wait_until(lambda: settled(gw), what="every reservation released")
        low, high_ended = ops_behind(gw, "k-low")
        assert pauses(gw.url, "paused") == 1
        assert high_ended < low["ended"] and len(low["text"].split()) == 400  # resumed, whole


@pytest.mark.heavy
@pytest.mark.parametrize("bands", [True, False], ids=["bands", "bands-off"])
def test_a_higher_band_pauses_a_lower_bands_stream_that_holds_its_room(bands: bool) -> None:
    """One backend with room for one long request: a low-band stream holds it; a high-band request
    arrives and is served at once (the low one paused), then the low one resumes and ends whole.
    With ``pause.bands`` off the high band waits for the low one to end."""
    with one_backend(700, {"unknown_output": 400}, {"bands": bands}) as gw:
        low: dict[str, Any] = {}

        def run_low() -> None:
            stream = client(gw.url).completions.create(
                model="sim", prompt="Tell me a long story.", max_tokens=400, stream=True
            )
            low["text"] = "".join(c.choices[0].text for c in stream if c.choices)

        t = threading.Thread(target=run_low)
        t.start()
        ledger = gw.app.state.gateway.director.lifecycles
        wait_until(
            lambda: any(lc.state == "streaming" for lc in ledger.values()), what="the low band streaming"
        )
        high = httpx.post(
            gw.url + "/v1/completions",
            json={"model": "sim", "prompt": "urgent", "max_tokens": 20},
            headers={"x-priority": "3"},
            timeout=60,
        )
        assert high.status_code == 200
        assert pauses(gw.url, "paused") == (1 if bands else 0)  # the low band gave way
        t.join(60)
        assert not t.is_alive() and len(low["text"].split()) == 400  # resumed, whole
        assert (
            httpx.post(
                gw.url + "/admin/requests/1/pause", headers={"authorization": "Bearer admin-secret"}
            ).status_code
            == 409
        )  # operators' pauses stay off
        wait_until(lambda: settled(gw), what="every reservation released")


@pytest.mark.heavy
@pytest.mark.parametrize("reserve", [0.3, 0.0], ids=["reserve", "no-reserve"])
def test_room_kept_for_a_higher_band_serves_it_while_the_default_band_floods(reserve: float) -> None:
    """Room for three default-band requests (about 306 tokens charged each) on a 1,000-token backend;
    a flood of three keeps it full. With ``band_reserve`` 0.3 the third waits (the default band stops
    at 700) and a higher band's request goes at once, ending before any of the flood; with none the
    third takes the room and the higher band waits for a departure. Pausing is off."""
    with one_backend(1000, {"unknown_output": 300, "band_reserve": reserve}, {"bands": False}) as gw:
        ended: list[str] = []
        lock = threading.Lock()

        def run_low(i: int) -> None:
            stream = client(gw.url).completions.create(
                model="sim", prompt="Tell me a long story.", max_tokens=300, stream=True
            )
            for _ in stream:
                pass
            with lock:
                ended.append(f"low{i}")

        flood = [threading.Thread(target=run_low, args=(i,)) for i in range(3)]
        for t in flood:
            t.start()
        ledger = gw.app.state.gateway.director.lifecycles
        in_flight = 2 if reserve else 3  # what the default band may fill
        wait_until(
            lambda: sum(lc.state == "streaming" for lc in ledger.values()) == in_flight,
            what="the flood streaming",
        )
        high = httpx.post(
            gw.url + "/v1/completions",
            json={"model": "sim", "prompt": "urgent", "max_tokens": 20},
            headers={"x-priority": "2"},
            timeout=60,
        )
        assert high.status_code == 200
        with lock:
            ended.append("high")
        for t in flood:
            t.join(60)
        assert not any(t.is_alive() for t in flood)
        if reserve:
            assert ended[0] == "high", ended  # it found the room kept for it
        else:
            assert ended[0].startswith("low"), ended  # it waited for one of the flood to end
        wait_until(lambda: settled(gw), what="every reservation released")


def test_a_body_priority_reaches_a_backend_only_in_priority_mode() -> None:
    """A backend not started in vLLM's priority mode refuses a ``priority``: the gateway reads it as a
    band and strips it; with ``upstream.forward_priority`` it sends the band it granted (clamped)."""
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "priority": -5}
    with fleet({}) as (fakes, url):
        assert httpx.post(url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
        assert "priority" not in fakes[0].state.bodies[-1]
    with fleet({}, upstream={"forward_priority": True}, rate_limits=OPEN_BANDS) as (fakes, url):
        assert httpx.post(url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
        assert fakes[0].state.bodies[-1]["priority"] == -3  # asked for band 6, granted 3
