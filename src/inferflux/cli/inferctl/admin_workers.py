"""`inferctl admin workers`: each loaded model's engine workers through `/v1/admin/workers`
(the `admin` scope; the key is INFERCTL_API_KEY), and runtime scaling with `--set N`
(in disaggregated mode `--role prefill|decode` picks the pool; default: decode).

Without `--model` the listing shows every loaded model and `--set` scales the default
model. The count set lasts until the model is loaded again or the server restarts.
Exit codes: 2 a usage error (a count outside 1..64, --role without --set), 1 the server's
error (a role in unified mode is the server's 400).
"""

from __future__ import annotations

import enum
from typing import Annotated, Any
from urllib.parse import quote

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

WORKERS = "/v1/admin/workers"
_MAX_WORKERS = 64  # the server's bound (engine/protocol.py MAX_WORKERS)


class Role(enum.StrEnum):
    """The pools of disaggregated mode (`scheduler.mode`)."""

    PREFILL = "prefill"
    DECODE = "decode"


def _worker_line(worker: dict[str, Any]) -> str:
    state = "draining" if worker.get("draining") else "ready" if worker["ready"] else "starting"
    return (
        f"  worker {worker['worker_id']}  pid {worker['pid']}  {state}  "
        f"in-flight {worker['num_in_flight']}  restarts {worker['restarts']}  "
        f"hangs {worker.get('hangs', 0)}" + _role(worker)
    )


def _role(worker: dict[str, Any]) -> str:
    role = worker.get("role", "unified")
    return "" if role == "unified" else f"  role {role}"


def _model_lines(model: dict[str, Any]) -> list[str]:
    mark = " (default)" if model.get("default") else ""
    draining = f", draining {model['num_draining']}" if model.get("num_draining") else ""
    head = f"{model['model']}{mark}: workers {model['num_workers']}{draining}"
    pools = model.get("pools") or {}
    if pools:  # disaggregated mode
        head += "  " + "  ".join(f"{r} {p['ready']}/{p['size']} ready" for r, p in pools.items())
    return [head, *(_worker_line(w) for w in model["workers"])]


def workers(
    model: Annotated[
        str | None,
        typer.Option("--model", help="The model (id or alias). Default: the default model."),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option("--set", metavar="N", help="Run N workers of the model from now on."),
    ] = None,
    role: Annotated[
        Role | None,
        typer.Option("--role", help="Disaggregated mode: the pool --set scales (default: decode)."),
    ] = None,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the workers of the loaded models, or scale one model's with --set N."""
    base = base_url(url, host, port)
    if role is not None and count is None:
        raise fail("--role goes with --set N (the pool to scale)", EXIT_USAGE_ERROR)
    if count is not None:
        if not 1 <= count <= _MAX_WORKERS:
            raise fail(f"--set {count}: give 1..{_MAX_WORKERS} workers", EXIT_USAGE_ERROR)
        body: dict[str, Any] = {"workers": count}
        if model is not None:
            body["model"] = model
        if role is not None:
            body["role"] = role.value
        answer = exchange(base, "POST", WORKERS, body)
        emit(answer, as_json, _model_lines(answer))
        return
    path = WORKERS if model is None else f"{WORKERS}?model={quote(model, safe='')}"
    answer = exchange(base, "GET", path)
    emit(answer, as_json, [line for m in answer["data"] for line in _model_lines(m)])
