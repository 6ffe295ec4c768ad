"""`inferctl admin config`: the server's effective settings through `/v1/admin/config`
(the `admin` scope; the key is INFERCTL_API_KEY), and changing the live ones.

Shown as dotted `section.key = value` lines (values as JSON; secrets come as "***" from
the server), the keys the server can change at runtime marked `(live)`. `--set KEY=VALUE`
(repeatable) sends one PATCH with the values nested like the config file; a VALUE is read
as JSON when it parses (`1024`, `true`, `["a"]`, `null`), else as a string. A key the
server can only take at a restart is its 409 `restart_required`, printed as the error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from inferflux.cli.inferctl.admin_policy import emit, exchange
from inferflux.cli.inferctl.client import (
    EXIT_USAGE_ERROR,
    HostOption,
    JsonOption,
    PortOption,
    UrlOption,
    base_url,
    fail,
)

CONFIG = "/v1/admin/config"


def parse_assignment(text: str) -> tuple[list[str], Any]:  # Any: a JSON value
    """`section.key=value` → (["section", "key"], value); exits 2 when malformed."""
    key, sep, raw = text.partition("=")
    path = key.strip().split(".")
    if not sep or len(path) < 2 or not all(part.strip() for part in path):
        raise fail(
            f"--set {text!r}: use SECTION.KEY=VALUE, e.g. scheduler.stream_interval=2",
            EXIT_USAGE_ERROR,
        )
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return [part.strip() for part in path], value


def nest(assignments: list[str]) -> dict[str, Any]:
    """The PATCH body: every `--set` nested like the config file; a key set twice, or set
    and also used as a section (`a.b=1` with `a.b.c=2`), is a usage error."""
    body: dict[str, Any] = {}
    for text in assignments:
        path, value = parse_assignment(text)
        node = body
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise fail(f"--set {text!r} clashes with an earlier --set", EXIT_USAGE_ERROR)
            node = child
        if path[-1] in node:
            raise fail(f"--set {text!r} clashes with an earlier --set", EXIT_USAGE_ERROR)
        node[path[-1]] = value
    return body


def flatten(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) for every leaf; an empty mapping is a leaf."""
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from flatten(value, f"{dotted}.")
        else:
            yield dotted, value


def _is_live(key: str, live: set[str]) -> bool:
    """`key` or a mapping it is an entry of (`observability.tenant_logging.acme`) is live."""
    parts = key.split(".")
    return any(".".join(parts[:end]) in live for end in range(1, len(parts) + 1))


def _config_lines(answer: dict[str, Any]) -> list[str]:
    live = set(answer.get("live", []))
    lines = [
        f"{key} = {json.dumps(value)}{'  (live)' if _is_live(key, live) else ''}"
        for key, value in flatten(answer.get("config", {}))
    ]
    changed = answer.get("changed")
    if changed is not None:
        lines.insert(0, f"changed: {', '.join(changed) or 'nothing (same values)'}")
    return lines


def config(
    assignments: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="Change a live key, e.g. scheduler.stream_interval=2 (repeatable).",
            show_default=False,
        ),
    ] = None,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the effective settings (live keys marked), or change live ones with --set."""
    base = base_url(url, host, port)
    if assignments:
        answer = exchange(base, "PATCH", CONFIG, nest(assignments))
    else:
        answer = exchange(base, "GET", CONFIG)
    emit(answer, as_json, _config_lines(answer))
