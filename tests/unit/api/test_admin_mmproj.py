"""POST /v1/admin/models with an `mmproj`: every refusal is OpenAI's error envelope with
the field at fault, and a refused load changes nothing.

The projector files are header-only stand-ins (tests/mmproj_header.py); every load here
is refused before a worker would start (a verification test, not a vision test).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator

import httpx
import pytest

from inferflux.api import create_app
from inferflux.config.settings import Settings
from inferflux.engine.model_verify import SignatureVerifier
from inferflux.models.catalog import Catalog
from inferflux.models.spec import ModelSpec
from tests.asgi_client import running_client
from tests.fakes.engine import FakeEngineClient, FakeTokenizer, fake_model_info
from tests.mmproj_header import serve_file, sha256_hex, write_projector_header
from tests.openai_envelope import assert_envelope

SHA = "ab" * 32
URL = "/v1/admin/models"
LOAD = {"action": "load", "id": "v", "path": "m.gguf", "sha256": SHA}


@pytest.mark.parametrize(
    ("fields", "status", "code", "param", "message"),
    [
        ({"mmproj_sha256": "12"}, 400, None, "mmproj_sha256", None),
        ({"mmproj": "p.gguf"}, 400, None, None, "mmproj_sha256 is required"),
        ({"mmproj_sha256": SHA}, 400, None, None, "mmproj_sha256 is set but mmproj is not"),
        ({"mmproj": "https://h/p.gguf"}, 400, None, None, "set its sha256"),
        ({"mmproj": 7, "mmproj_sha256": SHA}, 400, None, "mmproj", None),
        (
            {"mmproj": "../../etc/passwd", "mmproj_sha256": SHA},
            422,
            "model_verification_failed",
            "mmproj",
            "resolves outside the models folder",
        ),
    ],
)
async def test_refusals(client: httpx.AsyncClient, fields, status, code, param, message) -> None:
    response = await client.post(URL, json={**LOAD, **fields})
    assert_envelope(response, status, code=code)
    error = response.json()["error"]
    assert error["param"] == param
    if message is not None:
        assert message in error["message"]
    assert [m["id"] for m in (await client.get(URL)).json()["data"]] == ["fake-model"]


@pytest.fixture
async def folder_client(tmp_path, smollm2_model_path) -> AsyncIterator[httpx.AsyncClient]:
    """An app whose models folder holds the real SmolLM2 file (m.gguf) and a projector
    stand-in (mmproj.gguf)."""
    os.link(smollm2_model_path, tmp_path / "m.gguf")
    write_projector_header(tmp_path / "mmproj.gguf")
    info = dataclasses.replace(fake_model_info(), path=str(tmp_path / "m.gguf"))
    plan = Catalog(
        default=ModelSpec(info.model_id, tmp_path / "m.gguf", None, is_default=True),
        models_dir=tmp_path,
        verifier=SignatureVerifier((), require=False),
    )
    app = create_app(
        Settings(), engine=FakeEngineClient(), tokenizer=FakeTokenizer(), model_info=info,
        catalog=plan,
    )  # fmt: skip
    async with running_client(app) as client:
        yield client


async def test_a_mismatched_mmproj_hash_refuses_the_load(folder_client, tmp_path) -> None:
    body = {
        **LOAD, "sha256": sha256_hex(tmp_path / "m.gguf"),
        "mmproj": "mmproj.gguf", "mmproj_sha256": "00" * 32,
    }  # fmt: skip
    response = await folder_client.post(URL, json=body)
    assert_envelope(response, 422, code="model_verification_failed")
    error = response.json()["error"]
    assert error["param"] == "mmproj_sha256"
    assert error["message"].startswith(f"mmproj file {tmp_path.resolve() / 'mmproj.gguf'}")
    assert sha256_hex(tmp_path / "mmproj.gguf") in error["message"]  # what it hashes to
    models = {m["id"]: m["state"] for m in (await folder_client.get(URL)).json()["data"]}
    assert models == {"fake-model": "loaded"}  # a refused admin load registers nothing


async def test_a_missing_mmproj_is_a_404(folder_client, tmp_path) -> None:
    body = {
        **LOAD, "sha256": sha256_hex(tmp_path / "m.gguf"),
        "mmproj": "gone.gguf", "mmproj_sha256": SHA,
    }  # fmt: skip
    response = await folder_client.post(URL, json=body)
    assert_envelope(response, 404, code="model_file_not_found")
    error = response.json()["error"]
    assert error["param"] == "mmproj" and "gone.gguf does not exist" in error["message"]


async def test_a_model_for_an_mmproj_is_refused(folder_client, tmp_path) -> None:
    sha = sha256_hex(tmp_path / "m.gguf")
    body = {**LOAD, "sha256": sha, "mmproj": "m.gguf", "mmproj_sha256": sha}
    response = await folder_client.post(URL, json=body)
    assert_envelope(response, 422, code="model_verification_failed")
    assert "not a vision projector GGUF" in response.json()["error"]["message"]


async def test_an_mmproj_url_is_downloaded_then_verified(folder_client, tmp_path) -> None:
    data = write_projector_header(tmp_path / "served" / "p.gguf").read_bytes()
    with serve_file(data, "/p.gguf") as (url, gets):
        body = {**LOAD, "sha256": sha256_hex(tmp_path / "m.gguf"),
                "mmproj": url, "mmproj_sha256": "00" * 32}  # fmt: skip
        response = await folder_client.post(URL, json=body)
    assert gets == ["/p.gguf"]  # fetched by the load, then refused: the hash is wrong
    assert_envelope(response, 422, code="model_verification_failed")
    assert response.json()["error"]["param"] == "mmproj_sha256"
    assert "sha256 mismatch" in response.json()["error"]["message"]
