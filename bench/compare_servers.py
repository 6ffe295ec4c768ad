"""InferFlux vs llama-server vs llama-cpp-python's server, side by side (bench/compare/).

    .venv/bin/python bench/compare_servers.py                    # everything (`make bench`)
    .venv/bin/python bench/compare_servers.py --models smollm2 --levels 1,8 \\
        --servers inferflux,llama-server --endpoints chat --no-agent

The first run builds llama-server (minutes) and a llama-cpp-python venv under
.cache/compare/. Results: bench/results/compare.{json,md}; `--append BENCHMARKS.md`.
"""

from __future__ import annotations

import sys

from compare.runner import main

if __name__ == "__main__":
    sys.exit(main())
