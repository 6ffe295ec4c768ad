"""The Responses API's pure parts: the stored-response LRU (owners, bounds, expiry), the
conversation → chat template mapping, and what the request refuses."""

from __future__ import annotations

import pytest

from inferflux.api.response_store import ResponseStore, StoredResponse, owner_of
from inferflux.api.responses.protocol import (
    ResponsesRequest,
    item_json,
    stored_items,
    template_messages,
)
from inferflux.errors import InvalidRequest
from inferflux.security.principal import Principal, Scope


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stored(response_id: str, num_bytes: int = 10) -> StoredResponse:
    return StoredResponse(response_id, {"id": response_id}, (), (), num_bytes)


def test_responses_are_per_owner_and_expire():
    clock = FakeClock()
    store = ResponseStore(max_responses=8, max_bytes=1000, ttl_s=60, clock=clock)
    store.put("tenant:a", stored("r1"))
    assert store.get("tenant:a", "r1") is not None
    assert store.get("tenant:b", "r1") is None
    assert store.delete("tenant:b", "r1") is False
    clock.now += 61
    assert store.get("tenant:a", "r1") is None and len(store) == 0 and store.num_bytes == 0


def test_the_least_recently_used_go_first_under_both_bounds():
    store = ResponseStore(max_responses=2, max_bytes=25, ttl_s=None)
    store.put("o", stored("r1"))
    store.put("o", stored("r2"))
    assert store.get("o", "r1") is not None  # r1 is now the most recent
    store.put("o", stored("r3"))
    assert [store.get("o", r) is not None for r in ("r1", "r2", "r3")] == [True, False, True]
    store.put("o", stored("big", 20))  # 10 + 20 > 25: r3 and r1 go
    assert store.get("o", "big") is not None and store.num_bytes == 20 and len(store) == 1
    store.put("o", stored("huge", 26))  # larger than the whole store: not kept
    assert store.get("o", "huge") is None and store.get("o", "big") is not None


def test_replacing_a_response_keeps_the_byte_count_right():
    store = ResponseStore(max_responses=4, max_bytes=100, ttl_s=None)
    store.put("o", stored("r1", 30))
    store.put("o", stored("r1", 40))
    assert store.num_bytes == 40 and len(store) == 1
    assert store.delete("o", "r1") and store.num_bytes == 0


def test_owners_are_tenants_or_else_keys():
    scopes = frozenset({Scope.GENERATE})
    acme = Principal(subject="k1", kind="api_key", tenant="acme", scopes=scopes)
    alone = Principal(subject="k2", kind="api_key", tenant=None, scopes=scopes)
    assert owner_of(acme) == "tenant:acme" and owner_of(alone) == "subject:k2"


def request(**fields: object) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", **fields})


def test_a_conversation_becomes_template_messages():
    body = request(
        input=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get", "arguments": '{"a": 1}'},
            {"type": "function_call", "call_id": "c2", "name": "get", "arguments": "not json"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ]
    )
    body.check_supported()
    messages = template_messages("You help.", body.checked_input())
    assert [m["role"] for m in messages] == ["system", "system", "user", "assistant", "tool"]
    assert messages[0]["content"] == "You help." and messages[2]["content"] == "Weather?"
    calls = messages[3]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [{"a": 1}, "not json"]
    assert messages[4] == {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "get"}


def test_kept_items_come_back_as_the_same_conversation():
    body = request(input="Hello")
    kept = tuple(item_json(item) for item in body.checked_input())
    assert kept == (
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
    )
    assert template_messages(None, stored_items(kept)) == [{"role": "user", "content": "Hello"}]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input[0].content[0]"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"input": []}, "input"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(fields: dict, param: str):
    body = request(**{"input": "x", **fields})
    with pytest.raises(InvalidRequest) as refused:
        body.check_supported()
    assert refused.value.param == param


def test_what_is_accepted_and_ignored():
    body = request(
        input="x",
        reasoning=None,
        include=[],
        user="u",
        prompt_cache_key="k",
        text={"format": {"type": "text"}, "verbosity": "low"},
    )
    body.check_supported()
    assert body.output_spec() is None and body.stores()
