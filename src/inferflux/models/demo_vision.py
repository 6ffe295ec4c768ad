"""A tiny, untrained mmproj (vision projector GGUF) for the default model, SmolLM2-135M.

No small vision model ships on PyPI, so InferFlux writes one. SmolVLM-256M is SmolLM2-135M
(n_embd 576) behind a SigLIP vision tower and the idefics3 connector (pixel shuffle and
one linear layer); this file is that architecture in miniature, read by llama.cpp's own
loader (libmtmd, projector type `idefics3`):

- tiles of 128x128 pixels: libmtmd's idefics3 preprocessing resizes an image to a longest
  edge of 128 and cuts it into tiles of 128 (so one tile) plus a 128x128 overview;
  16x16 patches, so 64 patches a tile;
- a 2-block SigLIP tower, hidden 64, 4 heads, feed-forward 128, GELU;
- pixel shuffle by 2 (4 patches become one 256-wide row) and a 256 -> 576 linear layer:
  16 image embeddings a tile, 32 an image (the tile and the overview). libmtmd adds the
  idefics3 text around them (`<fake_token_around_image><row_1_col_1>` ..., about 20
  SmolLM2 tokens).

The weights are **not trained**; they are written by hand and with a seeded generator,
so the same version always gives the same bytes:
- the patch embedding averages each colour channel of a patch into hidden dims 0-2 (pixel
  values normalized to [-1, 1]), and its bias puts a constant 1 in dim 3;
- the position embeddings and the attention and feed-forward weights are small seeded
  noise (std 0.02, feed-forward down and attention output std 0.002), so the residual
  stream keeps the colour;
- the projector maps a patch's colour onto the text model's own embeddings of the words
  " red", " green" and " blue": an embedding is (1+R)/2 * E(" red") + (1+G)/2 *
  E(" green") + (1+B)/2 * E(" blue") (averaged over the 4 shuffled patches), so a solid
  red image shows the model the embedding of " red". Other dims get seeded noise.
It makes an image *mean* a colour and nothing else; it is a test fixture, not a model.
With SmolLM2's chat template, "What colour is this image?" about a solid red, green or
blue image gets the right colour word (greedy; tests/integration/test_vision_encoder.py).
A longest edge of 256 (2x2 tiles) diluted the colour among more wrapper tokens and got
green wrong.

Change any weight → bump `DEMO_MMPROJ_VERSION` (the file name carries it, and caches
key on it).
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Protocol

import gguf
import numpy as np

from inferflux.errors import ModelLoadError
from inferflux.models.files import default_model_path
from inferflux.models.materialize import DEFAULT_CACHE_DIR

__all__ = [
    "DEMO_COLOUR_WORDS",
    "DEMO_MMPROJ_VERSION",
    "build_demo_mmproj",
    "demo_mmproj_path",
]

DEMO_MMPROJ_VERSION = 1
DEMO_COLOUR_WORDS = ("Ġred", "Ġgreen", "Ġblue")  # GPT-2 style pieces: " red", ...

_IMAGE_SIZE = 128  # one tile
_LONGEST_EDGE = 128  # images are resized to this longest edge, then tiled
_PATCH = 16
_N_EMBD = 64
_N_HEAD = 4
_N_FF = 128
_N_BLOCK = 2
_SCALE = 2  # pixel shuffle factor
_N_EMBD_TEXT = 576  # SmolLM2-135M
_SEED = 20261126


class _Noise(Protocol):
    def __call__(self, *shape: int, std: float = 0.02) -> np.ndarray: ...


def demo_mmproj_path(models_dir: Path | None = None) -> Path:
    """The demo mmproj in `models_dir` (default ~/.cache/inferflux/models), written
    on first call if absent (well under a second)."""
    folder = (models_dir or DEFAULT_CACHE_DIR).expanduser()
    path = folder / f"inferflux-demo-vision-v{DEMO_MMPROJ_VERSION}.mmproj.gguf"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        build_demo_mmproj(path)
    return path


def build_demo_mmproj(path: Path, text_model: Path | None = None) -> None:
    """Write the mmproj to `path` atomically (a temporary file in the same folder, then
    a rename). `text_model` (default: the SmolLM2 GGUF) supplies the colour words'
    embeddings. The same inputs always give the same bytes."""
    colours = _colour_embeddings(text_model or default_model_path())
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    writer = gguf.GGUFWriter(str(tmp), "clip")
    try:
        _add_metadata(writer)
        for name, data in _tensors(colours).items():
            writer.add_tensor(name, data)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        tmp.chmod(0o644)  # mkstemp makes it 0600; a model file is readable
        os.replace(tmp, path)
    except BaseException:
        writer.close()  # idempotent; frees the file handle a failed write left open
        tmp.unlink(missing_ok=True)
        raise


@functools.cache  # reading the model's header takes seconds; the rows never change
def _colour_embeddings(text_model: Path) -> np.ndarray:
    """[3, 576] float32: the text model's token embeddings of " red", " green", " blue"
    (read-only: the cache shares it)."""
    reader = gguf.GGUFReader(str(text_model))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    table = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if table is None or any(word not in tokens for word in DEMO_COLOUR_WORDS):
        raise ModelLoadError(f"{text_model} is not SmolLM2-135M (the demo mmproj's model)")
    ids = [tokens.index(word) for word in DEMO_COLOUR_WORDS]
    rows = gguf.quants.dequantize(table.data[ids], table.tensor_type)
    if rows.shape != (3, _N_EMBD_TEXT):
        raise ModelLoadError(f"{text_model} is not SmolLM2-135M (token rows {rows.shape})")
    rows = np.array(rows, dtype=np.float32, order="C")
    rows.flags.writeable = False
    return rows


def _add_metadata(writer: gguf.GGUFWriter) -> None:
    writer.add_name(f"inferflux-demo-vision-v{DEMO_MMPROJ_VERSION}")
    writer.add_description(
        "Untrained idefics3-style vision projector for SmolLM2-135M (InferFlux test "
        "fixture): an image's embeddings are its colour mapped onto ' red'/' green'/' blue'"
    )
    writer.add_file_type(0)  # all F32
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "idefics3")
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", _IMAGE_SIZE)
    writer.add_uint32("clip.vision.preproc_image_size", _LONGEST_EDGE)
    writer.add_uint32("clip.vision.patch_size", _PATCH)
    writer.add_uint32("clip.vision.embedding_length", _N_EMBD)
    writer.add_uint32("clip.vision.feed_forward_length", _N_FF)
    writer.add_uint32("clip.vision.block_count", _N_BLOCK)
    writer.add_uint32("clip.vision.projection_dim", _N_EMBD_TEXT)
    writer.add_uint32("clip.vision.attention.head_count", _N_HEAD)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_uint32("clip.vision.projector.scale_factor", _SCALE)


def _tensors(colours: np.ndarray) -> dict[str, np.ndarray]:
    """Every tensor, in numpy (PyTorch) layout: [out, in] for matrices."""
    rng = np.random.default_rng(_SEED)

    def noise(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    n_patches = (_IMAGE_SIZE // _PATCH) ** 2
    patch_w = np.zeros((_N_EMBD, 3, _PATCH, _PATCH), dtype=np.float32)
    for channel in range(3):
        patch_w[channel, channel] = 1.0 / (_PATCH * _PATCH)  # the mean of the channel
    patch_b = np.zeros(_N_EMBD, dtype=np.float32)
    patch_b[3] = 1.0
    out: dict[str, np.ndarray] = {
        "v.patch_embd.weight": patch_w,
        "v.patch_embd.bias": patch_b,
        "v.position_embd.weight": noise(n_patches, _N_EMBD),
    }
    for i in range(_N_BLOCK):
        out |= _block(i, noise)
    out["mm.model.fc.weight"] = _projector(colours, noise)
    return out


def _block(i: int, noise: _Noise) -> dict[str, np.ndarray]:
    ones = np.ones(_N_EMBD, dtype=np.float32)
    zeros = np.zeros(_N_EMBD, dtype=np.float32)
    prefix = f"v.blk.{i}"
    return {
        f"{prefix}.ln1.weight": ones,
        f"{prefix}.ln1.bias": zeros,
        f"{prefix}.attn_q.weight": noise(_N_EMBD, _N_EMBD),
        f"{prefix}.attn_q.bias": zeros,
        f"{prefix}.attn_k.weight": noise(_N_EMBD, _N_EMBD),
        f"{prefix}.attn_k.bias": zeros,
        f"{prefix}.attn_v.weight": noise(_N_EMBD, _N_EMBD),
        f"{prefix}.attn_v.bias": zeros,
        f"{prefix}.attn_out.weight": noise(_N_EMBD, _N_EMBD, std=0.002),
        f"{prefix}.attn_out.bias": zeros,
        f"{prefix}.ln2.weight": ones,
        f"{prefix}.ln2.bias": zeros,
        f"{prefix}.ffn_up.weight": noise(_N_FF, _N_EMBD),
        f"{prefix}.ffn_up.bias": np.zeros(_N_FF, dtype=np.float32),
        f"{prefix}.ffn_down.weight": noise(_N_EMBD, _N_FF, std=0.002),
        f"{prefix}.ffn_down.bias": zeros,
    }


def _projector(colours: np.ndarray, noise: _Noise) -> np.ndarray:
    """[576, 64 * 4]: each of the 4 shuffled patches contributes a quarter of
    sum_c (1 + x_c)/2 * E_c = sum_c x_c * E_c/2 + (sum_c E_c)/2 * 1 (dim 3 holds 1)."""
    weight = noise(_N_EMBD_TEXT, _N_EMBD * _SCALE * _SCALE, std=0.002)
    for k in range(_SCALE * _SCALE):
        base = k * _N_EMBD
        for channel in range(3):
            weight[:, base + channel] = colours[channel] / 2 / (_SCALE * _SCALE)
        weight[:, base + 3] = colours.sum(axis=0) / 2 / (_SCALE * _SCALE)
    return weight
