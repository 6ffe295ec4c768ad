"""Bad requests against a real `inferflux serve`: the right status and the OpenAI envelope,
never a 500."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.openai_envelope import assert_envelope

pytestmark = [pytest.mark.model, pytest.mark.server]

USER = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def client(server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server_url, timeout=60) as client:
        yield client


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        (b'{"messages": [', CHAT),
        (b"not json at all", "/v1/completions"),
        (b"", CHAT),
        (b'{"messages": "\xc3\x28"}', CHAT),  # invalid UTF-8
    ],
)
def test_malformed_body_is_400(client: httpx.Client, raw: bytes, path: str) -> None:
    assert_envelope(client.post(path, content=raw, headers=JSON), 400, code="invalid_request")


@pytest.mark.parametrize("raw", [b"[]", b'"a string"', b"3", b"null", b"true"])
def test_non_object_body_is_400(client: httpx.Client, raw: bytes) -> None:
    error = assert_envelope(client.post(CHAT, content=raw, headers=JSON), 400)
    assert "JSON object" in str(error["message"])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": USER, "max_tokens": "ten"}, "max_tokens"),
        ({"messages": USER, "max_tokens": -1}, "max_tokens"),
        ({"messages": USER, "temperature": 3}, "temperature"),
        ({"messages": USER, "stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": 42}]}, "messages[0].content"),
        ({"messages": USER, "n": 17}, "n"),
        ({"messages": USER, "tools": [{"type": "function"}]}, "tools[0].function"),
        ({"messages": USER, "unknown_knob": 1}, "unknown_knob"),
        ({}, "messages"),
    ],
)
def test_invalid_fields_are_400_with_param(
    client: httpx.Client, body: dict[str, object], param: str
) -> None:
    assert_envelope(client.post(CHAT, json=body), 400, param=param)


def test_unknown_model_is_404(client: httpx.Client) -> None:
    response = client.post(CHAT, json={"model": "no-such-model", "messages": USER})
    assert_envelope(response, 404, param="model", code="model_not_found")


def test_prompt_over_context_is_400(client: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "word " * 5000}], "max_tokens": 8}
    error = assert_envelope(client.post(CHAT, json=body), 400, code="context_length_exceeded")
    assert "4096" in str(error["message"])


def test_ten_megabyte_body_is_413(client: httpx.Client) -> None:
    body = b'{"prompt": "' + b"a" * (10 * 1024 * 1024) + b'"}'
    response = client.post("/v1/completions", content=body, headers=JSON)
    assert_envelope(response, 413, code="request_too_large")
    # The connection stays usable for the next request.
    assert client.get("/healthz").status_code == 200


def test_wrong_route_and_method(client: httpx.Client) -> None:
    assert_envelope(client.get("/v2/chat"), 404, code="not_found")
    assert_envelope(client.get(CHAT), 405, code="method_not_allowed")


def test_server_still_generates_after_the_errors(client: httpx.Client) -> None:
    response = client.post(CHAT, json={"messages": USER, "max_tokens": 2, "temperature": 0})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] >= 1


def test_logs_hold_no_prompt_text_and_no_unhandled_errors(
    client: httpx.Client, server_log: Path
) -> None:
    secret = f"secret-{uuid.uuid4().hex}"
    messages = [{"role": "user", "content": f"Repeat {secret}"}]
    client.post(CHAT, json={"messages": messages, "max_tokens": 2})
    client.post(CHAT, json={"messages": messages, "temperature": 9})
    client.post(
        CHAT,
        headers={"authorization": f"Bearer {secret}"},
        json={"messages": USER, "max_tokens": 2},
    )
    log = server_log.read_text(errors="replace")
    assert secret not in log
    assert "unhandled" not in log and "Traceback" not in log
