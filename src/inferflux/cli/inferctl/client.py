"""The HTTP side of `inferctl`: where the server is, an authenticated client, JSON and SSE.

Owns target resolution (`--url`, `--host/--port`, `INFERCTL_HOST`), the Bearer key
(`INFERCTL_API_KEY`) and turning transport or API failures into one `typer.Exit(1)` with a
message on stderr. It knows nothing about commands or their output.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Annotated, Any

import httpx
import typer

EXIT_API_ERROR = 1
EXIT_USAGE_ERROR = 2
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080

UrlOption = Annotated[
    str | None, typer.Option("--url", help="Server URL (env INFERCTL_HOST).", show_default=False)
]
HostOption = Annotated[
    str | None, typer.Option("--host", help=f"Server host (default: {DEFAULT_HOST}).")
]
PortOption = Annotated[
    int | None, typer.Option("--port", min=1, max=65535, help=f"Port (default: {DEFAULT_PORT}).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the raw JSON response.")]


def base_url(url: str | None = None, host: str | None = None, port: int | None = None) -> str:
    """The server's base URL: `--url`, else `--host/--port`, else INFERCTL_HOST, else default.

    `--url` and `INFERCTL_HOST` may be `host:port` or a full URL.
    """
    if url and (host or port):
        raise typer.BadParameter("give either --url or --host/--port, not both")
    if url:
        target = url
    elif host or port:
        target = f"{host or DEFAULT_HOST}:{port or DEFAULT_PORT}"
    else:
        target = os.environ.get("INFERCTL_HOST") or f"{DEFAULT_HOST}:{DEFAULT_PORT}"
    return target if "://" in target else f"http://{target}"


def make_client(base: str) -> httpx.Client:
    """A client for `base` that sends INFERCTL_API_KEY as a Bearer token when it is set."""
    key = os.environ.get("INFERCTL_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=base, headers=headers, timeout=httpx.Timeout(600, connect=5))


def fail(message: str, code: int = EXIT_API_ERROR) -> typer.Exit:
    """Write `inferctl: message` to stderr; the caller raises the returned Exit."""
    typer.echo(f"inferctl: {message}", err=True)
    return typer.Exit(code)


def error_message(response: httpx.Response) -> str:
    """`status: message` from the OpenAI error envelope, or the start of the raw body."""
    try:
        error = response.json().get("error", {})
        return f"{response.status_code}: {error.get('message', response.text)}"
    except (ValueError, AttributeError):
        return f"{response.status_code}: {response.text[:200]}"


def request_json(client: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:  # Any: JSON
    """The decoded JSON body; raises typer.Exit(1) when unreachable or on an error status."""
    try:
        response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise fail(f"cannot reach {client.base_url}: {exc}") from None
    if response.status_code >= 400:
        raise fail(error_message(response))
    return response.json()


class ApiError(Exception):
    """The server answered a stream with an error status or an error event."""


def iter_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON events of an open SSE response until `data: [DONE]`; ApiError on an error."""
    if response.status_code >= 400:
        response.read()
        raise ApiError(error_message(response))
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return
        event: dict[str, Any] = json.loads(line[len("data: ") :])
        if "error" in event:
            raise ApiError(str(event["error"].get("message")))
        yield event


def stream_events(
    client: httpx.Client, path: str, body: dict[str, Any]
) -> Iterator[dict[str, Any]]:
    """POST `body` and yield its SSE events; raises typer.Exit(1) on any failure."""
    try:
        with client.stream("POST", path, json=body) as response:
            yield from iter_events(response)
    except ApiError as exc:
        raise fail(str(exc)) from None
    except httpx.HTTPError as exc:
        raise fail(f"cannot reach {client.base_url}: {exc}") from None


def delta_text(event: dict[str, Any]) -> str:
    """The text a chat or completion stream event carries (empty for role/usage events)."""
    pieces = []
    for choice in event.get("choices", []):
        pieces.append(choice.get("delta", {}).get("content") or choice.get("text") or "")
    return "".join(pieces)
