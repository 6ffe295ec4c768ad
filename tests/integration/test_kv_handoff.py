"""The prefill → decode hand-off on the real llama.cpp backend (engine/kv_channel.py):
a prefill EngineCore computes a prompt but its last token and writes the KV ticket to
shared memory; a decode EngineCore hydrates it into a sequence and generates.

Each test drives `step()` directly (no transport, no API process): the server-level
flow is in test_disaggregated.py.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferflux.engine.backends.llama_cpp import LlamaTokenizer
from inferflux.engine.core import EngineCore
from inferflux.engine.messages import (
    AddRequest,
    FinishReason,
    KvTicket,
    SamplingParams,
)
from tests.integration.test_engine_core import chat_prompt, make_core, run, tokens_of

pytestmark = pytest.mark.model

QUESTIONS = [
    "What is the capital of France?",
    "Explain photosynthesis briefly.",
    "Write a short poem about cats.",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_model_path: str) -> Iterator[LlamaTokenizer]:
    tok = LlamaTokenizer(smollm2_model_path)
    yield tok
    tok.close()


@pytest.fixture(scope="module")
def cores(smollm2_model_path: str) -> Iterator[dict[str, EngineCore]]:
    made = {
        role: make_core(smollm2_model_path, max_num_seqs=4, role=role)  # 4 running + 4 cached
        for role in ("prefill", "decode", "unified")
    }
    yield made
    for core in made.values():
        core.close()


def request(rid: str, prompt: list[int], **fields: object) -> AddRequest:
    sampling = SamplingParams(max_tokens=24, temperature=0.0)
    return AddRequest(request_id=rid, prompt_token_ids=prompt, sampling=sampling, **fields)  # type: ignore[arg-type]


def prefill(
    core: EngineCore, rid: str, prompt: list[int], path: Path, **fields: object
) -> KvTicket:
    (delta,) = run(core, [request(rid, prompt, ticket_path=str(path), **fields)])[rid]
    assert delta.finish_reason is FinishReason.HANDOFF, delta
    assert delta.token_ids == [] and delta.ticket is not None  # it sampled nothing
    return delta.ticket


def test_a_handed_off_prompt_generates_what_the_unified_engine_does(
    cores, tokenizer, tmp_path
) -> None:
    for i, question in enumerate(QUESTIONS):
        prompt = chat_prompt(tokenizer, question)
        path = tmp_path / f"t{i}"
        ticket = prefill(cores["prefill"], f"p{i}", prompt, path)
        assert ticket.n_tokens == len(prompt) - 1 and ticket.nbytes == path.stat().st_size
        decoded = run(cores["decode"], [request(f"p{i}", prompt, kv_ticket=ticket)])[f"p{i}"]
        unified = run(cores["unified"], [request(f"u{i}", prompt)])[f"u{i}"]
        assert tokens_of(decoded) == tokens_of(unified), question
        assert decoded[-1].num_prompt_tokens == len(prompt)
        assert path.exists()  # the API process recycles or deletes it, not a worker
    stats = cores["decode"].stats().tickets
    assert stats is not None and stats.hydrated >= len(QUESTIONS) and stats.refused == 0
    assert cores["prefill"].stats().tickets.written >= len(QUESTIONS)  # type: ignore[union-attr]
    assert cores["prefill"].stats().role == "prefill"


def test_the_decode_step_reports_each_transfer(cores, tokenizer, tmp_path) -> None:
    prompt = chat_prompt(tokenizer, "Name a colour.")
    ticket = prefill(cores["prefill"], "x", prompt, tmp_path / "t")
    cores["decode"].take_step_stats()
    run(cores["decode"], [request("x", prompt, kv_ticket=ticket)])
    step = cores["decode"].take_step_stats()
    assert step is not None and len(step.transfer_s) == 1
    assert 0 <= step.transfer_s[0] < 60


def test_the_prefill_worker_keeps_the_prompt_in_its_prefix_cache(
    cores, tokenizer, tmp_path
) -> None:
    prompt = chat_prompt(tokenizer, "Describe a quiet library at night in detail. " * 6)
    prefill(cores["prefill"], "a", prompt, tmp_path / "a")
    again = prefill(cores["prefill"], "b", prompt, tmp_path / "b")
    assert again.num_cached_tokens > 0  # reported to the client as cached tokens
    decoded = run(cores["decode"], [request("b", prompt, kv_ticket=again)])["b"]
    assert decoded[-1].num_cached_tokens == again.num_cached_tokens


@pytest.mark.parametrize("damage", ["namespace", "tokens", "gone", "truncated", "garbage"])
def test_a_ticket_that_does_not_match_is_refused_and_the_prompt_computed(
    cores, tokenizer, tmp_path, damage
) -> None:
    prompt = chat_prompt(tokenizer, "What is 12 times 12?")
    path = tmp_path / "t"
    ticket = prefill(cores["prefill"], "d", prompt, path, cache_namespace="tenant-a")
    sent = request("d", prompt, kv_ticket=ticket, cache_namespace="tenant-a")
    if damage == "namespace":  # written for another tenant's prefix space
        sent = request("d", prompt, kv_ticket=ticket, cache_namespace="tenant-b")
    elif damage == "tokens":  # same length, other tokens
        other = list(prompt)
        other[3] += 1
        sent = request("d", other, kv_ticket=ticket, cache_namespace="tenant-a")
    elif damage == "gone":
        path.unlink()
    elif damage == "truncated":
        os.truncate(path, 100)
    else:
        path.write_bytes(b"\x00" * 4096)
    before = cores["decode"].stats().tickets.refused  # type: ignore[union-attr]
    decoded = run(cores["decode"], [sent])["d"]
    expected = run(cores["unified"], [request(f"u-{damage}", sent.prompt_token_ids)])
    assert tokens_of(decoded) == tokens_of(expected[f"u-{damage}"])
    assert cores["decode"].stats().tickets.refused == before + 1  # type: ignore[union-attr]


def test_a_ticket_of_another_model_is_refused(
    cores, tokenizer, gemma3_model_path, tmp_path
) -> None:
    gemma = make_core(gemma3_model_path, role="prefill")
    try:
        prompt = chat_prompt(tokenizer, "Who wrote Hamlet?")
        # Gemma's vocabulary is larger: SmolLM2's ids are valid tokens there too
        ticket = prefill(gemma, "g", prompt, tmp_path / "g")
    finally:
        gemma.close()
    decoded = run(cores["decode"], [request("g", prompt, kv_ticket=ticket)])["g"]
    expected = run(cores["unified"], [request("gu", prompt)])["gu"]
    assert tokens_of(decoded) == tokens_of(expected)


def test_an_aborted_request_never_hydrates_its_ticket(cores, tokenizer, tmp_path) -> None:
    prompt = chat_prompt(tokenizer, "Tell me about the moon.")
    ticket = prefill(cores["prefill"], "c", prompt, tmp_path / "c")
    decode = cores["decode"]
    hydrated = decode.stats().tickets.hydrated  # type: ignore[union-attr]
    assert decode.add_request(request("c", prompt, kv_ticket=ticket)) == []
    (aborted,) = decode.abort_requests(["c"])  # before its first step
    assert aborted.finish_reason is FinishReason.ABORT
    assert not decode.has_work()
    assert decode.stats().tickets.hydrated == hydrated  # type: ignore[union-attr]


def test_a_ticket_that_cannot_be_written_ends_without_one(cores, tokenizer, tmp_path) -> None:
    prompt = chat_prompt(tokenizer, "List three prime numbers.")
    path = tmp_path / "missing-folder" / "t"
    (delta,) = run(cores["prefill"], [request("w", prompt, ticket_path=str(path))])["w"]
    assert delta.finish_reason is FinishReason.HANDOFF and delta.ticket is None
    assert not cores["prefill"].has_work()


def test_a_recycled_larger_file_carries_a_shorter_ticket(cores, tokenizer, tmp_path) -> None:
    path = tmp_path / "ring"
    long = chat_prompt(tokenizer, "Describe the sea in great detail. " * 8)
    short = chat_prompt(tokenizer, "Name a fruit.")
    first = prefill(cores["prefill"], "l", long, path)
    second = prefill(cores["prefill"], "s", short, path)  # written over the first's pages
    assert second.nbytes < first.nbytes == path.stat().st_size
    decoded = run(cores["decode"], [request("s", short, kv_ticket=second)])["s"]
    expected = run(cores["unified"], [request("su", short)])["su"]
    assert tokens_of(decoded) == tokens_of(expected)


@pytest.fixture
def full_tmpfs(tmp_path) -> Iterator[Path]:
    """A 1 MB tmpfs (a container's small /dev/shm); skipped where mounting is not allowed."""
    folder = tmp_path / "shm"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def test_a_full_shared_memory_ends_without_a_ticket_not_with_a_crash(
    cores, tokenizer, full_tmpfs
) -> None:
    prompt = chat_prompt(tokenizer, "Describe the sea in great detail. " * 8)  # ~2 MB of KV
    path = full_tmpfs / "t"
    (delta,) = run(cores["prefill"], [request("f", prompt, ticket_path=str(path))])["f"]
    assert delta.finish_reason is FinishReason.HANDOFF and delta.ticket is None
    assert not cores["prefill"].has_work()  # the worker lives on (a map write would SIGBUS)
