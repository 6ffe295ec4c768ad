"""The scheduler's runtime-adjustable knobs and its fairness counters (scheduler.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from inferflux.scheduler.request import PriorityClass


@dataclass(frozen=True, slots=True)
class SchedulingPolicy:
    """The runtime-adjustable knobs (assign a new one to `Scheduler.policy`)."""

    queue_timeout_s: float = 30.0  # waiting longer without starting → TIMEOUT (408)
    aging_s: float = 5.0  # a waiting request climbs one class per aging_s (0 = no aging)
    batch_window_s: float = 0.0  # idle engine: wait this long for more arrivals
    enable_preemption: bool = True
    high_priority_threshold: PriorityClass = PriorityClass.HIGH
    max_timeslice_tokens: int = 128
    # > 0: while HIGH-class requests arrived in the last _HIGH_TRAFFIC_S, the other
    # prompts carry at most this many tokens a step (shorter steps to stop or wait out).
    high_traffic_chunk_tokens: int = 128
    # a step that carries other prompts' tokens is stopped part-way when a HIGH-class
    # request arrives (EngineCore: it is planned again with that request)
    interrupt_steps: bool = True
    # the step that ends a HIGH-class prompt carries no decode rows of lower classes
    high_prefill_alone: bool = True
    # > 0: while sequences decode, a step carries only the prompt tokens that keep its
    # expected time under this (stall-free batching); 0 = the whole token budget.
    itl_target_s: float = 0.0
    # > 0: the same cap, relative: a step may take at most this many times the expected
    # time of its decode rows alone; the larger of the two targets applies.
    itl_target_ratio: float = 0.0
    # > 0: prompt bursts. While prompts are prefilled (and no stall-free target is set),
    # the decoding streams below the HIGH class stand aside for up to this many seconds,
    # so they pause once per burst of prompts instead of once per prompt step, and a
    # step ends where a prompt ends, the shortest prompt first (when the measured step
    # overhead makes that worth it). 0 = off: every step carries each stream's token
    # (the pure-logic default; the server's is `scheduler.burst_stall_ms`, 30 s).
    burst_stall_s: float = 0.0
    # Host memory below this many bytes = memory pressure: half the admissions and step
    # budget (REQ-9.5; EngineCore watches the memory). 0 = never.
    memory_low_bytes: int = 256 * 1024 * 1024


@dataclass(slots=True)
class FairnessCounters:
    """OBS-1 fairness counters, plus tokens generated per class (counted by EngineCore)."""

    preemptions: int = 0
    yields: int = 0
    resumes: int = 0
    timeouts: int = 0
    interrupts: int = 0  # steps stopped part-way for a HIGH arrival (counted by EngineCore)
    tokens: dict[PriorityClass, int] = field(
        default_factory=lambda: dict.fromkeys(PriorityClass, 0)
    )
