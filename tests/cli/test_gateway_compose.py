"""The local stack's compose file is valid (``docker-compose config``; no Docker engine needed), and
every service command is one the ``sagegate`` CLI accepts, as the tests run it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from sagegate import cmd_backend, cmd_serve

pytestmark = pytest.mark.heavy  # docker-compose and sagegate, in subprocesses

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"


def _compose_config(*profile: str) -> dict[str, Any]:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (Debian: apt-get install -y docker-compose)")
    args = [exe, "-f", str(COMPOSE)]
    if profile:
        args += ["--profile", *profile]
    out = subprocess.run([*args, "config"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    config: dict[str, Any] = yaml.safe_load(out.stdout)
    return config


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command("serve")(cmd_serve.serve)
    app.command("backend")(cmd_backend.backend)
    return app


def test_compose_file_is_valid_and_has_the_stack() -> None:
    services = _compose_config()["services"]
    assert {"redis", "gateway", "backend-a", "backend-b"} <= set(services)
    for name in ("redis", "gateway", "backend-a", "backend-b"):
        assert not services[name].get("profiles"), name  # the default stack needs no GPU
    assert services["vllm"]["profiles"] == ["gpu"] and services["gateway-gpu"]["profiles"] == ["gpu"]
    vllm = _compose_config("gpu")["services"]["vllm"]["command"]
    assert vllm[vllm.index("--scheduling-policy") + 1] == "priority"


def test_compose_commands_are_valid_cli_invocations(monkeypatch: pytest.MonkeyPatch) -> None:
    services = _compose_config("gpu")["services"]
    served: list[Any] = []
    monkeypatch.setattr(cmd_serve, "run", lambda settings, **_: served.append(settings))
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: None)
    runner = CliRunner()
    commands = {
        name: s["command"] for name, s in services.items() if s.get("image", "").startswith("sagegate")
    }
    assert {"gateway", "backend-a", "backend-b", "gateway-gpu"} <= set(commands)
    for name, command in commands.items():
        mounted = _mounts(services[name])  # the config file a service reads is the repository's
        result = runner.invoke(_cli(), [mounted.get(str(c), str(c)) for c in command])
        assert result.exit_code == 0, f"{name}: {result.output}"
    gateway = next(s for s in served if s.port == 8080 and len(s.backends) == 2)
    assert [b.url for b in gateway.backends] == ["http://backend-a:8000", "http://backend-b:8000"]
    assert gateway.redis_url == "redis://:change-me-too@redis:6379/0" and gateway.policy == "sagesched"
    assert gateway.predictor == "prefix" and gateway.host == "0.0.0.0"  # from deploy/gateway.yaml
    assert "ports" not in services["redis"] and "--requirepass" in services["redis"]["command"]


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """A service's bind mounts, container path → the repository's file."""
    out = {}
    for v in service.get("volumes") or []:
        if isinstance(v, dict) and v.get("type") == "bind":
            out[v["target"]] = v["source"]
        elif isinstance(v, str) and ":" in v:
            src, dst = v.split(":")[:2]
            out[dst] = str((REPO / src).resolve())
    return out


def test_the_replicas_profile_puts_two_ledger_sharing_gateways_behind_one_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (Debian: apt-get install -y docker-compose)")
    out = subprocess.run(
        [exe, "-f", str(COMPOSE), "--profile", "replicas", "config"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    default = _compose_config()["services"]
    assert default["gateway-r1"]["profiles"] == default["replicas-lb"]["profiles"] == ["replicas"]
    replicas = [services["gateway-r1"], services["gateway-r2"]]
    served: list[Any] = []
    monkeypatch.setattr(cmd_serve, "run", lambda settings, **_: served.append(settings))
    for r in replicas:
        assert r["environment"]["SAGEGATE_LEDGER__ENABLED"] == "true"
        result = CliRunner().invoke(_cli(), [str(c) for c in r["command"]])
        assert result.exit_code == 0, result.output
    assert (
        len(served) == 2
        and served[0].redis_url == served[1].redis_url == "redis://:change-me-too@redis:6379/0"
    )
    lb = services["replicas-lb"]
    assert any(p["published"] == 8081 for p in lb["ports"])
    (mount,) = lb["volumes"]
    source = mount["source"] if isinstance(mount, dict) else mount.split(":")[0]  # long or short syntax
    conf = Path(source).read_text()
    assert "server gateway-r1:8080;" in conf and "server gateway-r2:8080;" in conf
    assert "proxy_buffering off;" in conf  # SSE must not be buffered by the balancer
