"""Bounds every dialect puts on what a request may ask for, shared so that they cannot drift:
stop sequences (how many, how long), checked as pydantic validators at each edge."""

from __future__ import annotations

from pydantic_core import PydanticCustomError

MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 512


def check_stop_sequences(stop: str | list[str] | None) -> str | list[str] | None:
    """The bounds every route puts on stop strings (a pydantic validator body)."""
    sequences = [stop] if isinstance(stop, str) else stop or []
    if len(sequences) > MAX_STOP_SEQUENCES:
        raise PydanticCustomError(
            "too_many_stop", "at most {n} stop sequences are allowed", {"n": MAX_STOP_SEQUENCES}
        )
    if any(not s for s in sequences):
        raise PydanticCustomError("empty_stop", "stop sequences must not be empty strings")
    if any(len(s) > MAX_STOP_CHARS for s in sequences):
        raise PydanticCustomError(
            "long_stop", "a stop sequence may be at most {n} characters", {"n": MAX_STOP_CHARS}
        )
    return stop
