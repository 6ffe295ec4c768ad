"""The JSON body dependencies: requests parsed with pydantic, in one pass, as 400s.

Owns `JsonBody` / `json_body`; each route declares its body as
`Annotated[Model, Depends(json_body(Model))]`.
The app's parts (models, telemetry, the request's context) come from `api/state.py`; the
model a request names from `serving_for` (api/model_lease.py).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from inferflux.api.errors import invalid_request_from

BodyT = TypeVar("BodyT", bound=BaseModel)


class JsonBody(Generic[BodyT]):
    """A dependency that parses the raw body as `body_model` (strict JSON, one pass).

    Malformed JSON, invalid UTF-8, a non-object body and bad fields all raise
    InvalidRequest (400) naming the field, instead of FastAPI's 422. FastAPI cannot see
    the body this way, so `api/openapi.py` finds `JsonBody` dependencies and documents
    `body_model` as the route's request body.
    """

    def __init__(self, body_model: type[BodyT]) -> None:
        self.body_model = body_model

    async def __call__(self, request: Request) -> BodyT:
        raw = await request.body()
        try:
            return self.body_model.model_validate_json(raw)
        except ValidationError as exc:
            raise invalid_request_from(exc.errors()) from None


@functools.cache
def json_body(model: type[BodyT]) -> Callable[[Request], Awaitable[BodyT]]:
    """The `JsonBody` dependency for `model`: one instance per model, so FastAPI parses a
    body once per request even when several dependencies need it (`serving_for`)."""
    return JsonBody(model)
