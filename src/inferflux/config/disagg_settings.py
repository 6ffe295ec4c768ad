"""Settings of disaggregated prefill and decode (`scheduler.disaggregated`); the pool
sizes and the mode are in `scheduler` itself. docs/scheduling.md says when it pays."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferflux.config.env_lists import split_env_list


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DisaggregatedSettings(_Section):
    channel_capacity: int = Field(
        8,
        ge=1,
        le=4096,
        description="KV tickets in flight at most (written by a prefill worker and not yet "
        "hydrated by a decode worker). A request that finds the channel full waits for a "
        "slot before its prefill starts, up to ticket_wait_s.",
    )
    channel_max_mb: int = Field(
        2048,
        ge=1,
        le=1_048_576,
        description="Shared-memory bytes the tickets in flight may hold together, in MiB "
        "(estimated from the prompt length before prefill, checked again when written).",
    )
    ticket_wait_s: float = Field(
        2.0,
        ge=0,
        le=3600,
        description="How long a request waits for room in a full channel; past it the "
        "ticket counts as blocked and the prompt is computed by a decode worker instead "
        "(unified, as if the mode were off for that request).",
    )
    min_prompt_tokens: int = Field(
        2,
        ge=2,
        le=1_000_000,
        description="Prompts shorter than this skip the prefill pool and run on a decode "
        "worker (a short prompt costs a decode step less than a hand-off).",
    )
    path: str = Field(
        "/dev/shm",
        description="Folder of the shared-memory ticket files (tmpfs: /dev/shm on Linux). "
        "The server makes a private subfolder and removes it on exit.",
    )
    prefill_threads: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="CPU threads of each prefill worker. Unset: runtime.n_threads, else the "
        "cores (or prefill_cpus) shared among the prefill workers.",
    )
    decode_threads: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="CPU threads of each decode worker. Unset: runtime.n_threads, else the "
        "cores (or decode_cpus) shared among the decode workers.",
    )
    prefill_cpus: list[int] = Field(
        default_factory=list,
        description="Pin the prefill workers to these CPU ids (sched_setaffinity); empty = "
        "no pinning. Env: a comma list, INFERFLUX_SCHEDULER__DISAGGREGATED__PREFILL_CPUS=0,1.",
    )
    decode_cpus: list[int] = Field(
        default_factory=list,
        description="Pin the decode workers to these CPU ids; empty = no pinning.",
    )

    @field_validator("prefill_cpus", "decode_cpus", mode="before")
    @classmethod
    def _split_env(cls, value: object) -> object:
        return split_env_list(value, "cpus")

    @field_validator("prefill_cpus", "decode_cpus")
    @classmethod
    def _check_cpus(cls, cpus: list[int]) -> list[int]:
        if any(cpu < 0 for cpu in cpus):
            raise ValueError("CPU ids are 0 or more")
        return sorted(set(cpus))
