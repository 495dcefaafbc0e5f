"""Cache-aware placement in the live gateway (issue 36), over loopback HTTP: requests sharing a long
prefix stick to the backend that holds it, distinct prefixes spread, a backend that went down keeps no
sticky traffic, a client's session is credited where its last turn went, and every decision shows."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway_support import admin, fleet, metric, wait_until

pytestmark = pytest.mark.heavy  # a live gateway and backends on loopback

SYSTEM_A = "You are a careful assistant for the railway company. " * 150  # ~2,000 tokens
SYSTEM_B = "You translate customer letters into formal German prose. " * 150


def ask(url: str, system: str, question: str, session: str | None = None) -> httpx.Response:
    body = {
        "model": "fake",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 4,
    }
    headers = {"x-session-id": session} if session else {}
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return r


def test_a_shared_prefix_sticks_and_distinct_prefixes_spread() -> None:
    with fleet({}, {}) as (_, url):
        first = ask(url, SYSTEM_A, "When does the first train leave?")
        home = first.headers["x-sagegate-backend"]
        assert first.headers["x-sagegate-prefix-hit"] == "0"
        for i in range(5):
            r = ask(url, SYSTEM_A, f"Question {i}: is the 7:40 on time?")
            assert r.headers["x-sagegate-backend"] == home
            assert int(r.headers["x-sagegate-prefix-hit"]) > 1500  # the system prompt, in whole blocks
        other = ask(url, SYSTEM_B, "Dear Sir, thank you for your letter.")
        assert other.headers["x-sagegate-backend"] != home  # idle backends tie: the emptier cache wins
        assert metric(url, 'sagegate_placements_total{kind="sticky"}') == 5
        assert metric(url, 'sagegate_placements_total{kind="no_hit"}') == 2
        sent = metric(url, f'sagegate_prefix_tokens_total{{backend="{home}",what="sent"}}')
        cached = metric(url, f'sagegate_prefix_tokens_total{{backend="{home}",what="predicted_cached"}}')
        assert 0.5 < cached / sent < 1.0
        assert metric(url, f'sagegate_backend_prefix_index_blocks{{backend="{home}"}}') > 0


def test_a_backend_that_went_down_keeps_no_sticky_traffic() -> None:
    with fleet({}, {}) as (fakes, url):
        home = ask(url, SYSTEM_A, "first").headers["x-sagegate-backend"]
        idx = int(home.rsplit("-", 1)[1])
        assert int(ask(url, SYSTEM_A, "second").headers["x-sagegate-prefix-hit"]) > 0
        fakes[idx].state.healthy = False
        wait_until(lambda: not admin(url)["backends"][idx]["healthy"], what="backend down")
        r = ask(url, SYSTEM_A, "while it is down")
        assert r.headers["x-sagegate-backend"] != home
        fakes[idx].state.healthy = True
        wait_until(lambda: admin(url)["backends"][idx]["healthy"], what="backend back")
        # it came back with an empty cache: its index was cleared, only the other holds the prefix now
        assert metric(url, f'sagegate_backend_prefix_index_blocks{{backend="{home}"}}') == 0
        r = ask(url, SYSTEM_A, "after it came back")
        assert r.headers["x-sagegate-backend"] != home


def test_a_session_is_credited_where_its_last_turn_went() -> None:
    with fleet({}, {}) as (_, url):
        turn1 = ask(url, SYSTEM_A, "Plan a trip to Basel.", session="s-1")
        home = turn1.headers["x-sagegate-backend"]
        ask(url, SYSTEM_B, "Guten Tag.")  # the other backend now holds something too
        # the next turn re-renders its history differently (a new system prompt): no block matches,
        # but the session names where its KV is
        turn2 = ask(url, "Be brief. " + SYSTEM_A, "And back on Sunday?", session="s-1")
        assert turn2.headers["x-sagegate-backend"] == home
        assert int(turn2.headers["x-sagegate-prefix-hit"]) > 1000
        without = ask(url, "Be terse. " + SYSTEM_A, "And back on Monday?")  # no session, no credit
        assert without.headers["x-sagegate-prefix-hit"] == "0"


def test_least_loaded_placement_ignores_the_cache() -> None:
    with fleet({}, {}, placement={"mode": "least_loaded"}) as (_, url):
        r = ask(url, SYSTEM_A, "one")
        assert "x-sagegate-prefix-hit" not in r.headers
        assert metric(url, 'sagegate_placements_total{kind="sticky"}') == 0


def test_a_prefix_a_running_request_holds_is_charged_once() -> None:
    """A request whose system prompt a started request on the same backend holds is charged without
    it (the engine keeps one copy); one with a prompt of its own is charged whole; and when all have
    left, nothing stays charged."""
    import threading

    def stream(system: str, question: str, streaming: threading.Event) -> None:
        body = {
            "model": "fake",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 40,
            "stream": True,
        }
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            for n, _ in enumerate(r.iter_lines()):
                if n == 4:  # a few tokens relayed: it has started
                    streaming.set()

    def reserved() -> float:
        return float(admin(url)["backends"][0]["reserved_tokens"])

    def send(system: str, question: str) -> threading.Event:
        started = threading.Event()
        t = threading.Thread(target=stream, args=(system, question, started))
        t.start()
        threads.append(t)
        return started

    threads: list[threading.Thread] = []
    with fleet({"tokens": 40, "delay_s": 0.05}, placement={"mode": "cache_aware"}) as (_, url):
        assert send(SYSTEM_A, "first").wait(10)
        one = reserved()
        send(SYSTEM_A, "second, the same system prompt")
        wait_until(lambda: admin(url)["backends"][0]["inflight"] == 2, what="second in")
        shared = reserved() - one
        send(SYSTEM_B, "third, a prompt of its own")
        wait_until(lambda: admin(url)["backends"][0]["inflight"] == 3, what="third in")
        whole = reserved() - one - shared
        assert 0 < shared < whole - 1000  # ~1,300 tokens of system prompt not charged again
        for t in threads:
            t.join(timeout=30)
        wait_until(lambda: reserved() == 0, what="all released")


def test_a_prompt_the_backend_refused_or_failed_warms_nothing() -> None:
    """Only a prompt a backend accepted and computed counts as cached there: the simulated backend's
    400 (over its context, as vLLM answers) and a backend's 500 leave the index as it was."""
    from sagegate.gateway.app import create_app
    from tests.gateway_support import ServerThread, settings_for, sim_thread

    with sim_thread() as sim, ServerThread(create_app(settings_for([sim.url]))) as gw:
        wait_until(lambda: admin(gw.url)["backends"][0]["healthy"], what="backend up")
        body = {
            "model": "fake",
            "messages": [{"role": "system", "content": SYSTEM_A}, {"role": "user", "content": "Hello?"}],
            "max_tokens": 10_000_000,  # beyond the model's context: vLLM's 400
        }
        for _ in range(3):
            r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=10)
            assert r.status_code == 400, r.text
        assert metric(gw.url, 'sagegate_backend_prefix_index_blocks{backend="backend-0"}') == 0
        first = ask(gw.url, SYSTEM_A, "When does the first train leave?")
        assert first.headers["x-sagegate-prefix-hit"] == "0"  # the refused ones left nothing
        again = ask(gw.url, SYSTEM_A, "And the last one?")
        assert int(again.headers["x-sagegate-prefix-hit"]) > 1500  # what was computed counts
    with fleet({"mode": "fail500"}) as (fakes, url):
        body["max_tokens"] = 4
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
        assert r.status_code >= 500 and fakes[0].state.requests >= 1
        assert metric(url, 'sagegate_backend_prefix_index_blocks{backend="backend-0"}') == 0


