"""The envelope everywhere: 404/405, FastAPI validation (never 422), the catch-all 500."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive, Scope, Send

from inferflux.api.errors import CatchAllMiddleware, invalid_request_from
from inferflux.errors import ServiceUnavailable
from tests.openai_envelope import assert_envelope


async def test_unknown_route_is_404_envelope(client: httpx.AsyncClient) -> None:
    error = assert_envelope(await client.get("/v1/nothing"), 404, code="not_found")
    assert "/v1/nothing" in str(error["message"])


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/chat/completions"), ("DELETE", "/v1/completions"), ("POST", "/v1/models")],
)
async def test_wrong_method_is_405_envelope(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await client.request(method, path)
    assert_envelope(response, 405, code="method_not_allowed")
    assert "allow" in response.headers


async def test_unexpected_exception_is_a_logged_500_envelope(
    app: FastAPI, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError(" ".join(["the", "secret", "prompt"]))

    with caplog.at_level(logging.ERROR, logger="inferflux.api.errors"):
        response = await client.get("/boom")
    error = assert_envelope(response, 500, code="internal_error")
    assert error["type"] == "server_error" and "secret" not in str(error["message"])
    assert "RuntimeError" in caplog.text and "secret prompt" not in caplog.text
    assert "x-request-id" in response.headers


async def test_fastapi_validation_is_400_not_422(app: FastAPI) -> None:
    # Called directly: any FastAPI route with declared parameters makes this FastAPI version
    # leak a ResourceWarning at interpreter exit, and none of our routes declares any.
    handler = app.exception_handlers[RequestValidationError]
    exc = RequestValidationError(
        [{"loc": ("query", "count"), "type": "int_parsing", "msg": "Input should be an integer"}]
    )
    request = Request({"type": "http", "method": "GET", "path": "/", "headers": []})
    response = await handler(request, exc)
    assert response.status_code == 400
    assert json.loads(bytes(response.body))["error"]["param"] == "count"


async def test_service_unavailable_carries_retry_after(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    @app.get("/busy")
    async def busy() -> None:
        raise ServiceUnavailable("busy")

    response = await client.get("/busy")
    assert_envelope(response, 503, code="service_unavailable")
    assert response.headers["retry-after"] == "1"


@pytest.mark.parametrize(
    ("loc", "expected"),
    [
        (("messages", 0, "content", "str"), "messages[0].content"),
        (("messages", 0, "content", "list[ContentPart]", 1, "type"), "messages[0].content[1].type"),
        (("body", "temperature"), "temperature"),
        (("logit_bias", "123", "[key]"), "logit_bias"),
        (("stop", "function-after[_check_stop(), union[str,list[str]]]"), "stop"),
        ((), None),
    ],
)
def test_param_naming_drops_union_tags(loc: tuple[object, ...], expected: str | None) -> None:
    error = invalid_request_from([{"loc": loc, "type": "value_error", "msg": "bad"}])
    assert error.param == expected


def test_union_type_errors_are_merged() -> None:
    errors = [
        {"loc": ("stop", "str"), "type": "string_type", "msg": "x"},
        {"loc": ("stop", "list[str]"), "type": "list_type", "msg": "y"},
    ]
    error = invalid_request_from(errors)
    assert error.param == "stop"
    assert error.message == "invalid type for 'stop': expected a string or an array"


def test_deepest_error_wins() -> None:
    errors = [
        {"loc": ("stop", "str"), "type": "string_type", "msg": "x"},
        {"loc": ("stop", "list[str]", 0), "type": "string_type", "msg": "y"},
    ]
    assert invalid_request_from(errors).param == "stop[0]"


async def test_a_client_gone_while_its_body_is_read_is_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def reads_a_vanished_body(scope: Scope, receive: Receive, send: Send) -> None:
        raise ClientDisconnect()

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    scope: Scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
    with caplog.at_level(logging.INFO, logger="inferflux.api.errors"):
        await CatchAllMiddleware(reads_a_vanished_body)(scope, receive, send)
    assert sent == []  # nobody to answer
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("client disconnected" in r.getMessage() for r in caplog.records)
