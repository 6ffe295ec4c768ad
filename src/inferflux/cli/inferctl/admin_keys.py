"""`inferctl admin api-keys` and `inferctl admin tenants`: API keys (create, list, show,
rotate, revoke) through `/v1/admin/api_keys` and tenants (create, list, show, update,
delete) through `/v1/admin/tenants` (the `admin` scope; the key is INFERCTL_API_KEY).

A new or rotated key's plaintext is in the server's answer once: `create` and `rotate`
print it once, and nothing else here can show it again (the server keeps a digest).
`tenants update` reads the tenant and writes it back with the options given changed.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote

import typer

from inferflux.cli.inferctl.admin_policy import (
    ConcurrentOption,
    RpmOption,
    TpmOption,
    emit,
    exchange,
    limits_text,
    merge_limits,
)
from inferflux.cli.inferctl.client import (
    EXIT_USAGE_ERROR,
    HostOption,
    JsonOption,
    PortOption,
    UrlOption,
    base_url,
    fail,
)

API_KEYS = "/v1/admin/api_keys"
TENANTS = "/v1/admin/tenants"
PRIORITIES = ("high", "normal", "low")
SCOPES = ("generate", "read", "admin", "adapter-manager")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400}

api_keys_app = typer.Typer(
    help="API keys: create, list, show, rotate, revoke.", no_args_is_help=True
)
tenants_app = typer.Typer(help="Tenants: create, list, show, update, delete.", no_args_is_help=True)

KeyIdArgument = Annotated[str, typer.Argument(metavar="KEY_ID", help="The key's id (key_...).")]
TenantArgument = Annotated[str, typer.Argument(metavar="NAME", help="The tenant's name.")]
ModelsOption = Annotated[
    list[str] | None,
    typer.Option("--model", help="Allow only this model (repeatable).", show_default=False),
]
PriorityCapOption = Annotated[
    str | None, typer.Option(metavar="high|normal|low", help="Highest priority it may ask for.")
]


def parse_duration(text: str) -> float:
    """`3600`, `90s`, `30m`, `12h`, `30d` → seconds."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None or float(match.group(1)) <= 0:
        raise typer.BadParameter(f"{text!r}: give a duration such as 3600, 90s, 30m, 12h or 30d")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def _check_scopes(scopes: list[str]) -> None:
    unknown = [scope for scope in scopes if scope not in SCOPES]
    if unknown:
        raise fail(
            f"--scope {', '.join(unknown)}: use {', '.join(SCOPES)} (or --role)", EXIT_USAGE_ERROR
        )


def _check_priority(priority_cap: str | None) -> None:
    if priority_cap is not None and priority_cap not in PRIORITIES:
        raise fail(
            f"--priority-cap {priority_cap!r}: use one of {', '.join(PRIORITIES)}",
            EXIT_USAGE_ERROR,
        )


