"""`inferctl admin rate-limit` and `inferctl admin guardrails`: the policy's limits and
guardrail settings through `/v1/admin/rate_limit` and `/v1/admin/guardrails` (the `admin`
scope; the key is INFERCTL_API_KEY). Also the pieces the other policy commands share: the
limit options (`--rpm/--tpm/--concurrent`, a number or `unlimited`) and printing an
answer as text or `--json`.

Both commands read, change and write back: a flag changes only what it names (one
tenant's requests per minute, one blocklist word) and keeps the rest. The read and the
write are two requests, so two admins changing the same policy at once can lose one
change; run `inferctl admin ...` again to see what is in force.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Any, NamedTuple

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

RATE_LIMIT = "/v1/admin/rate_limit"
GUARDRAILS = "/v1/admin/guardrails"
UNLIMITED = 0  # what a limit option holds for `unlimited` (the API's null)
LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "max_concurrent")
_LIMIT_LABELS = ("requests/min", "tokens/min", "concurrent")
PII_ACTIONS = ("off", "redact", "block")


def parse_limit(text: str) -> int:
    """A limit option's value: a positive whole number, or `unlimited` (UNLIMITED)."""
    if text.strip().lower() in ("unlimited", "none"):
        return UNLIMITED
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 1:
        raise typer.BadParameter(f"{text!r}: give a whole number >= 1, or 'unlimited'")
    return value


def _limit_option(flag: str, what: str) -> Any:  # Any: typer's OptionInfo
    return typer.Option(
        flag, parser=parse_limit, metavar="N|unlimited", help=what, show_default=False
    )


RpmOption = Annotated[int | None, _limit_option("--rpm", "Requests per minute.")]
TpmOption = Annotated[int | None, _limit_option("--tpm", "Tokens per minute (prompt + output).")]
ConcurrentOption = Annotated[
    int | None, _limit_option("--concurrent", "Requests in flight at once.")
]


def merge_limits(
    current: dict[str, Any] | None, rpm: int | None, tpm: int | None, concurrent: int | None
) -> dict[str, int]:
    """`current` limits with the given ones set (UNLIMITED drops one): an API limits body."""
    merged = {k: v for k, v in (current or {}).items() if k in LIMIT_FIELDS and v is not None}
    for field, value in zip(LIMIT_FIELDS, (rpm, tpm, concurrent), strict=True):
        if value == UNLIMITED:
            merged.pop(field, None)
        elif value is not None:
            merged[field] = value
    return merged


def limits_text(limits: dict[str, Any] | None) -> str:
    """`requests/min 200  tokens/min unlimited  concurrent 4`."""
    values = [(limits or {}).get(field) for field in LIMIT_FIELDS]
    return "  ".join(
        f"{label} {'unlimited' if value is None else value}"
        for label, value in zip(_LIMIT_LABELS, values, strict=True)
    )


def emit(answer: Any, as_json: bool, lines: Iterable[str]) -> None:  # Any: JSON
    """The answer as indented JSON with `--json`, else the text lines."""
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    for line in lines:
        typer.echo(line)


def exchange(url: str, method: str, path: str, body: Any = None) -> Any:  # Any: JSON
    """One admin request; exits 1 with the server's message on an error."""
    with make_client(url) as client:
        if body is None:
            return request_json(client, method, path)
        return request_json(client, method, path, json=body)


def _rate_limit_lines(answer: dict[str, Any]) -> list[str]:
    lines = [f"default: {limits_text(answer.get('default'))}"]
    lines += [f"tier {name}: {limits_text(v)}" for name, v in answer.get("tiers", {}).items()]
    lines += [f"tenant {name}: {limits_text(v)}" for name, v in answer.get("tenants", {}).items()]
    return lines


def _rate_limit_target(default: bool, tenant: str | None, tier: str | None) -> tuple[str, str]:
    """("default", "") or ("tenants", NAME) or ("tiers", NAME); exits 2 on two targets."""
    given = [("tenants", tenant), ("tiers", tier)]
    named = [(part, name) for part, name in given if name]
    if len(named) + default > 1:
        raise fail("give one of --default, --tenant NAME, --tier NAME", EXIT_USAGE_ERROR)
    return named[0] if named else ("default", "")


