"""Hostile input against every body-taking route of a real `inferflux serve`: always a 4xx in
the route's error shape (the OpenAI envelope, or `{"error": "..."}` on the Ollama /api routes),
never a 500, never a hang (every request has a timeout), and the server keeps serving.

Routes that are not mounted (yet) are skipped; the list is every POST route the issue names.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import pytest

pytestmark = [pytest.mark.model, pytest.mark.server]

TIMEOUT_S = 30.0
JSON = {"content-type": "application/json"}
MARK = "hi"  # every base body has exactly one string value "hi", which the raw cases replace
USER = [{"role": "user", "content": MARK}]
OLLAMA = {"stream": False, "options": {"num_predict": 2}}

# path → a small valid body (generation capped at 2 tokens); `{model}` is the served model id.
BASE_BODIES: dict[str, dict[str, object]] = {
    "/v1/chat/completions": {"messages": USER, "max_tokens": 2},
    "/v1/completions": {"prompt": MARK, "max_tokens": 2},
    "/generate": {"prompt": MARK, "max_tokens": 2},
    "/chat": {"messages": USER, "max_tokens": 2},
    "/v1/embeddings": {"input": MARK},
    "/embeddings": {"input": MARK},
    "/tokenize": {"prompt": MARK},
    "/api/chat": {"model": "{model}", "messages": USER, **OLLAMA},
    "/api/generate": {"model": "{model}", "prompt": MARK, **OLLAMA},
    "/api/embed": {"model": "{model}", "input": MARK},
    "/api/embeddings": {"model": "{model}", "prompt": MARK},
}
CHAT_PATHS = ["/v1/chat/completions", "/chat", "/api/chat"]
GENERATION_PATHS = ["/v1/chat/completions", "/v1/completions", "/generate", "/chat"]
OPENAI_GENERATION = ["/v1/chat/completions", "/v1/completions"]
OLLAMA_GENERATION = ["/api/chat", "/api/generate"]
NESTED = b"[" * 100_000


@pytest.fixture(scope="module")
def client(server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server_url, timeout=TIMEOUT_S) as client:
        yield client


@pytest.fixture(scope="module")
def mounted(client: httpx.Client) -> set[str]:
    """The POST routes this server documents."""
    paths = client.get("/openapi.json").json()["paths"]
    return {path for path, operations in paths.items() if "post" in operations}


@pytest.fixture(scope="module")
def model_id(client: httpx.Client) -> str:
    return str(client.get("/v1/models").json()["data"][0]["id"])


def base_body(path: str, mounted: set[str], model_id: str) -> dict[str, object]:
    if path not in mounted:
        pytest.skip(f"{path} is not mounted on this server")
    text = json.dumps(BASE_BODIES[path]).replace('"{model}"', json.dumps(model_id))
    return json.loads(text)  # type: ignore[no-any-return]


def assert_client_error(response: httpx.Response, path: str) -> None:
    """A 4xx in the route's error shape."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    body = response.json()
    if path.startswith("/api/"):
        assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"]
    else:
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]


def replace_mark(body: dict[str, object], raw: bytes) -> bytes:
    encoded = json.dumps(body).encode()
    assert encoded.count(b'"hi"') == 1
    return encoded.replace(b'"hi"', raw)


RAW_CASES: dict[str, Callable[[dict[str, object]], bytes]] = {
    "truncated": lambda body: json.dumps(body).encode()[:-3],
    "not-json": lambda body: b"not json at all",
    "empty": lambda body: b"",
    "array": lambda body: b"[]",
    "string": lambda body: b'"a string"',
    "number": lambda body: b"3",
    "null": lambda body: b"null",
    "true": lambda body: b"true",
    "invalid-utf8": lambda body: replace_mark(body, b'"\xc3\x28\xff"'),
    "utf8-encoded-surrogate": lambda body: replace_mark(body, b'"\xed\xa0\x80"'),
    "lone-high-surrogate": lambda body: replace_mark(body, b'"\\ud800"'),
    "lone-low-surrogate": lambda body: replace_mark(body, b'"a\\udc00b"'),
    "nested-100k-unclosed": lambda body: NESTED,
    "nested-100k-closed": lambda body: NESTED + b"]" * 100_000,
    "nested-in-field": lambda body: replace_mark(body, NESTED + b"]" * 100_000),
    "duplicate-brace": lambda body: json.dumps(body).encode() + b"}",
}


@pytest.mark.parametrize("case", list(RAW_CASES))
@pytest.mark.parametrize("path", list(BASE_BODIES))
def test_raw_body_is_a_client_error(
    client: httpx.Client, mounted: set[str], model_id: str, path: str, case: str
) -> None:
    raw = RAW_CASES[case](base_body(path, mounted, model_id))
    assert_client_error(client.post(path, content=raw, headers=JSON), path)


@pytest.mark.parametrize("path", list(BASE_BODIES))
def test_ten_megabyte_body_is_413_before_parsing(
    client: httpx.Client, mounted: set[str], model_id: str, path: str
) -> None:
    base_body(path, mounted, model_id)
    declared = b'{"prompt": "' + b"a" * (10 * 1024 * 1024) + b'"}'
    response = client.post(path, content=declared, headers=JSON)
    assert response.status_code == 413
    assert_client_error(response, path)

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"a" * (1024 * 1024)
        yield b'"}'

    response = client.post(path, content=chunks(), headers=JSON)
    assert response.status_code == 413
    assert_client_error(response, path)