def test_sessions_are_kept_as_fixed_size_keys_and_a_long_id_is_refused() -> None:
    """Memory per session is bounded in bytes, not only in count: an id is kept as a 16-byte digest,
    at most ``max_sessions`` of them, and an id over ``max_session_id_bytes`` is the client's error."""
    from sagegate.gateway.app import create_app
    from tests.gateway_support import FakeBackend, ServerThread, settings_for

    fake = FakeBackend()
    with ServerThread(fake.app) as be:
        settings = settings_for([be.url], placement={"max_sessions": 100})
        app = create_app(settings)
        with ServerThread(app) as gw:  # type: ignore[arg-type]
            wait_until(lambda: admin(gw.url)["backends"][0]["healthy"], what="backend up")
            for i in range(150):
                ask(gw.url, SYSTEM_A, "Hi", session=f"{i:03d}" + "s" * 253)  # 256 bytes: the limit
            sessions = app.state.gateway.dispatcher.locality.sessions
            assert len(sessions) == 100 and all(len(k) == 32 for k in sessions)  # the newest 100
            body = {"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
            r = httpx.post(
                gw.url + "/v1/chat/completions", json=body, headers={"x-session-id": "s" * 60_000}, timeout=10
            )
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "x-session-id" and "256 bytes" in err["message"]
            assert fake.state.requests == 150  # refused before it reached a backend
