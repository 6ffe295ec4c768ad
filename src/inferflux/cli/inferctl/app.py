"""The `inferctl` Typer app: `status`, `models list`, `completion`, `chat`, `pull`,
`quantize`, and `admin models|adapters` (admin.py), `admin api-keys|tenants`
(admin_keys.py), `admin rate-limit|guardrails` (admin_policy.py), `admin config`
(admin_config.py), `admin workers` (admin_workers.py).

Each command resolves the target (`--url`, `--host/--port`, INFERCTL_HOST), makes one
request and prints the answer, or the raw JSON with `--json`. `chat --interactive` hands
over to `chat_repl`; `pull` lives in `pull`, `quantize` in `quantize` (both work on
local files, not through a server). Docs with sample output: docs/cli.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from inferflux import __version__
from inferflux.cli.inferctl import chat_repl, pull, quantize
from inferflux.cli.inferctl.admin import admin_app
from inferflux.cli.inferctl.admin_config import config
from inferflux.cli.inferctl.admin_keys import api_keys_app, tenants_app
from inferflux.cli.inferctl.admin_policy import guardrails, rate_limit
from inferflux.cli.inferctl.admin_workers import workers
from inferflux.cli.inferctl.client import (
    EXIT_API_ERROR,
    HostOption,
    JsonOption,
    PortOption,
    UrlOption,
    base_url,
    delta_text,
    make_client,
    request_json,
    stream_events,
)

app = typer.Typer(help="Talk to an InferFlux server.", no_args_is_help=True, add_completion=False)
models_app = typer.Typer(help="The served models.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(admin_app, name="admin")
admin_app.add_typer(api_keys_app, name="api-keys")
admin_app.add_typer(tenants_app, name="tenants")
admin_app.command("rate-limit")(rate_limit)
admin_app.command("guardrails")(guardrails)
admin_app.command("config")(config)
admin_app.command("workers")(workers)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """Talk to an InferFlux server."""


ModelOption = Annotated[
    str | None, typer.Option(help="Model id (default: the server's).", show_default=False)
]
TemperatureOption = Annotated[float, typer.Option(min=0.0, max=2.0)]
StreamOption = Annotated[bool, typer.Option("--stream", help="Print tokens as they come.")]
DestOption = Annotated[
    Path | None,
    typer.Option(
        help="Models directory (env INFERFLUX_MODELS_DIR, default ~/.cache/inferflux/models).",
        show_default=False,
    ),
]


def _worker_line(worker: dict[str, Any]) -> str:
    line = (
        f"worker {worker['worker_id']}: pid {worker['pid']} ready {worker['ready']} "
        f"running {worker.get('num_running', 0)} waiting {worker.get('num_waiting', 0)} "
        f"in-flight {worker.get('num_in_flight', 0)} restarts {worker['restarts']} "
        f"backend {worker.get('backend', 'cpu')}"
    )
    role = worker.get("role", "unified")
    if role != "unified":  # disaggregated mode: the worker's pool
        line += f" role {role}"
    reason = worker.get("fallback_reason")
    if reason:  # a GPU → CPU fallback (docs/reliability.md)
        line += f" (requested {worker.get('requested_backend')}: {reason})"
    return line


def status_lines(stats: dict[str, Any]) -> list[str]:
    """`inferctl status` in text: readiness, then in disaggregated mode each pool's health
    and the KV channel, then one line per worker."""
    uptime = stats.get("uptime_s", 0.0)
    lines = [f"ready: {stats['ready']}  model: {stats['model']['id']}  uptime: {uptime}s"]
    for role, pool in (stats.get("pools") or {}).items():
        health = "ok" if pool["ready"] else "DOWN" if role == "decode" else "degraded"
        lines.append(
            f"pool {role}: {health}  ready {pool['ready']}/{pool['size']}  "
            f"queue {pool['queue_depth']}  running {pool['num_running']}  "
            f"in-flight {pool['num_in_flight']}"
        )
    channel = stats.get("channel")
    if channel:
        lines.append(
            f"kv channel: in-flight {channel['in_flight']}/{channel['capacity']}  "
            f"{channel['in_flight_bytes'] / 2**20:.1f} MiB  handed off "
            f"{channel['handed_off']}  blocked {channel['blocked']}  direct "
            f"{channel['direct']}  resubmitted {channel['resubmitted']}"
        )
    return lines + [_worker_line(worker) for worker in stats["workers"]]


@app.command()
def status(
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """Health, readiness, model, workers and their queues (in disaggregated mode each
    pool's health and the KV channel). Exit 1 when not ready."""
    with make_client(base_url(url, host, port)) as client:
        stats = request_json(client, "GET", "/server/stats")
    if as_json:
        typer.echo(json.dumps(stats, indent=2))
    else:
        typer.echo("\n".join(status_lines(stats)))
    if not stats["ready"]:
        raise typer.Exit(EXIT_API_ERROR)


@models_app.command("list")
def models_list(
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the served models (GET /v1/models)."""
    with make_client(base_url(url, host, port)) as client:
        listing = request_json(client, "GET", "/v1/models")
    if as_json:
        typer.echo(json.dumps(listing, indent=2))
        return
    for model in listing["data"]:
        typer.echo(model["id"])


def _generate(base: str, path: str, body: dict[str, Any], stream: bool, as_json: bool) -> None:
    with make_client(base) as client:
        if not stream:
            reply = request_json(client, "POST", path, json=body)
            choice = reply["choices"][0]
            text = choice["message"]["content"] if "message" in choice else choice["text"]
            typer.echo(json.dumps(reply, indent=2) if as_json else text)
            return
        for event in stream_events(client, path, {**body, "stream": True}):
            if as_json:
                typer.echo(json.dumps(event))
            else:
                typer.echo(delta_text(event), nl=False)
        if not as_json:
            typer.echo("")


@app.command()
def completion(
    prompt: Annotated[str, typer.Option(help="Prompt text.")],
    model: ModelOption = None,
    max_tokens: Annotated[int, typer.Option(min=1)] = 128,
    temperature: TemperatureOption = 0.8,
    stream: StreamOption = False,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """Complete a prompt (POST /v1/completions)."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
    if model:
        body["model"] = model
    _generate(base_url(url, host, port), "/v1/completions", body, stream, as_json)


def _parse_messages(items: list[str], system: str | None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}] if system else []
    for item in items:
        role, sep, text = item.partition(":")
        if not sep or role not in ("system", "user", "assistant"):
            raise typer.BadParameter(f"{item!r}: use ROLE:TEXT with role system|user|assistant")
        messages.append({"role": role, "content": text})
    return messages


@app.command()
def chat(
    message: Annotated[
        list[str] | None,
        typer.Option(help="ROLE:TEXT, repeatable (e.g. user:Hello).", show_default=False),
    ] = None,
    interactive: Annotated[
        bool, typer.Option("--interactive", "-i", help="A REPL that keeps the dialogue.")
    ] = False,
    system: Annotated[str | None, typer.Option(help="A system message first.")] = None,
    model: ModelOption = None,
    max_tokens: Annotated[int, typer.Option(min=1)] = 256,
    temperature: TemperatureOption = 0.8,
    stream: StreamOption = False,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """Chat (POST /v1/chat/completions): one-shot with --message, or --interactive."""
    messages = _parse_messages(message or [], system)
    base = base_url(url, host, port)
    if interactive:
        options = chat_repl.ReplOptions(model, max_tokens, temperature)
        raise typer.Exit(chat_repl.run(base, messages, options))
    if not message:
        raise typer.BadParameter("give --message ROLE:TEXT (repeatable), or --interactive")
    body: dict[str, Any] = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    if model:
        body["model"] = model
    _generate(base, "/v1/chat/completions", body, stream, as_json)


@app.command("pull")
def pull_command(
    spec: Annotated[str, typer.Argument(metavar="REPO[:FILE]", help="e.g. owner/name:x.gguf")],
    revision: Annotated[str, typer.Option(help="Branch, tag or commit.")] = "main",
    dest: DestOption = None,
    as_json: JsonOption = False,
) -> None:
    """Download a GGUF from the Hugging Face Hub, verify its SHA-256, add it to models.yaml."""
    pulled = pull.pull(spec, revision, pull.models_dir(dest))
    if as_json:
        fields = {key: str(value) for key, value in pulled._asdict().items()}
        typer.echo(json.dumps(fields, indent=2))
        return
    typer.echo(f"saved {pulled.path}")
    typer.echo(f"sha256 {pulled.sha256} ({pulled.verification})")
    typer.echo(f"manifest {pulled.manifest}")
    typer.echo(f"serve it with: inferflux serve --model {pulled.path}")
    typer.echo(f"or every pulled model: inferflux serve --registry {pulled.manifest}")


@app.command("quantize")
def quantize_command(
    src: Annotated[Path, typer.Argument(metavar="SRC", help="GGUF file (F32, F16, BF16, Q8_0).")],
    level: Annotated[str, typer.Option("--type", help="Target level, e.g. Q4_K_M, Q8_0.")],
    dest: DestOption = None,
    sha256: Annotated[
        str | None, typer.Option(help="Expected SHA-256 of SRC (checked before reading).")
    ] = None,
    threads: Annotated[int, typer.Option(min=0, help="CPU threads (0: every core).")] = 0,
    as_json: JsonOption = False,
) -> None:
    """Quantize a GGUF down to --type (llama_model_quantize), into the models directory."""
    done = quantize.quantize(src, level.upper(), pull.models_dir(dest), sha256, threads, as_json)
    if as_json:
        fields = {key: str(value) for key, value in done._asdict().items()}
        typer.echo(json.dumps(fields, indent=2))
        return
    verb = "reused" if done.reused else "saved"
    typer.echo(f"{verb} {done.path} ({done.source_type} → {done.level})")
    typer.echo(f"sha256 {done.sha256}")
    typer.echo(f"serve it with: inferflux serve --model {done.path}")


def main() -> None:
    """Console-script entry point."""
    app()
