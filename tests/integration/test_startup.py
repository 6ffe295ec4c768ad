"""`inferflux serve` exits non-zero with a clear message when no worker can start."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.integration.server_process import INFERFLUX, free_port

pytestmark = [pytest.mark.model, pytest.mark.server]


def test_a_context_that_cannot_be_allocated_exits_1_naming_the_fix() -> None:
    env = {
        **os.environ,
        # 65536 cells x 64 sequences x 23 KB is ~96 GB of KV: more than this machine has
        "INFERFLUX_MODEL__CTX_SIZE": "65536",
        "INFERFLUX_SCHEDULER__MAX_NUM_SEQS": "64",
    }
    done = subprocess.run(
        [INFERFLUX, "serve", "--port", str(free_port())],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith("inferflux: no worker could load the model")
    assert "lower model.ctx_size or scheduler.max_num_seqs" in last_line
    assert "Traceback" not in done.stderr
