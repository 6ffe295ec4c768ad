"""The load a fault is injected under: N streaming clients, each sending one streaming
chat request after another until stopped, every request classified as the client saw it.

A request is
    ok       200, its chunks all of one completion id, a finish_reason (stop/length) and
             then `[DONE]`;
    failed   a clean refusal or failure: a non-200 answer with an OpenAI-shaped error body,
             or an `error` event followed by `[DONE]`;
    lost     anything else: the connection broke or timed out before a terminal event, the
             stream ended without `[DONE]`, chunks of two completions interleaved, or a
             non-200 answer that is not an OpenAI-shaped error.
`status_500` counts 500 answers (never acceptable). The load runs on a thread of its own
(its own event loop) so a fault can be injected with plain blocking calls beside it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

PROMPTS = (
    "Tell me a story about a dragon.",
    "List some colours of the rainbow.",
    "Explain what a compiler does.",
    "Write a short poem about the sea.",
    "Describe a busy market in the morning.",
    "What is the capital of France? Answer at length.",
)


@dataclass(slots=True)
class Outcome:
    """One request: when it was sent and ended (monotonic), and its class."""

    sent_at: float
    ended_at: float = 0.0
    kind: str = "ok"  # ok | failed | lost
    status: int = 0
    detail: str = ""


@dataclass
class LoadSpec:
    """What each client sends. `body` is merged over the default streaming chat body;
    `headers` go with every request; `path` is the route."""

    streams: int = 16
    max_tokens: int = 32
    path: str = "/v1/chat/completions"
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 120.0
    stream: bool = True
    pause_after_failure_s: float = 0.0  # a client backing off after a refusal


def _openai_error(text: str) -> bool:
    try:
        error = json.loads(text).get("error")
    except (json.JSONDecodeError, AttributeError):
        return False
    return isinstance(error, dict) and isinstance(error.get("message"), str)


def _fold_event(outcome: Outcome, data: dict[str, Any], ids: set[str]) -> str | None:
    """The request's finish ("error" for an error event) once one is seen, else None."""
    if "error" in data:
        outcome.detail = str(data["error"].get("code") or data["error"].get("type"))
        return "error"
    if data.get("id"):
        ids.add(str(data["id"]))
    finish = None
    for choice in data.get("choices") or []:
        finish = choice.get("finish_reason") or finish
    return finish


async def _read_stream(response: httpx.Response, outcome: Outcome) -> None:
    ids: set[str] = set()
    finish: str | None = None
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            if len(ids) > 1:
                outcome.kind, outcome.detail = "lost", f"interleaved ids {sorted(ids)[:3]}"
            elif finish == "error":
                outcome.kind = "failed"
            elif finish in ("stop", "length"):
                outcome.kind = "ok"
            else:
                outcome.kind, outcome.detail = "lost", f"[DONE] after finish {finish!r}"
            return
        finish = _fold_event(outcome, json.loads(payload), ids) or finish
    outcome.kind, outcome.detail = "lost", f"stream ended without [DONE] (finish {finish!r})"


async def send_one(client: httpx.AsyncClient, spec: LoadSpec, number: int) -> Outcome:
    """One request of `spec`, classified. Never raises for server faults."""
    body = {
        "messages": [{"role": "user", "content": f"{PROMPTS[number % len(PROMPTS)]} #{number}"}],
        "max_tokens": spec.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": spec.stream,
    } | spec.body
    outcome = Outcome(time.monotonic())
    try:
        async with client.stream("POST", spec.path, json=body, headers=spec.headers) as response:
            outcome.status = response.status_code
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                clean = _openai_error(text)
                outcome.kind = "failed" if clean else "lost"
                outcome.detail = f"HTTP {response.status_code}: {text[:120]}"
            elif spec.stream:
                await _read_stream(response, outcome)
            else:
                data = json.loads(await response.aread())
                outcome.kind = "ok" if data.get("choices") else "lost"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        outcome.kind, outcome.detail = "lost", f"{type(exc).__name__}: {exc}"[:200]
    outcome.ended_at = time.monotonic()
    return outcome


class StreamLoad:
    """`spec.streams` clients looping on `send_one` on a background thread until `stop()`.
    `outcomes` grows as requests end (read it after `stop()`)."""

    def __init__(self, url: str, spec: LoadSpec) -> None:
        self.url = url
        self.spec = spec
        self.outcomes: list[Outcome] = []
        self._stopping = threading.Event()
        self._counter = 0
        self._thread = threading.Thread(target=self._run, name="chaos-load", daemon=True)

    def start(self) -> StreamLoad:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 180.0) -> list[Outcome]:
        """Let each client finish its request in flight, then return every outcome."""
        self._stopping.set()
        self._thread.join(timeout_s)
        return list(self.outcomes)

    def wait_for(self, num_done: int, timeout_s: float = 120.0) -> None:
        """Block until `num_done` requests ended (the load is warm)."""
        deadline = time.monotonic() + timeout_s
        while len(self.outcomes) < num_done and time.monotonic() < deadline:
            time.sleep(0.1)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=self.spec.streams + 4)
        timeout = httpx.Timeout(self.spec.timeout_s, connect=10.0)
        async with httpx.AsyncClient(base_url=self.url, timeout=timeout, limits=limits) as client:
            await asyncio.gather(*(self._client(client) for _ in range(self.spec.streams)))

    async def _client(self, client: httpx.AsyncClient) -> None:
        while not self._stopping.is_set():
            self._counter += 1
            outcome = await send_one(client, self.spec, self._counter)
            self.outcomes.append(outcome)
            if outcome.kind != "ok" and self.spec.pause_after_failure_s:
                await asyncio.sleep(self.spec.pause_after_failure_s)


@dataclass(frozen=True, slots=True)
class Tally:
    sent: int
    ok: int
    failed: int
    lost: int
    status_500: int
    details: tuple[str, ...]


def between(start: float, end: float) -> Callable[[Outcome], bool]:
    """Selects the requests sent in [start, end)."""
    return lambda o: start <= o.sent_at < end


def tally(outcomes: list[Outcome], keep: Callable[[Outcome], bool] = lambda o: True) -> Tally:
    """Counts of `outcomes` (those `keep` selects); up to 5 distinct non-ok details."""
    chosen = [o for o in outcomes if keep(o)]
    details = sorted({o.detail[:100] for o in chosen if o.kind != "ok" and o.detail})
    return Tally(
        sent=len(chosen),
        ok=sum(o.kind == "ok" for o in chosen),
        failed=sum(o.kind == "failed" for o in chosen),
        lost=sum(o.kind == "lost" for o in chosen),
        status_500=sum(o.status == 500 for o in chosen),
        details=tuple(details[:5]),
    )


def first_ok_after(outcomes: list[Outcome], at: float) -> float | None:
    """Seconds from `at` until the first request sent after `at` ended ok."""
    ends = [o.ended_at for o in outcomes if o.sent_at >= at and o.kind == "ok"]
    return min(ends) - at if ends else None


def last_failure_after(outcomes: list[Outcome], at: float) -> float:
    """Seconds from `at` until the last non-ok request ended (0 when none failed)."""
    ends = [o.ended_at for o in outcomes if o.ended_at >= at and o.kind != "ok"]
    return max(ends) - at if ends else 0.0
