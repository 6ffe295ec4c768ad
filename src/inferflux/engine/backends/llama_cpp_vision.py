"""Images through llama.cpp's libmtmd: an mmproj turns pixels into text-model embeddings.

Owns: loading an mmproj against a loaded text model (`VisionEncoder`), encoding one RGB
image into the segments the text model reads (`EncodedImage`: the text tokens libmtmd
wraps an image in, and the image embeddings), and decoding embedding rows of several
sequences in one `llama_decode` (`decode_embeddings`). Does not own: decoding images
(Pillow, in the API process), the prompt layout, KV bookkeeping, or scheduling.

NOTE: a VisionEncoder is not thread-safe (libmtmd keeps the last output in its context);
call `encode` from one thread at a time. Embeddings are copied out of libmtmd, so an
`EncodedImage` outlives the encoder and can be cached by `sha256`.

NOTE: libmtmd wraps some images in tokens it looks up in the text model's vocab by their
text (idefics3: `<fake_token_around_image>`, `<global-img>`). A vocab without them
(SmolLM2-135M with the demo mmproj, models/demo_vision.py) gets LLAMA_TOKEN_NULL (-1),
which `llama_decode` refuses; `encode` drops those tokens.
"""

from __future__ import annotations

import ctypes
import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as ll  # isort: split

import llama_cpp.mtmd_cpp as mtmd
import numpy as np
from PIL import Image, ImageOps

from inferflux.engine.gguf_metadata import read_gguf_metadata
from inferflux.errors import EngineError, ModelLoadError

__all__ = [
    "EmbeddingRows",
    "EncodedImage",
    "ImageChunk",
    "VisionEncoder",
    "VisionError",
    "decode_embeddings",
    "rgb_pixels",
]

logger = logging.getLogger(__name__)

_LLAMA_TOKEN_NULL = -1
_CHUNK_TEXT, _CHUNK_IMAGE = mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT, mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE
_LOG_LEVELS = {3: logging.WARNING, 4: logging.ERROR}  # ggml_log_level; the rest: debug


def _log_to_python(level: int, text: bytes | None, _user_data: Any) -> None:  # Any: void*
    if text:
        message = text.decode("utf-8", "replace").rstrip()
        logger.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s", message)


# Kept referenced for the process lifetime: libmtmd holds the pointer.
_log_callback = ll.llama_log_callback(_log_to_python)


class VisionError(EngineError):
    """libmtmd could not encode an image (or the mmproj needs what InferFlux lacks)."""

    code = "vision_error"


@dataclass(frozen=True, slots=True)
class ImageChunk:
    """One image chunk's embeddings: float32 [n_tokens, n_embd], C-contiguous, owned."""

    embeddings: np.ndarray
    n_pos: int  # positions the chunk takes (n_tokens unless M-RoPE)
    non_causal: bool = False  # decode with causal attention off (Gemma 3 style)

    @property
    def n_tokens(self) -> int:
        return int(self.embeddings.shape[0])


Segment = tuple[int, ...] | ImageChunk


@dataclass(frozen=True, slots=True)
class EncodedImage:
    """An image as the text model reads it, in order: text token runs libmtmd puts around
    and between the image's tiles, and the tiles' embeddings."""

    sha256: str
    segments: tuple[Segment, ...]

    @property
    def n_tokens(self) -> int:
        """KV cells (and batch entries) the image takes."""
        return sum(len(s) if isinstance(s, tuple) else s.n_tokens for s in self.segments)

    @property
    def n_pos(self) -> int:
        """Positions the image advances a sequence by."""
        return sum(len(s) if isinstance(s, tuple) else s.n_pos for s in self.segments)


