"""Per-sequence sampling on llama.cpp: a sampler chain, plus an optional grammar constraint.

Owns `Sampler`: the llama.cpp chain (logit_bias, then llama.cpp's default order: penalties
→ DRY → top-n-sigma → top_k → typical → top_p → min_p → XTC → temperature (dynamic with
`dynatemp_range`) → dist, or a request's own `samplers` order; Mirostat 1/2: temperature
→ mirostat; greedy: penalties → DRY → argmax) and, for a constrained sequence, how the
constraint meets the chain.
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

import ctypes
import math
from typing import Any

import llama_cpp as ll
import numpy as np

from inferflux.engine.backends.base import DEFAULT_SAMPLER_ORDER, SamplerSpec
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
        *,
        vocab: Any = None,  # llama_vocab* (the DRY sampler tokenizes its breakers)
        n_ctx: int = 0,  # what a `last_n` of -1 means
    ) -> None:
        self.chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        self.matcher = matcher
        self.n_vocab = n_vocab
        self.spec = spec
        self._vocab = vocab
        self._n_ctx = n_ctx
        penalties = bool(
            spec.repeat_penalty != 1.0 or spec.presence_penalty or spec.frequency_penalty
        )
        self._penalties = penalties
        self._dry = spec.dry_multiplier > 0.0 and spec.dry_penalty_last_n != 0
        # sample, then verify (module docstring): a sampler with history (penalties, DRY,
        # Mirostat's running estimate) would record a rejected token, so those mask first
        self.verify_first = not (penalties or self._dry or spec.mirostat)
        bias = dict(spec.logit_bias)
        if spec.ignore_eos and matcher is None:
            bias.update(dict.fromkeys(eog_token_ids, -math.inf))
        plain = spec.temperature <= 0.0 and not penalties and not self._dry and matcher is None
        # argmax tokens the chain must judge (biased ones); None: always use the chain
        self.argmax_defers_to: frozenset[int] | None = (
            frozenset(bias) if plain and not spec.logit_bias else None
        )
        if bias:
            arr = (ll.llama_logit_bias * len(bias))(
                *(ll.llama_logit_bias(token=t, bias=b) for t, b in bias.items())
            )
            self._add(ll.llama_sampler_init_logit_bias(n_vocab, len(bias), arr))
        if spec.temperature <= 0.0:  # greedy: what changes logits by history, then argmax
            self._add_history_samplers()
            self._add(ll.llama_sampler_init_greedy())
        elif spec.mirostat:  # Mirostat replaces the others, as in llama.cpp
            self._add(ll.llama_sampler_init_temp(spec.temperature))
            seed = spec.seed & 0xFFFFFFFF
            tau, eta = spec.mirostat_tau, spec.mirostat_eta
            if spec.mirostat == 1:
                self._add(ll.llama_sampler_init_mirostat(n_vocab, seed, tau, eta, 100))
            else:
                self._add(ll.llama_sampler_init_mirostat_v2(seed, tau, eta))
        else:
            for name in spec.samplers if spec.samplers is not None else DEFAULT_SAMPLER_ORDER:
                self._add_named(name)
            self._add(ll.llama_sampler_init_dist(spec.seed & 0xFFFFFFFF))

    def _last_n(self, last_n: int) -> int:
        return self._n_ctx if last_n < 0 else last_n

    def _add_history_samplers(self) -> None:
        self._add_named("penalties")
        self._add_named("dry")

    def _add_named(self, name: str) -> None:  # noqa: C901 (one branch per sampler)
        """Add sampler `name` (DEFAULT_SAMPLER_ORDER's names) when its settings turn it on."""
        spec = self.spec
        if name == "penalties" and self._penalties:
            self._add(
                ll.llama_sampler_init_penalties(
                    self.n_vocab,  # NOTE: the vendored llama.h of 0.3.36 takes n_vocab first
                    self._last_n(spec.penalty_last_n),
                    spec.repeat_penalty,
                    spec.frequency_penalty,
                    spec.presence_penalty,
                )
            )
        elif name == "dry" and self._dry and self._vocab is not None:
            self._add_dry()
        elif name == "top_n_sigma" and spec.top_n_sigma > 0.0:
            self._add(ll.llama_sampler_init_top_n_sigma(spec.top_n_sigma))
        elif name == "top_k" and spec.top_k > 0:
            self._add(ll.llama_sampler_init_top_k(spec.top_k))
        elif name == "typ_p" and spec.typical_p < 1.0:
            self._add(ll.llama_sampler_init_typical(spec.typical_p, 1))
        elif name == "top_p" and spec.top_p < 1.0:
            self._add(ll.llama_sampler_init_top_p(spec.top_p, 1))
        elif name == "min_p" and spec.min_p > 0.0:
            self._add(ll.llama_sampler_init_min_p(spec.min_p, 1))
        elif name == "xtc" and spec.xtc_probability > 0.0:
            seed = (spec.seed + 1) & 0xFFFFFFFF
            self._add(ll.llama_sampler_init_xtc(spec.xtc_probability, spec.xtc_threshold, 1, seed))
        elif name == "temperature":
            if spec.dynatemp_range > 0.0:
                range_, exponent = spec.dynatemp_range, spec.dynatemp_exponent
                self._add(ll.llama_sampler_init_temp_ext(spec.temperature, range_, exponent))
            else:
                self._add(ll.llama_sampler_init_temp(spec.temperature))

    def _add_dry(self) -> None:
        spec = self.spec
        breakers = [b.encode() for b in spec.dry_sequence_breakers]
        array = (ctypes.c_char_p * max(len(breakers), 1))(*breakers)
        self._add(
            ll.llama_sampler_init_dry(
                self._vocab,
                spec.dry_multiplier,
                spec.dry_base,
                spec.dry_allowed_length,
                self._last_n(spec.dry_penalty_last_n),
                array,
                len(breakers),
            )
        )

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
