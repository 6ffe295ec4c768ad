"""`inferflux serve`: settings → logging → model → engine client → app → uvicorn.

Exit codes: 2 for an invalid configuration, model manifest or a policy store that cannot
be read (the message names the key or the problem and the fix), 1 when the default model
cannot be verified or loaded, 3 (uvicorn's) when the engine fails to start, 0 after a
graceful shutdown (SIGTERM or Ctrl-C: drain for `server.shutdown_grace_s`, see
`api/drain.py`; a second signal stops at once).

`inferflux digest-key` prints the digest of a key for `auth.api_keys[].sha256`.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import shlex
import socket
import ssl
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
import uvicorn
from fastapi import FastAPI

from inferflux import __version__
from inferflux.api import create_app
from inferflux.api.drain import Drain, drain_then_stop
from inferflux.api.security_layer import SecurityState, build_security
from inferflux.api.state import app_state
from inferflux.cli.guarded_http import ConnectionLimits, guarded_h11
from inferflux.cli.router import router
from inferflux.config.loader import load_settings
from inferflux.config.settings import Settings
from inferflux.engine import make_engine_client
from inferflux.engine.protocol import ModelInfo
from inferflux.errors import ConfigError, ModelLoadError
from inferflux.models.catalog import catalog_from_settings
from inferflux.models.files import default_model_path, load_model
from inferflux.models.spec import model_settings
from inferflux.observability.logging import configure_logging
from inferflux.security.api_keys import KeyDigester

EXIT_CONFIG_ERROR = 2
EXIT_MODEL_ERROR = 1
# `--model vision`: the default model with the demo mmproj, under this id
VISION_DEMO = "vision"
UVICORN_SHUTDOWN_S = 1
# TLS 1.2 suites: forward secret AEAD only (TLS 1.3 suites are always AEAD).
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20:!aNULL:!MD5:!DSS"

logger = logging.getLogger(__name__)

app = typer.Typer(
    name="inferflux",
    help="InferFlux: an OpenAI-compatible LLM inference server on llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
)


def print_version(value: bool) -> None:
    """`--version`: print the version and exit (an eager option of both CLIs)."""
    if value:
        typer.echo(__version__)
        raise typer.Exit()


VersionOption = Annotated[
    bool,
    typer.Option(
        "--version", help="Print the version and exit.", callback=print_version, is_eager=True
    ),
]


@app.callback()
def _root(version: VersionOption = False) -> None:
    """InferFlux: an OpenAI-compatible LLM inference server on llama.cpp."""


_ROUTING_HELP = (
    "How requests pick a worker: prefix_affinity, least_loaded, round_robin, memory_aware "
    "(scheduler.routing)."
)


ModelOption = Annotated[
    str | None,
    typer.Option(
        help="GGUF file to serve, or a URL: hf://ORG/REPO/FILE.gguf@REV, https://… "
        "(model.path). Default: SmolLM2-135M. `vision`: SmolLM2-135M with the demo "
        "mmproj (images in), served as the model `vision`."
    ),
]
MmprojOption = Annotated[
    str | None,
    typer.Option(help="Multimodal projector GGUF served beside the model (model.mmproj)."),
]


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Address to bind (server.host).")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port (server.port).")] = None,
    model: ModelOption = None,
    mmproj: MmprojOption = None,
    model_id: Annotated[
        str | None, typer.Option(help="Model id clients send as `model` (model.id).")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="YAML config file.")] = None,
    registry: Annotated[
        str | None,
        typer.Option(help="YAML model manifest: several models, hot swap (registry.path)."),
    ] = None,
    workers: Annotated[
        int | None, typer.Option(help="Engine worker processes (runtime.workers).")
    ] = None,
    in_process: Annotated[
        bool, typer.Option("--in-process", help="Run the engine on a thread (debugging).")
    ] = False,
    routing: Annotated[str | None, typer.Option(help=_ROUTING_HELP)] = None,
    ollama_port: Annotated[
        int | None,
        typer.Option(
            help="Also serve on this port, e.g. 11434 for Ollama clients (server.ollama_port)."
        ),
    ] = None,
    grpc_port: Annotated[
        int | None,
        typer.Option(
            help="Also serve the gRPC API (inferflux.v1) on this port (server.grpc_port)."
        ),
    ] = None,
    accept_policy_rollback: Annotated[
        bool,
        typer.Option(
            "--accept-policy-rollback",
            help="Load a policy store older than one written before (a restored backup).",
        ),
    ] = False,
) -> None:
    """Serve a GGUF model over the OpenAI API. Flags override env vars and the config file."""
    overrides = {
        "server.host": host,
        "server.port": port,
        "server.ollama_port": ollama_port,
        "server.grpc_port": grpc_port,
        **_model_overrides(model, mmproj, model_id),
        "registry.path": registry,
        "runtime.workers": workers,
        "runtime.in_process": True if in_process else None,
        "scheduler.routing": routing,
        "auth.policy_accept_rollback": True if accept_policy_rollback else None,
    }
    try:
        settings = load_settings(config, overrides=overrides)
    except ConfigError as exc:
        typer.echo(f"inferflux: {exc.message}", err=True)
        raise typer.Exit(EXIT_CONFIG_ERROR) from None
    configure_logging(settings.observability)
    _check_tls(settings)
    security = _build_security(settings)
    asgi_app, model_info = _build_app(settings, security)
    typer.echo(startup_banner(settings, model_info))
    if not security.authenticator.enabled:
        # NOTE: no auth is the newcomer's default (README); say so loudly, every start.
        logger.warning(
            "AUTHENTICATION IS OFF: no API key or OIDC issuer is configured, so any client "
            "that can reach %s:%d can use this server, admin API included "
            "(see docs/security.md)",
            settings.server.host,
            settings.server.port,
        )
    _run(asgi_app, settings)


def _model_overrides(
    model: str | None, mmproj: str | None, model_id: str | None
) -> dict[str, str | None]:
    """The `model` section's flags. `--model vision` (unless a file of that name exists)
    serves the default SmolLM2 with the demo mmproj (`models/demo_vision.py`, built on
    first use) as the model `vision`; `--mmproj` and `--model-id` still override."""
    if model != VISION_DEMO or Path(model).is_file():
        return {"model.path": model, "model.mmproj": mmproj, "model.id": model_id}
    try:
        path = str(default_model_path())
        demo = mmproj if mmproj is not None else str(_demo_mmproj_path()())
    except ModelLoadError as exc:
        typer.echo(f"inferflux: {exc.message}", err=True)
        raise typer.Exit(EXIT_MODEL_ERROR) from None
    except OSError as exc:
        typer.echo(f"inferflux: cannot build the demo mmproj: {exc}", err=True)
        raise typer.Exit(EXIT_MODEL_ERROR) from None
    return {"model.path": path, "model.mmproj": demo, "model.id": model_id or VISION_DEMO}


def _demo_mmproj_path() -> Callable[[], Path]:
    """`models.demo_vision.demo_mmproj_path`, imported only for `--model vision` (it
    pulls in gguf and numpy)."""
    module = importlib.import_module("inferflux.models.demo_vision")
    build: Callable[[], Path] = module.demo_mmproj_path
    return build


def _build_security(settings: Settings) -> SecurityState:
    """The security state, before the model loads; a bad policy store exits 2."""
    try:
        return build_security(settings)
    except ConfigError as exc:  # PolicyStoreError included
        typer.echo(f"inferflux: {exc.message}", err=True)
        raise typer.Exit(EXIT_CONFIG_ERROR) from None


@app.command("digest-key")
def digest_key(
    config: Annotated[Path | None, typer.Option(help="YAML config file (for auth.pepper).")] = None,
) -> None:
    """Read an API key on stdin; print the digest for auth.api_keys[].sha256 (HMAC-SHA-256
    keyed with auth.pepper / INFERFLUX_AUTH_PEPPER when set, as the server computes it)."""
    try:
        settings = load_settings(config)
    except ConfigError as exc:
        typer.echo(f"inferflux: {exc.message}", err=True)
        raise typer.Exit(EXIT_CONFIG_ERROR) from None
    key = sys.stdin.readline().strip()
    if not key:
        typer.echo("inferflux: give the key on stdin", err=True)
        raise typer.Exit(EXIT_CONFIG_ERROR)
    pepper = settings.auth.pepper
    typer.echo(KeyDigester(pepper.get_secret_value() if pepper else None).digest(key))


class _DrainingServer(uvicorn.Server):
    """uvicorn, but the first SIGTERM / SIGINT drains (`api/drain.py`) before it stops,
    and a drained stop exits 0 (uvicorn re-raises a captured signal after its shutdown,
    so the process would die by it). A second signal stops at once (uvicorn's way)."""

    def __init__(self, config: uvicorn.Config, drain: Drain, grace_s: float) -> None:
        super().__init__(config)
        self._drain = drain
        self._grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None or self._drain.draining or self.should_exit:
            super().handle_exit(sig, frame)
            return
        self._drain.begin()  # /readyz says 503 from now on
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        stop = partial(setattr, self, "should_exit", True)
        self._draining = asyncio.create_task(
            drain_then_stop(self._drain, self._grace_s, stop), name="drain"
        )


def _run(asgi_app: FastAPI, settings: Settings) -> None:
    tls = settings.server.tls
    config = uvicorn.Config(
        asgi_app,
        host=settings.server.host,
        port=settings.server.port,
        log_config=None,
        # NOTE: the drain already waited server.shutdown_grace_s; uvicorn's own wait is for
        # the cut streams' last frames and a request that stop() raced.
        timeout_graceful_shutdown=UVICORN_SHUTDOWN_S,
        ssl_certfile=tls.cert_path if tls.enabled else None,
        ssl_keyfile=tls.key_path if tls.enabled else None,
        ssl_ciphers=TLS12_CIPHERS,  # uvicorn's default ("TLSv1") allows CBC-SHA1 suites
        http=guarded_h11(
            ConnectionLimits(
                settings.server.header_timeout_s,
                settings.server.body_timeout_s,
                settings.server.max_connections,
            )
        ),
        timeout_keep_alive=settings.server.keep_alive_timeout_s,  # type: ignore[arg-type]
    )
    config.load()
    if config.ssl is not None:
        config.ssl.minimum_version = ssl.TLSVersion.TLSv1_2  # TLS 1.0 and 1.1 refused
    state = app_state(asgi_app)
    server = _DrainingServer(config, state.generation.drain, settings.server.shutdown_grace_s)
    # the app calls this when no engine worker can start: a clean stop, then exit 1
    state.request_shutdown = lambda: setattr(server, "should_exit", True)
    state.draining = lambda: bool(server.should_exit)
    server.run(sockets=_listen_sockets(config, settings.server.ollama_port))
    start_error = state.engine_start_error
    if start_error:
        typer.echo(f"inferflux: {start_error}", err=True)
        raise typer.Exit(EXIT_MODEL_ERROR)


def _check_tls(settings: Settings) -> None:
    """With server.tls on, load the certificate and key once before anything else, so a
    missing or mismatched file exits 2 at once with a clear message."""
    tls = settings.server.tls
    if not tls.enabled:
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            str(tls.cert_path), str(tls.key_path)
        )
    except (OSError, ssl.SSLError) as exc:
        typer.echo(
            f"inferflux: server.tls: cannot load cert_path {tls.cert_path} / key_path "
            f"{tls.key_path}: {exc}",
            err=True,
        )
        raise typer.Exit(EXIT_CONFIG_ERROR) from None


