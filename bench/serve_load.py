"""Load benchmark of a running InferFlux server: N concurrent streaming clients over HTTP.

Each of `--concurrency` clients sends `--requests` streaming requests one after another
to /v1/chat/completions (or /v1/completions with `--endpoint completions`), prompts drawn
from the seeded set in `bench/workload.py`. Every request asks for temperature 0,
`ignore_eos: true` and `max_tokens` (128), so each one generates exactly max_tokens tokens
and runs are comparable; `stream_options.include_usage` makes the server report the token
count in a final chunk.

Per request it measures
    TTFT     time from sending the request to the first SSE chunk with content;
    ITL      time between consecutive content chunks (one per chunk, not per token);
    tokens   output tokens, from the usage chunk (content chunks counted if it is missing);
    tok/s    output tokens / end-to-end request latency.
Per concurrency level it prints aggregate output tok/s (all output tokens / wall time of
the level), mean per-request tok/s, TTFT and ITL p50/p99, and the number of errors. A
request counts as an error on a non-200 status, an `error` event, `finish_reason: error`,
or a broken connection; `short` counts requests that stopped before max_tokens.

Usage (server started with `make run` in another terminal):

    .venv/bin/python bench/serve_load.py                            # levels 1,4,8,16
    .venv/bin/python bench/serve_load.py --concurrency 8 --requests 10 --max-tokens 256
    .venv/bin/python bench/serve_load.py --endpoint completions --json bench/results/x.json
    .venv/bin/python bench/serve_load.py --url http://10.0.0.5:8080 --model smollm2 \\
        --api-key sk-...

Without `--model` the first id listed by /v1/models is used. Exit status 1 when any
request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from workload import make_prompts, summarize

_MAX_ERRORS_KEPT = 10


@dataclass(slots=True)
class RequestResult:
    """One request as the client saw it. Times are seconds."""

    ok: bool = True
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    usage_reported: bool = False
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    text: str = ""  # the streamed content; left out of level reports

    @property
    def tok_s(self) -> float | None:
        return self.output_tokens / self.e2e_s if self.ok and self.e2e_s > 0 else None


@dataclass(frozen=True, slots=True)
class LoadConfig:
    url: str
    model: str
    endpoint: str  # "chat" | "completions"
    max_tokens: int
    requests_per_client: int
    seed: int
    min_words: int
    max_words: int
    api_key: str | None = None
    timeout_s: float = 600.0
    ignore_eos: bool = True  # False for servers that reject or lack the field
    extra_body: dict[str, Any] = field(default_factory=dict)  # Any: JSON; merged last


Prompt = str | list[dict[str, str]]  # a user message's text, or a whole chat history


def build_body(config: LoadConfig, prompt: Prompt) -> dict[str, Any]:  # Any: JSON body
    """The request body: streaming, greedy, exactly max_tokens tokens (with `ignore_eos`),
    usage at the end. A list `prompt` is sent as the chat's messages."""
    body: dict[str, Any] = {
        "model": config.model,
        "max_tokens": config.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.ignore_eos:
        body["ignore_eos"] = True
    if config.endpoint == "chat":
        body["messages"] = (
            prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        )
    else:
        body["prompt"] = prompt
    return body | config.extra_body


def _path(endpoint: str) -> str:
    return "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"


def _chunk_text(chunk: dict[str, Any]) -> tuple[str, str | None]:
    """(content text, finish_reason) of one chat or completion chunk."""
    text, finish = "", None
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta")
        piece = (delta or {}).get("content") if delta is not None else choice.get("text")
        text += piece or ""
        finish = choice.get("finish_reason") or finish
    return text, finish


def _apply_event(
    result: RequestResult, data: str, sent_at: float, last_at: float | None
) -> float | None:
    """Fold one SSE `data:` payload into `result`; returns the time of the last content."""
    chunk = json.loads(data)
    if "error" in chunk:
        result.ok, result.error = False, f"error event: {json.dumps(chunk['error'])[:200]}"
        return last_at
    text, finish = _chunk_text(chunk)
    result.finish_reason = finish or result.finish_reason
    usage = chunk.get("usage")
    if usage:
        _apply_usage(result, usage)
    if not text:
        return last_at
    result.text += text
    now = time.perf_counter()
    if last_at is None:
        result.ttft_s = now - sent_at
    else:
        result.itl_s.append(now - last_at)
    if not result.usage_reported:
        result.output_tokens += 1
    return now


def _apply_usage(result: RequestResult, usage: dict[str, Any]) -> None:
    if usage.get("completion_tokens") is not None:
        result.output_tokens, result.usage_reported = int(usage["completion_tokens"]), True
    result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
    details = usage.get("prompt_tokens_details") or {}
    result.cached_tokens = details.get("cached_tokens", result.cached_tokens)


async def stream_one(
    client: httpx.AsyncClient, config: LoadConfig, prompt: Prompt
) -> RequestResult:
    """Send one streaming request and time its chunks. Never raises for server faults."""
    result = RequestResult()
    sent_at = time.perf_counter()
    last_at: float | None = None
    try:
        async with client.stream(
            "POST", _path(config.endpoint), json=build_body(config, prompt)
        ) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode("utf-8", "replace")
                result.ok, result.error = False, f"HTTP {response.status_code}: {body[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                last_at = _apply_event(result, data, sent_at, last_at)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.ok, result.error = False, f"{type(exc).__name__}: {exc}"
    result.e2e_s = time.perf_counter() - sent_at
    if result.ok and result.finish_reason == "error":
        result.ok, result.error = False, "finish_reason=error"
    return result


async def _client_loop(
    client: httpx.AsyncClient, config: LoadConfig, prompts: list[str]
) -> list[RequestResult]:
    return [await stream_one(client, config, prompt) for prompt in prompts]


def make_http_client(config: LoadConfig, concurrency: int) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    return httpx.AsyncClient(
        base_url=config.url,
        headers=headers,
        timeout=httpx.Timeout(config.timeout_s, connect=10.0),
        limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
    )


async def run_level(
    client: httpx.AsyncClient, config: LoadConfig, concurrency: int
) -> dict[str, Any]:  # Any: JSON report
    """Run `concurrency` clients × `requests_per_client` requests; the level's report."""
    total = concurrency * config.requests_per_client
    prompts = make_prompts(total, config.seed, config.min_words, config.max_words)
    per_client = [prompts[i::concurrency] for i in range(concurrency)]
    started = time.perf_counter()
    batches = await asyncio.gather(*(_client_loop(client, config, p) for p in per_client))
    wall_s = time.perf_counter() - started
    return level_report(concurrency, [r for batch in batches for r in batch], wall_s, config)


def level_report(
    concurrency: int, results: list[RequestResult], wall_s: float, config: LoadConfig
) -> dict[str, Any]:  # Any: JSON report
    ok = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in ok)
    return {
        "concurrency": concurrency,
        "num_requests": len(results),
        "num_errors": len(results) - len(ok),
        "num_short": sum(1 for r in ok if r.output_tokens < config.max_tokens),
        "num_without_usage": sum(1 for r in ok if not r.usage_reported),
        "wall_s": wall_s,
        "output_tokens": output_tokens,
        "output_tok_s": output_tokens / wall_s if wall_s > 0 else 0.0,
        "request_tok_s": summarize([r.tok_s for r in ok if r.tok_s is not None]).as_dict(),
        "ttft_s": summarize([r.ttft_s for r in ok if r.ttft_s is not None]).as_dict(),
        "itl_s": summarize([x for r in ok for x in r.itl_s]).as_dict(),
        "e2e_s": summarize([r.e2e_s for r in ok]).as_dict(),
        "errors": [r.error for r in results if not r.ok][:_MAX_ERRORS_KEPT],
        "requests": [{k: v for k, v in asdict(r).items() if k != "text"} for r in results],
    }


