"""Child processes for tests, benchmarks and the demo: run a ``sagegate`` service on a free port, wait
until it answers, and always stop it (no process is left behind)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]  # the repository, so `python -m sagegate...` imports


def exit_on_sigterm() -> None:
    """Make SIGTERM (``kill``, a CI timeout) unwind like Ctrl-C: every ``finally`` runs, so the children
    this process started are stopped too (by default SIGTERM ends Python without unwinding)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free right now (another process may still take it before we bind)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def kv_events_flag() -> tuple[list[str], dict[str, str]]:
    """vLLM's ``--kv-events-config`` on two free ports (ZMQ PUB and replay), and the ``kv_events``
    entry of the gateway's ``backends`` setting that follows them."""
    pub, replay = free_port(), free_port()
    config = {
        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{pub}",
        "replay_endpoint": f"tcp://*:{replay}",
    }  # fmt: skip
    follow = {"endpoint": f"tcp://127.0.0.1:{pub}", "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
    return ["--kv-events-config", json.dumps(config)], follow


@contextlib.contextmanager
def spawned(
    module: str,
    args: Sequence[str] = (),
    *,
    ready_path: str = "/health",
    startup_timeout_s: float = 30.0,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """Run ``python -m <module> --host 127.0.0.1 --port <free> [args]`` and yield its base URL once
    ``ready_path`` answers 200; terminate it (then kill it) on exit."""
    with child(module, args, ready_path=ready_path, startup_timeout_s=startup_timeout_s, env=env) as c:
        yield c.url


@dataclass
class Child:
    """A running service: its URL and process (a fault test kills it; ``port`` lets it come back)."""

    url: str
    port: int
    proc: subprocess.Popen[str]
    log: IO[str]
    """The child's stderr (a file: read it from the start with ``seek(0)``)."""


@contextlib.contextmanager
def child(
    module: str,
    args: Sequence[str] = (),
    *,
    port: int | None = None,
    ready_path: str = "/health",
    startup_timeout_s: float = 30.0,
    env: dict[str, str] | None = None,
) -> Iterator[Child]:
    """:func:`spawned`, yielding the :class:`Child` (on ``port`` if given, else a free one)."""
    port = port or free_port()
    cmd = [sys.executable, "-m", module, *args, "--host", "127.0.0.1", "--port", str(port)]
    with running(cmd, f"http://127.0.0.1:{port}", ready_path, startup_timeout_s, env) as proc_log:
        yield Child(f"http://127.0.0.1:{port}", port, *proc_log)


@contextlib.contextmanager
def running(
    cmd: Sequence[str],
    url: str,
    ready_path: str = "/health",
    startup_timeout_s: float = 30.0,
    env: dict[str, str] | None = None,
    group: bool = False,
) -> Iterator[tuple[subprocess.Popen[str], IO[str]]]:
    """Run ``cmd`` (any program serving ``url``) until ``url + ready_path`` answers 200; yield the
    process and its stderr log; terminate it (then kill it) on exit. ``group``: it runs in a process
    group of its own, and whatever of the group is left (its children, when it was killed) is
    killed on exit too."""
    # stderr to a file, not a pipe: a chatty child never blocks on it.
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            list(cmd), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, text=True, env=env,
            start_new_session=group,
        )  # fmt: skip
        try:
            _wait_ready(proc, url + ready_path, log, startup_timeout_s)
            yield proc, log
        finally:
            if proc.poll() is None:
                stop(proc, 10)
            if group:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)


def stop(proc: subprocess.Popen[Any], grace: float) -> bool:
    """SIGTERM, then SIGKILL if ``proc`` has not exited within ``grace`` seconds; returns whether it
    had to be killed."""
    proc.terminate()
    try:
        proc.wait(grace)
        return False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return True


def _wait_ready(proc: subprocess.Popen[str], probe: str, log: IO[str], timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}: {log.read().strip()[-2000:]}")
        try:
            if httpx.get(probe, timeout=1.0, trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{probe} did not answer within {timeout_s} s")
        time.sleep(0.1)