def _listen_sockets(config: uvicorn.Config, ollama_port: int | None) -> list[socket.socket] | None:
    """None: uvicorn binds server.port itself. With `ollama_port`, both ports are bound
    here, on the same host, and one server (one app, one engine) accepts on both."""
    if ollama_port is None:
        return None
    ollama = uvicorn.Config(config.app, host=config.host, port=ollama_port, log_config=None)
    return [config.bind_socket(), ollama.bind_socket()]


def _build_app(settings: Settings, security: SecurityState) -> tuple[FastAPI, ModelInfo]:
    """The catalog (the manifest, or `model.path` alone), the default model (verified,
    vocabulary loaded), its engine client and the app. An invalid manifest exits with
    status 2, a default model that cannot be verified or loaded with status 1."""
    try:
        catalog = catalog_from_settings(settings)
        own_settings = model_settings(settings, catalog.default)
        model_info, tokenizer = load_model(catalog.default, own_settings)
        engine = make_engine_client(own_settings, model_info)
        asgi_app = create_app(
            settings,
            engine=engine,
            tokenizer=tokenizer,
            model_info=model_info,
            security=security,
            catalog=catalog,
        )
    except ConfigError as exc:
        typer.echo(f"inferflux: {exc.message}", err=True)
        raise typer.Exit(EXIT_CONFIG_ERROR) from None
    except ModelLoadError as exc:
        typer.echo(f"inferflux: {exc.message}", err=True)
        raise typer.Exit(EXIT_MODEL_ERROR) from None
    return asgi_app, model_info