_Column = tuple[str, int, Callable[[dict[str, Any]], str]]
_COLUMNS: tuple[_Column, ...] = (
    ("conc", 5, lambda lv: f"{lv['concurrency']}"),
    ("reqs", 5, lambda lv: f"{lv['num_requests']}"),
    ("errors", 6, lambda lv: f"{lv['num_errors']}"),
    ("short", 5, lambda lv: f"{lv['num_short']}"),
    ("out tok/s", 10, lambda lv: f"{lv['output_tok_s']:.1f}"),
    ("req tok/s", 10, lambda lv: _fmt(lv["request_tok_s"]["mean"], 1)),
    ("TTFT p50 ms", 12, lambda lv: _fmt(lv["ttft_s"]["p50"], 1000)),
    ("TTFT p99 ms", 12, lambda lv: _fmt(lv["ttft_s"]["p99"], 1000)),
    ("ITL p50 ms", 11, lambda lv: _fmt(lv["itl_s"]["p50"], 1000)),
    ("ITL p99 ms", 11, lambda lv: _fmt(lv["itl_s"]["p99"], 1000)),
)


def _fmt(value: float | None, scale: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * scale:.1f}"


def format_table(levels: list[dict[str, Any]]) -> str:
    header = " ".join(name.rjust(width) for name, width, _ in _COLUMNS)
    rows = [" ".join(cell(lv).rjust(width) for _, width, cell in _COLUMNS) for lv in levels]
    return "\n".join([header, *rows])


