"""The dashboard's feed, its access rule and the telemetry behind it (no browser: see
tests/gateway/test_dashboard_browser.py for the page itself)."""

from __future__ import annotations

import json
import math

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter

from sagegate.core.distribution import LengthDistribution
from sagegate.gateway.app import create_app
from sagegate.gateway.dashboard import COOKIE, FeedCache, cookie_token, encode
from sagegate.gateway.telemetry import QUALITY_EVERY_S, Telemetry, tau_b
from tests.gateway_support import FakeBackend, ServerThread, chat_body, settings_for, wait_until

KEY = "admin-secret"


def test_telemetry_steps_count_what_happened_in_each_step() -> None:
    reg = CollectorRegistry()
    admissions = Counter("sagegate_admissions", "", ["backend"], registry=reg)
    rejections = Counter("sagegate_rejections", "", ["reason"], registry=reg)
    tel = Telemetry(reg, window_s=3, step_s=1)
    admissions.labels("a").inc(3)
    admissions.labels("b").inc(2)
    rejections.labels("queue_full_requests").inc()
    for v in (0.1, 0.2, 0.3, 0.4):
        tel.first_token(v)
    first = tel.sample(1.0, queue_depth=7)
    assert (first.admitted, first.rejected, first.queue_depth) == (5, {"queue_full_requests": 1}, 7)
    assert first.ttft_p50 == pytest.approx(0.25) and first.ttlt_p50 is None
    admissions.labels("a").inc()
    second = tel.sample(2.0, queue_depth=0)
    assert (second.admitted, second.rejected, second.ttft_p50) == (1, {}, None)  # deltas, not totals
    for t in (3.0, 4.0, 5.0):
        tel.sample(t, queue_depth=1)
    series = tel.series()
    assert series["t"] == [3.0, 4.0, 5.0]  # the window keeps its last 3 steps
    assert series["rejected"] == {}


def test_prediction_quality_ranks_and_covers() -> None:
    tel = Telemetry(CollectorRegistry())
    for actual in (10, 20, 40, 80, 160):
        band = LengthDistribution((actual // 2, actual, actual * 2), (0.2, 0.6, 0.2))
        tel.completed(1.0, band, actual)
    good = tel.quality(0.0)
    assert good["n"] == 5 and good["tau"] == pytest.approx(1.0) and good["coverage"] == 1.0
    tel.completed(1.0, LengthDistribution.point(5), 1000)  # an order inverted, far outside its band
    tel.completed(1.0, None, 3)  # no prediction: not judged
    assert tel.quality(1.0) is good  # recomputed at most every QUALITY_EVERY_S
    worse = tel.quality(1.0 + QUALITY_EVERY_S)
    assert worse["n"] == 6 and worse["tau"] < 1.0 and worse["coverage"] == pytest.approx(5 / 6)
    assert worse["points"][-1] == [5.0, 5.0, 5.0, 1000]


def test_tau_b_agrees_with_scipy_ties_included() -> None:
    from scipy.stats import kendalltau

    x = np.array([1.0, 2.0, 2.0, 3.0, 4.0, 4.0])
    y = np.array([1.0, 3.0, 2.0, 2.0, 5.0, 4.0])
    assert tau_b(x, y) == pytest.approx(10 / math.sqrt(13 * 14))  # C - D = 10; 2 ties in x, 1 in y
    rng = np.random.default_rng(3)
    for n in (2, 7, 60, 400):
        a = rng.integers(1, 20, n).astype(float)
        b = a + rng.integers(-10, 10, n)
        assert tau_b(a, b) == pytest.approx(kendalltau(a, b).statistic, abs=1e-12)
    assert tau_b(np.ones(4), np.arange(4.0)) is None


def test_the_feed_is_strict_json_even_with_non_finite_numbers() -> None:
    assert json.loads(encode({"a": [1.0, float("nan")], "b": {"c": float("inf")}})) == {
        "a": [1.0, None],
        "b": {"c": None},
    }


def test_the_feed_is_built_at_most_once_per_ttl() -> None:
    now = [0.0]
    cache = FeedCache(lambda t: {"t": t}, lambda: now[0], ttl_s=0.5)
    first = cache.get()
    assert first["t"] == 0.0 and first["build_ms"] >= 0
    now[0] = 0.4
    assert cache.get() is first and cache.builds == 1
    now[0] = 0.6
    assert cache.get()["t"] == 0.6 and cache.builds == 2


@pytest.mark.heavy
def test_the_dashboard_needs_the_admin_key_and_never_stores_it() -> None:
    backend = FakeBackend(tokens=3)
    with ServerThread(backend.app) as be, ServerThread(create_app(settings_for([be.url]))) as gw:
        with httpx.Client(base_url=gw.url, timeout=10) as http:
            for path in ("/dashboard", "/admin/dashboard", "/dashboard/dashboard.js"):
                r = http.get(path)
                assert r.status_code == 403 and r.json()["error"]["type"] == "authentication_error"
            assert http.get("/dashboard", params={"key": "wrong"}).status_code == 403
            r = http.get("/dashboard", params={"key": KEY}, follow_redirects=False)
            assert r.status_code == 303 and r.headers["location"] == "/dashboard"
            cookie = r.headers["set-cookie"]
            assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower() and KEY not in cookie
            http.cookies.set(COOKIE, cookie_token(KEY))
            page = http.get("/dashboard")
            assert page.status_code == 200 and "/dashboard/dashboard.js" in page.text
            assert http.get("/dashboard/dashboard.js").headers["content-type"].startswith("text/javascript")
            assert http.get("/dashboard/secrets.txt").status_code == 404
            http.cookies.set(COOKIE, "forged")
            assert http.get("/admin/dashboard").status_code == 403
        bearer = {"authorization": f"Bearer {KEY}"}
        for _ in range(3):
            assert (
                httpx.post(gw.url + "/v1/chat/completions", json=chat_body(), timeout=10).status_code == 200
            )

        def judged() -> bool:
            feed = httpx.get(gw.url + "/admin/dashboard", headers=bearer, timeout=5).json()
            return (
                feed["quality"]["n"] == 0
                and len(feed["series"]["t"]) >= 2
                and sum(feed["series"]["admitted"]) == 3
            )

        wait_until(judged, timeout=10, what="two timeline steps counting the three admissions")
        feed = httpx.get(gw.url + "/admin/dashboard", headers=bearer, timeout=5).json()
        assert feed["backends"][0]["limit_tokens"] > 0 and feed["queued"] == 0
        assert feed["quality"]["tau"] is None  # predictor "none": nothing to judge
