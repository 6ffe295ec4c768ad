"""RequestContext: one per request, found on the ASGI scope by every layer; a layer
outside the app keeps what it set (its principal, its arrival time)."""

from __future__ import annotations

import pytest

from inferflux.security.context import UNMATCHED_ROUTE, RequestRecord, context_of, open_context
from inferflux.security.principal import ANONYMOUS


def test_one_context_per_scope() -> None:
    scope: dict[str, object] = {"type": "http"}
    first = context_of(scope)
    assert context_of(scope) is first
    assert first.route == UNMATCHED_ROUTE and first.tenant is None
    with pytest.raises(LookupError):
        _ = first.caller  # authentication never ran


def test_the_request_id_middleware_keeps_an_outer_layers_context() -> None:
    scope: dict[str, object] = {"type": "http"}
    outer = context_of(scope)
    outer.principal = ANONYMOUS
    context = open_context(scope, "req-9")
    assert context is outer and context.request_id == "req-9" and context.caller is ANONYMOUS


def test_the_record_keeps_text_only_when_asked() -> None:
    record = RequestRecord()
    record.set_prompt("secret")
    record.add_completion("answer")
    assert record.prompt_text is None and record.completion_text is None
    record.keep_text = True
    record.set_prompt("secret")
    record.add_completion("a")
    record.add_completion("b")
    assert record.prompt_text == "secret" and record.completion_text == "ab"
    record.add_decision("guardrail:pii:redact")
    record.add_decision("guardrail:pii:redact")
    assert record.policy_decisions == ["guardrail:pii:redact"]
