"""Incremental, UTF-8-safe detokenization and stop-string matching for one sequence.

Owns: turning token byte pieces into text that is safe to stream. A multi-byte
character split across tokens is held until complete; text that may still become a
stop string is held until it cannot. Does not own: token ids → bytes (the backend) or
deciding that a sequence is finished (EngineCore).
"""

from __future__ import annotations

import codecs


class IncrementalDetokenizer:
    """Bytes of successive tokens in, complete UTF-8 text out.

    Invalid byte sequences become U+FFFD, as a streaming client would show them;
    an incomplete trailing sequence is kept until the next piece or `flush()`.
    """

    __slots__ = ("_decoder",)

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, piece: bytes) -> str:
        """Text completed by `piece` (may be empty)."""
        return self._decoder.decode(piece)

    def flush(self) -> str:
        """Whatever is left at the end of generation (a dangling partial char → U+FFFD)."""
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Finds stop strings across chunk boundaries and never releases their text.

    `push` returns (text safe to emit, matched stop string or None). Held back is the
    longest tail of the stream that is a prefix of some stop string: since every
    earlier position was ruled out, a match can only start inside held text.
    """

    __slots__ = ("_held", "_max_len", "_stops")

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._max_len = max((len(s) for s in self._stops), default=0)
        self._held = ""

    def push(self, text: str) -> tuple[str, str | None]:
        """Feed new text. On a match, returns the text before it and the stop string."""
        if not self._stops:
            return text, None
        buf = self._held + text
        match_at, matched = self._earliest_match(buf)
        if matched is not None:
            self._held = ""
            return buf[:match_at], matched
        keep = self._partial_tail(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], None

    def flush(self) -> str:
        """Release held text at the end of generation (it never became a stop string)."""
        held, self._held = self._held, ""
        return held

    def _earliest_match(self, buf: str) -> tuple[int, str | None]:
        best_at, best = len(buf) + 1, None
        for stop in self._stops:
            at = buf.find(stop)
            if at != -1 and at < best_at:
                best_at, best = at, stop
        return best_at, best

    def _partial_tail(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of a stop string."""
        for size in range(min(len(buf), self._max_len - 1), 0, -1):
            tail = buf[len(buf) - size :]
            if any(stop.startswith(tail) for stop in self._stops):
                return size
        return 0
