"""Prefix cache, priorities, queue timeouts and logprobs on the real engine (grammars:
test_constrained_engine.py).

EngineCore with the llama.cpp backend and SmolLM2, driven step by step (no transport).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator

import pytest

from inferflux.config.settings import ObservabilitySettings, SchedulerSettings
from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaTokenizer
from inferflux.engine.core import EngineCore
from inferflux.engine.engine_build import WorkerConfig, build_engine_core
from inferflux.engine.messages import (
    AddRequest,
    FinishReason,
    Priority,
    RequestDelta,
    SamplingParams,
    TokenLogprob,
)
from inferflux.scheduler import RequestId
from inferflux.scheduler import scheduler as scheduler_module
from inferflux.scheduler.request import KvOp

pytestmark = pytest.mark.model

SYSTEM = (
    "<|im_start|>system\nYou are a careful assistant. You answer questions about geography, "
    "history and science with short, precise sentences, and you never invent facts. When a "
    "question is ambiguous, you say which reading you answer.<|im_end|>\n"
)


def chat(user: str, history: str = "") -> str:
    return f"{SYSTEM}{history}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def make_core(
    path: str,
    *,
    max_num_seqs: int = 4,
    cache_slots: int = 4,
    reuse_in_place: bool = True,
    index_only: bool = False,
    **scheduling: object,
) -> EngineCore:
    """`index_only`: no cache slots, the index over parked slots and the host tier
    alone (what the defaults resolve to: worker_config)."""
    sched = SchedulerSettings(max_num_seqs=max_num_seqs, max_batch_tokens=256, **scheduling)  # type: ignore[arg-type]
    sched.prefix_cache.slots = 0 if index_only else max(cache_slots, 1)
    sched.prefix_cache.enabled = index_only or cache_slots > 0
    sched.prefix_cache.reuse_in_place = reuse_in_place
    if index_only:
        cache_slots = 0
    config = WorkerConfig(
        worker_id=0,
        generation=1,
        input_address="",
        output_address="",
        context=ContextConfig(path, 512, max_num_seqs + cache_slots, 256, 2, 2, False),
        max_num_seqs=max_num_seqs,
        max_batch_tokens=256,
        observability=ObservabilitySettings(),
        scheduling=sched,
        cache_slots=0 if index_only else None,
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


def submit(
    core: EngineCore,
    tokenizer: LlamaTokenizer,
    rid: str,
    text: str,
    *,
    max_tokens: int = 8,
    priority: Priority = Priority.NORMAL,
    namespace: str = "",
    **sampling: object,
) -> list[int]:
    ids = tokenizer.tokenize(text, add_special=True, parse_special=True)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, **sampling)  # type: ignore[arg-type]
    errors = core.add_request(
        AddRequest(
            request_id=rid,
            prompt_token_ids=ids,
            sampling=params,
            priority=priority,
            cache_namespace=namespace,
        )
    )
    assert errors == [], errors
    return ids


def drain(core: EngineCore) -> dict[str, list[RequestDelta]]:
    by_id: dict[str, list[RequestDelta]] = {}
    for _ in range(2000):
        if not core.has_work():
            return by_id
        for delta in core.step():
            by_id.setdefault(delta.request_id, []).append(delta)
    raise AssertionError("the engine did not finish")


def start_streams(core: EngineCore, tokenizer: LlamaTokenizer, n: int, max_tokens: int) -> None:
    """`n` greedy streams that ignore EOS, stepped until all of them decode."""
    for i in range(n):
        submit(core, tokenizer, f"s{i}", chat(f"Count to {20 + i}."), max_tokens=max_tokens,
               ignore_eos=True)  # fmt: skip
    for _ in range(n + 1):
        core.step()


def tokens(deltas: list[RequestDelta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def test_a_shared_system_prompt_is_reused_and_fewer_prompt_tokens_are_computed(
    core: EngineCore, tokenizer: LlamaTokenizer
) -> None:
    prompt_a = submit(core, tokenizer, "pa", chat("What is the capital of France?"))
    before = core.stats()
    first = drain(core)["pa"]
    computed_a = core.stats().num_prompt_tokens_total - before.num_prompt_tokens_total
    prompt_b = submit(core, tokenizer, "pb", chat("Name a large river in Africa."))
    before = core.stats()
    second = drain(core)["pb"]
    computed_b = core.stats().num_prompt_tokens_total - before.num_prompt_tokens_total
    cached = second[-1].num_cached_tokens
    shared = next(i for i, (x, y) in enumerate(zip(prompt_a, prompt_b, strict=False)) if x != y)
    assert first[-1].num_cached_tokens == 0
    assert computed_a == len(prompt_a)
    assert cached == shared  # every shared token, nothing more
    assert computed_b == len(prompt_b) - cached
    stats = core.stats().prefix_cache
    assert stats is not None and stats.hits >= 1 and stats.matched_tokens >= shared


def test_the_next_turn_reuses_the_prompt_and_the_generated_answer(
    core: EngineCore, tokenizer: LlamaTokenizer
) -> None:
    prompt = submit(core, tokenizer, "t1", chat("Who wrote Hamlet?"), max_tokens=12)
    turn1 = drain(core)["t1"]
    answer = "".join(d.text for d in turn1)
    history = f"<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n<|im_start|>assistant\n{answer}"
    submit(core, tokenizer, "t2", chat("When?", history + "<|im_end|>\n"))
    turn2 = drain(core)["t2"]
    # the prompt and most of the generated answer (re-tokenized text may split differently)
    assert turn2[-1].num_cached_tokens >= len(prompt) + len(tokens(turn1)) // 2


def test_a_cache_hit_predicts_what_a_full_prefill_predicts(
    smollm2_model_path: str, tokenizer: LlamaTokenizer
) -> None:
    """Same first-token distribution with the cache on (suffix prefill) and off."""
    results = []
    for slots in (4, 0):
        engine = make_core(smollm2_model_path, cache_slots=slots)
        try:
            submit(engine, tokenizer, "warm", chat("Tell me about the moon."), max_tokens=1)
            drain(engine)
            submit(engine, tokenizer, "q", chat("Tell me about Mars."), max_tokens=1, logprobs=5)
            (delta,) = drain(engine)["q"]
            results.append(delta)
        finally:
            engine.close()
    cached, full = results
    assert cached.num_cached_tokens > 0 and full.num_cached_tokens == 0
    assert cached.logprobs is not None and full.logprobs is not None
    assert cached.token_ids == full.token_ids
    top_cached = dict(cached.logprobs[0].top)
    top_full = dict(full.logprobs[0].top)
    assert list(top_cached)[:3] == list(top_full)[:3]
    for token, logprob in top_full.items():
        if token in top_cached:
            assert abs(top_cached[token] - logprob) < 0.05


@pytest.mark.parametrize("reuse_in_place", [False, True], ids=["copy", "in-place"])
def test_a_refused_cache_copy_computes_the_prompt_instead(
    smollm2_model_path: str,
    tokenizer: LlamaTokenizer,
    monkeypatch: pytest.MonkeyPatch,
    reuse_in_place: bool,
) -> None:
    """llama.cpp may refuse a copy, or a cut of a parked prefix (a window-sized SWA cache
    drops old positions): the hit becomes a full prefill, not an error, and the output is
    what a cold run gives."""
    engine = make_core(smollm2_model_path, reuse_in_place=reuse_in_place)
    try:
        submit(engine, tokenizer, "warm", chat("Tell me about the moon."), max_tokens=1)
        drain(engine)
        if reuse_in_place:
            monkeypatch.setattr(engine.backend, "keep_seq", lambda seq, n: False)
        else:
            monkeypatch.setattr(engine.backend, "copy_seq", lambda src, dst, n: False)
        before = engine.stats()
        prompt = submit(engine, tokenizer, "q", chat("Tell me about Mars."), max_tokens=8)
        refused = drain(engine)["q"]
        computed = engine.stats().num_prompt_tokens_total - before.num_prompt_tokens_total
        monkeypatch.undo()
        assert refused[-1].finish_reason == FinishReason.LENGTH
        assert refused[-1].num_cached_tokens == 0 and computed == len(prompt)
        assert not engine.has_work() and engine.stats().kv_cells_used == 0
    finally:
        engine.close()
    cold_engine = make_core(smollm2_model_path, cache_slots=0)  # nothing cached anywhere
    try:
        submit(cold_engine, tokenizer, "cold", chat("Tell me about Mars."), max_tokens=8)
        cold = drain(cold_engine)["cold"]
    finally:
        cold_engine.close()
    assert cold[-1].num_cached_tokens == 0
    assert tokens(refused) == tokens(cold)


def _conversation(
    engine: EngineCore, tokenizer: LlamaTokenizer, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, list[int]], list[int]]:
    """Turn 1, turn 2 of the same conversation, then a prompt sharing only the system
    prompt; returns their tokens and the number of KV copies made before each of turn 2
    and the prompt, and at the end."""
    copies: list[tuple[int, int, int]] = []
    real_copy = engine.backend.copy_seq

    def spy(src: int, dst: int, n: int) -> bool:
        copies.append((src, dst, n))
        return real_copy(src, dst, n)

    monkeypatch.setattr(engine.backend, "copy_seq", spy)
    counts = []
    submit(engine, tokenizer, "t1", chat("Who wrote Hamlet?"), max_tokens=12)
    turn1 = drain(engine)["t1"]
    answer = "".join(d.text for d in turn1)
    history = "<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n<|im_start|>assistant\n"
    counts.append(len(copies))
    submit(engine, tokenizer, "t2", chat("When?", history + answer + "<|im_end|>\n"))
    turn2 = drain(engine)["t2"]
    counts.append(len(copies))
    submit(engine, tokenizer, "t3", chat("Name a planet."), max_tokens=12)
    other = drain(engine)["t3"]
    counts.append(len(copies))
    monkeypatch.undo()
    assert turn2[-1].num_cached_tokens > 0 and other[-1].num_cached_tokens > 0
    return {"t1": tokens(turn1), "t2": tokens(turn2), "t3": tokens(other)}, counts


def test_a_parked_conversation_continues_in_place_as_a_copied_one_would(
    smollm2_model_path: str, tokenizer: LlamaTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Turn 2 of a conversation, and a prompt that shares only the system prompt, reuse
    the parked KV of the request before instead of copying whole KV streams, and
    generate exactly what the copying prefix cache generates; also with no cache slots
    at all (the defaults: parked slots and the host tier only)."""
    results = {}
    for mode in ("index only", "in place", "copies"):
        in_place = mode != "copies"
        engine = make_core(
            smollm2_model_path, reuse_in_place=in_place, index_only=mode == "index only"
        )
        try:
            results[mode] = _conversation(engine, tokenizer, monkeypatch)
            stats, tiers = engine.stats().prefix_cache, engine.stats().kv_tiers
            assert stats is not None and stats.parked == (1 if in_place else 0)
            assert (stats.parked_tokens > 0) == in_place
            assert tiers is not None and tiers.spills == (1 if in_place else 0)
            assert engine.backend.config.n_seq_max == (4 if mode == "index only" else 8)
        finally:
            engine.close()
    (parked, parked_copies), (copied, copied_copies) = results["in place"], results["copies"]
    assert parked == copied == results["index only"][0]
    assert results["index only"][1] == [0, 0, 0]
    # parked: turn 2 continues turn 1 in place; the other prompt first saves the
    # conversation into the host tier (not a copy) and continues the system prompt
    assert parked_copies == [0, 0, 0]
    # copying: each request copies its KV into the cache when it ends, and each hit
    # copies a cached prefix out
    assert copied_copies == [1, 3, 5]


