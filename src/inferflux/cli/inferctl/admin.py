"""`inferctl admin models` and `inferctl admin adapters`: list the server's models and LoRA
adapters and drive their lifecycle (load, unload, hot swap, default) through
`/v1/admin/models` (the `admin` scope) and `/v1/admin/adapters` (the `adapter-manager`
scope); the key is INFERCTL_API_KEY.

`--load PATH` and `--swap PATH` name a file inside the server's models folder. The SHA-256
is `--sha256`, else computed here from PATH when this machine sees the same file (the
server verifies it either way before llama.cpp reads a byte); the same for `--mmproj`
(a vision model's projector) and `--mmproj-sha256`.
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
ADMIN_ADAPTERS = "/v1/admin/adapters"


def _sha256(path: str, given: str | None, flag: str = "--sha256") -> str:
    if given:
        return given
    local = Path(path).expanduser()
    if not local.is_file():
        raise fail(
            f"{path} is not a file here: give its SHA-256 with {flag} (sha256sum on the server)",
            EXIT_USAGE_ERROR,
        )
    return file_sha256(local)


def mmproj_fields(mmproj: str | None, sha256: str | None) -> dict[str, str]:
    """A load's `mmproj` and `mmproj_sha256`: the SHA-256 given, else computed here from
    the file (a URL's is left to the server: optional for hf://, required for https://)."""
    if not mmproj:
        return {}
    if not sha256 and "://" not in mmproj:
        sha256 = _sha256(mmproj, None, "--mmproj-sha256")
    return {"mmproj": mmproj, **({"mmproj_sha256": sha256} if sha256 else {})}


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
    mmproj: Annotated[
        str | None, typer.Option(help="Its multimodal projector GGUF (images in), or a URL.")
    ] = None,
    mmproj_sha256: Annotated[
        str | None, typer.Option("--mmproj-sha256", help="SHA-256 of the mmproj file.")
    ] = None,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the models, or load / swap / unload one, or set the default."""
    action = _action(load, swap, unload, set_default)
    if mmproj and not (load or swap):
        raise fail("--mmproj goes with --load or --swap", EXIT_USAGE_ERROR)
    body = None
    if action is not None:
        target = {"unload": unload, "set_default": set_default}.get(action, model_id)
        body = _body(
            action, target, load or swap, sha256=sha256, default=default,
            aliases=alias, n_ctx=n_ctx,
        )  # fmt: skip
        body.update(mmproj_fields(mmproj, mmproj_sha256))
    answer = _exchange(ADMIN_MODELS, body, base_url(url, host, port))
    listed = answer.get("data") or answer.get("models") or []
    _print(answer, action, answer.get("id"), [_model_line(m) for m in listed], as_json)


def _exchange(path: str, body: dict[str, Any] | None, url: str) -> Any:  # Any: JSON
    """GET `path` (no body) or POST `body` to it."""
    with make_client(url) as client:
        if body is None:
            return request_json(client, "GET", path)
        return request_json(client, "POST", path, json=body)


def _print(
    answer: dict[str, Any], action: str | None, name: object, lines: list[str], as_json: bool
) -> None:
    """The answer as JSON, or what was done to `name` and then one line per entry."""
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    if action is not None:
        load_s = f" in {answer['load_s']} s" if answer.get("load_s") is not None else ""
        retiring = f"; {answer['retiring']} retires once idle" if answer.get("retiring") else ""
        typer.echo(f"{action} {name}: done{load_s}{retiring}")
    for line in lines:
        typer.echo(line)


def _adapter_line(adapter: dict[str, Any]) -> str:
    return (
        f"{adapter['model']}: {adapter['state']}  scale {adapter['scale']}  "
        f"in-flight {adapter['num_in_flight']}  {adapter['path']}"
        + (f"  error: {adapter['error']}" if adapter.get("error") else "")
    )


@admin_app.command("adapters")
def adapters(
    base: Annotated[
        str | None, typer.Option(help="The base model id (with --load, --swap, --unload).")
    ] = None,
    load: Annotated[str | None, typer.Option(help="Load this LoRA GGUF as --id.")] = None,
    swap: Annotated[
        str | None, typer.Option(help="Swap adapter --id to this GGUF (in-flight requests finish).")
    ] = None,
    unload: Annotated[str | None, typer.Option(help="Unload this adapter id.")] = None,
    adapter_id: Annotated[
        str | None, typer.Option("--id", help="Adapter id to load or swap.")
    ] = None,
    sha256: Annotated[str | None, typer.Option(help="SHA-256 of the file.")] = None,
    scale: Annotated[float | None, typer.Option(help="LoRA scale, -16 to 16 (default 1).")] = None,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the LoRA adapters, or load / swap / unload one. An adapter `ID` on base `BASE` is
    served as the model `BASE:ID`."""
    action = _action(load, swap, unload, None)
    body = None
    if action is not None:
        if not base:
            raise fail(f"--{action} needs --base (the base model id)", EXIT_USAGE_ERROR)
        target = unload if action == "unload" else adapter_id
        body = {**_body(action, target, load or swap, sha256=sha256), "base": base}
        if scale is not None:  # NOTE: 0.0 is a scale too (_body drops falsy fields)
            body["scale"] = scale
    answer = _exchange(ADMIN_ADAPTERS, body, base_url(url, host, port))
    listed = answer.get("data") or answer.get("adapters") or []
    _print(answer, action, answer.get("model"), [_adapter_line(a) for a in listed], as_json)
