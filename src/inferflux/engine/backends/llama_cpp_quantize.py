"""Quantizing a GGUF with llama.cpp's `llama_model_quantize`.

Owns the one call into llama.cpp that rewrites a model file at another precision
(`quantize_gguf`). Does not own: which level, the cache name, hashing or the precision
check (models/quantize.py decides all of them).

`llama_model_quantize` has no progress callback: it logs one line per tensor (routed to
Python logging at debug level by `_ensure_backend`) and returns 0 on success. It reads
the source with its own loader and writes the output file itself. Blocking for seconds
to minutes (ctypes releases the GIL): call it on a thread or in a CLI process.
"""

from __future__ import annotations

import ctypes

import llama_cpp as ll

from inferflux.engine.backends.llama_cpp import _ensure_backend
from inferflux.errors import ModelLoadError


def quantize_gguf(src: str, dst: str, ftype: int, num_threads: int = 0) -> None:
    """Write `src` quantized to llama.cpp's `ftype` (a `llama_ftype`) at `dst`.

    `num_threads` 0: every core. Raises ModelLoadError when llama.cpp refuses (it then
    may have left a partial `dst`: the caller writes to a temporary name).
    """
    _ensure_backend()
    params = ll.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = num_threads
    status = ll.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if status != 0:
        raise ModelLoadError(
            f"llama.cpp could not quantize {src} (status {status}): is it a valid GGUF model file?",
            param="quantization",
        )
