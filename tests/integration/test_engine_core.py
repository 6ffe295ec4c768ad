"""EngineCore on the real llama.cpp backend: continuous batching, sampling, stops, aborts.

Each test drives `step()` directly (no transport). Outputs are compared only between
runs of the same batch shape, except the alone-vs-batched test, which measured
identical greedy output for SmolLM2 (see docs/engine.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inferflux.config.settings import ObservabilitySettings
from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaTokenizer
from inferflux.engine.core import EngineCore
from inferflux.engine.engine_build import WorkerConfig, build_engine_core
from inferflux.engine.messages import AddRequest, FinishReason, RequestDelta, SamplingParams

pytestmark = pytest.mark.model

QUESTIONS = [
    "What is the capital of France?",
    "Explain photosynthesis briefly.",
    "Write a short poem about cats.",
    "List three prime numbers.",
    "Who wrote Hamlet?",
    "Describe the color blue.",
    "What is 12 times 12?",
    "Give me a tip for sleeping well.",
    "Tell me about the moon.",
]


def make_core(
    path: str,
    *,
    n_ctx: int = 512,
    max_batch_tokens: int = 256,
    kv_unified: bool = False,
    max_num_seqs: int = 8,
    role: str = "unified",
) -> EngineCore:
    """A worker's engine over 8 sequences; with `max_num_seqs` < 8, the rest hold the
    prefix cache. `role`: "prefill" | "decode" for disaggregated mode's KV hand-off."""
    config = WorkerConfig(
        worker_id=0,
        generation=1,
        input_address="",
        output_address="",
        context=ContextConfig(path, n_ctx, 8, max_batch_tokens, 2, 2, kv_unified),
        max_num_seqs=max_num_seqs,
        max_batch_tokens=max_batch_tokens,
        observability=ObservabilitySettings(),
        role=role,
    )
    return build_engine_core(config)


@pytest.fixture(scope="module")
def tokenizer(smollm2_model_path: str) -> Iterator[LlamaTokenizer]:
    tok = LlamaTokenizer(smollm2_model_path)
    yield tok
    tok.close()


@pytest.fixture(scope="module")
def core(smollm2_model_path: str) -> Iterator[EngineCore]:
    engine = make_core(smollm2_model_path)
    yield engine
    engine.close()


def chat_prompt(tok: LlamaTokenizer, question: str) -> list[int]:
    text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return tok.tokenize(text, add_special=True, parse_special=True)


def run(core: EngineCore, requests: list[AddRequest]) -> dict[str, list[RequestDelta]]:
    """Submit all requests, step until idle, return every delta per request."""
    deltas: dict[str, list[RequestDelta]] = {r.request_id: [] for r in requests}
    for request in requests:
        for delta in core.add_request(request):
            deltas[delta.request_id].append(delta)
    while core.has_work():
        for delta in core.step():
            deltas[delta.request_id].append(delta)
    return deltas


def request(rid: str, prompt: list[int], **sampling: object) -> AddRequest:
    params = {"max_tokens": 24, "temperature": 0.0, **sampling}
    return AddRequest(request_id=rid, prompt_token_ids=prompt, sampling=SamplingParams(**params))  # type: ignore[arg-type]


def text_of(deltas: list[RequestDelta]) -> str:
    return "".join(d.text for d in deltas)


