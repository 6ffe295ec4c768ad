"""`OpaGuardrail`: a contextual decision from Open Policy Agent over HTTP.

POSTs `{"input": {principal, model, route, stage, prompt}}` to the Data API URL in
`guardrails.opa_endpoint` (e.g. `http://opa:8181/v1/data/inferflux/allow`), where
`prompt` is `{"hash": "hmac-sha256:…", "num_chars": n}` or, with
`guardrails.opa_input: text`, `{"text": …, "num_chars": n}`. OPA answers
`{"result": true|false}` or `{"result": {"allow": bool, "reason": "…"}}`.

A deny raises PolicyDenied (403, code content_filter). OPA unreachable, slower than
`guardrails.opa_timeout_s`, answering non-200, or with anything else (an undefined
decision is `{}`) raises PolicyUnavailable (503 policy_unavailable) unless
`guardrails.opa_fail_open`, which lets the request through and logs a warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import httpx

from inferflux.errors import PolicyDenied, PolicyUnavailable
from inferflux.security.digest import TextDigester
from inferflux.security.principal import Principal

logger = logging.getLogger(__name__)
_MAX_REASON_CHARS = 200


@dataclass(frozen=True, slots=True)
class DecisionContext:
    """What a decision is about (besides the text)."""

    principal: Principal
    model: str
    route: str
    stage: Literal["input", "output"] = "input"


class OpaGuardrail:
    name = "opa"

    def __init__(
        self,
        endpoint: str,
        *,
        client: httpx.AsyncClient,
        timeout_s: float,
        fail_open: bool,
        send_text: bool,
        digester: TextDigester,
    ) -> None:
        self.endpoint = endpoint
        self._client = client
        self._timeout_s = timeout_s
        self.fail_open = fail_open
        self._send_text = send_text
        self._digester = digester

    def input_document(self, context: DecisionContext, text: str) -> dict[str, object]:
        principal = context.principal
        prompt: dict[str, object] = {"num_chars": len(text)}
        if self._send_text:
            prompt["text"] = text
        else:
            prompt["hash"] = self._digester.digest(text)
        return {
            "input": {
                "principal": {
                    "subject": principal.subject,
                    "kind": principal.kind,
                    "tenant": principal.tenant,
                    "scopes": sorted(principal.scopes),
                },
                "model": context.model,
                "route": context.route,
                "stage": context.stage,
                "prompt": prompt,
            }
        }

    async def decide(self, context: DecisionContext, text: str) -> str | None:
        """None when allowed (or failing open); raises PolicyDenied / PolicyUnavailable.
        Returns `"fail_open"` when OPA failed and the request goes through anyway."""
        try:
            response = await self._client.post(
                self.endpoint, json=self.input_document(context, text), timeout=self._timeout_s
            )
            allow, reason = _parse(response)
        except (httpx.HTTPError, ValueError) as exc:
            return self._unavailable(type(exc).__name__)
        if not allow:
            detail = f": {reason[:_MAX_REASON_CHARS]}" if reason else ""
            raise PolicyDenied(f"the request was denied by the content policy{detail}")
        return None

    def _unavailable(self, why: str) -> str:
        if self.fail_open:
            logger.warning("OPA decision failed (%s); allowed: guardrails.opa_fail_open", why)
            return "fail_open"
        logger.warning("OPA decision failed (%s); refused (fail closed)", why)
        raise PolicyUnavailable(
            "the content policy service could not decide (unreachable or invalid answer); "
            "retry shortly"
        )


def _parse(response: httpx.Response) -> tuple[bool, str | None]:
    """(allow, reason) from an OPA Data API answer; ValueError when malformed."""
    if response.status_code != 200:
        raise ValueError(f"OPA answered {response.status_code}")
    body = response.json()
    if not isinstance(body, dict) or "result" not in body:
        raise ValueError("OPA's answer has no result (undefined decision?)")
    result = body["result"]
    if isinstance(result, bool):
        return result, None
    if isinstance(result, dict) and isinstance(result.get("allow"), bool):
        reason = result.get("reason")
        return result["allow"], reason if isinstance(reason, str) else None
    raise ValueError("OPA's result is neither a boolean nor {allow: boolean}")
