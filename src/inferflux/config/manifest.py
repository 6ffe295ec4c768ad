"""The model manifest (`registry.path`): its schema, reading it, and the bytes a signature covers.

Owns: `ManifestEntry` (one model: id, aliases, GGUF path, SHA-256, optional ed25519
signature, default flag, per-model settings, an optional mmproj: the multimodal projector
GGUF, with its SHA-256), `Manifest` (the list, with its invariants: unique ids and names,
at most one default), `read_manifest` and `canonical_entry`. Does not own: resolving
paths, hashing files or checking signatures (engine/model_verify.py).

The manifest is YAML: a list of entries (what `inferctl pull` writes to
`DIR/models.yaml`), or a mapping whose `models:` holds that list:

    models:
      - id: smollm2
        path: SmolLM2-135M-Instruct.Q4_1.gguf   # relative: inside registry.models_dir
        sha256: 5c1f...                          # 64 hex digits, required
        aliases: [smol]
        default: true
        n_ctx: 2048                              # optional per-model settings
        workers: 1
        n_batch: 256
        threads: 2
        system: You are a terse assistant.       # Ollama: the model's system prompt
        parameters: {temperature: 0.2, stop: ["###"]}  # Ollama: default options
        mmproj: mmproj-model-f16.gguf            # optional: a projector GGUF (images in),
        mmproj_sha256: 9a0b...                   #   a path or a URL like `path`
        signature: 3q2+...                       # optional: ed25519, base64
      - id: tiny
        path: hf://acme/tiny-GGUF/tiny.f16.gguf@main  # a URL: downloaded once (models/download.py)
        quantization: Q8_0                       # optional: quantized once (models/quantize.py)

`path` may be a URL: `hf://org/repo/file.gguf@revision` (the Hugging Face Hub; `sha256`
optional, the hub's LFS hash is checked) or `https://…` / `http://…` (`sha256` required);
so may `mmproj` (with `mmproj_sha256`).

A signature covers `canonical_entry(entry)`: the entry as written, without `signature`,
as JSON with sorted keys and no spaces (UTF-8). docs/models.md shows how to sign one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal, Self, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from inferflux.errors import ConfigError

# ids and aliases travel in URLs (/v1/models/{id}) and Ollama names (`id:latest`): no ':'.
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$"
SHA256_PATTERN = r"^[0-9a-fA-F]{64}$"
# A model path that is a URL (models/download.py fetches it); `HF_URL_SCHEME` needs no sha256.
HF_URL_SCHEME = "hf://"
URL_SCHEMES = (HF_URL_SCHEME, "https://", "http://")
HF_URL_PATTERN = r"hf://[^/@\s]+/[^/@\s]+/[^@\s]+\.gguf(@[^@/\s]+)?"
# The levels `quantization` accepts (llama.cpp ftype names; models/quantize.py maps them).
QuantizationLevel = Literal[
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L",
    "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "F16", "BF16",
]  # fmt: skip
QUANTIZATION_LEVELS: tuple[str, ...] = get_args(QuantizationLevel)


def is_model_url(path: str) -> bool:
    """True for a model path that names a URL to download (hf://, https://, http://)."""
    return path.startswith(URL_SCHEMES)


def check_hf_url(url: str, where: str) -> None:
    """`hf://ORG/REPO/FILE.gguf[@REVISION]` with no empty, `.` or `..` part (the file lands
    at `models_dir/ORG/REPO/FILE.gguf`). Raises ValueError naming `where` otherwise."""
    parts = url.removeprefix(HF_URL_SCHEME).partition("@")[0].split("/")
    if re.fullmatch(HF_URL_PATTERN, url) is None or {"", ".", ".."} & set(parts):
        raise ValueError(
            f"{where} {url!r}: expected hf://ORG/REPO/FILE.gguf[@REVISION] (no empty, . or .. "
            "parts)"
        )


def check_mmproj(mmproj: str | None, mmproj_sha256: str | None, where: str) -> None:
    """An mmproj URL is checked as a model URL (`check_model_url`), and its SHA-256 needs
    the file it checks. Raises ValueError naming `where` otherwise."""
    if mmproj is None and mmproj_sha256 is not None:
        raise ValueError(
            f"{where}_sha256 is set but {where} is not: set {where} (the projector GGUF) "
            f"or remove {where}_sha256"
        )
    check_model_url(mmproj, mmproj_sha256, where)


def check_model_url(path: str | None, sha256: str | None, where: str) -> None:
    """A hf:// URL must name a .gguf file; an http(s) model URL needs its SHA-256. Raises
    ValueError naming `where` otherwise."""
    if path is None or not is_model_url(path):
        return
    if path.startswith(HF_URL_SCHEME):
        check_hf_url(path, where)
    elif sha256 is None:
        raise ValueError(
            f"{where} {path!r} is an http(s) URL: set its sha256 (64 hex digits) so the "
            "download can be verified"
        )


_INT32_MAX = 2**31 - 1


class ModelParameters(BaseModel):
    """A model's default sampling options (Ollama's Modelfile `PARAMETER`s): what an Ollama
    request gets for an option it leaves unset. Only options the engine honours."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=_INT32_MAX)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    num_predict: int | None = Field(None, ge=-2, le=_INT32_MAX)
    seed: int | None = Field(None, ge=-1, le=2**63 - 1)
    repeat_penalty: float | None = Field(None, ge=0.0, le=100.0)
    repeat_last_n: int | None = Field(None, ge=-1, le=_INT32_MAX)
    presence_penalty: float | None = Field(None, ge=-100.0, le=100.0)
    frequency_penalty: float | None = Field(None, ge=-100.0, le=100.0)
    stop: tuple[str, ...] | None = Field(None, max_length=16)

    def options(self) -> dict[str, object]:
        """The options set, as Ollama's `options` object."""
        values = self.model_dump(exclude_none=True)
        if "stop" in values:
            values["stop"] = list(values["stop"])
        return values


class ManifestEntry(BaseModel):
    """One model of the manifest (also the body of an admin-API load)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=MODEL_NAME_PATTERN, description="The name clients send as `model`.")
    path: str = Field(
        min_length=1,
        max_length=4096,
        description="GGUF file in models_dir, or a URL: hf://org/repo/file.gguf@rev, https://…",
    )
    sha256: str | None = Field(
        None,
        pattern=SHA256_PATTERN,
        description="SHA-256 of the file (hex). Required, except for an hf:// URL (the hub's "
        "LFS hash is checked then).",
    )
    quantization: QuantizationLevel | None = Field(
        None,
        description="Quantize the file to this level (once, cached in models_dir) and serve "
        "the result. Only F32/F16/BF16/Q8_0 files are quantized down.",
    )
    aliases: tuple[str, ...] = Field(
        (), max_length=32, description="Other names that route to this model."
    )
    signature: str | None = Field(
        None, max_length=200, description="ed25519 signature of canonical_entry, base64."
    )
    default: bool = Field(False, description="Requests that name no model get this one.")
    n_ctx: int | None = Field(None, ge=64, le=1_048_576, description="Context per request.")
    workers: int | None = Field(None, ge=1, le=64, description="Engine worker processes.")
    n_batch: int | None = Field(
        None, ge=16, le=65536, description="Token budget of one engine step."
    )
    threads: int | None = Field(None, ge=1, le=512, description="CPU threads per worker.")
    chat_template: str | None = Field(
        None, max_length=1_000_000, description="A Jinja chat template replacing the GGUF's."
    )
    source: str | None = Field(
        None, max_length=4096, description="Where the file came from (`inferctl pull`)."
    )
    system: str | None = Field(
        None,
        max_length=100_000,
        description="Ollama: the system prompt of a chat or generate that sends none.",
    )
    parameters: ModelParameters | None = Field(
        None, description="Ollama: default options for what a request leaves unset."
    )
    mmproj: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Multimodal projector GGUF (images in), in models_dir or a URL like "
        "`path`; unset: text only.",
    )
    mmproj_sha256: str | None = Field(
        None,
        pattern=SHA256_PATTERN,
        description="SHA-256 of the mmproj file (hex). Required, except for an hf:// URL.",
    )

    @model_validator(mode="after")
    def _check_mmproj(self) -> Self:
        check_mmproj(self.mmproj, self.mmproj_sha256, "mmproj")
        mmproj = self.mmproj
        if (
            mmproj is not None
            and self.mmproj_sha256 is None
            and not mmproj.startswith(HF_URL_SCHEME)
        ):
            raise ValueError(
                "mmproj_sha256 is required (64 hex digits) with mmproj, except for an hf:// URL"
            )
        return self

    @model_validator(mode="after")
    def _check_aliases(self) -> Self:
        check_model_url(self.path, self.sha256, "path")
        if self.sha256 is None and not self.path.startswith(HF_URL_SCHEME):
            raise ValueError(
                "sha256 is required (64 hex digits), except for an hf:// URL in `path`"
            )
        for alias in self.aliases:
            if not _valid_name(alias):
                raise ValueError(f"alias {alias!r} must match {MODEL_NAME_PATTERN}")
            if alias == self.id:
                raise ValueError(f"alias {alias!r} repeats the id")
        return self

    def names(self) -> tuple[str, ...]:
        """The id, then the aliases."""
        return (self.id, *self.aliases)


def _valid_name(name: str) -> bool:
    return re.fullmatch(MODEL_NAME_PATTERN, name) is not None


class Manifest(BaseModel):
    """Every model the registry knows. Ids and aliases are unique across entries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: tuple[ManifestEntry, ...] = Field(max_length=1024)

    @model_validator(mode="after")
    def _check_unique(self) -> Self:
        seen: dict[str, str] = {}
        for entry in self.models:
            for name in entry.names():
                if name in seen:
                    raise ValueError(
                        f"the name {name!r} is used by both {seen[name]!r} and {entry.id!r}: "
                        "ids and aliases must be unique"
                    )
                seen[name] = entry.id
        defaults = [entry.id for entry in self.models if entry.default]
        if len(defaults) > 1:
            raise ValueError(f"several entries are the default ({', '.join(defaults)}): keep one")
        return self

    def default_id(self) -> str | None:
        """The entry marked default, else the first one (None when empty)."""
        for entry in self.models:
            if entry.default:
                return entry.id
        return self.models[0].id if self.models else None


class AdapterEntry(BaseModel):
    """A LoRA adapter (GGUF) bound to a base model (the body of an admin-API adapter load).
    It is served as the model `<base id>:<id>`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=MODEL_NAME_PATTERN, description="The adapter's name.")
    base: str = Field(min_length=1, max_length=128, description="The base model id or alias.")
    path: str = Field(min_length=1, max_length=4096, description="LoRA GGUF, in models_dir.")
    sha256: str = Field(pattern=SHA256_PATTERN, description="SHA-256 of the file (hex).")
    scale: float = Field(1.0, ge=-16, le=16, description="Multiplier of the adapter's delta.")
    signature: str | None = Field(
        None, max_length=200, description="ed25519 signature of canonical_entry, base64."
    )


def canonical_entry(entry: ManifestEntry | AdapterEntry) -> bytes:
    """The bytes an entry's signature covers: the fields written (not defaults filled in),
    without `signature`, as compact JSON with sorted keys."""
    data = entry.model_dump(mode="json", exclude={"signature"}, exclude_unset=True)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def parse_manifest(text: str, source: str) -> Manifest:
    """The manifest in `text` (YAML). Raises ConfigError naming `source`, the entry and
    the field at fault."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"model manifest {source} is not valid YAML: {exc}") from None
    if isinstance(data, list):  # the form `inferctl pull` writes: the entries alone
        data = {"models": data}
    if not isinstance(data, dict) or "models" not in data:
        raise ConfigError(
            f"model manifest {source} must be a list of entries or a mapping with a "
            "`models:` list (docs/models.md)"
        )
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None


def read_manifest(path: Path) -> Manifest:
    """Read and validate the manifest file. Raises ConfigError (missing, unreadable,
    invalid), never anything else."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"model manifest {path} does not exist: fix registry.path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"model manifest {path} cannot be read: {exc}") from None
    return parse_manifest(text, str(path))


def _describe(exc: ValidationError, source: str) -> str:
    lines = [f"invalid model manifest {source}:"]
    for err in exc.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
        where = where.lstrip(".") or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"  {where}: unknown key; remove it (docs/models.md lists the keys)")
            continue
        lines.append(f"  {where} = {err.get('input')!r}: {err['msg']}")
    return "\n".join(lines)
