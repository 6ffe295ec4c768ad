"""The engine under memory faults, on the real backend.

- A llama_decode without KV room fails no request by itself (REQ-9.2, REQ-9.3): with a KV
  cache smaller than the scheduler believes (its accounting is turned off: the fault), the
  step is retried after evicting the prefix cache, then split, and only a request that
  cannot fit even alone fails, with `kv_cache_full`.
- Memory pressure (REQ-9.5): with a low mark above what the host really has, the engine
  reads the real available memory, evicts its prefix cache, and admits half as many
  sequences with half the step budget.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaCppBackend, LlamaTokenizer
from inferflux.engine.core import EngineCore
from inferflux.engine.messages import AddRequest, FinishReason, RequestDelta, SamplingParams
from inferflux.scheduler import Scheduler
from inferflux.scheduler.policy import SchedulingPolicy
from inferflux.scheduler.prefix_cache import PrefixCache

pytestmark = pytest.mark.model

_TEXT = (
    "The committee met on a rainy Tuesday to discuss the budget for the new library, the "
    "repairs to the old bridge, and the schedule of the summer festival in the park. "
)


@pytest.fixture(scope="module")
def tokenizer(smollm2_model_path: str) -> Iterator[LlamaTokenizer]:
    tok = LlamaTokenizer(smollm2_model_path)
    yield tok
    tok.close()


def _prompt(tok: LlamaTokenizer, n_tokens: int, topic: str) -> list[int]:
    tokens = tok.tokenize(f"{topic}. " + _TEXT * 40, add_special=True, parse_special=False)
    assert len(tokens) >= n_tokens
    return tokens[:n_tokens]


def _core(path: str, *, cache_slots: int = 0, policy: SchedulingPolicy | None = None) -> EngineCore:
    """256 shared KV cells (4 sequences × 64), a scheduler that does not count cells."""
    backend = LlamaCppBackend(ContextConfig(path, 64, 4, 256, 2, 2, True))
    assert backend.n_ctx_total == 256
    running = 4 - cache_slots
    cache = PrefixCache(list(range(running, 4)), max_tokens=256) if cache_slots else None
    scheduler = Scheduler(
        max_num_seqs=running,
        max_batch_tokens=256,
        kv_capacity=None,
        prefix_cache=cache,
        policy=policy,
    )
    return EngineCore(backend, scheduler)


def _run(core: EngineCore, requests: list[AddRequest]) -> dict[str, list[RequestDelta]]:
    out: dict[str, list[RequestDelta]] = {r.request_id: [] for r in requests}
    for request in requests:
        assert core.add_request(request) == []
    while core.has_work():
        for delta in core.step():
            out[delta.request_id].append(delta)
    return out


def _request(rid: str, prompt: list[int], max_tokens: int = 6) -> AddRequest:
    return AddRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


def test_a_step_without_kv_room_fails_only_the_request_that_cannot_fit(
    smollm2_model_path: str, tokenizer: LlamaTokenizer
) -> None:
    core = _core(smollm2_model_path)
    try:
        # "long" holds 200 of the 256 cells and decodes; "late" then brings 100 prompt
        # tokens. That step needs 101 cells, 56 are free: it is split, the decode row of
        # "long" goes on, and "late" fails alone.
        deltas: dict[str, list[RequestDelta]] = {"long": [], "late": []}
        assert core.add_request(_request("long", _prompt(tokenizer, 200, "Budget"), 20)) == []
        while not deltas["long"]:
            for delta in core.step():
                deltas[delta.request_id].append(delta)
        assert core.add_request(_request("late", _prompt(tokenizer, 100, "Bridge"))) == []
        while core.has_work():
            for delta in core.step():
                deltas[delta.request_id].append(delta)
        long, late = deltas["long"][-1], deltas["late"][-1]
        assert long.finish_reason is FinishReason.LENGTH and long.num_output_tokens == 20
        assert sum(len(d.token_ids) for d in deltas["long"]) == 20
        assert "".join(d.text for d in deltas["long"]).strip()  # it generated text
        assert late.finish_reason is FinishReason.ERROR
        assert late.error_code == "kv_cache_full"
        assert core.stats().decode_failures == 2  # the pair, then "late" alone
        # the engine goes on: the same request alone now has room
        again = _run(core, [_request("retry", _prompt(tokenizer, 100, "Bridge"))])
        assert again["retry"][-1].finish_reason is FinishReason.LENGTH
    finally:
        core.close()


def test_no_kv_room_evicts_the_prefix_cache_and_retries_the_step(
    smollm2_model_path: str, tokenizer: LlamaTokenizer
) -> None:
    core = _core(smollm2_model_path, cache_slots=2)
    try:
        first = _run(core, [_request("first", _prompt(tokenizer, 150, "Budget"), 2)])
        assert first["first"][-1].finish_reason is FinishReason.LENGTH
        cache = core.stats().prefix_cache
        assert cache is not None and cache.entries == 1 and cache.cached_tokens >= 150
        # A different 150-token prompt: 150 cells needed, about 105 free: no room until
        # the cached prefix is evicted.
        second = _run(core, [_request("second", _prompt(tokenizer, 150, "Bridge"))])
        assert second["second"][-1].finish_reason is FinishReason.LENGTH
        assert core.stats().decode_failures == 1
    finally:
        core.close()


def test_memory_pressure_evicts_the_cache_and_halves_admissions_and_budget(
    smollm2_model_path: str, tokenizer: LlamaTokenizer
) -> None:
    core = _core(smollm2_model_path, cache_slots=1)  # 3 running slots, 1 cache slot
    try:
        _run(core, [_request("warm", _prompt(tokenizer, 40, "Budget"), 2)])
        assert core.stats().prefix_cache.entries == 1  # type: ignore[union-attr]
        # Every byte the host has is "too little": pressure from the next reading on.
        core.scheduler.policy = SchedulingPolicy(memory_low_bytes=1 << 60)
        core.memory.interval_s = 0.0  # read at every step (1 s in service)
        for i in range(3):
            core.add_request(_request(f"r{i}", _prompt(tokenizer, 20, f"Topic {i}"), 4))
        core.step()
        stats = core.stats()
        assert stats.memory_pressure and stats.memory_pressure_episodes == 1
        assert stats.host_memory_available_bytes > 0  # read from this host
        assert stats.prefix_cache is not None and stats.prefix_cache.entries == 0
        assert stats.num_running == 1 and stats.num_waiting == 2  # max(1, 3 // 2)
        while core.has_work():
            core.step()
        # the pressure ends with the low mark back at a value the host has
        core.scheduler.policy = SchedulingPolicy(memory_low_bytes=1)
        for i in range(3):
            core.add_request(_request(f"s{i}", _prompt(tokenizer, 20, f"Topic {i}"), 4))
        core.step()
        assert not core.stats().memory_pressure and core.stats().num_running == 3
        while core.has_work():
            core.step()
    finally:
        core.close()
