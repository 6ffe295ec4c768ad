"""Images of a prompt in the worker (issue 28): decode, encode with the mmproj, splice.

Owns: turning `AddRequest.images` into the prompt the scheduler runs, with each image's
tokens spliced in at its position (the text tokens libmtmd puts around an image, then one
pseudo token per embedding row), and keeping the embedding rows the backend decodes for
those pseudo tokens while a request may still need them. The slow part (decoding the file,
running the vision tower) runs on a thread of its own, so the decode loop keeps stepping
for everyone else. Does not own: sniffing and limits (engine/images.py), the libmtmd calls
(backends/llama_cpp_vision.py), cutting chunks at image boundaries (scheduler/request.py).

Pseudo tokens are negative: `-(key << 16 | row) - 1`, `key` 47 bits of the SHA-256 of
(mmproj id, image SHA-256, chunk index). So the same image under the same mmproj always
has the same ids: the prefix cache (and its disk tier, across restarts) reuses its KV, and
two different images never share KV. They never reach llama.cpp as tokens: the backend
decodes their rows as embeddings.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from inferflux.engine.images import ImageError, decode_image
from inferflux.engine.messages import AddRequest

if TYPE_CHECKING:
    from inferflux.engine.backends.llama_cpp_vision import EncodedImage, VisionEncoder

_ROW_BITS = 16  # rows per image chunk < 65,536
_KEY_BITS = 47  # key << 16 stays within int64 (KV blobs and msgpack carry the ids)
_MAX_ROWS = 1 << _ROW_BITS
_MAX_LAYOUTS = 256  # images remembered by SHA-256 (their rows may be evicted meanwhile)

# an encoded image: (text tokens, n) or (key of its embedding rows, n_rows), in order
_Layout = tuple[tuple[tuple[int, ...] | int, int], ...]


class ImagePromptError(Exception):
    """An image of the request cannot be used (a 400 for the client, with this code)."""

    code = "invalid_request"


class ImagePromptTooLong(ImagePromptError):
    """The prompt with its images' tokens leaves no room in the context."""

    code = "context_length_exceeded"


def is_image_token(token_id: int) -> bool:
    return token_id < 0


def _pseudo_ids(key: int, n_rows: int) -> list[int]:
    base = key << _ROW_BITS
    return [-(base | row) - 1 for row in range(n_rows)]


def _split(token_id: int) -> tuple[int, int]:
    value = -token_id - 1
    return value >> _ROW_BITS, value & (_MAX_ROWS - 1)


@dataclass(frozen=True, slots=True)
class PreparedPrompt:
    """The prompt with its images spliced in."""

    token_ids: list[int]
    image_spans: tuple[tuple[int, int], ...]  # [begin, end) of each run of pseudo tokens
    keys: tuple[int, ...]  # the embedding rows it needs (ImageRows keys)
    num_images: int
    encode_s: float  # decode + encode time of the images not found encoded already
    # the request's max_tokens cut to what the context leaves after the images' tokens (the
    # API checked the context with the text's tokens only)
    max_tokens: int


