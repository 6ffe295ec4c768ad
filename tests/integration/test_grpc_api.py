"""The gRPC API (inferflux.v1) end to end: the generated Python client against a real
`inferflux serve --grpc-port` (SmolLM2) with authentication on.

Streams (Chat, Generate), Embed, ListModels, the standard health service and reflection;
bad input as gRPC statuses with InferFlux's error code in the trailers; a cancelled call
frees the engine as a closed SSE connection does; credentials in metadata, the audit
log, the body-size limit, TLS. Every other control (guardrails, token limits, priority
caps, the tenant's cache) is tested on every gRPC method by the frontends' table,
tests/integration/security/test_frontend_controls.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
import trustme
import yaml
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from inferflux.api.grpc.gen import inference_pb2 as pb
from inferflux.api.grpc.gen import inference_pb2_grpc as pb_grpc
from tests.integration.server_process import ServerProcess, free_port

pytestmark = [pytest.mark.model, pytest.mark.server]

KEYS = {
    "admin": "sk-grpc-admin-0123456789",
    "read": "sk-grpc-read-0123456789",
    "generate": "sk-grpc-generate-0123456789",
}
TIMEOUT_S = 60


@dataclass
class GrpcServer:
    http: str
    audit_path: Path
    channel: grpc.Channel
    stub: pb_grpc.InferenceStub

    def admin(self) -> httpx.Client:
        auth = {"authorization": f"Bearer {KEYS['admin']}"}
        return httpx.Client(base_url=self.http, headers=auth, timeout=TIMEOUT_S)


def _auth(key: str | None) -> tuple[tuple[str, str], ...]:
    return () if key is None else (("authorization", f"Bearer {key}"),)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    folder = tmp_path_factory.mktemp("grpc")
    keys = [
        {"key": KEYS["admin"], "id": "admin", "roles": ["admin"], "tenant": "ops"},
        {"key": KEYS["read"], "id": "reader", "scopes": ["read"]},
        {"key": KEYS["generate"], "id": "generator", "scopes": ["generate"]},
    ]
    config = folder / "inferflux.yaml"
    audit_path = folder / "audit.jsonl"
    settings = {"auth": {"api_keys": keys}, "audit": {"path": str(audit_path)}}
    config.write_text(yaml.safe_dump(settings), encoding="utf-8")
    env = {
        "INFERFLUX_POLICY_STORE": str(folder / "policy.store"),
        "INFERFLUX_POLICY_PASSPHRASE": "a test passphrase, long enough",
    }
    grpc_port = free_port()
    log = folder / "inferflux.log"
    process = ServerProcess(
        "--config", str(config), "--grpc-port", str(grpc_port), env=env, log_path=log
    )
    try:
        process.wait_ready(180)
    except (RuntimeError, TimeoutError) as exc:
        process.close()
        pytest.fail(f"{exc}:\n{log.read_text(errors='replace')[-4000:]}")
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    try:
        yield GrpcServer(process.url, audit_path, channel, pb_grpc.InferenceStub(channel))
    finally:
        channel.close()
        process.close()


def _chat(text: str, **sampling: object) -> pb.ChatRequest:
    turns = [pb.ChatMessage(role="user", content=text)]
    return pb.ChatRequest(messages=turns, sampling=pb.Sampling(**sampling))  # type: ignore[arg-type]


def _error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def _trailer(error: grpc.RpcError, name: str) -> str | None:
    return next((m.value for m in error.trailing_metadata() or () if m.key == name), None)


# --- the API -------------------------------------------------------------------------


def test_chat_streams_text_then_the_finish_with_usage(server: GrpcServer):
    request = _chat("Name a color.", max_tokens=8, temperature=0)
    replies = list(server.stub.Chat(request, metadata=_auth(KEYS["generate"]), timeout=TIMEOUT_S))
    *deltas, last = replies
    assert deltas and all(r.WhichOneof("event") == "delta" for r in deltas)
    assert "".join(r.delta for r in deltas).strip()
    assert last.WhichOneof("event") == "finish"
    assert len({r.id for r in replies}) == 1 and replies[0].id.startswith("chat-")
    assert last.finish.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    usage = last.finish.usage
    assert usage.prompt_tokens > 5 and 0 < usage.completion_tokens <= 8


def test_generate_continues_a_prompt_and_reports_the_stop_string(server: GrpcServer):
    request = pb.GenerateRequest(
        prompt="one, two, three,", sampling=pb.Sampling(max_tokens=16, temperature=0, stop=[","])
    )
    replies = list(
        server.stub.Generate(request, metadata=_auth(KEYS["generate"]), timeout=TIMEOUT_S)
    )
    text = "".join(r.delta for r in replies)
    assert "four" in text.lower() and "," not in text
    finish = replies[-1].finish
    assert finish.finish_reason == pb.FINISH_REASON_STOP and finish.stop_sequence == ","


def test_structured_output_follows_the_json_schema(server: GrpcServer):
    schema = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}
    request = _chat(
        "Name a color as JSON.", max_tokens=40, temperature=0, json_schema=json.dumps(schema)
    )
    replies = list(server.stub.Chat(request, metadata=_auth(KEYS["generate"]), timeout=TIMEOUT_S))
    answer = json.loads("".join(r.delta for r in replies))
    assert isinstance(answer["color"], str)


def test_embed_gives_one_normalized_vector_per_input(server: GrpcServer):
    request = pb.EmbedRequest(inputs=["the sea", "ships"])
    answer = server.stub.Embed(request, metadata=_auth(KEYS["generate"]), timeout=TIMEOUT_S)
    assert len(answer.embeddings) == 2 and answer.prompt_tokens >= 2
    for embedding in answer.embeddings:
        assert len(embedding.values) > 100
        assert abs(sum(v * v for v in embedding.values) - 1.0) < 1e-3


def test_list_models_with_the_read_scope(server: GrpcServer):
    answer = server.stub.ListModels(
        pb.ListModelsRequest(), metadata=_auth(KEYS["read"]), timeout=TIMEOUT_S
    )
    (model,) = answer.models
    assert model.id.startswith("SmolLM2") and model.loaded and model.is_default


def test_health_says_serving_and_reflection_lists_the_services(server: GrpcServer):
    health = health_pb2_grpc.HealthStub(server.channel)
    for service in ("", "inferflux.v1.Inference"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    ask = reflection_pb2.ServerReflectionRequest(list_services="")
    (reply,) = list(reflection.ServerReflectionInfo(iter([ask]), timeout=10))
    names = {s.name for s in reply.list_services_response.service}
    assert names >= {"inferflux.v1.Inference", "grpc.health.v1.Health"}


def test_the_request_id_comes_back_as_metadata(server: GrpcServer):
    metadata = (*_auth(KEYS["generate"]), ("x-request-id", "grpc-test-1234"))
    call = server.stub.Chat(_chat("Hi", max_tokens=1), metadata=metadata, timeout=TIMEOUT_S)
    list(call)
    assert ("x-request-id", "grpc-test-1234") in tuple(call.initial_metadata())


def test_the_internal_routes_are_no_http_api(server: GrpcServer):
    with server.admin() as admin:
        answer = admin.post(
            "/grpc/inferflux.v1.Inference/Chat", content=_chat("Hi").SerializeToString()
        )
    assert answer.status_code == 404


# --- bad input ---------------------------------------------------------------------------


def test_malformed_bytes_are_invalid_argument(server: GrpcServer):
    raw = server.channel.unary_stream("/inferflux.v1.Inference/Chat")
    error = _error(lambda: list(raw(b"\xff\xff\xff", metadata=_auth(KEYS["generate"]))))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid inferflux.v1.ChatRequest" in error.details()


INVALID = grpc.StatusCode.INVALID_ARGUMENT
BAD_INPUT = [
    (pb.ChatRequest(model="nope", messages=[pb.ChatMessage(role="user", content="x")]),
     grpc.StatusCode.NOT_FOUND, "'nope' does not exist"),
    (_chat("x", json_schema="{not json"), INVALID, "not valid JSON"),
    (_chat("x", json_schema='{"type": "nonsense"}'), INVALID, "json_schema"),
    (_chat("x", temperature=5), INVALID, "sampling.temperature"),
    (pb.ChatRequest(), INVALID, "messages"),
    (pb.ChatRequest(messages=[pb.ChatMessage(role="robot", content="x")]), INVALID,
     "messages[0].role"),
]  # fmt: skip
BAD_INPUT_IDS = ["unknown model", "schema not json", "bad schema", "temperature", "no messages",
                 "role"]  # fmt: skip


@pytest.mark.parametrize(("request_", "code", "words"), BAD_INPUT, ids=BAD_INPUT_IDS)
def test_bad_input_gets_its_status_and_a_clear_message(
    server: GrpcServer, request_: Message, code: grpc.StatusCode, words: str
):
    call = server.stub.Chat
    error = _error(lambda: list(call(request_, metadata=_auth(KEYS["generate"]), timeout=30)))
    assert error.code() == code, error.details()
    assert words in error.details()
    assert _trailer(error, "inferflux-error-code")


def test_a_body_over_the_size_limit_is_resource_exhausted(server: GrpcServer):
    """server.max_request_bytes (4 MiB by default) holds for gRPC messages too."""
    big = _chat("x" * (4 * 1024 * 1024 + 100), max_tokens=1)
    auth = _auth(KEYS["generate"])
    error = _error(lambda: list(server.stub.Chat(big, metadata=auth, timeout=TIMEOUT_S)))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert _trailer(error, "inferflux-error-code") == "request_too_large"


# --- cancel ------------------------------------------------------------------------------


def _engine_state(admin: httpx.Client) -> tuple[int, int, int]:
    stats = admin.get("/server/stats").json()
    worker = stats["workers"][0]
    return stats["num_in_flight"], worker["num_running"], worker["num_generated_tokens_total"]


def test_a_cancelled_stream_frees_the_engine(server: GrpcServer):
    """As test_openai_api's SSE disconnect: nothing runs within the same bound (10 s).

    The prompt must not end early: sampled, "Count from one to one thousand." sometimes ends
    within a few tokens and the call finished OK before the cancel. Greedy, this one runs to
    max_tokens (as in test_ollama_api).
    """
    request = _chat("Write a long essay about the history of Rome.", max_tokens=2000, temperature=0)
    with server.admin() as admin:
        generated_before = _engine_state(admin)[2]
        call = server.stub.Chat(request, metadata=_auth(KEYS["generate"]), timeout=TIMEOUT_S)
        for index, _ in enumerate(call):
            if index >= 3:
                break
        call.cancel()
        deadline = time.monotonic() + 10
        state = _engine_state(admin)
        while state[:2] != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
            state = _engine_state(admin)
    assert state[:2] == (0, 0), state
    assert state[2] - generated_before < 1000
    assert call.code() == grpc.StatusCode.CANCELLED


# --- credentials (the other controls: tests/integration/security/test_frontend_controls.py)


def test_credentials_in_metadata(server: GrpcServer):
    chat = server.stub.Chat
    request = _chat("Hi", max_tokens=1)

    def call(*metadata: tuple[str, str]) -> object:
        return list(chat(request, metadata=metadata, timeout=TIMEOUT_S))

    assert call(("x-api-key", KEYS["generate"]))
    for metadata in ((), ("authorization", "Bearer sk-nobody-0123456789")):
        error = _error(lambda m=metadata: call(*([m] if m else [])))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    denied = _error(lambda: call(*_auth(KEYS["read"])))
    assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "lacks the 'generate' scope" in denied.details()
    models = server.stub.ListModels
    error = _error(lambda: models(pb.ListModelsRequest(), timeout=TIMEOUT_S))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


def test_the_audit_log_records_each_call(server: GrpcServer):
    metadata = (*_auth(KEYS["generate"]), ("x-request-id", "grpc-audit-1"))
    list(server.stub.Chat(_chat("Hi", max_tokens=2), metadata=metadata, timeout=TIMEOUT_S))
    anonymous = (("x-request-id", "grpc-audit-2"),)
    _error(lambda: list(server.stub.Chat(_chat("Hi"), metadata=anonymous, timeout=TIMEOUT_S)))
    lines = server.audit_path.read_text(encoding="utf-8").splitlines()
    events = {e.get("request_id"): e for e in map(json.loads, lines)}
    done, refused = events["grpc-audit-1"], events["grpc-audit-2"]
    assert done["route"] == "/grpc/inferflux.v1.Inference/Chat" and done["status"] == 200
    assert done["completion_tokens"] == 2 and done["tenant"] == "default"
    assert refused["status"] == 401


# --- TLS -------------------------------------------------------------------------------


def test_tls_when_the_server_has_tls(tmp_path: Path):
    """With server.tls on, gRPC speaks TLS with the same certificate (INFERFLUX_GRPC_PORT
    turns it on); a plaintext channel fails."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    grpc_port = free_port()
    env = {
        "INFERFLUX_TLS_ENABLED": "true",
        "INFERFLUX_TLS_CERT_PATH": str(tmp_path / "cert.pem"),
        "INFERFLUX_TLS_KEY_PATH": str(tmp_path / "key.pem"),
        "INFERFLUX_GRPC_PORT": str(grpc_port),
    }
    process = ServerProcess(env=env, log_path=tmp_path / "server.log")
    address = f"127.0.0.1:{grpc_port}"
    root = ca.cert_pem.bytes()
    try:
        with grpc.secure_channel(address, grpc.ssl_channel_credentials(root)) as channel:
            _wait_serving(health_pb2_grpc.HealthStub(channel), process)
            stub = pb_grpc.InferenceStub(channel)
            assert stub.ListModels(pb.ListModelsRequest(), timeout=TIMEOUT_S).models
        with grpc.insecure_channel(address) as plain:
            error = _error(lambda: pb_grpc.InferenceStub(plain).ListModels(
                pb.ListModelsRequest(), timeout=5))  # fmt: skip
        assert error.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        process.close()


def _wait_serving(health: health_pb2_grpc.HealthStub, process: ServerProcess) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert process.process.poll() is None, "the server exited"
        try:
            answer = health.Check(health_pb2.HealthCheckRequest(), timeout=2)
            if answer.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.3)
    raise TimeoutError("the gRPC health service never said SERVING")
