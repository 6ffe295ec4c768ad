"""`inferctl`: a thin HTTP client of an InferFlux server (no server internals imported).

This is the first cut: `status`, `models`, `completion`, `chat` (one-shot). The
interactive chat, admin commands and `pull` come with issue #8.

Target: `--url`, or `INFERCTL_HOST` (host:port or a URL; default 127.0.0.1:8080);
`INFERCTL_API_KEY` is sent as a Bearer token. Exit codes: 0 ok, 1 server or API error
(the message comes from the error envelope), 2 usage error.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import httpx
import typer

app = typer.Typer(help="Talk to an InferFlux server.", no_args_is_help=True, add_completion=False)

EXIT_API_ERROR = 1
UrlOption = Annotated[str | None, typer.Option("--url", help="Server URL (env INFERCTL_HOST).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the raw JSON response.")]


def _base_url(url: str | None) -> str:
    target = url or os.environ.get("INFERCTL_HOST") or "127.0.0.1:8080"
    return target if "://" in target else f"http://{target}"


def _client(url: str | None) -> httpx.Client:
    key = os.environ.get("INFERCTL_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(
        base_url=_base_url(url), headers=headers, timeout=httpx.Timeout(600, connect=5)
    )


def _fail(message: str) -> typer.Exit:
    typer.echo(f"inferctl: {message}", err=True)
    return typer.Exit(EXIT_API_ERROR)


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return f"{response.status_code}: {error.get('message', response.text)}"
    except (ValueError, AttributeError):
        return f"{response.status_code}: {response.text[:200]}"


def _request(client: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:  # Any: JSON
    try:
        response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise _fail(f"cannot reach {client.base_url}: {exc}") from None
    if response.status_code >= 400:
        raise _fail(_error_message(response))
    return response.json()


def _stream(client: httpx.Client, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The JSON events of an SSE response; raises typer.Exit on an error status or event."""
    try:
        with client.stream("POST", path, json=body) as response:
            if response.status_code >= 400:
                response.read()
                raise _fail(_error_message(response))
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: ") :])
                if "error" in event:
                    raise _fail(str(event["error"].get("message")))
                yield event
    except httpx.HTTPError as exc:
        raise _fail(f"cannot reach {client.base_url}: {exc}") from None


@app.command()
def status(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Health, readiness, model and workers. Exit 1 when the server is not ready."""
    with _client(url) as client:
        stats = _request(client, "GET", "/server/stats")
    if as_json:
        typer.echo(json.dumps(stats, indent=2))
    else:
        typer.echo(f"ready: {stats['ready']}  model: {stats['model']['id']}")
        for worker in stats["workers"]:
            typer.echo(
                f"worker {worker['worker_id']}: pid {worker['pid']} ready {worker['ready']} "
                f"running {worker['num_running']} restarts {worker['restarts']}"
            )
    if not stats["ready"]:
        raise typer.Exit(EXIT_API_ERROR)


@app.command()
def models(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """List the served models."""
    with _client(url) as client:
        listing = _request(client, "GET", "/v1/models")
    if as_json:
        typer.echo(json.dumps(listing, indent=2))
        return
    for model in listing["data"]:
        typer.echo(model["id"])


def _generate(
    url: str | None, path: str, body: dict[str, Any], stream: bool, as_json: bool
) -> None:
    with _client(url) as client:
        if not stream:
            reply = _request(client, "POST", path, json=body)
            choice = reply["choices"][0]
            text = choice["message"]["content"] if "message" in choice else choice["text"]
            typer.echo(json.dumps(reply, indent=2) if as_json else text)
            return
        for event in _stream(client, path, {**body, "stream": True}):
            if as_json:
                typer.echo(json.dumps(event))
                continue
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content") or choice.get("text") or ""
                sys.stdout.write(piece)
                sys.stdout.flush()
        if not as_json:
            typer.echo("")


@app.command()
def completion(
    prompt: Annotated[str, typer.Option(help="Prompt text.")],
    model: Annotated[str | None, typer.Option(help="Model id (default: the server's).")] = None,
    max_tokens: Annotated[int, typer.Option(min=1)] = 128,
    temperature: Annotated[float, typer.Option(min=0.0, max=2.0)] = 0.8,
    stream: Annotated[bool, typer.Option("--stream", help="Print tokens as they come.")] = False,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Complete a prompt (POST /v1/completions)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
    if model:
        body["model"] = model
    _generate(url, "/v1/completions", body, stream, as_json)


@app.command()
def chat(
    message: Annotated[list[str], typer.Option(help="ROLE:TEXT, repeatable (e.g. user:Hello).")],
    system: Annotated[str | None, typer.Option(help="A system message first.")] = None,
    model: Annotated[str | None, typer.Option(help="Model id (default: the server's).")] = None,
    max_tokens: Annotated[int, typer.Option(min=1)] = 256,
    temperature: Annotated[float, typer.Option(min=0.0, max=2.0)] = 0.8,
    stream: Annotated[bool, typer.Option("--stream", help="Print tokens as they come.")] = False,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """One-shot chat (POST /v1/chat/completions)."""
    messages = [{"role": "system", "content": system}] if system else []
    for item in message:
        role, sep, text = item.partition(":")
        if not sep or role not in ("system", "user", "assistant"):
            raise typer.BadParameter(f"{item!r}: use ROLE:TEXT with role system|user|assistant")
        messages.append({"role": role, "content": text})
    body: dict[str, Any] = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    if model:
        body["model"] = model
    _generate(url, "/v1/chat/completions", body, stream, as_json)


def main() -> None:
    """Console-script entry point."""
    app()
