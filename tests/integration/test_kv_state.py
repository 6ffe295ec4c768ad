"""A sequence's KV as bytes and back, on the real llama.cpp backend (both models).

Round trip: the state of a prefix, saved as a checked blob and loaded into another
sequence, gives bit-identical logits for the next token (each decoded alone, so the
batch shape is the same). Refusal: bytes of another model, another layout, or with one
byte flipped never reach llama.cpp; the engine recomputes instead.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import llama_cpp as ll
import numpy as np
import pytest

from inferflux.config.kv_settings import NvmeOffloadSettings, PagedKvSettings
from inferflux.config.settings import ObservabilitySettings, SchedulerSettings
from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaCppBackend
from inferflux.engine.core import EngineCore
from inferflux.engine.engine_build import WorkerConfig, build_engine_core
from inferflux.engine.kv_state import BlobHeader, KvStateRefused, decode_blob, encode_blob
from inferflux.engine.messages import AddRequest, SamplingParams

pytestmark = pytest.mark.model

PROMPT = (
    "The history of the printing press begins in the fifteenth century, when movable "
    "type changed how books were made, sold and read across Europe. "
) * 3


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def backend(request: pytest.FixtureRequest) -> Iterator[LlamaCppBackend]:
    path = request.getfixturevalue(f"{request.param}_model_path")
    b = LlamaCppBackend(ContextConfig(path, 512, 4, 256, 2, 2, False))
    yield b
    b.close()


def _tokens(backend: LlamaCppBackend) -> list[int]:
    vocab = ll.llama_model_get_vocab(backend.model_handle)
    data = PROMPT.encode()
    buf = (ll.llama_token * (len(data) + 8))()
    n = ll.llama_tokenize(vocab, data, len(data), buf, len(buf), True, False)
    return list(buf[:n])


def _next_logits(backend: LlamaCppBackend, seq_id: int, token: int, pos: int) -> np.ndarray:
    (row,) = backend.decode([(seq_id, [token], pos, 1)])
    ptr = ll.llama_get_logits_ith(backend._ctx, row)
    return np.ctypeslib.as_array(ptr, shape=(backend.n_vocab,)).copy()


def _header(backend: LlamaCppBackend, tokens: list[int], model_id: str = "m" * 64) -> BlobHeader:
    return BlobHeader(
        model_id=model_id, layout=backend.kv_layout(), namespace="ns", token_ids=tokens
    )


def test_round_trip_gives_bit_identical_logits(backend: LlamaCppBackend) -> None:
    tokens = _tokens(backend)
    prefix, last = tokens[:-1], tokens[-1]
    for seq in (0, 1):
        backend.free_seq(seq)
    backend.decode([(0, prefix, 0, 0)])
    blob = encode_blob(_header(backend, prefix), backend.save_seq(0))
    checked = decode_blob(blob, model_id="m" * 64, layout=backend.kv_layout())
    assert checked.header.token_ids == prefix
    assert backend.load_seq(1, checked.payload, len(prefix))
    original = _next_logits(backend, 0, last, len(prefix))
    restored = _next_logits(backend, 1, last, len(prefix))
    assert np.array_equal(original, restored)
    # a shorter restore (the first half) continues exactly like the original cut there
    # (not like a fresh prefill of the half: KV depends on the batch shape it came from)
    half = len(prefix) // 2
    backend.free_seq(0)
    backend.decode([(0, prefix, 0, 0)])
    assert backend.load_seq(2, checked.payload, half)
    assert backend.copy_seq(0, 3, half)
    assert np.array_equal(
        _next_logits(backend, 2, prefix[half], half), _next_logits(backend, 3, prefix[half], half)
    )
    for seq in range(4):
        backend.free_seq(seq)


def test_a_copy_not_yet_decoded_saves_and_loads_as_a_decoded_one(
    backend: LlamaCppBackend,
) -> None:
    """Across KV streams llama.cpp moves a copy's bytes only at the next llama_decode.
    Saving the destination before it, or loading a state into either end, must still
    see the copy as done (the backend runs the pending copies first)."""
    tokens = _tokens(backend)
    prefix, last = tokens[:40], tokens[40]
    for seq in range(4):
        backend.free_seq(seq)
    backend.decode([(0, prefix, 0, 0)])
    other = tokens[1:41]
    backend.decode([(1, other, 0, 0)])
    other_state = backend.save_seq(1)
    assert backend.copy_seq(0, 2, len(prefix))
    copied = backend.save_seq(2)  # no decode since the copy
    assert backend.copy_seq(0, 3, len(prefix))
    assert backend.load_seq(0, other_state, len(other))  # the source, overwritten at once
    expected = _next_logits(backend, 1, tokens[41], len(other))
    assert np.array_equal(_next_logits(backend, 0, tokens[41], len(other)), expected)
    reference = _next_logits(backend, 3, last, len(prefix))
    assert backend.load_seq(1, copied, len(prefix))
    assert np.array_equal(_next_logits(backend, 1, last, len(prefix)), reference)
    for seq in range(4):
        backend.free_seq(seq)


def test_mismatched_or_corrupt_bytes_are_refused(backend: LlamaCppBackend) -> None:
    tokens = _tokens(backend)[:40]
    backend.free_seq(0)
    backend.decode([(0, tokens, 0, 0)])
    blob = encode_blob(_header(backend, tokens), backend.save_seq(0))
    layout = backend.kv_layout()
    with pytest.raises(KvStateRefused, match="model"):
        decode_blob(blob, model_id="x" * 64, layout=layout)
    with pytest.raises(KvStateRefused, match="n_ctx_per_seq"):
        decode_blob(blob, model_id="m" * 64, layout={**layout, "n_ctx_per_seq": 1024})
    corrupt = bytearray(blob)
    corrupt[len(blob) // 2] ^= 0x01
    with pytest.raises(KvStateRefused, match="checksum"):
        decode_blob(bytes(corrupt), model_id="m" * 64, layout=layout)
    with pytest.raises(KvStateRefused, match="truncated"):
        decode_blob(blob[:10], model_id="m" * 64, layout=layout)
    # llama.cpp's own refusal (bytes that are not its state) empties the sequence
    assert not backend.load_seq(1, b"\x00" * 64, 10)
    assert ll.llama_memory_seq_pos_max(ll.llama_get_memory(backend._ctx), 1) == -1
    backend.free_seq(0)


def _tiered_core(path: str, tmp: Path | None, *, reuse_in_place: bool = True) -> EngineCore:
    scheduling = SchedulerSettings.model_validate(
        {"prefix_cache": {"slots": 1, "reuse_in_place": reuse_in_place}}
    )
    config = WorkerConfig(
        worker_id=0,
        generation=1,
        input_address="",
        output_address="",
        context=ContextConfig(path, 512, 2 + 1, 256, 2, 2, False),
        max_num_seqs=2,
        max_batch_tokens=256,
        observability=ObservabilitySettings(),
        scheduling=scheduling,
        paged_kv=PagedKvSettings(cpu_pages=64),
        nvme_offload=NvmeOffloadSettings(path=str(tmp) if tmp else None),
    )
    return build_engine_core(config)


def _run(core: EngineCore, request_id: str, prompt: list[int]) -> tuple[list[int], int]:
    sampling = SamplingParams(max_tokens=6, temperature=0.0)
    core.add_request(AddRequest(request_id=request_id, prompt_token_ids=prompt, sampling=sampling))
    out: list[int] = []
    cached = 0
    while core.has_work():
        for delta in core.step():
            out.extend(delta.token_ids)
            cached = delta.num_cached_tokens
    return out, cached


def _cold(path: str, prompt: list[int]) -> list[int]:
    """What a fresh engine (nothing cached anywhere) generates for `prompt`."""
    core = _tiered_core(path, None)
    try:
        out, cached = _run(core, "cold", prompt)
    finally:
        core.close()
    assert cached == 0
    return out


def test_evicted_prefix_is_restored_from_the_host_tier(
    smollm2_model_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One cache slot: B's turn evicts A's prefix into the host tier; A's next turn
    restores it (cached tokens counted) and generates exactly what a cold engine does.
    A corrupted host entry is refused, logged, and recomputed. (Finished requests go
    straight into the cache here: parked ones, the next test.)"""
    core = _tiered_core(smollm2_model_path, None, reuse_in_place=False)
    try:
        b = core.backend
        assert isinstance(b, LlamaCppBackend)
        a_prompt = _tokens(b)[:80]
        b_prompt = list(reversed(a_prompt))
        _run(core, "a1", a_prompt)
        _run(core, "b1", b_prompt)  # evicts a1's entry from the only slot
        assert core.kv_offload is not None
        assert core.kv_offload.stats.spills == 1
        a2 = a_prompt + [a_prompt[5], a_prompt[6], a_prompt[7]]
        warm, cached = _run(core, "a2", a2)
        assert cached >= len(a_prompt) - 1
        assert core.kv_offload.stats.restores == 1
        assert core.kv_offload.stats.host_hits == 1
        assert _cold(smollm2_model_path, a2) == warm
        # corrupt every host entry: the next hit is refused, logged and recomputed
        _run(core, "c1", list(reversed(a2)))  # pushes a2 out of the slot
        assert core.kv_offload.stats.host_entries == 3
        for entry in core.kv_offload.store.entries():
            if entry.data is not None:
                entry.data = bytes(entry.data[:-1]) + bytes([entry.data[-1] ^ 0xFF])
        with caplog.at_level(logging.WARNING):
            again, cached = _run(core, "a3", a2 + [a_prompt[9]])
        assert core.kv_offload.stats.refusals == 1
        assert "refused: checksum mismatch" in caplog.text
        assert cached == 0 and len(again) == 6
    finally:
        core.close()


