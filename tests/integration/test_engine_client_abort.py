"""`WorkerPoolClient.abort` over the real engine (one in-process worker): the stream ends at
once with an ABORT delta that still carries the request's counts, so usage, metrics and
the audit record of a request cut by the server's shutdown stay right."""

from __future__ import annotations

import pytest

from inferflux.config.loader import load_settings
from inferflux.engine import make_engine_client
from inferflux.engine.messages import AddRequest, FinishReason, SamplingParams
from inferflux.models.files import load_served_model

pytestmark = [pytest.mark.model]


async def test_an_aborted_stream_ends_at_once_with_the_counts_so_far() -> None:
    settings = load_settings(env={}, overrides={"runtime.in_process": True})
    model_info, tokenizer = load_served_model(settings)
    engine = make_engine_client(settings, model_info)
    await engine.start()
    try:
        prompt = tokenizer.tokenize("Once upon a time", add_special=True, parse_special=False)
        sampling = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
        request = AddRequest(request_id="cut-1", prompt_token_ids=prompt, sampling=sampling)
        deltas = []
        async for delta in engine.generate(request):
            deltas.append(delta)
            if len(deltas) == 5:
                await engine.abort("cut-1")
        last, before = deltas[-1], deltas[-2]  # deltas already queued may come between
        assert last.finish_reason is FinishReason.ABORT
        assert len(deltas) < 20  # not the 400 tokens asked for
        assert last.num_prompt_tokens == len(prompt)
        assert last.num_output_tokens == before.num_output_tokens >= 5
    finally:
        await engine.shutdown()
        tokenizer.close()