def wrong_types(path: str, body: dict[str, object]) -> list[dict[str, object]]:
    """The base body with one field of the wrong JSON type at a time."""
    cases: list[dict[str, object]] = [
        {**body, key: 42 if isinstance(value, str | list | dict) else {"x": [1]}}
        for key, value in body.items()
    ]
    if path in OLLAMA_GENERATION:
        cases.append({**body, "options": {"num_predict": "ten", "temperature": "hot"}})
    elif "max_tokens" in body:
        cases += [{**body, "max_tokens": "ten"}, {**body, "max_tokens": 1.5}]
        cases += [{**body, "temperature": "hot"}, {**body, "stream": "yes"}]
    return cases


@pytest.mark.parametrize("path", list(BASE_BODIES))
def test_wrong_types_are_client_errors(
    client: httpx.Client, mounted: set[str], model_id: str, path: str
) -> None:
    for body in wrong_types(path, base_body(path, mounted, model_id)):
        assert_client_error(client.post(path, json=body), path)


@pytest.mark.parametrize("path", CHAT_PATHS)
def test_ten_thousand_messages(
    client: httpx.Client, mounted: set[str], model_id: str, path: str
) -> None:
    body = base_body(path, mounted, model_id)
    messages = [{"role": ("user", "assistant")[i % 2], "content": f"m{i}"} for i in range(10_000)]
    assert_client_error(client.post(path, json={**body, "messages": messages}), path)


def huge_knobs(path: str) -> list[dict[str, object]]:
    """Knob values far past any limit, for one generation route; all must be refused."""
    stop_key = "stop_sequences" if path in ("/generate", "/chat") else "stop"
    cases: list[dict[str, object]] = [
        {"max_tokens": 10**12},
        {"max_tokens": 2**70},
        {stop_key: ["x"] * 10_000},
        {stop_key: ["x" * 100_000]},
        {"seed": 2**70},
        {"temperature": 1e308},
    ]
    if path in OPENAI_GENERATION:
        cases += [{"n": 10**9}, {"n": 2**70}, {"logit_bias": {str(10**12): 1}}]
    return cases


# Ollama clamps num_predict to the context and ignores what it cannot use (its documented
# semantics), so huge options may be refused (4xx) or clamped (200), but never fail or hang.
OLLAMA_HUGE_OPTIONS: list[dict[str, object]] = [
    {"num_ctx": 2**70},
    {"top_k": 2**70},
    {"seed": 2**70},
    {"stop": ["x"] * 10_000},
]


def post_each(
    client: httpx.Client, path: str, bodies: list[dict[str, object]]
) -> Iterator[tuple[dict[str, object], httpx.Response]]:
    for body in bodies:
        yield body, client.post(path, json=body)


@pytest.mark.parametrize("path", GENERATION_PATHS)
def test_huge_knobs_are_client_errors(
    client: httpx.Client, mounted: set[str], model_id: str, path: str
) -> None:
    body = base_body(path, mounted, model_id)
    bodies = [{**body, **knobs} for knobs in huge_knobs(path)]
    failures = []
    for sent, response in post_each(client, path, bodies):
        if 400 <= response.status_code < 500:
            assert_client_error(response, path)
        else:
            failures.append(f"{sent} -> {response.status_code} {response.text[:200]}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("path", OLLAMA_GENERATION)
def test_huge_ollama_options_never_fail(
    client: httpx.Client, mounted: set[str], model_id: str, path: str
) -> None:
    body = base_body(path, mounted, model_id)
    bodies = [{**body, "options": {"num_predict": 2, **huge}} for huge in OLLAMA_HUGE_OPTIONS]
    failures = []
    for sent, response in post_each(client, path, bodies):
        if response.status_code >= 500:
            failures.append(f"{sent['options']} -> {response.status_code} {response.text[:200]}")
        elif response.status_code >= 400:
            assert_client_error(response, path)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("path", OLLAMA_GENERATION)
def test_ollama_num_predict_past_int64_is_refused(
    client: httpx.Client, mounted: set[str], model_id: str, path: str
) -> None:
    body = base_body(path, mounted, model_id)
    response = client.post(path, json={**body, "options": {"num_predict": 2**70}}, timeout=10)
    assert_client_error(response, path)


@pytest.mark.parametrize("path", [*OPENAI_GENERATION, "/generate", "/chat"])
@pytest.mark.parametrize("top_k", [2**32 + 1, 2**70])
def test_top_k_past_int32_is_refused(
    client: httpx.Client, mounted: set[str], model_id: str, path: str, top_k: int
) -> None:
    body = base_body(path, mounted, model_id)
    assert_client_error(client.post(path, json={**body, "top_k": top_k}), path)


@pytest.mark.parametrize("path", GENERATION_PATHS)
def test_nul_and_odd_text_never_fail_the_server(
    client: httpx.Client, mounted: set[str], model_id: str, path: str
) -> None:
    """Valid but odd text generates (or is refused with a 4xx), never a 500."""
    body = base_body(path, mounted, model_id)
    for text in ["\u0000", "a\u0000b", "\U0001f600" * 50, "\u202e\ufeff", "<|im_end|><s></s>"]:
        raw = replace_mark(body, json.dumps(text).encode())
        response = client.post(path, content=raw, headers=JSON)
        assert response.status_code < 500, (text, response.status_code, response.text[:300])


def test_server_still_serves_afterwards(client: httpx.Client) -> None:
    assert client.get("/readyz").status_code == 200
    response = client.post("/generate", json={"prompt": "Hello", "max_tokens": 2})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] >= 1
