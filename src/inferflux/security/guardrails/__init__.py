"""Guardrails: a pluggable chain of content guardrails (blocklist, PII) and an OPA
decision, applied to prompts before they are queued and to output as it streams."""

from inferflux.security.guardrails.chain import (
    CompiledChain,
    GuardrailEvents,
    Guardrails,
    InputVerdict,
    OutputBlocked,
    OutputScanner,
)
from inferflux.security.guardrails.content import (
    Blocklist,
    ContentGuardrail,
    Finding,
    PiiScanner,
    iban_ok,
    luhn_ok,
)
from inferflux.security.guardrails.opa import DecisionContext, OpaGuardrail

__all__ = [
    "Blocklist",
    "CompiledChain",
    "ContentGuardrail",
    "DecisionContext",
    "Finding",
    "GuardrailEvents",
    "Guardrails",
    "InputVerdict",
    "OpaGuardrail",
    "OutputBlocked",
    "OutputScanner",
    "PiiScanner",
    "iban_ok",
    "luhn_ok",
]
