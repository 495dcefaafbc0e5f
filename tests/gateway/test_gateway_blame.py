"""One tenant's bad requests cost that tenant, not the fleet (issue 35): a request that fails on two
backends is blamed, not the backends; a backend failing everyone is still taken out of rotation; the
per-tenant retry budget; the verdict rules themselves."""

from __future__ import annotations

import threading

import httpx
import pytest

from sagegate.gateway.blame import RetryBudget, Suspect, Verdicts, error_object, refused_input
from tests.gateway_support import admin, chat_body, fleet, idle, metric, wait_until

POISON = "POISON-INPUT"


def post(url: str, text: str, tenant: str = "default") -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions", json=chat_body(text), headers={"x-tenant": tenant}, timeout=10
    )


def circuits(url: str) -> list[bool]:
    return [b["circuit_open"] for b in admin(url)["backends"]]


# --- the verdict over HTTP -------------------------------------------------------------------------
@pytest.mark.heavy
def test_a_request_that_fails_on_two_backends_is_blamed_and_no_circuit_opens() -> None:
    poisoned = {"poison": POISON}
    with fleet(poisoned, poisoned, health={"failure_threshold": 1}) as (fakes, url):
        r = post(url, f"please {POISON}")
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "request_failed_twice"
        assert "the engine failed on this input" in r.json()["error"]["message"]
        assert [f.state.requests for f in fakes] == [1, 1]  # one try each, then no more
        assert circuits(url) == [False, False]  # a threshold of 1 would have opened both before
        assert httpx.get(url + "/ready").status_code == 200
        assert post(url, "an ordinary question").status_code == 200
        assert metric(url, 'sagegate_suspect_failures_total{verdict="request"}') == 2
        assert idle(url)


@pytest.mark.heavy
def test_a_backend_error_that_says_the_input_was_refused_becomes_a_400() -> None:
    refused = {"poison": POISON, "poison_type": "BadRequestError"}
    with fleet(refused, refused) as (_, url):
        r = post(url, POISON)
        assert r.status_code == 400
        body = r.json()["error"]
        assert body["code"] == "input_refused" and body["type"] == "invalid_request_error"
        assert "the engine failed on this input" in body["message"]


@pytest.mark.heavy
def test_one_tenants_poison_burst_leaves_every_circuit_closed_for_the_others() -> None:
    """Eight poison requests at once (which opened both circuits before), a victim tenant alongside."""
    poisoned = {"poison": POISON, "delay_s": 0.002}
    with fleet(poisoned, poisoned) as (_, url):
        results: dict[str, list[int]] = {"attacker": [], "victim": []}
        lock = threading.Lock()

        def send(tenant: str, text: str) -> None:
            code = post(url, text, tenant).status_code
            with lock:
                results[tenant].append(code)

        for _ in range(3):
            threads = [threading.Thread(target=send, args=("attacker", POISON)) for _ in range(8)]
            threads += [threading.Thread(target=send, args=("victim", "hello")) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert circuits(url) == [False, False]
        assert results["victim"] == [200] * 12
        assert set(results["attacker"]) <= {502}  # refused, every one, as the attacker's own
        assert httpx.get(url + "/ready").status_code == 200
        wait_until(lambda: idle(url), what="nothing held")


@pytest.mark.heavy
def test_a_backend_failing_everyone_is_still_charged_and_taken_out() -> None:
    """The first backend answers every request 500; the second serves them: the first is charged."""
    with fleet({"mode": "fail500", "blocks": 8192}, {"blocks": 1024}) as (fakes, url):
        codes = [post(url, f"question {i}").status_code for i in range(3)]
        assert codes == [200, 200, 200]
        assert circuits(url)[0] and not circuits(url)[1]  # three charges: the default threshold
        assert metric(url, 'sagegate_suspect_failures_total{verdict="backend"}') == 3
        assert fakes[0].state.requests == 3


@pytest.mark.heavy
def test_a_tenant_past_its_retry_budget_gets_the_first_failure_and_others_keep_theirs() -> None:
    """Poison for the first backend only (it has more room, so it is tried first); the second serves."""
    first_only = [{"poison": POISON, "blocks": 8192}, {"blocks": 1024}]
    budget = {"tenant_retry_rate": 0.0, "tenant_retry_burst": 1}
    with fleet(*first_only, upstream=budget, health={"failure_threshold": 10}) as (fakes, url):
        assert post(url, POISON, "a").status_code == 200  # retried on the second: budget now spent
        r = post(url, POISON, "a")
        assert r.status_code == 502 and r.json()["error"]["code"] == "retry_budget_spent"
        assert post(url, POISON, "b").status_code == 200  # another tenant has its own budget
        assert fakes[1].state.requests == 2
        assert metric(url, 'sagegate_rejections_total{reason="retry_budget_spent"}') == 1


# --- the verdict rules -----------------------------------------------------------------------------
def _suspect(backend: str, since: float, error: dict[str, object] | None = None) -> Suspect:
    return Suspect(backend, f"{backend}: HTTP 500", since, error)


def test_verdicts_charge_only_backends_that_answered_nobody_since() -> None:
    v = Verdicts()
    assert not v.failed(_suspect("a", 10.0))
    answered = {"a": 12.0}
    assert v.charged_on_success(lambda name, since: answered.get(name, 0.0) > since) == []
    answered = {"a": 9.0}
    assert v.charged_on_success(lambda name, since: answered.get(name, 0.0) > since) == ["a"]
    assert v.failed(_suspect("b", 11.0))  # the second: the request is the cause


def test_the_answer_names_the_failures_or_passes_on_a_refusal() -> None:
    v = Verdicts()
    v.failed(_suspect("a", 0.0))
    v.failed(_suspect("b", 0.0, {"message": "too long", "type": "BadRequestError"}))
    err = v.answer()
    assert err.status == 400 and "too long" in err.message
    w = Verdicts()
    w.failed(_suspect("a", 0.0))
    w.failed(_suspect("b", 0.0))
    err = w.answer()
    assert err.status == 502 and "a: HTTP 500" in err.message and "b: HTTP 500" in err.message


def test_error_bodies_are_read_as_openai_errors_or_not_at_all() -> None:
    assert error_object(b'{"error": {"message": "m", "type": "t"}}') == {"message": "m", "type": "t"}
    assert error_object(b'{"message": "flat"}') == {"message": "flat"}
    assert error_object(b"<html>502 Bad Gateway</html>") is None
    assert error_object(b"[1, 2]") is None
    assert refused_input({"code": 400}) and refused_input({"type": "invalid_request_error"})
    assert not refused_input({"type": "InternalServerError", "code": 500}) and not refused_input(None)


def test_retry_budget_refills_at_its_rate_and_caps_at_its_burst() -> None:
    now = [0.0]
    budget = RetryBudget(rate=2.0, burst=3, clock=lambda: now[0])
    assert [budget.take("t") for _ in range(4)] == [True, True, True, False]
    assert budget.take("other")
    now[0] = 0.5  # one retry back
    assert budget.take("t") and not budget.take("t")
    now[0] = 100.0
    assert [budget.take("t") for _ in range(4)] == [True, True, True, False]  # the burst, no more
    off = RetryBudget(rate=0.0, burst=0, clock=lambda: now[0])
    assert not off.take("t")
