"""The shared benchmark workload: seeded chat prompts and latency summaries.

Used by `bench/serve_load.py` (HTTP, against a running server) and `bench/engine_limit.py`
(the engine core directly), so both drive the same prompts and report the same statistics.

    make_prompts(n, seed, min_words, max_words) -> list[str]
    summarize(values) -> Summary          # count, mean, min, p50, p90, p99, max
    percentile(values, q) -> float        # linear interpolation, like numpy's default

Standard library only; the same arguments always give the same prompts (any platform,
any Python >= 3.11), so runs on different days or machines are comparable.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass

_TOPICS = (
    "photosynthesis", "the water cycle", "compound interest", "black holes", "jazz music",
    "the French Revolution", "machine learning", "plate tectonics", "the immune system",
    "supply and demand", "public key cryptography", "the Roman Empire", "climate change",
    "volcanoes", "the stock market", "quantum computing", "honey bees", "the printing press",
    "sleep", "electric cars", "coral reefs", "the internet", "vaccines", "chess openings",
    "bread baking", "ocean tides", "renewable energy", "the human heart", "ancient Egypt",
    "recycling", "gravity", "the Moon landing", "coffee", "earthquakes", "democracy",
)  # fmt: skip
_TASKS = (
    "Explain {topic} to {audience}.",
    "Write a short story about {topic} for {audience}.",
    "Give me three surprising facts about {topic}.",
    "Summarize the history of {topic} in a few paragraphs.",
    "What are the main arguments for and against {topic}? Answer for {audience}.",
    "Write a poem about {topic}.",
    "Describe how {topic} works, step by step, for {audience}.",
    "Compare {topic} with {other} and explain which matters more to {audience}.",
    "Draft an email to {audience} inviting them to a talk on {topic}.",
    "List common misconceptions about {topic} and correct each one.",
)
_AUDIENCES = (
    "a ten-year-old", "a busy manager", "a first-year student", "my grandmother",
    "a software engineer", "a curious tourist", "a skeptical scientist", "a new employee",
)  # fmt: skip
_ADJECTIVES = (
    "small", "old", "bright", "quiet", "careful", "strange", "green", "heavy", "simple",
    "early", "distant", "warm", "clever", "broken", "famous", "local", "rapid", "gentle",
)  # fmt: skip
_NOUNS = (
    "teacher", "river", "engine", "garden", "report", "village", "machine", "letter",
    "market", "island", "student", "library", "storm", "bridge", "doctor", "museum",
    "forest", "question", "window", "project", "kitchen", "signal", "painter", "harbor",
)  # fmt: skip
_VERBS = (
    "follows", "describes", "changes", "reaches", "remembers", "builds", "crosses",
    "explains", "watches", "carries", "finds", "protects", "measures", "visits", "opens",
)  # fmt: skip
_PREPOSITIONS = ("near", "behind", "under", "across", "beside", "after", "before", "around")
_CONTEXT_INTROS = (
    "Some background first.",
    "Here is some context.",
    "Keep this in mind.",
    "For context, read this.",
)


def make_prompts(n: int, seed: int, min_words: int, max_words: int) -> list[str]:
    """`n` varied English-like chat prompts of `min_words`..`max_words` words each.

    Each prompt is a request (explain, summarize, write a poem, ...) about a topic, padded
    with context sentences to a word count drawn uniformly from the range. Deterministic
    in its arguments. Raises ValueError on n < 0 or an empty or inverted word range.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    rng = random.Random(seed)
    return [_make_prompt(rng, rng.randint(min_words, max_words)) for _ in range(n)]


def _make_prompt(rng: random.Random, num_words: int) -> str:
    topic, other = rng.sample(_TOPICS, 2)
    task = rng.choice(_TASKS).format(topic=topic, other=other, audience=rng.choice(_AUDIENCES))
    task_words = task.split()
    if len(task_words) >= num_words:
        return _sentence(task_words[:num_words])
    context_words: list[str] = rng.choice(_CONTEXT_INTROS).split()
    while len(context_words) < num_words - len(task_words):
        context_words += _filler_sentence(rng).split()
    context_words = context_words[: num_words - len(task_words)]
    return f"{_sentence(context_words)} {task}"


def _filler_sentence(rng: random.Random) -> str:
    words = [
        "The",
        rng.choice(_ADJECTIVES),
        rng.choice(_NOUNS),
        rng.choice(_VERBS),
        "the",
        rng.choice(_ADJECTIVES),
        rng.choice(_NOUNS),
    ]
    if rng.random() < 0.5:
        words += [rng.choice(_PREPOSITIONS), "the", rng.choice(_NOUNS)]
    return " ".join(words) + "."


def _sentence(words: list[str]) -> str:
    text = " ".join(words)
    return text if text.endswith((".", "?", "!")) else text.rstrip(",;:") + "."


@dataclass(frozen=True, slots=True)
class Summary:
    """Distribution of one measurement. Every field but `count` is None when count is 0."""

    count: int
    mean: float | None
    min: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within 0..100, got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float]) -> Summary:
    """Count, mean, min, p50, p90, p99 and max of `values` (latencies in seconds, rates...)."""
    if not values:
        return Summary(0, None, None, None, None, None, None)
    return Summary(
        count=len(values),
        mean=math.fsum(values) / len(values),
        min=min(values),
        p50=percentile(values, 50),
        p90=percentile(values, 90),
        p99=percentile(values, 99),
        max=max(values),
    )
