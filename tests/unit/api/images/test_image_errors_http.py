"""Image refusals over HTTP (the app over the fake engine, whose model has no mmproj):
OpenAI-shaped 400s naming the part, whatever is wrong, and never an echo of the image
data in the answer."""

from __future__ import annotations

import base64

import pytest

from tests.openai_envelope import assert_envelope

from .loopback_server import png_bytes

B64 = base64.b64encode(png_bytes()).decode()
DATA_URI = f"data:image/png;base64,{B64}"


def chat(image_url: object, role: str = "user") -> dict[str, object]:
    part = {"type": "image_url", "image_url": image_url}
    return {"messages": [{"role": role, "content": [{"type": "text", "text": "x"}, part]}]}


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        (chat({"url": DATA_URI}), "messages[0].content[1].image_url", "has no mmproj"),
        (chat(DATA_URI), "messages[0].content[1].image_url", "has no mmproj"),
        (chat({"url": DATA_URI, "detail": "ultra"}), "messages[0].content[1].image_url.detail", ""),
        (chat({"url": DATA_URI, "crop": 1}), "messages[0].content[1].image_url.crop", ""),
        (chat({"url": DATA_URI}, role="system"), "messages[0].content[1]", "only user messages"),
        (chat({"url": DATA_URI[:-8] + "!!!!"}), "messages[0].content[1].image_url", "base64"),
        (chat({"url": "file:///etc/passwd"}), "messages[0].content[1].image_url", "'file' URL"),
        (chat({"url": "http://10.0.0.1/a.png"}), "messages[0].content[1].image_url", "allow_urls"),
    ],
)
async def test_image_refusals_are_openai_400s(client, body, param, needle):
    response = await client.post("/v1/chat/completions", json=body)
    error = assert_envelope(response, 400, param=param)
    assert needle in str(error["message"])
    assert B64[:24] not in response.text


async def test_ollama_and_native_images_name_the_field(client):
    turn = {"role": "user", "content": "x", "images": [B64]}
    response = await client.post("/chat", json={"messages": [turn]})
    assert_envelope(response, 400, param="messages[0].images[0]")
    turn = {"role": "assistant", "content": "x", "images": [B64]}
    response = await client.post("/chat", json={"messages": [turn]})
    error = assert_envelope(response, 400, param="messages[0].images")
    assert "only user messages" in str(error["message"])
    body = {"model": "fake-model", "prompt": "x", "images": ["%%"]}
    response = await client.post("/api/generate", json=body)
    assert response.status_code == 400 and "not valid base64" in response.text
