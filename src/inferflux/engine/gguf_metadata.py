"""Reading a GGUF file's header: its metadata key/values and its parameter count.

Owns: a small pure-Python parser of the GGUF header (magic, version 2/3, key/value pairs,
tensor infos), little-endian files only, memory-mapped so that skipping a 262k-entry
token array costs milliseconds. Does not read tensor data and never imports llama_cpp
(the API process uses it to describe the served model, e.g. Ollama's `/api/show`).

Array values are not kept: they hold vocabularies and merges (megabytes) and are
reported as None, as Ollama does without `verbose`.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from inferflux.errors import ModelLoadError

GgufScalar = int | float | bool | str

_MAGIC = b"GGUF"
_FLOAT32, _STRING, _ARRAY = 6, 8, 9
_MAX_ARRAY_DEPTH = 16  # real files nest at most 1; deeper is a crafted file (RecursionError)
_SCALAR_FORMATS: dict[int, str] = {
    0: "<B",  # uint8
    1: "<b",  # int8
    2: "<H",  # uint16
    3: "<h",  # int16
    4: "<I",  # uint32
    5: "<i",  # int32
    6: "<f",  # float32
    7: "<?",  # bool
    10: "<Q",  # uint64
    11: "<q",  # int64
    12: "<d",  # float64
}
# llama.cpp's `llama_ftype` (general.file_type) → the name Ollama shows as quantization_level.
FILE_TYPE_NAMES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
}


@dataclass(frozen=True, slots=True)
class GgufMetadata:
    """The header of one GGUF file. `values` maps each key to its scalar (arrays: None)."""

    values: dict[str, GgufScalar | None]
    num_parameters: int  # sum over tensors of the product of their dimensions

    @property
    def file_type(self) -> int | None:
        value = self.values.get("general.file_type")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def architecture(self) -> str:
        value = self.values.get("general.architecture")
        return value if isinstance(value, str) else "unknown"

    def arch_int(self, key: str) -> int:
        """`<architecture>.<key>` as an int; 0 when absent or not an integer."""
        value = self.values.get(f"{self.architecture}.{key}")
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    @property
    def n_experts(self) -> int:
        """MoE experts per layer; 0 for a dense model."""
        return self.arch_int("expert_count")

    @property
    def n_active_experts(self) -> int:
        """MoE experts used per token; 0 for a dense model."""
        return self.arch_int("expert_used_count") if self.n_experts else 0

    @property
    def has_chat_template(self) -> bool:
        return isinstance(self.values.get("tokenizer.chat_template"), str)

    @property
    def quantization_name(self) -> str:
        """`Q4_K_M`, `F16`, ...; `unknown` when the file does not say."""
        file_type = self.file_type
        return "unknown" if file_type is None else FILE_TYPE_NAMES.get(file_type, "unknown")


class _Reader:
    """A cursor over the mapped file; every read checks the bounds."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.offset = 0

    def unpack(self, fmt: str) -> object:
        size = struct.calcsize(fmt)
        if self.offset + size > len(self.data):
            raise ValueError("the file ends inside its header")
        (value,) = struct.unpack_from(fmt, self.data, self.offset)
        self.offset += size
        return value

    def uint(self, fmt: str) -> int:
        value = self.unpack(fmt)
        assert isinstance(value, int)  # NOTE: only called with integer formats
        return value

    def string(self) -> str:
        length = self.uint("<Q")
        end = self.offset + length
        if end > len(self.data):
            raise ValueError("a string runs past the end of the file")
        text = bytes(self.data[self.offset : end]).decode("utf-8", errors="replace")
        self.offset = end
        return text

    def skip_string(self) -> None:
        length = self.uint("<Q")
        self.offset += length

    def value(self, value_type: int) -> GgufScalar | None:
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            self.skip_array()
            return None
        fmt = _SCALAR_FORMATS.get(value_type)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {value_type}")
        value = self.unpack(fmt)
        assert isinstance(value, int | float | bool)  # NOTE: struct gives these for our formats
        if value_type == _FLOAT32:
            return float(f"{value:.7g}")  # 1e-05, not 9.999999747378752e-06
        return value

    def skip_array(self, depth: int = 0) -> None:
        if depth > _MAX_ARRAY_DEPTH:
            raise ValueError(f"arrays nested more than {_MAX_ARRAY_DEPTH} deep")
        item_type = self.uint("<I")
        count = self.uint("<Q")
        if item_type == _STRING:
            for _ in range(count):
                self.skip_string()
        elif item_type == _ARRAY:
            for _ in range(count):
                self.skip_array(depth + 1)
        elif item_type in _SCALAR_FORMATS:
            self.offset += count * struct.calcsize(_SCALAR_FORMATS[item_type])
        else:
            raise ValueError(f"unknown GGUF array item type {item_type}")
        if self.offset > len(self.data):
            raise ValueError("an array runs past the end of the file")


def _parse(reader: _Reader) -> GgufMetadata:
    if bytes(reader.data[:4]) != _MAGIC:
        raise ValueError("not a GGUF file (bad magic)")
    reader.offset = 4
    version = reader.uint("<I")
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    num_tensors = reader.uint("<Q")
    num_values = reader.uint("<Q")
    values: dict[str, GgufScalar | None] = {}
    for _ in range(num_values):
        key = reader.string()
        values[key] = reader.value(reader.uint("<I"))
    num_parameters = 0
    for _ in range(num_tensors):
        reader.skip_string()
        count = 1
        for _ in range(reader.uint("<I")):
            count *= reader.uint("<Q")
        reader.offset += 4 + 8  # ggml type, data offset
        num_parameters += count
    return GgufMetadata(values=values, num_parameters=num_parameters)


def read_gguf_metadata(path: str | Path) -> GgufMetadata:
    """Parse the header of the GGUF file at `path` (blocking: run it off the event loop).

    Raises ModelLoadError naming the path when the file is missing or not a valid GGUF.
    """
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(_Reader(data))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read the GGUF header of {path}: {exc}") from None