class VisionEncoder:
    """An mmproj loaded against a text model (`llama_model*`, which must outlive it).

    `n_threads`: the vision tower's CPU threads. A small tower wants 1: with 2 threads on
    a busy 2-core machine, ggml's spinning thread barrier turned a 4-25 ms encode of the
    demo mmproj into 0.1-3 s."""

    def __init__(
        self, mmproj_path: str | Path, model: Any, *, n_threads: int, use_gpu: bool = False
    ):  # Any: llama_model*
        self._path = str(mmproj_path)
        # the width of the model's input embeddings (what libmtmd checks and outputs)
        self.n_embd = int(ll.llama_model_n_embd_inp(model))
        self._ctx = self._init_context(model, n_threads, use_gpu)
        self.marker: str = (mtmd.mtmd_default_marker() or b"<__media__>").decode()
        self.non_causal = bool(mtmd.mtmd_decode_use_non_causal(self._ctx, None))
        self.uses_mrope = bool(mtmd.mtmd_decode_use_mrope(self._ctx))
        self._check_supported()

    def _init_context(self, model: Any, n_threads: int, use_gpu: bool) -> Any:
        # Any: mtmd_context*
        if not Path(self._path).is_file():
            raise ModelLoadError(f"mmproj file {self._path} does not exist")
        mtmd.mtmd_log_set(_log_callback, ctypes.c_void_p(0))
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        params.warmup = False
        ctx = mtmd.mtmd_init_from_file(self._path.encode(), model, params)
        if not ctx:
            raise ModelLoadError(self._load_failure())
        return ctx

    def _load_failure(self) -> str:
        """Why mtmd_init_from_file refused the file, as far as its header tells."""
        try:
            values = read_gguf_metadata(Path(self._path)).values
        except ModelLoadError as exc:
            return f"mmproj {self._path} is not a readable GGUF file: {exc}"
        projection = values.get("clip.vision.projection_dim")
        if isinstance(projection, int) and projection != self.n_embd:
            return (
                f"mmproj {self._path} projects to {projection} dims but the model's "
                f"embeddings have {self.n_embd}: it was made for another model"
            )
        kind = values.get("clip.projector_type") or values.get("clip.vision.projector_type")
        return (
            f"llama.cpp could not load mmproj {self._path} (projector {kind!r}): not a "
            "vision projector this llama.cpp build supports, or not for this model"
        )

    def _check_supported(self) -> None:
        problem = None
        if not mtmd.mtmd_support_vision(self._ctx):
            problem = "has no vision encoder"
        elif self.uses_mrope:
            problem = "uses M-RoPE positions (Qwen-VL style), which InferFlux does not support"
        if problem is not None:
            self.close()
            raise ModelLoadError(f"mmproj {self._path} {problem}")

    def encode(self, rgb: bytes, width: int, height: int, sha256: str) -> EncodedImage:
        """Encode one image of packed RGB bytes (row-major, 3 bytes a pixel)."""
        if width <= 0 or height <= 0 or len(rgb) != width * height * 3:
            raise VisionError(f"image of {len(rgb)} bytes is not {width}x{height} RGB")
        if not self._ctx:
            raise VisionError("the vision encoder is closed")
        pixels = (ctypes.c_uint8 * len(rgb)).from_buffer_copy(rgb)
        bitmap = mtmd.mtmd_bitmap_init(width, height, pixels)
        if not bitmap:
            raise VisionError(f"libmtmd refused a {width}x{height} bitmap")
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            mtmd.mtmd_bitmap_set_id(bitmap, sha256.encode())
            self._tokenize(chunks, bitmap)
            segments = tuple(self._segment(chunks, i) for i in range(_n_chunks(chunks)))
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bitmap)
        return EncodedImage(sha256, tuple(s for s in segments if not _is_empty(s)))

    def _tokenize(self, chunks: Any, bitmap: Any) -> None:  # Any: mtmd pointers
        marker = self.marker.encode()
        text = mtmd.mtmd_input_text()
        text.text, text.text_len = marker, len(marker)
        text.add_special, text.parse_special = False, True
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        rc = mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(text), bitmaps, 1)
        if rc != 0:
            raise VisionError(f"libmtmd could not tokenize the image (mtmd_tokenize: {rc})")

    def _segment(self, chunks: Any, index: int) -> Segment:  # Any: mtmd_input_chunks*
        chunk = mtmd.mtmd_input_chunks_get(chunks, index)
        kind = mtmd.mtmd_input_chunk_get_type(chunk)
        if kind == _CHUNK_TEXT:
            n = ctypes.c_size_t()
            tokens = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            return tuple(t for t in tokens[: n.value] if t != _LLAMA_TOKEN_NULL)
        if kind != _CHUNK_IMAGE:
            raise VisionError(f"libmtmd gave a chunk of type {kind} for an image")
        rc = mtmd.mtmd_encode_chunk(self._ctx, chunk)
        output = mtmd.mtmd_get_output_embd(self._ctx)
        if rc != 0 or not output:
            raise VisionError(f"libmtmd could not encode the image (mtmd_encode_chunk: {rc})")
        n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
        view = np.ctypeslib.as_array(output, shape=(n_tokens * self.n_embd,))
        return ImageChunk(
            embeddings=view.reshape(n_tokens, self.n_embd).copy(),
            n_pos=int(mtmd.mtmd_input_chunk_get_n_pos(chunk)),
            non_causal=bool(mtmd.mtmd_decode_use_non_causal(self._ctx, chunk)),
        )

    def close(self) -> None:
        """Free libmtmd's context (idempotent)."""
        if self._ctx:
            mtmd.mtmd_free(self._ctx)
            self._ctx = None


