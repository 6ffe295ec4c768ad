"""The request flow of disaggregated mode (engine/disagg_flow.py): which requests are
handed off, what the prefill leg's outcomes lead to, and aborts while a request waits for
the channel. The workers are fakes (FakePrefill streams scripted deltas); the ticket
slots are real files in a temporary folder."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator

import pytest

from inferflux.config.settings import Settings
from inferflux.engine.disagg_flow import DisaggregatedFlow
from inferflux.engine.messages import (
    AddRequest,
    FinishReason,
    ImageInput,
    KvTicket,
    RequestDelta,
    SamplingParams,
)
from inferflux.engine.worker_pool import PoolWorker, WorkerPool
from inferflux.errors import EngineDeadError

PROMPT = list(range(1, 40))


class FakePrefill:
    """Streams what the test scripts for the prefill leg, and records what it was sent."""

    def __init__(self, outcome: RequestDelta | Exception | None) -> None:
        self.outcome = outcome
        self.sent: list[AddRequest] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    async def stream(
        self, worker: PoolWorker, request: AddRequest
    ) -> AsyncGenerator[RequestDelta, None]:
        self.sent.append(request)
        self.started.set()
        await self.release.wait()
        if isinstance(self.outcome, Exception):
            raise self.outcome
        if self.outcome is not None:
            yield self.outcome


class FakeDecode:
    """The client's `serve`: records the ticket it got and streams two deltas."""

    def __init__(self) -> None:
        self.tickets: list[KvTicket | None] = []

    async def serve(
        self, request: AddRequest, ticket: KvTicket | None
    ) -> AsyncGenerator[RequestDelta, None]:
        self.tickets.append(ticket)
        yield RequestDelta(request_id=request.request_id, text="a", token_ids=[5])
        yield RequestDelta(request_id=request.request_id, finish_reason=FinishReason.LENGTH)


def _settings(tmp_path, **disaggregated: object) -> Settings:
    return Settings.model_validate(
        {
            "scheduler": {
                "mode": "disaggregated",
                "disaggregated": {"path": str(tmp_path), **disaggregated},
            }
        }  # fmt: skip
    )


_OPEN: list[DisaggregatedFlow] = []


@pytest.fixture(autouse=True)
def _close_flows() -> Iterator[None]:
    yield
    while _OPEN:
        flow = _OPEN.pop()
        flow.slots.close()
        flow._pool.close()  # its ZeroMQ context


def _flow(tmp_path, prefill: FakePrefill, **disaggregated: object) -> DisaggregatedFlow:
    pool = WorkerPool(["prefill", "decode"], in_process=True, config=lambda *a: None)  # type: ignore[arg-type, return-value]
    for worker in pool.workers.values():
        worker.ready = True
    settings = _settings(tmp_path, **disaggregated)
    flow = DisaggregatedFlow(
        pool, lambda: settings, stream=prefill.stream, pick_prefill=lambda r: pool.workers[0]
    )
    flow.slots.open()
    _OPEN.append(flow)
    return flow


def _request(prompt: list[int] = PROMPT, **fields: object) -> AddRequest:
    return AddRequest(request_id="r", prompt_token_ids=prompt,
                      sampling=SamplingParams(max_tokens=8, **fields.pop("sampling", {})),  # type: ignore[arg-type]
                      **fields)  # type: ignore[arg-type]  # fmt: skip


def _handoff(ticket: KvTicket | None) -> RequestDelta:
    return RequestDelta(request_id="r", finish_reason=FinishReason.HANDOFF, ticket=ticket)


async def _run(
    flow: DisaggregatedFlow, decode: FakeDecode, request: AddRequest
) -> list[RequestDelta]:
    return [d async for d in flow.generate(request, decode.serve)]


async def test_a_long_prompt_is_prefilled_then_decoded_with_its_ticket(tmp_path) -> None:
    ticket = KvTicket(path="x", n_tokens=len(PROMPT) - 1, nbytes=100)
    prefill, decode = FakePrefill(_handoff(ticket)), FakeDecode()
    flow = _flow(tmp_path, prefill)
    deltas = await _run(flow, decode, _request())
    assert [d.finish_reason for d in deltas] == [None, FinishReason.LENGTH]
    assert decode.tickets == [ticket]
    (sent,) = prefill.sent
    assert sent.ticket_path.startswith(flow.slots.folder)
    assert sent.sampling.max_tokens == 1 and sent.prompt_token_ids == PROMPT
    stats = flow.slots.stats()
    assert (stats.handed_off, stats.direct, stats.in_flight, stats.prefill_queue) == (1, 0, 0, 0)


