"""The fast subset of the chaos suite (`make chaos` runs it all, tests/chaos/): a worker
killed under load and the client-side limits (idle connections, slowloris heads and
bodies, abrupt disconnects, a very slow SSE reader), each in its quick form, on one
`inferflux serve --workers 2` with short header and body timeouts. Each fault must meet
the target RELIABILITY.md states."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos import client_faults, worker_faults
from tests.chaos.context import ChaosRun
from tests.chaos.report import FaultResult
from tests.chaos.servers import serving
from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> ChaosRun:
    return ChaosRun(tmp_path_factory.mktemp("chaos"), quick=True, streams=8)


@pytest.fixture(scope="module")
def server(run: ChaosRun) -> Iterator[ServerProcess]:
    with serving(
        run.log_dir, "fast", "--workers", "2", env=client_faults.ENV, num_workers=2
    ) as server:
        yield server


def held(result: FaultResult) -> None:
    assert result.passed, "\n".join([result.name, *result.notes])


def test_a_worker_killed_under_load_fails_only_its_own_streams(run, server):
    held(worker_faults.worker_killed(run, server.url))


def test_idle_connections_are_closed_after_the_header_timeout(run, server):
    held(client_faults.idle_connections(run, server))


def test_slowloris_heads_are_cut(run, server):
    held(client_faults.slowloris_heads(run, server))


def test_slowloris_bodies_get_408(run, server):
    held(client_faults.slowloris_bodies(run, server))


def test_abrupt_disconnects_abort_their_requests(run, server):
    held(client_faults.disconnects(run, server))


def test_a_very_slow_sse_reader_costs_bounded_memory(run, server):
    held(client_faults.slow_reader(run, server))


def test_the_server_log_has_no_500(run, server):
    log = Path(run.log_dir / "fast.log").read_text(errors="replace")
    assert "Exception in ASGI application" not in log
    assert '" 500' not in log
