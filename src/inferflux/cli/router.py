"""`inferflux router`: settings → logging → `RouterApp` → uvicorn.

Exit codes: 2 for an invalid configuration (no replica given included; the message names
the key and the fix), 0 after SIGTERM / Ctrl-C: the router stops accepting, and the
streams it relays may finish within `router.shutdown_grace_s` (then uvicorn cuts them).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
import uvicorn

from inferflux.config.loader import load_settings
from inferflux.errors import ConfigError
from inferflux.observability.logging import configure_logging
from inferflux.router import RouterApp

EXIT_CONFIG_ERROR = 2


def router(
    replica: Annotated[
        list[str] | None,
        typer.Option(
            "--replica",
            help="Base URL of an `inferflux serve` replica, e.g. http://127.0.0.1:8080 "
            "(repeat for each; router.replicas).",
        ),
    ] = None,
    redis: Annotated[
        str | None,
        typer.Option(
            help="Redis URL that several routers share the affinity directory through "
            "(router.redis_url; prefer INFERFLUX_ROUTER__REDIS_URL: it may hold a password)."
        ),
    ] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (router.host).")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port (router.port).")] = None,
    config: Annotated[
        Path | None, typer.Option(help="YAML config file (its `router:` section).")
    ] = None,
) -> None:
    """Route requests across several `inferflux serve` replicas by prefix affinity and
    load. Flags override env vars and the config file."""
    overrides = {
        "router.replicas": list(replica) if replica else None,
        "router.redis_url": redis,
        "router.host": host,
        "router.port": port,
    }
    try:
        settings = load_settings(config, overrides=overrides)
    except ConfigError as exc:
        typer.echo(f"inferflux: {exc.message}", err=True)
        raise typer.Exit(EXIT_CONFIG_ERROR) from None
    own = settings.router
    if not own.replicas and own.replica_dns is None:
        typer.echo(
            "inferflux: no replica: give --replica URL (repeatable), "
            "INFERFLUX_ROUTER__REPLICAS, `router: {replicas: [...]}` in --config, or "
            "router.replica_dns (HOST:PORT of a headless Service)",
            err=True,
        )
        raise typer.Exit(EXIT_CONFIG_ERROR)
    configure_logging(settings.observability)
    typer.echo(
        f"InferFlux router on http://{own.host}:{own.port} over "
        f"{own.replica_dns or len(own.replicas)} replica(s), routing {own.routing} "
        "(ready once /readyz answers 200)"
    )
    uvicorn.run(
        RouterApp(own),
        host=own.host,
        port=own.port,
        log_config=None,
        timeout_graceful_shutdown=math.ceil(own.shutdown_grace_s),
        lifespan="on",
    )


router_app = typer.Typer(add_completion=False)
router_app.command()(router)
