"""The inferflux.v1 request messages (proto/inferflux/v1/inference.proto), decoded and checked.

Owns: decoding a request body (the serialized message the bridge passed on) into its
generated class, a malformed one being a 400 (INVALID_ARGUMENT, never INTERNAL), and the
checks every request gets, as pydantic models of the message's fields (`GenerateBody`,
`ChatBody`, `EmbedBody`: bounds, roles, stop strings, the JSON schema's text) so a bad
field is a 400 naming it (`sampling.temperature`), as on the JSON routes. Proto3's
defaults mean "unset": an empty `model` is the default model, an unset `optional` field
is the server's default. Does not own: the routes (`routes.py`), the responses
(`render.py`).
"""

from __future__ import annotations

import json
from typing import Literal, TypeVar

from google.protobuf.message import DecodeError, Message
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from inferflux.api.errors import invalid_request_from
from inferflux.api.generation.embedding import MAX_INPUTS
from inferflux.api.generation.limits import check_stop_sequences
from inferflux.api.generation.spec import JsonOutput
from inferflux.api.grpc.gen import inference_pb2 as pb
from inferflux.engine.messages import Priority, SamplingParams
from inferflux.errors import InvalidRequest

MessageT = TypeVar("MessageT", bound=Message)
BodyT = TypeVar("BodyT", bound=BaseModel)

MAX_MESSAGES = 4096
MAX_TOP_K = 2**31 - 1  # llama.cpp takes an int32
_PRIORITY = {
    pb.PRIORITY_UNSPECIFIED: Priority.NORMAL,
    pb.PRIORITY_LOW: Priority.LOW,
    pb.PRIORITY_NORMAL: Priority.NORMAL,
    pb.PRIORITY_HIGH: Priority.HIGH,
}
_OPTIONAL_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "seed", "json_schema")


def decode(message_class: type[MessageT], raw: bytes) -> MessageT:
    """`raw` parsed as `message_class`; InvalidRequest when it is not one."""
    message = message_class()
    try:
        message.ParseFromString(raw)
    except (DecodeError, ValueError) as exc:
        name = message_class.DESCRIPTOR.full_name
        raise InvalidRequest(f"the request is not a valid {name} message: {exc}") from None
    return message


class _Checked(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplingBody(_Checked):
    """`Sampling`, checked: the bounds of the JSON routes."""

    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=MAX_TOP_K)
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    priority: Priority = Priority.NORMAL
    json_schema: str | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: list[str]) -> list[str]:
        check_stop_sequences(stop)
        return stop

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else round(self.temperature, 6),
            top_p=1.0 if self.top_p is None else round(self.top_p, 6),
            top_k=self.top_k or 0,
            seed=self.seed,
            stop=list(self.stop),
        )

    def output_spec(self) -> JsonOutput | None:
        """The output's JSON schema; a text that is not a JSON object is a 400."""
        if self.json_schema is None:
            return None
        param = "sampling.json_schema"
        try:
            schema = json.loads(self.json_schema)
        except ValueError as exc:
            raise InvalidRequest(f"'{param}' is not valid JSON: {exc}", param=param) from None
        if not isinstance(schema, dict):
            raise InvalidRequest(f"'{param}' must be a JSON object", param=param)
        return JsonOutput(schema or None, param)


class GenerateBody(_Checked):
    model: str | None = None
    prompt: str = Field(min_length=1)
    sampling: SamplingBody


class ChatMessageBody(_Checked):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatBody(_Checked):
    model: str | None = None
    messages: list[ChatMessageBody] = Field(min_length=1, max_length=MAX_MESSAGES)
    sampling: SamplingBody


class EmbedBody(_Checked):
    model: str | None = None
    inputs: list[str] = Field(min_length=1, max_length=MAX_INPUTS)


def _checked(body_model: type[BodyT], fields: dict[str, object]) -> BodyT:
    try:
        return body_model.model_validate(fields)
    except ValidationError as exc:
        raise invalid_request_from(exc.errors()) from None


def _sampling_fields(sampling: pb.Sampling) -> dict[str, object]:
    fields: dict[str, object] = {
        name: getattr(sampling, name) for name in _OPTIONAL_SAMPLING if sampling.HasField(name)
    }
    fields["stop"] = list(sampling.stop)
    priority = _PRIORITY.get(sampling.priority)
    if priority is None:
        raise InvalidRequest(f"unknown priority {sampling.priority}", param="sampling.priority")
    fields["priority"] = priority
    return fields


def generate_body(message: pb.GenerateRequest) -> GenerateBody:
    return _checked(
        GenerateBody,
        {
            "model": message.model or None,
            "prompt": message.prompt,
            "sampling": _sampling_fields(message.sampling),
        },
    )


def chat_body(message: pb.ChatRequest) -> ChatBody:
    turns = [{"role": m.role, "content": m.content} for m in message.messages]
    return _checked(
        ChatBody,
        {
            "model": message.model or None,
            "messages": turns,
            "sampling": _sampling_fields(message.sampling),
        },
    )


def embed_body(message: pb.EmbedRequest) -> EmbedBody:
    return _checked(EmbedBody, {"model": message.model or None, "inputs": list(message.inputs)})
