"""engine/images.py: sniffing by magic bytes, the header-only probe and its
decompression-bomb limit, decoding (first GIF frame, EXIF orientation, alpha → RGB),
corrupt and truncated files."""

from __future__ import annotations

import contextlib
import io
import random
import struct
import zlib

import pytest
from PIL import Image

from inferflux.engine.images import ImageError, decode_image, probe_image, sniff_format

MAX_PIXELS = 33_177_600


def encode(image: Image.Image, fmt: str, **params: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **params)
    return out.getvalue()


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims `width` x `height` (RGB, 8 bit) and that holds no pixels."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IEND", b"")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_sniff_and_probe_each_format(fmt):
    data = encode(Image.new("RGB", (12, 7), (200, 10, 10)), fmt)
    assert sniff_format(data) == fmt
    probe = probe_image(data, max_pixels=MAX_PIXELS)
    assert (probe.format, probe.width, probe.height, probe.num_pixels) == (fmt, 12, 7, 84)


@pytest.mark.parametrize(
    "data", [b"", b"hello", b"<svg xmlns='http://www.w3.org/2000/svg'/>", b"BM" + bytes(60)]
)
def test_other_bytes_are_no_format(data):
    assert sniff_format(data) is None
    with pytest.raises(ImageError, match="not a PNG, JPEG, WebP or GIF"):
        probe_image(data, max_pixels=MAX_PIXELS)


def test_the_client_content_type_is_never_used():
    """A JPEG is a JPEG whatever it is called: only the bytes count."""
    data = encode(Image.new("RGB", (4, 4)), "JPEG")
    assert sniff_format(data) == "JPEG"


def test_a_huge_header_is_refused_before_decoding():
    """100k x 100k pixels claimed by the header: refused from the header alone (the file
    holds no pixel data at all, so any decoding attempt would fail differently)."""
    data = png_header(100_000, 100_000)
    with pytest.raises(ImageError, match=r"more than 33177600 pixels \(multimodal.max_pixels"):
        probe_image(data, max_pixels=MAX_PIXELS)
    with pytest.raises(ImageError, match="more than 33177600 pixels"):
        decode_image(data, max_pixels=MAX_PIXELS)
    # under Pillow's own bomb limit, the header's size is reported
    data = png_header(8000, 5000)
    with pytest.raises(ImageError, match=r"8000x5000 = 40000000 pixels; the limit is 33177600"):
        probe_image(data, max_pixels=MAX_PIXELS)


def test_the_pixel_limit_is_the_setting_not_pillows():
    data = encode(Image.new("RGB", (100, 100)), "PNG")
    assert probe_image(data, max_pixels=10_000).num_pixels == 10_000
    with pytest.raises(ImageError, match="the limit is 9999"):
        decode_image(data, max_pixels=9_999)


def test_truncated_and_corrupt_files():
    data = encode(Image.effect_noise((64, 64), 64).convert("RGB"), "PNG")
    with pytest.raises(ImageError, match="corrupt or truncated"):
        decode_image(data[: len(data) // 2], max_pixels=MAX_PIXELS)
    jpeg = encode(Image.effect_noise((64, 64), 64).convert("RGB"), "JPEG")
    with pytest.raises(ImageError, match="JPEG image is corrupt or truncated"):
        decode_image(jpeg[:200], max_pixels=MAX_PIXELS)
    with pytest.raises(ImageError, match="PNG image is corrupt or truncated"):
        probe_image(b"\x89PNG\r\n\x1a\n" + b"\x00" * 30, max_pixels=MAX_PIXELS)


def test_decode_gives_rgb_rows():
    image = Image.new("RGB", (3, 2), (1, 2, 3))
    decoded = decode_image(encode(image, "PNG"), max_pixels=MAX_PIXELS)
    assert (decoded.width, decoded.height, decoded.format) == (3, 2, "PNG")
    assert decoded.rgb == bytes([1, 2, 3]) * 6


def test_gif_first_frame():
    frames = [Image.new("RGB", (8, 8), color) for color in ((255, 0, 0), (0, 0, 255))]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:], duration=50)
    decoded = decode_image(out.getvalue(), max_pixels=MAX_PIXELS)
    assert decoded.format == "GIF"
    assert decoded.rgb[:3] == bytes([255, 0, 0])


def test_exif_orientation_is_applied():
    image = Image.new("RGB", (40, 20), (0, 200, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    decoded = decode_image(encode(image, "JPEG", exif=exif), max_pixels=MAX_PIXELS)
    assert (decoded.width, decoded.height) == (20, 40)


@pytest.mark.parametrize("mode", ["RGBA", "LA", "L", "P"])
def test_any_mode_becomes_rgb(mode):
    image = Image.new("RGBA", (5, 5), (0, 0, 0, 0)).convert(mode)
    decoded = decode_image(encode(image, "PNG"), max_pixels=MAX_PIXELS)
    assert len(decoded.rgb) == 5 * 5 * 3
    if mode in ("RGBA", "LA"):  # fully transparent → the white background
        assert decoded.rgb[:3] == b"\xff\xff\xff"


def test_mutated_files_only_ever_raise_image_error():
    """A small fuzz: bytes flipped and files cut in every format give an image or an
    ImageError, never another exception."""
    rng = random.Random(7)
    image = Image.effect_noise((32, 24), 40).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = 6
    files = [encode(image, fmt) for fmt in ("PNG", "WEBP", "GIF")]
    files.append(encode(image, "JPEG", exif=exif))
    for _ in range(1500):
        data = bytearray(rng.choice(files))
        for _ in range(rng.randint(1, 6)):
            position = rng.randrange(len(data))
            if rng.random() < 0.3 and position > 16:
                del data[position:]
            else:
                data[position] = rng.randrange(256)
        for call in (probe_image, decode_image):
            with contextlib.suppress(ImageError):
                call(bytes(data), max_pixels=10_000_000)
