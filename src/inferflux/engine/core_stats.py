"""EngineCore's counters as the messages `EngineStats` carries (engine/messages.py)."""

from __future__ import annotations

import msgspec

from inferflux.engine.image_prep import ImagePreparer
from inferflux.engine.kv_offload import KvOffload
from inferflux.engine.messages import (
    FairnessStats,
    ImageStats,
    KvTierStats,
    PrefixCacheStats,
    SpeculativeStats,
)
from inferflux.engine.speculative import NgramProposer
from inferflux.scheduler import Scheduler


def image_stats(images: ImagePreparer | None) -> ImageStats | None:
    if images is None:
        return None
    return ImageStats(
        num_images_total=images.num_images,
        encode_seconds_total=images.encode_s,
        num_preparing=len(images),
        rows_bytes=images.rows.nbytes,
    )


def fairness_stats(scheduler: Scheduler) -> FairnessStats:
    c = scheduler.counters
    return FairnessStats(
        preemptions=c.preemptions,
        yields=c.yields,
        resumes=c.resumes,
        timeouts=c.timeouts,
        tokens={p.name.lower(): n for p, n in c.tokens.items()},
        interrupts=c.interrupts,
    )


def prefix_stats(scheduler: Scheduler) -> PrefixCacheStats | None:
    cache = scheduler.prefix_cache
    if cache is None:
        return None
    c, parked = cache.stats, scheduler.parked
    return PrefixCacheStats(
        hits=c.hits,
        misses=c.misses,
        partial_hits=c.partial_hits,
        matched_tokens=c.matched_tokens,
        evictions=c.evictions,
        inserts=c.inserts,
        entries=cache.num_entries,
        cached_tokens=cache.cached_tokens,
        max_tokens=cache.max_tokens,
        parked=len(parked) if parked is not None else 0,
        parked_tokens=parked.num_tokens if parked is not None else 0,
    )


def tier_stats(offload: KvOffload | None) -> KvTierStats | None:
    return msgspec.structs.replace(offload.stats) if offload is not None else None


def spec_stats(speculator: NgramProposer | None) -> SpeculativeStats | None:
    if speculator is None:
        return None
    c = speculator.counters
    return SpeculativeStats(
        chunks=c.chunks,
        chunks_accepted=c.chunks_accepted,
        drafted_tokens=c.drafted_tokens,
        accepted_tokens=c.accepted_tokens,
        match_rates=list(speculator.prior.rates),  # rounded by /server/stats
        match_seen=list(speculator.prior.seen),
    )
