"""libllama is loaded before numpy and pyzmq in every serving process.

With one CUDA build of llama-cpp-python, a process that had imported numpy or pyzmq
before it loaded `libllama` segfaulted in `llama_model_load_from_file` (BENCHMARKS.md,
"GPU (issue 10)"); loading llama_cpp first avoided it. engine/__init__.py imports the
llama.cpp backend first. Each check runs in a fresh interpreter with a meta-path finder
that notes, at the first import of numpy and of zmq, whether `llama_cpp.llama_cpp` has
already loaded the library (its `_lib`). It needs no GPU: it checks the order, which is
the fix; that the order avoids the crash was seen on the GPU machine of issue 10.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src"

_PROBE = """
import importlib, importlib.abc, json, sys
loaded_first = {}
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in ("numpy", "zmq") and top not in loaded_first:
            lib = sys.modules.get("llama_cpp.llama_cpp")
            loaded_first[top] = lib is not None and hasattr(lib, "_lib")
        return None
sys.meta_path.insert(0, Watch())
for module in sys.argv[1:]:
    importlib.import_module(module)
print(json.dumps(loaded_first))
"""


@pytest.mark.parametrize(
    "modules",
    [
        # a spawned worker: the console script's module, then the Process target's module
        ("inferflux.cli.main", "inferflux.engine.worker"),
        # the API process of `inferflux serve` (its tokenizer loads the model too)
        ("inferflux.cli.serve",),
        ("inferflux.api",),
    ],
)
def test_libllama_is_loaded_before_numpy_and_zmq(modules: tuple[str, ...]) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *modules],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    loaded_first = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded_first == {"numpy": True, "zmq": True}, (modules, loaded_first)


def test_the_worker_process_target_lives_under_the_engine_package() -> None:
    """The order holds in a spawned worker because unpickling its target imports the
    `inferflux.engine` package (whose __init__ loads libllama) before anything else."""
    from inferflux.engine.worker import worker_process_main

    assert worker_process_main.__module__.startswith("inferflux.engine.")
