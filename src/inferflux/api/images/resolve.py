"""A prompt's `ImageRef`s → checked image files for the engine (`ImageInput`s).

Owns the API side's rules, in this order, so the cheapest refusal comes first: at most
`max_images_per_request` images; a URL only when `multimodal.allow_urls` is on; a model
that takes images (it has an mmproj); then per image the URL fetch (fetch.py), the size
limit, the format sniffed from the bytes and the header probe (`engine.images`: pixels
checked before anything is decoded); a request's URLs are fetched concurrently. Records
the multimodal metrics and logs each image's SHA-256 (never its bytes). Every refusal is
an InvalidRequest (400) naming the request field. Decoding pixels and encoding them is the worker's.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from inferflux.api.images.fetch import fetch_image
from inferflux.api.images.refs import ImageRef
from inferflux.config.multimodal_settings import MultimodalSettings
from inferflux.engine.images import ImageError, ImageProbe, probe_image
from inferflux.engine.protocol import ModelInfo
from inferflux.errors import InvalidRequest
from inferflux.observability.metrics import Metrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ResolvedImage:
    """An image checked and ready for the engine: its bytes, their SHA-256 and its probe."""

    sha256: str
    data: bytes
    probe: ImageProbe


def check_image_refs(
    refs: Sequence[ImageRef], settings: MultimodalSettings, model_info: ModelInfo
) -> None:
    """The request-wide checks that need no I/O (count, URL policy, a model that takes
    images). Raises InvalidRequest."""
    if len(refs) > settings.max_images_per_request:
        raise InvalidRequest(
            f"the request has {len(refs)} images; at most {settings.max_images_per_request} "
            "are taken (multimodal.max_images_per_request)",
            param=refs[settings.max_images_per_request].param,
        )
    for ref in refs:
        if ref.url is not None and not settings.allow_urls:
            raise InvalidRequest(
                "image URLs are not fetched on this server (multimodal.allow_urls is off); "
                "send the image inline as a data URI (data:image/png;base64,...)",
                param=ref.param,
            )
    if refs and not model_info.vision:
        raise InvalidRequest(
            f"model '{model_info.model_id}' does not take images: it has no mmproj",
            param=refs[0].param,
        )


async def resolve_image(ref: ImageRef, settings: MultimodalSettings) -> ResolvedImage:
    """`ref`'s bytes (fetched for a URL), size-checked, sniffed and probed. Raises
    InvalidRequest (param `ref.param`)."""
    data = ref.data
    if data is None:
        data = await fetch_image(ref.url or "", settings, ref.param)
    if len(data) > settings.max_image_bytes:
        raise InvalidRequest(
            f"the image is {len(data)} bytes; the limit is {settings.max_image_bytes} "
            "(multimodal.max_image_bytes)",
            param=ref.param,
        )
    try:
        probe = probe_image(data, max_pixels=settings.max_pixels)
    except ImageError as exc:
        raise InvalidRequest(exc.message, param=ref.param) from None
    return ResolvedImage(hashlib.sha256(data).hexdigest(), data, probe)


async def _timed(ref: ImageRef, settings: MultimodalSettings) -> tuple[ResolvedImage, float]:
    started = time.perf_counter()
    image = await resolve_image(ref, settings)
    return image, time.perf_counter() - started


async def _resolve_all(
    refs: Sequence[ImageRef], settings: MultimodalSettings
) -> list[tuple[ResolvedImage, float]]:
    """Every image with its preprocessing time. URLs are fetched concurrently (a request's
    fetches together take about one `fetch_timeout_s` at most, not one per URL); the
    first refusal cancels the other fetches."""
    if not any(ref.url is not None for ref in refs):
        return [await _timed(ref, settings) for ref in refs]
    tasks = [asyncio.ensure_future(_timed(ref, settings)) for ref in refs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def resolve_images(
    refs: Sequence[ImageRef],
    settings: MultimodalSettings,
    model_info: ModelInfo,
    metrics: Metrics | None = None,
) -> list[ResolvedImage]:
    """Every image of a request, checked (module docstring), in order. Raises
    InvalidRequest for the first refusal; counts the images and the request in
    `metrics` only when all of them are taken."""
    check_image_refs(refs, settings, model_info)
    timed = await _resolve_all(refs, settings)
    images = [image for image, _ in timed]
    timings = [preprocess_s for _, preprocess_s in timed]
    if images:
        logger.debug("request images: %s", ", ".join(f"sha256:{image.sha256}" for image in images))
    if metrics is not None and images:
        metrics.multimodal_requests.labels(metrics.model).inc()
        for image, preprocess_s in zip(images, timings, strict=True):
            metrics.observe_image(preprocess_s, len(image.data), image.probe.num_pixels)
    return images
