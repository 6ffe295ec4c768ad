"""Images through the dialects' parsing and the planner (fake tokenizer: one token per
byte): each image lands at the token position its marker stood at, the checks run in
order (count, URL policy, a model with an mmproj, then per image), a client's own
`<__media__>` stays text, and the metrics count only what was taken."""

from __future__ import annotations

import base64
import dataclasses
import hashlib

import pytest

from inferflux.api.generation import ChatPrompt, GenerationSpec, SamplingParams, TextPrompt
from inferflux.api.generation.planner import Planner
from inferflux.api.images import ImageSet
from inferflux.api.ollama.generate import generate_prompt
from inferflux.api.ollama.protocol import OllamaChatRequest, OllamaGenerateRequest
from inferflux.api.openai.protocol import ChatCompletionRequest
from inferflux.config.settings import Settings
from inferflux.errors import InvalidRequest
from inferflux.models.resident import build_serving
from inferflux.models.serving import ClientEngine, ServingState
from inferflux.observability.metrics import Metrics
from tests.fakes.engine import FakeEngineClient, FakeTokenizer, fake_model_info

from .loopback_server import png_bytes

PNG = png_bytes((4, 3))
DATA_URI = "data:image/png;base64," + base64.b64encode(PNG).decode()


def serving(*, vision: bool = True, **multimodal) -> ServingState:
    info = fake_model_info(n_ctx=4096)
    if vision:
        info = dataclasses.replace(info, mmproj="/models/mmproj.gguf")
    settings = Settings(multimodal=multimodal)
    return build_serving(
        settings, FakeEngineClient(), FakeTokenizer(), info, lambda e, t, i: ClientEngine(e)
    )


def spec(prompt) -> GenerationSpec:
    return GenerationSpec(
        id_prefix="t",
        prompts=[prompt],
        sampling=lambda limit: SamplingParams(max_tokens=limit),
        prompt_param="messages",
        max_tokens=4,
    )


def openai_prompt(content) -> ChatPrompt:
    body = ChatCompletionRequest.model_validate(
        {"model": "fake-model", "messages": [{"role": "user", "content": content}]}
    )
    images = ImageSet()
    return ChatPrompt(body.template_messages(images), images=images or None)


def image_part(url: str = DATA_URI) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": url, "detail": "low"}}


async def plan(prompt, state: ServingState | None = None, metrics: Metrics | None = None):
    state = state or serving()
    return await Planner(state, None, metrics).plan(spec(prompt))


def text_of(token_ids: list[int]) -> str:
    return FakeTokenizer().detokenize(token_ids)


async def test_images_go_where_their_parts_stand():
    content = [{"type": "text", "text": "A"}, image_part(), {"type": "text", "text": "B"}]
    content.append(image_part())
    request = (await plan(openai_prompt(content))).choices[0].request
    first, second = request.images
    tokens = request.prompt_token_ids
    assert text_of(tokens[: first.position]).endswith("user\nA\n")
    assert text_of(tokens[first.position : second.position]) == "\nB\n"
    assert text_of(tokens[second.position :]).startswith("<|im_end|>")
    assert first.sha256 == hashlib.sha256(PNG).hexdigest() and first.data == PNG
    assert tokens[0] == 1  # BOS once, on the first piece only
    assert tokens.count(1) == 1


async def test_a_client_media_marker_stays_text():
    content = [{"type": "text", "text": "see <__media__> here"}, image_part()]
    request = (await plan(openai_prompt(content))).choices[0].request
    assert len(request.images) == 1
    assert "see <__media__> here" in text_of(request.prompt_token_ids)


async def test_a_model_without_mmproj_is_named():
    prompt = openai_prompt([{"type": "text", "text": "hi"}, image_part()])
    with pytest.raises(InvalidRequest) as caught:
        await plan(prompt, serving(vision=False))
    assert caught.value.message == "model 'fake-model' does not take images: it has no mmproj"
    assert caught.value.param == "messages[0].content[1].image_url"


async def test_urls_are_refused_while_allow_urls_is_off_before_the_model_check():
    prompt = openai_prompt([image_part("https://example.com/cat.png")])
    with pytest.raises(InvalidRequest) as caught:
        await plan(prompt, serving(vision=False))
    assert "multimodal.allow_urls is off" in caught.value.message
    assert caught.value.param == "messages[0].content[0].image_url"


async def test_too_many_images():
    prompt = openai_prompt([image_part()] * 3)
    with pytest.raises(InvalidRequest) as caught:
        await plan(prompt, serving(max_images_per_request=2))
    assert "3 images; at most 2" in caught.value.message
    assert caught.value.param == "messages[0].content[2].image_url"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("data:image/png;base64,%%%", "not valid base64"),
        ("data:image/png,rawbytes", "must be base64-encoded"),
        ("data:text/plain;base64,aGk=", "media type 'text/plain' is not an image"),
        ("data:image/png;base64", "the data URI is malformed"),
        ("ftp://example.com/a.png", "not a 'ftp' URL"),
        ("cat.png", "must be a data URI"),
    ],
)
def test_malformed_image_urls_are_refused_at_parse(url, message):
    with pytest.raises(InvalidRequest) as caught:
        openai_prompt([{"type": "text", "text": "x"}, image_part(url)])
    assert message in caught.value.message
    assert caught.value.param == "messages[0].content[1].image_url"
    assert "%%%" not in caught.value.message and "rawbytes" not in caught.value.message


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GIF89a" + bytes(10), "GIF image is corrupt or truncated"),
        (b"plain text", "not a PNG, JPEG, WebP or GIF image"),
        (PNG + bytes(2048), "the image is 2"),
    ],
)
async def test_bad_image_bytes_are_refused(data, message):
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    with pytest.raises(InvalidRequest) as caught:
        await plan(openai_prompt([image_part(uri)]), serving(max_image_bytes=2048))
    assert message in caught.value.message


