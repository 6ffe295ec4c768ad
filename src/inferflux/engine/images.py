"""Image files → pixels, safely (issue 28): sniffing, a header-only probe, and decoding.

Owns: telling PNG, JPEG, WebP and GIF apart by their magic bytes (never by what a client
says the content type is), reading a file's size from its header without decoding it
(`probe_image`: the API refuses oversized images before any pixel is decoded), and
decoding (`decode_image`: the first frame of an animation, EXIF orientation applied, any
mode → 8-bit RGB). The decompression-bomb limit (`max_pixels`) is checked from the header
before the pixels are decoded: `Image.open` is lazy, so the check costs a header read.
Pure Python over Pillow, no llama.cpp: the API process and the workers both import it.
Does not own fetching images nor encoding them for a model.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

from PIL import Image, ImageOps

__all__ = [
    "FORMATS",
    "DecodedImage",
    "ImageError",
    "ImageProbe",
    "decode_image",
    "probe_image",
    "sniff_format",
]

# The formats taken, by the name Pillow gives their plugin.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF")

# Any error Pillow raises on a corrupt, truncated or unsupported file.
_PIL_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


class ImageError(ValueError):
    """The bytes are not an image this server takes (unknown format, corrupt, truncated,
    too many pixels). `message` says which, fit for a 400."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class ImageProbe:
    """What a file's header says: its format (one of `FORMATS`) and its size in pixels."""

    format: str
    width: int
    height: int

    @property
    def num_pixels(self) -> int:
        return self.width * self.height


@dataclass(frozen=True, slots=True)
class DecodedImage:
    """An image as packed 8-bit RGB rows (`len(rgb) == width * height * 3`)."""

    rgb: bytes
    width: int
    height: int
    format: str


def sniff_format(data: bytes) -> str | None:
    """The format of `data` by its magic bytes (one of `FORMATS`), or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if len(data) >= 12 and data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def _open(data: bytes, max_pixels: int) -> tuple[Image.Image, ImageProbe]:
    """The lazily opened image (header read, no pixels decoded) and its probe. Raises
    ImageError for an unknown format, an unreadable header or more than `max_pixels`."""
    fmt = sniff_format(data)
    if fmt is None:
        raise ImageError("the data is not a PNG, JPEG, WebP or GIF image")
    try:
        # NOTE: Pillow's own bomb check warns or raises at its global MAX_IMAGE_PIXELS;
        # ours (max_pixels, below) is the one that decides, so its warning is silenced
        # (with the others a hostile file may cause: `_quiet`).
        with _quiet():
            image = Image.open(io.BytesIO(data), formats=[fmt])
    except Image.DecompressionBombError:
        raise ImageError(
            f"the {fmt} image has more than {max_pixels} pixels (multimodal.max_pixels)"
        ) from None
    except _PIL_ERRORS:
        raise ImageError(f"the {fmt} image is corrupt or truncated") from None
    width, height = image.size
    probe = ImageProbe(fmt, width, height)
    if width < 1 or height < 1:
        raise ImageError(f"the {fmt} image has no pixels ({width}x{height})")
    if probe.num_pixels > max_pixels:
        raise ImageError(
            f"the {fmt} image is {width}x{height} = {probe.num_pixels} pixels; the limit is "
            f"{max_pixels} (multimodal.max_pixels)"
        )
    return image, probe


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No warnings from Pillow about the file (corrupt EXIF, its own bomb limit): they are
    about hostile input, which is refused or decoded as far as it goes, never news for
    the log. NOTE: `catch_warnings` swaps process-wide filters; a race between threads
    can only mix up which warnings show, never the decoding."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def probe_image(data: bytes, *, max_pixels: int) -> ImageProbe:
    """Format and size from the header only (no pixel is decoded). Raises ImageError
    (module docstring). A file whose header is fine may still fail `decode_image`."""
    image, probe = _open(data, max_pixels)
    image.close()
    return probe


def decode_image(data: bytes, *, max_pixels: int) -> DecodedImage:
    """The first frame of `data` as RGB, EXIF orientation applied; transparency is
    composited over white. Raises ImageError for an unknown format, a corrupt or truncated
    file, or more than `max_pixels` pixels (checked before decoding)."""
    image, probe = _open(data, max_pixels)
    try:
        with image, _quiet():
            image.seek(0)  # the first frame of a GIF or animated WebP
            image.load()
            frame = ImageOps.exif_transpose(image) or image
            rgb = _to_rgb(frame)
    except _PIL_ERRORS:
        raise ImageError(f"the {probe.format} image is corrupt or truncated") from None
    return DecodedImage(rgb.tobytes(), rgb.width, rgb.height, probe.format)


def _to_rgb(image: Image.Image) -> Image.Image:
    """`image` in mode RGB; an alpha channel (or a palette's transparency) over white."""
    if image.mode == "RGB":
        return image
    has_alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
    if not has_alpha:
        return image.convert("RGB")
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")
