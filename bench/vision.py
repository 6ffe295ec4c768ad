"""Images in (issue 28): what an image costs, and what image requests do to text streams.

`encode`: per image size, the API's header probe (sniff + size, before anything is
decoded), the worker's decode of the file to RGB (Pillow), and libmtmd's encode (its own
resize and normalisation, then the vision tower), with the demo mmproj on SmolLM2, each the
median of `--reps` runs. The spec's KPI is preprocessing < 150 ms per 1-megapixel image on
CPU: preprocessing is probe + decode here; the tower's time depends on the mmproj.

`itl`: a fresh `inferflux serve --model vision`; `--concurrency` text streams (chat, long
outputs) alone, beside one more client sending short text requests back to back, and
beside one sending the same requests each with a new image (`--image-size` JPEG as a data
URI). Alternated over `--rounds` rounds; the report gives the text streams' ITL p50/p99,
TTFT p50 and output tok/s per mode: "images" against "text" is what the images cost.

    .venv/bin/python bench/vision.py encode --json bench/results/vision_encode.json
    .venv/bin/python bench/vision.py itl --json bench/results/vision_itl.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from launch import kill_group, start_server
from serve_load import LoadConfig, RequestResult, stream_one
from workload import make_prompts, summarize

_PORT = 18447
SIZES = ((256, 256), (512, 512), (1024, 1024), (1600, 1200), (2048, 2048))


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A photo-like test image: smooth gradients plus noise (compresses like a photo)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], -1)
    pixels = np.clip(base + rng.normal(0, 18, base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def encoded(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def _median_ms(fn: Any, reps: int) -> float:  # Any: a no-argument callable
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def run_encode(args: argparse.Namespace) -> list[dict[str, Any]]:
    import llama_cpp as ll  # noqa: F401  (libllama before numpy users: engine/__init__)

    from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaCppBackend
    from inferflux.engine.backends.llama_cpp_vision import VisionEncoder
    from inferflux.models.demo_vision import demo_mmproj_path
    from inferflux.models.files import default_model_path

    backend = LlamaCppBackend(
        ContextConfig(
            model_path=str(default_model_path()),
            n_ctx_per_seq=2048,
            n_seq_max=1,
            n_batch=512,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            kv_unified=False,
        )
    )
    encoder = VisionEncoder(str(demo_mmproj_path()), backend.model_handle, n_threads=args.threads)
    rows = []
    for width, height in SIZES:
        for fmt in ("JPEG", "PNG"):
            rows.append(_measure(encoder, encoded(photo(width, height), fmt), fmt, args.reps))
            print(json.dumps(rows[-1]), flush=True)
    encoder.close()
    backend.close()
    return rows


def _measure(encoder: Any, data: bytes, fmt: str, reps: int) -> dict[str, Any]:
    from inferflux.engine.images import decode_image, probe_image

    max_pixels = 64_000_000
    image = decode_image(data, max_pixels=max_pixels)
    probe = _median_ms(lambda: probe_image(data, max_pixels=max_pixels), reps)
    decode = _median_ms(lambda: decode_image(data, max_pixels=max_pixels), reps)
    enc = _median_ms(lambda: encoder.encode(image.rgb, image.width, image.height, "x"), reps)
    return {
        "size": f"{image.width}x{image.height}",
        "megapixels": round(image.width * image.height / 1e6, 2),
        "format": fmt.lower(),
        "bytes": len(data),
        "probe_ms": round(probe, 2),
        "decode_ms": round(decode, 2),
        "preprocess_ms": round(probe + decode, 2),
        "encode_ms": round(enc, 2),
        "image_tokens": encoder.encode(image.rgb, image.width, image.height, "x").n_tokens,
    }


def data_uri(width: int, height: int, seed: int) -> str:
    data = encoded(photo(width, height, seed), "JPEG")
    return "data:image/jpeg;base64," + base64.b64encode(data).decode()


async def _side_client(
    client: httpx.AsyncClient,
    model: str,
    images: list[str] | None,
    stop: asyncio.Event,
    out: list[float],
) -> None:
    """Requests back to back beside the text streams: each with a new image (no reuse of an
    encoding or of KV), or the same request without the image (`images` None)."""
    index = 0
    while not stop.is_set():
        content: list[dict[str, Any]] = [{"type": "text", "text": f"Describe image {index}."}]
        if images is not None:
            content.insert(
                0, {"type": "image_url", "image_url": {"url": images[index % len(images)]}}
            )
        index += 1
        body = {
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 16,
        }
        started = time.perf_counter()
        response = await client.post("/v1/chat/completions", json=body)
        if response.status_code != 200:
            raise SystemExit(f"side request failed: {response.status_code} {response.text}")
        out.append(time.perf_counter() - started)


async def _text_round(
    config: LoadConfig, args: argparse.Namespace, mode: str, images: list[str]
) -> dict[str, Any]:
    prompts = make_prompts(args.concurrency * args.requests, args.seed, 20, 60)
    limits = httpx.Limits(max_connections=args.concurrency + 2)
    async with httpx.AsyncClient(base_url=config.url, timeout=600, limits=limits) as client:
        stop = asyncio.Event()
        side_s: list[float] = []
        side = None
        if mode != "alone":
            pictures = images if mode == "images" else None
            side = asyncio.create_task(_side_client(client, config.model, pictures, stop, side_s))
        started = time.perf_counter()

        async def one_client(mine: list[str]) -> list[RequestResult]:
            return [await stream_one(client, config, p) for p in mine]

        per_client = [prompts[i :: args.concurrency] for i in range(args.concurrency)]
        results = [r for rs in await asyncio.gather(*map(one_client, per_client)) for r in rs]
        wall_s = time.perf_counter() - started
        stop.set()
        if side is not None:
            await side
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise SystemExit(f"text streams failed: {failed[:3]}")
    itl = [x for r in results for x in r.itl_s]
    return {
        "mode": mode,
        "itl_p50_ms": summarize(itl).p50 * 1000,
        "itl_p99_ms": summarize(itl).p99 * 1000,
        "ttft_p50_ms": summarize([r.ttft_s or 0 for r in results]).p50 * 1000,
        "output_tok_s": sum(r.output_tokens for r in results) / wall_s,
        "side_requests": len(side_s),
        "side_request_p50_ms": statistics.median(side_s) * 1000 if side_s else None,
    }


def run_itl(args: argparse.Namespace) -> list[dict[str, Any]]:
    server = start_server(_PORT, ["--model", "vision"])
    try:
        url = f"http://127.0.0.1:{_PORT}"
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        config = LoadConfig(
            url=url,
            model=model,
            endpoint="chat",
            max_tokens=args.max_tokens,
            requests_per_client=args.requests,
            seed=args.seed,
            min_words=20,
            max_words=60,
        )
        # made before the rounds: encoding JPEGs in this process would stall its clients
        per_round = 40  # distinct images a round (about 20 are sent): none is seen twice
        images = [
            data_uri(args.image_size, args.image_size, seed)
            for seed in range(per_round * args.rounds)
        ]
        modes = ["alone", "text", "images"]
        rounds = []
        for index in range(args.rounds):
            mine = images[index * per_round : (index + 1) * per_round]
            for mode in modes if index % 2 == 0 else modes[::-1]:
                rounds.append(asyncio.run(_text_round(config, args, mode, mine)))
                print(json.dumps(rounds[-1]), flush=True)
    finally:
        kill_group(server)
    return [_median_of([r for r in rounds if r["mode"] == mode]) for mode in modes]


def _median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k, v in rounds[0].items() if isinstance(v, float)]
    merged = dict(rounds[0])
    for key in keys:
        merged[key] = round(statistics.median(r[key] for r in rounds), 2)
    merged["rounds"] = len(rounds)
    return merged


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["encode", "itl"])
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--reps", type=int, default=5, help="encode: runs per size (median)")
    parser.add_argument("--threads", type=int, default=2, help="encode: CPU threads")
    parser.add_argument("--concurrency", type=int, default=4, help="itl: text streams")
    parser.add_argument("--requests", type=int, default=3, help="itl: requests per stream")
    parser.add_argument("--max-tokens", type=int, default=128, help="itl: text output tokens")
    parser.add_argument("--image-size", type=int, default=1024, help="itl: image side, px")
    parser.add_argument("--rounds", type=int, default=2, help="itl: alternated rounds")
    parser.add_argument("--seed", type=int, default=7)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rows = run_encode(args) if args.part == "encode" else run_itl(args)
    report = {"part": args.part, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
