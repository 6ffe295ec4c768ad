"""Images in (issue 28) through a real `inferflux serve` on the default SmolLM2, which has
no mmproj: an image (OpenAI SDK data URI, Ollama `images` on chat and generate) is a 400
naming the model, never dropped; a malformed data URI and a URL while
`multimodal.allow_urls` is off are 400s that say why; the image data never reaches the
server's log. Text requests on the same server keep working."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import openai
import pytest
from openai import OpenAI
from PIL import Image

from tests.openai_envelope import assert_envelope


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (250, 30, 30)).save(out, format="PNG")
    return out.getvalue()


B64 = base64.b64encode(png()).decode()
DATA_URI = f"data:image/png;base64,{B64}"


@pytest.fixture(scope="module")
def client(server_url: str) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def ask(client: OpenAI, model: str, url: str) -> None:
    client.chat.completions.create(
        model=model,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What color is this?"},
                    {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
                ],
            }
        ],
        max_tokens=4,
    )


def test_openai_image_to_a_model_without_mmproj(client: OpenAI, served_model: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, served_model, DATA_URI)
    assert refused.value.status_code == 400
    assert refused.value.param == "messages[0].content[1].image_url"
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["message"] == f"model '{served_model}' does not take images: it has no mmproj"
    assert error["type"] == "invalid_request_error"


def test_malformed_data_uri(client: OpenAI, served_model: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, served_model, "data:image/png;base64,not*base64!")
    assert refused.value.param == "messages[0].content[1].image_url"
    assert "not valid base64" in refused.value.message


def test_url_while_allow_urls_is_off(client: OpenAI, served_model: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, served_model, "http://169.254.169.254/latest/meta-data/")
    assert refused.value.param == "messages[0].content[1].image_url"
    assert "multimodal.allow_urls is off" in refused.value.message


def test_ollama_images_on_chat_and_generate(server_url: str, served_model: str) -> None:
    no_mmproj = f"model '{served_model}' does not take images: it has no mmproj"
    with ollama.Client(host=server_url, timeout=120) as client:
        with pytest.raises(ollama.ResponseError) as refused:
            client.chat(
                model=served_model,
                messages=[{"role": "user", "content": "What is this?", "images": [png()]}],
            )
        assert refused.value.status_code == 400
        assert no_mmproj in refused.value.error
        with pytest.raises(ollama.ResponseError) as refused:
            client.generate(model=served_model, prompt="What is this?", images=[png()])
        assert refused.value.status_code == 400
        assert no_mmproj in refused.value.error


def test_native_chat_and_anthropic_images(server_url: str, served_model: str) -> None:
    no_mmproj = f"model '{served_model}' does not take images: it has no mmproj"
    with httpx.Client(base_url=server_url, timeout=60) as http:
        turn = {"role": "user", "content": "What is this?", "images": [DATA_URI]}
        response = http.post("/chat", json={"model": served_model, "messages": [turn]})
        error = assert_envelope(response, 400, param="messages[0].images[0]")
        assert error["message"] == no_mmproj
        source = {"type": "base64", "media_type": "image/png", "data": B64}
        content = [{"type": "image", "source": source}, {"type": "text", "text": "What?"}]
        body = {
            "model": served_model,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": content}],
        }
        response = http.post("/v1/messages", json=body)
        assert response.status_code == 400
        assert response.json()["error"]["message"] == f"messages[0].content[0].source: {no_mmproj}"


def test_responses_input_image(client: OpenAI, served_model: str) -> None:
    content = [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": DATA_URI, "detail": "auto"},
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model=served_model,
            input=[{"role": "user", "content": content}],  # type: ignore[list-item]
            max_output_tokens=16,
        )
    assert refused.value.param == "input[0].content[1].image_url"
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["message"] == f"model '{served_model}' does not take images: it has no mmproj"


def test_raw_bodies_name_the_field(server_url: str, served_model: str) -> None:
    with httpx.Client(base_url=server_url, timeout=60) as http:
        chat = {
            "model": served_model,
            "stream": False,
            "messages": [{"role": "user", "content": "x", "images": [B64, "%%"]}],
        }
        response = http.post("/api/chat", json=chat)
        assert response.status_code == 400
        assert "not valid base64" in response.text
        unknown = {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}
        body = {"model": served_model, "messages": [{"role": "user", "content": [unknown]}]}
        error = assert_envelope(http.post("/v1/chat/completions", json=body), 400)
        assert "'input_audio' is not supported" in str(error["message"])


def test_text_still_works_and_the_log_never_holds_image_data(
    client: OpenAI, served_model: str, server_log: Path
) -> None:
    reply = client.chat.completions.create(
        model=served_model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert reply.choices[0].finish_reason in ("length", "stop")
    log = server_log.read_text(errors="replace")
    assert B64[:40] not in log
    assert "not*base64!" not in log