def _utc(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key_line(key: dict[str, Any]) -> str:
    expires_at = key.get("expires_at")
    expired = expires_at is not None and expires_at <= time.time()
    state = " REVOKED" if key.get("revoked") else (" EXPIRED" if expired else "")
    name = f" {key['name']!r}" if key.get("name") else ""
    return (
        f"{key['id']}{name}{state}  tenant {key['tenant']}  scopes {','.join(key['scopes'])}"
        f"  source {key['source']}"
    )


def _key_lines(key: dict[str, Any]) -> list[str]:
    """Every field of a key view, one per line (the view never holds a secret)."""
    lines = [_key_line(key)]
    if key.get("limits"):
        lines.append(f"  limits: {limits_text(key['limits'])}")
    for field in ("rate_limit_tier", "priority_cap", "allowed_models"):
        if key.get(field) is not None:
            value = key[field]
            lines.append(f"  {field}: {', '.join(value) if isinstance(value, list) else value}")
    for field in ("created_at", "expires_at"):
        if key.get(field) is not None:
            lines.append(f"  {field}: {_utc(key[field])}")
    return lines


def _new_key_lines(answer: dict[str, Any], verb: str) -> list[str]:
    replaces = f" (replaces {answer['replaces']}, now revoked)" if answer.get("replaces") else ""
    return [
        f"{verb}{replaces}:",
        *_key_lines(answer),
        f"key: {answer['key']}",
        "This is the only time the key is shown: store it now.",
    ]


@api_keys_app.command("create")
def create_key(
    scope: Annotated[
        list[str] | None,
        typer.Option(
            help="generate, read, admin or adapter-manager (repeatable).", show_default=False
        ),
    ] = None,
    role: Annotated[
        list[str] | None, typer.Option(help="A role from auth.roles, e.g. user (repeatable).")
    ] = None,
    name: Annotated[str, typer.Option(help="A label for listings.")] = "",
    tenant: Annotated[str, typer.Option(help="The key's tenant (it must exist).")] = "default",
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrent: ConcurrentOption = None,
    tier: Annotated[
        str | None, typer.Option(help="Rate-limit tier (applies unless it has own limits).")
    ] = None,
    priority_cap: PriorityCapOption = None,
    model: ModelsOption = None,
    expires_in: Annotated[
        float | None,
        typer.Option(parser=parse_duration, metavar="DURATION", help="e.g. 30d, 12h, 3600."),
    ] = None,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a key and print it (once: the server keeps only its digest)."""
    if not scope and not role:
        raise fail("give the key --scope SCOPE or --role ROLE (repeatable)", EXIT_USAGE_ERROR)
    _check_scopes(scope or [])
    _check_priority(priority_cap)
    body: dict[str, Any] = {
        "name": name,
        "tenant": tenant,
        "scopes": scope or [],
        "roles": role or [],
    }
    limits = merge_limits(None, rpm, tpm, concurrent)
    optional = {
        "limits": limits or None,
        "rate_limit_tier": tier,
        "priority_cap": priority_cap,
        "allowed_models": model or None,
        "expires_in_s": expires_in,
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    answer = exchange(base_url(url, host, port), "POST", API_KEYS, body)
    emit(answer, as_json, _new_key_lines(answer, "created"))


@api_keys_app.command("list")
def list_keys(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the keys (revoked ones too), without secrets."""
    path = API_KEYS if tenant is None else f"{API_KEYS}?tenant={quote(tenant, safe='')}"
    answer = exchange(base_url(url, host, port), "GET", path)
    emit(answer, as_json, [_key_line(key) for key in answer["data"]] or ["(no keys)"])


def _one_key(verb: str, key_id: str, url: str) -> Any:  # Any: JSON
    method, suffix = {"show": ("GET", ""), "revoke": ("DELETE", ""), "rotate": ("POST", "/rotate")}[
        verb
    ]
    return exchange(url, method, f"{API_KEYS}/{_segment(key_id)}{suffix}")


def _segment(value: str) -> str:
    """`value` as one path segment: a `/` or `?` in an id is a usage error, not another route."""
    if not value or any(char in value for char in "/?#") or value in (".", ".."):
        raise fail(f"{value!r} is not an id or a name", EXIT_USAGE_ERROR)
    return value


@api_keys_app.command("show")
def show_key(
    key_id: KeyIdArgument,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """One key's fields (never its secret)."""
    answer = _one_key("show", key_id, base_url(url, host, port))
    emit(answer, as_json, _key_lines(answer))


@api_keys_app.command("rotate")
def rotate_key(
    key_id: KeyIdArgument,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """A new key (and id) with the same rights; the old one is revoked at once."""
    answer = _one_key("rotate", key_id, base_url(url, host, port))
    emit(answer, as_json, _new_key_lines(answer, "rotated"))


@api_keys_app.command("revoke")
def revoke_key(
    key_id: KeyIdArgument,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """Revoke a key: 401 from its next request on (revoking twice is harmless)."""
    answer = _one_key("revoke", key_id, base_url(url, host, port))
    emit(answer, as_json, [f"revoked {answer['id']}"])


def _tenant_lines(tenant: dict[str, Any]) -> list[str]:
    models = tenant.get("allowed_models")
    return [
        f"{tenant['name']}: {limits_text(tenant.get('limits'))}  "
        f"active keys {tenant.get('num_active_keys', 0)}",
        f"  models: {', '.join(models) if models is not None else 'any'}  "
        f"priority cap: {tenant.get('priority_cap') or 'none'}  "
        f"shared prefix cache: {tenant.get('share_prefix_cache')}",
    ]


@tenants_app.command("list")
def list_tenants(
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the configured tenants with their limits and number of active keys."""
    answer = exchange(base_url(url, host, port), "GET", TENANTS)
    lines = [line for tenant in answer["data"] for line in _tenant_lines(tenant)]
    emit(answer, as_json, lines or ["(no tenants)"])


@tenants_app.command("show")
def show_tenant(
    name: TenantArgument,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """One tenant."""
    answer = exchange(base_url(url, host, port), "GET", f"{TENANTS}/{_segment(name)}")
    emit(answer, as_json, _tenant_lines(answer))


ShareOption = Annotated[
    bool | None,
    typer.Option(
        "--share-prefix-cache/--no-share-prefix-cache",
        help="Share cached prompt prefixes with other tenants.",
        show_default=False,
    ),
]
AnyModelOption = Annotated[bool, typer.Option("--any-model", help="Lift the --model restriction.")]


def _tenant_fields(
    current: dict[str, Any],
    limits: tuple[int | None, int | None, int | None],
    models: list[str] | None,
    any_model: bool,
    priority_cap: str | None,
    share: bool | None,
) -> dict[str, Any]:
    """The PUT/POST fields: `current` (a tenant view) with the given options changed;
    exits 2 (before any request) on options that contradict each other."""
    if models and any_model:
        raise fail("give --model or --any-model, not both", EXIT_USAGE_ERROR)
    _check_priority(priority_cap)
    fields: dict[str, Any] = {
        "limits": merge_limits(current.get("limits"), *limits),
        "allowed_models": None if any_model else (models or current.get("allowed_models")),
        "priority_cap": priority_cap or current.get("priority_cap"),
        "share_prefix_cache": bool(current.get("share_prefix_cache")) if share is None else share,
    }
    return fields


@tenants_app.command("create")
def create_tenant(
    name: TenantArgument,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrent: ConcurrentOption = None,
    model: ModelsOption = None,
    priority_cap: PriorityCapOption = None,
    share_prefix_cache: ShareOption = None,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a tenant (limits not given: the default limits)."""
    fields = _tenant_fields({}, (rpm, tpm, concurrent), model, False, priority_cap,
                            share_prefix_cache)  # fmt: skip
    if not fields["limits"]:
        fields.pop("limits")  # the server then gives the default limits
    answer = exchange(base_url(url, host, port), "POST", TENANTS, {"name": name, **fields})
    emit(answer, as_json, [f"created tenant {answer['name']}", *_tenant_lines(answer)])


@tenants_app.command("update")
def update_tenant(
    name: TenantArgument,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrent: ConcurrentOption = None,
    model: ModelsOption = None,
    any_model: AnyModelOption = False,
    priority_cap: PriorityCapOption = None,
    share_prefix_cache: ShareOption = None,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """Change the options given (the rest stay as they are; `unlimited` lifts a limit)."""
    base, path = base_url(url, host, port), f"{TENANTS}/{_segment(name)}"
    options = ((rpm, tpm, concurrent), model, any_model, priority_cap, share_prefix_cache)
    _tenant_fields({}, *options)  # usage errors before any request
    fields = _tenant_fields(exchange(base, "GET", path), *options)
    answer = exchange(base, "PUT", path, fields)
    emit(answer, as_json, [f"updated tenant {answer['name']}", *_tenant_lines(answer)])


@tenants_app.command("delete")
def delete_tenant(
    name: TenantArgument,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete a tenant no active key names (revoke its keys first)."""
    answer = exchange(base_url(url, host, port), "DELETE", f"{TENANTS}/{_segment(name)}")
    emit(answer, as_json, [f"deleted tenant {name}"])