async def resolve_model(client: httpx.AsyncClient) -> str:
    """The first model id the server lists at /v1/models."""
    response = await client.get("/v1/models")
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


def parse_levels(text: str) -> list[int]:
    levels = [int(part) for part in text.split(",") if part.strip()]
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"need positive integers like 1,4,8: {text!r}")
    return levels


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL")
    p.add_argument("--model", default=None, help="model id (default: first of /v1/models)")
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    p.add_argument("--concurrency", type=parse_levels, default=[1, 4, 8, 16], help="e.g. 1,4,8")
    p.add_argument("--requests", type=int, default=4, help="requests per client (default 4)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0, help="prompt set seed")
    p.add_argument("--min-words", type=int, default=16, help="shortest prompt, in words")
    p.add_argument("--max-words", type=int, default=128, help="longest prompt, in words")
    p.add_argument("--warmup", type=int, default=1, help="requests sent before measuring")
    p.add_argument("--api-key", default=None, help="sent as a Bearer token")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, s")
    p.add_argument("--json", type=Path, default=None, help="write the full results here")
    return p


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:  # Any: JSON report
    config = LoadConfig(
        url=args.url,
        model=args.model or "",
        endpoint=args.endpoint,
        max_tokens=args.max_tokens,
        requests_per_client=args.requests,
        seed=args.seed,
        min_words=args.min_words,
        max_words=args.max_words,
        api_key=args.api_key,
        timeout_s=args.timeout,
    )
    levels: list[dict[str, Any]] = []
    async with make_http_client(config, max(args.concurrency)) as client:
        if not config.model:
            config = LoadConfig(**{**asdict(config), "model": await resolve_model(client)})
        print(f"model {config.model} at {config.url}{_path(config.endpoint)}", flush=True)
        for prompt in make_prompts(args.warmup, config.seed + 1, 8, 16):
            await stream_one(client, config, prompt)
        for concurrency in args.concurrency:
            levels.append(await run_level(client, config, concurrency))
            print(format_table(levels[-1:]), flush=True)
    if args.json is not None:
        report = {"config": asdict(config) | {"api_key": None}, "levels": levels}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return levels


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        levels = asyncio.run(run(args))
    except httpx.HTTPError as exc:
        print(f"cannot reach {args.url}: {exc}", file=sys.stderr)
        return 2
    print("\n" + format_table(levels))
    errors = sum(lv["num_errors"] for lv in levels)
    for message in {e for lv in levels for e in lv["errors"]}:
        print(f"error: {message}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
