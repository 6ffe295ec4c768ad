"""The Ollama-compatible API (/api/*) against a real `inferflux serve` with SmolLM2.

The official `ollama` Python client drives chat, generate, streaming, embed, list, show
and ps unchanged; httpx checks the wire format itself (NDJSON framing, metrics, error
bodies), client disconnects, and the second listener of `server.ollama_port`.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator

import httpx
import ollama
import pytest

from tests.integration.server_process import ServerProcess, free_port

pytestmark = [pytest.mark.model, pytest.mark.server]

USER = [{"role": "user", "content": "Name three colors."}]
COUNTING = "Count from 1 to 1000: 1, 2, 3, 4, 5,"
GREEDY = {"temperature": 0, "num_predict": 12}
CREATED_AT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z")
DURATIONS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


@pytest.fixture(scope="module")
def client(server_url: str) -> Iterator[ollama.Client]:
    with ollama.Client(host=server_url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def http(server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server_url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def model(http: httpx.Client) -> str:
    return str(http.get("/v1/models").json()["data"][0]["id"])


def ndjson(http: httpx.Client, path: str, body: dict[str, object]) -> list[dict[str, object]]:
    """Every object of an NDJSON stream, checking the framing on the way."""
    with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson"
        raw = response.read().decode()
    assert raw.endswith("\n")
    return [json.loads(line) for line in raw.splitlines()]


def assert_final_metrics(final: dict[str, object]) -> None:
    for name in DURATIONS:
        value = final[name]
        assert isinstance(value, int) and value > 0, (name, value)
    assert isinstance(final["prompt_eval_count"], int) and final["prompt_eval_count"] > 0
    assert isinstance(final["eval_count"], int) and final["eval_count"] > 0
    assert final["total_duration"] >= final["eval_duration"]  # type: ignore[operator]


# -- the official client ---------------------------------------------------------------------
def test_list_show_ps(client: ollama.Client, model: str) -> None:
    listed = client.list().models
    assert [m.model for m in listed] == [f"{model}:latest"]
    assert listed[0].details is not None and listed[0].details.format == "gguf"
    assert listed[0].details.family == "llama" and listed[0].details.quantization_level == "Q4_1"
    assert listed[0].details.parameter_size == "134.52M" and listed[0].size

    shown = client.show(f"{model}:latest")
    assert shown.modelinfo is not None
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == 8192
    assert shown.modelinfo["general.parameter_count"] == 134_515_008
    assert shown.template and "im_start" in shown.template
    assert shown.parameters and "temperature" in shown.parameters
    assert shown.capabilities == ["completion", "tools"]

    running = client.ps().models
    assert [m.model for m in running] == [f"{model}:latest"]
    assert running[0].context_length == 4096 and running[0].expires_at is not None


def test_chat_non_streaming_and_streaming_agree(client: ollama.Client, model: str) -> None:
    response = client.chat(model=model, messages=USER, options=GREEDY)
    assert response.done and response.done_reason in ("stop", "length")
    assert response.message.role == "assistant" and response.message.content
    assert 0 < (response.eval_count or 0) <= 12 and response.prompt_eval_count
    assert all(isinstance(getattr(response, name), int) for name in DURATIONS)

    parts = list(client.chat(model=model, messages=USER, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert parts[-1].eval_count == response.eval_count
    assert "".join(p.message.content or "" for p in parts) == response.message.content


def test_generate_and_continue_from_context(client: ollama.Client, model: str) -> None:
    first = client.generate(model=model, prompt="Say hi.", options=GREEDY)
    assert first.done and first.response and first.context
    assert len(first.context) == (first.prompt_eval_count or 0) + (first.eval_count or 0)

    follow = client.generate(model=model, prompt="Again.", context=first.context, options=GREEDY)
    assert follow.response and follow.context
    assert follow.context[: len(first.context)] == first.context  # the context was prepended
    assert (follow.prompt_eval_count or 0) > len(first.context)


def test_generate_streaming(client: ollama.Client, model: str) -> None:
    parts = list(client.generate(model=model, prompt=COUNTING, options=GREEDY, stream=True))
    assert len(parts) >= 2 and parts[-1].done and parts[-1].done_reason == "length"
    assert parts[-1].eval_count == 12 and parts[-1].context
    text = "".join(p.response or "" for p in parts)
    assert (
        text.strip()
        and text == client.generate(model=model, prompt=COUNTING, options=GREEDY).response
    )


def test_embed_and_legacy_embeddings(client: ollama.Client, model: str) -> None:
    embedded = client.embed(model=model, input=["The cat sat.", "A dog ran."])
    assert len(embedded.embeddings) == 2 and embedded.prompt_eval_count
    for vector in embedded.embeddings:
        assert len(vector) == 576 and math.isclose(math.hypot(*vector), 1.0, rel_tol=1e-4)
    short = client.embed(model=model, input="The cat sat.", dimensions=64).embeddings[0]
    assert len(short) == 64 and math.isclose(math.hypot(*short), 1.0, rel_tol=1e-4)

    legacy = client.embeddings(model=model, prompt="The cat sat.").embedding
    norm = math.hypot(*legacy)
    assert len(legacy) == 576 and norm > 0  # Ollama's legacy route does not normalize
    cosine = sum(a * b for a, b in zip(legacy, embedded.embeddings[0], strict=True)) / norm
    assert cosine == pytest.approx(1.0, abs=1e-3)


def test_load_and_unload_requests(client: ollama.Client, model: str) -> None:
    assert client.generate(model=model).done_reason == "load"
    assert client.generate(model=model, keep_alive=0).done_reason == "unload"
    loaded = client.chat(model=model, messages=[])
    assert loaded.done and loaded.done_reason == "load" and loaded.message.content == ""


def test_unknown_model_is_a_404(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as raised:
        client.chat(model="llama3.2", messages=USER)
    assert raised.value.status_code == 404 and raised.value.error == "model 'llama3.2' not found"


# -- the wire format, over httpx ---------------------------------------------------------
def test_ndjson_framing_and_final_object(http: httpx.Client, model: str) -> None:
    body = {"model": model, "prompt": COUNTING, "options": {"temperature": 0, "num_predict": 5}}
    objects = ndjson(http, "/api/generate", body)
    *pieces, final = objects
    assert pieces and all(
        p["done"] is False and set(p) == {"model", "created_at", "response", "done"} for p in pieces
    )
    assert all(CREATED_AT.fullmatch(str(o["created_at"])) for o in objects)
    assert final["done"] is True and final["done_reason"] == "length" and final["response"] == ""
    assert final["eval_count"] == 5 and final["model"] == model
    assert_final_metrics(final)


def test_chat_final_object_and_stop_option(http: httpx.Client, model: str) -> None:
    body = {
        "model": f"{model}:latest",
        "messages": [{"role": "user", "content": COUNTING}],
        "stream": False,
        "options": {"temperature": 0, "num_predict": 40, "stop": [","]},
    }
    response = http.post("/api/chat", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    final = response.json()
    assert final["model"] == f"{model}:latest" and final["done_reason"] == "stop"
    assert final["message"]["role"] == "assistant" and "," not in final["message"]["content"]
    assert_final_metrics(final)


def test_priority_extension(http: httpx.Client, model: str) -> None:
    body = {"model": model, "prompt": "Hi", "stream": False, "priority": "high", "options": GREEDY}
    assert http.post("/api/generate", json=body).json()["done"] is True
    response = http.post("/api/generate", json={**body, "priority": "urgent"})
    assert response.status_code == 400 and "priority" in response.json()["error"]


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"model": "nope", "prompt": "x"}, 404, "model 'nope' not found"),
        ({"prompt": "x"}, 400, "model is required"),
        ({"model": "{m}", "prompt": 5}, 400, "'prompt'"),
        ({"model": "{m}", "prompt": "x", "options": {"temperature": "hot"}}, 400, "temperature"),
        ({"model": "{m}", "prompt": "x", "options": {"mirostat": 3}}, 400, "mirostat"),
        ({"model": "{m}", "prompt": "x", "format": "xml"}, 400, "format"),
        ({"model": "{m}", "prompt": "x", "format": {"type": "wat"}}, 400, "invalid JSON schema"),
        ({"model": "{m}", "prompt": "x", "images": ["aGk="]}, 400, "images"),
        ({"model": "{m}", "prompt": "x", "keep_alive": "soon"}, 400, "duration"),
        ({"model": "{m}", "prompt": "x", "context": [10**9]}, 400, "out of range"),
        ({"model": "{m}", "prompt": "word " * 5000}, 400, "context length"),
    ],
)
def test_generate_errors_in_ollama_shape(
    http: httpx.Client, model: str, body: dict[str, object], status: int, needle: str
) -> None:
    if body.get("model") == "{m}":
        body = {**body, "model": model}
    response = http.post("/api/generate", json=body)
    assert response.status_code == status
    payload = response.json()
    assert set(payload) == {"error"} and needle in payload["error"]


def test_malformed_bodies_and_unknown_routes(http: httpx.Client, model: str) -> None:
    for raw in (b"{bad json", b"[]", b""):
        response = http.post("/api/chat", content=raw)
        assert response.status_code == 400 and isinstance(response.json()["error"], str)
    tools = [{"type": "function"}]  # no function: a malformed tool
    response = http.post("/api/chat", json={"model": model, "messages": USER, "tools": tools})
    assert response.status_code == 400 and "tools" in response.json()["error"]
    response = http.post("/api/show", json={"model": 3})
    assert response.status_code == 400 and isinstance(response.json()["error"], str)
    response = http.get("/api/nothing-here")
    assert response.status_code == 404 and isinstance(response.json()["error"], str)
    too_large = b'{"model": "' + b"a" * (5 * 1024 * 1024) + b'"}'
    response = http.post("/api/generate", content=too_large)
    assert response.status_code == 413 and "server.max_request_bytes" in response.json()["error"]


def test_root_and_version(http: httpx.Client) -> None:
    response = http.get("/")
    assert response.status_code == 200 and response.text == "Ollama is running"
    assert response.headers["content-type"].startswith("text/plain")
    assert http.head("/").status_code == 200
    assert re.fullmatch(r"\d+\.\d+\.\d+", http.get("/api/version").json()["version"])


def _busy(http: httpx.Client) -> int:
    stats = http.get("/server/stats").json()
    workers = stats["workers"]
    return int(stats["num_in_flight"]) + sum(w["num_running"] + w["num_waiting"] for w in workers)


def test_client_disconnect_frees_the_engine(
    http: httpx.Client, server_url: str, model: str
) -> None:
    # Raw (no chat template) and greedy, SmolLM2 continues this list to the token limit
    # (1000 of 1000, measured). Through the template it answers COUNTING in 15 tokens, and
    # the essay prompt once had the server idle after line one in a CI run.
    options = {"temperature": 0, "num_predict": 2000}
    body = {"model": model, "prompt": "a, b, c, d, e, f, g, h,", "raw": True, "options": options}
    with (
        httpx.Client(base_url=server_url, timeout=60) as streaming,
        streaming.stream("POST", "/api/generate", json=body) as response,
    ):
        lines = response.iter_lines()
        first = json.loads(next(lines))
        assert first["done"] is False
        busy = _busy(http)
        if not busy:  # say what the stream was (it should still be generating)
            rest = [json.loads(line) for line in lines]
            text = first["response"] + "".join(str(r.get("response", "")) for r in rest)
            raise AssertionError(f"idle after line one; the stream was {text[:300]!r}, {rest[-1:]}")
    # the connection is closed: the engine must stop long before 2000 tokens
    deadline = time.monotonic() + 10
    while _busy(http) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _busy(http) == 0


# -- server.ollama_port: one extra server ----------------------------------------------------
@pytest.fixture(scope="module")
def two_port_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A server on a free port that also listens on INFERFLUX_OLLAMA_PORT."""
    ollama_port = free_port()
    log = tmp_path_factory.mktemp("ollama-port") / "inferflux.log"
    server = ServerProcess(env={"INFERFLUX_OLLAMA_PORT": str(ollama_port)}, log_path=log)
    try:
        server.wait_ready(180)
    except (RuntimeError, TimeoutError) as exc:
        server.close()
        pytest.fail(f"{exc}:\n{log.read_text(errors='replace')[-4000:]}")
    yield server.url, f"http://127.0.0.1:{ollama_port}"
    server.close()


def test_ollama_port_serves_the_same_app(two_port_server: tuple[str, str]) -> None:
    main_url, ollama_url = two_port_server
    assert httpx.get(f"{ollama_url}/", timeout=10).text == "Ollama is running"
    with ollama.Client(host=ollama_url, timeout=120) as client:
        name = client.list().models[0].model
        assert name is not None
        reply = client.generate(model=name, prompt="Hi", options=GREEDY)
        assert reply.done and reply.response
    # the same engine behind both ports: its counters include the request above
    stats = httpx.get(f"{main_url}/server/stats", timeout=10).json()
    assert sum(w["num_generated_tokens_total"] for w in stats["workers"]) >= 1
