"""`SamplerOptions`: llama.cpp's samplers beyond temperature, top_p, top_k and min_p, declared
once for every dialect (the OpenAI routes take them as extensions, the native routes as
fields, Ollama inside `options`), with llama-server's names and ranges.

| field | default | what it does |
| --- | --- | --- |
| `typical_p` | 1.0 (off) | locally typical sampling |
| `top_n_sigma` | -1 (off) | keep tokens within n standard deviations of the top logit |
| `mirostat` | 0 (off) | 1 = Mirostat, 2 = Mirostat 2.0 (replace the other samplers) |
| `mirostat_tau`, `mirostat_eta` | 5.0, 0.1 | Mirostat's target surprise and learning rate |
| `dynatemp_range`, `dynatemp_exponent` | 0 (off), 1.0 | temperature ± range by entropy |
| `dry_multiplier` | 0 (off) | DRY ("don't repeat yourself") penalty of repeated sequences |
| `dry_base`, `dry_allowed_length` | 1.75, 2 | its growth and the repeat length it allows |
| `dry_penalty_last_n` | -1 (the context) | tokens it looks back over (0 = off) |
| `dry_sequence_breakers` | `["\\n", ":", "\\"", "*"]` | strings that end a repeated sequence |
| `xtc_probability`, `xtc_threshold` | 0 (off), 0.1 | XTC: sometimes exclude the top choices |
| `repeat_last_n` | 64 | tokens the repeat penalties look back over (-1 = the context) |
| `samplers` | llama.cpp's order | which samplers run and in what order |
| `speculative` | true | false: no speculative decoding for this request (docs/speculative.md) |

Out-of-range values are a 400 naming the field, like every other field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator

from inferflux.engine.backends.base import DEFAULT_SAMPLER_ORDER

SamplerName = Literal[
    "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"
]
MAX_BREAKERS = 32
Breaker = Annotated[str, Field(min_length=1, max_length=64)]
_INT32_MAX = 2**31 - 1


class SamplerOptions(BaseModel):
    """The fields; a dialect's request model inherits them (and its own config)."""

    typical_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_n_sigma: float | None = Field(default=None, ge=-1.0, le=100.0)
    mirostat: int | None = Field(default=None, ge=0, le=2)
    mirostat_tau: float | None = Field(default=None, ge=0.0, le=100.0)
    mirostat_eta: float | None = Field(default=None, ge=0.0, le=1.0)
    dynatemp_range: float | None = Field(default=None, ge=0.0, le=100.0)
    dynatemp_exponent: float | None = Field(default=None, ge=0.0, le=100.0)
    dry_multiplier: float | None = Field(default=None, ge=0.0, le=100.0)
    dry_base: float | None = Field(default=None, ge=1.0, le=100.0)
    dry_allowed_length: int | None = Field(default=None, ge=0, le=_INT32_MAX)
    dry_penalty_last_n: int | None = Field(default=None, ge=-1, le=_INT32_MAX)
    dry_sequence_breakers: list[Breaker] | None = Field(default=None, max_length=MAX_BREAKERS)
    xtc_probability: float | None = Field(default=None, ge=0.0, le=1.0)
    xtc_threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    repeat_last_n: int | None = Field(default=None, ge=-1, le=_INT32_MAX)  # -1: the context
    samplers: list[SamplerName] | None = Field(default=None, max_length=len(DEFAULT_SAMPLER_ORDER))
    speculative: bool | None = None  # False: opt out of speculative decoding

    @field_validator("samplers")
    @classmethod
    def _each_once(cls, names: list[str] | None) -> list[str] | None:
        if names is not None and len(set(names)) != len(names):
            raise ValueError("each sampler may be named once")
        return names

    def sampler_fields(self) -> dict[str, object]:
        """The `SamplingParams` fields these options set; unset ones keep the engine's
        defaults (`repeat_last_n` is `penalty_last_n` there)."""
        fields: dict[str, object] = {}
        for name in SamplerOptions.model_fields:
            value = getattr(self, name)
            if value is not None:
                fields["penalty_last_n" if name == "repeat_last_n" else name] = value
        return fields
