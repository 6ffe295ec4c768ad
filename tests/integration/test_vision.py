"""Images in, end to end, through a real `inferflux serve --model vision`.

The model is SmolLM2-135M-Instruct with the demo mmproj (models/demo_vision.py): a tiny
deterministic idefics3-shaped vision tower, not a trained one. So these tests check the
path a real vision model takes (parsing, fetching, the worker's libmtmd encode, image rows
decoded as embeddings in the continuous batch, KV keyed by the image) and what can be told
from outside: the image changes the answer, the same image reuses its KV, a different one
does not. They never check what the model "sees".
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import ollama
import openai
import pytest
from PIL import Image

from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

QUESTION = "What is in this picture?"


def png(color: tuple[int, int, int], size: int = 96) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (size, size), color).save(out, format="PNG")
    return out.getvalue()


RED, BLUE = png((220, 30, 30)), png((30, 30, 220))


def noise_png(size: int) -> bytes:
    """Random pixels: a PNG of about 3 bytes a pixel (over the server's 64 KiB limit)."""
    out = io.BytesIO()
    Image.frombytes("RGB", (size, size), os.urandom(size * size * 3)).save(out, format="PNG")
    return out.getvalue()


def bilevel_png(size: int) -> bytes:
    """A blank 1-bit image: a few KB on disk, size² pixels (a decompression bomb's shape)."""
    out = io.BytesIO()
    Image.new("1", (size, size)).save(out, format="PNG")
    return out.getvalue()


def data_uri(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def image_message(url: str, text: str = QUESTION) -> list[dict[str, object]]:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
    return [{"role": "user", "content": content}]


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = {"/red.png": RED, "/blue.png": BLUE}.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def image_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder: Path = tmp_path_factory.mktemp("vision")
    env = {
        "INFERFLUX_MULTIMODAL__ALLOW_URLS": "true",
        "INFERFLUX_MULTIMODAL__URL_ALLOWLIST": "127.0.0.1",
        "INFERFLUX_MULTIMODAL__MAX_IMAGE_BYTES": "65536",
        "INFERFLUX_MULTIMODAL__MAX_PIXELS": "4000000",
    }
    server = ServerProcess("--model", "vision", env=env, log_path=folder / "server.log")
    try:
        server.wait_ready(timeout_s=240)
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def http_client(vision: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=vision.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def sdk(vision: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{vision.url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def model(http_client: httpx.Client) -> str:
    return str(http_client.get("/v1/models").json()["data"][0]["id"])


def chat(sdk: openai.OpenAI, model: str, messages: list[dict[str, object]]):  # noqa: ANN201
    return sdk.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
    )


def test_a_data_uri_image_through_the_openai_sdk(sdk: openai.OpenAI, model: str) -> None:
    with_image = chat(sdk, model, image_message(data_uri(RED)))
    text_only = chat(sdk, model, [{"role": "user", "content": QUESTION}])
    assert with_image.choices[0].message.content
    assert with_image.usage and text_only.usage
    # the image's tokens count as prompt tokens, as OpenAI counts them
    assert with_image.usage.prompt_tokens > text_only.usage.prompt_tokens + 8


@pytest.mark.parametrize(
    ("color", "word"), [((255, 0, 0), "red"), ((0, 255, 0), "green"), ((0, 0, 255), "blue")]
)
def test_the_model_names_the_image_s_colour(
    sdk: openai.OpenAI, model: str, color: tuple[int, int, int], word: str
) -> None:
    """The demo mmproj maps an image's mean colour onto the embeddings of " red", " green"
    and " blue" (models/demo_vision.py): so the answer shows the image reached the model,
    through the worker's encode and the embedding decode."""
    question = "What colour is this image? Answer with one word."
    answer = chat(sdk, model, image_message(data_uri(png(color, size=64)), question))
    assert word in (answer.choices[0].message.content or "").lower()


def test_the_same_image_reuses_its_kv_and_another_does_not(
    http_client: httpx.Client, model: str
) -> None:
    def cached(data: bytes) -> tuple[int, int]:
        body = {
            "model": model,
            "messages": image_message(data_uri(data), "Describe it in detail, please."),
            "max_tokens": 2,
        }
        usage = http_client.post("/v1/chat/completions", json=body).json()["usage"]
        return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]

    picture = png((123, 45, 67))
    prompt_tokens, _ = cached(picture)
    _, hit = cached(picture)
    _, other = cached(png((67, 45, 123)))
    assert hit >= prompt_tokens - 16  # all but the last block: the image's KV was reused
    assert other < hit - 8  # another image stops the match where the images start


def test_a_url_image_from_a_loopback_server(
    sdk: openai.OpenAI, model: str, image_server: str
) -> None:
    """Loopback is refused unless allow-listed: this server allow-lists 127.0.0.1."""
    by_url = chat(sdk, model, image_message(f"{image_server}/blue.png"))
    by_data = chat(sdk, model, image_message(data_uri(BLUE)))
    assert by_url.choices[0].message.content == by_data.choices[0].message.content


def test_the_ollama_client_sends_images(vision: ServerProcess, model: str) -> None:
    with ollama.Client(host=vision.url, timeout=120) as client:
        options = {"temperature": 0, "num_predict": 8}
        message = {"role": "user", "content": QUESTION, "images": [RED]}
        chat_answer = client.chat(model=model, messages=[message], options=options)
        assert chat_answer.message.content
        generated = client.generate(model=model, prompt=QUESTION, images=[RED], options=options)
        assert generated.response
        show = client.show(model)
        assert "vision" in (show.capabilities or [])


def test_image_and_text_requests_decode_together(
    http_client: httpx.Client, sdk: openai.OpenAI, model: str
) -> None:
    """A text stream keeps producing tokens while image requests come and go."""
    before = http_client.get("/server/stats").json()["workers"][0]["images"]
    stamps: list[float] = []
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Write a long essay about the history of Rome."}],
        "max_tokens": 200,
        "temperature": 0,
        "stream": True,
    }

    def stream_text() -> None:
        with http_client.stream("POST", "/v1/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    stamps.append(time.monotonic())

    with ThreadPoolExecutor(2) as pool:
        text = pool.submit(stream_text)
        while len(stamps) < 5:
            time.sleep(0.01)
        started = time.monotonic()
        for index in range(3):
            chat(sdk, model, image_message(data_uri(png((index * 80, 10, 10)))))
        ended = time.monotonic()
        text.result(timeout=120)
    assert any(started < s < ended for s in stamps)  # tokens while images were served
    after = http_client.get("/server/stats").json()["workers"][0]["images"]
    assert after["num_images_total"] >= before["num_images_total"] + 3
    assert after["num_preparing"] == 0


def test_metrics_count_images(http_client: httpx.Client) -> None:
    text = http_client.get("/metrics").text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("inferflux_multimodal_"):
            name, value = line.split("{")[0].split(" ")[0], float(line.rsplit(" ", 1)[1])
            values[name] = values.get(name, 0.0) + value
    assert values["inferflux_multimodal_images_total"] > 0
    assert values["inferflux_multimodal_requests_total"] > 0
    assert values["inferflux_multimodal_worker_images_total"] > 0
    assert values["inferflux_multimodal_encode_seconds_total"] > 0
    assert values["inferflux_multimodal_preparing_requests"] == 0


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("data:image/png;base64,@@@", "base64"),
        (data_uri(b"this is not an image"), "image"),
        ("file:///etc/passwd", "http"),
        ("http://169.254.169.254/latest/meta-data", "169.254.169.254"),
        (data_uri(noise_png(300)), "the limit is 65536 (multimodal.max_image_bytes)"),
        (data_uri(bilevel_png(3000)), "the limit is 4000000 (multimodal.max_pixels)"),
    ],
    ids=[
        "bad base64",
        "not an image",
        "file url",
        "metadata address",
        "too big",
        "too many pixels",
    ],
)
def test_bad_images_are_400s(http_client: httpx.Client, model: str, url: str, words: str) -> None:
    body = {"model": model, "messages": image_message(url), "max_tokens": 2}
    response = http_client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert words in error["message"], error["message"]


def test_the_debug_record_carries_the_image_hash_not_its_bytes(
    http_client: httpx.Client, sdk: openai.OpenAI, model: str
) -> None:
    answer = chat(sdk, model, image_message(data_uri(RED)))
    record = http_client.get(f"/debug/requests/{answer.id}").text
    assert hashlib.sha256(RED).hexdigest() in record
    assert base64.b64encode(RED).decode()[:40] not in record


@pytest.fixture(scope="module")
def small_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`--model vision` with a 160-token context: an image (50 tokens) fills it fast."""
    log = tmp_path_factory.mktemp("vision-small") / "server.log"
    env = {"INFERFLUX_MODEL__CTX_SIZE": "160"}
    server = ServerProcess("--model", "vision", env=env, log_path=log)
    try:
        server.wait_ready(timeout_s=240)
        yield server
    finally:
        server.close()


def test_max_tokens_is_cut_to_what_the_images_leave(small_context: ServerProcess) -> None:
    """The API checks the context with the text's tokens only; the worker, knowing the
    image's tokens, cuts an unset (or too large) max_tokens to what is left, as
    llama-server does, and refuses a prompt its images push over the context."""
    url = f"{small_context.url}/v1/chat/completions"
    body = {"model": "vision", "messages": image_message(data_uri(RED)), "temperature": 0}
    answer = httpx.post(url, json=body, timeout=120).json()
    usage = answer["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= 160, answer
    assert answer["choices"][0]["finish_reason"] in ("length", "stop")
    three = image_message(data_uri(RED)) + image_message(data_uri(BLUE))
    three += image_message(data_uri(png((9, 9, 9))))
    response = httpx.post(url, json={"model": "vision", "messages": three}, timeout=120)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "with its images' tokens" in error["message"]


def test_every_dialect_carries_the_image(
    http_client: httpx.Client, sdk: openai.OpenAI, model: str
) -> None:
    """Native /chat, Anthropic /v1/messages and the Responses API reach the same encoder:
    each answer names the solid image's colour."""
    question = "What colour is this image? Answer with one word."
    red = png((255, 0, 0), size=64)
    b64 = base64.b64encode(red).decode()
    native = {
        "model": model,
        "messages": [{"role": "user", "content": question, "images": [b64]}],
        "max_tokens": 12,
        "temperature": 0,
    }
    answer = http_client.post("/chat", json=native)
    assert answer.status_code == 200, answer.text
    assert "red" in answer.json()["message"]["content"].lower()
    source = {"type": "base64", "media_type": "image/png", "data": b64}
    content = [{"type": "image", "source": source}, {"type": "text", "text": question}]
    anthropic = {
        "model": model,
        "max_tokens": 12,
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    }
    answer = http_client.post("/v1/messages", json=anthropic)
    assert answer.status_code == 200, answer.text
    assert "red" in answer.json()["content"][0]["text"].lower()
    parts = [
        {"type": "input_image", "image_url": data_uri(red)},
        {"type": "input_text", "text": question},
    ]
    response = sdk.responses.create(
        model=model,
        input=[{"role": "user", "content": parts}],  # type: ignore[list-item]
        max_output_tokens=12,
        temperature=0,
    )
    assert "red" in response.output_text.lower()