def test_a_parked_slot_that_lost_its_kv_is_recomputed_not_trusted(
    smollm2_model_path: str, tokenizer: LlamaTokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    """A parked slot whose KV is gone (cleared behind the scheduler's back, as a failed
    save's trim does) is not continued: the request computes its prompt and answers as
    a cold engine does."""
    engine = make_core(smollm2_model_path)
    try:
        submit(engine, tokenizer, "warm", chat("Tell me about the moon."), max_tokens=1)
        drain(engine)
        assert engine.scheduler.parked is not None
        (entry,) = engine.scheduler.parked.entries()
        engine.backend.free_seq(entry.slot)
        with caplog.at_level(logging.WARNING):
            submit(engine, tokenizer, "q", chat("Tell me about Mars."), max_tokens=8)
            lost = drain(engine)["q"]
        assert "reusing the parked prefix of q failed" in caplog.text
        assert lost[-1].num_cached_tokens == 0
    finally:
        engine.close()
    cold_engine = make_core(smollm2_model_path, cache_slots=0)
    try:
        submit(cold_engine, tokenizer, "q", chat("Tell me about Mars."), max_tokens=8)
        assert tokens(lost) == tokens(drain(cold_engine)["q"])
    finally:
        cold_engine.close()


def test_namespaces_isolate_cached_prefixes(core: EngineCore, tokenizer: LlamaTokenizer) -> None:
    text = chat("What is the tallest mountain on Earth?")
    submit(core, tokenizer, "n1", text, namespace="tenant-a")
    drain(core)
    submit(core, tokenizer, "n2", text, namespace="tenant-b")
    assert drain(core)["n2"][-1].num_cached_tokens == 0
    submit(core, tokenizer, "n3", text, namespace="tenant-a")
    assert drain(core)["n3"][-1].num_cached_tokens > 0


def test_a_preempted_request_resumes_without_losing_or_repeating_tokens(
    smollm2_model_path: str, tokenizer: LlamaTokenizer
) -> None:
    engine = make_core(smollm2_model_path, max_num_seqs=1, cache_slots=2)
    try:
        text = chat("Count from one to fifty in words.")
        submit(engine, tokenizer, "ref", text, max_tokens=40, ignore_eos=True)
        reference = tokens(drain(engine)["ref"])
        engine.scheduler.prefix_cache.clear()  # type: ignore[union-attr]
        for slot in (1, 2, *engine.scheduler.drop_parked()):  # "low" starts cold
            engine.backend.free_seq(slot)
        submit(
            engine, tokenizer, "low", text, max_tokens=40, ignore_eos=True, priority=Priority.LOW
        )
        deltas: dict[str, list[RequestDelta]] = {"low": []}
        for _ in range(20):  # 16+ tokens: now it may be preempted
            for delta in engine.step():
                deltas.setdefault(delta.request_id, []).append(delta)
        submit(engine, tokenizer, "high", chat("Say hi."), max_tokens=4, priority=Priority.HIGH)
        for rid, more in drain(engine).items():
            deltas.setdefault(rid, []).extend(more)
        fairness = engine.stats().fairness
        assert fairness.preemptions == 1 and fairness.resumes == 1
        assert tokens(deltas["low"]) == reference  # nothing lost, nothing repeated
        assert deltas["high"][-1].finish_reason is not None
        assert fairness.tokens["low"] >= 40 and fairness.tokens["high"] >= 1
    finally:
        engine.close()


def test_a_request_that_waits_past_the_queue_timeout_ends_with_timeout(
    smollm2_model_path: str, tokenizer: LlamaTokenizer
) -> None:
    engine = make_core(smollm2_model_path, max_num_seqs=1, cache_slots=0, queue_timeout_s=0.3)
    try:
        submit(
            engine, tokenizer, "busy", chat("Write a long story."), max_tokens=200, ignore_eos=True
        )
        submit(engine, tokenizer, "late", chat("Hi"), max_tokens=4)
        started = time.monotonic()
        timed_out: list[RequestDelta] = []
        while not timed_out and time.monotonic() - started < 30:
            timed_out = [d for d in engine.step() if d.request_id == "late"]
        (delta,) = timed_out
        assert delta.finish_reason is FinishReason.TIMEOUT and delta.token_ids == []
        assert engine.stats().fairness.timeouts == 1
    finally:
        engine.close()


def test_the_step_cost_model_learns_steps_without_their_kv_operations(
    smollm2_model_path: str, tokenizer: LlamaTokenizer
) -> None:
    """A step's KV operations (host-tier saves of displaced prefixes, moves, restores)
    cost what their tokens hold, not what the step's shape does; counted into the step,
    32 admissions' saves made a 50-token step look like 0.46 s, and the prompt steps
    after it grouped prompts they should have split (BENCHMARKS, nineteenth session).
    Here the first step's KV operations are held up 1.5 s: the model must not see it."""
    engine = make_core(smollm2_model_path)
    observed: list[float] = []
    observe, apply = engine.scheduler.observe_step, engine.kv.apply
    delays = [1.5]

    def slow_ops(ops: list[KvOp]) -> set[str]:
        if delays:
            time.sleep(delays.pop())
        return apply(ops)

    def record(decoding: int, tokens: int, seconds: float) -> None:
        observed.append(seconds)
        observe(decoding, tokens, seconds)

    engine.kv.apply = slow_ops  # type: ignore[method-assign]
    engine.scheduler.observe_step = record  # type: ignore[method-assign]
    try:
        started = time.monotonic()
        submit(engine, tokenizer, "a", chat("Name a colour."), max_tokens=4)
        out = drain(engine)
        elapsed = time.monotonic() - started
    finally:
        engine.close()
    assert len(tokens(out["a"])) == 4
    assert not delays and elapsed > 1.5 and observed
    assert max(observed) < 1.0, observed


def test_logprobs_of_sampled_tokens_and_of_the_prompt(
    core: EngineCore, tokenizer: LlamaTokenizer
) -> None:
    prompt = submit(
        core, tokenizer, "lp", chat("Say yes."), max_tokens=4, logprobs=3, prompt_logprobs=2
    )
    deltas = drain(core)["lp"]
    for delta in deltas:
        assert delta.logprobs is not None and len(delta.logprobs) == len(delta.token_ids)
        for entry in delta.logprobs:
            assert len(entry.top) == 3
            # greedy: the sampled token is the most likely one
            assert entry.token_id == entry.top[0][0]
            assert math.isclose(entry.logprob, entry.top[0][1], abs_tol=1e-5)
            assert sum(math.exp(lp) for _, lp in entry.top) <= 1.0 + 1e-5
    scored = deltas[0].prompt_logprobs
    assert scored is not None and len(scored) == len(prompt) and scored[0] is None
    assert all(
        s is not None and s.token_id == t for s, t in zip(scored[1:], prompt[1:], strict=True)
    )
    assert all(s is not None and s.logprob <= 0 and len(s.top) == 2 for s in scored[1:])
    assert deltas[-1].num_cached_tokens == 0  # prompt logprobs bypass the cache


LONG_TEXT = chat("Summarise this: " + " ".join(["the river runs to the sea"] * 30))


Answer = tuple[list[int], list[TokenLogprob]]  # greedy tokens, each with its top 2


def steps_beside_streams(
    path: str, tokenizer: LlamaTokenizer, asks: dict[str, str], **scheduling: object
) -> tuple[list[tuple[int, int]], dict[str, Answer], dict[str, list[int]]]:
    """Three greedy streams decoding, then `asks` (id: chat text, 12 tokens each) sent
    together and run to the end. Returns (decode rows, other tokens) of each step from
    then on, the answers, and the prompts' token ids."""
    engine = make_core(path, cache_slots=0, **scheduling)
    steps: list[tuple[int, int]] = []
    observe = engine.scheduler.observe_step

    def record(decoding: int, tokens: int, seconds: float) -> None:
        steps.append((decoding, tokens))
        observe(decoding, tokens, seconds)

    engine.scheduler.observe_step = record  # type: ignore[method-assign]
    try:
        start_streams(engine, tokenizer, 3, max_tokens=48)
        steps.clear()
        prompts = {
            rid: submit(engine, tokenizer, rid, text, max_tokens=12, logprobs=2)
            for rid, text in asks.items()
        }
        out = drain(engine)
    finally:
        engine.close()
    answers = {rid: (tokens(out[rid]), [lp for d in out[rid] for lp in d.logprobs or []])
               for rid in asks}  # fmt: skip
    return steps, answers, prompts


def assert_same_greedy_answer(one: Answer, other: Answer, margin: float = 0.25) -> None:
    """The same tokens, or the same up to a position where greedy decoding stood at a
    near-tie in both runs: their top two within `margin` nats, each run taking one of the
    two. A step computes a prompt in other ubatch shapes when the batch around it differs,
    and llama.cpp's CPU kernels round differently per shape, so a near-tie may go either
    way (seen: SmolLM2's top two 0.13 nats apart); past it the contexts differ."""
    for i, (a, b) in enumerate(zip(one[0], other[0], strict=True)):
        if a != b:
            for lp in (one[1][i], other[1][i]):
                (first, lp1), (second, lp2) = lp.top[:2]
                assert {a, b} == {first, second} and lp1 - lp2 < margin, (i, one, other)
            return


def test_under_a_ratio_target_a_long_prompt_is_prefilled_in_short_steps_beside_streams(
    smollm2_model_path: str, tokenizer: LlamaTokenizer
) -> None:
    """Stall-free steps on the real engine: with `itl_target_ratio` 2 a 200-token prompt
    arriving beside three streams is computed over several steps of a few dozen tokens
    (uncapped, with prompt bursts off, it takes one step beside them), and its answer is
    the uncapped one (`assert_same_greedy_answer`)."""
    asks = {"long": LONG_TEXT}
    runs: dict[float, tuple[list[int], Answer]] = {}
    for ratio in (0.0, 2.0):
        steps, answers, prompts = steps_beside_streams(
            smollm2_model_path, tokenizer, asks, itl_target_ratio=ratio, burst_stall_ms=0.0
        )
        beside = [t for d, t in steps if d >= 3 and t > 0]  # prompt tokens in shared steps
        assert sum(beside) >= len(prompts["long"]) - 1
        runs[ratio] = (beside, answers["long"])
    uncapped, capped = runs[0.0][0], runs[2.0][0]
    assert max(uncapped) >= len(prompts["long"]) - 1  # one step took the whole prompt
    assert len(capped) >= 3 and max(capped) < len(prompts["long"]) // 2
    assert_same_greedy_answer(runs[2.0][1], runs[0.0][1])


def test_prompt_bursts_stand_the_streams_aside_and_change_no_answer(
    smollm2_model_path: str, tokenizer: LlamaTokenizer
) -> None:
    """Prompt bursts on the real engine: two prompts arriving beside three streams are
    computed in steps that carry none of the streams' tokens, the shorter prompt first in
    a step of its own, and both answers are those of a run with bursts off
    (`assert_same_greedy_answer`)."""
    asks = {"long": LONG_TEXT, "short": chat("Name a colour.")}
    runs: dict[float, tuple[list[tuple[int, int]], dict[str, Answer]]] = {}
    for stall_ms in (0.0, 30_000.0):
        steps, answers, prompts = steps_beside_streams(
            smollm2_model_path, tokenizer, asks, max_num_seqs=5, burst_stall_ms=stall_ms
        )
        runs[stall_ms] = ([(d, t) for d, t in steps if t > 0], answers)
    assert runs[0.0][0][0][0] == 3  # off: the streams feed a token beside the prompts
    lengths = [len(prompts["short"]), len(prompts["long"])]
    assert runs[30_000.0][0] == [(0, lengths[0]), (0, lengths[1])]
    for rid in asks:
        assert_same_greedy_answer(runs[30_000.0][1][rid], runs[0.0][1][rid])


def test_a_step_stopped_for_a_high_priority_arrival_changes_no_answer(
    smollm2_model_path: str, tokenizer: LlamaTokenizer
) -> None:
    """Step interruption on the real engine: while two streams decode, the step carrying a
    long low-priority prompt is stopped part-way (a fake stands in for the worker loop's
    socket check and reports one high-priority arrival), llama.cpp drops what the step
    computed, the next step plans the same work again, and every answer is the one of a
    run without the stop, token for token. Decode-only steps are never armed."""
    answers: dict[bool, dict[str, list[int]]] = {}
    for stop in (False, True):
        engine = make_core(smollm2_model_path, cache_slots=0)
        asked: list[bool] = []
        pending = [False]

        def fake_socket_check(asked: list[bool] = asked, pending: list[bool] = pending) -> bool:
            arrived, pending[0] = pending[0], False
            asked.append(arrived)
            return arrived

        if stop:
            engine.high_arrived = fake_socket_check
        try:
            start_streams(engine, tokenizer, 2, max_tokens=40)
            asked_before = len(asked)
            for _ in range(3):
                engine.step()
            assert len(asked) == asked_before  # a decode-only step is not armed
            submit(engine, tokenizer, "long", LONG_TEXT, max_tokens=12, priority=Priority.LOW)
            pending[0] = True
            out = drain(engine)
            answers[stop] = {rid: tokens(deltas) for rid, deltas in out.items()}
            interrupts = engine.stats().fairness.interrupts
        finally:
            engine.close()
        assert interrupts == (1 if stop else 0)
        if stop:
            assert asked.count(True) == 1
    assert answers[True] == answers[False]
    assert len(answers[True]["long"]) == 12


def test_requests_that_finish_mid_step_leave_the_rest_of_the_step_its_logits(
    smollm2_model_path: str, tokenizer: LlamaTokenizer
) -> None:
    """Two requests end in one step while a third still samples after them. With the
    copying prefix cache and one cache slot, the second's insert evicts the first's entry
    into the host tier before the first's copy has been decoded, and saving it decodes
    (`LlamaCppBackend._settle`): run then, that decode overwrote the step's logits and
    the third request failed ("invalid logits id"). Finish's KV ops now wait for the
    step's last row."""
    prompts = {rid: chat(f"Tell me about {topic}.") for rid, topic in
               (("a", "rivers"), ("b", "mountains"), ("c", "deserts"))}  # fmt: skip

    def run(rids: tuple[str, ...]) -> dict[str, list[RequestDelta]]:
        engine = make_core(smollm2_model_path, max_num_seqs=3, cache_slots=1,
                           reuse_in_place=False)  # fmt: skip
        try:
            for rid in rids:
                submit(engine, tokenizer, rid, prompts[rid], ignore_eos=True,
                       max_tokens=24 if rid == "c" else 6)  # fmt: skip
            out = drain(engine)
            tiers = engine.stats().kv_tiers
            assert tiers is not None and tiers.spills >= (1 if len(rids) > 1 else 0)
            return out
        finally:
            engine.close()

    together, alone = run(("a", "b", "c")), run(("c",))
    assert all(d.error is None for deltas in together.values() for d in deltas), together
    assert together["c"][-1].finish_reason is FinishReason.LENGTH
    assert tokens(together["c"]) == tokens(alone["c"])


def test_a_turn_moved_next_to_the_running_slot_answers_as_one_continued_in_place(
    smollm2_model_path: str, tokenizer: LlamaTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation's next turn whose parked slot (2) would leave a gap beside a running
    stream (slot 0) is serialized into slot 1 (`KvMove`) and keeps its whole cached
    turn; its answer is the one continued in place in slot 2 (`assert_same_greedy_answer`:
    the two runs' batches split into different ubatches)."""
    turn1 = chat("Who wrote Hamlet?")
    runs: dict[bool, tuple[int, int, Answer]] = {}
    for move in (True, False):
        if not move:  # the rule off: a parked prefix is always continued in place
            monkeypatch.setattr(scheduler_module, "packed_slot", lambda run, free, prefer: prefer)
        engine = make_core(smollm2_model_path, index_only=True)
        try:
            submit(engine, tokenizer, "stream", chat("Count to 50."), max_tokens=60,
                   ignore_eos=True)  # fmt: skip
            submit(engine, tokenizer, "other", chat("Name a colour."), max_tokens=2)
            submit(engine, tokenizer, "t1", turn1, max_tokens=12)
            answer, ended = "", set()
            while ended != {"t1", "other"}:  # the stream decodes on in slot 0
                for delta in engine.step():
                    answer += delta.text if delta.request_id == "t1" else ""
                    if delta.finish_reason is not None:
                        ended.add(delta.request_id)
            history = "<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n<|im_start|>assistant\n"
            submit(engine, tokenizer, "t2", chat("When?", history + answer + "<|im_end|>\n"),
                   max_tokens=12, logprobs=2)  # fmt: skip
            engine.step()
            t2 = engine.scheduler.get(RequestId("t2"))
            assert t2 is not None and t2.seq_id is not None
            deltas = drain(engine)["t2"]
            logprobs = [lp for d in deltas for lp in d.logprobs or []]
            runs[move] = (t2.seq_id, deltas[-1].num_cached_tokens, (tokens(deltas), logprobs))
        finally:
            engine.close()
    assert runs[True][0] == 1 and runs[False][0] == 2
    assert (
        runs[True][1]
        == runs[False][1]
        > len(tokenizer.tokenize(turn1, add_special=True, parse_special=True))
    )
    assert_same_greedy_answer(runs[True][2], runs[False][2])
