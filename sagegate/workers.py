"""``sagegate serve --workers N``: N gateway processes behind one port, each a replica of the shared
admission ledger (``gateway.ledger``), for more cores than one Python process can use.

The supervisor writes the merged settings to a file, starts N ``sagegate.cmd_serve`` children on
it, each binding the port with ``SO_REUSEPORT`` (the kernel spreads new connections over them), and
passes SIGTERM/SIGINT on to them (each drains as a single gateway does). Each child is a replica
like a process on another host: its own queue and policy order, one ledger in Redis. A child that
dies is not restarted (its leases expire; the others take its room); the supervisor exits when all
have, with the first child's failing exit code (0 if all ended well).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from typing import Any


def check(settings: Any, workers: int) -> str | None:
    """Why ``settings`` cannot run with ``workers`` processes (None: it can)."""
    if workers > 1 and not settings.ledger_on:
        return "--workers needs the shared ledger: set redis_url, ledger.enabled not false (docs/gateway.md)"
    if workers > 1 and settings.port == 0:
        return "--workers needs a fixed --port (each worker binds the same one)"
    return None


def supervise(settings: Any, workers: int) -> int:
    """Run ``workers`` children on ``settings`` until they exit; returns the exit code."""
    data = settings.model_dump(mode="json", exclude_unset=True)  # (unset: each child's defaults)
    if "local_share" not in settings.ledger.model_fields_set:
        # Redis down: each takes 1/N of every backend, together one backend's worth.
        data.setdefault("ledger", {})["local_share"] = 1.0 / workers
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False, prefix="sagegate-workers-") as f:
        json.dump(data, f)  # JSON is YAML
    cmd = [sys.executable, "-m", "sagegate.cmd_serve", "--config", f.name, "--reuse-port"]
    # Own sessions: a terminal's Ctrl-C reaches them once, through ``forward``, not twice (a second
    # signal would make uvicorn skip the drain).
    children = [subprocess.Popen(cmd, start_new_session=True) for _ in range(workers)]

    def forward(sig: int, frame: Any) -> None:
        for c in children:
            if c.poll() is None:
                c.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        codes = [c.wait() for c in children]
    finally:
        os.unlink(f.name)
    # uvicorn re-raises the signal it drained on: a child ended by the signal we passed on ended well.
    clean = {0, -signal.SIGTERM, -signal.SIGINT}
    return next((c for c in codes if c not in clean), 0)


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` that other workers may bind too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
