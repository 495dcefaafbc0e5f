"""Two gateway replicas sharing one Redis: a completion served through one informs the predictions
of the other (the semantic predictor's history travels through the session's private Redis).

The embedder is a small deterministic bag-of-words hash (the test is about sharing history between
replicas, not about MiniLM); everything else — gateways, backends, Redis — is real.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

import httpx
import numpy as np
import pytest

from sagegate.gateway.app import create_app
from sagegate.gateway.settings import DEFAULT_BUDGET_S
from tests.gateway_support import FakeBackend, ServerThread, settings_for, wait_until

pytestmark = pytest.mark.heavy  # live replicas and backends, Redis

DIM = 384  # the history index is built for MiniLM-sized vectors


class BagOfWordsEmbedder:
    dim = DIM

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[i, zlib.crc32(word.encode()) % DIM] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-9)


def _replica(backend: str, redis_url: str, prefix: str) -> ServerThread:
    from sagegate.predictor.factory import SemanticOptions, make_predictor

    opts = SemanticOptions(
        embedder=BagOfWordsEmbedder(), redis_url=redis_url, redis_prefix=prefix, budget_s=DEFAULT_BUDGET_S
    )
    # dispatch_first off: each request waits for its prediction, which is what this reads back
    settings = settings_for([backend], predictor="semantic", redis_url=redis_url, dispatch_first=False)
    return ServerThread(create_app(settings, predictor=make_predictor("semantic", opts)))


def _ask(url: str, text: str) -> httpx.Response:
    body = {"model": "fake", "messages": [{"role": "user", "content": text}], "max_tokens": 2000}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=20)
    r.raise_for_status()
    return r


QUESTION = "please summarise the history of the roman empire in detail"


def test_a_completion_through_one_replica_informs_the_other(redis_url: str, redis_prefix: str) -> None:
    long_answers = FakeBackend(tokens=77)  # what replica A's backend answers
    short_answers = FakeBackend(tokens=5)  # replica B's
    with (
        ServerThread(long_answers.app) as be_a,
        ServerThread(short_answers.app) as be_b,
        _replica(be_a.url, redis_url, redis_prefix) as a,
        _replica(be_b.url, redis_url, redis_prefix) as b,
    ):
        gw_b = b.app.state.gateway
        assert gw_b.predictor.core.size("fake") == 0  # B has served nothing and knows nothing
        for i in range(8):  # eight: enough for the window's own prior (fewer shrink to the cold default)
            assert _ask(a.url, f"{QUESTION} variant {i}").headers["x-sagegate-backend"] == "backend-0"
        wait_until(lambda: gw_b.predictor.core.size("fake") >= 8, timeout=10, what="history reached B")
        after = _ask(b.url, QUESTION)
        # A's 77-token answers, moved a little by the ranking head's shift (B's own backend answers 5)
        assert 60 <= int(after.headers["x-sagegate-predicted-tokens"]) <= 95
        metrics = httpx.get(b.url + "/metrics").text
        assert 'sagegate_predictor_path_total{path="semantic"} 1.0' in metrics
