"""Draft-model speculative decoding: a second, smaller model proposes the drafts.

Owns `DraftModelProposer`: the draft model's own context (a `ModelBackend` over the
draft GGUF, one sequence per running slot), keeping each speculating request's draft KV
in step with its tokens (trimmed to the common prefix, then fed what is new), and
drafting greedily for every speculating request together: one draft `llama_decode` per
draft position, whatever the number of requests. Gates (opt-out, acceptance, batch
size, goodput) are `NgramProposer`'s; the draft's expected acceptance is the request's
rolling acceptance. Does not own verification (EngineCore) or the target's KV.
Thread rule: the engine thread only (the draft context is touched by it alone).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from inferflux.engine.backends.base import DecodeChunk, ModelBackend
from inferflux.engine.speculative import (
    NgramProposer,
    _Candidate,
    _RequestDrafts,
    best_draft_length,
)
from inferflux.errors import EngineError, ModelLoadError
from inferflux.scheduler import Request, RequestId

logger = logging.getLogger(__name__)


def check_same_vocab(target: ModelBackend, draft: ModelBackend, n_vocab: tuple[int, int]) -> None:
    """Raise ModelLoadError unless the two vocabularies agree (size, and the bytes of
    every 61st token): a draft token id must mean the same text to the target."""
    if n_vocab[0] != n_vocab[1]:
        raise ModelLoadError(
            f"the draft model's vocabulary has {n_vocab[1]} tokens, the model's "
            f"{n_vocab[0]}: runtime.speculative_decoding.draft_model must share its tokenizer"
        )
    for token in range(0, n_vocab[0], 61):
        if target.piece(token) != draft.piece(token):
            raise ModelLoadError(
                f"the draft model's token {token} differs from the model's: "
                "runtime.speculative_decoding.draft_model must share its tokenizer"
            )


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(slots=True)
class DraftModelProposer(NgramProposer):
    """A `DraftProposer` whose drafts come from `draft` (see the module docstring).
    `batch_tokens` bounds one draft decode (the draft context's n_batch)."""

    draft: ModelBackend | None = None
    batch_tokens: int = 512
    _cached: dict[RequestId, list[int]] = field(default_factory=dict)  # draft KV tokens
    _seq: dict[RequestId, int] = field(default_factory=dict)  # its draft sequence
    _owner: dict[int, RequestId] = field(default_factory=dict)

    def forget(self, request_id: RequestId) -> None:
        NgramProposer.forget(self, request_id)
        self._release(request_id)

    def _release(self, request_id: RequestId) -> None:
        seq = self._seq.pop(request_id, None)
        self._cached.pop(request_id, None)
        if seq is not None and self._owner.get(seq) == request_id:
            del self._owner[seq]
            assert self.draft is not None
            self.draft.free_seq(seq)

    def _claim(self, request: Request) -> int:
        """The draft sequence of `request`: its slot's number (taken from whoever had it)."""
        seq = request.seq_id
        assert seq is not None  # decoding requests hold a slot
        if self._seq.get(request.request_id) != seq:
            self._release(request.request_id)
        owner = self._owner.get(seq)
        if owner is not None and owner != request.request_id:
            self._release(owner)
        self._seq[request.request_id] = seq
        self._owner[seq] = request.request_id
        return seq

    def _drafts(self, active: list[tuple[Request, _RequestDrafts]]) -> list[_Candidate]:
        rows = len(active)
        chosen: list[tuple[float, Request, int]] = []
        for request, state in active:
            rate = state.tracker.estimate(len(request.output_token_ids))
            k, _ = best_draft_length(
                rate, self.config.max_draft_tokens, rows, rows, self.config.step_cost
            )
            if k > 0:
                chosen.append((rate, request, k))
        if not chosen:
            return []
        drafts = self._generate([(r, k) for _, r, k in chosen])
        # match length 0: not an n-gram draft (MatchPrior neither explores nor learns it)
        return [(rate, r.request_id, drafts[r.request_id], 0) for rate, r, _ in chosen]

    def _generate(self, wanted: list[tuple[Request, int]]) -> dict[RequestId, list[int]]:
        """`_generate_all`; a draft decode that fails costs only this step's drafts (the
        draft KV is dropped and rebuilt next time)."""
        try:
            return self._generate_all(wanted)
        except EngineError as exc:
            logger.warning("draft model decode failed: %s", exc)
            for request, _ in wanted:
                self._release(request.request_id)
            return {r.request_id: [] for r, _ in wanted}

    def close(self) -> None:
        if self.draft is not None:
            self.draft.close()
            self.draft = None

    def _generate_all(self, wanted: list[tuple[Request, int]]) -> dict[RequestId, list[int]]:
        """Greedy drafts of k tokens each: sync every draft sequence, then one batched
        decode per draft position."""
        feeds: list[DecodeChunk] = []
        for request, _ in wanted:
            seq = self._claim(request)
            tokens = request.prompt_token_ids + request.output_token_ids
            cached = self._cached.get(request.request_id, [])
            keep = min(_common_prefix(cached, tokens), len(tokens) - 1)
            assert self.draft is not None
            if not self.draft.trim_seq(seq, keep):
                keep = 0
            feeds.append((seq, tokens[keep:], keep, 1))
            self._cached[request.request_id] = tokens
        nexts = self._feed(feeds)
        drafts: dict[RequestId, list[int]] = {r.request_id: [] for r, _ in wanted}
        live = list(zip(wanted, nexts, strict=True))
        while live:
            for (request, _), token in live:
                drafts[request.request_id].append(token)
            live = [(w, t) for w, t in live if len(drafts[w[0].request_id]) < w[1]]
            if not live:
                break
            step: list[DecodeChunk] = []
            for (request, _), token in live:
                cached = self._cached[request.request_id]
                step.append((self._seq[request.request_id], [token], len(cached), 1))
                cached.append(token)
            tokens = self._feed(step)
            live = [(w, t) for (w, _), t in zip(live, tokens, strict=True)]
        return drafts

    def _feed(self, chunks: list[DecodeChunk]) -> list[int]:
        """Decode `chunks` (split to fit the batch), the argmax after each chunk's end."""
        assert self.draft is not None
        pieces: list[tuple[int, DecodeChunk]] = []  # (chunk index, piece)
        for i, (seq, tokens, start, _) in enumerate(chunks):
            for at in range(0, len(tokens), self.batch_tokens):
                part = tokens[at : at + self.batch_tokens]
                last = at + len(part) == len(tokens)
                pieces.append((i, (seq, part, start + at, 1 if last else 0)))
        out = [0] * len(chunks)
        batch: list[tuple[int, DecodeChunk]] = []
        size = 0
        for item in [*pieces, None]:
            if item is None or size + len(item[1][1]) > self.batch_tokens:
                if batch:
                    rows = self.draft.decode([c for _, c in batch])
                    for (i, c), row in zip(batch, rows, strict=True):
                        if c[3]:
                            out[i] = self.draft.logprobs(row, [0], 1)[0][1][0][0]
                batch, size = [], 0
            if item is not None:
                batch.append(item)
                size += len(item[1][1])
        return out
