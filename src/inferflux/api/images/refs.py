"""Images as a request names them, before anything is fetched: `ImageRef` and `ImageSet`.

Owns parsing what every dialect sends (an OpenAI `image_url.url`: a data URI or an
http(s) URL; Ollama's bare base64; Anthropic's base64 / url sources) into `ImageRef`s,
each tagged with the request field it came from for 400s, and `ImageSet`, the images of
one prompt with the marker their place in the text is rendered as. Base64 is decoded
here (a malformed data URI is a 400 whatever the model); the limits, URL policy and
probing are resolve.py's. Error messages never quote the data (a data URI never reaches
a response or a log line).

The marker: each image renders as `ImageSet.marker` in the message text the chat
template sees, a per-request random string a client cannot guess, and the rendered
prompt is split there. A client's own text that spells mtmd's `<__media__>` (or anything
else) stays text and never becomes an image.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from inferflux.errors import InvalidRequest

_DATA_URI = re.compile(r"data:([^,;]*)((?:;[^,;]*)*),", re.IGNORECASE)
_WHITESPACE = re.compile(r"\s+")


class ImageRefError(ValueError):
    """A malformed image reference; `message` is fit for a 400 (it never quotes data)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image of a request: its bytes (a data URI or base64, decoded) or its URL (to
    fetch), and `param`, the request field it came from (`messages[0].content[1].image_url`)."""

    param: str
    data: bytes | None = None
    url: str | None = None


@dataclass(slots=True)
class ImageSet:
    """The images of one prompt, in the order their markers appear in its messages."""

    marker: str = field(default_factory=lambda: f"<__image_{secrets.token_hex(12)}__>")
    refs: list[ImageRef] = field(default_factory=list)

    def add(self, ref: ImageRef) -> str:
        """Record `ref` (mutates); returns the marker to put where the image stands."""
        self.refs.append(ref)
        return self.marker

    def __bool__(self) -> bool:
        return bool(self.refs)


def take_image(
    images: ImageSet | None, role: str, param: str, ref_at: Callable[[str], ImageRef]
) -> str:
    """The marker for an image part at `param` of a `role` message, recorded in `images`
    (None: images are not taken where this message is read); only user messages carry
    images. Raises InvalidRequest (400 naming the part)."""
    if images is None:
        raise InvalidRequest("images are not taken here", param=param)
    if role != "user":
        raise InvalidRequest("only user messages may carry images", param=param)
    return images.add(ref_at(param))


def decode_base64(text: str) -> bytes:
    """Standard base64 (whitespace ignored, padding required). Raises ImageRefError."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        pass  # line breaks (MIME-style wrapping)? strip whitespace only then: it costs a copy
    try:
        return base64.b64decode(_WHITESPACE.sub("", text), validate=True)
    except (binascii.Error, ValueError):
        raise ImageRefError("the image is not valid base64") from None


def parse_data_uri(uri: str) -> bytes:
    """The bytes of a base64 `data:` URI of an image (`data:image/png;base64,...`); its
    media type may be missing but never names a non-image type. The format itself is
    sniffed from the bytes later, never taken from the URI. Raises ImageRefError."""
    match = _DATA_URI.match(uri)
    if match is None:
        raise ImageRefError("the data URI is malformed: write data:image/png;base64,<base64>")
    media_type, params = match.group(1).strip().lower(), match.group(2).lower()
    if media_type and not media_type.startswith("image/"):
        raise ImageRefError(f"the data URI's media type '{media_type[:64]}' is not an image")
    if ";base64" not in params:
        raise ImageRefError("the data URI must be base64-encoded (data:image/png;base64,...)")
    data = decode_base64(uri[match.end() :])
    if not data:
        raise ImageRefError("the data URI holds no data")
    return data


def url_ref(url: str, param: str) -> ImageRef:
    """An OpenAI `image_url.url` (or Anthropic url source): a data URI, decoded now, or an
    http(s) URL, fetched later if the server allows URLs. Raises InvalidRequest (param
    `param`) for a malformed one."""
    try:
        return _url_ref(url, param)
    except ImageRefError as exc:
        raise InvalidRequest(exc.message, param=param) from None


def _url_ref(url: str, param: str) -> ImageRef:
    scheme = url.split(":", 1)[0].strip().lower() if ":" in url else ""
    if scheme == "data":
        return ImageRef(param, data=parse_data_uri(url.strip()))
    if scheme in ("http", "https"):
        return ImageRef(param, url=url.strip())
    shown = f"a '{scheme[:16]}' URL" if scheme.isalnum() else "this"
    raise ImageRefError(
        f"an image URL must be a data URI (data:image/png;base64,...) or an http(s) URL, "
        f"not {shown}"
    )


def base64_ref(text: str, param: str) -> ImageRef:
    """Ollama's `images` entry: bare base64 (a data URI is taken too). Raises
    InvalidRequest (param `param`) for a malformed one."""
    try:
        data = parse_data_uri(text) if text[:5].lower() == "data:" else decode_base64(text)
    except ImageRefError as exc:
        raise InvalidRequest(exc.message, param=param) from None
    if not data:
        raise InvalidRequest("the image is empty", param=param)
    return ImageRef(param, data=data)
