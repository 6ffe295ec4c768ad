"""Random-weight GGUF models of a real model's shape, for speed measurements only.

No 7B GGUF ships on PyPI, and the device machine that runs the GPU benchmark has no
network. This script makes one there from what the repository can carry:

    skeleton SRC OUT      (here) copy every metadata key of the GGUF `SRC` (tokenizer,
                          chat template, hyperparameters) and the list of its tensors
                          (names, shapes), without their data, into the small GGUF `OUT`.
    build SKEL OUT        (there) write an F16 GGUF with that metadata and random weights:
                          every matrix N(0, 0.02) in F16, every vector (norms) 1.0 in F32.
                          `--shape llama2-7b` replaces the hyperparameters and tensors by
                          Llama-2-7B's (32 layers, hidden 4096, 32 heads, FFN 11008),
                          keeping the skeleton's tokenizer.

Then `llama-quantize OUT.gguf Q.gguf Q4_K_M` gives the quantized model. The weights are
random: the model produces noise. Decode speed depends on shapes and tensor types only,
and the benchmark sends `ignore_eos`, so every request generates exactly max_tokens
tokens, as with real weights. Never use these files for anything about quality.

Matrices are slices of one 64 Mi-value pool of N(0, 0.02) taken at random offsets, so
a 7B model is written in about a minute instead of drawing 7 billion normals.

Needs the `gguf` package: llama.cpp's gguf-py, vendored in the llama-cpp-python sdist
(`PYTHONPATH=<llama.cpp>/gguf-py`).

    python bench/gpu/synth_gguf.py skeleton SmolLM2-135M-Instruct.Q4_1.gguf smollm2.skel.gguf
    python bench/gpu/synth_gguf.py build smollm2.skel.gguf /tmp/llama7b-f16.gguf --shape llama2-7b
    llama-quantize /tmp/llama7b-f16.gguf /tmp/llama7b-q4_k_m.gguf Q4_K_M
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

TENSORS_KEY = "synth.tensors"  # JSON list of [name, numpy shape] in the skeleton only
_POOL_VALUES = 64 * 1024 * 1024
_STD = 0.02
_SKIP_KEYS = ("GGUF.", "general.architecture", "general.file_type", TENSORS_KEY)


@dataclass(frozen=True, slots=True)
class Shape:
    """A llama-architecture model's hyperparameters."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    tied_output: bool = False


SHAPES = {
    "llama2-7b": Shape("llama2-7b", 32, 4096, 32, 32, 11008, 4096),
    "llama2-1b": Shape("llama2-1b", 16, 2048, 32, 8, 5632, 4096),  # TinyLlama-like
    "tiny": Shape("tiny", 2, 64, 4, 2, 128, 2048),  # smoke test of this script
}


def _copy_fields(reader: gguf.GGUFReader, writer: gguf.GGUFWriter, skip: tuple[str, ...]) -> None:
    for key, field in reader.fields.items():
        if key.startswith(skip) or not field.types:
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type)


def skeleton(src: str, out: str) -> None:
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out, arch)
    _copy_fields(reader, writer, ("GGUF.", "general.architecture"))
    tensors = [[t.name, [int(d) for d in reversed(t.shape)]] for t in reader.tensors]
    writer.add_string(TENSORS_KEY, json.dumps(tensors))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    print(f"{out}: {arch}, {len(reader.fields)} keys, {len(tensors)} tensors listed")


def _llama_tensors(shape: Shape, n_vocab: int) -> list[tuple[str, list[int]]]:
    """Tensor names and numpy shapes of a llama model (as convert_hf_to_gguf writes them)."""
    e, ff = shape.n_embd, shape.n_ff
    kv = e // shape.n_head * shape.n_head_kv
    out: list[tuple[str, list[int]]] = [("token_embd.weight", [n_vocab, e])]
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", [e]),
            (p + "attn_q.weight", [e, e]),
            (p + "attn_k.weight", [kv, e]),
            (p + "attn_v.weight", [kv, e]),
            (p + "attn_output.weight", [e, e]),
            (p + "ffn_norm.weight", [e]),
            (p + "ffn_gate.weight", [ff, e]),
            (p + "ffn_up.weight", [ff, e]),
            (p + "ffn_down.weight", [e, ff]),
        ]
    out.append(("output_norm.weight", [e]))
    if not shape.tied_output:
        out.append(("output.weight", [n_vocab, e]))
    return out


def _set_llama_shape(writer: gguf.GGUFWriter, shape: Shape, n_vocab: int) -> None:
    writer.add_name(f"random-weight {shape.name} (speed tests only)")
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.n_embd // shape.n_head)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(shape.rms_eps)


def _vocab_size(reader: gguf.GGUFReader) -> int:
    return len(reader.fields["tokenizer.ggml.tokens"].data)


class _Pool:
    """Matrices cut from one pool of N(0, 0.02) F16 values at random offsets."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        half = self._rng.standard_normal(_POOL_VALUES, dtype=np.float32) * _STD
        self._values = np.concatenate([half, half]).astype(np.float16)

    def matrix(self, numpy_shape: list[int]) -> np.ndarray[Any, np.dtype[np.float16]]:
        n = int(np.prod(numpy_shape))
        parts, done = [], 0
        while done < n:
            take = min(n - done, _POOL_VALUES)
            start = int(self._rng.integers(0, _POOL_VALUES))
            parts.append(self._values[start : start + take])
            done += take
        return np.concatenate(parts).reshape(numpy_shape)


def build(skel: str, out: str, shape_name: str | None, seed: int) -> None:
    started = time.monotonic()
    reader = gguf.GGUFReader(skel)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out, "llama" if shape_name else arch)
    if shape_name:
        if arch != "llama":
            raise SystemExit(f"--shape needs a llama-architecture skeleton, got {arch}")
        shape = SHAPES[shape_name]
        _copy_fields(reader, writer, (*_SKIP_KEYS, "general.name", "llama."))
        _set_llama_shape(writer, shape, _vocab_size(reader))
        tensors = _llama_tensors(shape, _vocab_size(reader))
    else:
        _copy_fields(reader, writer, _SKIP_KEYS)
        tensors = [(n, s) for n, s in json.loads(reader.fields[TENSORS_KEY].contents())]
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for name, numpy_shape in tensors:
        dtype = np.dtype(np.float16 if len(numpy_shape) > 1 else np.float32)
        nbytes = int(np.prod(numpy_shape)) * dtype.itemsize
        writer.add_tensor_info(name, numpy_shape, dtype, nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    pool = _Pool(seed)
    n_params = 0
    for _name, numpy_shape in tensors:
        if len(numpy_shape) > 1:
            data: np.ndarray[Any, Any] = pool.matrix(numpy_shape)
        else:
            data = np.ones(numpy_shape, dtype=np.float32)
        n_params += data.size
        writer.write_tensor_data(data)
    writer.close()
    took = time.monotonic() - started
    print(f"{out}: {len(tensors)} tensors, {n_params / 1e9:.3f} B parameters, {took:.0f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("skeleton", help="metadata and tensor list of a GGUF, no data")
    s.add_argument("src")
    s.add_argument("out")
    b = sub.add_parser("build", help="an F16 GGUF with random weights from a skeleton")
    b.add_argument("skeleton")
    b.add_argument("out")
    b.add_argument("--shape", choices=sorted(SHAPES), default=None)
    b.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.cmd == "skeleton":
        skeleton(args.src, args.out)
    else:
        build(args.skeleton, args.out, args.shape, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