def tokens_of(deltas: list[RequestDelta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def test_greedy_is_deterministic_and_the_same_alone_or_among_eight(core, tokenizer) -> None:
    prompts = [chat_prompt(tokenizer, q) for q in QUESTIONS]
    alone_1 = run(core, [request("a", prompts[0], max_tokens=32, ignore_eos=True)])["a"]
    alone_2 = run(core, [request("a", prompts[0], max_tokens=32, ignore_eos=True)])["a"]
    batch = [request("a", prompts[0], max_tokens=32, ignore_eos=True)]
    batch += [
        request(f"o{i}", p, max_tokens=32, ignore_eos=True) for i, p in enumerate(prompts[1:])
    ]
    batched = run(core, batch)
    assert len(batch) == 9
    assert tokens_of(alone_1) == tokens_of(alone_2)
    assert len(tokens_of(alone_1)) == 32
    assert tokens_of(batched["a"]) == tokens_of(alone_1)
    assert all(len(tokens_of(d)) == 32 for d in batched.values())


def test_only_the_last_delta_finishes_and_counts_add_up(core, tokenizer) -> None:
    prompt = chat_prompt(tokenizer, QUESTIONS[4])
    deltas = run(core, [request("r", prompt, max_tokens=12, ignore_eos=True)])["r"]
    assert [d.finish_reason for d in deltas[:-1]] == [None] * (len(deltas) - 1)
    last = deltas[-1]
    assert last.finish_reason == FinishReason.LENGTH
    assert last.num_output_tokens == 12
    assert last.num_prompt_tokens == len(prompt)
    assert text_of(deltas) == tokenizer.detokenize(tokens_of(deltas))


def test_end_of_generation_token_finishes_with_stop(core, tokenizer) -> None:
    deltas = run(core, [request("r", chat_prompt(tokenizer, QUESTIONS[0]), max_tokens=64)])["r"]
    assert deltas[-1].finish_reason == FinishReason.STOP
    assert "Paris" in text_of(deltas)
    assert deltas[-1].num_output_tokens < 64


def test_stop_string_ends_generation_and_its_text_is_never_streamed(core, tokenizer) -> None:
    prompt = chat_prompt(tokenizer, QUESTIONS[0])
    full = text_of(run(core, [request("r", prompt, max_tokens=24)])["r"])
    stop = full.split()[2]  # a word from the middle of the greedy answer
    deltas = run(core, [request("s", prompt, max_tokens=24, stop=[stop])])["s"]
    assert deltas[-1].finish_reason == FinishReason.STOP_SEQUENCE
    assert stop not in text_of(deltas)
    assert full.startswith(text_of(deltas))
    assert text_of(deltas) == full[: full.index(stop)]


def test_same_seed_samples_the_same_text_and_another_seed_differs(core, tokenizer) -> None:
    prompt = chat_prompt(tokenizer, QUESTIONS[2])

    def sample(seed: int) -> list[int]:
        r = request("r", prompt, max_tokens=24, temperature=1.0, seed=seed, ignore_eos=True)
        return tokens_of(run(core, [r])["r"])

    first, again = sample(1234), sample(1234)
    assert first == again
    others = {tuple(sample(seed)) for seed in (1, 2, 3)}
    assert any(o != tuple(first) for o in others)


def test_logit_bias_bans_and_forces_tokens(core, tokenizer) -> None:
    prompt = chat_prompt(tokenizer, QUESTIONS[0])
    greedy = tokens_of(run(core, [request("r", prompt, max_tokens=1)])["r"])[0]
    banned = tokens_of(
        run(core, [request("r", prompt, max_tokens=1, logit_bias={greedy: -100.0})])["r"]
    )
    assert banned[0] != greedy
    forced_token = tokenizer.tokenize(" banana", add_special=False, parse_special=False)[0]
    forced = run(core, [request("r", prompt, max_tokens=3, logit_bias={forced_token: 100.0})])["r"]
    assert tokens_of(forced) == [forced_token] * 3


def test_abort_frees_the_sequence_at_the_next_step(core, tokenizer) -> None:
    prompts = [chat_prompt(tokenizer, q) for q in QUESTIONS[:3]]
    for i, p in enumerate(prompts):
        assert core.add_request(request(f"x{i}", p, max_tokens=200, ignore_eos=True)) == []
    for _ in range(3):
        core.step()
    assert core.stats().num_running == 3
    deltas = core.abort_requests(["x1", "unknown-id"])
    assert [(d.request_id, d.finish_reason) for d in deltas] == [("x1", FinishReason.ABORT)]
    assert core.stats().num_running == 2
    stepped = core.step()
    assert {d.request_id for d in stepped} == {"x0", "x2"}
    core.abort_requests(["x0", "x2"])
    assert not core.has_work()
    assert core.stats().kv_cells_used == 0


def test_chunked_prefill_of_a_prompt_longer_than_the_step_budget(core, tokenizer) -> None:
    long_question = "Summarize this: " + " ".join(QUESTIONS * 8)
    prompt = chat_prompt(tokenizer, long_question)
    assert len(prompt) > 256  # the step budget of the fixture
    steps_before = core.stats().num_steps
    deltas = run(core, [request("long", prompt, max_tokens=4, ignore_eos=True)])["long"]
    assert deltas[-1].num_prompt_tokens == len(prompt)
    assert deltas[-1].num_output_tokens == 4
    assert core.stats().num_steps - steps_before == -(-len(prompt) // 256) + 3


def test_requests_that_can_never_run_get_an_error_delta(core, tokenizer) -> None:
    deltas = core.add_request(request("empty", []))
    assert deltas[0].finish_reason == FinishReason.ERROR
    assert "empty" in (deltas[0].error or "")
    assert not core.has_work()


def test_streamed_text_is_valid_utf8_for_multibyte_output(core, tokenizer) -> None:
    prompt = chat_prompt(tokenizer, "Repeat exactly: 日本語のテキスト 😀 café €")
    deltas = run(core, [request("u", prompt, max_tokens=40)])["u"]
    text = text_of(deltas)
    assert "\ufffd" not in text
    assert text == tokenizer.detokenize(tokens_of(deltas))


def test_gemma_base_model_generates_and_reads_its_own_end_tokens(gemma3_model_path) -> None:
    tok = LlamaTokenizer(gemma3_model_path)
    engine = make_core(gemma3_model_path, n_ctx=256, max_batch_tokens=128)
    try:
        assert tok.chat_template is None
        assert {1, 106} <= engine.backend.eog_token_ids  # <eos>, <end_of_turn>
        prompt = tok.tokenize("The capital of France is", add_special=True, parse_special=True)
        deltas = run(engine, [request("g", prompt, max_tokens=8)])["g"]
        assert deltas[-1].num_output_tokens >= 1
        assert text_of(deltas).strip()
    finally:
        engine.close()
        tok.close()


def test_top_k_1_and_min_p_1_reduce_sampling_to_greedy(core, tokenizer) -> None:
    prompt = chat_prompt(tokenizer, QUESTIONS[5])
    greedy = tokens_of(run(core, [request("g", prompt, max_tokens=16, ignore_eos=True)])["g"])
    for knob in ({"top_k": 1}, {"min_p": 1.0}):
        sampled = request(
            "s", prompt, max_tokens=16, ignore_eos=True, temperature=1.5, seed=7, **knob
        )
        assert tokens_of(run(core, [sampled])["s"]) == greedy, knob


def test_frequency_penalty_reduces_repetition(core, tokenizer) -> None:
    prompt = tokenizer.tokenize(
        "the the the the the the the the", add_special=True, parse_special=False
    )

    def distinct(**penalties: float) -> int:
        r = request("p", prompt, max_tokens=32, ignore_eos=True, **penalties)
        return len(set(tokens_of(run(core, [r])["p"])))

    plain = distinct()
    assert distinct(frequency_penalty=2.0) > plain
    assert distinct(presence_penalty=2.0) > plain
    assert distinct(repeat_penalty=1.8) > plain


def test_a_failure_inside_one_request_finishes_only_that_request(
    core, tokenizer, monkeypatch
) -> None:
    """Fault injection into the real backend: other requests of the batch go on."""
    prompts = [chat_prompt(tokenizer, q) for q in QUESTIONS[:3]]
    real_make_sampler = core.backend.make_sampler
    calls = iter([real_make_sampler, _raise, real_make_sampler])

    def second_call_fails(spec):
        return next(calls)(spec)

    monkeypatch.setattr(core.backend, "make_sampler", second_call_fails)
    results = run(
        core, [request(f"f{i}", p, max_tokens=6, ignore_eos=True) for i, p in enumerate(prompts)]
    )
    monkeypatch.undo()
    assert results["f1"][-1].finish_reason == FinishReason.ERROR
    assert results["f0"][-1].num_output_tokens == 6 and results["f2"][-1].num_output_tokens == 6

    real_sample = core.backend.sample
    victim = {"row": None}

    def flaky_sample(sampler, row):
        if victim["row"] is None:
            victim["row"] = row
        if row == victim["row"]:
            raise RuntimeError("injected sampling fault")
        return real_sample(sampler, row)

    monkeypatch.setattr(core.backend, "sample", flaky_sample)
    results = run(
        core, [request(f"s{i}", p, max_tokens=6, ignore_eos=True) for i, p in enumerate(prompts)]
    )
    monkeypatch.undo()
    finishes = sorted(str(d[-1].finish_reason) for d in results.values())
    assert finishes.count("error") >= 1 and finishes.count("length") >= 1
    assert not core.has_work() and core.stats().kv_cells_used == 0


def _raise(spec):
    raise TypeError("injected sampler fault")


def test_unified_kv_generates_and_admits_by_reserved_cells(smollm2_model_path, tokenizer) -> None:
    """runtime.kv_unified: 8 x 256 = 2048 shared cells; admission reserves prompt + max_tokens."""
    engine = make_core(smollm2_model_path, n_ctx=256, kv_unified=True)
    split = make_core(smollm2_model_path, n_ctx=256)
    try:
        assert engine.scheduler.kv_capacity == engine.backend.n_ctx_total >= 2048
        prompt = chat_prompt(tokenizer, QUESTIONS[0])
        alone = run(engine, [request("u", prompt, max_tokens=16, ignore_eos=True)])["u"]
        assert tokens_of(alone) == tokens_of(
            run(split, [request("u", prompt, max_tokens=16, ignore_eos=True)])["u"]
        )
        too_big = engine.add_request(
            request("big", prompt, max_tokens=engine.scheduler.kv_capacity)
        )
        assert too_big[0].finish_reason == FinishReason.ERROR and "KV cache" in (
            too_big[0].error or ""
        )
        # each reserves len(prompt) + 600 cells: three fit in 2048, the rest wait for cells
        per_request = len(prompt) + 600
        fits = engine.scheduler.kv_capacity // per_request
        for i in range(fits + 2):
            assert (
                engine.add_request(request(f"r{i}", prompt, max_tokens=600, ignore_eos=True)) == []
            )
        engine.step()
        assert engine.stats().num_running == fits and engine.stats().num_waiting == 2
        engine.abort_requests([f"r{i}" for i in range(fits + 2)])
        assert not engine.has_work() and engine.stats().kv_cells_used == 0
    finally:
        engine.close()
        split.close()
