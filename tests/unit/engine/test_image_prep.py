"""ImagePreparer and ImageRows (engine/image_prep.py): splicing a request's images into its
prompt as pseudo tokens, keyed by image and mmproj, and keeping their rows while needed.

The vision tower is a fake here (`FakeVisionEncoder`): these are tests of the splicing and
bookkeeping logic only. The real libmtmd path is tested in tests/integration/test_vision_*.
"""

from __future__ import annotations

import hashlib
import io
import threading
from dataclasses import dataclass

import numpy as np
import pytest
from PIL import Image

from inferflux.engine.backends.llama_cpp_vision import EncodedImage, ImageChunk
from inferflux.engine.image_prep import (
    ImagePreparer,
    ImagePromptError,
    ImagePromptTooLong,
    ImageRows,
    is_image_token,
)
from inferflux.engine.messages import AddRequest, ImageInput, SamplingParams

N_EMBD = 4


@dataclass
class FakeVisionEncoder:
    """Two wrapper tokens around 3 rows whose values are the image's mean colour."""

    calls: int = 0
    non_causal: bool = False
    trailer: bool = True  # a text token after the rows (idefics3 has wrapper tokens)

    def encode(self, rgb: bytes, width: int, height: int, sha256: str) -> EncodedImage:
        self.calls += 1
        pixels = np.frombuffer(rgb, dtype=np.uint8).reshape(height, width, 3)
        row = np.array([*pixels.mean(axis=(0, 1)), width], dtype=np.float32)
        rows = np.tile(row, (3, 1))
        after = ((8,),) if self.trailer else ()
        return EncodedImage(sha256=sha256, segments=((7,), ImageChunk(rows, 3), *after))

    def close(self) -> None:
        pass


def png(color: tuple[int, int, int], size: int = 8) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (size, size), color).save(out, format="PNG")
    return out.getvalue()


def image(data: bytes, position: int) -> ImageInput:
    return ImageInput(sha256=hashlib.sha256(data).hexdigest(), data=data, position=position)


def message(rid: str, prompt: list[int], *images: ImageInput) -> AddRequest:
    return AddRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling=SamplingParams(max_tokens=4),
        images=list(images),
    )


def prepare(preparer: ImagePreparer, msg: AddRequest):  # noqa: ANN201 (test helper)
    preparer.submit(msg)
    ((done_msg, prepared),) = preparer.done(5.0)
    assert done_msg is msg
    return prepared


@pytest.fixture
def preparer():
    prep = ImagePreparer(FakeVisionEncoder(), mmproj_id="m1", max_pixels=10_000, rows=ImageRows())
    yield prep
    prep.close()


def test_images_are_spliced_at_their_positions(preparer: ImagePreparer) -> None:
    red, blue = png((255, 0, 0)), png((0, 0, 255))
    prepared = prepare(preparer, message("a", [1, 2, 3, 4], image(red, 1), image(blue, 3)))
    tokens = prepared.token_ids
    # 1 | 7 [3 rows] 8 | 2 3 | 7 [3 rows] 8 | 4
    assert [t for t in tokens if not is_image_token(t)] == [1, 7, 8, 2, 3, 7, 8, 4]
    assert prepared.image_spans == ((2, 5), (9, 12))
    assert all(is_image_token(t) for b, e in prepared.image_spans for t in tokens[b:e])
    rows = preparer.rows.embeddings(tokens[2:5])
    assert rows.shape == (3, N_EMBD) and rows[0][0] == 255.0  # the red image's rows
    assert preparer.rows.embeddings(tokens[9:12])[0][2] == 255.0  # the blue one's


def test_the_same_image_gets_the_same_ids_and_is_encoded_once(preparer: ImagePreparer) -> None:
    red = png((255, 0, 0))
    first = prepare(preparer, message("a", [1, 2], image(red, 1)))
    second = prepare(preparer, message("b", [1, 2], image(red, 1)))
    assert first.token_ids == second.token_ids  # the prefix cache can reuse its KV
    assert preparer.encoder.calls == 1  # type: ignore[attr-defined]
    other = prepare(preparer, message("c", [1, 2], image(png((0, 255, 0)), 1)))
    assert set(other.token_ids[2:5]).isdisjoint(first.token_ids[2:5])


def test_another_mmproj_gives_other_ids() -> None:
    red = png((255, 0, 0))
    ids = []
    for mmproj_id in ("m1", "m2"):
        prep = ImagePreparer(
            FakeVisionEncoder(), mmproj_id=mmproj_id, max_pixels=10_000, rows=ImageRows()
        )
        ids.append(prepare(prep, message("a", [1, 2], image(red, 1))).token_ids)
        prep.close()
    assert ids[0] != ids[1]


