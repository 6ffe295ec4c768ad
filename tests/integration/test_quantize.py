"""Quantization on real files: `inferctl quantize` and `model.quantization` at startup.

The source is an F16 llama GGUF with random weights written by the test
(synthetic_gguf.py: SmolLM2's tokenizer, 2 small layers); llama.cpp's
`llama_model_quantize` makes it Q8_0, the header of the output says so, a second run
reuses the cached file, and a server started with `model.quantization: Q8_0` loads the
quantized file and generates with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from inferflux.engine.gguf_metadata import read_gguf_metadata
from inferflux.models.download import file_sha256, read_record
from tests.integration.server_process import INFERFLUX, ServerProcess
from tests.integration.synthetic_gguf import write_tiny_llama

pytestmark = [pytest.mark.model]

INFERCTL = str(Path(sys.executable).with_name("inferctl"))


@pytest.fixture(scope="module")
def f16_model(tmp_path_factory, smollm2_model_path) -> Path:
    folder = tmp_path_factory.mktemp("quantize-source")
    return write_tiny_llama(folder / "tiny.f16.gguf", smollm2_model_path)


def _quantize(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [INFERCTL, "quantize", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_inferctl_quantize_writes_a_q8_0_file_once(f16_model: Path, tmp_path: Path) -> None:
    assert read_gguf_metadata(f16_model).quantization_name == "F16"
    dest = tmp_path / "models"
    done = _quantize(str(f16_model), "--type", "q8_0", "--dest", str(dest), "--json")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    path = Path(reply["path"])
    assert path.parent == dest and path.name.startswith("tiny.f16.Q8_0.")
    assert (reply["level"], reply["source_type"], reply["reused"]) == ("Q8_0", "F16", "False")
    assert read_gguf_metadata(path).quantization_name == "Q8_0"
    assert path.stat().st_size < f16_model.stat().st_size
    assert reply["sha256"] == file_sha256(path) == read_record(path)["sha256"]
    again = _quantize(str(f16_model), "--type", "Q8_0", "--dest", str(dest), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) | {"reused": "True"} == reply | {"reused": "True"}
    assert sorted(p.name for p in dest.iterdir()) == [path.name, path.name + ".source.json"]


def test_inferctl_quantize_refuses_to_raise_precision(smollm2_model_path, tmp_path) -> None:
    done = _quantize(smollm2_model_path, "--type", "Q8_0", "--dest", str(tmp_path / "m"))
    assert done.returncode == 2
    assert "is Q4_1: quantizing it to Q8_0 would not lower its precision" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())


def test_inferctl_quantize_checks_the_given_sha256(f16_model: Path, tmp_path: Path) -> None:
    wrong = "0" * 64
    done = _quantize(str(f16_model), "--type", "Q8_0", "--dest", str(tmp_path), "--sha256", wrong)
    assert done.returncode == 1
    assert "does not match its SHA-256" in done.stderr and "Traceback" not in done.stderr


def test_a_server_refuses_to_quantize_its_default_model_up(tmp_path: Path) -> None:
    env = {**os.environ, "INFERFLUX_MODEL__QUANTIZATION": "Q8_0", "HOME": str(tmp_path)}
    done = subprocess.run(
        [INFERFLUX, "serve"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1
    assert "is Q4_1: quantizing it to Q8_0 would not lower its precision" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.server
def test_a_server_quantizes_its_model_at_startup_and_generates(f16_model, tmp_path) -> None:
    models = tmp_path / "models"
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(f16_model), "id": "tiny", "quantization": "Q8_0"},
                "registry": {"models_dir": str(models)},
            }
        )
    )
    log = tmp_path / "server.log"
    server = ServerProcess("--config", str(config), log_path=log)
    try:
        server.wait_ready(120)
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
        reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1
        show = httpx.post(f"{server.url}/api/show", json={"model": "tiny"}, timeout=30).json()
        assert show["details"]["quantization_level"] == "Q8_0"
    except (RuntimeError, TimeoutError) as exc:
        pytest.fail(f"{exc}:\n{log.read_text(errors='replace')[-4000:]}")
    finally:
        server.close()
    [quantized] = models.glob("tiny.f16.Q8_0.*.gguf")
    assert read_gguf_metadata(quantized).quantization_name == "Q8_0"
    assert "quantized tiny.f16.Q8_0" in log.read_text()