class ImageRows:
    """Embedding rows by key: pinned while a request may decode them, then kept in an LRU
    bounded by bytes for the next request with the same image. Thread-safe: the image
    thread adds, the engine thread reads and unpins."""

    def __init__(self, max_unpinned_bytes: int = 64 << 20) -> None:
        self._lock = threading.Lock()
        self._rows: OrderedDict[int, np.ndarray] = OrderedDict()
        self._pins: dict[int, int] = {}
        self._owners: dict[str, tuple[int, ...]] = {}
        self._max_bytes = max_unpinned_bytes

    def add(self, key: int, rows: np.ndarray) -> None:
        with self._lock:
            self._rows[key] = rows
            self._rows.move_to_end(key)

    def get(self, key: int) -> np.ndarray | None:
        with self._lock:
            rows = self._rows.get(key)
            if rows is not None:
                self._rows.move_to_end(key)
            return rows

    def pin(self, owner: str, keys: tuple[int, ...]) -> None:
        with self._lock:
            self._owners[owner] = keys
            for key in keys:
                self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, owner: str) -> None:
        with self._lock:
            for key in self._owners.pop(owner, ()):
                left = self._pins.get(key, 0) - 1
                if left > 0:
                    self._pins[key] = left
                else:
                    self._pins.pop(key, None)
            self._trim()

    def embeddings(self, token_ids: list[int]) -> np.ndarray:
        """The rows of these pseudo tokens, stacked (float32 [n, n_embd]). KeyError when a
        row is gone (a bug: rows stay pinned while their request lives)."""
        with self._lock:
            parts = []
            for token_id in token_ids:
                key, row = _split(token_id)
                parts.append(self._rows[key][row])
            return np.ascontiguousarray(np.stack(parts), dtype=np.float32)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(rows.nbytes for rows in self._rows.values())

    def _trim(self) -> None:
        unpinned = [k for k in self._rows if k not in self._pins]
        size = sum(self._rows[k].nbytes for k in unpinned)
        for key in unpinned:  # oldest first
            if size <= self._max_bytes:
                break
            size -= self._rows.pop(key).nbytes


