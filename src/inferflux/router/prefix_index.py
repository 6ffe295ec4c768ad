"""Prefix affinity without a tokenizer: an approximate index over the prompt's text.

Owns: `affinity_text` (the prompt-bearing part of a request body, canonicalized),
`prompt_blocks` (chained hashes of fixed-size character blocks, namespaced by model and
credential) and `PrefixIndex` (per replica, the block hashes recently routed there, LRU
bounded). Does not own: picking a replica (`picker.py`) or what the replicas really cache.

Why text blocks: SGLang's router keeps an approximate radix tree over request text for the
same reason: the router has no tokenizer, and a replica's prefix cache (token ids) holds a
prompt whose text began the same way. Each block's hash covers every block before it
(chained), so one hash found in a replica's set means the whole prefix up to that block
was routed there. The namespace is the model plus a hash of the credential, because the
replicas' prefix caches are per tenant: two tenants' identical prompts never share KV.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

_MAX_DEPTH = 8  # content parts nest a few levels at most (message → parts → text)
_encoder = msgspec.json.Encoder(order="sorted")


def affinity_text(body: Mapping[str, Any]) -> str:  # Any: a parsed JSON request body
    """The text a replica's prefix cache would reuse: system/instructions, then the
    messages (OpenAI, Ollama, Anthropic chat), the Responses `input`, or the `prompt`,
    each message as role + content, in order. "" when the body carries no prompt."""
    parts = [
        _text(body[key], 0)
        for key in ("system", "instructions", "messages", "input", "prompt")
        if key in body and body[key] is not None
    ]
    return "".join(parts)


def _text(value: object, depth: int) -> str:
    if isinstance(value, str):
        return value
    if depth >= _MAX_DEPTH:
        return ""
    if isinstance(value, list):
        return "".join(_text(item, depth + 1) for item in value)
    if isinstance(value, dict):
        if "content" in value:  # a message: its role then its content
            role = value.get("role")
            head = f"\x1f{role}\x1f" if isinstance(role, str) else "\x1f"
            return head + _text(value["content"], depth + 1) + "\x1e"
        if isinstance(value.get("text"), str):  # a text part
            return str(value["text"])
        return _encoder.encode(value).decode()  # an image part, a tool call: as JSON
    return str(value)  # numbers (a token-id prompt)


def namespace(model: str | None, credential: str | None) -> bytes:
    """The seed of a prompt's block chain: model + a digest of the credential."""
    digest = hashlib.sha256((credential or "").encode()).digest()[:16]
    return hashlib.blake2b(f"{model or ''}\x00".encode() + digest, digest_size=8).digest()


def prompt_blocks(seed: bytes, text: str, block_chars: int) -> list[bytes]:
    """Chained 8-byte hashes of `text` cut in blocks of `block_chars` characters; the
    last block may be shorter. Empty text: no blocks."""
    blocks: list[bytes] = []
    previous = seed
    for start in range(0, len(text), block_chars):
        chunk = text[start : start + block_chars].encode("utf-8", "surrogatepass")
        previous = hashlib.blake2b(previous + chunk, digest_size=8).digest()
        blocks.append(previous)
    return blocks


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """How much of a prompt one replica was sent before. `at_end`: the match ends where
    an earlier prompt ended (the conversation's previous turn, a repeated request), not
    where an earlier prompt went on with other text (a shared system prompt)."""

    num_blocks: int
    at_end: bool


def last_full_block(text_chars: int, block_chars: int) -> int:
    """Index of the last block of a `text_chars` long prompt that is complete (-1: none):
    the next turn of a conversation repeats that block, never a partial one."""
    return text_chars // block_chars - 1


@dataclass(slots=True)
class _ReplicaBlocks:
    max_blocks: int
    # block hash → True where a recorded prompt ended (its last full block, its last block)
    blocks: OrderedDict[bytes, bool] = field(default_factory=OrderedDict)

    def add(self, hashes: list[bytes], end: int) -> None:
        last = len(hashes) - 1
        for i, block in enumerate(hashes):
            self.blocks[block] = self.blocks.get(block, False) or i in (end, last)
            self.blocks.move_to_end(block)
        while len(self.blocks) > self.max_blocks:
            self.blocks.popitem(last=False)

    def longest(self, hashes: list[bytes]) -> PrefixMatch:
        """Blocks of `hashes` matched from the start (the last one found wins: chained)."""
        for i in range(len(hashes) - 1, -1, -1):
            at_end = self.blocks.get(hashes[i])
            if at_end is not None:
                return PrefixMatch(i + 1, at_end)
        return PrefixMatch(0, False)


_NO_MATCH = PrefixMatch(0, False)


class PrefixIndex:
    """Per replica (by index), the prompt blocks routed there, least recently used out
    first. Not thread-safe: used from the router's event loop only."""

    def __init__(self, num_replicas: int, max_blocks: int) -> None:
        self._max_blocks = max_blocks
        self._replicas = [_ReplicaBlocks(max_blocks) for _ in range(num_replicas)]

    def add_replica(self) -> None:
        """One more replica (the next index), knowing nothing yet."""
        self._replicas.append(_ReplicaBlocks(self._max_blocks))

    def match(self, hashes: list[bytes]) -> list[PrefixMatch]:
        """For each replica, how many leading blocks of `hashes` were routed there."""
        if not hashes:
            return [_NO_MATCH] * len(self._replicas)
        return [replica.longest(hashes) for replica in self._replicas]

    def record(self, replica: int, hashes: list[bytes], end: int) -> None:
        """Remember that `hashes` were sent to `replica`, the prompt's last full block at
        index `end` (refreshes their recency)."""
        self._replicas[replica].add(hashes, end)

    def forget(self, replica: int) -> None:
        """Drop everything known about `replica` (it died: its cache is gone)."""
        self._replicas[replica].blocks.clear()

    def size(self, replica: int) -> int:
        return len(self._replicas[replica].blocks)


def merge_matches(local: list[PrefixMatch], shared: list[PrefixMatch] | None) -> list[PrefixMatch]:
    """Per replica the longer of what this router knows and what the shared directory
    says (an end mark wins a tie)."""
    if shared is None:
        return local
    return [
        max(a, b, key=lambda m: (m.num_blocks, m.at_end))
        for a, b in zip(local, shared, strict=True)
    ]
