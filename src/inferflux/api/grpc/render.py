"""inferflux.v1 responses, rendered from the generation service's events, and their framing.

Owns the frames the routes hand the bridge (`bridge.py`): gRPC's own length-prefixed
message format, one flag byte then a 4-byte big-endian length then the bytes. Flag 0:
a serialized response message; flag 0x80 (as gRPC-Web's trailers): an error after the
stream started, as JSON `{"status", "error": {"message", "type", "code"}}`, which ends
the call with the status's gRPC code. `StreamRenderer` turns a generation into
`GenerateResponse` / `ChatResponse` messages: each text delta, then one `finish` (finish
reason, stop string, usage with cached tokens). Tool calls are not part of v1.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import msgspec
from google.protobuf.message import Message
from starlette.responses import Response

from inferflux.api.generation import (
    ChoiceClosed,
    ChoiceOutput,
    ChoiceResult,
    FinishReason,
    Generation,
    GenerationEvent,
    GenerationResult,
    text_of,
)
from inferflux.api.grpc.gen import inference_pb2 as pb
from inferflux.api.sse import EventStreamResponse
from inferflux.errors import InferfluxError

MESSAGE_FLAG = 0x00
ERROR_FLAG = 0x80
GRPC_MEDIA_TYPE = "application/grpc+proto"
_HEADER = struct.Struct(">BI")

_FINISH_REASON = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.STOP_SEQUENCE: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.ABORT: pb.FINISH_REASON_STOP,
    FinishReason.CONTENT_FILTER: pb.FINISH_REASON_CONTENT_FILTER,
    FinishReason.ERROR: pb.FINISH_REASON_SCHEMA_FAILED,  # a failed JSON check
    FinishReason.TIMEOUT: pb.FINISH_REASON_STOP,  # never reaches a stream (a 408 first)
}


def frame(payload: bytes, flag: int = MESSAGE_FLAG) -> bytes:
    return _HEADER.pack(flag, len(payload)) + payload


def message_frame(message: Message) -> bytes:
    return frame(message.SerializeToString())


def error_payload(error: InferfluxError) -> bytes:
    """What an error frame carries: the HTTP status and the OpenAI-shaped error."""
    return msgspec.json.encode({"status": error.http_status, **error.to_body()})


class FrameReader:
    """Splits a byte stream back into `(flag, payload)` frames, across chunk boundaries."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[tuple[int, bytes]]:
        self._buffer += chunk
        frames: list[tuple[int, bytes]] = []
        while len(self._buffer) >= _HEADER.size:
            flag, length = _HEADER.unpack_from(self._buffer)
            end = _HEADER.size + length
            if len(self._buffer) < end:
                break
            frames.append((flag, bytes(self._buffer[_HEADER.size : end])))
            del self._buffer[:end]
        return frames


class FramesResponse(EventStreamResponse):
    """The frames of one call, streamed (closed like an SSE stream when the call ends)."""

    media_type = GRPC_MEDIA_TYPE


StreamMessage = type[pb.GenerateResponse] | type[pb.ChatResponse]


def finish_of(result: ChoiceResult) -> pb.Finish:
    usage = pb.Usage(
        prompt_tokens=result.num_prompt_tokens,
        completion_tokens=result.num_output_tokens,
        cached_tokens=result.num_cached_tokens,
    )
    return pb.Finish(
        finish_reason=_FINISH_REASON[result.finish_reason],
        usage=usage,
        stop_sequence=result.stop_sequence or "",
    )


class StreamRenderer:
    """The response messages of one Generate or Chat call (one choice)."""

    stream_response = FramesResponse

    def __init__(self, generation: Generation, model: str, message_class: StreamMessage) -> None:
        self.message_class = message_class
        self.id = generation.response_id
        self.model = model

    def _delta(self, text: str) -> bytes:
        return message_frame(self.message_class(id=self.id, model=self.model, delta=text))

    def _finish(self, result: ChoiceResult) -> bytes:
        finish = finish_of(result)
        return message_frame(self.message_class(id=self.id, model=self.model, finish=finish))

    def frames(self, event: GenerationEvent) -> Sequence[bytes]:
        if isinstance(event, ChoiceOutput):
            text = text_of(event.parts)
            return (self._delta(text),) if text else ()
        if isinstance(event, ChoiceClosed):
            text = text_of(event.parts)
            frames = [self._delta(text)] if text else []
            frames.append(self._finish(event.result))
            return frames
        return ()

    def error_frame(self, error: InferfluxError) -> bytes:
        return frame(error_payload(error), ERROR_FLAG)

    def end_frames(self) -> Sequence[bytes]:
        return ()

    def response(self, result: GenerationResult) -> Response:
        """The whole call at once (the routes always stream; this serves the protocol)."""
        (choice,) = result.choices
        body = self._delta(choice.text) if choice.text else b""
        body += self._finish(choice)
        return Response(body, media_type=GRPC_MEDIA_TYPE)