def rgb_pixels(data: bytes) -> tuple[bytes, int, int]:
    """An encoded image file (PNG, JPEG, WebP, GIF: its first frame) as packed RGB bytes,
    width, height, upright per its EXIF orientation; alpha is dropped (as llama.cpp's own
    loader does). The API has sniffed and size-checked the file already."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.seek(0)
            upright = ImageOps.exif_transpose(img).convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise VisionError(f"the image could not be decoded: {exc}") from exc
    return upright.tobytes(), upright.width, upright.height


def _n_chunks(chunks: Any) -> int:  # Any: mtmd_input_chunks*
    return int(mtmd.mtmd_input_chunks_size(chunks))


def _is_empty(segment: Segment) -> bool:
    return isinstance(segment, tuple) and not segment


# (seq_id, start_pos, embeddings float32 [n, n_embd], logits for the last row)
EmbeddingRows = tuple[int, int, np.ndarray, bool]


def decode_embeddings(
    ctx: Any, n_embd: int, rows: Sequence[EmbeddingRows], *, non_causal: bool = False
) -> int:
    """One `llama_decode` of embedding rows for several sequences (positions start_pos,
    start_pos + 1, ...); returns its rc (0: done). `non_causal` turns causal attention off
    for the call (all of an image chunk must then be in one ubatch: n_ubatch >= its
    n_tokens). The caller keeps the batch within the context's n_batch. Any: context*."""
    n_total = sum(int(r[2].shape[0]) for r in rows)
    if n_total == 0:
        return 0
    batch = ll.llama_batch_init(n_total, n_embd, 1)
    try:
        _fill_batch(batch, n_embd, rows, n_total)
        if not non_causal:
            return int(ll.llama_decode(ctx, batch))
        ll.llama_set_causal_attn(ctx, False)
        try:
            return int(ll.llama_decode(ctx, batch))
        finally:
            ll.llama_set_causal_attn(ctx, True)
    finally:
        ll.llama_batch_free(batch)


def _fill_batch(batch: Any, n_embd: int, rows: Sequence[EmbeddingRows], n_total: int) -> None:
    """Any: llama_batch."""
    embd = np.ctypeslib.as_array(batch.embd, shape=(n_total, n_embd))
    pos = np.ctypeslib.as_array(batch.pos, shape=(n_total,))
    n_seq_id = np.ctypeslib.as_array(batch.n_seq_id, shape=(n_total,))
    logits = np.ctypeslib.as_array(batch.logits, shape=(n_total,))
    n_seq_id[:] = 1
    logits[:] = 0
    i = 0
    for seq_id, start_pos, embeddings, want_logits in rows:
        n = int(embeddings.shape[0])
        if embeddings.ndim != 2 or embeddings.shape[1] != n_embd:
            raise VisionError(f"embeddings of shape {embeddings.shape} for n_embd {n_embd}")
        embd[i : i + n] = embeddings
        pos[i : i + n] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        for j in range(i, i + n):
            batch.seq_id[j][0] = seq_id
        if want_logits:
            logits[i + n - 1] = 1
        i += n
    batch.n_tokens = n_total