def test_a_displaced_parked_prefix_goes_to_the_host_tier_and_comes_back(
    smollm2_model_path: str,
) -> None:
    """Finished requests stay parked in their slots: when B takes A's slot, A's KV is
    serialized straight into the host tier (no copy into a cache slot); A's next turn
    restores it and generates exactly what a cold engine does."""
    core = _tiered_core(smollm2_model_path, None)
    try:
        b = core.backend
        assert isinstance(b, LlamaCppBackend)
        assert core.kv_offload is not None and core.scheduler.prefix_cache is not None
        a_prompt = _tokens(b)[:80]
        _run(core, "a1", a_prompt)
        assert core.kv_offload.stats.spills == 0  # parked, nothing moved yet
        _run(core, "b1", list(reversed(a_prompt)))
        assert core.kv_offload.stats.spills == 1
        assert core.scheduler.prefix_cache.num_entries == 0  # the cache slot was not used
        a2 = a_prompt + [a_prompt[5], a_prompt[6], a_prompt[7]]
        warm, cached = _run(core, "a2", a2)
        assert cached >= len(a_prompt) - 1
        assert core.kv_offload.stats.restores == 1 and core.kv_offload.stats.host_hits == 1
        assert _cold(smollm2_model_path, a2) == warm
    finally:
        core.close()


