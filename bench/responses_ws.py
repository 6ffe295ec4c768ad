"""A 20-step tool-call loop on the Responses API: over HTTP and over one WebSocket.

Starts `inferflux serve` (the default model unless --model) and runs an agent loop of
`--steps` responses, each a forced call of a `lookup` function (greedy, at most
`--tokens` tokens) answered by a `function_call_output`, three ways:

- `http-full`: a new streamed POST per step that resends the whole conversation
  (`store: false`): what a client without server-side state does;
- `http-chain`: a streamed POST per step with `previous_response_id` and only the new
  item (the server keeps the conversation);
- `ws-chain`: the same chain as `response.create` messages on one WebSocket
  (`store: false`: the connection keeps it).

The modes alternate, `--rounds` times each, on the same warm server; every mode does the
same work (the prompts and, greedy, the outputs are the same: the report checks the token
counts). Prints the median end-to-end seconds of a loop per mode, the per-step overhead
against `ws-chain`, and the bytes the client sent.

Usage:
    .venv/bin/python bench/responses_ws.py
    .venv/bin/python bench/responses_ws.py --steps 20 --rounds 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from websockets.sync.client import ClientConnection, connect

from launch import start_server

TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look up a record by its key.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
        },
    }
]
INSTRUCTIONS = "You are an agent. Look up every record you are asked about, one at a time."
ENDED = ("response.completed", "response.incomplete", "response.failed", "error")


class Loop:
    """One agent loop's state: what to send next and what it cost."""

    def __init__(self, model: str, tokens: int) -> None:
        self.model = model
        self.tokens = tokens
        self.history: list[dict[str, object]] = []
        self.previous: str | None = None
        self.new_items: list[dict[str, object]] = [
            {"role": "user", "content": "Look up the records r1, r2, r3 and so on, in order."}
        ]
        self.bytes_sent = 0
        self.output_tokens = 0
        self.input_tokens = 0

    def body(self, *, chain: bool, store: bool) -> dict[str, object]:
        items = self.new_items if chain else [*self.history, *self.new_items]
        body: dict[str, object] = {
            "model": self.model,
            "instructions": INSTRUCTIONS,
            "input": items,
            "tools": TOOLS,
            "tool_choice": {"type": "function", "name": "lookup"},
            "parallel_tool_calls": False,
            "max_output_tokens": self.tokens,
            "temperature": 0,
            "store": store,
        }
        if chain and self.previous is not None:
            body["previous_response_id"] = self.previous
        return body

    def sent(self, payload: bytes) -> None:
        self.bytes_sent += len(payload)

    def finished(self, response: dict) -> None:
        """Take a finished response: its call gets an answer, the next step's input."""
        if response.get("status") not in ("completed", "incomplete"):
            raise SystemExit(f"a step failed: {json.dumps(response)[:500]}")
        usage = response["usage"]
        self.output_tokens += usage["output_tokens"]
        self.input_tokens += usage["input_tokens"]
        calls = [item for item in response["output"] if item["type"] == "function_call"]
        if not calls:
            raise SystemExit(f"no function call: {json.dumps(response)[:500]}")
        self.history += self.new_items + response["output"]
        answer = {
            "type": "function_call_output",
            "call_id": calls[0]["call_id"],
            "output": json.dumps({"found": True, "value": len(self.history)}),
        }
        self.new_items = [answer]
        self.previous = response["id"]


def _sse_events(response: httpx.Response) -> Iterator[dict]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[6:])


def http_step(client: httpx.Client, url: str, loop: Loop, *, chain: bool) -> None:
    payload = json.dumps({**loop.body(chain=chain, store=chain), "stream": True}).encode()
    loop.sent(payload)
    headers = {"content-type": "application/json"}
    with client.stream("POST", f"{url}/v1/responses", content=payload, headers=headers) as answer:
        answer.raise_for_status()
        for event in _sse_events(answer):
            if event["type"] in ENDED:
                loop.finished(event.get("response", event))
                return
    raise SystemExit("the stream ended without a final event")


def ws_step(socket: ClientConnection, loop: Loop) -> None:
    payload = json.dumps({"type": "response.create", **loop.body(chain=True, store=False)})
    loop.sent(payload.encode())
    socket.send(payload)
    while True:
        event = json.loads(socket.recv())
        if event["type"] in ENDED:
            loop.finished(event.get("response", event))
            return


def run_loop(mode: str, url: str, model: str, steps: int, tokens: int) -> dict[str, float]:
    loop = Loop(model, tokens)
    started = time.perf_counter()
    if mode == "ws-chain":
        with connect(url.replace("http://", "ws://") + "/v1/responses") as socket:
            for _ in range(steps):
                ws_step(socket, loop)
    else:
        with httpx.Client(timeout=600) as client:
            for _ in range(steps):
                http_step(client, url, loop, chain=mode == "http-chain")
    return {
        "seconds": time.perf_counter() - started,
        "bytes_sent": loop.bytes_sent,
        "output_tokens": loop.output_tokens,
        "input_tokens": loop.input_tokens,
    }


MODES = ("http-full", "http-chain", "ws-chain")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--port", type=int, default=18196)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tokens", type=int, default=64, help="max_output_tokens of a step")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    server = start_server(args.port, ["--model", args.model] if args.model else [])
    url = f"http://127.0.0.1:{args.port}"
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    try:
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        run_loop("http-chain", url, model, 3, args.tokens)  # warm up
        for _ in range(args.rounds):
            for mode in MODES:
                results[mode].append(run_loop(mode, url, model, args.steps, args.tokens))
    finally:
        server.terminate()
        server.wait(30)
    report = _report(results, args.steps)
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _report(results: dict[str, list[dict[str, float]]], steps: int) -> dict[str, object]:
    medians = {m: statistics.median(r["seconds"] for r in runs) for m, runs in results.items()}
    base = medians["ws-chain"]
    return {
        "steps": steps,
        "modes": {
            mode: {
                "loop_seconds_median": round(medians[mode], 3),
                "loop_seconds_all": [round(r["seconds"], 3) for r in runs],
                "vs_ws_chain": round(medians[mode] / base, 3),
                "overhead_per_step_ms_vs_ws": round((medians[mode] - base) / steps * 1000, 1),
                "client_bytes_sent": int(runs[0]["bytes_sent"]),
                "output_tokens": sorted({int(r["output_tokens"]) for r in runs}),
                "input_tokens": sorted({int(r["input_tokens"]) for r in runs}),
            }
            for mode, runs in results.items()
        },
    }


if __name__ == "__main__":
    raise SystemExit(main())
