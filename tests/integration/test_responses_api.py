"""OpenAI's Responses API end to end: the official `openai` SDK (`client.responses`) against
a real `inferflux serve` (SmolLM2): text, the typed event stream, previous_response_id
chains whose prompt comes from the prefix cache, store / GET / DELETE / input_items,
function calls and their outputs, text.format json_schema, input_tokens, errors, a client
that goes away, and WebSocket mode (`client.responses.connect()`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

pytestmark = [pytest.mark.model, pytest.mark.server]

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ASK = "What is the weather in Paris?"
ENDED = ("response.completed", "response.incomplete", "response.failed", "error")


@pytest.fixture(scope="module")
def client(server_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0) as client:
        yield client  # closed: an unclosed client's sockets warn when collected


@pytest.fixture(scope="module")
def model(served_model: str) -> str:
    return served_model


def test_a_response_has_text_usage_and_a_status(client: openai.OpenAI, model: str):
    response = client.responses.create(
        model=model,
        instructions="You are terse.",
        input="Name a color.",
        temperature=0,
        max_output_tokens=16,
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.model == model and response.instructions == "You are terse."
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text.strip()
    assert response.status in ("completed", "incomplete")
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"
    usage = response.usage
    assert usage.input_tokens > 5 and 0 < usage.output_tokens <= 16
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_the_token_limit_makes_an_incomplete_response(client: openai.OpenAI, model: str):
    response = client.responses.create(
        model=model, input="Write a long story about a dragon.", max_output_tokens=3
    )
    assert response.status == "incomplete" and response.usage.output_tokens == 3
    assert response.incomplete_details.reason == "max_output_tokens"


def test_the_sdk_stream_gives_the_same_response(client: openai.OpenAI, model: str):
    with client.responses.stream(
        model=model, input="Say hi.", temperature=0, max_output_tokens=200
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and final.output_text == deltas and final.status == "completed"


def test_a_chain_reuses_the_stored_conversation_and_its_cache(client: openai.OpenAI, model: str):
    first = client.responses.create(
        model=model, input="My name is Ada. Remember it.", temperature=0, max_output_tokens=12
    )
    second = client.responses.create(
        model=model,
        previous_response_id=first.id,
        input="What is my name?",
        temperature=0,
        max_output_tokens=12,
    )
    assert second.previous_response_id == first.id
    # the whole first exchange is in the prompt, and its KV came from the prefix cache
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 2
    counted = client.responses.input_tokens.count(
        model=model, previous_response_id=first.id, input="What is my name?"
    )
    assert counted.input_tokens == second.usage.input_tokens


def test_stored_responses_can_be_read_listed_and_deleted(
    client: openai.OpenAI, model: str, server_url: str
):
    response = client.responses.create(model=model, input="Hello there.", max_output_tokens=4)
    again = client.responses.retrieve(response.id)
    assert again.id == response.id and again.output_text == response.output_text
    items = client.responses.input_items.list(response.id)
    assert [item.type for item in items.data] == ["message"]
    assert items.data[0].content[0].text == "Hello there."
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError) as gone:
        client.responses.create(
            model=model, previous_response_id=response.id, input="More.", max_output_tokens=2
        )
    assert gone.value.code == "previous_response_not_found"


def test_store_false_keeps_nothing(client: openai.OpenAI, model: str):
    response = client.responses.create(
        model=model, input="Hello.", max_output_tokens=2, store=False
    )
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_a_function_call_and_its_output_round_trip(client: openai.OpenAI, model: str):
    call = client.responses.create(
        model=model,
        input=ASK,
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=64,
    )
    calls = [item for item in call.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert "city" in json.loads(calls[0].arguments) and calls[0].call_id.startswith("call_")
    answer = client.responses.create(
        model=model,
        previous_response_id=call.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny"}],
        tools=[WEATHER],
        temperature=0,
        max_output_tokens=16,
    )
    assert answer.usage.input_tokens > call.usage.input_tokens
    assert answer.usage.input_tokens_details.cached_tokens > 0


def test_a_streamed_function_call_has_its_argument_events(client: openai.OpenAI, model: str):
    with client.responses.stream(
        model=model,
        input=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=128,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    assert any(item.type == "function_call" for item in final.output)


def test_text_format_json_schema_constrains_the_output(client: openai.OpenAI, model: str):
    schema = {
        "type": "object",
        "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["color"],
        "additionalProperties": False,
    }
    response = client.responses.create(
        model=model,
        input="Pick a color.",
        text={"format": {"type": "json_schema", "name": "pick", "schema": schema}},
        max_output_tokens=40,
    )
    assert json.loads(response.output_text)["color"] in ("red", "green", "blue")


def test_bad_input_is_a_400_naming_the_field(client: openai.OpenAI, model: str, server_url: str):
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="nope", input="x")
    assert missing.value.code == "model_not_found"
    refused = {
        "tools": [{"type": "web_search"}],
        "background": True,
        "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
        "reasoning": {"effort": "high"},
        "nonsense": 1,
    }
    for field, value in refused.items():
        body = {"model": model, "input": "x", field: value}
        answer = httpx.post(f"{server_url}/v1/responses", json=body)
        assert answer.status_code == 400, field
        error = answer.json()["error"]
        assert field in f"{error['param']} {error['message']}", (field, error)
    over = httpx.post(
        f"{server_url}/v1/responses",
        json={"model": model, "input": "word " * 5000, "max_output_tokens": 8},
    )
    assert over.status_code == 400 and over.json()["error"]["code"] == "context_length_exceeded"
    broken = httpx.post(
        f"{server_url}/v1/responses",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert broken.status_code == 400


def test_a_client_that_goes_away_frees_the_engine(model: str, server_url: str):
    body = {
        "model": model,
        "input": "Write a very long story.",
        "stream": True,
        "max_output_tokens": 2000,
    }
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server_url}/v1/responses", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("event: response.output_text.delta"):
                    break
        _assert_engine_idle(http, server_url)


def _assert_engine_idle(http: httpx.Client, server_url: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if http.get(f"{server_url}/server/stats").json()["num_running"] == 0:
            break
        time.sleep(0.1)
    assert http.get(f"{server_url}/server/stats").json()["num_running"] == 0


def _until_done(connection: object) -> list[object]:
    events = []
    for event in connection:  # type: ignore[attr-defined]
        events.append(event)
        if event.type in ENDED:
            break
    return events


def test_websocket_mode_chains_responses_on_one_connection(client: openai.OpenAI, model: str):
    with client.responses.connect() as connection:
        connection.response.create(
            model=model, input="My name is Ada.", max_output_tokens=8, store=False
        )
        first = _until_done(connection)
        assert first[0].type == "response.created" and first[-1].type in ENDED[:2]
        done = first[-1].response
        deltas = "".join(e.delta for e in first if e.type == "response.output_text.delta")
        assert deltas == done.output_text
        # store: false, yet the connection continues its own chain
        connection.response.create(
            model=model,
            input="My name?",
            previous_response_id=done.id,
            max_output_tokens=8,
            store=False,
        )
        second = _until_done(connection)[-1].response
        assert second.usage.input_tokens_details.cached_tokens >= done.usage.input_tokens - 2
        connection.response.create(model="nope", input="x")
        (error,) = _until_done(connection)
        assert error.type == "error" and error.code == "model_not_found"
        connection.response.create(model=model, input="Still here?", max_output_tokens=2)
        assert _until_done(connection)[-1].type in ENDED[:2]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(done.id)  # never stored outside the connection


def test_a_websocket_that_goes_away_frees_the_engine(server_url: str, model: str):
    from websockets.sync.client import connect

    url = server_url.replace("http://", "ws://") + "/v1/responses"
    with connect(url) as socket:
        create = {
            "type": "response.create",
            "model": model,
            "input": "Write a long story.",
            "max_output_tokens": 2000,
        }
        socket.send(json.dumps(create))
        while json.loads(socket.recv())["type"] != "response.output_text.delta":
            pass
    with httpx.Client(timeout=30) as http:
        _assert_engine_idle(http, server_url)


def test_websocket_messages_that_are_not_requests_get_error_events(server_url: str):
    from websockets.sync.client import connect

    url = server_url.replace("http://", "ws://") + "/v1/responses"
    with connect(url) as socket:
        for message in ("{not json", json.dumps({"type": "session.update"}), "[]"):
            socket.send(message)
            event = json.loads(socket.recv())
            assert event["type"] == "error" and event["status"] == 400
        socket.send(json.dumps({"type": "response.create", "input": "x"}))  # no model
        event = json.loads(socket.recv())
        assert event["type"] == "error" and event["param"] == "model"


def test_a_websocket_that_floods_messages_behind_a_response_is_closed(server_url: str, model: str):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = server_url.replace("http://", "ws://") + "/v1/responses"
    create = {
        "type": "response.create",
        "model": model,
        "input": "Write a long story.",
        "max_output_tokens": 2000,
    }
    with connect(url) as socket:
        socket.send(json.dumps(create))
        while json.loads(socket.recv())["type"] != "response.output_text.delta":
            pass
        deadline = time.monotonic() + 30
        # The server may close the socket before the 40th send (then `send` raises).
        with pytest.raises(ConnectionClosed) as closed:
            for _ in range(40):  # the response in flight, then 32 may wait: the 33rd is refused
                socket.send(json.dumps(create))
            while time.monotonic() < deadline:
                socket.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    with httpx.Client(timeout=30) as http:
        _assert_engine_idle(http, server_url)
