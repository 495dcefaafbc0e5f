"""Priority bands live: a higher band goes ahead of a lower one in the queue, and one that fits
nowhere pauses a lower band's stream (which resumes and ends whole), pausing otherwise off."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sagegate.gateway.app import create_app
from sagegate.gateway.tenants import identify
from tests.gateway.test_pause_resume import client, pauses, settled, sim_backend
from tests.gateway_support import ServerThread, settings_for, wait_until


@contextlib.contextmanager
def one_backend(capacity: int, admission: dict[str, Any], pause: dict[str, Any]) -> Iterator[ServerThread]:
    """A ready gateway (``sagesched``, the ``sum`` rule at 1.0 and ``admission``) before one simulated
    backend it charges ``capacity`` tokens."""
    with sim_backend(time_scale=0.5) as be:
        settings = settings_for(
            [],
            backends=[{"url": be.url, "capacity_tokens": capacity}],
            policy="sagesched",
            admission={"rule": "sum", "target": 1.0, **admission},
            pause=pause,
        )
        with ServerThread(create_app(settings)) as gw:
            wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, what="gateway ready")
            yield gw


def test_the_band_is_the_header_else_the_body_priority_as_vllm_reads_it() -> None:
    assert identify({}, {}, 0.0).priority == 1
    assert identify({"x-priority": "5"}, {}, 0.0, body_priority=-9).priority == 5  # the header wins
    assert identify({}, {}, 0.0, body_priority=-3).priority == 4  # vLLM: lower first
    assert identify({}, {}, 0.0, body_priority=0).priority == 1  # vLLM's default is the default band
    for bad in ("high", 1.5, True):
        with pytest.raises(Exception, match="priority"):
            identify({}, {}, 0.0, body_priority=bad)


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
