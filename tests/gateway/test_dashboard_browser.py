"""The dashboard in a real browser (headless Chromium) against a live gateway with simulated backends
under load: what the page shows matches ``/admin/queue`` and ``/metrics`` read at the same moment.

Set ``SAGEGATE_DASHBOARD_SCREENSHOT=docs/images/dashboard.png`` to keep the screenshot for the README.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from sagegate.core.request import FORCED_OUTPUT_FIELD
from sagegate.gateway.app import create_app
from sagegate.sim.config import EngineConfig
from sagegate.sim.server import BackendSettings
from sagegate.sim.server import create_app as backend_app
from tests.gateway_support import ServerThread, admin, settings_for, wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)"),
    pytest.mark.heavy,  # a browser, a live gateway and simulated backends
]
KEY = "admin-secret"


def _body(words: int, forced: int) -> dict[str, Any]:
    return {
        "model": "sim",
        "messages": [{"role": "user", "content": " ".join(["word"] * words)}],
        "max_tokens": 4096,
        FORCED_OUTPUT_FIELD: forced,
    }


def _metric(text: str, name: str, backend: str | None = None) -> float:
    want = name if backend is None else f'{name}{{backend="{backend}"}}'
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{want} not in /metrics")


# Read the page, then the two endpoints, inside the page: one moment, no test-side round trips between.
READ_ALL = """async () => {
  await window.sagegateDashboard.refresh();
  const text = (sel) => Array.from(document.querySelectorAll(sel)).map((e) => e.textContent);
  const rows = Array.from(document.querySelectorAll('#queue tbody tr')).map((tr) => ({
    id: tr.dataset.rid,
    rank: tr.querySelector('[data-field=rank]').textContent,
    prompt: tr.querySelector('[data-field=prompt_tokens]').textContent,
    p50: tr.querySelector('[data-field=p50]').textContent,
  }));
  const backends = Array.from(document.querySelectorAll('#backends tbody tr')).map((tr) => {
    const out = { name: tr.dataset.backend };
    for (const td of tr.querySelectorAll('[data-field]')) out[td.dataset.field] = td.textContent;
    return out;
  });
  const auth = { headers: { authorization: 'Bearer ADMIN_KEY' } };
  const queue = await (await fetch('/admin/queue', auth)).json();
  const metrics = await (await fetch('/metrics')).text();
  return { rows, backends, head: text('#head-reason')[0],
           depth: text('#queue-depth')[0], tau: text('#tau')[0], n: text('#quality-n')[0],
           queue, metrics };
}""".replace("ADMIN_KEY", KEY)


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def test_the_dashboard_shows_what_the_gateway_reports(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    engine = EngineConfig(max_num_seqs=2, num_gpu_blocks_override=400)
    backends = [
        backend_app(BackendSettings(engine=engine, served_model_name="sim", time_scale=1.0)) for _ in range(2)
    ]
    with ServerThread(backends[0]) as b0, ServerThread(backends[1]) as b1:
        settings = settings_for(
            [b0.url, b1.url],
            policy="sagesched",
            predictor="length-bucket",
            # pending_s: the backends run in this process, so on a busy machine they can take longer
            # than the default 30 ms to schedule a request; until a scrape answers it counts as waiting
            admission={"max_waiting": 1, "pending_s": 2.0},
        )
        with ServerThread(create_app(settings)) as gw:
            url = gw.url + "/v1/chat/completions"
            for words, out in [(10, 3), (10, 5), (60, 20), (60, 30), (300, 9), (300, 11)] * 2:
                assert httpx.post(url, json=_body(words, out), timeout=60).status_code == 200
            # Long requests fill both backends; the rest wait in the gateway's queue, still.
            stop = threading.Event()

            def send(words: int, forced: int) -> None:
                # streamed, so the gateway sees each token and its charge follows the generation
                body = {**_body(words, forced), "stream": True}
                with httpx.stream("POST", url, json=body, timeout=120) as resp:
                    for _ in resp.iter_bytes():
                        if stop.is_set():
                            return

            threads = [threading.Thread(target=send, args=(w, 4000), daemon=True) for w in (20, 30, 40, 50)]
            threads += [threading.Thread(target=send, args=(w, 4000), daemon=True) for w in range(5, 200, 13)]
            for t in threads:
                t.start()
            wait_until(lambda: admin(gw.url)["queued"] >= 8, timeout=30, what="a queue behind busy backends")

            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                try:
                    page = browser.new_page(viewport={"width": 1400, "height": 1100})
                    denied = page.goto(gw.url + "/dashboard")
                    assert denied is not None and denied.status == 403
                    page.goto(gw.url + f"/dashboard?key={KEY}")
                    assert page.url == gw.url + "/dashboard"  # the key left the address bar
                    page.wait_for_selector("#queue tbody tr")
                    page.wait_for_timeout(2500)  # a few timeline steps
                    seen = page.evaluate(READ_ALL)
                    shot = Path(os.environ.get("SAGEGATE_DASHBOARD_SCREENSHOT", tmp_path / "dashboard.png"))
                    shot.parent.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(shot), full_page=True)
                finally:
                    browser.close()
            stop.set()

    queue, metrics = seen["queue"], seen["metrics"]
    assert _num(seen["depth"]) == queue["queued"] == _metric(metrics, "sagegate_queue_depth")
    shown = seen["rows"]
    assert len(shown) == min(queue["queued"], 50) > 0
    for row, item in zip(shown, queue["requests"], strict=False):
        assert row["id"] == str(item["id"]) and _num(row["rank"]) == item["rank"]
        assert _num(row["prompt"]) == item["prompt_tokens"]
        assert _num(row["p50"]) == pytest.approx(item["prediction"]["p50"], abs=0.5)
    # both backends have KV room, but each already holds its one waiting request (max_waiting 1)
    assert seen["head"].startswith(f"head {queue['requests'][0]['id']}: a backend has KV room for it but")
    assert [b["name"] for b in seen["backends"]] == [b["name"] for b in queue["backends"]]
    for row, b in zip(seen["backends"], queue["backends"], strict=True):
        name = b["name"]
        assert _num(row["capacity_tokens"]) == b["capacity_tokens"]
        assert _num(row["capacity_tokens"]) == _metric(metrics, "sagegate_backend_capacity_kv_tokens", name)
        assert (
            _num(row["inflight"]) == b["inflight"] == _metric(metrics, "sagegate_backend_inflight", name) > 0
        )
        reserved = _metric(metrics, "sagegate_backend_reserved_kv_tokens", name)
        # generation moves the charge token by token between the page's read and the endpoints'
        assert _num(row["reserved_tokens"]) == pytest.approx(reserved, rel=0.05)
        assert row["state"] == "healthy"
        assert row["kv_used_tokens"] != "–"  # the engine's own gauge was scraped
    assert _num(seen["n"]) >= 12 and seen["tau"] != "–"  # the warm-up completions were judged
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
