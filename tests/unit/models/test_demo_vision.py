"""The demo mmproj builder: deterministic bytes, the keys and tensors libmtmd's idefics3
loader reads, the colour projection, and an atomic write (reads the real SmolLM2 GGUF
for the colour words' embeddings)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from inferflux.errors import ModelLoadError
from inferflux.models.demo_vision import (
    DEMO_COLOUR_WORDS,
    DEMO_MMPROJ_VERSION,
    build_demo_mmproj,
    demo_mmproj_path,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mmproj") / "demo.mmproj.gguf"
    build_demo_mmproj(path)
    return path


def test_same_bytes_twice(built: Path, tmp_path: Path) -> None:
    again = tmp_path / "again.gguf"
    build_demo_mmproj(again)
    assert again.read_bytes() == built.read_bytes()


def test_keys_read_back(built: Path) -> None:
    fields = gguf.GGUFReader(str(built)).fields

    def value(key: str) -> object:
        return fields[key].contents()

    assert value("general.architecture") == "clip"
    assert value("clip.projector_type") == "idefics3"
    assert value("clip.has_vision_encoder") is True
    assert value("clip.use_gelu") is True
    expected = {
        "clip.vision.image_size": 128,
        "clip.vision.preproc_image_size": 128,
        "clip.vision.patch_size": 16,
        "clip.vision.embedding_length": 64,
        "clip.vision.feed_forward_length": 128,
        "clip.vision.block_count": 2,
        "clip.vision.projection_dim": 576,
        "clip.vision.attention.head_count": 4,
        "clip.vision.projector.scale_factor": 2,
    }
    assert {key: value(key) for key in expected} == expected
    assert value("clip.vision.attention.layer_norm_epsilon") == pytest.approx(1e-6)
    assert value("clip.vision.image_mean") == pytest.approx([0.5, 0.5, 0.5])
    assert value("clip.vision.image_std") == pytest.approx([0.5, 0.5, 0.5])


def test_tensors_read_back(built: Path) -> None:
    tensors = {t.name: t for t in gguf.GGUFReader(str(built)).tensors}
    assert len(tensors) == 3 + 2 * 16 + 1
    shapes = {name: tuple(int(n) for n in t.shape) for name, t in tensors.items()}
    # gguf reports ggml order (innermost first): numpy [576, 256] is ne (256, 576)
    assert shapes["v.patch_embd.weight"] == (16, 16, 3, 64)
    assert shapes["v.position_embd.weight"] == (64, 64)
    assert shapes["v.blk.1.ffn_up.weight"] == (64, 128)
    assert shapes["v.blk.1.ffn_down.weight"] == (128, 64)
    assert shapes["mm.model.fc.weight"] == (256, 576)
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in tensors.values())


def test_projection_is_the_colour_words(built: Path, smollm2_model_path: str) -> None:
    """A patch's (R, G, B) in [-1, 1] and the constant 1 in dim 3 project onto
    sum_c (1 + x_c)/2 * E(word_c), a quarter from each of the 4 shuffled patches."""
    model = gguf.GGUFReader(smollm2_model_path)
    tokens = model.fields["tokenizer.ggml.tokens"].contents()
    table = next(t for t in model.tensors if t.name == "token_embd.weight")
    ids = [tokens.index(w) for w in DEMO_COLOUR_WORDS]
    words = gguf.quants.dequantize(table.data[ids], table.tensor_type)
    fc = next(t for t in gguf.GGUFReader(str(built)).tensors if t.name == "mm.model.fc.weight")
    weight = np.asarray(fc.data).reshape(576, 256)
    red = np.zeros(256, dtype=np.float32)
    for k in range(4):
        red[k * 64 : k * 64 + 4] = [1.0, -1.0, -1.0, 1.0]
    np.testing.assert_allclose(weight @ red, words[0], atol=1e-5)


def test_another_model_is_refused(tmp_path: Path, gemma3_model_path: str) -> None:
    with pytest.raises(ModelLoadError, match="not SmolLM2-135M"):
        build_demo_mmproj(tmp_path / "x.gguf", Path(gemma3_model_path))
    assert list(tmp_path.iterdir()) == []


def test_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "demo.gguf"
    target.write_bytes(b"the previous file")

    def fail(self: gguf.GGUFWriter, *args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", fail)
    with pytest.raises(OSError, match="disk full"):
        build_demo_mmproj(target)
    assert target.read_bytes() == b"the previous file"
    assert [p.name for p in tmp_path.iterdir()] == ["demo.gguf"]  # no temporary left


def test_path_builds_once_and_names_the_version(tmp_path: Path) -> None:
    path = demo_mmproj_path(tmp_path / "models")
    assert path == tmp_path / "models" / f"inferflux-demo-vision-v{DEMO_MMPROJ_VERSION}.mmproj.gguf"
    assert path.is_file() and path.stat().st_mode & 0o777 == 0o644
    first = path.stat().st_mtime_ns
    assert demo_mmproj_path(tmp_path / "models") == path
    assert path.stat().st_mtime_ns == first
