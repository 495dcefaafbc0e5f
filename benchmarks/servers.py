"""The processes a gateway benchmark starts and measures: simulated backends and a gateway on free
loopback ports (their pids in ``PIDS``, by URL), each stopped on exit, and their CPU time (Linux)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from sagegate.harness.procs import free_port

REPO = Path(__file__).resolve().parents[1]

PIDS: dict[str, int] = {}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of a process and its live descendants (a proxy may fork workers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            total += cpu_seconds(p)
        todo += children.get(p, [])
    return total


def wait_ready(url: str, path: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + path, timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{url}{path} not ready")


def stop_server(proc: subprocess.Popen[bytes], grace: float = 30) -> None:
    """``harness.procs.stop``, saying so when the process had to be killed."""
    from sagegate.harness.procs import stop

    if stop(proc, grace):
        print(f"(note: pid {proc.pid} ignored SIGTERM for {grace:g} s: killed)", file=sys.stderr)


@contextlib.contextmanager
def backend(time_scale: float, *extra: str) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "sagegate.cli", "backend", "--port", str(port), "--served-model-name", "sim"]
    cmd += ["--time-scale", str(time_scale), *extra]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    PIDS[url] = proc.pid
    try:
        wait_ready(url, "/health", proc)
        yield url
    finally:
        stop_server(proc, 10)


@contextlib.contextmanager
def gateway(backends: Sequence[str], **settings: Any) -> Iterator[str]:
    port = free_port()
    cfg = {
        "backends": list(backends),
        "port": port,
        "log_level": "warning",
        "policy": "fcfs",
        "predictor": "none",
    }
    cfg.update(settings)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(cfg, f)
    cmd = [sys.executable, "-m", "sagegate.cmd_serve", "--config", f.name]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    PIDS[url] = proc.pid
    try:
        wait_ready(url, "/ready", proc)
        yield url
    finally:
        stop_server(proc)
        os.unlink(f.name)
