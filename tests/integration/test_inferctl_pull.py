"""`inferctl pull` against the fake Hugging Face Hub on a loopback port (fake_hub.py).

The served "GGUF" files are a few KiB of fake content: `pull` only checks hashes, it never
loads the model.
`.venv/bin/inferctl` runs as a subprocess because huggingface_hub reads HF_ENDPOINT at
import time.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.fake_hub import COMMIT, FakeHub, hub_env, serve_hub

INFERCTL = str(Path(sys.executable).with_name("inferctl"))
REPO = "acme/tiny-GGUF"


@pytest.fixture
def hub() -> Iterator[tuple[FakeHub, str]]:
    files = {"tiny-q8_0.gguf": b"GGUF" + os.urandom(64 * 1024), "README.md": b"# tiny\n"}
    fake = FakeHub({REPO: files, "acme/two-GGUF": {"a.gguf": b"GGUFa", "b.gguf": b"GGUFb"}})
    with serve_hub(fake) as endpoint:
        yield fake, endpoint


def _pull(endpoint: str, tmp_path: Path, *args: str, **extra_env: str):
    env = hub_env(endpoint, tmp_path, **extra_env)
    return subprocess.run(
        [INFERCTL, "pull", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_pull_downloads_verifies_and_records_the_file(hub, tmp_path: Path) -> None:
    fake, endpoint = hub
    dest = tmp_path / "models"
    done = _pull(endpoint, tmp_path, f"{REPO}:tiny-q8_0.gguf", "--dest", str(dest))
    assert done.returncode == 0, done.stderr
    path = dest / REPO / "tiny-q8_0.gguf"
    data = fake.repos[REPO]["tiny-q8_0.gguf"]
    assert path.read_bytes() == data
    assert f"inferflux serve --model {path}" in done.stdout
    assert "matches the hub" in done.stdout
    [entry] = yaml.safe_load((dest / "models.yaml").read_text())
    assert entry == {
        "id": "tiny-q8_0",
        "path": str(path),
        "sha256": hashlib.sha256(data).hexdigest(),
        "source": f"hf://{REPO}/tiny-q8_0.gguf@{COMMIT}",
    }


def test_pull_without_a_file_picks_the_only_gguf_and_reads_the_env_dir(hub, tmp_path) -> None:
    _, endpoint = hub
    dest = tmp_path / "env-models"
    done = _pull(endpoint, tmp_path, REPO, "--json", INFERFLUX_MODELS_DIR=str(dest))
    assert done.returncode == 0, done.stderr
    assert (dest / REPO / "tiny-q8_0.gguf").is_file()
    assert len(yaml.safe_load((dest / "models.yaml").read_text())) == 1
    reply = json.loads(done.stdout)
    assert reply["path"] == str(dest / REPO / "tiny-q8_0.gguf")
    assert reply["verification"] == "matches the hub"


def test_pull_with_several_ggufs_lists_them_and_exits_2(hub, tmp_path: Path) -> None:
    _, endpoint = hub
    done = _pull(endpoint, tmp_path, "acme/two-GGUF", "--dest", str(tmp_path / "m"))
    assert done.returncode == 2
    assert "acme/two-GGUF:a.gguf" in done.stderr and "acme/two-GGUF:b.gguf" in done.stderr


def test_a_sha256_mismatch_deletes_the_file_and_exits_1(hub, tmp_path: Path) -> None:
    fake, endpoint = hub
    fake.lie_about_sha256 = True
    dest = tmp_path / "models"
    done = _pull(endpoint, tmp_path, f"{REPO}:tiny-q8_0.gguf", "--dest", str(dest))
    assert done.returncode == 1
    assert "sha256 mismatch" in done.stderr
    assert not (dest / REPO / "tiny-q8_0.gguf").exists()
    assert not (dest / "models.yaml").exists()


def test_a_missing_file_exits_1_without_a_traceback(hub, tmp_path: Path) -> None:
    _, endpoint = hub
    done = _pull(endpoint, tmp_path, f"{REPO}:nope.gguf", "--dest", str(tmp_path / "m"))
    assert done.returncode == 1
    assert "cannot pull" in done.stderr and "Traceback" not in done.stderr


def test_a_second_pull_of_the_same_file_downloads_nothing(hub, tmp_path: Path) -> None:
    fake, endpoint = hub
    dest = tmp_path / "models"
    for _ in range(2):
        done = _pull(endpoint, tmp_path, f"{REPO}:tiny-q8_0.gguf", "--dest", str(dest))
        assert done.returncode == 0, done.stderr
    assert fake.downloads == [f"/{REPO}/resolve/{COMMIT}/tiny-q8_0.gguf"]
    assert len(yaml.safe_load((dest / "models.yaml").read_text())) == 1