async def test_too_many_pixels():
    uri = "data:image/png;base64," + base64.b64encode(png_bytes((100, 100))).decode()
    with pytest.raises(InvalidRequest, match="100x100 = 10000 pixels; the limit is 9999"):
        await plan(openai_prompt([image_part(uri)]), serving(max_pixels=9999))


def test_images_only_in_user_messages_and_only_known_parts():
    with pytest.raises(InvalidRequest, match="only user messages may carry images"):
        body = ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "system", "content": [image_part()]}]}
        )
        body.template_messages(ImageSet())
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": [image_part()]}]}
    )
    with pytest.raises(InvalidRequest, match="images are not taken here"):
        body.template_messages()


async def test_ollama_chat_and_generate_images():
    b64 = base64.b64encode(PNG).decode()
    body = OllamaChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "what?", "images": [b64, b64]}]}
    )
    images = ImageSet()
    prompt = ChatPrompt(body.template_messages(images), images=images)
    request = (await plan(prompt)).choices[0].request
    assert [image.position for image in request.images][1] > request.images[0].position
    assert text_of(request.prompt_token_ids[request.images[1].position :]).startswith("\nwhat?")

    generate = OllamaGenerateRequest.model_validate({"model": "m", "prompt": "hi", "images": [b64]})
    request = (await plan(generate_prompt(generate))).choices[0].request
    assert len(request.images) == 1
    raw = OllamaGenerateRequest.model_validate(
        {"model": "m", "prompt": "hi", "images": [b64], "raw": True}
    )
    prompt = generate_prompt(raw)
    assert isinstance(prompt, TextPrompt)
    request = (await plan(prompt)).choices[0].request
    assert request.images[0].position == 1  # after BOS, before "\nhi"
    bad = OllamaGenerateRequest.model_validate({"model": "m", "prompt": "hi", "images": ["%"]})
    with pytest.raises(InvalidRequest) as caught:
        generate_prompt(bad)
    assert caught.value.param == "images[0]"


async def test_metrics_count_images_taken():
    metrics = Metrics(model="fake-model", info={"backend": "llama.cpp"}, workers=list)
    await plan(openai_prompt([image_part(), image_part()]), metrics=metrics)
    with pytest.raises(InvalidRequest):
        await plan(openai_prompt([image_part()]), serving(vision=False), metrics=metrics)
    sample = metrics.registry.get_sample_value
    assert sample("inferflux_multimodal_images_total", {"model": "fake-model"}) == 2
    assert sample("inferflux_multimodal_requests_total", {"model": "fake-model"}) == 1
    assert sample("inferflux_multimodal_image_pixels_sum", {"model": "fake-model"}) == 24
    assert sample("inferflux_multimodal_image_bytes_count", {"model": "fake-model"}) == 2
    assert sample("inferflux_multimodal_preprocess_seconds_count", {"model": "fake-model"}) == 2


async def test_the_request_record_keeps_image_hashes_never_bytes():
    from inferflux.api.generation import GenerationService
    from inferflux.api.telemetry import make_telemetry
    from inferflux.security.context import RequestContext
    from inferflux.security.principal import ANONYMOUS

    state = serving()
    service = GenerationService(make_telemetry(Settings(), lambda: [], state.model_info))
    context = RequestContext("req-1", started_at=0.0, principal=ANONYMOUS)
    await service.plan(state, spec(openai_prompt([image_part(), image_part()])), context)
    assert context.record.image_sha256s == [hashlib.sha256(PNG).hexdigest()]


async def test_responses_input_image_parts():
    from inferflux.api.responses.protocol import ResponsesRequest, template_messages

    part = {"type": "input_image", "image_url": DATA_URI, "detail": "high"}
    text = {"type": "input_text", "text": "What?"}
    body = ResponsesRequest.model_validate(
        {"model": "m", "input": [{"role": "user", "content": [part, text]}]}
    )
    images = ImageSet()
    messages = template_messages(None, body.checked_input(), images)
    assert messages == [{"role": "user", "content": f"{images.marker}What?"}]
    request = (await plan(ChatPrompt(messages, images=images))).choices[0].request
    assert request.images[0].sha256 == hashlib.sha256(PNG).hexdigest()
    file_part = {"type": "input_image", "file_id": "file-1"}
    body = ResponsesRequest.model_validate(
        {"model": "m", "input": [{"role": "user", "content": [file_part]}]}
    )
    with pytest.raises(InvalidRequest) as caught:
        template_messages(None, body.checked_input(), ImageSet())
    assert caught.value.param == "input[0].content[0].image_url"
    assert "file_id is not supported" in caught.value.message
