"""Prompt keys and the per-replica prefix index of the router (pure logic)."""

from __future__ import annotations

from inferflux.router.prefix_index import (
    PrefixIndex,
    affinity_text,
    last_full_block,
    namespace,
    prompt_blocks,
)

BLOCK = 16


def _chat(*contents: str) -> dict:
    roles = ["system", "user", "assistant", "user", "assistant", "user"][: len(contents)]
    messages = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=True)]
    return {"model": "m", "messages": messages}


def test_chat_text_is_messages_in_order_with_roles():
    text = affinity_text(_chat("be brief", "hello"))
    assert text.index("be brief") < text.index("hello")
    assert "system" in text and "user" in text


def test_turn_two_extends_turn_one():
    one = affinity_text(_chat("sys", "first question"))
    two = affinity_text(_chat("sys", "first question", "an answer", "second question"))
    assert two.startswith(one)


def test_content_parts_prompt_and_ollama_shapes():
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}]}
    assert "hi there" in affinity_text(parts)
    assert affinity_text({"prompt": "The capital of"}) == "The capital of"
    assert affinity_text({"prompt": [1, 2, 3]}) == "123"
    assert affinity_text({"system": "S", "prompt": "P"}) == "SP"  # Ollama /api/generate
    assert affinity_text({"model": "m"}) == ""


def test_blocks_are_chained_and_namespaced():
    seed = namespace("m", "Bearer key-a")
    text = "x" * (3 * BLOCK)
    blocks = prompt_blocks(seed, text, BLOCK)
    assert len(blocks) == 3 and len(set(blocks)) == 3  # same text, different position
    assert prompt_blocks(namespace("m", "Bearer key-b"), text, BLOCK)[0] != blocks[0]
    assert prompt_blocks(namespace("other", "Bearer key-a"), text, BLOCK)[0] != blocks[0]
    assert prompt_blocks(seed, text + "tail", BLOCK)[:3] == blocks
    assert prompt_blocks(seed, "", BLOCK) == []


def test_last_full_block():
    assert last_full_block(BLOCK - 1, BLOCK) == -1
    assert last_full_block(BLOCK, BLOCK) == 0
    assert last_full_block(3 * BLOCK + 5, BLOCK) == 2


def _key(text: str) -> tuple[list[bytes], int]:
    return prompt_blocks(b"seed", text, BLOCK), last_full_block(len(text), BLOCK)


def test_match_counts_leading_blocks_and_marks_prompt_ends():
    index = PrefixIndex(2, max_blocks=100)
    turn_one = "a" * (2 * BLOCK) + "question"
    index.record(0, *_key(turn_one))
    turn_two, _ = _key(turn_one + "answer and a new question")
    matches = index.match(turn_two)
    assert matches[0].num_blocks == 2 and matches[0].at_end
    assert matches[1].num_blocks == 0


def test_a_shared_prefix_is_not_an_end():
    index = PrefixIndex(1, max_blocks=100)
    system = "s" * (4 * BLOCK)
    index.record(0, *_key(system + "conversation one" + "x" * BLOCK))
    other, _ = _key(system + "conversation two" + "y" * BLOCK)
    (match,) = index.match(other)
    assert match.num_blocks == 4 and not match.at_end


def test_lru_bound_and_forget():
    index = PrefixIndex(1, max_blocks=3)
    index.record(0, *_key("z" * (5 * BLOCK)))
    assert index.size(0) == 3
    hashes, _ = _key("z" * (5 * BLOCK))
    assert index.match(hashes)[0].num_blocks == 5  # the newest blocks stayed
    index.forget(0)
    assert index.size(0) == 0
