"""What route handlers may depend on, as `Annotated` aliases over `app.state`.

Owns: `ServingState` (one per resident model; `app.state.serving` is the default
model's, kept current by the model manager), the aliases that hand its parts to handlers
(`EngineDep`, `ServingDep`, ...: the default model), and the JSON body dependencies that
parse OpenAI requests with pydantic (`ChatBody`, `CompletionBody`). Routes that serve the
model their body names use `serving_for` (api/model_router.py) instead of `ServingDep`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Generic, TypeVar, cast

from fastapi import Depends, Request
from pydantic import BaseModel, ValidationError

from inferflux.api.errors import invalid_request_from
from inferflux.api.openai.protocol import ChatCompletionRequest, CompletionRequest
from inferflux.api.telemetry import Telemetry
from inferflux.config.settings import Settings
from inferflux.engine.chat_template import ChatTemplate
from inferflux.engine.grammar import ConstraintCompiler
from inferflux.engine.protocol import EngineClient, ModelInfo, Tokenizer

BodyT = TypeVar("BodyT", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class ServingState:
    """Everything the routes need of one model. Immutable; the engine is async-safe."""

    settings: Settings
    engine: EngineClient
    tokenizer: Tokenizer
    model_info: ModelInfo
    chat_template: ChatTemplate
    constraints: ConstraintCompiler  # response_format / grammar → llguidance grammars
    system_fingerprint: str
    started_at: float  # time.monotonic() when the app was built


def get_serving(request: Request) -> ServingState:
    return cast(ServingState, request.app.state.serving)


def get_engine(request: Request) -> EngineClient:
    return get_serving(request).engine


def get_model_info(request: Request) -> ModelInfo:
    return get_serving(request).model_info


def get_telemetry(request: Request) -> Telemetry:
    return cast(Telemetry, request.app.state.telemetry)


ServingDep = Annotated[ServingState, Depends(get_serving)]
EngineDep = Annotated[EngineClient, Depends(get_engine)]
ModelInfoDep = Annotated[ModelInfo, Depends(get_model_info)]
TelemetryDep = Annotated[Telemetry, Depends(get_telemetry)]


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


ChatBody = Annotated[ChatCompletionRequest, Depends(json_body(ChatCompletionRequest))]
CompletionBody = Annotated[CompletionRequest, Depends(json_body(CompletionRequest))]
