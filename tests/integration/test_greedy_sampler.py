"""The greedy fast path of `Sampler` (a numpy argmax instead of llama.cpp's chain) against
the chain itself, on real logits of SmolLM2: same tokens, and the chain still decides when
the argmax is a token it would bias away (ignore_eos)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import llama_cpp as ll
import numpy as np
import pytest

from inferflux.engine.backends.base import SamplerSpec
from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaCppBackend
from inferflux.engine.backends.llama_cpp_sampler import Sampler

pytestmark = pytest.mark.model

N_SEQ = 6


def _spec(**changes: object) -> SamplerSpec:
    fields: dict[str, object] = {
        "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": 1,
        "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "penalty_last_n": 64, "logit_bias": (), "ignore_eos": False,
    }  # fmt: skip
    return SamplerSpec(**{**fields, **changes})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def backend(smollm2_model_path: str) -> Iterator[LlamaCppBackend]:
    engine = LlamaCppBackend(ContextConfig(smollm2_model_path, 256, N_SEQ, 128, 2, 2, False))
    yield engine
    engine.close()


def _decode(backend: LlamaCppBackend, step: int) -> list[int]:
    """One token for each sequence (different tokens, so rows differ); the rows."""
    if step == 0:
        for seq in range(N_SEQ):
            backend.free_seq(seq)
    return backend.decode([(s, [100 + 37 * s + step], step, 1) for s in range(N_SEQ)])


def test_plain_greedy_takes_the_fast_path_and_matches_the_chain(backend):
    fast = [backend.make_sampler(_spec()) for _ in range(N_SEQ)]
    chain = [backend.make_sampler(_spec()) for _ in range(N_SEQ)]
    for sampler in chain:
        sampler.argmax_defers_to = None  # force llama.cpp's chain
    assert all(s.argmax_defers_to == frozenset() for s in fast)
    for step in range(4):
        rows = _decode(backend, step)
        got = [backend.sample(fast[i], rows[i]) for i in range(N_SEQ)]
        want = [backend.sample(chain[i], rows[i]) for i in range(N_SEQ)]
        assert got == want
    for sampler in fast + chain:
        sampler.close()


@pytest.mark.parametrize(
    ("changes", "fast"),
    [
        ({"temperature": 0.7}, False),
        ({"repeat_penalty": 1.3}, False),
        ({"logit_bias": ((5, 2.0),)}, False),
        ({"ignore_eos": True}, True),
    ],
)
def test_only_plain_greedy_skips_the_chain(backend, changes, fast):
    sampler = backend.make_sampler(_spec(**changes))
    assert (sampler.argmax_defers_to is not None) is fast
    sampler.close()


def test_an_end_of_generation_argmax_goes_back_to_the_chain_under_ignore_eos(backend):
    eog = min(backend.eog_token_ids)
    sampler = backend.make_sampler(_spec(ignore_eos=True))
    assert isinstance(sampler, Sampler) and eog in (sampler.argmax_defers_to or ())
    rows = _decode(backend, 0)
    logits = np.ctypeslib.as_array(
        ll.llama_get_logits_ith(backend._ctx, rows[0]), (backend.n_vocab,)
    )
    runner_up = int(
        np.argmax(
            np.where(
                np.isin(np.arange(backend.n_vocab), list(backend.eog_token_ids)), -math.inf, logits
            )
        )
    )
    logits[eog] = float(logits.max()) + 10.0  # the model "wants" to stop
    assert backend.sample(sampler, rows[0]) == runner_up
    sampler.close()
