"""Every OpenAI parameter against a real `inferflux serve` (SmolLM2-135M on llama.cpp), through
the official `openai` SDK where it has the parameter, raw httpx where it does not.

Greedy outputs are compared only between runs with the same batch shape (same n), since
batched decoding is not bit-identical to decoding alone (docs/engine-notes.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import OpenAI

from tests.openai_envelope import assert_envelope

pytestmark = [pytest.mark.model, pytest.mark.server]

STORY = [{"role": "user", "content": "Write a short story about a brave knight."}]
PROMPT = "The three primary colors are"


@pytest.fixture(scope="module")
def client(server_url: str) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def http(server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server_url, timeout=120) as c:
        yield c


def test_chat_n_gives_independent_seeded_choices(client: OpenAI) -> None:
    def sample() -> list[str]:
        response = client.chat.completions.create(
            model=openai.omit, messages=STORY, max_tokens=12, temperature=1.0, n=3, seed=42
        )
        assert [c.index for c in response.choices] == [0, 1, 2]
        assert all(c.finish_reason in ("stop", "length") for c in response.choices)
        usage = response.usage
        assert usage is not None and 3 <= usage.completion_tokens <= 36
        assert usage.prompt_tokens < 60  # the prompt counts once, not three times
        return [c.message.content or "" for c in response.choices]

    first = sample()
    assert all(first) and len(set(first)) > 1  # different seeds per choice
    assert sample() == first  # derived from the one seed: reproducible


def test_chat_n_streamed_equals_non_streamed(client: OpenAI) -> None:
    kwargs = {"model": openai.omit, "messages": STORY, "max_tokens": 12, "temperature": 0, "n": 2}
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    stream = client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    texts, finishes = ["", ""], [[], []]
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finishes[choice.index].append(choice.finish_reason)
    assert texts == [c.message.content for c in whole.choices]
    assert finishes == [[c.finish_reason] for c in whole.choices]
    assert len({c.id for c in chunks}) == 1 and all(c.system_fingerprint for c in chunks)
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None and whole.usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_logprobs_and_top_logprobs(client: OpenAI) -> None:
    response = client.chat.completions.create(
        model=openai.omit,
        messages=STORY,
        max_tokens=10,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
    )
    choice = response.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    content = choice.logprobs.content
    assert "".join(item.token for item in content) == choice.message.content
    for item in content:
        assert len(item.top_logprobs) == 5
        assert sum(math.exp(t.logprob) for t in item.top_logprobs) <= 1.0 + 1e-4
        # greedy: the sampled token is the most likely one, with the same logprob
        assert item.top_logprobs[0].token == item.token
        assert item.top_logprobs[0].logprob == pytest.approx(item.logprob, abs=1e-5)
        assert item.bytes is not None and bytes(item.bytes).decode(errors="replace") == item.token
    logprobs = [t.logprob for t in content[0].top_logprobs]
    assert logprobs == sorted(logprobs, reverse=True)


def test_chat_logprobs_stream_with_their_text(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=openai.omit,
        messages=STORY,
        max_tokens=10,
        temperature=0,
        logprobs=True,
        stream=True,
    )
    seen = 0
    for chunk in stream:
        choice = chunk.choices[0]
        if choice.delta.content:
            assert choice.logprobs is not None and choice.logprobs.content is not None
            tokens = "".join(item.token for item in choice.logprobs.content)
            assert tokens == choice.delta.content
            seen += len(choice.logprobs.content)
    assert seen >= 1


def test_completion_logprobs_with_echo(client: OpenAI, http: httpx.Client) -> None:
    response = client.completions.create(
        model=openai.omit, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3, echo=True
    )
    choice = response.choices[0]
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs
    assert logprobs.top_logprobs is not None and logprobs.text_offset is not None
    prompt_ids = http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    assert response.usage is not None and response.usage.prompt_tokens == len(prompt_ids)
    assert len(logprobs.tokens) == len(prompt_ids) + response.usage.completion_tokens
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(lp is not None and lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    assert logprobs.text_offset[len(prompt_ids)] == len(PROMPT)
    for top in logprobs.top_logprobs[1:]:
        assert top is not None and 1 <= len(top) <= 4  # top 3 plus the sampled token


def test_stop_list_cuts_at_the_earliest_match(client: OpenAI) -> None:
    full = client.completions.create(
        model=openai.omit, prompt=PROMPT, max_tokens=24, temperature=0
    ).choices[0]
    words = full.text.split()
    assert len(words) >= 4, full.text
    stops = [words[3], words[1]]
    cut = client.completions.create(
        model=openai.omit, prompt=PROMPT, max_tokens=24, temperature=0, stop=stops
    ).choices[0]
    earliest = min(full.text.index(s) for s in stops)
    assert cut.text == full.text[:earliest] and cut.finish_reason == "stop"


def test_completion_prompt_batch(client: OpenAI, http: httpx.Client) -> None:
    prompts = ["The sky is", "Roses are red,"]
    response = client.completions.create(
        model=openai.omit, prompt=prompts, max_tokens=4, temperature=0.7, n=2, echo=True
    )
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    for choice in response.choices:
        assert choice.text.startswith(prompts[choice.index // 2])
    counts = [http.post("/tokenize", json={"prompt": p}).json()["count"] for p in prompts]
    assert response.usage is not None and response.usage.prompt_tokens == sum(counts)
    token_prompts = [http.post("/tokenize", json={"prompt": p}).json()["tokens"] for p in prompts]
    by_ids = client.completions.create(model=openai.omit, prompt=token_prompts, max_tokens=2)
    assert len(by_ids.choices) == 2 and by_ids.usage is not None
    assert by_ids.usage.prompt_tokens == sum(counts)


def test_content_parts_equal_the_joined_string(client: OpenAI) -> None:
    parts = [
        {"type": "text", "text": "Write a short story"},
        {"type": "text", "text": "about a knight."},
    ]
    joined = "Write a short story\nabout a knight."

    def greedy(content: object) -> str:
        response = client.chat.completions.create(
            model=openai.omit,
            messages=[{"role": "user", "content": content}],  # type: ignore[list-item, misc]
            max_tokens=8,
            temperature=0,
        )
        return response.choices[0].message.content or ""

    assert greedy(parts) == greedy(joined)
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    with pytest.raises(openai.BadRequestError) as refused:
        greedy([parts[0], image])
    assert refused.value.param == "messages[0].content[1].image_url"
    assert "multimodal.allow_urls is off" in refused.value.message


def test_refused_and_unknown_parameters(client: OpenAI) -> None:
    cases = [
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"n": 17}, "n"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"stop": [str(i) for i in range(17)]}, "stop"),
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=openai.omit,
                messages=STORY,
                max_tokens=2,
                **kwargs,  # type: ignore[arg-type]
            )
        assert refused.value.param == param, kwargs


def test_hints_are_accepted(client: OpenAI) -> None:
    response = client.chat.completions.create(
        model=openai.omit,
        messages=STORY,
        max_completion_tokens=3,
        user="user-1",
        metadata={"k": "v"},
        store=False,
        service_tier="auto",
        response_format={"type": "text"},
        modalities=["text"],
        extra_body={"priority": "high", "top_k": 20, "min_p": 0.05, "repeat_penalty": 1.1},
    )
    assert response.usage is not None and response.usage.completion_tokens <= 3


def test_usage_details(client: OpenAI) -> None:
    response = client.chat.completions.create(
        model=openai.omit, messages=STORY, max_tokens=2, temperature=0
    )
    usage = response.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached is not None and 0 <= cached <= usage.prompt_tokens
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 0


def test_repeated_prompt_reports_cached_tokens(client: OpenAI) -> None:
    """Waits on the prefix cache: the second identical request reuses the prompt's KV."""
    messages = [{"role": "user", "content": "List ten animals that live in the ocean."}]
    for _ in range(2):
        response = client.chat.completions.create(
            model=openai.omit,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=2,
            temperature=0,
        )
    details = response.usage.prompt_tokens_details  # type: ignore[union-attr]
    assert details is not None and (details.cached_tokens or 0) > 0


