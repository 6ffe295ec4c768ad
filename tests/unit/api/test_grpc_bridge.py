"""The gRPC bridge's pure parts: HTTP status → gRPC code, peers, frames, request decoding."""

from __future__ import annotations

import grpc
import pytest

from inferflux import errors
from inferflux.api.grpc.bridge import CallFailed, grpc_code, peer_address
from inferflux.api.grpc.gen import inference_pb2 as pb
from inferflux.api.grpc.protocol import chat_body, decode
from inferflux.api.grpc.render import ERROR_FLAG, FrameReader, error_payload, frame
from inferflux.config.loader import load_settings
from inferflux.errors import ConfigError

Code = grpc.StatusCode


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.InvalidRequest, Code.INVALID_ARGUMENT),
        (errors.ContentFiltered, Code.INVALID_ARGUMENT),
        (errors.Unprocessable, Code.INVALID_ARGUMENT),
        (errors.Unauthorized, Code.UNAUTHENTICATED),
        (errors.PermissionDenied, Code.PERMISSION_DENIED),
        (errors.ModelNotFound, Code.NOT_FOUND),
        (errors.Conflict, Code.FAILED_PRECONDITION),
        (errors.RequestTooLarge, Code.RESOURCE_EXHAUSTED),
        (errors.QueueFull, Code.UNAVAILABLE),
        (errors.QueueTimeout, Code.UNAVAILABLE),
        (errors.EngineError, Code.INTERNAL),
    ],
)
def test_every_error_has_its_code(error: type[errors.InferfluxError], code: grpc.StatusCode):
    assert grpc_code(error.http_status) == code


def test_the_other_statuses():
    assert grpc_code(429) == Code.RESOURCE_EXHAUSTED
    assert grpc_code(499) == Code.CANCELLED
    assert grpc_code(504) == Code.DEADLINE_EXCEEDED
    assert grpc_code(502) == Code.INTERNAL


def test_a_failure_carries_the_message_the_field_and_the_code():
    error = errors.InvalidRequest("must be at most 2", param="sampling.temperature")
    failed = CallFailed(400, error_payload(error), (("x-request-id", "r1"),))
    assert failed.code == Code.INVALID_ARGUMENT
    assert failed.details == "sampling.temperature: must be at most 2"
    assert failed.trailers == (("inferflux-error-code", "invalid_request"), ("x-request-id", "r1"))
    garbled = CallFailed(500, b"<html>", ())
    assert garbled.code == Code.INTERNAL and "logged" in garbled.details


def test_peers():
    assert peer_address("ipv4:127.0.0.1:5000") == ("127.0.0.1", 5000)
    assert peer_address("ipv6:[::1]:5000") == ("::1", 5000)
    assert peer_address("unix:/tmp/socket") is None


def test_frames_split_across_chunks():
    stream = frame(b"one") + frame(b"") + frame(b"{}", ERROR_FLAG)
    reader = FrameReader()
    frames = [f for i in range(len(stream)) for f in reader.feed(stream[i : i + 1])]
    assert frames == [(0, b"one"), (0, b""), (ERROR_FLAG, b"{}")]


def test_malformed_messages_and_bad_fields_are_invalid_requests():
    with pytest.raises(errors.InvalidRequest, match="not a valid inferflux.v1.ChatRequest"):
        decode(pb.ChatRequest, b"\xff\xff\xff")
    request = pb.ChatRequest(messages=[pb.ChatMessage(role="user", content="hi")])
    request.sampling.top_p = 0
    with pytest.raises(errors.InvalidRequest) as caught:
        chat_body(request)
    assert caught.value.param == "sampling.top_p"
    request.sampling.ClearField("top_p")
    request.sampling.temperature = 0.7
    assert chat_body(request).sampling.sampling_params(4).temperature == 0.7


def test_grpc_port_is_off_by_default_set_by_env_and_needs_a_port_of_its_own():
    assert load_settings(env={}).server.grpc_port is None
    assert load_settings(env={"INFERFLUX_GRPC_PORT": "50051"}).server.grpc_port == 50051
    for clash in (
        {"INFERFLUX_GRPC_PORT": "8080"},
        {"INFERFLUX_GRPC_PORT": "9", "INFERFLUX_OLLAMA_PORT": "9"},
    ):
        with pytest.raises(ConfigError, match="grpc_port"):
            load_settings(env=clash)
