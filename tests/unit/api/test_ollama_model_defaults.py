"""A model's own system prompt and default options on the Ollama routes (`ollama create`),
and the names and parameters /api/create accepts: pure logic."""

from __future__ import annotations

import pytest

from inferflux.api.ollama.chat import with_system
from inferflux.api.ollama.generate import generate_prompt
from inferflux.api.ollama.manage import _parameters, model_id_of
from inferflux.api.ollama.protocol import (
    OllamaGenerateRequest,
    OllamaOptions,
    sampling_params,
    with_model_defaults,
)
from inferflux.config.manifest import ModelParameters
from inferflux.errors import InvalidRequest

DEFAULTS = ModelParameters(temperature=0.2, num_predict=7, stop=("###",), top_k=5)


def test_request_options_win_over_the_model_defaults() -> None:
    merged = with_model_defaults(OllamaOptions(temperature=0.9, top_p=0.5), DEFAULTS)
    assert merged is not None
    sampling = sampling_params(merged, max_tokens=7, n_ctx=512)
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.9, 0.5, 5)
    assert sampling.stop == ["###"] and merged.num_predict == 7
    alone = with_model_defaults(None, DEFAULTS)
    assert alone is not None and alone.temperature == 0.2
    options = OllamaOptions(temperature=0.3)
    assert with_model_defaults(options, None) is options


def test_the_model_system_prompt_fills_in_only_when_the_request_has_none() -> None:
    user = [{"role": "user", "content": "hi"}]
    assert with_system(user, "Be brief.") == [{"role": "system", "content": "Be brief."}, *user]
    own = [{"role": "system", "content": "Mine."}, *user]
    assert with_system(own, "Be brief.") == own
    assert with_system([], "Be brief.") == []  # nothing to generate: a load request
    assert with_system(user, None) == user


def test_generate_uses_the_request_system_else_the_model_one() -> None:
    body = OllamaGenerateRequest(model="m", prompt="hi")
    messages = generate_prompt(body, "Be brief.").messages  # type: ignore[union-attr]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    own = OllamaGenerateRequest(model="m", prompt="hi", system="Mine.")
    assert generate_prompt(own, "Be brief.").messages[0]["content"] == "Mine."  # type: ignore[union-attr]
    raw = OllamaGenerateRequest(model="m", prompt="hi", raw=True)
    assert not hasattr(generate_prompt(raw, "Be brief."), "messages")


def test_model_names_take_latest_only() -> None:
    assert model_id_of("pirate", "model") == "pirate"
    assert model_id_of("pirate:latest", "model") == "pirate"
    for bad, words in [("pirate:v2", "no tags"), ("", "required"), ("a b", "must match")]:
        with pytest.raises(InvalidRequest, match=words):
            model_id_of(bad, "model")


def test_create_parameters_map_to_entry_fields() -> None:
    fields = _parameters({"num_ctx": 1024, "stop": "###", "temperature": 0}, {"top_k": 5})
    assert fields == {
        "n_ctx": 1024,
        "parameters": {"top_k": 5, "temperature": 0.0, "stop": ["###"]},
    }
    with pytest.raises(InvalidRequest, match="'mirostat' is not supported") as unknown:
        _parameters({"mirostat": 1}, None)
    assert unknown.value.param == "parameters.mirostat"
    with pytest.raises(InvalidRequest) as bad:
        _parameters({"top_p": 7}, None)
    assert bad.value.param == "parameters.top_p"
