"""`WorkerPoolClient.scale` over the real engine in in-process mode (worker threads): a
worker added takes requests, a worker removed finishes the generation it runs before it
stops, and a bad count changes nothing."""

from __future__ import annotations

import asyncio

import pytest

from inferflux.config.loader import load_settings
from inferflux.engine import make_engine_client
from inferflux.engine.messages import AddRequest, FinishReason, SamplingParams
from inferflux.errors import InvalidRequest
from inferflux.models.files import load_served_model

pytestmark = [pytest.mark.model]


async def test_scale_up_then_down_while_a_generation_runs() -> None:
    settings = load_settings(env={}, overrides={"runtime.in_process": True, "model.ctx_size": 512})
    model_info, tokenizer = load_served_model(settings)
    engine = make_engine_client(settings, model_info)
    await engine.start()
    try:
        prompt = tokenizer.tokenize("Once upon a time", add_special=True, parse_special=False)
        sampling = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)

        async def run(request_id: str) -> list:
            request = AddRequest(request_id=request_id, prompt_token_ids=prompt, sampling=sampling)
            return [delta async for delta in engine.generate(request)]

        statuses = await engine.scale(2)
        assert [s.worker_id for s in statuses] == [0, 1] and all(s.ready for s in statuses)
        first = asyncio.create_task(run("a"))
        second = asyncio.create_task(run("b"))
        while sum(s.num_in_flight for s in engine.workers()) < 2:
            await asyncio.sleep(0.01)
        statuses = await engine.scale(1)
        assert sum(s.draining for s in statuses) == 1
        for deltas in await asyncio.gather(first, second):
            assert deltas[-1].finish_reason is FinishReason.LENGTH
            assert deltas[-1].num_output_tokens == 48
        while len(engine.workers()) > 1:
            await asyncio.sleep(0.05)
        (left,) = engine.workers()
        assert left.ready and not left.draining
        with pytest.raises(InvalidRequest):
            await engine.scale(0)
        assert len(engine.workers()) == 1
    finally:
        await engine.shutdown()
        tokenizer.close()