class ImagePreparer:
    """Prepares requests with images on one background thread (the vision tower uses the
    cores a step would; one image at a time keeps a step's share predictable)."""

    def __init__(
        self,
        encoder: VisionEncoder,
        *,
        mmproj_id: str,
        max_pixels: int,
        rows: ImageRows,
        max_chunk_rows: int = _MAX_ROWS - 1,
        n_ctx: int = 1 << 30,
    ) -> None:
        """`max_chunk_rows`: the most rows one image chunk may have here (the backend's
        `max_image_rows`: a batch, or a ubatch for a non-causal tower). `n_ctx`: a
        request's context (prompt + output tokens)."""
        self._n_ctx = n_ctx
        self.encoder = encoder
        self.rows = rows
        self._mmproj_id = mmproj_id
        self._max_pixels = max_pixels
        self._max_chunk_rows = min(max_chunk_rows, _MAX_ROWS - 1)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="images")
        self._pending: dict[str, tuple[AddRequest, Future[PreparedPrompt]]] = {}
        self._layouts: OrderedDict[str, _Layout] = OrderedDict()  # image thread only
        self.num_images = 0
        self.encode_s = 0.0

    def __len__(self) -> int:
        return len(self._pending)

    def request_ids(self) -> list[str]:
        return list(self._pending)

    def submit(self, message: AddRequest) -> None:
        future = self._pool.submit(self._prepare, message)
        self._pending[message.request_id] = (message, future)

    def drop(self, request_ids: set[str]) -> list[AddRequest]:
        """Forget these pending requests (aborted): their messages."""
        dropped = []
        for request_id in request_ids & self._pending.keys():
            message, future = self._pending.pop(request_id)
            if not future.cancel():  # running or done: unpin what it pinned, once done
                future.add_done_callback(partial(self._unpin_prepared, request_id))
            dropped.append(message)
        return dropped

    def _unpin_prepared(self, request_id: str, future: Future[PreparedPrompt]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.rows.unpin(request_id)

    def done(self, wait_s: float) -> list[tuple[AddRequest, PreparedPrompt | ImagePromptError]]:
        """Requests whose images are ready (or failed: why), waiting up to `wait_s` for the
        first."""
        if not self._pending:
            return []
        if wait_s > 0:
            futures = [f for _, f in self._pending.values()]
            wait_futures(futures, timeout=wait_s, return_when="FIRST_COMPLETED")
        out: list[tuple[AddRequest, PreparedPrompt | ImagePromptError]] = []
        for request_id, (message, future) in list(self._pending.items()):
            if not future.done():
                continue
            del self._pending[request_id]
            exc = future.exception()
            if exc is None:
                prepared = future.result()
                self.num_images += prepared.num_images
                self.encode_s += prepared.encode_s
                out.append((message, prepared))
            elif isinstance(exc, ImagePromptError):
                out.append((message, exc))
            elif isinstance(exc, ImageError):
                out.append((message, ImagePromptError(str(exc))))
            else:
                out.append((message, ImagePromptError(f"the image could not be encoded: {exc}")))
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.encoder.close()

    # -- on the image thread ------------------------------------------------------------
    def _prepare(self, message: AddRequest) -> PreparedPrompt:
        prompt = message.prompt_token_ids
        tokens: list[int] = []
        spans: list[tuple[int, int]] = []
        keys: list[int] = []
        taken = 0
        encode_s = 0.0
        for image in sorted(message.images, key=lambda i: i.position):
            if not 0 <= image.position <= len(prompt):
                raise ImagePromptError(f"image position {image.position} is outside the prompt")
            tokens.extend(prompt[taken : image.position])
            taken = image.position
            layout = self._layout(image.sha256)
            if layout is None:
                started = time.perf_counter()
                layout = self._encode(image.data, image.sha256)
                encode_s += time.perf_counter() - started
            for key_or_tokens, n_rows in layout:
                if isinstance(key_or_tokens, tuple):  # text tokens around the image
                    tokens.extend(key_or_tokens)
                    continue
                keys.append(key_or_tokens)
                begin = len(tokens)
                tokens.extend(_pseudo_ids(key_or_tokens, n_rows))
                spans.append((begin, len(tokens)))
        tokens.extend(prompt[taken:])
        if spans and spans[-1][1] == len(tokens):
            raise ImagePromptError("the prompt cannot end with an image: add text after it")
        room = self._n_ctx - len(tokens)
        if room < 1:
            raise ImagePromptTooLong(
                f"the prompt is {len(tokens)} tokens with its images' tokens; this model's "
                f"context is {self._n_ctx}: send fewer or smaller images, or less text"
            )
        self.rows.pin(message.request_id, tuple(keys))
        max_tokens = min(message.sampling.max_tokens, room)
        return PreparedPrompt(
            tokens, tuple(spans), tuple(keys), len(message.images), encode_s, max_tokens
        )

    def _layout(self, sha256: str) -> _Layout | None:
        """The layout of an image encoded before whose rows are all still kept."""
        layout = self._layouts.get(sha256)
        if layout is None:
            return None
        if any(not isinstance(k, tuple) and self.rows.get(k) is None for k, _ in layout):
            del self._layouts[sha256]
            return None
        self._layouts.move_to_end(sha256)
        return layout

    def _encode(self, data: bytes, sha256: str) -> _Layout:
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ImagePromptError("an image's sha256 does not match its bytes")
        image = decode_image(data, max_pixels=self._max_pixels)
        encoded: EncodedImage = self.encoder.encode(image.rgb, image.width, image.height, sha256)
        layout: list[tuple[tuple[int, ...] | int, int]] = []
        for index, segment in enumerate(encoded.segments):
            if isinstance(segment, tuple):
                layout.append((segment, len(segment)))
                continue
            if len(segment.embeddings) > self._max_chunk_rows:
                raise ImagePromptError(
                    f"an image chunk takes {len(segment.embeddings)} tokens; this server "
                    f"decodes at most {self._max_chunk_rows} at once "
                    "(scheduler.max_batch_tokens)"
                )
            key = self._key(sha256, index)
            self.rows.add(key, segment.embeddings)
            layout.append((key, len(segment.embeddings)))
        self._layouts[sha256] = tuple(layout)
        while len(self._layouts) > _MAX_LAYOUTS:
            self._layouts.popitem(last=False)
        return tuple(layout)

    def _key(self, sha256: str, index: int) -> int:
        digest = hashlib.sha256(f"{self._mmproj_id}:{sha256}:{index}".encode()).digest()
        return int.from_bytes(digest[:8], "big") >> (64 - _KEY_BITS)
