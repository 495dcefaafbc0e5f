"""``sagegate serve``: the gateway under uvicorn, configured from a YAML file, the environment and flags.

On SIGTERM (or Ctrl-C) it stops accepting connections, answers 503 to new requests on open ones,
lets in-flight and queued requests finish for up to ``drain_timeout_s``, ends what is left itself
(streams with an SSE error event, the rest with 503), then exits. Client connections are bounded as
``gateway.client_guard`` says (head and body timeouts, head size, optional connection limit).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer


def serve(
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML settings file (see docs/gateway.md).")
    ] = None,
    backend: Annotated[
        list[str] | None, typer.Option("--backend", help="Backend base URL; repeat for several.")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on.")] = None,
    policy: Annotated[str | None, typer.Option(help="Queue policy spec (default sagesched).")] = None,
    predictor: Annotated[
        str | None,
        typer.Option(help="Output-length predictor: none, global, prefix, length-bucket, semantic."),
    ] = None,
    redis_url: Annotated[
        str | None, typer.Option("--redis-url", help="Redis for the shared prediction history.")
    ] = None,
    admin_key: Annotated[
        str | None, typer.Option("--admin-key", envvar="SAGEGATE_ADMIN_KEY", help="Key for /admin routes.")
    ] = None,
    log_level: Annotated[str | None, typer.Option("--log-level", help="Log level.")] = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers", min=1, help="Gateway processes behind the port (>1 needs redis_url and the ledger)."
        ),
    ] = 1,
    reuse_port: Annotated[bool, typer.Option("--reuse-port", hidden=True)] = False,
) -> None:
    """Run the OpenAI-compatible scheduling gateway in front of vLLM-compatible backends."""
    from pydantic import ValidationError

    from sagegate.gateway.settings import load_settings

    overrides: dict[str, Any] = {
        "backends": backend or None,
        "host": host,
        "port": port,
        "policy": policy,
        "predictor": predictor,
        "redis_url": redis_url,
        "admin_key": admin_key,
        "log_level": log_level,
    }
    try:
        settings = load_settings(config, **overrides)
    except (ValidationError, FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if not settings.backends:
        typer.echo("error: no backends: give --backend URL or a config file with backends", err=True)
        raise typer.Exit(2)
    if workers > 1:
        from sagegate.workers import check, supervise

        why = check(settings, workers)
        if why is not None:
            typer.echo(f"error: {why}", err=True)
            raise typer.Exit(2)
        raise typer.Exit(supervise(settings, workers))
    run(settings, reuse_port=reuse_port)


def run(settings: Any, *, reuse_port: bool = False) -> None:
    """Serve ``settings`` (a ``GatewaySettings``) until SIGTERM/SIGINT, then drain. ``reuse_port``:
    bind with ``SO_REUSEPORT`` beside the other workers of ``--workers``."""
    import asyncio
    import logging

    import uvicorn

    from sagegate.gateway.app import create_app
    from sagegate.gateway.client_guard import BodyDeadline, uvicorn_options
    from sagegate.policies.registry import PolicySpecError

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if settings.log_level.upper() != "DEBUG":
        # httpx logs every request at INFO: each upstream call and each /metrics scrape (10 a second
        # per backend) would flood the log and cost CPU on the request path.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        app = create_app(settings)
    except (PolicySpecError, ValueError, ImportError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    gateway = app.state.gateway

    class _Server(uvicorn.Server):
        loop: asyncio.AbstractEventLoop | None = None

        async def startup(self, sockets: Any = None) -> None:
            self.loop = asyncio.get_running_loop()
            await super().startup(sockets)

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not gateway.draining and self.loop is not None:
                # At the drain deadline the gateway ends what is left itself, before uvicorn's own
                # shutdown timeout (DRAIN_GRACE_S later) would cut streams without an SSE error event.
                loop, delay = self.loop, settings.drain_timeout_s
                loop.call_soon_threadsafe(loop.call_later, delay, gateway.director.close_all)
            gateway.draining = True
            super().handle_exit(sig, frame)

    cfg = uvicorn.Config(
        BodyDeadline(app, settings.limits.body_timeout_s),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
        **uvicorn_options(settings, gateway.metrics.connection_event),
    )
    from sagegate.gateway.redact import redact_url

    names = ", ".join(redact_url(b.url) for b in settings.backends)
    typer.echo(
        f"sagegate serve: policy {settings.policy}, predictor {settings.predictor}, backends {names} "
        f"at http://{settings.host}:{settings.port}",
        err=True,
    )
    if reuse_port:
        from sagegate.workers import reuse_port_socket

        _Server(cfg).run(sockets=[reuse_port_socket(settings.host, settings.port)])
    else:
        _Server(cfg).run()


if __name__ == "__main__":  # pragma: no cover
    typer.run(serve)