@pytest.mark.parametrize(
    ("data", "position", "words"),
    [
        (b"not an image", 1, "image"),
        (png((1, 2, 3), size=200), 1, "pixels"),  # 40,000 > max_pixels
        (png((1, 2, 3)), 9, "outside the prompt"),
    ],
    ids=["not an image", "too many pixels", "position"],
)
def test_unusable_images_fail_with_a_reason(
    preparer: ImagePreparer, data: bytes, position: int, words: str
) -> None:
    preparer.submit(message("a", [1, 2], image(data, position)))
    ((_, reason),) = preparer.done(5.0)
    assert isinstance(reason, ImagePromptError) and words in str(reason), reason
    assert reason.code == "invalid_request"


def test_a_wrong_sha256_is_refused(preparer: ImagePreparer) -> None:
    data = png((1, 2, 3))
    bad = ImageInput(sha256="0" * 64, data=data, position=1)
    preparer.submit(message("a", [1, 2], bad))
    ((_, reason),) = preparer.done(5.0)
    assert str(reason) == "an image's sha256 does not match its bytes"


def test_rows_stay_while_pinned_and_the_unpinned_are_bounded() -> None:
    rows = ImageRows(max_unpinned_bytes=100)
    big = np.zeros((4, 8), dtype=np.float32)  # 128 bytes
    rows.add(1, big)
    rows.pin("r", (1,))
    rows.add(2, big)
    rows.unpin("nobody")  # trims: 2 is unpinned and over the bound, 1 is pinned
    assert rows.get(1) is not None and rows.get(2) is None
    rows.unpin("r")
    assert rows.get(1) is None
    assert rows.nbytes == 0


def test_a_dropped_request_unpins_its_rows(preparer: ImagePreparer) -> None:
    msg = message("a", [1, 2], image(png((255, 0, 0)), 1))
    preparer.submit(msg)
    preparer._pool.submit(lambda: None).result()  # the preparation has finished
    assert preparer.drop({"a"}) == [msg]
    assert preparer.done(0.0) == []
    preparer.rows.unpin("nobody")  # trim
    assert preparer.rows._pins == {}


def test_a_prompt_cannot_end_with_an_image() -> None:
    """Its last position must give the logits of the first sample: text, not image rows."""
    encoder = FakeVisionEncoder(trailer=False)
    prep = ImagePreparer(encoder, mmproj_id="m1", max_pixels=10_000, rows=ImageRows())
    prep.submit(message("a", [1, 2], image(png((1, 2, 3)), 2)))
    ((_, reason),) = prep.done(5.0)
    prep.close()
    assert str(reason) == "the prompt cannot end with an image: add text after it"


def test_an_image_chunk_over_what_one_decode_takes_is_refused() -> None:
    rows = ImageRows()
    prep = ImagePreparer(
        FakeVisionEncoder(), mmproj_id="m1", max_pixels=10_000, rows=rows, max_chunk_rows=2
    )
    prep.submit(message("a", [1, 2], image(png((1, 2, 3)), 1)))
    ((_, reason),) = prep.done(5.0)
    prep.close()
    assert str(reason) == (
        "an image chunk takes 3 tokens; this server decodes at most 2 at once "
        "(scheduler.max_batch_tokens)"
    )


def test_max_tokens_is_cut_to_what_the_context_leaves_after_the_images() -> None:
    """The API checked prompt + max_tokens with the text's tokens only."""
    prep = ImagePreparer(
        FakeVisionEncoder(), mmproj_id="m1", max_pixels=10_000, rows=ImageRows(), n_ctx=12
    )
    msg = message("a", [1, 2], image(png((1, 2, 3)), 1))  # 2 + 5 image tokens = 7, asks 4
    prepared = prepare(prep, msg)
    assert len(prepared.token_ids) == 7 and prepared.max_tokens == 4
    prep._n_ctx = 9
    prepared = prepare(prep, message("b", [1, 2], image(png((1, 2, 3)), 1)))
    assert prepared.max_tokens == 2  # 9 - 7
    prep._n_ctx = 7
    prep.submit(message("c", [1, 2], image(png((1, 2, 3)), 1)))
    ((_, reason),) = prep.done(5.0)
    prep.close()
    assert isinstance(reason, ImagePromptTooLong) and reason.code == "context_length_exceeded"
    assert str(reason).startswith("the prompt is 7 tokens with its images' tokens")


def test_a_request_dropped_while_its_image_is_encoded_leaves_nothing_pinned() -> None:
    started, release = threading.Event(), threading.Event()

    @dataclass
    class FakeSlowEncoder(FakeVisionEncoder):
        def encode(self, rgb: bytes, width: int, height: int, sha256: str) -> EncodedImage:
            started.set()
            release.wait(5)
            return super().encode(rgb, width, height, sha256)

    rows = ImageRows()
    prep = ImagePreparer(FakeSlowEncoder(), mmproj_id="m1", max_pixels=10_000, rows=rows)
    prep.submit(message("a", [1, 2], image(png((1, 2, 3)), 1)))
    assert started.wait(5)
    assert [m.request_id for m in prep.drop({"a"})] == ["a"]
    release.set()
    prep._pool.submit(lambda: None).result()  # the preparation has finished
    prep.close()
    assert rows._pins == {} and rows._owners == {}