def _rate_limit_body(
    current: dict[str, Any], target: tuple[str, str], limits: tuple[int | None, ...]
) -> dict[str, Any]:
    part, name = target
    if part == "default":
        return {"default": merge_limits(current.get("default"), *limits)}
    return {part: {name: merge_limits(current.get(part, {}).get(name), *limits)}}


def rate_limit(
    set_rpm: Annotated[
        int | None, _limit_option("--set", "Shorthand for --rpm (requests per minute).")
    ] = None,
    default: Annotated[
        bool, typer.Option("--default", help="Change the default (per-key) limits.")
    ] = False,
    tenant: Annotated[str | None, typer.Option(help="Change this tenant's limits.")] = None,
    tier: Annotated[str | None, typer.Option(help="Change (or add) this tier's limits.")] = None,
    remove: Annotated[bool, typer.Option("--remove", help="Remove the --tier.")] = False,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrent: ConcurrentOption = None,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the rate limits (default per key, tiers, tenants), or change one target's.

    Without --tenant or --tier the default limits change. Limits not given keep their
    value; `unlimited` lifts one. A key's own limits are set when it is created
    (`inferctl admin api-keys create --rpm ...`)."""
    if set_rpm is not None and rpm is not None:
        raise fail("give --set or --rpm, not both (--set N is --rpm N)", EXIT_USAGE_ERROR)
    limits = (rpm if set_rpm is None else set_rpm, tpm, concurrent)
    target = _rate_limit_target(default, tenant, tier)
    changing = any(value is not None for value in limits)
    base = base_url(url, host, port)
    if remove:
        if target[0] != "tiers" or changing:
            raise fail("--remove goes with --tier NAME alone", EXIT_USAGE_ERROR)
        answer = exchange(base, "PUT", RATE_LIMIT, {"tiers": {target[1]: None}})
    elif changing:
        body = _rate_limit_body(exchange(base, "GET", RATE_LIMIT), target, limits)
        answer = exchange(base, "PUT", RATE_LIMIT, body)
    elif default or tenant or tier:
        raise fail(
            "give the limits to set: --rpm, --tpm, --concurrent (or --set)", EXIT_USAGE_ERROR
        )
    else:
        answer = exchange(base, "GET", RATE_LIMIT)
    emit(answer, as_json, _rate_limit_lines(answer))


def _guardrail_lines(answer: dict[str, Any]) -> list[str]:
    opa = answer.get("opa_endpoint")
    fail_mode = "fail open" if answer.get("opa_fail_open") else "fail closed"
    lines = [
        f"blocklist: {', '.join(answer.get('blocklist', [])) or '(empty)'}",
        f"blocklist_regex: {'  '.join(answer.get('blocklist_regex', [])) or '(empty)'}",
        f"pii: {answer.get('pii_action')}",
        f"opa: {f'{opa} ({fail_mode})' if opa else 'off'}",
    ]
    invalid = answer.get("invalid_blocklist_regex") or []
    if invalid:
        lines.append(f"skipped (not valid RE2, replace them): {'  '.join(invalid)}")
    return lines


def _edited(entries: list[str], add: list[str], remove: list[str], what: str) -> list[str]:
    """`entries` less `remove` (each must be there: exit 2) plus `add` (no duplicates)."""
    missing = [entry for entry in remove if entry not in entries]
    if missing:
        raise fail(f"not in the {what}: {', '.join(map(repr, missing))}", EXIT_USAGE_ERROR)
    kept = [entry for entry in entries if entry not in remove]
    return kept + [entry for entry in dict.fromkeys(add) if entry not in kept]


def _pii_from_set(names: str, pii: str | None) -> str | None:
    """`--set NAMES`: guardrails to switch on. Only `pii` is a switch (to --pii, else block);
    the others need content, so a clear usage error says which option to use."""
    hints = {
        "blocklist": "the blocklist is on while it holds words: --add-word WORD / --add-regex RE",
        "opa": "OPA is on while it has an endpoint: --opa URL",
    }
    for name in (part.strip().lower() for part in names.split(",") if part.strip()):
        if name == "pii":
            pii = pii or "block"
        elif name in hints:
            raise fail(f"--set {name}: {hints[name]}", EXIT_USAGE_ERROR)
        else:
            raise fail(
                f"--set {name}: no guardrail of that name. The guardrails are the blocklist "
                "(--add-word, --add-regex), PII (--pii off|redact|block: emails, phone "
                "numbers, cards, IBANs) and OPA (--opa URL); a word to refuse, such as "
                f"'{name}', goes in with --add-word {name}",
                EXIT_USAGE_ERROR,
            )
    return pii


def _check_pii(pii: str | None) -> None:
    if pii is not None and pii not in PII_ACTIONS:
        raise fail(f"--pii {pii!r}: use one of {', '.join(PII_ACTIONS)}", EXIT_USAGE_ERROR)


class GuardrailChange(NamedTuple):
    """What the guardrails flags ask for; `apply` turns the current policy into the PUT body."""

    add_word: list[str]
    remove_word: list[str]
    add_regex: list[str]
    remove_regex: list[str]
    pii: str | None
    opa: str | None
    no_opa: bool
    opa_fail_open: bool | None

    def any(self) -> bool:
        edits = (self.add_word, self.remove_word, self.add_regex, self.remove_regex)
        return (
            any(edits)
            or bool(self.pii or self.opa or self.no_opa)
            or (self.opa_fail_open is not None)
        )

    def apply(self, current: dict[str, Any]) -> dict[str, Any]:
        """The whole policy to PUT (the read-only `invalid_blocklist_regex` left out)."""
        body = {k: v for k, v in current.items() if k != "invalid_blocklist_regex"}
        body["blocklist"] = _edited(body["blocklist"], self.add_word, self.remove_word, "blocklist")
        body["blocklist_regex"] = _edited(
            body["blocklist_regex"], self.add_regex, self.remove_regex, "blocklist_regex"
        )
        body["pii_action"] = self.pii or body["pii_action"]
        body["opa_endpoint"] = None if self.no_opa else (self.opa or body["opa_endpoint"])
        if self.opa_fail_open is not None:
            body["opa_fail_open"] = self.opa_fail_open
        return body


def guardrails(
    add_word: Annotated[
        list[str] | None, typer.Option(help="Refuse this word (repeatable).")
    ] = None,
    remove_word: Annotated[
        list[str] | None, typer.Option(help="Take a word off the blocklist (repeatable).")
    ] = None,
    add_regex: Annotated[
        list[str] | None, typer.Option(help="Refuse this RE2 pattern (repeatable).")
    ] = None,
    remove_regex: Annotated[
        list[str] | None, typer.Option(help="Take a pattern off (repeatable).")
    ] = None,
    pii: Annotated[
        str | None, typer.Option(metavar="off|redact|block", help="PII detection.")
    ] = None,
    set_names: Annotated[
        str | None, typer.Option("--set", metavar="NAMES", help="Switch on: `pii` (= --pii block).")
    ] = None,
    opa: Annotated[str | None, typer.Option(metavar="URL", help="OPA decision URL.")] = None,
    no_opa: Annotated[bool, typer.Option("--no-opa", help="No OPA decision.")] = False,
    opa_fail_open: Annotated[
        bool | None,
        typer.Option(
            "--opa-fail-open/--opa-fail-closed",
            help="Allow (open) or refuse (closed) requests when OPA fails.",
            show_default=False,
        ),
    ] = None,
    url: UrlOption = None,
    host: HostOption = None,
    port: PortOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the guardrails, or change them: blocklist words and patterns, PII, OPA."""
    if opa and no_opa:
        raise fail("give --opa URL or --no-opa, not both", EXIT_USAGE_ERROR)
    pii = _pii_from_set(set_names, pii) if set_names is not None else pii
    _check_pii(pii)
    base = base_url(url, host, port)
    answer = exchange(base, "GET", GUARDRAILS)
    change = GuardrailChange(
        add_word or [], remove_word or [], add_regex or [], remove_regex or [],
        pii, None if no_opa else opa, no_opa, opa_fail_open,
    )  # fmt: skip
    if change.any():
        answer = exchange(base, "PUT", GUARDRAILS, change.apply(answer))
    emit(answer, as_json, _guardrail_lines(answer))
