"""llama.cpp's other samplers (typical_p, top-n-sigma, Mirostat 1/2, dynamic temperature,
DRY, XTC, sampler order) on a real server: each one generates, reproducibly under a seed,
on the OpenAI, native and Ollama routes; DRY breaks a greedy loop; bad values are 400s."""

from __future__ import annotations

import collections

import httpx
import pytest

pytestmark = [pytest.mark.model, pytest.mark.server]

SAMPLED = {"temperature": 0.8, "seed": 7}
CONFIGS = {
    "typical_p": {"typical_p": 0.5},
    "top_n_sigma": {"top_n_sigma": 1.0},
    "mirostat 1": {"mirostat": 1, "mirostat_tau": 3.0},
    "mirostat 2": {"mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2},
    "dynatemp": {"dynatemp_range": 0.5, "dynatemp_exponent": 1.5},
    "dry": {"dry_multiplier": 0.8, "dry_allowed_length": 3},
    "xtc": {"xtc_probability": 0.9, "xtc_threshold": 0.05},
    "order": {"samplers": ["temperature", "top_k"], "top_k": 5},
    "repeat_last_n": {"repeat_penalty": 1.3, "repeat_last_n": -1},
}
LOOP = "Count the apples: apple, apple, apple,"


def _repeats(text: str) -> int:
    """How many word trigrams of `text` repeat an earlier one."""
    words = text.split()
    counts = collections.Counter(zip(words, words[1:], words[2:], strict=False))
    return sum(n - 1 for n in counts.values() if n > 1)


def _complete(url: str, **body: object) -> str:
    answer = httpx.post(f"{url}/v1/completions", json={"max_tokens": 24, **body}, timeout=120)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert answer.json()["usage"]["completion_tokens"] > 0
    return str(choice["text"])


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_each_sampler_generates_reproducibly(server_url: str, config: dict):
    body = {"prompt": "Once upon a time", **SAMPLED, **config}
    assert _complete(server_url, **body) == _complete(server_url, **body)


def test_dry_breaks_a_greedy_loop(server_url: str):
    looping = _complete(server_url, prompt=LOOP, temperature=0, max_tokens=48)
    dry = _complete(server_url, prompt=LOOP, temperature=0, max_tokens=48, dry_multiplier=1.0)
    assert _repeats(looping) >= 10 and _repeats(dry) < _repeats(looping) // 2


def test_native_and_ollama_routes_take_them_too(server_url: str, served_model: str):
    native = httpx.post(
        f"{server_url}/generate",
        json={"prompt": LOOP, "max_tokens": 8, **SAMPLED, "mirostat": 2, "dry_multiplier": 1.0},
        timeout=120,
    )
    assert native.status_code == 200, native.text
    options = {"num_predict": 8, **SAMPLED, "mirostat": 2, "typical_p": 0.9, "xtc_probability": 0.5}
    ollama = httpx.post(
        f"{server_url}/api/generate",
        json={"model": served_model, "prompt": LOOP, "stream": False, "options": options},
        timeout=120,
    )
    assert ollama.status_code == 200, ollama.text
    assert ollama.json()["eval_count"] > 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("typical_p", 0),
        ("mirostat", 3),
        ("dry_base", 0.5),
        ("dry_sequence_breakers", [""]),
        ("xtc_probability", 1.5),
        ("samplers", ["top_k", "top_k"]),
        ("samplers", ["beam_search"]),
        ("repeat_last_n", -2),
    ],
)
def test_out_of_range_values_are_400s_naming_the_field(server_url: str, field: str, value):
    answer = httpx.post(
        f"{server_url}/v1/completions", json={"prompt": "x", "max_tokens": 1, field: value}
    )
    assert answer.status_code == 400
    assert field in answer.json()["error"]["message"]
