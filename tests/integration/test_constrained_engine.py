"""Constrained decoding (llguidance) on the real engine, both test models.

EngineCore with the llama.cpp backend, driven step by step: JSON schemas, GBNF and regex
grammars are enforced token by token, a grammar that completes ends the request without
waiting for an end-of-generation token, constrained and free sequences share one
`llama_decode`, and a constraint that reaches the engine without the API's checks is
refused without being queued.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import jsonschema
import pytest

from inferflux.engine.backends.llama_cpp import LlamaTokenizer
from inferflux.engine.core import sampler_spec
from inferflux.engine.grammar import ConstraintCompiler
from inferflux.engine.messages import AddRequest, FinishReason, RequestDelta, SamplingParams
from tests.integration.test_scheduling_engine import drain, make_core, tokens

pytestmark = pytest.mark.model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "enum": ["Paris", "Lima", "Oslo"]},
        "pets": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "pets"],
    "additionalProperties": False,
}


class Model:
    """One model's engine, tokenizer and grammar compiler, and its prompt format."""

    def __init__(self, path: str, gemma: bool) -> None:
        self.tokenizer = LlamaTokenizer(path)
        self.core = make_core(path, max_num_seqs=4, cache_slots=0)
        self.compiler = ConstraintCompiler(self.tokenizer.constraint_error)
        self.gemma = gemma

    def chat(self, user: str) -> list[int]:
        if self.gemma:
            text = f"<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"
        else:
            text = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        return self.tokenizer.tokenize(text, add_special=True, parse_special=True)

    def submit(self, rid: str, user: str, *, max_tokens: int = 96, **sampling: object) -> None:
        sampling.setdefault("temperature", 0.0)
        params = SamplingParams(max_tokens=max_tokens, **sampling)  # type: ignore[arg-type]
        request = AddRequest(request_id=rid, prompt_token_ids=self.chat(user), sampling=params)
        assert self.core.add_request(request) == []

    def close(self) -> None:
        self.core.close()
        self.tokenizer.close()


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request: pytest.FixtureRequest) -> Iterator[Model]:
    name = request.param
    loaded = Model(request.getfixturevalue(f"{name}_model_path"), gemma=name == "gemma3")
    yield loaded
    loaded.close()


def text_of(deltas: list[RequestDelta]) -> str:
    return "".join(d.text for d in deltas)


def test_a_json_schema_is_enforced_and_the_request_ends_when_the_json_does(model: Model) -> None:
    grammar = model.compiler.json_schema(PERSON, param="schema")
    model.submit("person", "Describe a person who lives in Oslo, as JSON.", constraint=grammar)
    deltas = drain(model.core)["person"]
    value = json.loads(text_of(deltas))
    jsonschema.validate(value, PERSON)
    assert deltas[-1].finish_reason is FinishReason.STOP
    last_token = deltas[-1].token_ids[-1]
    # finished by the grammar, not by an end-of-generation token
    assert last_token not in model.core.backend.eog_token_ids
    assert model.core.backend.piece(last_token).endswith(b"}")


def test_any_json_object_and_a_cut_object_ends_with_length(model: Model) -> None:
    grammar = model.compiler.json_object(param="response_format")
    ask = "Give a JSON object describing a cat with its name and color."
    model.submit("obj", ask, constraint=grammar)
    model.submit("cut", "Give me a JSON object about the moon.", constraint=grammar, max_tokens=3)
    deltas = drain(model.core)
    assert deltas["obj"][-1].finish_reason is FinishReason.STOP
    assert isinstance(json.loads(text_of(deltas["obj"])), dict)
    assert deltas["cut"][-1].finish_reason is FinishReason.LENGTH
    assert deltas["cut"][-1].num_output_tokens == 3
    with pytest.raises(ValueError):
        json.loads(text_of(deltas["cut"]))


