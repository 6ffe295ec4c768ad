"""The libmtmd wrapper on real parts: SmolLM2-135M, the demo mmproj, llama.cpp's libmtmd.

Shapes and determinism of `VisionEncoder.encode`; `decode_embeddings` against libmtmd's
own path (`mtmd_helper_eval_chunk_single`, the reference implementation) for the same
prompt and image, greedy, token for token; two sequences in one decode; the errors.
Encode times are printed (run with -s), not asserted.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp as ll  # isort: split

import llama_cpp.mtmd_cpp as mtmd
import numpy as np
import pytest
from PIL import Image

from inferflux.engine.backends.llama_cpp_vision import (
    EncodedImage,
    ImageChunk,
    VisionEncoder,
    VisionError,
    decode_embeddings,
    rgb_pixels,
)
from inferflux.errors import ModelLoadError
from inferflux.models.demo_vision import demo_mmproj_path

pytestmark = pytest.mark.model

N_EMBD = 576
N_BATCH = 512
USER = "<|im_start|>user\n"
QUESTION = "What colour is this image?<|im_end|>\n<|im_start|>assistant\n"
# SmolLM2's chat template adds this system prompt when a conversation has none
SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\n"
)
ONE_WORD = "What colour is this image? Answer with one word.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def model(smollm2_model_path: str) -> Iterator[Any]:
    ll.llama_backend_init()
    handle = ll.llama_model_load_from_file(
        smollm2_model_path.encode(), ll.llama_model_default_params()
    )
    assert handle
    yield handle
    ll.llama_model_free(handle)


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(demo_mmproj_path(tmp_path_factory.mktemp("models")))


@pytest.fixture(scope="module")
def encoder(model: Any, mmproj: str) -> Iterator[VisionEncoder]:
    enc = VisionEncoder(mmproj, model, n_threads=1)  # see test_encode_times
    yield enc
    enc.close()


@pytest.fixture
def ctx(model: Any) -> Iterator[Any]:
    params = ll.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = 1024, N_BATCH, N_BATCH
    params.n_seq_max, params.n_threads, params.n_threads_batch = 2, 2, 2
    params.no_perf = True
    handle = ll.llama_init_from_model(model, params)
    assert handle
    yield handle
    ll.llama_free(handle)


def image(width: int, height: int, colour: tuple[int, int, int], stripe: bool = False):
    img = Image.new("RGB", (width, height), colour)
    if stripe:  # a white band across the top third
        img.paste((255, 255, 255), (0, 0, width, height // 3))
    return img


def encode(encoder: VisionEncoder, img: Image.Image) -> EncodedImage:
    data = img.tobytes()
    return encoder.encode(data, img.width, img.height, hashlib.sha256(data).hexdigest())


def chunks_of(encoded: EncodedImage) -> list[ImageChunk]:
    return [s for s in encoded.segments if isinstance(s, ImageChunk)]


def tokenize(model: Any, text: str) -> list[int]:
    vocab = ll.llama_model_get_vocab(model)
    raw = text.encode()
    out = (ll.llama_token * (len(raw) + 8))()
    n = ll.llama_tokenize(vocab, raw, len(raw), out, len(out), False, True)
    assert n >= 0
    return list(out[:n])


def decode_tokens(ctx: Any, seq_tokens: list[tuple[int, list[int], int]]) -> None:
    """One llama_decode of text for several sequences: (seq_id, tokens, start_pos); the
    last token of each sequence gets logits."""
    n_total = sum(len(t) for _, t, _ in seq_tokens)
    batch = ll.llama_batch_init(n_total, 0, 2)
    i = 0
    for seq_id, tokens, start in seq_tokens:
        for j, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + j, 1
            batch.seq_id[i][0] = seq_id
            batch.logits[i] = j == len(tokens) - 1
            i += 1
    batch.n_tokens = n_total
    try:
        assert ll.llama_decode(ctx, batch) == 0
    finally:
        ll.llama_batch_free(batch)


def greedy(ctx: Any, model: Any, pos: int, n: int = 8, seq_id: int = 0) -> list[int]:
    """n greedy tokens after a prefill whose last row of `seq_id` has logits (index -1)."""
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    out: list[int] = []
    for _ in range(n):
        logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        out.append(int(np.argmax(logits)))
        decode_tokens(ctx, [(seq_id, [out[-1]], pos)])
        pos += 1
    return out


def decode_with_wrapper(
    ctx: Any, model: Any, encoded: EncodedImage, user: str = USER, question: str = QUESTION
) -> int:
    """[user tokens, the image's segments, question tokens] into sequence 0; returns the
    position after the prompt."""
    seq_id = 0
    prefix, suffix = tokenize(model, user), tokenize(model, question)
    decode_tokens(ctx, [(seq_id, prefix, 0)])
    pos = len(prefix)
    for segment in encoded.segments:
        if isinstance(segment, ImageChunk):
            rows = [(seq_id, pos, segment.embeddings, False)]
            assert decode_embeddings(ctx, N_EMBD, rows, non_causal=segment.non_causal) == 0
            pos += segment.n_pos
        else:
            decode_tokens(ctx, [(seq_id, list(segment), pos)])
            pos += len(segment)
    decode_tokens(ctx, [(seq_id, suffix, pos)])
    return pos + len(suffix)


@pytest.fixture(scope="module")
def reference_mtmd(model: Any, mmproj: str) -> Iterator[Any]:
    """libmtmd's own context for the reference path, apart from the wrapper's."""
    params = mtmd.mtmd_context_params_default()
    params.n_threads, params.warmup, params.print_timings = 1, False, False
    handle = mtmd.mtmd_init_from_file(mmproj.encode(), model, params)
    assert handle
    yield handle
    mtmd.mtmd_free(handle)


def decode_with_libmtmd(ctx: Any, mctx: Any, img: Image.Image) -> int:
    """The same prompt through libmtmd: mtmd_tokenize of the whole prompt, then
    mtmd_helper_eval_chunk_single per image chunk (encode + decode). Text chunks go
    through llama_decode without the tokens the vocab lacks (-1), which libmtmd's text
    path would hand to llama_decode as they are."""
    prompt = (USER + mtmd.mtmd_default_marker().decode() + QUESTION).encode()
    text = mtmd.mtmd_input_text()
    text.text, text.text_len, text.add_special, text.parse_special = prompt, len(prompt), 0, 1
    data = img.tobytes()
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    bitmap = mtmd.mtmd_bitmap_init(img.width, img.height, buf)
    chunks = mtmd.mtmd_input_chunks_init()
    pos = 0
    try:
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd.mtmd_tokenize(mctx, chunks, ctypes.byref(text), bitmaps, 1) == 0
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                raw = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens = [t for t in raw[: n.value] if t >= 0]
                if tokens:
                    decode_tokens(ctx, [(0, tokens, pos)])
                    pos += len(tokens)
                continue
            new_pos = ll.llama_pos(pos)
            rc = mtmd.mtmd_helper_eval_chunk_single(
                mctx, ctx, chunk, pos, 0, N_BATCH, False, ctypes.byref(new_pos)
            )
            assert rc == 0
            pos = new_pos.value
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)
    return pos


def test_encoder_facts(encoder: VisionEncoder) -> None:
    assert encoder.marker == "<__media__>"
    assert encoder.n_embd == N_EMBD
    assert not encoder.non_causal and not encoder.uses_mrope


@pytest.mark.parametrize("size", [(64, 64), (640, 480)])
def test_encode_shapes(encoder: VisionEncoder, size: tuple[int, int]) -> None:
    encoded = encode(encoder, image(*size, (200, 30, 30)))
    chunks = chunks_of(encoded)
    assert len(chunks) == 2  # one 128x128 tile (longest edge 128) and the overview
    for chunk in chunks:
        assert chunk.embeddings.shape == (16, N_EMBD)
        assert chunk.embeddings.dtype == np.float32
        assert chunk.embeddings.flags.c_contiguous and chunk.embeddings.flags.owndata
        assert chunk.n_pos == 16 and not chunk.non_causal
    texts = [s for s in encoded.segments if isinstance(s, tuple)]
    assert texts and all(t and min(t) >= 0 for t in texts)  # no LLAMA_TOKEN_NULL
    assert encoded.n_tokens == encoded.n_pos == 32 + sum(len(t) for t in texts)
    print(f"\n{size}: {encoded.n_tokens} tokens, 32 of them image embeddings")  # noqa: T201


def test_same_image_same_embeddings(encoder: VisionEncoder) -> None:
    first = chunks_of(encode(encoder, image(640, 480, (10, 120, 240), stripe=True)))
    again = chunks_of(encode(encoder, image(640, 480, (10, 120, 240), stripe=True)))
    for a, b in zip(first, again, strict=True):
        assert np.array_equal(a.embeddings, b.embeddings)
    other = chunks_of(encode(encoder, image(640, 480, (240, 120, 10), stripe=True)))
    assert not np.allclose(first[0].embeddings, other[0].embeddings, atol=1e-3)
    plain = chunks_of(encode(encoder, image(640, 480, (10, 120, 240))))
    assert not np.allclose(first[0].embeddings, plain[0].embeddings, atol=1e-3)


def test_decode_matches_libmtmd(
    ctx: Any, model: Any, encoder: VisionEncoder, reference_mtmd: Any
) -> None:
    img = image(640, 480, (30, 160, 60), stripe=True)
    pos = decode_with_wrapper(ctx, model, encode(encoder, img))
    ours = greedy(ctx, model, pos)
    ll.llama_memory_clear(ll.llama_get_memory(ctx), True)
    ref_pos = decode_with_libmtmd(ctx, reference_mtmd, img)
    reference = greedy(ctx, model, ref_pos)
    assert ref_pos == pos
    assert ours == reference
    print(f"\n{pos} prompt tokens; greedy: {reference}")  # noqa: T201


def test_two_sequences_in_one_decode(ctx: Any, model: Any, encoder: VisionEncoder) -> None:
    images = [image(640, 480, (255, 0, 0)), image(64, 64, (0, 0, 255))]
    encoded = [encode(encoder, img) for img in images]
    alone = []
    for one in encoded:
        ll.llama_memory_clear(ll.llama_get_memory(ctx), True)
        alone.append(greedy(ctx, model, decode_with_wrapper(ctx, model, one, question=ONE_WORD)))
    ll.llama_memory_clear(ll.llama_get_memory(ctx), True)
    prefix, suffix = tokenize(model, USER), tokenize(model, ONE_WORD)
    decode_tokens(ctx, [(0, prefix, 0), (1, prefix, 0)])
    pos = len(prefix)
    for seg0, seg1 in zip(encoded[0].segments, encoded[1].segments, strict=True):
        if isinstance(seg0, ImageChunk) and isinstance(seg1, ImageChunk):
            rows = [(0, pos, seg0.embeddings, False), (1, pos, seg1.embeddings, False)]
            assert decode_embeddings(ctx, N_EMBD, rows) == 0
            pos += seg0.n_pos
        else:
            assert seg0 == seg1  # same size: the same wrapper tokens
            decode_tokens(ctx, [(0, list(seg0), pos), (1, list(seg1), pos)])
            pos += len(seg0)
    decode_tokens(ctx, [(0, suffix, pos), (1, suffix, pos)])
    pos += len(suffix)
    together: list[list[int]] = [[], []]
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    index = [len(suffix) - 1, 2 * len(suffix) - 1]
    for _ in range(8):
        for seq_id in (0, 1):
            row = ll.llama_get_logits_ith(ctx, index[seq_id])
            logits = np.ctypeslib.as_array(row, shape=(n_vocab,))
            together[seq_id].append(int(np.argmax(logits)))
        decode_tokens(ctx, [(0, together[0][-1:], pos), (1, together[1][-1:], pos)])
        index, pos = [0, 1], pos + 1
    assert together == alone
    assert alone[0] != alone[1]  # the images do reach the model


@pytest.mark.parametrize("colour", ["red", "green", "blue"])
def test_the_demo_image_means_its_colour(
    ctx: Any, model: Any, encoder: VisionEncoder, colour: str
) -> None:
    """The demo mmproj's one trick (models/demo_vision.py), through SmolLM2's own chat
    template (its default system prompt): a solid image is read as its colour word."""
    rgb = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}[colour]
    pos = decode_with_wrapper(
        ctx, model, encode(encoder, image(64, 64, rgb)), SYSTEM + USER, ONE_WORD
    )
    answer = detokenize(model, greedy(ctx, model, pos, n=10))
    assert colour in answer.lower(), answer


def detokenize(model: Any, tokens: list[int]) -> str:
    vocab = ll.llama_model_get_vocab(model)
    out = b""
    for token in tokens:
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
        out += buf.raw[:n]
    return out.decode("utf-8", "replace")


def test_non_causal_decode_restores_causal_attention(ctx: Any, model: Any) -> None:
    """Embeddings decoded with causal attention off (seq 1); text decoded afterwards (seq
    0) gets the same logits as in a context that never turned it off."""
    text = tokenize(model, SYSTEM + USER + "Hello there")
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    decode_tokens(ctx, [(0, text, 0)])
    fresh = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
    ll.llama_memory_clear(ll.llama_get_memory(ctx), True)
    rows = np.random.default_rng(0).standard_normal((16, N_EMBD)).astype(np.float32) * 0.05
    assert decode_embeddings(ctx, N_EMBD, [(1, 0, rows, True)], non_causal=True) == 0
    decode_tokens(ctx, [(0, text, 0)])
    after = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
    assert np.array_equal(after, fresh)


def test_rgb_pixels_of_image_files() -> None:
    img = image(40, 30, (10, 200, 30))
    for fmt in ("PNG", "JPEG", "WEBP", "GIF"):
        buf = io.BytesIO()
        img.save(buf, fmt)
        rgb, width, height = rgb_pixels(buf.getvalue())
        assert (width, height, len(rgb)) == (40, 30, 40 * 30 * 3)
        pixel = np.frombuffer(rgb, dtype=np.uint8).reshape(30, 40, 3)[15, 20]
        assert np.allclose(pixel, (10, 200, 30), atol=12), fmt
    rgba = io.BytesIO()
    Image.new("RGBA", (8, 4), (255, 0, 0, 0)).save(rgba, "PNG")
    assert rgb_pixels(rgba.getvalue())[1:] == (8, 4)
    with pytest.raises(VisionError, match="could not be decoded"):
        rgb_pixels(b"\x89PNG\r\n\x1a\n not really")


def test_mismatched_model_is_a_load_error(gemma3_model_path: str, mmproj: str) -> None:
    gemma = ll.llama_model_load_from_file(
        gemma3_model_path.encode(), ll.llama_model_default_params()
    )
    try:
        with pytest.raises(ModelLoadError, match="projects to 576 dims .* have 640"):
            VisionEncoder(mmproj, gemma, n_threads=1)
    finally:
        ll.llama_model_free(gemma)


def test_missing_and_invalid_mmproj(model: Any, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        VisionEncoder(str(tmp_path / "absent.gguf"), model, n_threads=1)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(ModelLoadError, match="mmproj"):
        VisionEncoder(str(junk), model, n_threads=1)


def test_bad_bitmap_is_a_vision_error(encoder: VisionEncoder) -> None:
    with pytest.raises(VisionError, match="not 4x4 RGB"):
        encoder.encode(b"\0" * 47, 4, 4, "0" * 64)


def test_encode_times(encoder: VisionEncoder) -> None:
    """Printed, not asserted. One thread: the tower is tiny, and with 2 threads on a busy
    2-core machine ggml's spinning thread barrier made an encode take 0.1-3 s instead
    of 4-25 ms."""
    for side in (64, 512, 1024):
        img = image(side, side, (90, 90, 200), stripe=True)
        data = img.tobytes()
        times_s = []
        for _ in range(5):
            started = time.perf_counter()
            encoded = encoder.encode(data, side, side, "timed")
            times_s.append(time.perf_counter() - started)
        ms = ", ".join(f"{t * 1000:.1f}" for t in times_s)
        print(f"\nencode {side}x{side}: {ms} ms, {encoded.n_tokens} tokens")  # noqa: T201
