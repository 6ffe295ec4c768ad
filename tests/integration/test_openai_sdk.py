"""The official `openai` SDK against a real `inferflux serve` (SmolLM2-135M on llama.cpp).

Requests run one at a time, so greedy outputs compared here share one batch shape.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI

from inferflux.config.loader import load_settings
from inferflux.engine.protocol import Tokenizer
from inferflux.models.files import load_served_model

pytestmark = [pytest.mark.model, pytest.mark.server]

QUESTION = [{"role": "user", "content": "Write a short story about a brave knight."}]
PROMPT = "The three primary colors are"


@pytest.fixture(scope="module")
def client(server_url: str) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def model_id(client: OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """The served model's vocabulary, loaded in the test process (no weights)."""
    return load_served_model(load_settings(env={}))[1]


def greedy_chat(client: OpenAI, max_tokens: int = 16) -> str:
    # `model` left out on purpose: the server then uses the one model it serves.
    response = client.chat.completions.create(
        model=openai.omit, messages=QUESTION, max_tokens=max_tokens, temperature=0
    )
    return response.choices[0].message.content or ""


def test_models_list(client: OpenAI, model_id: str) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [model_id]
    assert models[0].owned_by == "inferflux"


def test_chat_non_streaming(client: OpenAI, model_id: str) -> None:
    response = client.chat.completions.create(
        model=model_id, messages=QUESTION, max_tokens=16, temperature=0
    )
    assert response.object == "chat.completion" and response.model == model_id
    assert response.id.startswith("chatcmpl-") and response.system_fingerprint
    choice = response.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert usage is not None and usage.prompt_tokens > 10
    assert 1 <= usage.completion_tokens <= 16
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_chat_streaming_matches_non_streaming(client: OpenAI) -> None:
    expected = greedy_chat(client)
    stream = client.chat.completions.create(
        messages=QUESTION,
        model=openai.omit,
        max_tokens=16,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.usage is None for c in chunks)


def test_chat_stream_include_usage(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        messages=QUESTION,
        model=openai.omit,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 8
    assert last.usage.total_tokens == last.usage.prompt_tokens + 8
    assert all(c.usage is None for c in chunks[:-1])


def test_max_tokens_gives_finish_reason_length(client: OpenAI) -> None:
    response = client.chat.completions.create(
        messages=QUESTION,
        model=openai.omit,
        max_tokens=5,
        temperature=0,
    )
    assert response.choices[0].finish_reason == "length"
    assert response.usage is not None and response.usage.completion_tokens == 5


def test_completions_non_streaming_and_streaming(client: OpenAI, model_id: str) -> None:
    response = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=8, temperature=0)
    assert response.object == "text_completion"
    text = response.choices[0].text
    assert text and response.usage is not None and response.usage.completion_tokens <= 8
    stream = client.completions.create(
        model=model_id,
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == response.usage.completion_tokens


def test_stop_string_is_never_output(client: OpenAI) -> None:
    full = greedy_chat(client, max_tokens=24)
    words = full.split()
    assert len(words) >= 4, full
    stop = words[len(words) // 2]
    expected = full[: full.index(stop)]
    response = client.chat.completions.create(
        messages=QUESTION,
        model=openai.omit,
        max_tokens=24,
        temperature=0,
        stop=[stop],
    )
    text = response.choices[0].message.content or ""
    assert stop not in text
    assert text == expected
    assert response.choices[0].finish_reason == "stop"


def test_stop_string_in_a_stream(client: OpenAI) -> None:
    full = greedy_chat(client, max_tokens=24)
    stop = full.split()[2]
    stream = client.chat.completions.create(
        messages=QUESTION,
        model=openai.omit,
        max_tokens=24,
        temperature=0,
        stop=stop,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert stop not in text and text == full[: full.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_greedy_is_deterministic(client: OpenAI) -> None:
    assert greedy_chat(client) == greedy_chat(client)


def test_seed_reproduces_sampling(client: OpenAI) -> None:
    def sample(seed: int) -> str:
        response = client.completions.create(
            model=openai.omit,
            prompt="Once upon a time",
            max_tokens=16,
            temperature=0.8,
            seed=seed,
        )
        return response.choices[0].text

    first = sample(1234)
    assert first and sample(1234) == first


def test_logit_bias_bans_and_forces_tokens(client: OpenAI, tokenizer: Tokenizer) -> None:
    prompt_ids = tokenizer.tokenize(PROMPT, add_special=True, parse_special=True)

    def first_token(bias: dict[str, int] | None = None) -> str:
        response = client.completions.create(
            model=openai.omit,
            prompt=prompt_ids,
            max_tokens=1,
            temperature=0,
            logit_bias=bias or openai.omit,
        )
        return response.choices[0].text

    greedy = first_token()
    greedy_ids = tokenizer.tokenize(greedy, add_special=False, parse_special=False)
    assert len(greedy_ids) == 1, (greedy, greedy_ids)
    assert first_token({str(greedy_ids[0]): -100}) != greedy
    forced = tokenizer.tokenize(" banana", add_special=False, parse_special=False)[-1]
    assert first_token({str(forced): 100}) == tokenizer.detokenize([forced])


def test_errors_raise_the_sdk_exceptions(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(
            model=openai.omit,
            prompt="hello " * 5000,
            max_tokens=4,
        )
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as bad_param:
        client.chat.completions.create(
            model=openai.omit,
            messages=QUESTION,
            temperature=3,
        )
    assert bad_param.value.param == "temperature"
