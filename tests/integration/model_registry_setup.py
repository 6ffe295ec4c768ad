"""Test setup for the model registry: a models folder with the real GGUFs, manifests, the
server's process-tree memory, and streaming clients that report how each request ended.

The folder holds hard links to the real model files (copies when /tmp is another
filesystem), so paths stay inside the folder as the registry requires, at no disk cost.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml


@functools.cache
def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def link_into(folder: Path, source: str, name: str) -> Path:
    """`folder/name` naming the same bytes as `source` (hard link, else a copy)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    if not target.exists():
        try:
            os.link(source, target)
        except OSError:
            shutil.copyfile(source, target)
    return target


def write_truncated(folder: Path, source: str, name: str, num_bytes: int) -> Path:
    """A corrupt model: the first `num_bytes` of `source`."""
    target = folder / name
    with open(source, "rb") as src, open(target, "wb") as dst:
        dst.write(src.read(num_bytes))
    return target


def entry(model_id: str, path: Path, source: str, **fields: object) -> dict[str, object]:
    """A manifest entry for `path` (relative to the manifest's folder), hashed from `source`."""
    return {"id": model_id, "path": path.name, "sha256": sha256_file(source), **fields}


def write_manifest(path: Path, entries: list[dict[str, object]]) -> None:
    """Replace the manifest atomically (temp file + rename), as an operator's tool would."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(yaml.safe_dump({"models": entries}), encoding="utf-8")
    temporary.replace(path)


def write_config(path: Path, manifest: Path, **sections: dict[str, object]) -> Path:
    config = {"registry": {"path": str(manifest), "poll_interval_ms": 200}, **sections}
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and all its descendants (the server and its workers)."""
    children: dict[int, list[int]] = {}
    for entry_name in os.listdir("/proc"):
        if not entry_name.isdigit():
            continue
        try:
            with open(f"/proc/{entry_name}/stat", encoding="utf-8") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry_name))
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        stack.extend(children.get(current, []))
        try:
            with open(f"/proc/{current}/status", encoding="utf-8") as file:
                for line in file:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def admin_models(url: str) -> dict[str, list[dict[str, object]]]:
    """GET /v1/admin/models, as {id: [its entries]} (a swapped model has two while retiring)."""
    data = httpx.get(f"{url}/v1/admin/models", timeout=30).json()["data"]
    models: dict[str, list[dict[str, object]]] = {}
    for model in data:
        models.setdefault(str(model["id"]), []).append(model)
    return models


@dataclass
class StreamOutcome:
    """How one streamed completion ended, as the client saw it."""

    status: int
    fingerprints: set[str] = field(default_factory=set)
    num_text_chunks: int = 0
    finish_reason: str | None = None
    completion_tokens: int | None = None
    done: bool = False  # saw `data: [DONE]`
    error: str | None = None
    started_at: float = 0.0  # monotonic seconds, sent / answered or failed
    ended_at: float = 0.0

    def ok(self, max_tokens: int) -> bool:
        """Complete and untruncated: 200, a finish reason, the usage chunk, [DONE], and
        every token up to max_tokens when it stopped for length."""
        if self.status != 200 or self.error or not self.done or self.finish_reason is None:
            return False
        if self.finish_reason == "length":
            return self.completion_tokens == max_tokens
        return self.finish_reason == "stop" and self.completion_tokens is not None


async def stream_completion(
    client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int
) -> StreamOutcome:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    outcome = StreamOutcome(status=0, started_at=time.monotonic())
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            outcome.status = response.status_code
            if response.status_code != 200:
                outcome.error = (await response.aread()).decode(errors="replace")
            else:
                async for line in response.aiter_lines():
                    _read_event(outcome, line)
    except httpx.HTTPError as exc:
        outcome.status, outcome.error = 0, f"{type(exc).__name__}: {exc}"
    outcome.ended_at = time.monotonic()
    return outcome


def _read_event(outcome: StreamOutcome, line: str) -> None:
    if not line.startswith("data: "):
        return
    data = line.removeprefix("data: ")
    if data == "[DONE]":
        outcome.done = True
        return
    event = json.loads(data)
    if "error" in event:
        outcome.error = str(event["error"])
        return
    outcome.fingerprints.add(event["system_fingerprint"])
    for choice in event["choices"]:
        outcome.num_text_chunks += 1 if choice["text"] else 0
        outcome.finish_reason = choice["finish_reason"] or outcome.finish_reason
    if event.get("usage"):
        outcome.completion_tokens = event["usage"]["completion_tokens"]


async def streams_during(
    url: str, model: str, action: asyncio.Task[httpx.Response], *, clients: int, max_tokens: int
) -> list[StreamOutcome]:
    """`clients` concurrent streaming clients, each sending completions back to back while
    `action` runs and one more after it ended (so streams span its whole duration)."""

    async def client_loop(index: int) -> list[StreamOutcome]:
        outcomes = []
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            while True:
                finished = action.done()
                prompt = f"Story {index}: once upon a time"
                outcomes.append(await stream_completion(client, model, prompt, max_tokens))
                if finished:
                    return outcomes

    results = await asyncio.gather(*(client_loop(i) for i in range(clients)))
    return [outcome for outcomes in results for outcome in outcomes]


def write_lora(
    target: Path,
    base_gguf: str,
    *,
    rank: int = 4,
    targets: tuple[str, ...] = ("attn_q", "attn_v"),
    std: float = 0.25,
    seed: int = 0,
) -> Path:
    """A real LoRA adapter GGUF for `base_gguf`, written with the `gguf` package: rank
    `rank` A/B pairs (`blk.N.<target>.weight.lora_a/_b`, random normal × `std`, seeded) for
    every layer's `targets`, with the metadata llama.cpp reads (`general.type adapter`,
    `adapter.type lora`, `adapter.lora.alpha`). The delta is large enough to change the
    logits measurably."""
    import gguf  # noqa: PLC0415  # a dev dependency, only for this generator
    import numpy as np  # noqa: PLC0415

    reader = gguf.GGUFReader(base_gguf)
    field = reader.fields["general.architecture"]
    architecture = bytes(field.parts[field.data[0]]).decode()
    writer = gguf.GGUFWriter(str(target), architecture)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(rank))
    rng = np.random.default_rng(seed)
    for tensor in reader.tensors:
        parts = tensor.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in targets:
            continue
        n_in, n_out = (int(n) for n in tensor.shape[:2])  # GGUF order: ne0 = input width
        lora_a = (rng.standard_normal((rank, n_in)) * std).astype(np.float32)
        lora_b = (rng.standard_normal((n_out, rank)) * std).astype(np.float32)
        writer.add_tensor(f"{tensor.name}.lora_a", lora_a)
        writer.add_tensor(f"{tensor.name}.lora_b", lora_b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
