"""A command that needs no embedder starts without loading one: `sagegate serve` imports no model,
plotting or statistics library until its predictor starts (and `--predictor none` never does)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "onnxruntime", "matplotlib", "scipy", "sklearn", "hnswlib", "ray")

PROBE = """
import json, sys
from typer.testing import CliRunner
from sagegate.cli import app
assert CliRunner().invoke(app, ["serve", "--help"]).exit_code == 0
from sagegate.gateway.app import create_app
from sagegate.gateway.settings import GatewaySettings
create_app(GatewaySettings(backends=["http://127.0.0.1:9"], predictor=sys.argv[1]))
print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
"""


@pytest.mark.parametrize("predictor", ["none", "length-bucket", "semantic"])
def test_building_the_gateway_loads_no_heavy_library(predictor: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, predictor, json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_probe_sees_a_heavy_import() -> None:
    """The check can fail: a module that imports one of them is seen."""
    probe = (
        "import json, sys, scipy.special\n"
        "print(json.dumps(sorted(m for m in json.loads(sys.argv[1]) if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout) == ["scipy"]
