"""Which models take images, as each listing says it: /v1/models (`meta.capabilities`,
`architecture.input_modalities`), Ollama's /api/tags (`clip` in `families`) and
/api/show (`vision` in `capabilities`, `projector_info`), LM Studio's `type: vlm`, gRPC
ListModels' `vision`; for a loaded model and for a registered one that is not loaded.

The app runs over the fake engine; the model files are the real SmolLM2 GGUF (listings
read its header) and the mmproj files header-only stand-ins (tests/mmproj_header.py):
nothing loads them, so this is a listing test, not a vision test.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest

from inferflux.api import create_app
from inferflux.config.settings import Settings
from inferflux.engine.model_verify import SignatureVerifier
from inferflux.models.catalog import Catalog
from inferflux.models.spec import ModelSpec
from tests.asgi_client import running_client
from tests.fakes.engine import FakeEngineClient, FakeTokenizer, fake_model_info
from tests.integration.server_process import free_port
from tests.mmproj_header import sha256_hex, write_projector_header


@pytest.fixture
def grpc_port() -> int:
    return free_port()


@pytest.fixture
async def client(tmp_path, smollm2_model_path, grpc_port) -> AsyncIterator[httpx.AsyncClient]:
    """A loaded vision model (the default), a registered vision model that is not loaded
    and a registered text model."""
    model = tmp_path / "m.gguf"
    os.link(smollm2_model_path, model)
    mmproj = write_projector_header(tmp_path / "mmproj.gguf")
    settings = Settings.model_validate(
        {"registry": {"max_resident_models": 1}, "server": {"grpc_port": grpc_port}}
    )
    info = dataclasses.replace(fake_model_info(), path=str(model), mmproj=str(mmproj))
    sha = sha256_hex(model)

    def spec(model_id: str, **fields: object) -> ModelSpec:
        return ModelSpec(model_id, model, sha, source="manifest", **fields)  # type: ignore[arg-type]

    plan = Catalog(
        default=dataclasses.replace(spec(info.model_id, mmproj=mmproj), is_default=True),
        models_dir=tmp_path,
        verifier=SignatureVerifier((), require=False),
        others=(spec("idle-vision", mmproj=mmproj, mmproj_sha256=sha256_hex(mmproj)),
                spec("text")),
    )  # fmt: skip
    app = create_app(
        settings, engine=FakeEngineClient(), tokenizer=FakeTokenizer(), model_info=info,
        catalog=plan,
    )  # fmt: skip
    async with running_client(app) as client:
        yield client


VISION = {"fake-model": True, "idle-vision": True, "text": False}


async def test_openai_models_say_which_take_images(client) -> None:
    cards = {c["id"]: c for c in (await client.get("/v1/models")).json()["data"]}
    assert set(cards) == set(VISION)
    assert cards["fake-model"]["meta"]["loaded"] and not cards["idle-vision"]["meta"]["loaded"]
    for model_id, vision in VISION.items():
        card = cards[model_id]
        expected = ["completion", "vision"] if vision else ["completion"]
        assert card["meta"]["capabilities"] == expected, model_id
        inputs = ["text", "image"] if vision else ["text"]
        assert card["architecture"] == {"input_modalities": inputs, "output_modalities": ["text"]}
    one = (await client.get("/v1/models/idle-vision")).json()
    assert one["meta"]["capabilities"] == ["completion", "vision"]


async def test_ollama_tags_list_clip_among_a_vision_model_families(client) -> None:
    tags = {t["name"]: t for t in (await client.get("/api/tags")).json()["models"]}
    assert set(tags) == {f"{name}:latest" for name in VISION}
    for model_id, vision in VISION.items():
        families = tags[f"{model_id}:latest"]["details"]["families"]
        assert families == (["llama", "clip"] if vision else ["llama"]), model_id


@pytest.mark.parametrize("model_id", list(VISION))
async def test_ollama_show_says_vision_and_describes_the_projector(client, model_id) -> None:
    shown = (await client.post("/api/show", json={"model": model_id})).json()
    if VISION[model_id]:
        assert shown["capabilities"] == ["completion", "tools", "vision"]
        projector = shown["projector_info"]
        assert projector["general.architecture"] == "clip"
        assert projector["clip.has_vision_encoder"] is True
        assert projector["clip.projector_type"] == "idefics3"
    else:
        assert shown["capabilities"] == ["completion", "tools"]
        assert "projector_info" not in shown


async def test_lmstudio_calls_a_vision_model_a_vlm(client) -> None:
    models = {m["id"]: m for m in (await client.get("/api/v0/models")).json()["data"]}
    assert {i: m["type"] for i, m in models.items()} == {
        i: "vlm" if vision else "llm" for i, vision in VISION.items()
    }


async def test_the_admin_listing_names_the_mmproj(client, tmp_path) -> None:
    models = {m["id"]: m for m in (await client.get("/v1/admin/models")).json()["data"]}
    assert models["idle-vision"]["mmproj"] == str(tmp_path / "mmproj.gguf")
    assert models["text"]["mmproj"] is None


async def test_grpc_list_models_says_vision(client, grpc_port) -> None:
    from inferflux.api.grpc.gen import inference_pb2 as pb
    from inferflux.api.grpc.gen import inference_pb2_grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        answer = await stub.ListModels(pb.ListModelsRequest(), timeout=10)
    assert {m.id: m.vision for m in answer.models} == VISION
