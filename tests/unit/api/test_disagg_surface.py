"""What operators see of disaggregated mode, over the fake engine: /readyz per pool,
/server/stats' pools and channel, /v1/admin/workers' roles and scaling a pool, and the
metrics at /metrics; unified mode keeps today's answers. The pools themselves (real
workers, real tickets) are tested in tests/integration."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from inferflux.api import create_app
from inferflux.api.pools import takes_requests
from inferflux.config.settings import Settings
from inferflux.engine.messages import StepStats, TicketStats
from tests.fakes.engine import (
    FakeEngineClient,
    FakeTokenizer,
    fake_channel,
    fake_model_info,
    pool_status,
)
from tests.openai_envelope import assert_envelope

WORKERS = "/v1/admin/workers"


def disaggregate(
    engine: FakeEngineClient, *, prefill_ready: bool = True, decode_ready=(True, True)
):
    """One prefill and two decode workers, and a channel with some traffic."""
    engine.channel_stats = fake_channel(
        in_flight=2, in_flight_bytes=3 << 20, prefill_queue=4, handed_off=10, blocked=1,
        direct=3, resubmitted=1,
    )  # fmt: skip
    written = TicketStats(written=10, write_seconds_total=0.5, written_bytes=4096)
    hydrated = TicketStats(hydrated=6, hydrate_seconds_total=0.25, refused=1)
    engine.statuses = [
        pool_status(0, "prefill", ready=prefill_ready, num_waiting=1, tickets=written),
        pool_status(1, "decode", ready=decode_ready[0], num_waiting=2, num_in_flight=3,
                    tickets=hydrated),
        pool_status(2, "decode", ready=decode_ready[1], num_waiting=5, tickets=TicketStats()),
    ]  # fmt: skip


# -- /readyz ------------------------------------------------------------------------------
async def test_unified_readyz_keeps_its_body(client: httpx.AsyncClient) -> None:
    response = await client.get("/readyz")
    assert response.status_code == 200 and response.content == b'{"status":"ok"}'


async def test_readyz_names_each_pool(client: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    disaggregate(engine)
    response = await client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "pools": {"prefill": {"ready": 1, "size": 1}, "decode": {"ready": 2, "size": 2}},
    }


async def test_readyz_is_degraded_without_a_ready_prefill_worker(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    disaggregate(engine, prefill_ready=False, decode_ready=(False, True))
    response = await client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {
        "status": "degraded",
        "pools": {"prefill": {"ready": 0, "size": 1}, "decode": {"ready": 1, "size": 2}},
    }


async def test_readyz_is_503_without_a_ready_decode_worker(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    disaggregate(engine, decode_ready=(False, False))
    error = assert_envelope(await client.get("/readyz"), 503, code="no_worker_ready")
    assert "decode" in str(error["message"])


async def test_a_draining_worker_is_not_counted_in_its_pool(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    disaggregate(engine)
    assert engine.statuses is not None
    engine.statuses.append(pool_status(3, "decode", draining=True))
    pools = (await client.get("/readyz")).json()["pools"]
    assert pools["decode"] == {"ready": 2, "size": 2}


# -- /server/stats ------------------------------------------------------------------------
async def test_unified_stats_have_no_pools(client: httpx.AsyncClient) -> None:
    body = (await client.get("/server/stats")).json()
    assert body["mode"] == "unified" and body["pools"] is None and body["channel"] is None
    assert body["workers"][0]["role"] == "unified"


async def test_stats_show_each_pool_and_the_channel(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    disaggregate(engine)
    body = (await client.get("/server/stats")).json()
    assert body["mode"] == "disaggregated"
    assert body["pools"] == {
        "prefill": {"size": 1, "ready": 1, "queue_depth": 4, "num_running": 0,
                    "num_in_flight": 0},
        "decode": {"size": 2, "ready": 2, "queue_depth": 7, "num_running": 0,
                   "num_in_flight": 3},
    }  # fmt: skip
    assert body["channel"] == {
        "capacity": 8, "in_flight": 2, "in_flight_bytes": 3 << 20, "prefill_queue": 4,
        "handed_off": 10, "blocked": 1, "direct": 3, "resubmitted": 1,
    }  # fmt: skip
    assert [w["role"] for w in body["workers"]] == ["prefill", "decode", "decode"]
    assert body["workers"][0]["tickets"]["written"] == 10
    disaggregate(engine, decode_ready=(False, False))
    assert (await client.get("/server/stats")).json()["ready"] is False


# -- /v1/admin/workers --------------------------------------------------------------------
async def test_the_listing_shows_roles_and_pools(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    unified = (await client.get(WORKERS)).json()["data"][0]
    assert unified["mode"] == "unified" and unified["pools"] is None
    disaggregate(engine)
    (model,) = (await client.get(WORKERS)).json()["data"]
    assert model["mode"] == "disaggregated"
    assert model["pools"] == {"prefill": {"size": 1, "ready": 1}, "decode": {"size": 2, "ready": 2}}
    assert [w["role"] for w in model["workers"]] == ["prefill", "decode", "decode"]


async def test_scale_a_pool_by_role(client: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    disaggregate(engine)
    for body in (
        {"workers": 2, "role": "prefill"},
        {"workers": 3, "role": "decode"},
        {"workers": 1},
    ):
        assert (await client.post(WORKERS, json=body)).status_code == 200
    assert engine.scaled == [2, 3, 1]
    assert engine.scaled_roles == ["prefill", "decode", None]


@pytest.mark.parametrize("role", ["gpu", "Prefill", "", 1, ["decode"]])
async def test_a_bad_role_is_a_400(
    client: httpx.AsyncClient, engine: FakeEngineClient, role: object
) -> None:
    disaggregate(engine)
    response = await client.post(WORKERS, json={"workers": 2, "role": role})
    assert_envelope(response, 400, code="invalid_request", param="role")
    assert engine.scaled == []


async def test_a_role_in_unified_mode_is_a_400(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    response = await client.post(WORKERS, json={"workers": 2, "role": "prefill"})
    error = assert_envelope(response, 400, param="role")
    assert "unified" in str(error["message"])
    assert engine.scaled == []


# -- /metrics -----------------------------------------------------------------------------
DISAGG_FAMILIES = {
    "inferflux_disagg_queue_depth": "gauge",
    "inferflux_kv_channel_in_flight": "gauge",
    "inferflux_kv_channel_capacity": "gauge",
    "inferflux_kv_channel_bytes": "gauge",
    "inferflux_kv_tickets": "counter",
    "inferflux_kv_tickets_written": "counter",
    "inferflux_kv_ticket_written_bytes": "counter",
    "inferflux_kv_ticket_write_seconds": "counter",
    "inferflux_kv_tickets_hydrated": "counter",
    "inferflux_kv_ticket_hydrate_seconds": "counter",
    "inferflux_kv_tickets_refused": "counter",
    "inferflux_worker_role_info": "gauge",
    "inferflux_kv_transfer_seconds": "histogram",
}


async def scrape(client: httpx.AsyncClient) -> tuple[dict, dict]:
    text = (await client.get("/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    return families, samples


async def test_unified_mode_exports_no_disaggregated_family(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.emit_step(StepStats(num_generated_tokens=1))
    families, _ = await scrape(client)
    assert not set(DISAGG_FAMILIES) & set(families)


async def test_disaggregated_metrics(client: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    disaggregate(engine)
    engine.emit_step(StepStats(transfer_s=[0.0008, 0.004, 0.03]), worker_id=1)
    families, samples = await scrape(client)
    for name, kind in DISAGG_FAMILIES.items():
        assert families[name].type == kind, name
    assert samples[("inferflux_disagg_queue_depth", (("phase", "prefill"),))] == 4
    assert samples[("inferflux_disagg_queue_depth", (("phase", "decode"),))] == 7
    assert samples[("inferflux_kv_channel_in_flight", ())] == 2
    assert samples[("inferflux_kv_channel_capacity", ())] == 8
    assert samples[("inferflux_kv_channel_bytes", ())] == 3 << 20
    for outcome, n in (("handed_off", 10), ("blocked", 1), ("direct", 3), ("resubmitted", 1)):
        assert samples[("inferflux_kv_tickets_total", (("outcome", outcome),))] == n
    assert samples[("inferflux_kv_tickets_written_total", ())] == 10
    assert samples[("inferflux_kv_ticket_written_bytes_total", ())] == 4096
    assert samples[("inferflux_kv_ticket_write_seconds_total", ())] == 0.5
    assert samples[("inferflux_kv_tickets_hydrated_total", ())] == 6
    assert samples[("inferflux_kv_ticket_hydrate_seconds_total", ())] == 0.25
    assert samples[("inferflux_kv_tickets_refused_total", ())] == 1
    assert samples[("inferflux_worker_role_info", (("role", "prefill"), ("worker", "0")))] == 1
    assert samples[("inferflux_worker_role_info", (("role", "decode"), ("worker", "2")))] == 1
    assert samples[("inferflux_kv_transfer_seconds_count", ())] == 3
    assert samples[("inferflux_kv_transfer_seconds_bucket", (("le", "0.001"),))] == 1
    assert samples[("inferflux_kv_transfer_seconds_bucket", (("le", "0.005"),))] == 2
    # the existing per-worker families keep their labels
    assert samples[("inferflux_worker_up", (("worker", "1"),))] == 1


@pytest.fixture
async def disagg_client(engine: FakeEngineClient) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings.model_validate({"scheduler": {"mode": "disaggregated"}})
    app: FastAPI = create_app(
        settings, engine=engine, tokenizer=FakeTokenizer(), model_info=fake_model_info()
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


async def test_the_transfer_histogram_is_there_from_start_in_disaggregated_mode(
    disagg_client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    disaggregate(engine)
    families, samples = await scrape(disagg_client)
    assert families["inferflux_kv_transfer_seconds"].type == "histogram"
    assert samples[("inferflux_kv_transfer_seconds_count", ())] == 0


def test_every_disaggregated_family_is_documented() -> None:
    docs = (Path(__file__).parents[3] / "docs" / "observability.md").read_text()
    for name, kind in DISAGG_FAMILIES.items():
        exposed = f"{name}_total" if kind == "counter" else name
        assert f"| `{exposed}` |" in docs, exposed


def test_takes_requests_is_the_one_readiness_rule() -> None:
    """/readyz and gRPC health: a ready worker; in disaggregated mode a ready decode one."""
    engine = FakeEngineClient()
    assert takes_requests(engine)
    engine.ready = False
    assert not takes_requests(engine)
    disaggregate(engine, prefill_ready=False, decode_ready=(False, True))
    assert takes_requests(engine)  # degraded: decode workers compute the prompts
    disaggregate(engine, decode_ready=(False, False))
    assert not takes_requests(engine)