@pytest.mark.parametrize("reuse_in_place", [False, True], ids=["copy", "in-place"])
def test_gemma_without_full_swa_reuses_whole_entries_and_recomputes_cut_ones(
    gemma3_model_path: str, caplog: pytest.LogCaptureFixture, reuse_in_place: bool
) -> None:
    """swa_full off: the sliding-window layers keep only the last window of a sequence.
    A next turn (the whole cached or parked entry) reuses it; a prompt that diverges early
    (the entry cut before what the window kept) would attend to dropped positions, so it
    is recomputed instead: output equal to a cold engine's either way."""

    def core(swa_full: bool) -> EngineCore:
        cache = {"slots": 1, "reuse_in_place": reuse_in_place}
        config = WorkerConfig(
            worker_id=0,
            generation=1,
            input_address="",
            output_address="",
            context=ContextConfig(gemma3_model_path, 1536, 3, 512, 2, 2, False, swa_full=swa_full),
            max_num_seqs=2,
            max_batch_tokens=512,
            observability=ObservabilitySettings(),
            scheduling=SchedulerSettings.model_validate({"prefix_cache": cache}),
        )
        return build_engine_core(config)

    swa = core(swa_full=False)
    try:
        b = swa.backend
        assert isinstance(b, LlamaCppBackend)
        words = _tokens(b)
        long_prompt = (words * 20)[:1100]
        _run(swa, "t1", long_prompt)
        if reuse_in_place:
            assert swa.scheduler.parked is not None
            (parked,) = swa.scheduler.parked.entries()
            entry = parked.tokens
        else:
            (_, _, entry), *_ = swa.scheduler.prefix_cache.entries()  # type: ignore[union-attr]
        turn2 = entry + [words[1], words[2]]
        warm, cached = _run(swa, "t2", turn2)
        assert cached == len(entry)  # the whole entry: its window is intact
        early = long_prompt[:300] + list(reversed(words))
        with caplog.at_level(logging.WARNING):
            cut, cut_cached = _run(swa, "t3", early)
        assert cut_cached == 0 and "failed; computing its prompt" in caplog.text
    finally:
        swa.close()
    cold = core(swa_full=True)
    try:
        assert _run(cold, "t2", turn2)[0] == warm
        assert _run(cold, "t3", early)[0] == cut
    finally:
        cold.close()


def test_gemma_restores_keep_only_the_window_so_cut_restores_are_refused(
    gemma3_model_path: str,
) -> None:
    """A restored Gemma state holds its sliding-window layers' last window only (even
    with swa_full on): the whole state loads, a cut before that window is refused (the
    next token would attend to positions that are not there)."""
    b = LlamaCppBackend(ContextConfig(gemma3_model_path, 1024, 3, 512, 2, 2, False))
    try:
        tokens = (_tokens(b) * 20)[:700]
        b.decode([(0, tokens[:512], 0, 0)])
        b.decode([(0, tokens[512:], 512, 0)])
        data = b.save_seq(0)
        memory = ll.llama_get_memory(b._ctx)
        assert b.load_seq(1, data, 700)
        assert ll.llama_memory_seq_pos_min(memory, 1) > 0  # only the window came back
        assert not b.load_seq(2, data, 300)
        assert ll.llama_memory_seq_pos_max(memory, 2) == -1
        assert b.copy_seq(1, 2, 700)  # whole: fine; cut: refused, dst left empty
        assert not b.copy_seq(1, 2, 300)
    finally:
        b.close()
