"""Every error leaves the server as the OpenAI envelope; this module holds the only handlers.

`{"error": {"message", "type", "param", "code"}}` with the status of the `InferfluxError`
subclass (see `errors.py`). Owns: rendering `InferfluxError`, turning pydantic and FastAPI
validation errors into a 400 whose `param` names the field (never FastAPI's 422), the
envelope for Starlette's 404/405, and `CatchAllMiddleware`, which turns any other exception
into a logged 500 envelope (never a traceback, never prompt text).

The exceptions, with the same status (`error_body` picks the shape by path): under `/api/`
(the Ollama-compatible routes; not LM Studio's `/api/v0/`, which answer as OpenAI) the
body is Ollama's `{"error": "<message>"}`; under
`/v1/messages` Anthropic's `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from pydantic_core import ErrorDetails
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferflux.config.policy_schema import UNUSABLE
from inferflux.errors import (
    InferfluxError,
    InvalidRequest,
    QueueTimeout,
    ServiceUnavailable,
    Unprocessable,
)

logger = logging.getLogger(__name__)

_FIELD_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
_LOCATIONS = frozenset({"body", "query", "path", "header", "cookie"})
_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "none_required": "null",
}


OLLAMA_PATH_PREFIX = "/api/"
LMSTUDIO_PATH_PREFIX = "/api/v0/"  # LM Studio's REST API: OpenAI's shapes, under /api/
ANTHROPIC_PATH_PREFIX = "/v1/messages"
# Anthropic's error `type` by HTTP status (anything else: `api_error`)
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error_body(exc: InferfluxError) -> Mapping[str, object]:
    """Anthropic's `{"type": "error", "error": {"type", "message"}}`; the message starts
    with the field at fault when there is one (`messages[0].content[0]: ...`)."""
    kind = _ANTHROPIC_ERROR_TYPES.get(exc.http_status, "api_error")
    message = exc.message
    if exc.param and exc.param not in message:
        message = f"{exc.param}: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


def is_ollama_path(path: str) -> bool:
    """Under `/api/` (Ollama's routes) and not LM Studio's `/api/v0/` (OpenAI's shapes)."""
    return path.startswith(OLLAMA_PATH_PREFIX) and not path.startswith(LMSTUDIO_PATH_PREFIX)


def error_body(exc: InferfluxError, path: str = "") -> Mapping[str, object]:
    """Ollama's `{"error": message}` for a path under `/api/` (not LM Studio's
    `/api/v0/`), Anthropic's body under `/v1/messages`, else the OpenAI envelope."""
    if is_ollama_path(path):
        return {"error": exc.message}
    if path.startswith(ANTHROPIC_PATH_PREFIX):
        return anthropic_error_body(exc)
    return exc.to_body()


def error_response(exc: InferfluxError, path: str = "") -> Response:
    """The error response for `exc` on `path` (the body shape: `error_body`), with
    Retry-After when the client should retry."""
    headers = exc.headers()
    if isinstance(exc, ServiceUnavailable):
        headers = {"retry-after": str(exc.retry_after_s), **headers}
    elif isinstance(exc, QueueTimeout):
        headers = {"retry-after": str(exc.retry_after_s), "connection": "close", **headers}
    return Response(
        msgspec.json.encode(error_body(exc, path)),
        status_code=exc.http_status,
        headers=headers,
        media_type="application/json",
    )


def invalid_request_from(
    errors: Sequence[ErrorDetails] | Sequence[Any],
) -> InvalidRequest | Unprocessable:
    """A 400 naming the most specific failing field of a pydantic/FastAPI error list, or a
    422 when every error is a well-formed value the policy cannot use (`UNUSABLE`, e.g. a
    blocklist pattern RE2 cannot run).

    `Any`: FastAPI's RequestValidationError.errors() is typed as a sequence of Any.
    """
    if not errors:
        return InvalidRequest("the request body is invalid")
    malformed = [err for err in errors if err["type"] != UNUSABLE]
    if not malformed:
        return Unprocessable(errors[0]["msg"], param=_param_of(errors[0]["loc"]))
    errors = malformed
    ranked = [(_param_of(err["loc"]), err) for err in errors]
    depth = max(len(param or "") for param, _ in ranked)
    param, first = next((p, e) for p, e in ranked if len(p or "") == depth)
    siblings = [e for p, e in ranked if p == param]
    return InvalidRequest(_describe(param, first, siblings), param=param)


def _param_of(loc: Sequence[int | str]) -> str | None:
    """`("messages", 0, "str", "content")` → `messages[0].content` (union tags dropped)."""
    parts = list(loc)
    if parts and parts[0] in _LOCATIONS:
        parts = parts[1:]
    param = ""
    for part in parts:
        if isinstance(part, int):
            param += f"[{part}]"
        elif _FIELD_NAME.fullmatch(part) and part not in _TYPE_TAGS:
            param += f".{part}" if param else part
    return param or None


def _describe(param: str | None, first: Any, siblings: list[Any]) -> str:  # Any: error dict
    kind = first["type"]
    if param is None:
        if kind == "json_invalid":
            return f"the request body is not valid JSON: {first['msg']}"
        if kind in ("model_type", "model_attributes_type", "dict_type"):
            return "the request body must be a JSON object"
        return f"the request body is invalid: {first['msg']}"
    if kind == "missing":
        return f"missing required parameter '{param}'"
    if kind == "extra_forbidden":
        return f"unrecognized request argument supplied: '{param}'"
    expected = [_EXPECTED[e["type"]] for e in siblings if e["type"] in _EXPECTED]
    if len(expected) == len(siblings) and expected:
        return f"invalid type for '{param}': expected {' or '.join(dict.fromkeys(expected))}"
    return f"invalid value for '{param}': {first['msg']}"


async def _inferflux_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, InferfluxError)  # NOTE: registered for InferfluxError only
    return error_response(exc, request.url.path)


async def _validation_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError | ValidationError)
    return error_response(invalid_request_from(exc.errors()), request.url.path)


