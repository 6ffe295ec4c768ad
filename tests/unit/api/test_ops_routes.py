"""Health probes, /server/stats, /v1/models, and the lifespan driving the engine."""

from __future__ import annotations

import asyncio

import httpx
from fastapi import FastAPI

from inferflux.api import create_app
from inferflux.api.state import app_state
from inferflux.config.settings import Settings
from tests.fakes.engine import FakeEngineClient, FakeTokenizer, fake_model_info
from tests.openai_envelope import assert_envelope


async def test_liveness_is_always_200(client: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    engine.ready = False
    for path in ("/healthz", "/livez"):
        response = await client.get(path)
        assert response.status_code == 200 and response.json() == {"status": "ok"}


async def test_readyz_follows_the_engine(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    assert (await client.get("/readyz")).status_code == 200
    engine.ready = False
    assert_envelope(await client.get("/readyz"), 503, code="no_worker_ready")


async def test_models_list(client: httpx.AsyncClient) -> None:
    body = (await client.get("/v1/models")).json()
    assert body == {
        "object": "list",
        "data": [
            {
                "id": "fake-model",
                "object": "model",
                "created": 1_700_000_000,
                "owned_by": "inferflux",
                "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "meta": {
                    "architecture": "llama",
                    "n_ctx": 256,
                    "n_ctx_train": 256,
                    "n_vocab": 259,
                    "size_bytes": 1234,
                    "parameters": 0,
                    "parameter_size": "0",
                    "quantization": "unknown",
                    "context_length": 256,
                    "has_chat_template": False,
                    "is_moe": False,
                    "n_experts": 0,
                    "n_active_experts": 0,
                    "capabilities": ["completion"],
                    "aliases": [],
                    "loaded": True,
                    "default": True,
                },
            }
        ],
    }


async def test_server_stats(client: httpx.AsyncClient) -> None:
    body = (await client.get("/server/stats")).json()
    assert body["uptime_s"] >= 0 and body["ready"] is True
    assert body["model"]["id"] == "fake-model"
    assert body["num_workers"] == 1
    (worker,) = body["workers"]
    assert worker["worker_id"] == 0 and worker["pid"] == 4242 and worker["restarts"] == 0
    for key in ("ready", "num_in_flight", "num_running", "num_waiting", "num_steps"):
        assert key in worker
    assert worker["num_running"] == 1 and worker["num_steps"] == 5
    assert body["routing"] == {"strategy": "prefix_affinity", "decisions": {}}
    assert worker["routing"] is None  # the fake engine has no router


async def test_lifespan_starts_and_stops_the_engine() -> None:
    engine = FakeEngineClient()
    app: FastAPI = create_app(
        Settings(), engine=engine, tokenizer=FakeTokenizer(), model_info=fake_model_info()
    )
    assert not engine.started
    async with app.router.lifespan_context(app):
        await asyncio.sleep(0.01)  # the engine starts in the background
        assert engine.started and not engine.stopped
        assert app_state(app).engine_start_error is None
    assert engine.stopped


async def test_an_engine_that_cannot_start_records_why_and_asks_for_shutdown() -> None:
    engine = FakeEngineClient(fail_start="no worker could load the model: out of memory")
    app: FastAPI = create_app(
        Settings(), engine=engine, tokenizer=FakeTokenizer(), model_info=fake_model_info()
    )
    shutdowns: list[bool] = []
    app_state(app).request_shutdown = lambda: shutdowns.append(True)
    async with app.router.lifespan_context(app):
        await asyncio.sleep(0.01)
        assert app_state(app).engine_start_error == "no worker could load the model: out of memory"
        assert shutdowns == [True]
    assert engine.stopped


def test_configured_chat_template_overrides_the_models() -> None:
    settings = Settings.model_validate({"model": {"chat_template": "{{ messages[0]['content'] }}"}})
    app = create_app(
        settings,
        engine=FakeEngineClient(),
        tokenizer=FakeTokenizer("IGNORED"),
        model_info=fake_model_info(),
    )
    template = app_state(app).models.default_serving().chat_template
    assert template.render([{"role": "user", "content": "x"}]) == "x"


def test_gemma_model_without_template_gets_gemma_fallback() -> None:
    app = create_app(
        Settings(),
        engine=FakeEngineClient(),
        tokenizer=FakeTokenizer(None),
        model_info=fake_model_info(architecture="gemma3"),
    )
    text = (
        app_state(app)
        .models.default_serving()
        .chat_template.render([{"role": "user", "content": "x"}])
    )
    assert text == "<s><start_of_turn>user\nx<end_of_turn>\n<start_of_turn>model\n"
