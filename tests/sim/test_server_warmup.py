"""The simulated backend loads its tokenizer before it opens its port: a fresh backend's first
request must not pay for it (vLLM warms up before serving; a stand-in that did not would slow the
first second of every benchmark, more for setups whose first requests land together)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.heavy  # a sagegate backend process

PROBE = """
from fastapi.testclient import TestClient
from sagegate.core.tokens import _encoder
from sagegate.sim.server import _filler_ids, create_app
app = create_app()
assert _encoder.cache_info().currsize == 0, "loaded at import"
with TestClient(app) as client:  # runs the lifespan: what happens before the port opens
    print(_encoder.cache_info().currsize, _filler_ids.cache_info().currsize)
    assert client.get("/health").status_code == 200
"""


def test_backend_loads_the_tokenizer_before_serving() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1"]