async def _http_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    error = InferfluxError(_http_message(request, exc))
    error.http_status = exc.status_code
    error.error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    error.code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    response = error_response(error, request.url.path)
    for name, value in (exc.headers or {}).items():
        response.headers[name] = value
    return response


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 400: "invalid_request"}


def _http_message(request: Request, exc: StarletteHTTPException) -> str:
    if exc.status_code == 404:
        return f"no route {request.url.path}; see GET /v1/models and docs/api.md"
    if exc.status_code == 405:
        return f"method {request.method} is not allowed on {request.url.path}"
    return str(exc.detail)


def log_unexpected(exc: BaseException, where: str) -> None:
    """Log an unexpected exception: type, place and stack frames, never its message (it
    could quote the prompt)."""
    logger.error(
        "unhandled %s in %s; traceback (message omitted):\n%s",
        type(exc).__name__,
        where,
        "".join(traceback.format_tb(exc.__traceback__)),
    )


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers; add `CatchAllMiddleware` innermost for everything else."""
    app.add_exception_handler(InferfluxError, _inferflux_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(ValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)


class CatchAllMiddleware:
    """Pure ASGI: an unexpected exception becomes a logged 500 envelope, not a traceback.

    Starlette's own catch-all (ServerErrorMiddleware) re-raises after responding, so the
    server logs the error twice; this middleware logs once and stops it. If the response had
    already started (a stream), it can only log and re-raise so the connection is dropped.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracking)
        except ClientDisconnect:
            # the client went away while its body was read: nobody to answer, nothing broke
            logger.info("client disconnected from %s %s", scope.get("method"), scope.get("path"))
            return
        except Exception as exc:
            log_unexpected(exc, f"{scope.get('method')} {scope.get('path')}")
            if started:
                raise
            error = InferfluxError("internal server error; the failure was logged")
            error.code = "internal_error"
            await error_response(error, scope.get("path", ""))(scope, receive, send)