def startup_banner(settings: Settings, model_info: ModelInfo) -> str:
    """The URL and a ready-to-paste curl for the chat endpoint."""
    host = settings.server.host
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    scheme = "https" if settings.server.tls.enabled else "http"
    base = f"{scheme}://{shown}:{settings.server.port}"
    body = (
        f'{{"model": "{model_info.model_id}", "messages": '
        '[{"role": "user", "content": "Say hello in five words."}], "max_tokens": 32}'
    )
    auth = ' -H "Authorization: Bearer $INFERFLUX_API_KEY"' if settings.auth.enabled else ""
    curl = (
        f"curl -s {base}/v1/chat/completions{auth} -H 'Content-Type: application/json' "
        f"-d {shlex.quote(body)}"
    )
    banner = (
        f"InferFlux serving {model_info.model_id} on {base} "
        f"(ready once {base}/readyz answers 200)\n"
        f"Try:\n  {curl}"
    )
    if settings.server.ollama_port is not None:
        ollama = f"http://{shown}:{settings.server.ollama_port}"
        banner += f"\nOllama clients: OLLAMA_HOST={ollama} (the same API on a second port)"
    if settings.server.grpc_port is not None:
        banner += f"\ngRPC (inferflux.v1.Inference): {shown}:{settings.server.grpc_port}"
    return banner


app.command("router")(router)


def main() -> None:
    """Console-script entry point (`inferflux`)."""
    app()
