"""With the backend saturated, queued requests are dispatched in the policy's rank order.

One simulated backend runs one sequence at a time (``max_num_seqs=1``) and admission allows one
waiting request there (``max_waiting=1``): a long blocker runs, a filler waits at the backend, and
everything sent afterwards queues in the gateway. They then complete one by one, in dispatch order.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from sagegate.gateway.app import create_app
from sagegate.sim.config import EngineConfig
from sagegate.sim.server import BackendSettings
from sagegate.sim.server import create_app as backend_app
from tests.gateway_support import ServerThread, admin, settings_for, wait_until

pytestmark = pytest.mark.heavy  # a live gateway and a simulated backend on loopback

N = 6


def _post(
    url: str, body: dict[str, Any], headers: dict[str, str], done: list[tuple[float, int]], tag: int
) -> None:
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
    r.raise_for_status()
    done.append((time.monotonic(), tag))


def _queued(url: str, n: int) -> Callable[[], bool]:
    return lambda: admin(url)["queued"] == n


def _body(content: str, max_tokens: int) -> dict[str, Any]:
    return {"model": "sim", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}


def _run(policy: str, requests: list[tuple[dict[str, Any], dict[str, str]]]) -> list[int]:
    """Saturate the backend, queue ``requests`` (in the given order), return their completion order."""
    engine = EngineConfig(max_num_seqs=1)
    backend = backend_app(BackendSettings(engine=engine, served_model_name="sim", time_scale=1.0))
    with ServerThread(backend) as be:
        settings = settings_for([be.url], policy=policy, admission={"max_waiting": 1})
        with ServerThread(create_app(settings)) as gw:
            done: list[tuple[float, int]] = []
            threads = []

            def send(body: dict[str, Any], headers: dict[str, str], tag: int) -> None:
                t = threading.Thread(target=_post, args=(gw.url, body, headers, done, tag), daemon=True)
                t.start()
                threads.append(t)

            send(_body("blocker", 1000), {}, -1)  # ~6.5 s: room to queue on a busy machine
            wait_until(lambda: admin(gw.url)["backends"][0]["inflight"] == 1, what="blocker dispatched")
            send(_body("filler", 4), {}, -2)
            wait_until(lambda: admin(gw.url)["backends"][0]["inflight"] == 2, what="filler dispatched")
            for tag, (body, headers) in enumerate(requests):
                send(body, headers, tag)
                wait_until(_queued(gw.url, tag + 1), what="request queued")
            assert done == [], "the blocker ended before every request was queued; lengthen it"
            for t in threads:
                t.join(60)
    order = [tag for _, tag in sorted(done)]
    # the blocker and the filler end first; which of the two a loaded machine records first is a
    # race between their client threads (the filler's 4 tokens follow the blocker's last one)
    assert sorted(order[:2]) == [-2, -1]
    return order[2:]


@pytest.mark.parametrize("seed", [0, 1])
def test_edf_dispatches_earliest_deadline_first(seed: int) -> None:
    deadlines = random.Random(seed).sample(range(10_000, 60_000, 5_000), N)
    reqs: list[tuple[dict[str, Any], dict[str, str]]] = [
        (_body(f"r{i}", 4), {"x-deadline-ms": str(d)}) for i, d in enumerate(deadlines)
    ]
    order = _run("edf", reqs)
    assert order == sorted(range(N), key=lambda i: deadlines[i])


def test_sagesched_without_prediction_serves_short_prompts_first() -> None:
    """With no predictor every request gets the same prior, so the Gittins rank of the memory-time
    cost grows with the prompt: shortest prompt first."""
    sizes = random.Random(7).sample(range(1, 60), N)
    reqs: list[tuple[dict[str, Any], dict[str, str]]] = [(_body("word " * (10 * s), 4), {}) for s in sizes]
    order = _run("sagesched", reqs)
    assert order == sorted(range(N), key=lambda i: sizes[i])


def test_x_priority_and_tenant_reach_the_policy() -> None:
    """Tenant, class and deadline headers become what the policy reads (``wfs`` weighs by priority);
    the admin snapshot shows it."""
    engine = EngineConfig(max_num_seqs=1)
    backend = backend_app(BackendSettings(engine=engine, served_model_name="sim", time_scale=1.0))
    with ServerThread(backend) as be:
        settings = settings_for(
            [be.url],
            policy="wfs",
            admission={"max_waiting": 1},
            queue={"max_wait_s": 0.5},
            rate_limits={"default": {"max_priority": 7}},
        )
        with ServerThread(create_app(settings)) as gw:
            headers = {"x-priority": "7", "x-tenant": "acme", "x-slo-ttft-ms": "60000"}
            threads = [
                threading.Thread(
                    target=lambda: httpx.post(
                        gw.url + "/v1/chat/completions", json=_body("b", 300), timeout=10
                    ),
                    daemon=True,
                )
                for _ in range(3)
            ]
            for t in threads:
                t.start()
                time.sleep(0.05)
            wait_until(lambda: admin(gw.url)["backends"][0]["inflight"] == 2, what="saturated")
            r: list[httpx.Response] = []
            t = threading.Thread(
                target=lambda: r.append(
                    httpx.post(
                        gw.url + "/v1/chat/completions", json=_body("x", 4), headers=headers, timeout=10
                    )
                )
            )
            t.start()
            wait_until(lambda: any(q["tenant"] == "acme" for q in admin(gw.url)["requests"]), what="queued")
            q = next(q for q in admin(gw.url)["requests"] if q["tenant"] == "acme")
            assert q["priority"] == 7
            assert 50 < q["deadline_in_s"] <= 60  # the SLO, less the time it has waited
            t.join(10)
            for th in threads:
                th.join(10)


@pytest.mark.parametrize("rank_priority", [True, False], ids=["rank", "no-rank"])
def test_the_rank_carried_into_the_engine_orders_its_waiting_queue(rank_priority: bool) -> None:
    """``upstream.rank_priority``: with the gateway holding nothing back (every request goes straight
    to the engine), an engine in vLLM's priority mode still serves in the gateway's order: a long
    prompt sent first (a worse rank: more memory-time) yields to the shorter ones behind it. Without
    it the engine serves first come first served."""
    engine = EngineConfig(max_num_seqs=1)
    opts = BackendSettings(
        engine=engine, served_model_name="sim", time_scale=1.0, scheduling_policy="priority"
    )
    sizes = [3000, 1000, 300, 100, 8]  # words, sent longest first (each in its own rank bucket)
    with ServerThread(backend_app(opts)) as be:
        settings = settings_for(
            [be.url],
            policy="sagesched",
            predictor="none",
            admission={"max_waiting": 100},
            upstream={"rank_priority": rank_priority},
        )
        with ServerThread(create_app(settings)) as gw:
            done: list[tuple[float, int]] = []
            threads = []
            for tag, size in [(-1, 0), *enumerate(sizes)]:
                body = _body("blocker", 1000) if tag < 0 else _body("word " * size, 4)
                t = threading.Thread(target=_post, args=(gw.url, body, {}, done, tag), daemon=True)
                t.start()
                threads.append(t)
                wait_until(lambda n=tag + 2: admin(gw.url)["backends"][0]["inflight"] == n, what="sent on")
            assert done == [] and admin(gw.url)["queued"] == 0  # all at the engine, none held back
            for t in threads:
                t.join(60)
    order = [tag for _, tag in sorted(done)]
    assert order[0] == -1  # the blocker was running
    expected = sorted(range(len(sizes)), key=lambda i: sizes[i]) if rank_priority else list(range(len(sizes)))
    assert order[1:] == expected