def test_a_grammar_the_model_would_not_follow_forces_the_mask(model: Model) -> None:
    """The prompt asks for words; the grammar allows only a 5-digit code: the sampled
    token is rejected and the masked logits decide (the mask path, not verify-first)."""
    grammar = model.compiler.regex(r"[0-9]{5}", param="grammar")
    model.submit("code", "Write a poem about the sea.", constraint=grammar)
    deltas = drain(model.core)["code"]
    assert re.fullmatch(r"[0-9]{5}", text_of(deltas))
    assert deltas[-1].finish_reason is FinishReason.STOP


def test_gbnf_with_penalties_and_sampling_masks_first(model: Model) -> None:
    grammar = model.compiler.gbnf('root ::= ("yes" | "no") "."', param="grammar")
    for seed in range(3):
        model.submit(
            f"yn{seed}",
            "Is the sky green?",
            constraint=grammar,
            temperature=1.5,
            seed=seed,
            repeat_penalty=1.3,
            frequency_penalty=0.5,
        )
    deltas = drain(model.core)
    assert {text_of(deltas[f"yn{seed}"]) for seed in range(3)} <= {"yes.", "no."}
    # penalties would record a rejected token in their history: those sequences mask first
    plain = SamplingParams(max_tokens=4, constraint=grammar)
    penalised = SamplingParams(max_tokens=4, constraint=grammar, repeat_penalty=1.3)
    samplers = [model.core.backend.make_sampler(sampler_spec(p)) for p in (plain, penalised)]
    assert [s.verify_first for s in samplers] == [True, False]  # type: ignore[attr-defined]
    for sampler in samplers:
        sampler.close()


def test_constrained_and_free_sequences_share_each_step(model: Model) -> None:
    grammar = model.compiler.json_schema(PERSON, param="schema")
    model.submit("json", "Describe a person from Lima as JSON.", constraint=grammar)
    model.submit("free", "Describe a person from Lima.", max_tokens=12)
    steps_before = model.core.stats().num_steps
    seen: dict[str, list[int]] = {"json": [], "free": []}
    while model.core.has_work():
        step = model.core.stats().num_steps
        for delta in model.core.step():
            seen[delta.request_id].append(step)
    shared = set(seen["json"]) & set(seen["free"])
    assert len(shared) >= 8  # both sampled from the same llama_decode, step after step
    assert model.core.stats().num_steps - steps_before <= len(seen["json"]) + 2


def test_an_unchecked_invalid_constraint_is_refused_without_queuing(model: Model) -> None:
    assert model.core.backend.constraints_ready(wait_s=60)  # else the request waits aside
    for rid, constraint in [("bad", "start: ("), ("empty", "")]:
        params = SamplingParams(max_tokens=4, constraint=constraint)
        (delta,) = model.core.add_request(
            AddRequest(request_id=rid, prompt_token_ids=model.chat("hi"), sampling=params)
        )
        assert delta.finish_reason is FinishReason.ERROR and "constraint" in (delta.error or "")
    assert not model.core.has_work()


def test_the_first_constraint_waits_aside_without_stalling_free_sequences(
    smollm2_model_path: str,
) -> None:
    """A fresh worker indexes the vocabulary for grammars only at its first constraint
    (memory); meanwhile that request waits and the others keep decoding."""
    model = Model(smollm2_model_path, gemma=False)
    try:
        model.submit("free", "Count from one to twenty.", max_tokens=24, ignore_eos=True)
        first = model.core.step()  # the free request is prefilled and running
        grammar = model.compiler.json_schema(PERSON, param="schema")
        model.submit("json", "A person as JSON.", constraint=grammar)
        model.submit("gone", "Another person as JSON.", constraint=grammar)
        assert model.core.stats().num_waiting == 2
        assert set(model.core.request_ids()) == {"free", "json", "gone"}
        (aborted,) = model.core.abort_requests(["gone"])
        assert aborted.finish_reason is FinishReason.ABORT
        seen = drain(model.core)
        assert "gone" not in seen
        assert len(tokens(first + seen["free"])) == 24
        person = json.loads(text_of(seen["json"]))
        jsonschema.validate(person, PERSON)
    finally:
        model.close()