def test_grammar_constrains_the_output(client: OpenAI) -> None:
    response = client.completions.create(
        model=openai.omit,
        prompt="Is the sky blue? Answer:",
        max_tokens=8,
        temperature=1.0,
        seed=3,
        extra_body={"grammar": 'root ::= " yes" | " no"'},
    )
    assert response.choices[0].text in (" yes", " no")


def test_invalid_grammar_is_400(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(
            model=openai.omit, prompt="x", max_tokens=2, extra_body={"grammar": "root ::= ("}
        )
    assert refused.value.param == "grammar"


def test_grammar_that_would_overflow_llama_cpp_is_refused(http: httpx.Client) -> None:
    """40,000 nested groups crash llama.cpp's GBNF parser (stack overflow); the API must
    refuse them before llama.cpp sees them, and keep serving."""
    deep = "root ::= " + "(" * 40_000 + '"a"' + ")" * 40_000
    response = http.post("/v1/completions", json={"prompt": "x", "grammar": deep})
    assert_envelope(response, 400, param="grammar")
    assert http.get("/readyz").status_code == 200


def test_models_retrieve(client: OpenAI) -> None:
    model_id = client.models.list().data[0].id
    assert client.models.retrieve(model_id).id == model_id
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    assert missing.value.code == "model_not_found"


def test_tokenize_detokenize_round_trip(client: OpenAI, http: httpx.Client) -> None:
    text = "Hello, wörld! 👋 The café is open."
    data = http.post("/tokenize", json={"prompt": text, "add_special": False}).json()
    assert data["count"] == len(data["tokens"]) and data["max_model_len"] == 4096
    assert http.post("/detokenize", json={"tokens": data["tokens"]}).json() == {"prompt": text}
    counted = http.post("/tokenize", json={"messages": STORY}).json()["count"]
    response = client.chat.completions.create(model=openai.omit, messages=STORY, max_tokens=1)
    assert response.usage is not None and response.usage.prompt_tokens == counted


HOSTILE = [
    ("/v1/chat/completions", {"messages": STORY, "n": 10_000}),
    ("/v1/chat/completions", {"messages": STORY, "n": "2"}),
    ("/v1/chat/completions", {"messages": STORY, "stop": ["x"] * 1000}),
    ("/v1/chat/completions", {"messages": STORY, "stop": "x" * 10_000}),
    ("/v1/chat/completions", {"messages": STORY, "logprobs": True, "top_logprobs": 50}),
    ("/v1/chat/completions", {"messages": STORY, "logprobs": "yes"}),
    ("/v1/chat/completions", {"messages": STORY, "max_tokens": 10**12}),
    ("/v1/chat/completions", {"messages": STORY, "priority": ["high"]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": 5}]}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}] * 10_000}),
    ("/v1/completions", {"prompt": "x", "logprobs": 10}),
    ("/v1/completions", {"prompt": ["x"] * 65}),
    ("/v1/completions", {"prompt": [[1, 2], [10**9]]}),
    ("/v1/completions", {"prompt": "x", "echo": "yes"}),
    ("/v1/completions", {"prompt": "x", "best_of": 5}),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"999999": 1}}),
    ("/tokenize", {"prompt": ["x"]}),
    ("/tokenize", {"messages": "x"}),
    ("/detokenize", {"tokens": [10**9]}),
    ("/detokenize", {"tokens": [[1]]}),
]


@pytest.mark.parametrize(("path", "body"), HOSTILE)
def test_hostile_input_is_4xx(http: httpx.Client, path: str, body: dict[str, object]) -> None:
    response = http.post(path, json=body)
    assert 400 <= response.status_code < 500, response.text
    assert_envelope(response, response.status_code)