@pytest.mark.parametrize(
    "fields",
    [
        {"prompt": [1]},  # shorter than min_prompt_tokens (2)
        {"images": [ImageInput(sha256="0" * 64, data=b"x", position=0)]},
        {"sampling": {"prompt_logprobs": 1}},
    ],
    ids=["short", "images", "prompt_logprobs"],
)
async def test_requests_that_cannot_be_handed_off_run_direct(tmp_path, fields) -> None:
    prefill, decode = FakePrefill(None), FakeDecode()
    flow = _flow(tmp_path, prefill)
    await _run(flow, decode, _request(**fields))
    assert prefill.sent == [] and decode.tickets == [None]
    assert flow.slots.stats().direct == 1


async def test_no_ready_prefill_worker_runs_it_direct(tmp_path) -> None:
    prefill, decode = FakePrefill(None), FakeDecode()
    flow = _flow(tmp_path, prefill)
    flow._pool.workers[0].ready = False
    await _run(flow, decode, _request())
    assert prefill.sent == [] and decode.tickets == [None]


@pytest.mark.parametrize(
    ("outcome", "resubmitted"),
    [
        (EngineDeadError("the engine worker died"), 1),
        (RequestDelta(request_id="r", finish_reason=FinishReason.ERROR, error="x"), 0),
        (RequestDelta(request_id="r", finish_reason=FinishReason.TIMEOUT), 0),
        (_handoff(None), 0),  # the ticket could not be written
    ],
    ids=["worker_died", "error", "timeout", "no_ticket"],
)
async def test_a_failed_prefill_leg_runs_the_prompt_on_a_decode_worker(
    tmp_path, outcome, resubmitted
) -> None:
    prefill, decode = FakePrefill(outcome), FakeDecode()
    flow = _flow(tmp_path, prefill)
    deltas = await _run(flow, decode, _request())
    assert deltas[-1].finish_reason is FinishReason.LENGTH and decode.tickets == [None]
    stats = flow.slots.stats()
    assert (stats.direct, stats.resubmitted, stats.in_flight) == (1, resubmitted, 0)


async def test_an_abort_during_prefill_ends_the_request_there(tmp_path) -> None:
    aborted = RequestDelta(request_id="r", finish_reason=FinishReason.ABORT)
    prefill, decode = FakePrefill(aborted), FakeDecode()
    flow = _flow(tmp_path, prefill)
    assert await _run(flow, decode, _request()) == [aborted]
    assert decode.tickets == [] and flow.slots.stats().in_flight == 0


async def test_a_full_channel_blocks_then_runs_direct(tmp_path) -> None:
    prefill, decode = FakePrefill(_handoff(None)), FakeDecode()
    flow = _flow(tmp_path, prefill, channel_capacity=1, ticket_wait_s=0.05)
    held = await flow.slots.reserve(10)
    await _run(flow, decode, _request())
    assert prefill.sent == [] and decode.tickets == [None]
    stats = flow.slots.stats()
    assert (stats.blocked, stats.direct, stats.in_flight) == (1, 1, 1)
    flow.slots.release(held)  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["abort", "client_gone"])
async def test_a_request_ended_while_waiting_for_the_channel_holds_nothing(tmp_path, how) -> None:
    prefill, decode = FakePrefill(None), FakeDecode()
    flow = _flow(tmp_path, prefill, channel_capacity=1, ticket_wait_s=30)
    held = await flow.slots.reserve(10)
    task = asyncio.create_task(_run(flow, decode, _request()))
    await asyncio.sleep(0.05)
    if how == "abort":  # EngineClient.abort: no worker holds it, it ends at once
        flow.abort("r")
        deltas = await asyncio.wait_for(task, 5)
        assert [d.finish_reason for d in deltas] == [FinishReason.ABORT]
        assert deltas[0].num_prompt_tokens == len(PROMPT)
    else:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert prefill.sent == [] and decode.tickets == []
    assert flow.slots.stats().in_flight == 1  # only the slot the test holds
    flow.slots.release(held)  # type: ignore[arg-type]
    assert flow.slots.stats().in_flight == 0
