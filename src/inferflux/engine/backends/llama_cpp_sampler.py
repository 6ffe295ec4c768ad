"""Per-sequence sampling on llama.cpp: a sampler chain, plus an optional grammar constraint.

Owns `Sampler`: the llama.cpp chain (logit_bias → penalties → top_k → top_p → min_p → temp
→ dist, or greedy) and, for a constrained sequence, how the constraint meets the chain.
Does not own the logits (the backend's context) or what a grammar is (engine/grammar.py).

Constrained sampling, "sample, then verify": the chain samples from the raw logits and
the matcher checks that one token (microseconds). Only when the grammar rejects it is the
full allowed-token mask computed, written into the row's logits as -inf, and the chain
run again. The accepted token is drawn from the masked distribution either way (for
greedy exactly the masked argmax), and while the model already follows the grammar, which
is most steps, no mask is computed at all. With penalties on, the chain would record the
rejected token in its penalty history, so such sequences mask first, every step.

Thread rule: a Sampler is used by the worker thread that owns the context.
"""

from __future__ import annotations

import math
from typing import Any

import llama_cpp as ll
import numpy as np

from inferflux.engine.backends.base import SamplerSpec
from inferflux.engine.grammar import GrammarMatcher
from inferflux.errors import EngineError


class LogitMasker:
    """Writes a constraint's allowed-token mask into a logits row: -inf where forbidden.

    JSON masks are mostly lopsided: a handful of tokens allowed (structure), or nearly all
    (inside a string). Then only the minority side is written: keep the few allowed
    logits and fill the rest, or set the few forbidden ones (75–90 µs for Gemma's 262k
    tokens). A mixed mask becomes additive biases (0 or -inf) by a table lookup and one
    vectorised add (0.34 ms; a masked `copyto` takes up to 1.3 ms). Measured here.
    Scratch buffers are reused (one masker per context, worker thread only).
    """

    _BIAS = np.array([-np.inf, 0.0], dtype=np.float32)

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self._words = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
        self._bias = np.empty(n_vocab, dtype=np.float32)

    def apply(self, matcher: GrammarMatcher, logits_ptr: Any) -> None:  # Any: float*
        """Mask the row at `logits_ptr`; raises EngineError when nothing is allowed."""
        matcher.fill_mask(self._words)
        bits = np.unpackbits(self._words.view(np.uint8), count=self.n_vocab, bitorder="little")
        allowed = bits.view(np.bool_)
        n_allowed = int(np.count_nonzero(allowed))
        if n_allowed == 0:
            raise EngineError("the constraint admits no next token")
        logits = np.ctypeslib.as_array(logits_ptr, shape=(self.n_vocab,))
        lopsided = self.n_vocab // 8
        if n_allowed <= lopsided:
            ids = np.flatnonzero(allowed)
            kept = logits[ids]
            logits.fill(-np.inf)
            logits[ids] = kept
        elif n_allowed >= self.n_vocab - lopsided:
            logits[np.flatnonzero(~allowed)] = -np.inf
        else:
            np.take(self._BIAS, bits, out=self._bias)
            np.add(logits, self._bias, out=logits)


class Sampler:
    """One sequence's sampler chain, and its grammar matcher when constrained.

    temperature 0 ends the chain with greedy. `ignore_eos` biases every end-of-generation
    token to -inf, as llama-server does, except under a constraint: a complete grammar
    must be able to end.

    Plain greedy (temperature 0, no penalties, no constraint, no logit_bias but
    ignore_eos's) skips the chain: a numpy argmax over the row. The chain copies the whole
    row into a candidate array first: 0.31 ms per row for Gemma's 262k vocabulary against
    0.055 ms for the argmax, same tokens (bench/sampling_cost.py; ≈8 ms saved per step of
    32 sequences, about 4% of such a step on 2 cores). The argmax picks
    the first maximum, as llama.cpp's greedy sampler does; when it lands on a token the
    chain would bias away (an end-of-generation token under ignore_eos), the chain decides.
    """

    def __init__(
        self,
        spec: SamplerSpec,
        n_vocab: int,
        eog_token_ids: frozenset[int],
        matcher: GrammarMatcher | None = None,
    ) -> None:
        self.chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        self.matcher = matcher
        self.n_vocab = n_vocab
        penalties = bool(
            spec.repeat_penalty != 1.0 or spec.presence_penalty or spec.frequency_penalty
        )
        # sample, then verify (module docstring); penalties would record a rejected token
        self.verify_first = not penalties
        bias = dict(spec.logit_bias)
        if spec.ignore_eos and matcher is None:
            bias.update(dict.fromkeys(eog_token_ids, -math.inf))
        plain = spec.temperature <= 0.0 and not penalties and matcher is None
        # argmax tokens the chain must judge (biased ones); None: always use the chain
        self.argmax_defers_to: frozenset[int] | None = (
            frozenset(bias) if plain and not spec.logit_bias else None
        )
        if bias:
            arr = (ll.llama_logit_bias * len(bias))(
                *(ll.llama_logit_bias(token=t, bias=b) for t, b in bias.items())
            )
            self._add(ll.llama_sampler_init_logit_bias(n_vocab, len(bias), arr))
        if penalties:
            self._add(
                ll.llama_sampler_init_penalties(
                    n_vocab,  # NOTE: the vendored llama.h of 0.3.36 still takes n_vocab first
                    spec.penalty_last_n,
                    spec.repeat_penalty,
                    spec.frequency_penalty,
                    spec.presence_penalty,
                )
            )
        self._add_selection(spec)

    def _add_selection(self, spec: SamplerSpec) -> None:
        if spec.temperature <= 0.0:
            self._add(ll.llama_sampler_init_greedy())
            return
        if spec.top_k > 0:
            self._add(ll.llama_sampler_init_top_k(spec.top_k))
        if spec.top_p < 1.0:
            self._add(ll.llama_sampler_init_top_p(spec.top_p, 1))
        if spec.min_p > 0.0:
            self._add(ll.llama_sampler_init_min_p(spec.min_p, 1))
        self._add(ll.llama_sampler_init_temp(spec.temperature))
        self._add(ll.llama_sampler_init_dist(spec.seed & 0xFFFFFFFF))

    def _add(self, sampler: Any) -> None:  # Any: llama_sampler*
        ll.llama_sampler_chain_add(self.chain, sampler)

    @property
    def constraint_complete(self) -> bool:
        """True once the constraint admits no further token (False when unconstrained)."""
        return self.matcher is not None and self.matcher.complete

    def sample(self, ctx: Any, row: int, masker: LogitMasker) -> int:  # Any: context*
        """A token from logits row `row`, allowed by the constraint if there is one (module
        docstring). May overwrite the row's logits with -inf where the constraint forbids
        (`masker`). Raises EngineError when the constraint admits nothing."""
        if self.argmax_defers_to is not None:
            logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, row), (self.n_vocab,))
            token = int(logits.argmax())
            if token not in self.argmax_defers_to:
                return token
        if self.matcher is None:
            return int(ll.llama_sampler_sample(self.chain, ctx, row))
        if self.verify_first:
            token = int(ll.llama_sampler_sample(self.chain, ctx, row))
            if self.matcher.allows(token):
                self.matcher.consume(token)
                return token
        masker.apply(self.matcher, ll.llama_get_logits_ith(ctx, row))
        token = int(ll.llama_sampler_sample(self.chain, ctx, row))
        self.matcher.consume(token)
        return token

    def close(self) -> None:
        """Free the chain (and the samplers it owns)."""
        if self.chain:
            ll.llama_sampler_free(self.chain)
            self.chain = None
