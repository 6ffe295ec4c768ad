"""The GGUF header reader, on small GGUF files written byte by byte here."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from inferflux.engine.gguf_metadata import read_gguf_metadata
from inferflux.errors import ModelLoadError


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _kv(key: str, value_type: int, payload: bytes) -> bytes:
    return _string(key) + struct.pack("<I", value_type) + payload


def _tensor(name: str, dims: list[int]) -> bytes:
    shape = b"".join(struct.pack("<Q", d) for d in dims)
    return _string(name) + struct.pack("<I", len(dims)) + shape + struct.pack("<IQ", 2, 0)


def _gguf(values: list[bytes], tensors: list[bytes], magic: bytes = b"GGUF") -> bytes:
    header = magic + struct.pack("<IQQ", 3, len(tensors), len(values))
    return header + b"".join(values) + b"".join(tensors)


def _sample() -> bytes:
    tokens = struct.pack("<IQ", 8, 3) + _string("a") + _string("bb") + _string("<s>")
    scores = struct.pack("<IQ", 6, 2) + struct.pack("<ff", 0.5, -1.0)
    return _gguf(
        [
            _kv("general.architecture", 8, _string("llama")),
            _kv("general.file_type", 4, struct.pack("<I", 15)),
            _kv("llama.context_length", 4, struct.pack("<I", 2048)),
            _kv("llama.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-5)),
            _kv("tokenizer.ggml.add_bos_token", 7, struct.pack("<?", True)),
            _kv("tokenizer.ggml.tokens", 9, tokens),
            _kv("tokenizer.ggml.scores", 9, scores),
            _kv("general.parameter_seed", 11, struct.pack("<q", -7)),
        ],
        [_tensor("token_embd.weight", [64, 3]), _tensor("output_norm.weight", [64])],
    )


def test_reads_scalars_skips_arrays_and_counts_parameters(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(_sample())
    meta = read_gguf_metadata(path)
    assert meta.values["general.architecture"] == "llama"
    assert meta.values["llama.context_length"] == 2048
    assert meta.values["llama.attention.layer_norm_rms_epsilon"] == 1e-05  # float32, tidied
    assert meta.values["tokenizer.ggml.add_bos_token"] is True
    assert (
        meta.values["tokenizer.ggml.tokens"] is None
        and meta.values["tokenizer.ggml.scores"] is None
    )
    assert meta.values["general.parameter_seed"] == -7
    assert meta.num_parameters == 64 * 3 + 64
    assert meta.file_type == 15 and meta.quantization_name == "Q4_K_M"


def test_unknown_file_type_is_named_unknown(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(_gguf([_kv("general.file_type", 4, struct.pack("<I", 999))], []))
    assert read_gguf_metadata(path).quantization_name == "unknown"
    path.write_bytes(_gguf([], []))
    assert read_gguf_metadata(path).quantization_name == "unknown"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        _gguf([], [], magic=b"GGML"),
        _sample()[:60],  # cut inside the key/values
        _gguf([_kv("x", 42, b"")], []),  # unknown value type
    ],
)
def test_invalid_files_raise_model_load_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(ModelLoadError, match="cannot read the GGUF header"):
        read_gguf_metadata(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError):
        read_gguf_metadata(tmp_path / "missing.gguf")
