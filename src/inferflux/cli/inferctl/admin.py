"""`inferctl admin models`: list the server's models and drive their lifecycle (load, unload,
hot swap, default) through `/v1/admin/models` (the `admin` scope: INFERCTL_API_KEY).

`--load PATH` and `--swap PATH` name a file inside the server's models folder. The SHA-256
is `--sha256`, else computed here from PATH when this machine sees the same file (the
server verifies it either way before llama.cpp reads a byte).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from inferflux.cli.inferctl.client import (
    EXIT_USAGE_ERROR,
    HostOption,
    JsonOption,
    PortOption,
    UrlOption,
    base_url,
    fail,
    make_client,
    request_json,
)
from inferflux.cli.inferctl.pull import file_sha256

admin_app = typer.Typer(help="Server administration (admin scope).", no_args_is_help=True)

ADMIN_MODELS = "/v1/admin/models"


def _sha256(path: str, given: str | None) -> str:
    if given:
        return given
    local = Path(path).expanduser()
    if not local.is_file():
        raise fail(
            f"{path} is not a file here: give its SHA-256 with --sha256 (sha256sum on the server)",
            EXIT_USAGE_ERROR,
        )
    return file_sha256(local)


def _action(
    load: str | None, swap: str | None, unload: str | None, set_default: str | None
) -> str | None:
    chosen = [name for name, value in (("load", load), ("swap", swap), ("unload", unload),
              ("set_default", set_default)) if value]  # fmt: skip
    if len(chosen) > 1:
        raise fail("give one of --load, --swap, --unload, --set-default", EXIT_USAGE_ERROR)
    return chosen[0] if chosen else None


def _body(action: str, model_id: str | None, path: str | None, **entry: Any) -> dict[str, Any]:
    if not model_id:
        raise fail(f"--{action.replace('_', '-')} needs --id", EXIT_USAGE_ERROR)
    body: dict[str, Any] = {"action": action, "id": model_id}
    if path is not None:
        body.update(path=path, sha256=_sha256(path, entry.pop("sha256")))
        body.update({key: value for key, value in entry.items() if value})
    return body


def _model_line(model: dict[str, Any]) -> str:
    marks = " (default)" if model["default"] else ""
    aliases = f" aliases {','.join(model['aliases'])}" if model["aliases"] else ""
    return (
        f"{model['id']}{marks}: {model['state']}  in-flight {model['num_in_flight']}  "
        f"workers {len(model['workers'])}{aliases}  {model['path']}"
        + (f"  error: {model['error']}" if model.get("error") else "")
    )


@admin_app.command("models")
def models(
    load: Annotated[str | None, typer.Option(help="Load this GGUF (needs --id).")] = None,
    swap: Annotated[
        str | None, typer.Option(help="Hot swap --id to this GGUF (in-flight requests finish).")
    ] = None,
    unload: Annotated[str | None, typer.Option(help="Unload this model id.")] = None,
    set_default: Annotated[
        str | None, typer.Option("--set-default", help="Make this model id the default.")
    ] = None,
    model_id: Annotated[str | None, typer.Option("--id", help="Model id to load or swap.")] = None,
    sha256: Annotated[str | None, typer.Option(help="SHA-256 of the file.")] = None,
    default: Annotated[bool, typer.Option("--default", help="Also make it the default.")] = False,
    alias: Annotated[list[str] | None, typer.Option(help="An alias (repeatable).")] = None,
    n_ctx: Annotated[int | None, typer.Option(help="Context per request.")] = None,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the models, or load / swap / unload one, or set the default."""
    action = _action(load, swap, unload, set_default)
    with make_client(base_url(url, host, port)) as client:
        if action is None:
            answer = request_json(client, "GET", ADMIN_MODELS)
        else:
            target = {"unload": unload, "set_default": set_default}.get(action, model_id)
            body = _body(
                action, target, load or swap, sha256=sha256, default=default,
                aliases=alias, n_ctx=n_ctx,
            )  # fmt: skip
            answer = request_json(client, "POST", ADMIN_MODELS, json=body)
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    if action is not None:
        load_s = f" in {answer['load_s']} s" if answer.get("load_s") is not None else ""
        retiring = f"; {answer['retiring']} retires once idle" if answer.get("retiring") else ""
        typer.echo(f"{action} {answer['id']}: done{load_s}{retiring}")
    for model in answer.get("data") or answer.get("models") or []:
        typer.echo(_model_line(model))
