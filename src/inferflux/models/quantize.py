"""Quantizing a model file down to a level (`Q4_K_M`, `Q8_0`, …), once, into a cache.

Owns: the level names → llama.cpp `llama_ftype` table, the "higher precision" rule (only
F32, F16, BF16 and Q8_0 files are quantized, and only to a lower precision; a file
already at the level is used as it is), the cache name `<stem>.<LEVEL>.<src-sha12>.gguf`
in the models folder with its `.source.json` record (the output's SHA-256, so it is
verified like any model when it loads), and `quantize` / `find_quantized`. The llama.cpp
call itself is engine/backends/llama_cpp_quantize.py.

The source is read through `verified_file`: when its SHA-256 is known, llama.cpp reads
exactly the bytes that were hashed. The output is written under a temporary name, hashed,
then renamed, so the cache never holds a partial file. Blocking: run it on a thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inferflux.config.manifest import QUANTIZATION_LEVELS
from inferflux.engine.gguf_metadata import FILE_TYPE_NAMES, read_gguf_metadata
from inferflux.engine.model_verify import verified_file
from inferflux.errors import QuantizationRefused
from inferflux.models.download import file_sha256, partial_path, read_record, write_record

logger = logging.getLogger(__name__)

# level name → llama_ftype (general.file_type), for the levels config accepts
LEVEL_FTYPES: dict[str, int] = {
    name: ftype for ftype, name in FILE_TYPE_NAMES.items() if name in QUANTIZATION_LEVELS
}
# precision rank of the file types a quantization may start from (higher = more precise);
# every other level ranks 1 (already quantized, never a source)
_SOURCE_RANKS = {"F32": 5, "F16": 4, "BF16": 4, "Q8_0": 3}
_LEVEL_RANKS = {**_SOURCE_RANKS, "Q6_K": 2}

# one phase of the work: "reading", "quantizing", "hashing", "done"
Phase = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Quantized:
    """The file to serve at `level`. `reused`: found in the cache; `path` is the source
    itself when it already was at that level."""

    path: Path
    sha256: str
    level: str
    source_type: str
    reused: bool


def source_type(path: Path | str) -> str:
    """The file type of a GGUF (`F16`, `Q4_K_M`, …; `unknown`) from its header."""
    return read_gguf_metadata(path).quantization_name


def check_level(source: str, level: str, what: str) -> bool:
    """True when `source` (a file type) must be quantized to `level`, False when it
    already is at `level`. Raises QuantizationRefused for anything else."""
    if level not in LEVEL_FTYPES:
        known = ", ".join(sorted(LEVEL_FTYPES))
        raise QuantizationRefused(f"unknown quantization {level!r}: use one of {known}")
    if source == level:
        return False
    if source not in _SOURCE_RANKS or _SOURCE_RANKS[source] <= _LEVEL_RANKS.get(level, 1):
        raise QuantizationRefused(
            f"{what} is {source}: quantizing it to {level} would not lower its precision "
            "(only F32, F16, BF16 and Q8_0 files are quantized down); use a file of higher "
            "precision, or drop `quantization`",
            param="quantization",
        )
    return True


def quantized_path(source: Path, source_sha256: str, level: str, folder: Path) -> Path:
    """The cache name of `source` at `level`: `folder/<stem>.<LEVEL>.<sha12>.gguf`."""
    stem = source.name.removesuffix(".gguf")
    return folder / f"{stem}.{level}.{source_sha256[:12].lower()}.gguf"


def _cache_source(source_sha256: str, level: str) -> str:
    return f"quantize:{source_sha256.lower()}:{level}"


def find_quantized(source: Path, source_sha256: str, level: str, folder: Path) -> Quantized | None:
    """The cached result of an earlier `quantize`, or None. No hashing (the load verifies
    the file against the recorded SHA-256)."""
    target = quantized_path(source, source_sha256, level, folder)
    record = read_record(target)
    if record is None or record.get("source") != _cache_source(source_sha256, level):
        return None
    if not target.is_file():
        return None
    kind = record.get("source_type", "unknown")
    return Quantized(target, record["sha256"], level, kind, reused=True)


def quantize(
    source: Path,
    source_sha256: str | None,
    level: str,
    folder: Path,
    phase: Phase | None = None,
    num_threads: int = 0,
) -> Quantized:
    """`source` at `level`: the cached file, the source itself when it already is at that
    level, or a new quantization into the cache.

    Side effects: writes `quantized_path(...)` and its record. Raises QuantizationRefused
    (not higher precision, unknown level), ModelVerificationFailed (source hash),
    ModelLoadError (not a GGUF, llama.cpp refused).
    """
    report = phase or (lambda _: None)
    source_sha256 = (source_sha256 or _hash(source, report)).lower()
    cached = find_quantized(source, source_sha256, level, folder)
    if cached is not None:
        report("done")
        return cached
    report("reading")
    with verified_file(source, source_sha256) as load_path:
        kind = source_type(load_path)
        if not check_level(kind, level, str(source)):
            report("done")
            return Quantized(source, source_sha256, level, kind, reused=True)
        target = quantized_path(source, source_sha256, level, folder)
        _quantize_into(load_path, target, level, report, num_threads)
    report("hashing")
    sha256 = file_sha256(target)
    write_record(target, sha256, _cache_source(source_sha256, level), source_type=kind)
    report("done")
    return Quantized(target, sha256, level, kind, reused=False)


def _hash(source: Path, report: Phase) -> str:
    report("hashing")
    return file_sha256(source)


def _quantize_into(
    load_path: str, target: Path, level: str, report: Phase, num_threads: int
) -> None:
    """llama_model_quantize into a temporary name, renamed over `target` on success."""
    from inferflux.engine.backends.llama_cpp_quantize import quantize_gguf

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(target)
    report("quantizing")
    started_at = time.monotonic()
    logger.info("quantizing to %s into %s", level, target)
    try:
        quantize_gguf(load_path, str(partial), LEVEL_FTYPES[level], num_threads)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    logger.info("quantized %s to %s in %.1fs", target.name, level, time.monotonic() - started_at)
