"""A tiny llama-architecture GGUF with random weights, written with the `gguf` package.

No F16 model is shipped, so quantization tests make one: SmolLM2's tokenizer (copied from
the real GGUF of the test fixtures, so text encodes and decodes) over 2 layers of random
weights, n_embd 64 (rows a multiple of 32, as Q8_0 and Q4_0 need). Random weights still
generate tokens, which is all a test of loading and serving needs.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

_COPIED_PREFIXES = ("tokenizer.",)


def write_tiny_llama(
    path: Path, tokenizer_source: str, *, dtype: str = "F16", n_embd: int = 64, seed: int = 0
) -> Path:
    """Write the model to `path` with 2D weights in `dtype` (F16 or F32); returns `path`."""
    reader = gguf.GGUFReader(tokenizer_source)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    n_layer, n_head, n_head_kv, n_ff = 2, 4, 2, 2 * n_embd
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-random-llama")
    writer.add_context_length(512)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(1 if dtype == "F16" else 0)
    for name, field in reader.fields.items():
        if name.startswith(_COPIED_PREFIXES):
            sub_type = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
    rng = np.random.default_rng(seed)
    weight_type = np.float16 if dtype == "F16" else np.float32

    def add(name: str, *shape: int) -> None:
        data = rng.normal(0, 0.02, size=shape)
        writer.add_tensor(name, data.astype(weight_type if len(shape) > 1 else np.float32))

    add("token_embd.weight", n_vocab, n_embd)
    add("output_norm.weight", n_embd)
    n_embd_kv = n_embd // n_head * n_head_kv
    for i in range(n_layer):
        add(f"blk.{i}.attn_norm.weight", n_embd)
        add(f"blk.{i}.attn_q.weight", n_embd, n_embd)
        add(f"blk.{i}.attn_k.weight", n_embd_kv, n_embd)
        add(f"blk.{i}.attn_v.weight", n_embd_kv, n_embd)
        add(f"blk.{i}.attn_output.weight", n_embd, n_embd)
        add(f"blk.{i}.ffn_norm.weight", n_embd)
        add(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        add(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        add(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
