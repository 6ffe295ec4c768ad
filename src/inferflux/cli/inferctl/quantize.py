"""`inferctl quantize SRC --type LEVEL`: a GGUF quantized down, into the models directory.

Owns: the command's progress display (a spinner per phase: llama.cpp's quantize reports
no progress of its own), its exit codes and its output. The work is the server's own code,
models/quantize.py, so the file lands under the very cache name a `quantization:` in the
manifest or `model.quantization` looks for (`DIR/<stem>.<LEVEL>.<src-sha12>.gguf`), and a
server pointed at the same models directory reuses it instead of quantizing again.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from rich.console import Console

from inferflux.cli.inferctl.client import EXIT_API_ERROR, EXIT_USAGE_ERROR, fail

_PHASES = {
    "hashing": "hashing",
    "reading": "reading the GGUF header",
    "quantizing": "quantizing (llama_model_quantize)",
}


class QuantizeResult(NamedTuple):
    """The file written (or reused), its hash, the level, the source's type."""

    path: Path
    sha256: str
    level: str
    source_type: str
    reused: bool


def quantize(
    src: Path, level: str, dest: Path, sha256: str | None, threads: int, quiet: bool = False
) -> QuantizeResult:
    """Quantize `src` to `level` into `dest` (or find it there). typer.Exit(2) for a
    missing source or a level that would not lower its precision, typer.Exit(1) when the
    source does not verify or llama.cpp refuses it."""
    from inferflux.errors import ModelLoadError, QuantizationRefused
    from inferflux.models.quantize import quantize as run_quantize

    if not src.is_file():
        raise fail(f"{src} is not a file", EXIT_USAGE_ERROR)
    console = Console(stderr=True, quiet=quiet)
    try:
        with console.status(f"{src.name} → {level}") as status:

            def phase(name: str) -> None:
                if name in _PHASES:
                    status.update(f"{src.name} → {level}: {_PHASES[name]}")

            done = run_quantize(src.resolve(), sha256, level, dest, phase, threads)
    except QuantizationRefused as exc:
        raise fail(exc.message, EXIT_USAGE_ERROR) from None
    except ModelLoadError as exc:
        raise fail(exc.message, EXIT_API_ERROR) from None
    return QuantizeResult(done.path, done.sha256, level, done.source_type, done.reused)
